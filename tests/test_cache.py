"""The pile cache: hits and misses, checks, LRU eviction within the limit, and processes sharing it."""

from __future__ import annotations

import errno
import logging
import mmap
import multiprocessing
import os
import pickle
import signal
import time
import zlib

import numpy as np
import pytest

from shardkit.errors import ConfigError, CorruptShardError, DatasetNotFoundError, StorageError
from shardkit.storage.cache import EVICT_LOCK, SUBDIRECTORY, PileCache, entry_name

FORK = multiprocessing.get_context("fork")
URL = "s3://bucket/ds/pile-000003.tar"


class Remote:
    """Piles served from memory, counting the fetches of each."""

    def __init__(self, piles: dict[str, bytes]) -> None:
        self.piles = piles
        self.fetches: dict[str, int] = {}

    def fetcher(self, url: str):
        def fetch() -> bytes:
            self.fetches[url] = self.fetches.get(url, 0) + 1
            return self.piles[url]

        return fetch

    def get(self, cache: PileCache, url: str, *, checked: bool = True):
        data = self.piles[url]
        return cache.get(url, size=len(data), fetch=self.fetcher(url), check=crc_check(data) if checked else None)


def crc_check(expected: bytes):
    """What the loader passes: a CRC-32 of the bytes against the one expected."""
    want = zlib.crc32(expected)

    def check(buf) -> str | None:
        found = zlib.crc32(buf)
        return None if found == want else f"checksum is {found:08x}, expected {want:08x}"

    return check


def cached(cache: PileCache) -> dict[str, int]:
    """The cache's entries and their sizes (names made of a digest, a dash and a base name)."""
    return {n: os.path.getsize(os.path.join(cache.directory, n)) for n in os.listdir(cache.directory) if n[16:17] == "-"}


def partials(cache: PileCache) -> list[str]:
    """The cache's partial files (a pile being written, or one a dead writer left)."""
    return [n for n in os.listdir(cache.directory) if ".partial-" in n]


