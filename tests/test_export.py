"""`shardkit export`: a dataset back to Parquet, in pile order or one epoch's order, bytes as stored."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

import shardkit
from shardkit import storage
from shardkit.cli import main
from shardkit.piles.readers import make
from shardkit.tar.shard import iter_shard

pq = pytest.importorskip("pyarrow.parquet", reason="the parquet extra (pyarrow) is not installed")


@pytest.fixture
def dataset(tmp_path):
    samples = [{"__key__": f"s{i:03d}", "txt": f"text {i}", **({"cls": i % 3} if i % 4 else {})} for i in range(60)]
    return shardkit.preprocess([samples[:30], samples[30:]], lambda unit: unit, tmp_path / "piles", piles=4, seed=5, quiet=True)


def test_export_in_pile_order_and_back(tmp_path, dataset):
    result = shardkit.export(tmp_path / "piles", tmp_path / "all.parquet", rows_per_group=16, quiet=True)
    table = pq.read_table(tmp_path / "all.parquet")
    assert result.rows == table.num_rows == 60 and result.columns == ("__key__", "cls", "txt")
    assert pq.ParquetFile(tmp_path / "all.parquet").metadata.num_row_groups == 4
    stored = [s for pile in sorted((tmp_path / "piles").glob("pile-*.tar")) for s in iter_shard(str(pile))]
    assert table.column("__key__").to_pylist() == [s["__key__"] for s in stored]  # pile order
    row = table.slice(0, 1).to_pylist()[0]
    assert row["txt"] == stored[0]["txt"] and row["cls"] == stored[0].get("cls")  # null where a sample has no field
    # piled again with its keys, the export gives back the same samples
    shardkit.pile(str(tmp_path / "all.parquet"), tmp_path / "again", piles=2, quiet=True, format=make("parquet", key="__key__"))
    again = {s.pop("__key__"): s for p in (tmp_path / "again").glob("pile-*.tar") for s in iter_shard(str(p))}
    assert again == {s.pop("__key__"): s for s in stored}


def test_export_one_epochs_order_and_the_command(tmp_path, dataset, capsys):
    shardkit.export(tmp_path / "piles", tmp_path / "e2.parquet", seed=9, epoch=2, quiet=True)
    with shardkit.loader(str(tmp_path / "piles"), seed=9, decode=False) as reader:
        reader.set_epoch(2)
        expected = [s["__key__"] for s in reader]
    assert pq.read_table(tmp_path / "e2.parquet").column("__key__").to_pylist() == expected
    assert (
        main(
            ["export", str(tmp_path / "piles"), "--to", "parquet", "-o", str(tmp_path / "cli.parquet"), "--seed", "9", "--epoch", "2", "-q"]
        )
        == 0
    )
    assert "60 samples" in capsys.readouterr().out
    assert pq.read_table(tmp_path / "cli.parquet").equals(pq.read_table(tmp_path / "e2.parquet"))
    assert main(["export", str(tmp_path / "piles"), "-o", str(tmp_path / "x.parquet"), "--epoch", "1"]) == 1
    assert "give --seed too" in capsys.readouterr().err
    assert not (tmp_path / "x.parquet").exists()
    with pytest.raises(shardkit.ConfigError, match=r"epoch: .*give seed= too"):  # in Python too, not pile order
        shardkit.export(tmp_path / "piles", tmp_path / "x.parquet", epoch=1, quiet=True)
    assert not (tmp_path / "x.parquet").exists()


@pytest.mark.parametrize("rank", ["1", None], ids=["RANK=1", "no RANK"])
def test_export_inside_a_distributed_job_writes_every_sample(tmp_path, dataset, monkeypatch, rank):
    """A job launched with WORLD_SIZE (and RANK) around it exports the whole dataset, not one rank's share."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    for seed in (None, 3):
        result = shardkit.export(tmp_path / "piles", tmp_path / f"all-{seed}.parquet", seed=seed, quiet=True)
        assert result.rows == 60


