"""Pass 1 and the eager shuffle write the random-access index as they publish: the first pile of a dataset as written starts by range."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import shardkit
from shardkit import manifest, storage
from shardkit.cli.main import main
from shardkit.dataset import layout
from shardkit.loading import index as index_module
from shardkit.loading import source as source_module
from tests.conftest import hold_whole_reads, make_samples, write_wds_shards

N = 160


def _samples(i: int) -> list[dict]:
    return [{**s, "__key__": f"u{i}-{s['__key__']}"} for s in make_samples(N // 4, size=300 + 40 * i)]


def _write(door: str, out: str, tmp_path: Path, **options) -> manifest.Manifest:
    """A dataset written by one front door, its M and seed fixed, with its index unless told otherwise."""
    options.setdefault("index", True)
    if door == "writer":
        with shardkit.PileWriter(out, piles=3, seed=4, **options) as w:
            for s in make_samples(N, size=500):
                w.write(s)
        return w.manifest
    if door == "preprocess":
        return shardkit.preprocess(list(range(4)), _samples, out, piles=3, seed=4, quiet=True, **options)
    if door == "shuffle":  # shards of at most 40 samples: several files, the first one read by range
        return shardkit.shuffle(_shards(tmp_path), out, piles=3, seed=4, maxcount=40, quiet=True, **options)
    return shardkit.pile(_shards(tmp_path), out, piles=3, seed=4, quiet=True, **options)


def _shards(tmp_path: Path, count: int = 3) -> list[str]:
    """``count`` input shards of 50 samples each (written once per test)."""
    src = tmp_path / "src"
    if not src.exists():
        src.mkdir()
        write_wds_shards(src, "s-{:03d}.tar", count, lambda k, i: {"__key__": f"k{k}-{i:05d}", "txt": b"x" * (i % 90)} if i < 50 else None)
    return sorted(str(p) for p in src.glob("s-*.tar"))


def _index_path(out: str) -> str:
    return os.path.join(out, layout.index_name(manifest.read(out).generation))


def _starts_by_range(out: str, monkeypatch) -> bool:
    """Whether the loader hands out its first samples while no pile may be read whole."""
    real = source_module.fetch
    gate = hold_whole_reads(monkeypatch)
    done: list[bool] = []

    def first() -> None:
        with shardkit.loader(out, decode=False) as loader:
            next(iter(loader))
            done.append(True)

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    thread.join(5)
    early = bool(done)
    gate.set()
    thread.join(20)
    monkeypatch.setattr(source_module, "fetch", real)
    return early


@pytest.mark.parametrize("door", ["writer", "preprocess", "pile", "shuffle"])
def test_a_dataset_as_written_has_its_index_and_starts_its_first_pile_by_range(door, tmp_path, monkeypatch):
    out = str(tmp_path / "ds")
    m = _write(door, out, tmp_path)
    path = _index_path(out)
    with open(path, "rb") as f:
        written = f.read()
    assert written.startswith(index_module.MAGIC)
    # the same bytes an index built by reading every pile has
    assert written == index_module.encode(index_module.build(out, m), m)
    assert shardkit.verify(out, quiet=True) == []
    assert _starts_by_range(out, monkeypatch)


@pytest.mark.parametrize("door", ["writer", "preprocess", "pile", "shuffle"])
def test_the_piles_are_the_same_bytes_without_the_index_and_then_none_is_written(door, tmp_path, monkeypatch):
    with_index, without = str(tmp_path / "a"), str(tmp_path / "b")
    _write(door, with_index, tmp_path)
    _write(door, without, tmp_path, index=False)
    assert not os.path.exists(_index_path(without))
    assert manifest.read(with_index).to_json() == manifest.read(without).to_json()
    for name in manifest.read(without).files():
        assert Path(with_index, name).read_bytes() == Path(without, name).read_bytes()
    assert not _starts_by_range(without, monkeypatch)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_split_and_compressed_piles_are_indexed_from_their_staged_copies(compression, tmp_path):
    out = str(tmp_path / "ds")
    m = shardkit.preprocess(
        list(range(4)), _samples, out, piles=2, seed=1, max_pile_bytes="40KiB", compression=compression, index=True, quiet=True
    )
    assert m.split_piles > 0
    with open(_index_path(out), "rb") as f:
        assert f.read() == index_module.encode(index_module.build(out, m), m)
    ds = shardkit.open(out, decode=False)
    assert sorted(ds[i]["__key__"] for i in range(len(ds))) == sorted(s["__key__"] for i in range(4) for s in _samples(i))


def test_an_overwrite_and_gc_keep_only_the_current_generations_index(tmp_path):
    out = str(tmp_path / "ds")
    _write("writer", out, tmp_path)
    shardkit.gc(out, grace=0)
    assert os.path.exists(_index_path(out))
    _write("preprocess", out, tmp_path, overwrite=True)
    shardkit.gc(out, grace=0)
    m = manifest.read(out)
    left = sorted(n for n in os.listdir(out) if layout.INDEX_FILE.fullmatch(n))
    assert left == [layout.index_name(m.generation)]
    assert index_module.decode(storage.read_bytes(_index_path(out)), m, out).crcs is not None
    assert shardkit.verify(out, quiet=True) == []


@pytest.mark.parametrize("split", [False, True])
def test_an_append_indexes_its_new_files_and_takes_the_kept_ones_from_the_last_index(split, tmp_path, monkeypatch):
    out = str(tmp_path / "ds")
    limit = {"max_pile_bytes": "64KiB"} if split else {}
    with shardkit.PileWriter(out, piles=3, seed=4, index=True, **limit) as w:
        for s in make_samples(N, size=500):
            w.write(s)
    first = _index_path(out)
    for generation, window in ((1, None), (2, 1)):
        with shardkit.PileWriter(out, piles=3, seed=4, mode="append", window=window, index=True, **limit) as w:
            for s in make_samples(N // 2, size=400, seed=9):
                w.write({**s, "__key__": f"g{generation}-{s['__key__']}"})
        m = manifest.read(out)
        assert m.generation == generation
        if window is None:
            assert any(len(p.parts) > 1 for p in m.piles)  # files of generation 0 kept beside the new segments
        with open(_index_path(out), "rb") as f:
            assert f.read() == index_module.encode(index_module.build(out, m), m)
        assert shardkit.verify(out, quiet=True) == []
    assert _starts_by_range(out, monkeypatch)
    shardkit.gc(out, grace=0)  # generations 0 and 1 left the window: their indexes go with them
    assert sorted(n for n in os.listdir(out) if layout.INDEX_FILE.fullmatch(n)) == [layout.index_name(2)]
    assert not os.path.exists(first)


def test_an_append_to_a_dataset_without_an_index_writes_none(tmp_path):
    out = str(tmp_path / "ds")
    _write("writer", out, tmp_path, index=False)
    with shardkit.PileWriter(out, piles=3, seed=4, mode="append", index=True) as w:
        w.write({"__key__": "new", "bin": b"x"})
    assert not os.path.exists(_index_path(out))  # its old files are not read again: built when first needed
    assert shardkit.verify(out, quiet=True) == []


def test_on_s3_the_index_is_made_from_the_local_staging_and_uploaded(s3, monkeypatch):
    url = s3.url("ds")
    reads: list[str] = []
    for method in ("read", "read_range", "read_whole"):
        real = getattr(storage.FsspecStore, method)
        monkeypatch.setattr(
            storage.FsspecStore, method, lambda self, name, *a, _real=real, **kw: reads.append(name) or _real(self, name, *a, **kw)
        )
    m = _write("writer", url, Path("."))
    assert not [r for r in reads if "pile-" in r]  # no pile came back from the store
    monkeypatch.setattr(source_module, "fetch", real)
    data = storage.read_bytes(storage.join(url, layout.index_name(m.generation)))
    assert data == index_module.encode(index_module.build(url, m), m)


@pytest.mark.parametrize("command", ["pile", "shuffle"])
def test_the_command_line_writes_it_when_asked(command, tmp_path):
    shards = _shards(tmp_path, 2)
    for flag, expected in (([], False), (["--index"], True)):
        out = str(tmp_path / f"out{len(flag)}")
        assert main([command, *shards, "-o", out, "--piles", "2", "-q", *flag]) == 0
        assert os.path.exists(_index_path(out)) is expected


def test_an_index_that_cannot_be_written_is_logged_and_the_dataset_stays_published(tmp_path, caplog):
    out = tmp_path / "ds"
    (out / layout.index_name(0)).mkdir(parents=True)  # where the index goes: a directory, so no file can take its name
    with caplog.at_level("WARNING"):
        m = _write("writer", str(out), tmp_path)
    assert manifest.read(str(out)) == m
    assert "the dataset is published, but its index was not written" in caplog.text
    with shardkit.loader(str(out), decode=False) as loader:
        assert len(list(loader)) == N
