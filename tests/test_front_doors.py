"""Every option a front door takes in Python is taken by its YAML job and its command line, by the same name.

The Python signatures are read with ``inspect``, the YAML schema from the job loader's allowed
keys, the command lines from their argparse parsers: a keyword added to a function without a
flag or a YAML key fails here.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
from pathlib import Path

import pytest

import shardkit
from shardkit.cli import jobs
from shardkit.cli.main import build_parser
from shardkit.option_fields import specs

ROOT = Path(__file__).resolve().parents[1]

# parameters that are not options: what the job works on, and the options object itself
_NOT_OPTIONS = {"inputs", "fn", "out", "src", "dst", "options"}
# Python-only on purpose, each for a stated reason
_PYTHON_ONLY = {
    "codecs": "encoder functions by extension: code, not configuration",
    "extra": "free metadata for the manifest; a YAML job records what its transform says",
    "mp_context": "the multiprocessing start method of the calling interpreter",
    "quiet": "a flag of the command itself (-q) and of `shardkit run -q`, not of the job",
}
# the command line names storage_options --storage-option KEY=VALUE (repeatable), a mapping flag by flag
_CLI_NAMES = {"storage_options": "storage_option"}


def _options(fn) -> set[str]:
    params = inspect.signature(fn).parameters
    return {name for name, p in params.items() if p.kind is p.KEYWORD_ONLY and name not in _NOT_OPTIONS | set(_PYTHON_ONLY)}


def _cli_dests(parser: argparse.ArgumentParser) -> set[str]:
    return {a.dest for a in parser._actions if a.option_strings}


def _command(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _script(name: str) -> argparse.ArgumentParser:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_parser()


DOORS = [
    # (function, options class, YAML job kind or None, command lines that run it)
    (shardkit.pile, shardkit.PileOptions, "pile", [lambda: _command("pile")]),
    (shardkit.shuffle, shardkit.ShuffleOptions, "shuffle", [lambda: _command("shuffle")]),
    (shardkit.repile, shardkit.PileOptions, None, [lambda: _command("repile")]),
    (shardkit.preprocess, shardkit.PileOptions, "preprocess", [lambda: _script("preprocess_images"), lambda: _script("preprocess_jsonl")]),
]


@pytest.mark.parametrize(("fn", "cls", "kind", "parsers"), DOORS, ids=[d[0].__name__ for d in DOORS])
def test_every_python_option_is_a_yaml_key_and_a_flag(fn, cls, kind, parsers):
    names = _options(fn)
    assert names, fn
    if kind is not None:
        yaml = set(jobs._ALLOWED[kind]) | {name for name, spec in specs(cls).items() if spec.yaml == "output"}
        assert names <= yaml, f"{fn.__name__}: not accepted by `job: {kind}`: {sorted(names - yaml)}"
    for make in parsers:
        dests = _cli_dests(make())
        wanted = {_CLI_NAMES.get(name, name) for name in names}
        assert wanted <= dests, f"{fn.__name__}: not accepted on the command line: {sorted(wanted - dests)}"


@pytest.mark.parametrize("cls", [shardkit.PileOptions, shardkit.ShuffleOptions])
def test_every_option_field_has_a_yaml_place(cls):
    assert [name for name, spec in specs(cls).items() if spec.yaml is None] == []
