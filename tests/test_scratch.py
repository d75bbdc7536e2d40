"""The memory compressed piles are decoded into: a map is given out again only once nothing refers
to it, and a loader's samples stay exact over epochs, with fields held as views across them."""

from __future__ import annotations

import copy
import gc
import mmap
import os
import pathlib
import pickle

import numpy as np
import pytest

import shardkit
from shardkit.storage import Scratch
from shardkit.storage import scratch as scratch_module
from shardkit.tar import compression, lz4_blocks

needs_counts = pytest.mark.skipif(scratch_module._ALONE is None, reason="maps are reused only where CPython's reference counts tell")


def _filled(s: Scratch, size: int, byte: bytes) -> mmap.mmap:
    m = s.take(size)
    assert m is not None and len(m) == size
    m[:] = byte * size
    return m


@needs_counts
def test_a_map_is_given_again_resized_once_nothing_refers_to_it():
    s = Scratch(keep=2)
    first = id(_filled(s, 10_000, b"a"))  # let go at once
    b = s.take(8_000)
    assert id(b) == first and len(b) == 8_000 and b[:3] == b"aaa"  # the same memory, left as it was
    b.resize(8_000)  # writable and not exported
    assert len(s) == 1


@needs_counts
@pytest.mark.parametrize(
    "hold",
    [
        pytest.param(lambda m: m, id="a reference"),
        pytest.param(lambda m: memoryview(m)[10:20].toreadonly(), id="a field's view"),
        pytest.param(lambda m: np.frombuffer(m, dtype=np.uint8)[5:], id="a numpy view"),
        pytest.param(lambda m: [{"x": memoryview(m)}], id="a view inside a batch"),
    ],
)
def test_a_map_anything_still_refers_to_is_never_given_again(hold):
    s = Scratch(keep=4)
    held = hold(_filled(s, 4096, b"x"))
    _filled(s, 4096, b"y")  # must be another map: what is held does not change
    assert len(s) == 2
    found = held if not isinstance(held, list) else held[0]["x"]
    assert bytes(memoryview(found)[:5]) == b"xxxxx"


@needs_counts
def test_keep_bounds_the_maps_kept_and_a_closed_loader_lets_them_go(piles):
    s = Scratch(keep=1)
    a, b = s.take(100), s.take(100)
    assert len(s) == 1 and a is not b
    s.room(0)
    assert len(s) == 0 and a[:0] == b""  # let go by the scratch, still whole for who holds it
    loader = shardkit.loader(piles[0]["lz4"], seed=0, decode=False)
    assert sum(1 for _ in loader) == len(piles[1])
    scratch = loader._setup.scratch
    assert len(scratch) >= (1 if scratch_module._ALONE is not None else 0)
    loader.close()
    assert len(scratch) == 0


def test_where_reference_counts_cannot_tell_no_map_is_given_or_kept(piles, monkeypatch):
    monkeypatch.setattr(scratch_module, "_ALONE", None)
    s = Scratch(keep=3)
    assert s.take(4096) is None and len(s) == 0
    roots, truth = piles
    with shardkit.loader(roots["lz4"], seed=4, decode=False) as loader:
        assert {x["__key__"]: x["txt"] for x in loader} == truth
        assert len(loader._setup.scratch) == 0


@needs_counts
def test_no_bytes_is_no_map_and_a_copy_or_pickle_starts_empty():
    s = Scratch(keep=3)
    assert s.take(0) is None
    held = s.take(64)
    for again in (pickle.loads(pickle.dumps(s)), copy.copy(s)):
        assert isinstance(again, Scratch) and len(again) == 0 and again._keep == 3
    assert held is not None


@needs_counts
def test_lz4_decodes_into_the_scratch_and_a_frame_that_fails_leaves_its_map_free():
    frame = pytest.importorskip("lz4.frame", reason="lz4 piles need the lz4 package: pip install lz4")

    data = b"".join(b"%08d" % i for i in range(200_000))
    packed = compression.compress(data, "lz4", level=0)
    s = Scratch(keep=1)
    out = lz4_blocks.read_checked(packed, len(data), into=s)
    assert isinstance(out, mmap.mmap) and out[:] == data and len(s) == 1
    kept = id(out)
    del out
    unsized = frame.compress(data, store_size=False)  # no content size in the header: the decode itself finds it short
    assert lz4_blocks.read_checked(unsized, len(data) + 1, into=s) is None
    again = s.take(len(data))
    assert id(again) == kept  # nothing held the failed decode's map


@pytest.fixture(scope="module")
def piles(tmp_path_factory):
    root = tmp_path_factory.mktemp("scratch")
    rng = np.random.default_rng(0)
    samples = [
        {"__key__": f"s{i:05d}", "txt": (" ".join(["red", "green", "blue"][j % 3] for j in range(int(rng.integers(20, 400))))).encode()}
        for i in range(1500)
    ]
    out = {}
    for codec in (None, "lz4", "zstd"):
        with shardkit.PileWriter(str(root / str(codec)), piles=5, seed=3, compression=codec) as w:
            for sample in samples:
                w.write(sample)
        out[codec] = str(root / str(codec))
    return out, {s["__key__"]: s["txt"] for s in samples}


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_a_loaders_epochs_are_exact_with_views_held_from_every_epoch(piles, codec):
    roots, truth = piles
    loader = shardkit.loader(roots[codec], seed=5, decode=False, views=True)
    plain = shardkit.loader(roots[None], seed=5, decode=False)
    held = []
    for _ in range(3):
        got = [(s["__key__"], s["txt"]) for s in loader]
        assert [k for k, _ in got] == [s["__key__"] for s in plain]  # the same order as the plain piles
        assert all(bytes(v) == truth[k] for k, v in got)
        held.extend(got[:: max(1, len(got) // 20)])
        gc.collect()
        assert all(bytes(v) == truth[k] for k, v in held)  # views from earlier epochs still read their own bytes
    loader.close()
    plain.close()


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_copied_fields_over_epochs_reuse_the_memory_and_stay_exact(piles, codec, monkeypatch):
    roots, truth = piles
    made = []
    real = scratch_module._new
    monkeypatch.setattr(scratch_module, "_new", lambda size: made.append(size) or real(size))
    loader = shardkit.loader(roots[codec], seed=9, decode=False)
    for _ in range(3):
        assert sorted(s["__key__"] for s in loader) == sorted(truth)
        assert all(s["txt"] == truth[s["__key__"]] for s in loader)
    loader.close()
    if scratch_module._ALONE is not None:
        # 6 epochs of 5 piles: only as many maps as piles are held at once, not one a pile
        assert 0 < len(made) <= 4, made


def test_a_compressed_pile_on_disk_is_never_written_through(piles):
    roots, _ = piles
    files = sorted(f for f in os.listdir(roots["lz4"]) if f.endswith(".lz4"))
    before = {f: pathlib.Path(roots["lz4"], f).read_bytes() for f in files}
    for _ in shardkit.loader(roots["lz4"], seed=1, decode=False, views=True):
        pass
    assert {f: pathlib.Path(roots["lz4"], f).read_bytes() for f in files} == before
