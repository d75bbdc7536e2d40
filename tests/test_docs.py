"""The README and docs/ tell the truth: every fenced Python and shell block runs, and the site builds strictly.

Each page's blocks run in order, in a fresh folder holding tiny example data (``shards/``,
``photos/``, ``a.jsonl``, ``b.jsonl``) and copies of ``configs/`` and ``scripts/``, as a user
would run them from a clone. See ``doc_blocks.py`` for the ``skip`` and ``needs`` marks.
"""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from doc_blocks import Block, blocks, script

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]


def _page_blocks(page: str) -> list[Block]:
    return blocks(ROOT / page, page)


def _have(need: str) -> bool:
    modules = {
        "s3": ("moto", "s3fs"),
        "ray": ("ray",),
        "torch": ("torch",),
        "plot": ("matplotlib",),
        "parquet": ("pyarrow",),
        "hf": ("datasets", "pyarrow"),
        "mds": ("streaming",),
        "litdata": ("litdata",),
    }[need]
    return all(importlib.util.find_spec(m) is not None for m in modules)


def make_example_files(root: Path) -> None:
    """The tiny data every example may use: class-sorted shards, a folder of photos by class, JSON lines."""
    import tarfile

    from PIL import Image

    rng = np.random.default_rng(0)
    (root / "shards").mkdir()
    for k in range(4):  # shard k holds class k only: the class-sorted data the shuffle is for
        with tarfile.open(root / "shards" / f"train-{k:06d}.tar", "w") as tar:
            for i in range(50):
                key = f"s{k:02d}{i:04d}"
                for ext, data in (("bin", rng.bytes(256)), ("cls", str(k).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    for name in ("cat", "dog", "fox"):
        folder = root / "photos" / name
        folder.mkdir(parents=True)
        for i in range(6):
            pixels = rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{name}{i}.jpg", quality=80)
    for name, count in (("a", 20), ("b", 10)):
        lines = [f'{{"id": "{name}{i}", "text": "line {i} of {name}"}}' for i in range(count)]
        (root / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    for folder in ("configs", "scripts"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("data", "out", "__pycache__"))


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env["NO_MKDOCS_2_WARNING"] = "1"
    return env


def _aim_at_s3(env: dict[str, str], moto_server) -> None:
    """Point ``s3://`` URLs at the suite's moto server, as ``AWS_ENDPOINT_URL`` and test keys; blocks make their buckets."""
    from s3_server import aws_environment

    for name, value in aws_environment(moto_server.endpoint).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value


@pytest.mark.parametrize("page", PAGES)
def test_the_examples_of_a_page_run(page, tmp_path, request):
    runnable, missing = [], []
    for block in _page_blocks(page):
        if block.skip is not None:
            continue
        absent = sorted(n for n in block.needs if not _have(n))
        (missing if absent else runnable).append((block, absent))
    if not runnable:
        pytest.skip(f"{page}: no block to run here" + (f" ({len(missing)} need extras not installed)" if missing else ""))
    page_blocks = [b for b, _ in runnable]
    make_example_files(tmp_path)
    env = _environment()
    moto = request.getfixturevalue("moto_server") if any("s3" in b.needs for b in page_blocks) else None
    if moto is not None:
        _aim_at_s3(env, moto)
    (tmp_path / ".examples.py").write_text(script(page_blocks))
    try:
        done = subprocess.run(
            [sys.executable, ".examples.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280, stdin=subprocess.DEVNULL
        )
    finally:
        if moto is not None:
            moto.reset()  # the next page's buckets start empty
    assert done.returncode == 0, f"{page}: an example failed\n--- stdout\n{done.stdout[-6000:]}\n--- stderr\n{done.stderr[-6000:]}"


_INSTALL = {
    "s3": "remote",
    "ray": "ray",
    "torch": "torch",
    "plot": "plot",
    "parquet": "parquet",
    "hf": "hf",
    "mds": "mds",
    "litdata": "litdata",
}
NOT_RUN = [b for page in PAGES for b in _page_blocks(page) if b.skip is not None or not all(_have(n) for n in b.needs)]


@pytest.mark.parametrize("block", NOT_RUN, ids=[b.where for b in NOT_RUN])
def test_blocks_not_run_are_listed_with_the_reason(block):
    """A block marked skip, or needing an extra that is not installed, shows in pytest's summary with why."""
    if block.skip is not None:
        pytest.skip(f"{block.where}: {block.skip}")
    absent = sorted(n for n in block.needs if not _have(n))
    extras = ",".join(_INSTALL[n] for n in absent)
    pytest.skip(f"{block.where}: needs {', '.join(absent)}: pip install -e '.[{extras}]'")


def _quickstart() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.startswith("python3 -m venv .venv && ")]


def test_the_readme_test_command_is_the_one_ci_runs():
    demo, tests = _quickstart()
    assert demo.endswith("shardkit demo")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-2] == "# the README's test command, verbatim from here on"
    assert ci[-1] == tests


def test_the_readme_stays_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 260, f"README.md has {len(lines)} lines: move detail into docs/"


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs site needs mkdocs-material: pip install -e '.[dev]'")
    pytest.importorskip("material", reason="the docs site needs mkdocs-material: pip install -e '.[dev]'")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-8000:]
    assert (tmp_path / "site" / "reference" / "index.html").exists()


def test_the_reference_names_every_flag_yaml_key_and_option():
    import argparse

    from shardkit.cli import jobs
    from shardkit.cli.main import build_parser
    from shardkit.cli.reference import reference
    from shardkit.eager_shuffle import ShuffleOptions
    from shardkit.loading.options import LoaderOptions
    from shardkit.option_fields import specs
    from shardkit.piles.options import PileOptions

    text = reference()
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subs.choices.items():
        assert f"### `shardkit {name}`" in text
        for action in sub._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            for flag in action.option_strings:
                assert f"`{flag}`" in text, f"shardkit {name} {flag}"
    for kind in jobs.JOBS:
        own, cls = jobs.job_fields(kind)
        section = text.split(f"### `job: {kind}`")[1].split("###")[0]
        options = [n for n, s in specs(cls).items() if s.yaml] if cls else []
        for key in (*own, *options):
            assert f"| `{key}` |" in section, f"job {kind}: {key}"
    for cls in (PileOptions, ShuffleOptions, LoaderOptions):
        for name in specs(cls):
            assert f"| `{name}` |" in text


def test_an_undocumented_flag_stops_the_reference():
    import argparse

    from shardkit.cli.reference import UndocumentedError, cli_reference

    parser = argparse.ArgumentParser(prog="shardkit", description="d")
    sub = parser.add_subparsers()
    sub.add_parser("thing", help="does a thing").add_argument("--secret-flag")
    with pytest.raises(UndocumentedError, match="shardkit thing: --secret-flag has no help text"):
        cli_reference(parser)


def test_the_block_runner_reads_marks_and_names_the_block_that_fails(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# t\n\n```python\nx = 41\n```\n\n<!-- skip: not here -->\n```python\nraise SystemExit(3)\n```\n\n"
        "<!-- needs: s3 -->\n```sh\necho s3\n```\n\n- a list item:\n\n  ```python\n  x += 1\n  ```\n\n"
        "```yaml\nnot: run\n```\n\n```sh\ntest \"$(python -c 'print(6 * 7)')\" = 42\nfalse\n```\n"
    )
    found = blocks(page, "page.md")
    assert [(b.line, b.lang, b.skip, sorted(b.needs)) for b in found] == [
        (3, "python", None, []),
        (8, "python", "not here", []),
        (13, "sh", None, ["s3"]),
        (19, "python", None, []),
        (27, "sh", None, []),
    ]
    run = [b for b in found if b.skip is None and not b.needs]
    (tmp_path / "run.py").write_text(script(run))
    done = subprocess.run([sys.executable, "run.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "page.md:27: this shell block failed" in done.stderr
    (tmp_path / "ok.py").write_text(script(run[:2]) + "assert x == 42\n")
    assert subprocess.run([sys.executable, "ok.py"], cwd=tmp_path, capture_output=True, timeout=60).returncode == 0
    for bad, message in (("<!-- needs: gpu -->\n```sh\nx\n```\n", "needs: expected some of"), ("```python\nx = 1\n", "never closed")):
        page.write_text(bad)
        with pytest.raises(ValueError, match=message):
            blocks(page, "page.md")


def test_the_reference_names_every_flag_of_the_preprocessing_scripts():
    import argparse
    import importlib.util

    pytest.importorskip("mkdocs", reason="the docs hooks need mkdocs: pip install -e '.[dev]'")
    from shardkit.cli.reference import reference

    spec = importlib.util.spec_from_file_location("shardkit_docs_hook", ROOT / "docs" / "hooks" / "shardkit_docs.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    parsers = hook._script_parsers()
    assert {"python scripts/preprocess_images.py", "python scripts/preprocess_jsonl.py"} <= set(parsers)
    text = reference(scripts=parsers)
    for command, parser in parsers.items():
        section = text.split(f"### `{command}`")[1].split("\n## ")[0]
        for action in parser._actions:
            if not isinstance(action, argparse._HelpAction):
                for flag in action.option_strings:
                    assert f"`{flag}`" in section, f"{command} {flag}"
