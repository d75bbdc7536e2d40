"""mkdocs hooks: generate the reference page from the code, and bring in what the included top-level pages link to.

``reference.md`` is made by :func:`shardkit.cli.reference.reference` at every build, so the CLI
flags, the scripts' flags, YAML keys and option fields on it are the ones the code declares; an
option without a description stops the build. BENCHMARKS.md and RELIABILITY.md live at the top of the repository
and are included into their pages (``--8<--``); files they link to by a relative path (a plot)
are added to the site under the same path.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
INCLUDED = ("BENCHMARKS.md", "RELIABILITY.md")
_LINK = re.compile(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)")


def _script_parsers() -> dict:
    """``{"python scripts/x.py": parser}`` for every script in scripts/ that has a ``build_parser()``."""
    parsers = {}
    for path in sorted((ROOT / "scripts").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"_docs_script_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if hasattr(module, "build_parser"):
            parsers[f"python scripts/{path.name}"] = module.build_parser()
    return parsers


def on_files(files, config):
    from shardkit.cli.reference import reference

    files.append(File.generated(config, "reference.md", content=reference(scripts=_script_parsers())))
    for name in INCLUDED:
        for target in _LINK.findall((ROOT / name).read_text(encoding="utf-8")):
            if not target.endswith(".md") and (ROOT / target).is_file() and files.get_file_from_path(target) is None:
                files.append(File.generated(config, target, abs_src_path=str(ROOT / target)))
    return files