def payload(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(n)


def test_a_miss_fetches_and_stores_then_a_hit_reads_the_copy(tmp_path):
    remote = Remote({URL: payload(3000, 1)})
    cache = PileCache(tmp_path)
    assert remote.get(cache, URL) == remote.piles[URL]
    assert remote.get(cache, URL) == remote.piles[URL]
    assert remote.fetches == {URL: 1}
    assert cached(cache) == {entry_name(URL): 3000}
    assert cache.stats().hits == 1 and cache.stats().misses == 1 and cache.stats().bytes_fetched == 3000
    assert cache.directory == os.path.join(tmp_path, SUBDIRECTORY)


def test_a_large_cached_pile_comes_back_memory_mapped_and_read_only(tmp_path):
    remote = Remote({URL: payload(2 << 20, 2)})
    cache = PileCache(tmp_path)
    assert isinstance(remote.get(cache, URL), bytes)  # a miss returns what was fetched
    hit = remote.get(cache, URL)
    assert isinstance(hit, mmap.mmap) and hit[:] == remote.piles[URL]
    with pytest.raises(TypeError):
        hit[0] = 0


def test_the_entry_name_keeps_datasets_apart_and_the_base_name_readable():
    a, b = entry_name("s3://bucket/one/pile-000003.tar"), entry_name("s3://bucket/two/pile-000003.tar")
    assert a != b and a.endswith("-pile-000003.tar") and b.endswith("-pile-000003.tar")
    assert len(a.split("-", 1)[0]) == 16
    assert entry_name("https://host/a b/pile?x=1").endswith("-pile")
    assert entry_name("s3://bucket/") != entry_name("s3://other/")


def test_a_cached_copy_of_the_wrong_size_is_fetched_again(tmp_path, caplog):
    remote = Remote({URL: payload(3000, 3)})
    cache = PileCache(tmp_path)
    remote.get(cache, URL)
    path = os.path.join(cache.directory, entry_name(URL))
    with open(path, "ab") as f:
        f.write(b"tail")
    with caplog.at_level(logging.WARNING):
        assert remote.get(cache, URL) == remote.piles[URL]
    assert remote.fetches == {URL: 2}
    assert cached(cache) == {entry_name(URL): 3000}
    assert "holds 3004 bytes, expected 3000; fetching it again" in caplog.text


def test_a_cached_copy_failing_the_check_is_fetched_again(tmp_path, caplog):
    remote = Remote({URL: payload(3000, 4)})
    cache = PileCache(tmp_path)
    remote.get(cache, URL)
    path = os.path.join(cache.directory, entry_name(URL))
    with open(path, "r+b") as f:
        f.seek(1000)
        f.write(b"\xff\x00\xff")
    with caplog.at_level(logging.WARNING):
        assert remote.get(cache, URL) == remote.piles[URL]
    assert remote.fetches == {URL: 2}
    assert "is wrong: checksum is" in caplog.text
    assert remote.get(cache, URL) == remote.piles[URL] and remote.fetches == {URL: 2}  # the fresh copy is kept


def test_fetched_bytes_failing_the_check_raise_naming_the_url_and_are_not_stored(tmp_path):
    cache = PileCache(tmp_path)
    good, bad = payload(3000, 5), payload(3000, 6)
    with pytest.raises(CorruptShardError, match=rf"^{URL}: checksum is [0-9a-f]{{8}}, expected [0-9a-f]{{8}}$"):
        cache.get(URL, size=3000, fetch=lambda: bad, check=crc_check(good))
    with pytest.raises(CorruptShardError, match=rf"^{URL}: fetched 2999 bytes, expected 3000$"):
        cache.get(URL, size=3000, fetch=lambda: good[:-1])
    assert cached(cache) == {} and not [n for n in os.listdir(cache.directory) if ".partial-" in n]


def test_eviction_removes_the_least_recently_used_and_a_hit_counts_as_use(tmp_path):
    urls = [f"s3://bucket/ds/pile-{i:06d}.tar" for i in range(4)]
    remote = Remote({u: payload(1000, i) for i, u in enumerate(urls)})
    cache = PileCache(tmp_path, limit=3000)
    for url in urls[:3]:
        remote.get(cache, url)
    remote.get(cache, urls[0])  # a hit: urls[1] is now the least recently used
    remote.get(cache, urls[3])
    assert set(cached(cache)) == {entry_name(u) for u in (urls[0], urls[2], urls[3])}
    assert cache.stats().evictions == 1
    remote.get(cache, urls[0])
    assert remote.fetches[urls[0]] == 1


def test_a_pile_larger_than_the_limit_bypasses_the_cache_with_one_warning(tmp_path, caplog):
    remote = Remote({URL: payload(5000, 7), "s3://bucket/ds/small.tar": payload(100, 8)})
    cache = PileCache(tmp_path, limit="4KiB")
    remote.get(cache, "s3://bucket/ds/small.tar")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert remote.get(cache, URL) == remote.piles[URL]
    assert remote.fetches[URL] == 3 and cache.stats().bypasses == 3
    assert set(cached(cache)) == {entry_name("s3://bucket/ds/small.tar")}  # nothing evicted for it either
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert URL in warnings[0] and "4.9 KiB" in warnings[0] and "cache_limit=4.0 KiB" in warnings[0]


def test_eviction_never_touches_files_the_cache_did_not_make(tmp_path):
    foreign = {
        tmp_path / "precious.tar": b"mine",
        tmp_path / SUBDIRECTORY / "notes.txt": b"also mine",
        tmp_path / SUBDIRECTORY / "0123456789abcdef.tar": b"almost a name of the cache's",
        tmp_path / SUBDIRECTORY / "0123456789ABCDEF-x.tar": b"upper-case hex: not a name the cache makes",
    }
    (tmp_path / SUBDIRECTORY).mkdir()
    for path, data in foreign.items():
        path.write_bytes(data)
    (tmp_path / SUBDIRECTORY / "fedcba9876543210-dir").mkdir()  # a directory named like an entry
    os.symlink(tmp_path / "precious.tar", tmp_path / SUBDIRECTORY / "00112233445566aa-link.tar")
    remote = Remote({f"s3://b/p{i}.tar": payload(1000, i) for i in range(10)})
    cache = PileCache(tmp_path, limit=2500)
    for url in remote.piles:
        remote.get(cache, url)
    assert cache.stats().evictions == 8
    assert all(path.read_bytes() == data for path, data in foreign.items())
    assert (tmp_path / SUBDIRECTORY / "fedcba9876543210-dir").is_dir()
    assert (tmp_path / SUBDIRECTORY / "00112233445566aa-link.tar").read_bytes() == b"mine"


def test_the_cached_piles_stay_within_the_limit_whatever_is_asked(tmp_path):
    rng = np.random.default_rng(11)
    limit = 20_000
    remote = Remote({f"s3://b/pile-{i:03d}.tar": payload(int(rng.integers(1, 9000)), i) for i in range(30)})
    remote.piles["s3://b/empty.tar"] = b""
    cache = PileCache(tmp_path, limit=limit)
    urls = sorted(remote.piles)
    for i in rng.integers(0, len(urls), 300):
        assert remote.get(cache, urls[i]) == remote.piles[urls[i]]
        assert sum(cached(cache).values()) <= limit
    stats = cache.stats()
    assert stats.hits + stats.misses == 300 and stats.hits > 0 and stats.evictions > 0
    assert stats.bytes_fetched == sum(len(remote.piles[u]) * n for u, n in remote.fetches.items())
    assert all(n[16:17] in ("-", ".") for n in os.listdir(cache.directory) if n != EVICT_LOCK)


def test_a_full_disk_costs_the_copy_not_the_read(tmp_path, monkeypatch, caplog):
    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    remote = Remote({URL: payload(3000, 9)})
    cache = PileCache(tmp_path)
    monkeypatch.setattr(os, "replace", full)
    with caplog.at_level(logging.WARNING):
        assert remote.get(cache, URL) == remote.piles[URL]
        assert remote.get(cache, URL) == remote.piles[URL]
    monkeypatch.undo()
    assert remote.fetches == {URL: 2} and cached(cache) == {}
    assert not [n for n in os.listdir(cache.directory) if ".partial-" in n]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"{URL}: not cached") and "no space left on the device" in warnings[0]


