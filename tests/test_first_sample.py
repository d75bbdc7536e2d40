"""The loader's first pile served by checked ranges while it is read whole: same order, no unchecked byte."""

from __future__ import annotations

import itertools
import json
import logging
import os
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit import manifest
from shardkit.dataset import layout
from shardkit.errors import CorruptShardError
from shardkit.loading import index as index_module
from tests.conftest import hold_whole_reads, make_samples

N = 240


@pytest.fixture
def ds(tmp_path) -> str:
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=4, seed=3) as w:
        for s in make_samples(N, size=700):
            w.write(s)
    return out


def _epoch(out: str, **options) -> list[dict]:
    with shardkit.loader(out, decode=False, **options) as loader:
        return [{k: bytes(v) if k != "__key__" else v for k, v in s.items()} for s in loader]


def _index(out: str) -> tuple[index_module.Index, str]:
    m = manifest.read(out)
    return index_module.load_or_build(out, m), os.path.join(out, layout.index_name(m.generation))


@pytest.mark.parametrize(("seed", "epoch", "views"), [(0, 0, False), (5, 2, True)])
def test_first_samples_come_by_range_before_the_pile_is_read_and_the_order_is_unchanged(ds, monkeypatch, seed, epoch, views):
    reference = []
    with shardkit.loader(ds, decode=False, seed=seed) as loader:
        loader.set_epoch(epoch)
        reference = [{k: bytes(v) if k != "__key__" else v for k, v in s.items()} for s in loader]
    _index(ds)
    gate = hold_whole_reads(monkeypatch)
    with shardkit.loader(ds, decode=False, seed=seed, views=views) as loader:
        loader.set_epoch(epoch)
        samples = iter(loader)
        first = [next(samples) for _ in range(5)]  # no pile has been read whole yet
        assert not gate.is_set()
        if views:
            assert all(isinstance(v, memoryview) for s in first for k, v in s.items() if k != "__key__")
        gate.set()
        got = first + list(samples)
    assert [{k: bytes(v) if k != "__key__" else v for k, v in s.items()} for s in got] == reference


@pytest.mark.parametrize("options", [{"batch_size": 8}, {"decode": True}, {"decode": True, "batch_size": 8, "num_workers": 1}])
def test_batches_and_decoded_samples_are_unchanged(ds, options):
    def keys(out):
        with shardkit.loader(out, seed=1, **options) as loader:
            items = list(loader)
        if "batch_size" in options:
            return [list(b["__key__"]) for b in items], [np.asarray(b["cls"]).tolist() for b in items]
        return [s["__key__"] for s in items], [s["cls"] for s in items]

    reference = keys(ds)
    _index(ds)
    assert keys(ds) == reference


def _first_pile_positions(ds: str, idx: index_module.Index, count: int) -> list[tuple[str, int, int]]:
    """(file, start, end) of the first ``count`` samples of epoch 0 (seed 0)."""
    keys = [s["__key__"] for s in _epoch(ds)[:count]]
    found = []
    for key in keys:
        (position,) = idx.lookup(key)
        f, start, end = idx.locate(position)
        found.append((idx.files[f].name, start, end))
    return found


def _flip(path: str, offset: int) -> None:
    data = bytearray(Path(path).read_bytes())
    data[offset] ^= 0x20
    Path(path).write_bytes(bytes(data))


@pytest.mark.parametrize("which", [0, 2])
def test_a_corrupt_sample_is_never_yielded_the_pile_read_whole_raises(ds, which):
    reference = _epoch(ds)
    idx, _ = _index(ds)
    name, start, _end = _first_pile_positions(ds, idx, 3)[which]
    _flip(os.path.join(ds, name), start + 512 + 5)  # inside the first member's bytes
    got = []
    loader = shardkit.loader(ds, decode=False)
    with pytest.raises(CorruptShardError, match=rf"{name}: checksum is crc32:[0-9a-f]+, the manifest says"), loader:
        for s in loader:
            got.append({k: bytes(v) if k != "__key__" else v for k, v in s.items()})
    assert len(got) <= which and got == reference[: len(got)]