@pytest.mark.parametrize("name", ["shardkit.json", "pile-000000.tar", "shardkit.g000001.json"])
def test_export_refuses_to_write_over_a_file_of_the_dataset(tmp_path, dataset, capsys, name):
    """``-o piles/shardkit.json`` would replace the dataset's own manifest (or a pile) with Parquet."""
    before = {p.name: p.read_bytes() for p in (tmp_path / "piles").iterdir()}
    with pytest.raises(shardkit.ConfigError, match=rf"{name}: .*the dataset's own"):
        shardkit.export(tmp_path / "piles", tmp_path / "piles" / name, quiet=True)
    assert main(["export", str(tmp_path / "piles") + "/", "-o", str(tmp_path / "piles" / "." / name), "-q"]) == 1
    assert "the dataset's own" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (tmp_path / "piles").iterdir()} == before
    shardkit.export(tmp_path / "piles", tmp_path / "piles" / "all.parquet", quiet=True)  # a name of its own is fine


def test_an_append_between_the_manifest_read_and_the_rows_loses_no_field(tmp_path, dataset, monkeypatch):
    """The columns came from one read of the manifest and the rows from the loader's own, later
    one: a generation appended in between, with a new field, was exported without that field."""
    from shardkit.tools import export as export_module

    real = export_module.info

    def info_then_append(*args, **kwargs):
        found = real(*args, **kwargs)
        with shardkit.PileWriter(tmp_path / "piles", piles=4, seed=5, mode="append") as w:
            w.write({"__key__": "new", "txt": "t", "extra": b"\xff"})
        return found

    monkeypatch.setattr(export_module, "info", info_then_append)
    result = shardkit.export(tmp_path / "piles", tmp_path / "all.parquet", quiet=True)
    assert result.rows == 61 and result.columns == ("__key__", "cls", "extra", "txt")
    rows = {r["__key__"]: r for r in pq.read_table(tmp_path / "all.parquet").to_pylist()}
    assert rows["new"]["extra"] == b"\xff"


def test_quiet_is_true_or_false(tmp_path, dataset):
    """``quiet="no"`` was taken for quiet (a truthy string), as repile and pile refuse it."""
    with pytest.raises(shardkit.ConfigError, match=r"quiet: expected True or False, got 'no'"):
        shardkit.export(tmp_path / "piles", tmp_path / "x.parquet", quiet="no")
    assert not (tmp_path / "x.parquet").exists()


def _other_dataset(path) -> dict:
    with shardkit.PileWriter(path, piles=2, seed=0) as w:
        for i in range(10):
            w.write({"__key__": f"k{i}", "txt": "x"})
    return {p.name: p.read_bytes() for p in path.iterdir()}


@pytest.mark.parametrize("name", ["shardkit.json", "pile-000000.tar"])
def test_export_refuses_a_name_of_another_dataset_s_files(tmp_path, dataset, capsys, name):
    before = _other_dataset(tmp_path / "other")
    with pytest.raises(shardkit.ConfigError, match=rf"other/{name}: is a name shardkit gives a dataset's \w+ files; .*another name"):
        shardkit.export(tmp_path / "piles", tmp_path / "other" / name, quiet=True)
    assert main(["export", str(tmp_path / "piles"), "-o", str(tmp_path / "other" / name), "-q"]) == 1
    assert "a name shardkit gives" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (tmp_path / "other").iterdir()} == before


