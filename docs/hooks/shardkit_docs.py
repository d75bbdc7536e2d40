"""mkdocs hooks: generate the reference page from the code, and bring in what the included top-level pages link to.

``reference.md`` is made by :func:`shardkit.cli.reference.reference` at every build, so the CLI
flags, YAML keys and option fields on it are the ones the code declares; an option without a
description stops the build. BENCHMARKS.md and RELIABILITY.md live at the top of the repository
and are included into their pages (``--8<--``); files they link to by a relative path (a plot)
are added to the site under the same path.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
INCLUDED = ("BENCHMARKS.md", "RELIABILITY.md")
_LINK = re.compile(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)")


def on_files(files, config):
    from shardkit.cli.reference import reference

    files.append(File.generated(config, "reference.md", content=reference()))
    for name in INCLUDED:
        for target in _LINK.findall((ROOT / name).read_text(encoding="utf-8")):
            if not target.endswith(".md") and (ROOT / target).is_file() and files.get_file_from_path(target) is None:
                files.append(File.generated(config, target, abs_src_path=str(ROOT / target)))
    return files