def test_bad_options_are_named(tmp_path):
    with pytest.raises(ConfigError, match="cache_limit: expected a size"):
        PileCache(tmp_path, limit="lots")
    with pytest.raises(ConfigError, match="cache_limit: expected a positive size"):
        PileCache(tmp_path, limit=0)
    with pytest.raises(ConfigError, match="cache_limit"):
        PileCache(tmp_path, limit=True)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cache_dir: expected a local directory"):
        PileCache("s3://bucket/cache")
    with pytest.raises(ConfigError, match="size: expected an integer >= 0"):
        PileCache(tmp_path).get(URL, size=-1, fetch=bytes)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StorageError, match=f"{SUBDIRECTORY}: cannot use it as the pile cache: .*file is a file, not a directory"):
        PileCache(tmp_path / "file")
    assert PileCache(f"file://{tmp_path}", limit="1.5KiB").limit == 1536


def test_a_copy_for_another_process_shares_the_directory_and_counts_afresh(tmp_path):
    remote = Remote({URL: payload(100, 10)})
    cache = PileCache(tmp_path, limit=1000)
    remote.get(cache, URL)
    copy = pickle.loads(pickle.dumps(cache))
    assert copy.stats().misses == 0 and copy.limit == 1000
    assert remote.get(copy, URL) == remote.piles[URL] and remote.fetches == {URL: 1}


# -- processes sharing one cache ------------------------------------------------------------------


def _slow_get(directory, counter: str, start, results) -> None:
    """Fetch URL through the cache at ``directory``; each fetch appends a byte to ``counter``."""

    def fetch() -> bytes:
        with open(counter, "ab") as f:
            f.write(b"x")
        time.sleep(0.3)  # keeps the download going while the other process asks
        return payload(2 << 20, 12)

    cache = PileCache(directory)
    start.wait()
    data = cache.get(URL, size=2 << 20, fetch=fetch, check=crc_check(payload(2 << 20, 12)))
    results.put(zlib.crc32(data))


