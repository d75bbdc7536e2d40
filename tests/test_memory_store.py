"""A dataset's life on the in-memory store: write, read, verify, leftovers, gc and failures, in milliseconds."""

from __future__ import annotations

import logging

import pytest
from conftest import STOP_AT, make_samples, unit_samples

import shardkit
from shardkit import manifest, storage
from shardkit.dataset import layout
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


def _same_files(mem_dir: storage.Store, local: str) -> None:
    names = [n for n in mem_dir.list() if not n.startswith("shardkit.")]
    assert names == [n for n in sorted(storage.listdir(local)) if not n.startswith("shardkit.")]
    for name in names:  # byte for byte what a local writer makes
        assert mem_dir.read(name) == storage.read_bytes(f"{local}/{name}"), name


def test_an_append_on_memory_writes_the_segments_a_local_append_writes(mem, tmp_path):
    for out in (mem.root + "/ds", str(tmp_path / "ds")):
        shardkit.preprocess([0, 1, 2, 3], unit_samples, out, piles=3, seed=2, quiet=True)
        grown = shardkit.preprocess(range(4, 10), unit_samples, out, piles=3, seed=2, mode="append", quiet=True)
        assert grown.generation == 1 and grown.samples == 60
    # the same segments, byte for byte; their names on a store without a lock carry the job's token
    mine, local = manifest.read(mem.root + "/ds").files(), manifest.read(str(tmp_path / "ds")).files()
    assert len(mine) == len(local) and any(".g000001-" in n for n in mine)
    for a, b in zip(mine, local, strict=True):
        assert mem.sub("ds").read(a) == storage.read_bytes(str(tmp_path / "ds" / b)), (a, b)
    assert _keys(mem.root + "/ds") == sorted(f"u{u:02d}-{k}" for u in range(10) for k in range(6))
    assert shardkit.verify(mem.root + "/ds", quiet=True) == []


def test_a_stopped_pass_1_on_memory_resumes_without_redoing_its_committed_units(mem, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    from shardkit.piles import resume

    out, reference = mem.root + "/ds", str(tmp_path / "ref")
    shardkit.preprocess(range(12), unit_samples, reference, piles=3, seed=2, quiet=True)
    monkeypatch.setattr(resume, "COMMIT_SECONDS", 0.0)
    monkeypatch.setitem(STOP_AT, "at", 8)
    with pytest.raises(KeyboardInterrupt):
        shardkit.preprocess(range(12), unit_samples, out, piles=3, seed=2, quiet=True)
    assert not mem.sub("ds").exists(manifest.MANIFEST)
    assert mem.sub("ds").exists(layout.REMOTE_STAGING)  # where its staging is, on this machine
    with pytest.raises(shardkit.DatasetExistsError, match="holds an interrupted pass 1"):
        shardkit.preprocess(range(12), unit_samples, out, piles=3, seed=2, quiet=True)
    STOP_AT["at"] = None
    shardkit.preprocess(range(12), unit_samples, out, piles=3, seed=2, quiet=True, resume=True)
    said = [r.getMessage() for r in caplog.records if ": resuming: keeping" in r.getMessage()]
    assert len(said) == 1 and "keeping 0 of" not in said[0], said
    _same_files(mem.sub("ds"), reference)
    assert not mem.sub("ds").exists(layout.REMOTE_STAGING)
    assert shardkit.verify(out, quiet=True) == []


@pytest.mark.parametrize(("nth", "named"), [(1, "shardkit-install"), (3, "pile-0000"), (6, "shardkit.json")])
def test_an_overwrite_whose_nth_put_fails_on_a_local_store_keeps_the_old_dataset(tmp_path, nth, named):
    out = str(tmp_path / "ds")
    _write(out, 60, piles=4)
    before = {n: storage.read_bytes(f"{out}/{n}") for n in storage.listdir(out)}
    faulty = storage.mount(storage.FaultyStore(storage.LocalStore(out)))
    try:
        faulty.fail("put", nth=nth)  # the install's puts: its journal, four piles linked in (Store.link_in), the manifest
        with pytest.raises(StorageError, match=rf"{out}/\.?{named}\S*: cannot write: .*injected failure"):
            _write(out, 30, piles=4, overwrite=True)
    finally:
        storage.unmount(faulty)
    # the old dataset whole, nothing of the new one; its journal may stay, for the next job
    left = {n: storage.read_bytes(f"{out}/{n}") for n in storage.listdir(out) if not n.startswith(".shardkit-install-")}
    assert left == before
    assert _keys(out) == sorted(s["__key__"] for s in make_samples(60))
    _write(out, 30, piles=4, overwrite=True)
    assert _keys(out) == sorted(s["__key__"] for s in make_samples(30)) and shardkit.verify(out, quiet=True) == []
    assert not [n for n in storage.listdir(out) if n.startswith(".shardkit-install-")]
