"""A dataset's life on the in-memory store: write, read, verify, leftovers, gc and failures, in milliseconds."""

from __future__ import annotations

import pytest
from conftest import make_samples

import shardkit
from shardkit import manifest, storage
from shardkit.errors import CorruptShardError, DatasetNotFoundError, StorageError


@pytest.fixture
def mem():
    store = storage.mount(storage.MemoryStore())
    yield store
    storage.unmount(store)


def _write(out: str, n: int = 60, *, piles: int = 4, **kw) -> None:
    with shardkit.PileWriter(out, piles=piles, seed=0, **kw) as w:
        for s in make_samples(n):
            w.write(s)


def _keys(out: str) -> list[str]:
    return sorted(s["__key__"] for s in shardkit.loader(out, decode=False, shuffle=False))


def test_a_dataset_written_to_memory_reads_and_verifies_as_on_disk(mem, tmp_path):
    out = mem.root + "/ds"
    _write(out)
    _write(str(tmp_path / "ds"))
    assert mem.sub("ds").list() == sorted(storage.listdir(str(tmp_path / "ds")))
    for name in mem.sub("ds").list():  # byte for byte the dataset a local writer makes
        assert mem.sub("ds").read(name) == storage.read_bytes(str(tmp_path / "ds" / name)), name
    assert _keys(out) == sorted(s["__key__"] for s in make_samples(60))
    assert shardkit.verify(out, quiet=True) == []
    ds = shardkit.open(out, decode=False)
    assert ds.get("s0000007")["__key__"] == "s0000007"


def test_a_changed_byte_is_found_by_verify_and_named_by_the_loader(mem):
    out = mem.root + "/ds"
    _write(out)
    pile = manifest.read(out).piles[1].name
    data = bytearray(mem.sub("ds").read(pile))
    data[700] ^= 0xFF
    mem.sub("ds").put(pile, bytes(data))
    assert [p.kind for p in shardkit.verify(out, quiet=True)] == ["checksum"]
    with pytest.raises(CorruptShardError, match=rf"{out}/{pile}: checksum is"):
        _keys(out)


def test_leftovers_and_extra_piles_are_reported_and_gc_keeps_what_is_not_its_own(mem):
    out = mem.root + "/ds"
    _write(out)
    ds = mem.sub("ds")
    ds.put("pile-000099.tar", b"stray")
    ds.put("notes.txt", b"the user's")
    ds.put(".shardkit-staging-abc/part-0.tar", b"half")
    assert sorted((p.name, p.kind) for p in shardkit.verify(out, quiet=True)) == [
        (".shardkit-staging-abc", "leftover"),
        ("pile-000099.tar", "extra"),
    ]
    report = shardkit.gc(out, grace=0)
    assert report.deleted == [] and "pile-000099.tar" in report.skipped  # no record of the dataset names it
    assert {"notes.txt", "pile-000099.tar"} <= set(ds.list())
    assert _keys(out) == sorted(s["__key__"] for s in make_samples(60))


def test_an_overwrite_replaces_the_dataset_and_gc_removes_the_old_generation(mem):
    out = mem.root + "/ds"
    _write(out, 60, piles=4)
    _write(out, 30, piles=2, overwrite=True)
    assert _keys(out) == sorted(s["__key__"] for s in make_samples(30))
    shardkit.gc(out, grace=0)
    assert shardkit.verify(out, quiet=True) == []
    assert not [n for n in mem.sub("ds").list() if n in ("pile-000002.tar", "pile-000003.tar")]


@pytest.mark.parametrize("nth", [1, 4, 5])
def test_a_failed_install_leaves_no_dataset_and_the_next_writer_succeeds(nth):
    faulty = storage.mount(storage.FaultyStore(storage.MemoryStore()))
    try:
        # a fresh dataset's conditional writes: its four piles, then the manifest
        faulty.fail("put_if_absent", nth=nth)
        named = manifest.MANIFEST if nth == 5 else "pile-0000"
        with pytest.raises(StorageError, match=rf"{faulty.root}/{named}.*: cannot write: .*injected failure"):
            _write(faulty.root)
        assert not faulty.exists(manifest.MANIFEST)
        with pytest.raises(DatasetNotFoundError):
            shardkit.loader(faulty.root)
        _write(faulty.root)
        assert _keys(faulty.root) == sorted(s["__key__"] for s in make_samples(60))
    finally:
        storage.unmount(faulty)