def test_two_processes_asking_at_once_fetch_once_and_get_the_same_bytes(tmp_path):
    counter = str(tmp_path / "fetches")
    start, results = FORK.Event(), FORK.Queue()
    procs = [FORK.Process(target=_slow_get, args=(tmp_path / "cache", counter, start, results)) for _ in range(2)]
    for p in procs:
        p.start()
    start.set()
    crcs = [results.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(10)
    assert [p.exitcode for p in procs] == [0, 0]
    assert os.path.getsize(counter) == 1
    assert crcs == [zlib.crc32(payload(2 << 20, 12))] * 2


def _store_and_hang(directory, storing) -> None:
    """Fetch URL and hang where the whole copy is written but not yet renamed into place."""

    def hang(src, dst):
        storing.set()
        time.sleep(60)

    os.replace = hang  # this process's own os module: it is killed before it could matter elsewhere
    PileCache(directory).get(URL, size=3000, fetch=lambda: payload(3000, 13))


def test_a_process_killed_while_storing_leaves_no_file_under_the_name_and_its_partial_is_cleaned(tmp_path):
    directory = tmp_path / "cache"
    storing = FORK.Event()
    proc = FORK.Process(target=_store_and_hang, args=(directory, storing))
    proc.start()
    assert storing.wait(30)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    root = directory / SUBDIRECTORY
    assert not (root / entry_name(URL)).exists()
    assert len([n for n in os.listdir(root) if ".partial-" in n]) == 1
    remote = Remote({URL: payload(3000, 13)})
    cache = PileCache(directory)  # the lock the dead process held is free: its partial file goes
    assert not [n for n in os.listdir(root) if ".partial-" in n]
    assert remote.get(cache, URL) == remote.piles[URL] and remote.fetches == {URL: 1}


def test_a_dead_process_partial_file_goes_when_its_entry_is_next_fetched_or_at_eviction(tmp_path):
    unlimited, limited = PileCache(tmp_path), PileCache(tmp_path, limit=1500)
    left = [os.path.join(unlimited.directory, f"{entry_name(u)[:16]}.partial-{'0' * 32}") for u in (URL, "s3://b/other.tar")]
    for path in left:
        with open(path, "wb") as f:
            f.write(b"half a pi")
    remote = Remote({URL: payload(1000, 14), "s3://b/x.tar": payload(1000, 15)})
    remote.get(unlimited, URL)  # the entry's own lock, taken to fetch it: its partial goes
    assert not os.path.exists(left[0]) and os.path.exists(left[1])
    remote.get(limited, "s3://b/x.tar")  # eviction sweeps the rest, and the lock it took to do so
    assert not os.path.exists(left[1])
    assert not os.path.exists(os.path.join(limited.directory, f"{entry_name('s3://b/other.tar')[:16]}.lock"))
    assert set(cached(limited)) == {entry_name("s3://b/x.tar")}


def test_a_miss_checks_the_fetched_bytes_once_when_the_fetch_checked_them(tmp_path):
    """A store's checked read already checked what it returns: the cache does not check it again
    (a second CRC-32 of every pile downloaded), unless the fetch did not."""
    cache, data = PileCache(tmp_path / "c"), payload(3000, 1)
    calls = []
    check = crc_check(data)

    def counted(buf):
        calls.append(1)
        return check(buf)

    def checked_fetch():
        assert counted(data) is None  # what a checked read does with its bytes
        return data

    assert cache.get(URL, size=3000, fetch=checked_fetch, check=counted, fetch_checks=counted) == data
    assert len(calls) == 1
    assert cache.get(URL + "2", size=3000, fetch=lambda: data, check=counted) == data  # a fetch that checks nothing
    assert len(calls) == 2


class Streaming(Remote):
    """A remote that can also write a pile into a local file as it downloads (``fetch_into``),
    returning it mapped, as a store's ``read_checked_into`` does."""

    def __init__(self, piles: dict[str, bytes]) -> None:
        super().__init__(piles)
        self.streams: dict[str, int] = {}

    def streamer(self, url: str, *, fail: BaseException | None = None, decline: bool = False):
        def fetch_into(local: str):
            self.streams[url] = self.streams.get(url, 0) + 1
            if decline:
                return None
            with open(local, "wb") as f:
                f.write(self.piles[url][:1000])  # a first part on disk, then the failure
                if fail is not None:
                    raise fail
                f.write(self.piles[url][1000:])
            with open(local, "rb", buffering=0) as f:
                from shardkit.storage.local import map_open

                return map_open(f)

        return fetch_into

    def get(self, cache: PileCache, url: str, **streaming):
        data = self.piles[url]
        check = crc_check(data)
        return cache.get(
            url, size=len(data), fetch=self.fetcher(url), check=check, fetch_checks=check, fetch_into=self.streamer(url, **streaming)
        )


def test_a_streamed_miss_is_the_cached_file_itself_and_the_next_read_a_hit(tmp_path):
    remote = Streaming({URL: payload(3 << 20, 1)})
    cache = PileCache(tmp_path)
    first = remote.get(cache, URL)
    assert isinstance(first, mmap.mmap) and first[:] == remote.piles[URL]
    assert list(cached(cache).values()) == [len(remote.piles[URL])]
    # the map is of the file now under the entry's name: no partial is left, and it was never read whole
    assert remote.streams == {URL: 1} and remote.fetches == {}
    assert not partials(cache)
    assert cache.stats().misses == 1 and cache.stats().bytes_fetched == len(remote.piles[URL])
    assert remote.get(cache, URL)[:] == remote.piles[URL]
    assert remote.streams == {URL: 1} and cache.stats().hits == 1


def _disk_full() -> StorageError:
    full = StorageError(f"{URL}: cannot read: no space left on the device")
    full.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    return full


@pytest.mark.parametrize(
    "streaming",
    [
        {"decline": True},  # a store that does not stream this pile
        {"fail": _disk_full()},  # the cache's disk full under the stream
        {"fail": StorageError(f"{URL}: cannot read: connection reset")},  # the connection
    ],
    ids=["not-streamed", "disk-full", "connection"],
)
def test_a_pile_the_stream_does_not_bring_is_read_whole_and_written(tmp_path, streaming):
    """A stream that fails costs that try: the whole read names any fault."""
    remote = Streaming({URL: payload(5000, 2)})
    cache = PileCache(tmp_path)
    assert remote.get(cache, URL, **streaming) == remote.piles[URL]
    assert remote.streams == {URL: 1} and remote.fetches == {URL: 1} and len(cached(cache)) == 1
    assert not partials(cache)


def test_a_missing_file_is_not_read_again_after_its_stream(tmp_path):
    remote = Streaming({URL: payload(5000, 5)})
    cache = PileCache(tmp_path)
    with pytest.raises(DatasetNotFoundError, match="no such file"):
        remote.get(cache, URL, fail=DatasetNotFoundError(f"{URL}: no such file"))
    assert remote.fetches == {} and not partials(cache)


def test_streamed_bytes_of_another_size_are_refused_whatever_the_check(tmp_path):
    remote = Streaming({URL: payload(5000, 7)})
    cache = PileCache(tmp_path)
    with pytest.raises(CorruptShardError, match=rf"^{URL}: fetched 5000 bytes, expected 4999$"):
        cache.get(URL, size=4999, fetch=remote.fetcher(URL), fetch_into=remote.streamer(URL))
    assert cached(cache) == {} and remote.fetches == {}
    assert not partials(cache)


def test_a_streamed_pile_failing_the_full_check_is_not_cached(tmp_path):
    """A copy found wrong is fetched again and must pass the full check, not only the store's own."""
    data = payload(5000, 5)
    remote = Streaming({URL: data})
    cache = PileCache(tmp_path)
    never = lambda buf: "checksum is 00000000, expected 12345678"  # noqa: E731
    with pytest.raises(CorruptShardError, match=rf"^{URL}: checksum is 00000000"):
        cache.get(URL, size=len(data), fetch=remote.fetcher(URL), check=never, fetch_checks=None, fetch_into=remote.streamer(URL))
    assert cached(cache) == {} and not partials(cache)


def test_a_streamed_pile_that_cannot_be_named_is_read_on_uncached_with_one_warning(tmp_path, monkeypatch, caplog):
    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    remote = Streaming({URL: payload(3 << 20, 6)})
    cache = PileCache(tmp_path)
    monkeypatch.setattr(os, "replace", full)
    with caplog.at_level(logging.WARNING):
        got = remote.get(cache, URL)
        assert got[:] == remote.piles[URL]
    monkeypatch.undo()
    assert cached(cache) == {} and not partials(cache)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"{URL}: not cached") and "no space left on the device" in warnings[0]
