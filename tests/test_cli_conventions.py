"""The command line's conventions in the CLI and every script: -o/--out, -V, no abbreviations,
errors that name the command and the typo."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from shardkit._util import VERSION
from shardkit.cli import main

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("preprocess_images.py", "preprocess_jsonl.py")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), ROOT / "scripts" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _usage_error(argv: list[str], capsys, run=main) -> str:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.fixture
def shard(dataset) -> str:
    return str(Path(dataset) / "pile-000000.tar")


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([flag])
    assert exit_info.value.code == 0 and capsys.readouterr().out == f"shardkit {VERSION}\n"


@pytest.mark.parametrize("name", SCRIPTS)
def test_scripts_take_version_and_short_out(name, capsys, tmp_path):
    script = _script(name)
    with pytest.raises(SystemExit):
        script.main(["-V"])
    assert capsys.readouterr().out == f"{name} {VERSION}\n"
    args = script.build_parser().parse_args(["x", "-o", str(tmp_path), "--piles", "2"])
    assert args.out == str(tmp_path)


@pytest.mark.parametrize("flag", ["-o", "--out"])
def test_every_writing_command_takes_short_and_long_out(flag, shard, tmp_path, capsys):
    for i, command in enumerate(("pile", "shuffle")):
        out = str(tmp_path / f"o{i}")
        assert main([command, shard, flag, out, "--piles", "2", "-q"]) == 0
        assert (Path(out) / "shardkit.json").exists()


def test_no_abbreviations(shard, tmp_path, capsys):
    # --pile is not --piles: argparse's prefix matching is off
    last = _usage_error(["pile", shard, "-o", str(tmp_path / "o"), "--pile", "4"], capsys)
    assert last == "shardkit pile: error: unrecognized argument --pile (did you mean --piles?)"
    last = _usage_error(["pile", shard, "-o", str(tmp_path / "o"), "--piles", "4", "--work", "2"], capsys)
    assert last == "shardkit pile: error: unrecognized arguments: --work 2 (did you mean --workers?)"
    assert not (tmp_path / "o").exists()
    last = _usage_error(["--verb", "info", str(tmp_path)], capsys)
    assert last.startswith("shardkit: error: unrecognized arguments: --verb")


@pytest.mark.parametrize("name", SCRIPTS)
def test_scripts_take_no_abbreviations(name, capsys, tmp_path):
    last = _usage_error(["x", "--out", str(tmp_path), "--pile", "2"], capsys, run=_script(name).main)
    assert last == f"{name}: error: unrecognized argument --pile (did you mean --piles?)"


def test_a_typo_is_named_before_a_missing_required_flag(shard, tmp_path, capsys):
    last = _usage_error(["pile", shard, "-o", str(tmp_path / "o"), "--piels", "4"], capsys)
    assert last == "shardkit pile: error: unrecognized argument --piels (did you mean --piles?)"
    last = _usage_error(["pile", shard, "-o", str(tmp_path / "o"), "--piels=4"], capsys)
    assert last == "shardkit pile: error: unrecognized argument --piels (did you mean --piles?)"


def test_a_missing_flag_is_still_named(shard, capsys):
    last = _usage_error(["pile", shard, "--piles", "4"], capsys)
    assert last == "shardkit pile: error: the following arguments are required: -o/--out"


def test_an_unknown_command_suggests_the_closest(capsys):
    last = _usage_error(["pilee", "x"], capsys)
    assert re.fullmatch(r"shardkit: error: argument COMMAND: invalid choice: 'pilee' \(choose from .*\) \(did you mean pile\?\)", last)
    last = _usage_error(["zzzz"], capsys)
    assert "did you mean" not in last


def test_a_bad_choice_suggests_the_closest(shard, tmp_path, capsys):
    last = _usage_error(["pile", shard, "-o", str(tmp_path / "o"), "--piles", "2", "--on-error", "skp"], capsys)
    assert last.startswith("shardkit pile: error: argument --on-error: invalid choice: 'skp'") and last.endswith("(did you mean skip?)")


def test_usage_and_runtime_errors_name_the_subcommand(tmp_path, capsys):
    assert main(["info", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith("shardkit info: error: ")
    last = _usage_error(["verify"], capsys)
    assert last == "shardkit verify: error: the following arguments are required: DIR"


def test_negative_numbers_and_repeated_short_flags_are_not_typos(tmp_path, capsys):
    # -vv and a negative value look like flags to a naive check
    assert main(["info", str(tmp_path), "-vv"]) == 1
    assert "unrecognized" not in capsys.readouterr().err
    assert _usage_error(["trace", str(tmp_path), "--epoch", "-1"], capsys).endswith("the following arguments are required: --step")


def _commands():
    from shardkit.cli.commands import COMMANDS
    from shardkit.cli.main import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.choices and not a.option_strings]
    return COMMANDS, sub.choices


def test_every_command_is_declared_once_and_its_parser_runs_its_handler():
    commands, parsers = _commands()
    assert [c.name for c in commands] == list(parsers)  # --help lists them in declaration order, each once
    for command in commands:
        assert parsers[command.name].get_default("handler") is command.run
        assert parsers[command.name].get_default("prog") == f"shardkit {command.name}"


def test_a_description_in_lines_is_printed_as_written_and_a_paragraph_is_wrapped(monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    commands, parsers = _commands()
    kinds = set()
    for command in commands:
        text = parsers[command.name].format_help()
        lines = "\n" in command.description
        kinds.add(lines)
        if lines:
            assert command.description in text and (command.epilog or "") in text, command.name
        elif len(command.description) > 60:
            assert command.description not in text and " ".join(command.description.split()) in " ".join(text.split()), command.name
    assert kinds == {True, False}


@pytest.mark.parametrize("name", ["pile", "info", "verify", "gc", "shuffle", "run", "demo", "trace", "quality", "repile", "export"])
def test_verbose_is_taken_after_every_command_that_reads_or_writes_a_dataset(name):
    _, parsers = _commands()
    flags = {s for a in parsers[name]._actions for s in a.option_strings}
    assert {"-v", "--verbose", "--storage-option"} <= flags


@pytest.mark.parametrize("buffered", [True, False])
def test_output_into_a_closed_pipe_ends_quietly(dataset, buffered):
    """``shardkit info DIR | head -1``: the reader closes the pipe early; the command stops with
    SIGPIPE's status and no error line or traceback, whether its output was still buffered when
    the command ended (a pipe's usual case) or written as it went (``PYTHONUNBUFFERED``)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | ({} if buffered else {"PYTHONUNBUFFERED": "1"})
    read, write = os.pipe()
    os.close(read)  # every write into the pipe fails: what head does once it has its lines
    try:
        done = subprocess.run(
            [sys.executable, "-m", "shardkit", "info", dataset], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120, env=env
        )
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""


def test_a_quoted_home_in_a_path_is_the_home_directory(tmp_path, monkeypatch):
    """'~/...' quoted (as patterns are quoted to reach shardkit whole) is expanded as YAML jobs
    expand it, for inputs and outputs: -o '~/out' made a folder named '~' in the working directory."""
    import shardkit
    from tests.conftest import write_wds_shards

    (tmp_path / "in").mkdir()
    (tmp_path / "here").mkdir()
    write_wds_shards(tmp_path / "in", "s-{}.tar", 2, lambda k, i: {"__key__": f"{k}-{i:04d}", "txt": b"x"} if i < 5 else None)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path / "here")
    assert main(["pile", "~/in/*.tar", "-o", "~/out", "--piles", "2"]) == 0
    assert shardkit.info(str(tmp_path / "out")).samples == 10
    assert main(["info", "~/out"]) == 0
    assert list((tmp_path / "here").iterdir()) == []


def test_a_missing_directory_is_said_to_be_missing(tmp_path, capsys):
    """A mistyped path is no dataset because nothing is there, not because a job did not finish."""
    for command in ("info", "verify"):
        assert main([command, str(tmp_path / "tyop")]) == 1
        assert capsys.readouterr().err == f"shardkit {command}: error: {tmp_path}/tyop: no such directory (expected a shardkit dataset)\n"
    (tmp_path / "empty").mkdir()
    assert main(["info", str(tmp_path / "empty")]) == 1
    assert "not a shardkit dataset (no shardkit.json; a job that did not finish leaves none)" in capsys.readouterr().err


def test_plan_refuses_counts_that_are_no_numbers_in_one_line(capsys):
    for bad in ("inf", "nan", "1e999"):
        with pytest.raises(SystemExit):
            main(["plan", "--samples", bad, "--units", "1", "--piles", "1"])
        err = capsys.readouterr().err
        assert f"argument --samples: expected a whole count >= 1, got '{bad}'" in err and "Traceback" not in err