def test_a_damaged_index_is_passed_over_with_a_warning(ds, caplog):
    reference = _epoch(ds)
    _, url = _index(ds)
    stored = Path(url).read_bytes()
    for offset in (20, len(stored) - 12, len(stored) // 2):  # the header, the sample checksums, the arrays
        Path(url).write_bytes(stored[:offset] + bytes([stored[offset] ^ 1]) + stored[offset + 1 :])
        with caplog.at_level(logging.WARNING):
            assert _epoch(ds) == reference
    Path(url).write_bytes(stored[:20])  # torn
    with caplog.at_level(logging.WARNING):
        assert _epoch(ds) == reference
    assert "not used to start the first pile early" in caplog.text


def test_an_index_whose_sample_checksum_is_wrong_never_hands_out_its_range(ds, monkeypatch):
    reference = _epoch(ds)
    idx, url = _index(ds)
    name, start, _ = _first_pile_positions(ds, idx, 1)[0]
    crcs = idx.crcs.copy()
    crcs[int(np.flatnonzero(idx.bounds == start)[0]) - [f.name for f in idx.files].index(name)] ^= 1
    bad = index_module.Index(idx.files, idx.bounds, idx.hashes, idx.order, crcs)
    Path(url).write_bytes(index_module.encode(bad, manifest.read(ds)))  # consistent, but wrong about one sample
    gate = hold_whole_reads(monkeypatch)
    threading.Timer(0.5, gate.set).start()
    assert _epoch(ds) == reference  # that sample came from the pile read whole
    assert gate.is_set()


def _v1(idx: index_module.Index, m: manifest.Manifest) -> bytes:
    """The index in the first version of the format (no sample checksums)."""
    header = {
        "version": 1,
        "generation": m.generation,
        "manifest": index_module.identity(m),
        "samples": len(idx),
        "files": [f.name for f in idx.files],
        "order": idx.order.dtype.str,
    }
    text = json.dumps(header).encode()
    head = index_module.MAGIC_V1 + struct.pack("<I", len(text)) + text
    head += b"\0" * (-len(head) % 8)
    body = head + idx.bounds.astype("<i8").tobytes() + idx.hashes.astype("<u8").tobytes() + idx.order.tobytes()
    return body + struct.pack("<I", manifest.checksum(body))


def test_an_index_of_the_first_version_still_serves_random_access_and_the_loader_reads_piles_whole(ds, monkeypatch):
    reference = _epoch(ds)
    idx, url = _index(ds)
    m = manifest.read(ds)
    Path(url).write_bytes(_v1(idx, m))
    loaded = index_module.decode(Path(url).read_bytes(), m, url)
    assert loaded.crcs is None and (loaded.bounds == idx.bounds).all() and (loaded.order == idx.order).all()
    assert index_module.file_checks(Path(url).read_bytes(), m.piles[0], url) is None
    builds = []
    real = index_module.build
    monkeypatch.setattr(index_module, "build", lambda *a, **k: builds.append(1) or real(*a, **k))
    ds_map = shardkit.open(ds, decode=False)
    assert ds_map[3]["__key__"] == ds_map.raw(3)["__key__"] and builds == []  # the old index is used as it is
    gate = hold_whole_reads(monkeypatch)
    threading.Timer(0.3, gate.set).start()
    assert _epoch(ds) == reference


def test_the_index_section_of_each_pile_matches_the_whole_index(ds):
    idx, url = _index(ds)
    data = Path(url).read_bytes()
    m = manifest.read(ds)
    for f, part in enumerate(idx.files):
        bounds, crcs = index_module.file_checks(data, part.info, url)
        lo, hi = int(idx.starts[f]), int(idx.starts[f + 1])
        assert (bounds == idx.bounds[lo + f : hi + f + 1]).all() and (crcs == idx.crcs[lo:hi]).all()
        pile = Path(os.path.join(ds, part.name)).read_bytes()
        assert [manifest.checksum(pile[a:b]) for a, b in itertools.pairwise(bounds.tolist())] == crcs.tolist()
    other = manifest.PileInfo(name=m.piles[0].name, samples=m.piles[0].samples, bytes=m.piles[0].bytes, checksum="crc32:00000000")
    assert index_module.file_checks(data, other, url) is None  # another file of that name: not this index's


def test_a_resumed_epoch_starts_its_pile_early_where_the_state_says(ds, monkeypatch):
    reference = _epoch(ds, seed=2)
    _index(ds)
    with shardkit.loader(ds, decode=False, seed=2) as loader:
        samples = iter(loader)
        for _ in range(7):
            next(samples)
        state = loader.state_dict()
    gate = hold_whole_reads(monkeypatch)
    with shardkit.loader(ds, decode=False, seed=2) as loader:
        loader.load_state_dict(state)
        samples = iter(loader)
        first = next(samples)  # from its range: no pile was read whole yet
        gate.set()
        rest = [first, *samples]
    assert [s["__key__"] for s in rest] == [s["__key__"] for s in reference[7:]]


def test_random_access_checks_each_ranged_read_against_the_index(ds):
    idx, _ = _index(ds)
    f, start, _ = idx.locate(10)
    _flip(os.path.join(ds, idx.files[f].name), start + 512 + 3)  # a payload byte: headers and key unchanged
    data = shardkit.open(ds, decode=False)
    with pytest.raises(CorruptShardError, match=rf"{idx.files[f].name}: the sample at offset {start} does not match its checksum"):
        data.raw(10)
    assert data.raw(11)["__key__"]  # the others still read
    assert shardkit.open(ds, decode=False, verify=False).raw(10)["__key__"]  # verify=False: not checked


def test_a_paused_reader_reads_nothing_until_resumed_or_asked():
    from shardkit.loading.prefetch import PileReader

    read = []
    reader = PileReader([1, 2, 3], lambda x: read.append(x) or x * 10, slots=2, paused=True)
    try:
        threading.Event().wait(0.2)
        assert read == [] and not reader.ready()
        assert reader.get() == 10  # asking resumes it
        reader.release()
        assert reader.get() == 20 and read[:2] == [1, 2]
    finally:
        reader.close()
    other = PileReader([1, 2], lambda x: x, slots=1, paused=True)
    other.resume()
    assert other.get() == 1
    other.close()
