"""`shardkit pile`: brace patterns in, a one-line summary out, clean errors and exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardkit import manifest
from shardkit.cli import main
from shardkit.loading.pile import read_pile

ROOT = Path(__file__).resolve().parents[1]


def write_shards(src: Path, name: str, count: int, per_shard: int, key: str) -> Path:
    """``count`` webdataset shards ``name.format(k)`` of ``per_shard`` samples keyed ``key.format(k=, i=)``."""
    import webdataset as wds

    src.mkdir()
    for k in range(count):
        with wds.TarWriter(str(src / name.format(k))) as w:
            for i in range(per_shard):
                w.write({"__key__": key.format(k=k, i=i), "txt": f"{k} {i}"})
    return src


@pytest.fixture
def shards(tmp_path) -> Path:
    return write_shards(tmp_path / "src", "src-{:06d}.tar", 3, 20, "s{k}_{i:02d}")


def test_pile_with_a_brace_pattern(tmp_path, shards, capsys):
    out = tmp_path / "out"
    code = main(["pile", str(shards / "src-{000000..000002}.tar"), "-o", str(out), "--piles", "4", "--workers", "2", "--seed", "3", "-q"])
    assert code == 0
    line = capsys.readouterr().out
    assert line.startswith(f"{out}: 60 samples in 4 piles, ") and line.endswith("s\n") and line.count("\n") == 1
    m = manifest.read(str(out))
    assert m.seed == 3 and m.samples == 60
    keys = sorted(s["__key__"] for p in m.piles for s in read_pile(str(out / p.name), expected=p))
    assert keys == sorted(f"s{k}_{i:02d}" for k in range(3) for i in range(20))


@pytest.mark.parametrize("command", ["pile", "shuffle"])
def test_key_prefix_unit_merges_shards_whose_keys_restart(tmp_path, command, capsys):
    src = write_shards(tmp_path / "restart", "part-{}.tar", 2, 30, "{i:06d}")  # keys restart in each shard
    out = tmp_path / "out"
    assert main([command, str(src / "*.tar"), "-o", str(out), "--piles", "2", "--key-prefix", "unit", "-q"]) == 0
    assert main(["verify", str(out), "-q"]) == 0
    m = manifest.read(str(out))
    keys = sorted(s["__key__"] for p in m.piles for s in read_pile(str(out / p.name), expected=p))
    assert keys == sorted(f"part-{k}/{i:06d}" for k in range(2) for i in range(30))


def test_pile_summary_mentions_splits(tmp_path, shards, capsys):
    code = main(["pile", str(shards / "*.tar"), "-o", str(tmp_path / "out"), "--piles", "1", "--max-pile-bytes", "20KiB"])
    assert code == 0
    assert ", 1 oversized pile split" in capsys.readouterr().out
    assert all(p.bytes <= 20 * 1024 for p in manifest.read(str(tmp_path / "out")).piles)
    assert main(["info", str(tmp_path / "out")]) == 0
    assert "  (1 oversized pile split)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{src}/src-{{000000..000005}}.tar"], "src-000003.tar: no such file"),
        (["{src}/*.tar", "--piles", "0"], "piles: expected an integer >= 1, got 0"),
        (["{src}/*.tar", "--workers", "0"], "workers: expected an integer >= 1, got 0"),
        (["{src}/*.tar", "--max-pile-bytes", "big"], "max_pile_bytes: expected a size like 2GiB or 500MB, got 'big'"),
    ],
)
def test_errors_exit_1_with_one_error_line(tmp_path, shards, capsys, args, message):
    argv = ["pile", *[a.format(src=shards) for a in args], "-o", str(tmp_path / "out")]
    if "--piles" not in args:
        argv += ["--piles", "2"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("shardkit pile: error: ") and message in err and err.count("\n") == 1


def test_an_existing_dataset_needs_overwrite(tmp_path, shards, capsys):
    out = str(tmp_path / "out")
    assert main(["pile", str(shards / "*.tar"), "-o", out, "--piles", "2"]) == 0
    assert main(["pile", str(shards / "*.tar"), "-o", out, "--piles", "3"]) == 1
    assert "already holds a shardkit dataset" in capsys.readouterr().err
    assert main(["pile", str(shards / "*.tar"), "-o", out, "--piles", "3", "--overwrite"]) == 0
    assert len(manifest.read(out).piles) == 3


@pytest.mark.parametrize("argv", [["pile"], ["pile", "x.tar", "--piles", "2"], ["pile", "x.tar", "-o", "o", "--piles", "two"], ["nosuch"]])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage: shardkit" in capsys.readouterr().err


def test_help_says_what_pile_does(capsys):
    with pytest.raises(SystemExit) as info:
        main(["pile", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # as read, whatever the wrapping
    for flag in ("--piles", "--workers", "--seed", "--max-pile-bytes", "--overwrite", "--on-error", "brace patterns", ".tar.lz4"):
        assert flag in text


def test_command_line_error_has_no_traceback(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"x" * 700)  # not a tar
    done = subprocess.run(
        [sys.executable, "-m", "shardkit", "pile", str(bad), "-o", str(tmp_path / "out"), "--piles", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.startswith(f"shardkit pile: error: input unit 0 ('{bad}'): {bad}: member 0")
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "out" / "shardkit.json").exists()


@pytest.mark.parametrize("flags", [["--mode", "create", "--append"], ["--append", "--mode", "create"]])
def test_append_and_another_mode_are_refused_in_either_order(tmp_path, shards, capsys, flags):
    with pytest.raises(SystemExit) as refused:
        main(["pile", str(shards / "*.tar"), "-o", str(tmp_path / "out"), "--piles", "2", "-q", *flags])
    assert refused.value.code == 2
    assert "ask for different modes: give one" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert main(["pile", str(shards / "*.tar"), "-o", str(tmp_path / "out"), "--piles", "2", "-q", "--mode", "create"]) == 0
    # the same mode twice is no conflict: --append is --mode append
    assert main(["pile", str(shards / "*.tar"), "-o", str(tmp_path / "other"), "--piles", "2", "-q", "--mode", "append", "--append"]) == 1
    assert "no shardkit dataset to append to" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()  # the failed append made no folder


@pytest.mark.parametrize("command", ["pile", "shuffle"])
def test_a_failed_job_leaves_no_folder_behind_and_a_rerun_writes_it(tmp_path, shards, capsys, command):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"garbage")
    out = tmp_path / "x" / "out"  # neither folder was there: the output goes, its parent stays
    assert main([command, str(bad), "-o", str(out), "--piles", "4", "-q"]) == 1
    assert str(bad) in capsys.readouterr().err
    assert os.listdir(tmp_path / "x") == []
    assert main([command, str(shards / "*.tar"), "-o", str(out), "--piles", "4", "-q"]) == 0
    assert manifest.read(str(out)).samples == 60


def test_a_failed_job_keeps_the_folder_that_was_there(tmp_path, capsys):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"garbage")
    out = tmp_path / "out"
    out.mkdir()
    assert main(["pile", str(bad), "-o", str(out), "--piles", "4", "-q"]) == 1
    assert out.is_dir() and os.listdir(out) == []
