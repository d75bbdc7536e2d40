"""A pile read again with the same checked bytes reuses its index instead of scanning its headers."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

import shardkit
from shardkit import manifest
from shardkit.errors import CorruptShardError
from shardkit.loading import layouts, pile
from shardkit.loading.layouts import LAYOUTS, Layouts
from shardkit.storage import local_store
from shardkit.tar import compression, scan
from shardkit.tar.shard import Shard
from tests.conftest import make_samples


def counting(monkeypatch, module, name: str) -> list[int]:
    """The length of each buffer ``module.name`` is called on, from now on; the kept layouts cleared."""
    LAYOUTS.clear()
    seen: list[int] = []
    real = getattr(module, name)

    def counted(buf, *args, **kw):
        seen.append(len(buf))
        return real(buf, *args, **kw)

    monkeypatch.setattr(module, name, counted)
    return seen


@pytest.fixture
def scans(monkeypatch) -> list[int]:
    """The length of each buffer the header scan is run on, from now on."""
    return counting(monkeypatch, scan, "scan")


def written(tmp_path, compression: str | None, samples: int = 40, piles: int = 2) -> tuple[str, manifest.PileInfo]:
    """The first pile of a dataset of ``samples`` small samples just written."""
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=piles, seed=1, compression=compression) as w:
        for s in make_samples(samples, size=100):
            w.write(s)
    return first_pile(out)


def first_pile(directory: str) -> tuple[str, manifest.PileInfo]:
    info = manifest.read(directory).piles[0]
    return os.path.join(directory, info.name), info


def read(url: str, info: manifest.PileInfo, verify: bool = True) -> tuple[pile.Fetched, Shard]:
    fetched = pile.fetch(url, expected=info, verify=verify)
    return fetched, pile.open_pile(fetched, expected=info)


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_a_pile_read_again_is_not_scanned_and_reads_the_same(tmp_path, scans, compression):
    url, info = written(tmp_path, compression)
    first, _ = read(url, info)
    second, a = read(url, info)  # kept from the second read on: a pile read once is seldom read again
    assert first.layout is None and second.layout is None and len(scans) == 2
    third, b = read(url, info)
    assert third.layout is a.layout and third.chain is None and len(scans) == 2  # not scanned again
    assert b.keys == a.keys and list(b) == list(a) and b.columns([3, 0]) == a.columns([3, 0])
    assert b.spans([1]).fields[0][1].tolist() == a.spans([1]).fields[0][1].tolist()


def test_unchecked_bytes_are_scanned_and_never_kept(dataset, scans):
    url, info = first_pile(dataset)
    read(url, info, verify=False)
    fetched, _ = read(url, info, verify=False)
    assert fetched.layout is None and len(scans) == 2
    assert LAYOUTS.get(url, info) is None


def test_bytes_changed_since_are_refused_before_the_kept_index_is_used(dataset, scans):
    url, info = first_pile(dataset)
    read(url, info)
    read(url, info)
    assert LAYOUTS.get(url, info) is not None
    path = Path(url)
    raw = bytearray(path.read_bytes())
    raw[600] ^= 0xFF  # same size, another checksum
    path.write_bytes(raw)
    with pytest.raises(CorruptShardError, match=r"pile-\d+\.tar: checksum is .*, the manifest says"):
        read(url, info)


def test_a_new_manifest_entry_for_the_same_file_is_scanned_again(tmp_path, scans):
    """Rewritten with other samples under the same name (a new manifest entry): a new index."""
    out = str(tmp_path / "ds")
    for n in (30, 31):
        with shardkit.PileWriter(out, piles=1, seed=1, overwrite=True) as w:
            for s in make_samples(n, size=50):
                w.write(s)
        url, info = first_pile(out)
        fetched, shard = read(url, info)
        assert fetched.layout is None and len(shard) == n
        read(url, info)  # kept from here on
    assert len(scans) == 4


@pytest.mark.parametrize(("mix", "batch_size"), [(1, None), (2, None), (2, 16), (1, 16)])
def test_the_loader_gives_the_same_epochs_with_kept_indexes(dataset, scans, mix, batch_size):
    """Samples one at a time and batches built by columns (with mix=2, from two piles' kept
    indexes at once): the same epochs as when every pile is scanned every time."""

    def epochs() -> list[list]:
        loader = shardkit.loader(dataset, decode=False, seed=5, mix=mix, batch_size=batch_size)
        got = []
        for e in range(4):
            loader.set_epoch(e)
            if batch_size is None:
                got.append([(s["__key__"], bytes(s["bin"])) for s in loader])
            else:
                got.append([(b["__key__"], [bytes(v) for v in b["bin"]]) for b in loader])
        return got

    kept = epochs()
    assert len(scans) == 16  # 8 piles, scanned in the first two epochs only
    LAYOUTS.clear()
    LAYOUTS.budget = 0  # nothing kept: every pile scanned every epoch
    try:
        assert epochs() == kept and len(scans) == 16 + 4 * 8
    finally:
        LAYOUTS.budget = layouts.BUDGET


def test_the_least_recently_used_go_first_past_the_budget(dataset):
    url, info = first_pile(dataset)
    layout = Shard(url, Path(url).read_bytes()).layout
    kept = Layouts(budget=2 * layout.nbytes)
    for name in ("a", "b", "c"):
        kept.put(name, info, layout)
        assert kept.get(name, info) is None  # read once: not kept
        kept.put(name, info, layout)
        if name == "b":
            assert kept.get("a", info) is layout  # "a" used last: "b" goes first
    assert [n for n in "abc" if kept.get(n, info) is not None] == ["a", "c"]
    small = Layouts(budget=layout.nbytes - 1)
    small.put("a", info, layout)
    small.put("a", info, layout)
    assert small.get("a", info) is None  # larger than the whole budget: not kept


@pytest.fixture
def checksums(monkeypatch) -> list[int]:
    """The length of each buffer checksummed from now on (a file's CRC-32, and a compressed pile's
    tar's, taken as it is decompressed); files count as settled at once."""
    monkeypatch.setattr(local_store, "SETTLED_NS", 0)
    seen = counting(monkeypatch, manifest, "checksum")
    real = compression.crc32
    monkeypatch.setattr(compression, "crc32", lambda buf, *args: seen.append(len(buf)) or real(buf, *args))
    return seen


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_an_unchanged_file_is_checksummed_once(tmp_path, checksums, compression):
    url, info = written(tmp_path, compression)
    checksums.clear()  # the writer's
    _, first = read(url, info)
    once = len(checksums)
    assert once == (1 if compression is None else 2)  # a compressed pile: the file, then the tar inside
    for _ in range(3):
        _, again = read(url, info)
        assert list(again) == list(first)
    assert len(checksums) == once
    assert read(url, info, verify=False)[0].checked is False  # verify=False is as before: nothing checked


def test_a_fresh_file_is_checksummed_every_time(dataset, monkeypatch):
    """A file changed under SETTLED_NS ago: a change now might leave its times as they are."""
    url, info = first_pile(dataset)
    monkeypatch.setattr(local_store, "SETTLED_NS", 10**18)
    calls = counting(monkeypatch, manifest, "checksum")
    for _ in range(3):
        read(url, info)
    assert len(calls) == 3


@pytest.mark.parametrize("compression", [None, "lz4"])
@pytest.mark.parametrize("how", ["in place", "in place, times set back", "replaced, times set back"])
def test_a_file_changed_after_it_passed_is_checksummed_and_refused(tmp_path, checksums, compression, how):
    url, info = written(tmp_path, compression, samples=30, piles=1)
    read(url, info)
    read(url, info)
    assert LAYOUTS.checked(url, info) is not None
    path = Path(url)
    st = path.stat()
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, other bytes
    time.sleep(0.02)  # past a coarse clock's tick
    if how.startswith("replaced"):
        other = path.with_name("other")
        other.write_bytes(raw)
        os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(other, path)
    else:
        with open(path, "r+b") as f:
            f.write(raw)
        if how.endswith("set back"):
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(CorruptShardError, match=r"pile-000000\.tar(\.lz4)?: "):
        read(url, info)


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_a_tar_that_fails_its_own_checksum_is_refused_every_time(tmp_path, checksums, compression):
    """The stored file passes, the tar inside does not: nothing is remembered as passed."""
    url, info = written(tmp_path, compression)
    wrong = dataclasses.replace(info, tar_checksum="crc32:00000000")
    for _ in range(3):
        with pytest.raises(CorruptShardError, match=r"the tar inside has checksum crc32:\w+, the manifest says crc32:00000000"):
            read(url, wrong)
    assert LAYOUTS.checked(url, wrong) is None
