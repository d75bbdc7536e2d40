"""Every option a front door takes in Python is taken by its YAML job and its command line, by the same name.

The Python signatures are read with ``inspect``, the YAML schema from the job loader's allowed
keys, the command lines from their argparse parsers: a keyword added to a function without a
flag or a YAML key fails here. Each front door takes every field of its options class but those
listed once below with the reason, and a field added to an options class reaches its front
doors' signatures and docstrings, the command line, YAML and the reference with no other line.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import shardkit
from shardkit.cli import jobs
from shardkit.cli.flags import add_option_flags, options_from_args
from shardkit.cli.main import build_parser
from shardkit.cli.reference import _yaml_option_rows
from shardkit.option_fields import Door, meta, specs, yaml_names

NO_TORCH = importlib.util.find_spec("torch") is None
ShardkitDataset = None if NO_TORCH else importlib.import_module("shardkit.torch").ShardkitDataset

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


@pytest.mark.parametrize("cls", [shardkit.PileOptions, shardkit.ShuffleOptions, shardkit.LoaderOptions])
def test_every_option_field_has_a_group_that_help_and_the_docs_list_it_under(cls):
    assert [name for name, spec in specs(cls).items() if spec.group is None] == []
    parser = argparse.ArgumentParser()
    add_option_flags(parser, cls, [name for name, spec in specs(cls).items() if spec.help])
    for group in parser._action_groups[2:]:  # after the positional arguments and the ungrouped options
        assert {specs(cls)[a.dest].group for a in group._group_actions} == {group.title.removesuffix(" options")}


# ---- a front door takes its class's fields, less those listed here ---------------------------------

_JOB_ONLY = "describes a job over input units; the writer writes in the calling process"
_NOT_TAKEN = {
    "preprocess": {"key_prefix": "its keys come from its function (YAML takes it, refusing 'unit' as Python does)"},
    "pile": {},
    "repile": dict.fromkeys(
        ("buffer_size", "on_error", "key_prefix", "repeat", "mode", "window"), "it copies one whole dataset into a new one"
    ),
    "shuffle": {},
    "PileWriter": dict.fromkeys(("workers", "on_error", "key_prefix", "executor", "ray_address", "resume", "repeat"), _JOB_ONLY),
    "loader": {"worker": "the DataLoader worker's share, set by shardkit.torch"},
    "ShardkitDataset": {"worker": "the DataLoader worker's share, set by the dataset itself in each worker"},
}
EVERY_DOOR = [
    ("preprocess", shardkit.preprocess, shardkit.PileOptions),
    ("pile", shardkit.pile, shardkit.PileOptions),
    ("repile", shardkit.repile, shardkit.PileOptions),
    ("shuffle", shardkit.shuffle, shardkit.ShuffleOptions),
    ("PileWriter", shardkit.PileWriter, shardkit.PileOptions),
    ("loader", shardkit.loader, shardkit.LoaderOptions),
    ("ShardkitDataset", ShardkitDataset, shardkit.LoaderOptions),
]
_NEEDS_TORCH = pytest.mark.skipif(NO_TORCH, reason="needs torch: pip install 'shardkit[torch]'")
EVERY_DOOR_PARAMS = [pytest.param(*d, id=d[0], marks=[_NEEDS_TORCH] if d[0] == "ShardkitDataset" else []) for d in EVERY_DOOR]
# what a front door reached from no YAML job or command line is, instead
_PYTHON_DOORS = {
    "PileWriter": "a writer a Python program feeds sample by sample",
    "loader": "a reader inside a training loop; `shardkit trace` takes the options that set the order",
    "ShardkitDataset": "the loader inside torch's DataLoader",
}
_YAML = {"preprocess": "preprocess", "pile": "pile", "shuffle": "shuffle"}
_CLI = {"pile": lambda: _command("pile"), "repile": lambda: _command("repile"), "shuffle": lambda: _command("shuffle")}
_CLI |= {"preprocess": lambda: _script("preprocess_jsonl")}


# keywords beside the options: what pile's inputs are (YAML `format:`, --format), what a blend mixes
_BESIDE = {"format", "weights", "epoch_size"}


def _signature_options(door) -> set[str]:
    params = inspect.signature(door).parameters.values()
    return {p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name not in _NOT_OPTIONS | set(_PYTHON_ONLY) | _BESIDE}


@pytest.mark.parametrize(("name", "door", "cls"), EVERY_DOOR_PARAMS)
def test_a_front_door_takes_every_field_but_those_listed_with_a_reason(name, door, cls):
    fields = set(specs(cls))
    taken = _signature_options(door)
    assert taken == fields - set(_NOT_TAKEN[name]), name
    assert set(_NOT_TAKEN[name]) <= fields, f"{name}: listed fields its class lacks"
    if name in _YAML:  # the YAML keys are the Python keywords, by name, but where listed
        yaml = set(jobs._ALLOWED[_YAML[name]]) | set(yaml_names(cls, "output"))
        assert yaml & fields == taken | ({"key_prefix"} if name == "preprocess" else set()), name
    if name in _CLI:  # the flags are the Python keywords, by name
        dests = _cli_dests(_CLI[name]()) & (fields | set(_CLI_NAMES.values()))
        assert dests == {_CLI_NAMES.get(n, n) for n in taken}, name
    assert name in _YAML or name in _CLI or name in _PYTHON_DOORS


@pytest.mark.parametrize(("name", "door", "cls"), EVERY_DOOR_PARAMS)
def test_a_front_door_documents_every_option_it_takes(name, door, cls):
    doc = inspect.getdoc(door)
    params = inspect.signature(door).parameters
    for option in _signature_options(door):
        assert re.search(rf"^    (\w+, )*{option}(, \w+)*: ", doc, re.M), f"{name}: {option} is not under Args:"
        assert params[option].annotation and params[option].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: shardkit.preprocess([1], print, "out", piles=2, max_pile_byte="1GiB"), "'max_pile_byte'. Did you mean 'max_pile_bytes'?"),
        (
            lambda: shardkit.pile("a.tar", "out", piles=2, quite=True),
            "pile() got an unexpected keyword argument 'quite'. Did you mean 'quiet'?",
        ),
        (
            lambda: shardkit.shuffle("a.tar", "out", maxcunt=3),
            "shuffle() got an unexpected keyword argument 'maxcunt'. Did you mean 'maxcount'?",
        ),
        (lambda: shardkit.repile("a", "b", bufer_size=3), "repile() got an unexpected keyword argument 'bufer_size'"),
        (
            lambda: shardkit.loader("data", bach_size=3),
            "loader() got an unexpected keyword argument 'bach_size'. Did you mean 'batch_size'?",
        ),
        (
            lambda: shardkit.PileWriter("out", piles=2, workers=3),
            "workers is an option of PileOptions that PileWriter.__init__() does not take",
        ),
    ],
)
def test_an_unknown_keyword_is_a_type_error_naming_the_closest(tmp_path, monkeypatch, call, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match=re.escape(message)):
        call()
    assert list(tmp_path.iterdir()) == []


# ---- one declaration reaches Python, the command line, YAML and the docs ---------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Grown(shardkit.PileOptions):
    """PileOptions with one field more.

    Args:
        shelf: where the piles rest (a new option, declared once, here).
    """

    shelf: int = dataclasses.field(default=0, metadata=meta(help="where the piles rest", metavar="K", yaml="output", group="piles"))


_GROWN = Door(_Grown, exclude=("key_prefix",))


@_GROWN
def _grown_door(inputs, out, *, options=None, quiet=False, **keywords):
    """A front door over the grown options.

    Args:
        inputs: the inputs.
        out: the output.
        options: the options object instead of the keywords.
        quiet: no progress bar.
    """
    return _GROWN.options(options, keywords)


def test_a_field_added_to_an_options_class_reaches_python_cli_yaml_and_docs():
    # Python: a keyword-only parameter with its default and type, described under Args:, taken
    param = inspect.signature(_grown_door).parameters["shelf"]
    assert (param.kind, param.default, param.annotation) == (inspect.Parameter.KEYWORD_ONLY, 0, "int")
    assert "    shelf: where the piles rest (a new option, declared once, here)." in inspect.getdoc(_grown_door)
    assert _grown_door([1], "out", piles=2, shelf=3) == _Grown(piles=2, shelf=3)
    with pytest.raises(shardkit.ConfigError, match=re.escape("got options= and shelf=3")):
        _grown_door([1], "out", options=_Grown(piles=2), shelf=3)
    # the command line: a flag of that name, read back into the options
    parser = argparse.ArgumentParser()
    add_option_flags(parser, _Grown, _GROWN.names)
    args = parser.parse_args(["--piles", "2", "--shelf", "4"])
    assert options_from_args(_Grown, args, _GROWN.names) == _Grown(piles=2, shelf=4)
    # YAML and the reference
    assert "shelf" in yaml_names(_Grown, "output")
    assert any(row.startswith("| `shelf` | output | int | `0` | where the piles rest |") for row in _yaml_option_rows(_Grown))
