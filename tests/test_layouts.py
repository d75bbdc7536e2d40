"""A pile read again with the same checked bytes reuses its index instead of scanning its headers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import shardkit
from shardkit import manifest
from shardkit.errors import CorruptShardError
from shardkit.loading import layouts, pile
from shardkit.loading.layouts import LAYOUTS, Layouts
from shardkit.tar import scan
from shardkit.tar.shard import Shard
from tests.conftest import make_samples


@pytest.fixture
def scans(monkeypatch) -> list[int]:
    """The length of each buffer the header scan is run on, from now on."""
    LAYOUTS.clear()
    seen: list[int] = []
    real = scan.scan

    def counted(buf, **kw):
        seen.append(len(buf))
        return real(buf, **kw)

    monkeypatch.setattr(scan, "scan", counted)
    return seen


def first_pile(directory: str) -> tuple[str, manifest.PileInfo]:
    info = manifest.read(directory).piles[0]
    return os.path.join(directory, info.name), info


def read(url: str, info: manifest.PileInfo, verify: bool = True) -> tuple[pile.Fetched, Shard]:
    fetched = pile.fetch(url, expected=info, verify=verify)
    return fetched, pile.open_pile(fetched, expected=info)


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_a_pile_read_again_is_not_scanned_and_reads_the_same(tmp_path, scans, compression):
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=2, seed=1, compression=compression) as w:
        for s in make_samples(40, size=100):
            w.write(s)
    url, info = first_pile(out)
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
