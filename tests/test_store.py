"""One conformance suite for every Store: a local directory, memory, and S3 on the moto server."""

from __future__ import annotations

import threading

import pytest

from shardkit import storage
from shardkit.errors import ConfigError, CorruptShardError, DatasetNotFoundError, StorageError
from shardkit.storage import CachingStore, FaultyStore, FsspecStore, LocalStore, MemoryStore, Store
from shardkit.storage.cache import PileCache


@pytest.fixture(params=["local", "memory", "s3"])
def store(request, tmp_path) -> Store:
    if request.param == "local":
        return LocalStore(str(tmp_path))
    if request.param == "memory":
        return MemoryStore()
    s3 = request.getfixturevalue("s3")
    return FsspecStore(s3.url("ds"), concurrency=4)


def test_put_read_range_size_and_list(store):
    store.put("a.bin", b"0123456789")
    store.put("b.bin", b"")
    assert store.read("a.bin") == b"0123456789"
    assert bytes(store.read_whole("a.bin", size=10)) == b"0123456789"
    assert store.read_range("a.bin", 2, 5) == b"234"
    assert store.read_range("a.bin", 8, 20) == b"89"  # past the end: what is there
    assert store.size("a.bin") == 10 and store.size("b.bin") == 0
    assert store.exists("a.bin") and not store.exists("c.bin")
    assert store.list() == ["a.bin", "b.bin"]
    assert [(e.name, e.size) for e in store.entries()] == [("a.bin", 10), ("b.bin", 0)]
    assert all(e.modified.tzinfo is not None for e in store.entries())


def test_put_replaces_whole_and_a_failed_stream_leaves_nothing(store):
    store.put("a.bin", b"old")
    store.put("a.bin", b"new bytes")
    assert store.read("a.bin") == b"new bytes"
    with pytest.raises(RuntimeError), store.put_stream("b.bin") as f:
        f.write(b"half")
        raise RuntimeError("stop")
    assert store.list() == ["a.bin"]
    with store.put_stream("b.bin", size=4) as f:
        f.write(b"whole")
    assert store.read("b.bin") == b"whole"


def test_missing_files_raise_errors_naming_the_url(store):
    url = store.url("nope.bin")
    for call in (lambda: store.read("nope.bin"), lambda: store.size("nope.bin"), lambda: store.read_range("nope.bin", 0, 1)):
        with pytest.raises(DatasetNotFoundError, match=r"nope\.bin"):
            call()
    assert url.endswith("nope.bin")
    store.delete("nope.bin")  # a delete of what is not there is no error


def test_delete(store):
    store.put("a.bin", b"x")
    store.delete("a.bin")
    assert not store.exists("a.bin") and store.list(missing_ok=True) == []


def test_put_if_absent_lets_exactly_one_writer_win(store):
    if not store.supports_put_if_absent:
        with pytest.raises(ConfigError, match="conditional write"):
            store.put_if_absent("a", b"1")
        return
    wins = []

    def race(k: int) -> None:
        if store.put_if_absent("m.json", f"writer {k}".encode()):
            wins.append(k)

    threads = [threading.Thread(target=race, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert store.read("m.json") == f"writer {wins[0]}".encode()
    assert not store.put_if_absent("m.json", b"late")


def test_lock_keeps_a_second_holder_out(store):
    if not store.supports_locks:
        with pytest.raises(ConfigError, match="no lock"):
            store.lock("lock")
        return
    with store.lock(".lock", wait=False) as mine:
        assert mine
        with store.lock(".lock", wait=False) as second:
            assert not second
    with store.lock(".lock", wait=False) as again:
        assert again


def test_read_checked_reads_again_where_bytes_travel_then_names_the_url(store):
    store.put("p.tar", b"abcd")
    seen = []

    def check(buf):
        seen.append(bytes(buf))
        return None if len(seen) >= 2 else "torn"

    if store.supports_mapping:  # never torn: one read, one verdict
        with pytest.raises(CorruptShardError, match=r"p\.tar: torn$"):
            store.read_checked("p.tar", size=4, check=check)
        assert len(seen) == 1
    else:
        assert bytes(store.read_checked("p.tar", size=4, check=check)) == b"abcd" and len(seen) == 2
        with pytest.raises(CorruptShardError, match=r"p\.tar: bad \(read 3 times\)"):
            store.read_checked("p.tar", size=4, check=lambda b: "bad")


def test_the_url_functions_reach_the_same_store(store):
    mounted = isinstance(store, MemoryStore)  # no URL names it until it is mounted
    if mounted:
        storage.mount(store)
    try:
        storage.write_bytes(store.url("f.bin"), b"via url")
        assert store.read("f.bin") == b"via url"
        assert storage.read_bytes(store.url("f.bin")) == b"via url"
        assert storage.listdir(store.url("")) == ["f.bin"]
        storage.remove(store.url("f.bin"))
        assert not storage.exists(store.url("f.bin"))
    finally:
        if mounted:
            storage.unmount(store)


def test_caching_store_reads_the_inner_store_once(tmp_path):
    inner = FaultyStore(MemoryStore())
    inner.put("p.tar", b"pile bytes")
    inner.supports_mapping = False  # as if its bytes travelled
    cached = CachingStore(inner, PileCache(str(tmp_path / "cache")))
    for _ in range(3):
        assert bytes(cached.read_checked("p.tar", size=10, check=lambda b: None)) == b"pile bytes"
    assert inner.calls["read"] == 1 and cached.caches_reads and not inner.caches_reads
    assert cached.cache.stats().misses == 1


def test_store_for_wraps_a_travelling_store_in_the_cache_only(tmp_path, s3):
    reads = storage.RemoteReads(concurrency=2, cache=PileCache(str(tmp_path / "cache")))
    assert isinstance(storage.store_for(str(tmp_path), reads=reads), LocalStore)
    remote = storage.store_for(s3.url("ds"), reads=reads)
    assert isinstance(remote, CachingStore) and isinstance(remote.inner, FsspecStore) and remote.inner.concurrency == 2
    store, name = storage.locate(s3.url("ds/pile-000001.tar"))
    assert (store.url(name), name) == (s3.url("ds/pile-000001.tar"), "pile-000001.tar")


@pytest.mark.parametrize("operation", ["put", "put_if_absent", "delete", "read"])
def test_faulty_store_fails_the_nth_call_and_a_failed_put_leaves_nothing(operation):
    store = FaultyStore(MemoryStore()).fail(operation, nth=2)
    calls = {
        "put": lambda k: store.put(f"f{k}", b"x"),
        "put_if_absent": lambda k: store.put_if_absent(f"f{k}", b"x"),
        "delete": lambda k: store.delete(f"f{k}"),
        "read": lambda k: store.read("f0"),
    }
    store.inner.put("f0", b"x")
    calls[operation](1)
    named = "f0" if operation == "read" else "f2"
    with pytest.raises(StorageError, match=rf"{store.root}/{named}: .*injected failure of {operation} call 2"):
        calls[operation](2)
    calls[operation](3)  # once only
    if operation in ("put", "put_if_absent"):
        assert store.list() == ["f0", "f1", "f3"]


def test_faulty_store_raises_the_error_it_is_given():
    store = FaultyStore(MemoryStore()).fail("delete", nth=1, error=KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        store.delete("a")
    with pytest.raises(ValueError, match="operation: expected one of"):
        store.fail("rename")