def test_export_writes_through_a_link_and_refuses_what_is_no_file(tmp_path, dataset):
    real = tmp_path / "real.parquet"
    real.write_bytes(b"old")
    (tmp_path / "link.parquet").symlink_to(real)
    shardkit.export(tmp_path / "piles", tmp_path / "link.parquet", quiet=True)
    assert (tmp_path / "link.parquet").is_symlink() and pq.read_table(real).num_rows == 60
    before = _other_dataset(tmp_path / "other")
    (tmp_path / "to-manifest").symlink_to(tmp_path / "other" / "shardkit.json")  # a link to a dataset's file: refused
    with pytest.raises(shardkit.ConfigError, match=r"other/shardkit\.json: is a name shardkit gives"):
        shardkit.export(tmp_path / "piles", tmp_path / "to-manifest", quiet=True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "other").iterdir()} == before
    os.mkfifo(tmp_path / "fifo.parquet")
    with pytest.raises(shardkit.ConfigError, match=r"fifo\.parquet: is not a regular file"):
        shardkit.export(tmp_path / "piles", tmp_path / "fifo.parquet", quiet=True)
    assert stat.S_ISFIFO(os.stat(tmp_path / "fifo.parquet").st_mode)
    with pytest.raises(shardkit.ConfigError, match=r"other: is a directory: name the file to write in it, e\.g\. .*other/NAME"):
        shardkit.export(tmp_path / "piles", tmp_path / "other", quiet=True)
    with pytest.raises(shardkit.ConfigError, match=r"-: export writes a Parquet file, not to standard output"):
        shardkit.export(tmp_path / "piles", "-", quiet=True)


def test_export_without_pyarrow_says_which_extra(tmp_path, dataset, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow: ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(shardkit.ConfigError, match=r"export needs pyarrow, which is not installed: pip install 'shardkit\[parquet\]'"):
        shardkit.export(tmp_path / "piles", tmp_path / "all.parquet", quiet=True)
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    assert main(["pile", str(tmp_path / "x.parquet"), "-o", str(tmp_path / "out"), "--piles", "2", "-q"]) == 1
    assert "x.parquet: reading Parquet needs pyarrow, which is not installed: pip install 'shardkit[parquet]'" in capsys.readouterr().err


def test_what_a_killed_export_left_is_removed_by_the_next(tmp_path, dataset):
    """A write killed mid-way leaves OUT.partial-<uuid>; the next export to OUT removes it, but
    never one a live writer still holds, nor another name."""
    target = tmp_path / "all.parquet"
    script = (
        "import os, signal, sys\nfrom shardkit import storage\n"
        "with storage.atomic_write(sys.argv[1]) as f:\n    f.write(b'half a file')\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    assert subprocess.run([sys.executable, "-c", script, str(target)]).returncode == -signal.SIGKILL
    (dead,) = tmp_path.glob("all.parquet.partial-*")
    assert storage.remove_dead_partials(str(target)) == []  # under PARTIAL_AGE_S old: its writer may not have locked it yet
    os.utime(dead, (time.time() - 60, time.time() - 60))  # killed a minute ago
    (tmp_path / "other.parquet.partial-0123").write_bytes(b"mine")
    with storage.atomic_write(str(target)):  # a writer still at work beside the export
        (live,) = set(tmp_path.glob("all.parquet.partial-*")) - {dead}
        assert storage.remove_dead_partials(str(target)) == [dead.name]
        assert live.exists() and not dead.exists()
    subprocess.run([sys.executable, "-c", script, str(target)])
    for left in tmp_path.glob("all.parquet.partial-*"):
        os.utime(left, (time.time() - 60, time.time() - 60))
    shardkit.export(tmp_path / "piles", target, quiet=True)
    assert sorted(p.name for p in tmp_path.glob("*.partial-*")) == ["other.parquet.partial-0123"]
    assert pq.read_table(target).num_rows == 60


def test_a_write_at_work_is_never_taken_for_a_dead_one(tmp_path):
    """Writes of one name and removals of dead partials at once: every write lands."""
    store = storage.store_for(str(tmp_path))
    stop, failures = threading.Event(), []

    def sweep():
        while not stop.is_set():
            store.remove_dead_partials("out.parquet")

    sweeper = threading.Thread(target=sweep)
    sweeper.start()
    try:
        for i in range(300):
            try:
                with store.put_stream("out.parquet", sync=False) as f:
                    f.write(b"%d" % i)
            except shardkit.ShardkitError as e:
                failures.append(str(e))
    finally:
        stop.set()
        sweeper.join()
    assert failures == [] and (tmp_path / "out.parquet").read_bytes() == b"299"
