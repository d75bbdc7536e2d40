"""Options: ``options=`` and keywords give the same run; CLI flags and YAML keys come from the fields."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import pathlib
import re
import textwrap

import pytest
from conftest import make_samples, write_wds_shards

import shardkit
from shardkit import manifest
from shardkit.cli import main
from shardkit.cli.flags import add_option_flags, add_pile_args, options_from_args, pile_kwargs
from shardkit.cli.jobs import load_job, run_job
from shardkit.cli.main import build_parser
from shardkit.loading import options as loading_options
from shardkit.option_fields import specs, yaml_names
from shardkit.piles import options as pile_options

PACKAGE = pathlib.Path(shardkit.__file__).parent


def _files(directory) -> dict[str, bytes]:
    return {name: (pathlib.Path(directory) / name).read_bytes() for name in sorted(os.listdir(directory))}


def _unit(unit: int):
    for j in range(5):
        yield {"__key__": f"u{unit}-{j}", "txt": f"{unit} {j}"}


@pytest.fixture
def shards(tmp_path) -> list[str]:
    (tmp_path / "src").mkdir()
    return write_wds_shards(
        tmp_path / "src", "src-{:06d}.tar", 3, lambda k, i: {"__key__": f"k{k}_{i:03d}", "txt": f"{k}-{i}"} if i < 20 else None
    )


# ---- options= gives what the keywords give ------------------------------------------------


def test_loader_options_equal_keywords(dataset):
    opts = shardkit.LoaderOptions(batch_size=16, seed=5, mix=2, decode=False)
    with shardkit.loader(dataset, options=opts) as a, shardkit.loader(dataset, batch_size=16, seed=5, mix=2, decode=False) as b:
        assert a.options == b.options == dataclasses.replace(opts, rank=0, world_size=1)
        assert [batch["__key__"] for batch in a] == [batch["__key__"] for batch in b]


def test_preprocess_options_equal_keywords(tmp_path):
    opts = shardkit.PileOptions(piles=3, seed=4, workers=2, max_pile_bytes="4KiB")
    a = shardkit.preprocess(range(6), _unit, tmp_path / "a", options=opts, quiet=True)
    b = shardkit.preprocess(range(6), _unit, tmp_path / "b", piles=3, seed=4, workers=2, max_pile_bytes="4KiB", quiet=True)
    assert a == b and _files(tmp_path / "a") == _files(tmp_path / "b")


def test_pile_options_equal_keywords(tmp_path, shards):
    opts = shardkit.PileOptions(piles=2, seed=1, key_prefix="unit", on_error="skip")
    a = shardkit.pile(shards, tmp_path / "a", options=opts, quiet=True)
    b = shardkit.pile(shards, tmp_path / "b", piles=2, seed=1, key_prefix="unit", on_error="skip", quiet=True)
    assert a == b and _files(tmp_path / "a") == _files(tmp_path / "b") and a.samples == 60


def test_shuffle_options_equal_keywords(tmp_path, shards):
    opts = shardkit.ShuffleOptions(piles=2, maxcount=25, seed=2, key_prefix="unit")
    a = shardkit.shuffle(shards, tmp_path / "a", options=opts, quiet=True)
    b = shardkit.shuffle(shards, tmp_path / "b", piles=2, maxcount=25, seed=2, key_prefix="unit", quiet=True)
    assert a == b and _files(tmp_path / "a") == _files(tmp_path / "b") and [p.samples for p in a.piles] == [25, 25, 10]


def test_pile_writer_and_repile_take_options(tmp_path):
    opts = shardkit.PileOptions(piles=4, seed=2)
    for name, kwargs in (("a", {"options": opts}), ("b", {"piles": 4, "seed": 2})):
        with shardkit.PileWriter(tmp_path / name, **kwargs) as w:
            for s in make_samples(50):
                w.write(s)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    again = shardkit.repile(tmp_path / "a", tmp_path / "c", options=shardkit.PileOptions(piles=3, seed=7))
    assert (again.seed, len(again.piles), again.samples) == (7, 3, 50)
    assert shardkit.repile(tmp_path / "a", tmp_path / "d").seed == 3  # the source's seed + 1, as on the command line


# ---- options= and keywords: one or the other ------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda d, out: shardkit.loader(d, options=shardkit.LoaderOptions(), batch_size=64),
            "options: pass options= or keyword options, not both: got options= and batch_size=64",
        ),
        (
            lambda d, out: shardkit.preprocess([1], _unit, out, options=shardkit.PileOptions(piles=2), piles=3, workers=2),
            "options: pass options= or keyword options, not both: got options= and piles=3, workers=2",
        ),
        (
            lambda d, out: shardkit.pile(d, out, options=shardkit.PileOptions(piles=2), key_prefix="unit"),
            "got options= and key_prefix='unit'",
        ),
        (lambda d, out: shardkit.shuffle(d, out, options=shardkit.ShuffleOptions(), seed=1), "got options= and seed=1"),
        (lambda d, out: shardkit.PileWriter(out, options=shardkit.PileOptions(piles=2), overwrite=True), "got options= and overwrite=True"),
        (lambda d, out: shardkit.repile(d, out, options=shardkit.PileOptions(piles=2, seed=5), seed=6), "got options= and seed=6"),
        (lambda d, out: shardkit.loader(d, options={"batch_size": 2}), "options: expected a LoaderOptions, got dict"),
        (lambda d, out: shardkit.preprocess([1], _unit, out), r"piles: missing (required): pass piles=... or options=PileOptions(...)"),
        (lambda d, out: shardkit.PileWriter(out, seed=1), "piles: missing (required)"),
    ],
)
def test_options_and_keywords_do_not_mix(dataset, tmp_path, call, message):
    with pytest.raises(shardkit.ConfigError, match=re.escape(message)):
        call(dataset, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_keyword_left_at_its_default_does_not_count(dataset, tmp_path):
    with shardkit.loader(dataset, options=shardkit.LoaderOptions(seed=4), seed=0, shuffle=True) as loader:
        assert loader.options.seed == 4


@pytest.mark.parametrize(
    ("entry", "cls"),
    [
        (shardkit.loader, shardkit.LoaderOptions),
        (shardkit.preprocess, shardkit.PileOptions),
        (shardkit.pile, shardkit.PileOptions),
        (shardkit.shuffle, shardkit.ShuffleOptions),
        (shardkit.PileWriter, shardkit.PileOptions),
    ],
)
def test_keyword_defaults_are_the_field_defaults(entry, cls):
    # the rule "a keyword other than its default" is exact only when the two defaults agree
    params = inspect.signature(entry).parameters
    assert params["options"].default is None
    shared = [name for name in specs(cls) if name in params]
    assert len(shared) >= 5
    for name in shared:
        assert params[name].default == specs(cls)[name].default, name


def test_job_only_options_are_refused_where_they_mean_nothing(tmp_path):
    with pytest.raises(shardkit.ConfigError, match="workers: PileWriter writes samples in the calling process"):
        shardkit.PileWriter(tmp_path / "w", options=shardkit.PileOptions(piles=2, workers=4))
    with pytest.raises(shardkit.ConfigError, match="key_prefix: preprocess takes sample keys from its function"):
        shardkit.preprocess([1], _unit, tmp_path / "p", options=shardkit.PileOptions(piles=2, key_prefix="unit"))
    with pytest.raises(shardkit.ConfigError, match=re.escape("on_error: expected one of 'raise', 'skip', got 'warn'")):
        shardkit.PileOptions(piles=2, on_error="warn")
    assert not os.listdir(tmp_path)


# ---- the CLI and YAML read the fields ---------------------------------------------------------

# flags of a command that are not options (the command's own arguments and UI switches)
_NOT_OPTIONS = {
    "-h",
    "--help",
    "-o",
    "--out",
    "-q",
    "--quiet",
    "-v",
    "--verbose",
    "--storage-option",
    "--append",
    "--format",
    "--reader-arg",
}  # --append: --mode append, shorter; --format and --reader-arg: pile's input readers, arguments of pile() beside its options


def _flags(command: str) -> dict[str, argparse.Action]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices[command]._actions if a.option_strings and not set(a.option_strings) & _NOT_OPTIONS}


@pytest.mark.parametrize(
    ("command", "cls", "every_field"),
    [("pile", shardkit.PileOptions, True), ("shuffle", shardkit.ShuffleOptions, True), ("repile", shardkit.PileOptions, False)],
)
def test_every_flag_is_an_option_field(command, cls, every_field):
    flags = _flags(command)
    fields = specs(cls)
    assert set(flags) <= set(fields)
    if every_field:  # a field added to the class is a flag of the command, with no second declaration
        # storage options come from --storage-option, which every command takes and applies to every URL
        assert list(flags) != [] and set(flags) == set(fields) - {"storage_options"}
    for name, action in flags.items():
        spec = fields[name]
        negative = [f"--no-{spec.flag[2:]}"] if spec.is_bool and spec.default is True else []  # an option on by default
        assert action.option_strings == [spec.flag, *negative]
        assert action.choices is spec.choices  # the options module's tuple, not a copy
        assert spec.help is not None
        if command != "repile" or name not in ("piles", "seed"):  # repile's defaults come from SRC
            assert spec.help in action.help and action.default == spec.default


def test_choices_are_listed_once():
    assert _flags("pile")["on_error"].choices is pile_options.ON_ERROR
    assert _flags("pile")["key_prefix"].choices is pile_options.KEY_PREFIX
    assert _flags("shuffle")["key_prefix"].choices is pile_options.KEY_PREFIX
    assert specs(shardkit.LoaderOptions)["on_error"].choices is loading_options.ON_ERROR
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    for values in (pile_options.ON_ERROR, pile_options.KEY_PREFIX, loading_options.ON_ERROR):
        literal = ", ".join(f'"{v}"' for v in values)  # as written in the source
        assert source.count(f"({literal})") == 1, values


def test_derived_flags_build_the_options_class():
    parser = argparse.ArgumentParser()
    add_option_flags(parser, shardkit.LoaderOptions, ["batch_size", "shuffle", "on_error", "max_pile_bytes"])
    args = parser.parse_args(["--batch-size", "8", "--no-shuffle", "--on-error", "warn", "--max-pile-bytes", "1GiB"])
    opts = options_from_args(shardkit.LoaderOptions, args, ["batch_size", "shuffle", "on_error", "max_pile_bytes"])
    assert opts == shardkit.LoaderOptions(batch_size=8, shuffle=False, on_error="warn", max_pile_bytes=2**30)
    with pytest.raises(SystemExit):
        parser.parse_args(["--batch-size", "eight"])


def test_pile_kwargs_are_the_keywords_of_preprocess():
    parser = argparse.ArgumentParser()
    add_pile_args(parser)
    kwargs = pile_kwargs(parser.parse_args(["--piles", "4", "--on-error", "skip", "--max-pile-bytes", "2GiB", "-q"]))
    assert kwargs == {
        "piles": 4,
        "workers": 1,
        "seed": 0,
        "max_pile_bytes": "2GiB",
        "buffer_size": "64MiB",
        "overwrite": False,
        "resume": False,
        "on_error": "skip",
        "executor": "local",
        "ray_address": None,
        "compression": None,
        "compression_level": None,
        "repeat": None,
        "mode": "create",
        "window": None,
        "index": False,
        "storage_options": None,
        "quiet": True,
    }
    assert set(kwargs) <= set(inspect.signature(shardkit.preprocess).parameters)
    assert pile_kwargs(parser.parse_args(["--piles", "4", "--append", "--window", "90d"]))["mode"] == "append"


@pytest.mark.parametrize(("kind", "cls"), [("pile", shardkit.PileOptions), ("shuffle", shardkit.ShuffleOptions)])
def test_every_yaml_key_is_an_option_field(tmp_path, kind, cls):
    (tmp_path / "a.tar").write_bytes(b"\0" * 1024)
    job = f"job: {kind}\ninputs: a.tar\noutput: {{path: o, nosuch: 1}}\n"
    (tmp_path / "job.yaml").write_text(job)
    with pytest.raises(shardkit.ConfigError) as info:
        load_job(tmp_path / "job.yaml")
    listed = str(info.value).split("expected one of: ")[1].rstrip(")").split(", ")
    assert listed == ["path", *yaml_names(cls, "output")]
    # every field a YAML job takes, set to a value other than its default, reaches the options
    values = {"piles": 3, "seed": 9, "max_pile_bytes": "1MiB", "buffer_size": "2MiB", "overwrite": True, "workers": 2}
    values |= {"on_error": "skip", "memory": "3MiB", "maxcount": 10, "maxsize": "5MiB", "storage_options": {"anon": True}}
    values |= {"executor": "ray", "ray_address": "auto", "resume": True, "compression": "zstd", "compression_level": 5}
    values |= {"repeat": "cls:1=2", "key_prefix": "unit"}
    values |= {"mode": "append", "window": 3, "index": True}
    output = {name: values[name] for name in yaml_names(cls, "output")}
    if "mode" in output:
        output["overwrite"] = False  # an append adds to the dataset there: it refuses to replace it
    top = {name: values[name] for name in yaml_names(cls, "job")}
    text = f"job: {kind}\ninputs: a.tar\noutput: {{path: o, {', '.join(f'{k}: {v}' for k, v in output.items())}}}\n"
    text += "".join(f"{k}: {v}\n" for k, v in top.items())
    (tmp_path / "job.yaml").write_text(text)
    assert load_job(tmp_path / "job.yaml").options == cls(**output, **top)
    assert set(yaml_names(cls, "output")) | set(yaml_names(cls, "job")) == set(specs(cls))


def test_a_yaml_job_runs_with_its_options_object(tmp_path, shards):
    text = f"""\
        job: pile
        inputs: {tmp_path}/src/*.tar
        output: {{path: out, piles: 2, seed: 5}}
        workers: 2
        on_error: skip
    """
    (tmp_path / "job.yaml").write_text(textwrap.dedent(text))
    job = load_job(tmp_path / "job.yaml")
    assert job.options == shardkit.PileOptions(piles=2, seed=5, workers=2, on_error="skip")
    result = run_job(job, quiet=True)
    assert result == shardkit.pile(shards, tmp_path / "again", options=job.options, quiet=True)
    assert _files(tmp_path / "out") == _files(tmp_path / "again")


def test_cli_pile_builds_the_same_options(tmp_path, shards):
    out = tmp_path / "cli"
    argv = ["pile", *shards, "-o", str(out), "--piles", "2", "--seed", "3", "--key-prefix", "unit", "--buffer-size", "1MiB", "-q"]
    assert main(argv) == 0
    python = shardkit.pile(shards, tmp_path / "py", options=shardkit.PileOptions(piles=2, seed=3, key_prefix="unit"), quiet=True)
    assert manifest.read(str(out)) == python
