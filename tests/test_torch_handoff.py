"""DataLoader workers hand raw batches of compressed piles over in shared memory: the same batches, whatever fits."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import shardkit
from tests.conftest import make_samples

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'shardkit[torch]')")

from shardkit.loading import ring as ring_module  # noqa: E402
from shardkit.loading.ring import Ring  # noqa: E402
from shardkit.torch import ShardkitDataLoader, ShardkitDataset  # noqa: E402

N = 150
pytestmark = pytest.mark.skipif(Ring.make(1) is None, reason="no memfd_create on this platform: batches go through the queue")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """Compressed piles: their fields cannot be left in the files (tests/test_torch_located.py),
    so every batch goes through the ring."""
    out = str(tmp_path_factory.mktemp("handoff") / "ds")
    with shardkit.PileWriter(out, piles=4, seed=3, compression="gzip") as w:
        for s in make_samples(N, size=300):
            w.write(s)
    return out


def reference(source: str, epoch: int = 0) -> list[dict]:
    """The batches one process yields (no worker, no handoff), with every raw field as bytes."""
    with shardkit.loader(source, decode=False, batch_size=16, seed=2) as loader:
        loader.set_epoch(epoch)
        return [{k: [bytes(x) for x in v] if k != "__key__" else v for k, v in b.items()} for b in loader]


def plain(batches: list[dict]) -> list[dict]:
    return [{k: [bytes(x) for x in v] if k != "__key__" else v for k, v in b.items()} for b in batches]


def test_a_ring_hands_batches_over_and_reuses_its_lowest_room():
    ring = Ring.make(2, region=100)
    w = ring.writer(1)
    a = w.put([[b"abc", b"de"], [b"f"]], 6)
    b = w.put([[memoryview(b"0123456789")]], 10)
    assert a == (0, 0) and b == (1, 6)
    assert ring.cut(1, 0, np.array([3, 5])) == [b"abc", b"de"] and ring.read(1, 5, 1) == b"f"
    assert ring.read(1, 6, 10) == b"0123456789" and ring.read(0, 0, 3) == bytes(3)  # worker 0's region untouched
    assert w.put([[bytes(90)]], 90) is None  # no room while both are unread
    ring.done(1, 0)
    assert ring.count(1) == 1 and w.put([[b"x" * 6]], 6) == (2, 0)  # the first batch's room, read, is reused
    ring.done(1, 1), ring.done(1, 2)
    assert w.put([[bytes(100)]], 100) == (3, 0) and w.put([[b"y"]], 1) is None
    assert ring.writer(1) is w and Ring.make(2, region=100).writer(1).seq == 0


def test_a_new_writer_goes_on_from_what_was_read():
    ring = Ring.make(1, region=64)
    for seq in range(3):
        assert ring.writer(0).put([[b"ab"]], 2) == (seq, 2 * seq)
    ring.done(0, 2)
    ring._writers.clear()  # as in a worker process started anew on the same ring
    assert ring.writer(0).put([[b"cd"]], 2) == (3, 0)


@pytest.mark.parametrize("views", [False, True])
def test_persistent_workers_hand_every_batch_over_in_shared_memory(data, views):
    ds = ShardkitDataset(data, batch_size=16, decode=False, seed=2, views=views)
    dl = ShardkitDataLoader(ds, num_workers=2, persistent_workers=True)
    for epoch in range(2):
        ds.set_epoch(epoch)
        got = list(dl)
        kind = memoryview if views else bytes
        assert all(type(v) is kind for b in got for v in b["bin"])
        assert sorted(plain(got), key=lambda b: b["__key__"]) == sorted(reference(data, epoch=epoch), key=lambda b: b["__key__"])
    # every batch of both epochs came through the ring, none through the queue
    assert dl._ring is not None and dl._ring.count(0) + dl._ring.count(1) == 2 * len(dl)


def test_batches_that_find_no_room_go_through_the_queue(data, monkeypatch):
    want = plain(list(ShardkitDataLoader(ShardkitDataset(data, batch_size=16, decode=False, seed=2), num_workers=2)))
    for region in (100, 9000):  # no batch fits; about one batch fits
        monkeypatch.setattr(ring_module, "REGION", region)
        dl = ShardkitDataLoader(ShardkitDataset(data, batch_size=16, decode=False, seed=2), num_workers=2, persistent_workers=True)
        assert plain(list(dl)) == want
        assert (dl._ring.count(0) + dl._ring.count(1) == 0) is (region == 100)


def test_two_live_iterations_of_one_dataloader_do_not_share_memory(data):
    dl = ShardkitDataLoader(ShardkitDataset(data, batch_size=16, decode=False, seed=2), num_workers=2)
    want = plain(list(dl))
    first = iter(dl)
    head = [next(first) for _ in range(3)]  # its workers stay alive, a batch or two ahead
    second = plain(list(dl))
    rest = plain(head) + plain(list(first))
    assert second == want and rest == want


def test_with_persistent_workers_an_iteration_a_newer_one_ended_raises(data):
    """torch hands every iteration of a DataLoader with persistent workers the same iterator,
    reset: an earlier iteration that went on would read the newer one's batches (the two mixed,
    more batches than an epoch has). It raises at its next batch instead; the newer one is whole."""
    dl = ShardkitDataLoader(ShardkitDataset(data, batch_size=16, decode=False, seed=2), num_workers=2, persistent_workers=True)
    want = plain(list(dl))
    first = iter(dl)
    head = [next(first) for _ in range(3)]
    assert plain(head) == want[:3]
    assert plain(list(dl)) == want
    with pytest.raises(RuntimeError, match=r"ended before its last batch: a newer iteration began"):
        next(first)


def test_an_iteration_stopped_early_leaves_the_next_one_whole(data):
    ds = ShardkitDataset(data, batch_size=16, decode=False, seed=2)
    for persistent in (False, True):
        dl = ShardkitDataLoader(ds, num_workers=2, persistent_workers=persistent)
        want = plain(list(dl))
        for stop in (1, 4):
            it = iter(dl)
            for _ in range(stop):
                next(it)
            del it
            assert plain(list(dl)) == want


def test_fields_missing_from_some_samples_stay_bytes(tmp_path):
    """Irregular piles are collated sample by sample: a field some samples lack is a list with
    None in their places, and its values stay bytes although the worker reads views."""
    out = str(tmp_path / "irregular")
    with shardkit.PileWriter(out, piles=2, seed=1) as w:
        for i in range(40):
            w.write({"__key__": f"k{i:03d}", "bin": bytes([i]) * 50, **({"odd": b"x" * i} if i % 2 else {})})
    dl = ShardkitDataLoader(ShardkitDataset(out, batch_size=8, decode=False, seed=0), num_workers=2)
    got = list(dl)
    assert {type(v) for b in got for v in b["odd"]} == {bytes, type(None)}
    assert {type(v) for b in got for v in b["bin"]} == {bytes}
    assert sorted(k for b in got for k in b["__key__"]) == [f"k{i:03d}" for i in range(40)]
    for b in got:
        for key, odd in zip(b["__key__"], b["odd"], strict=True):
            i = int(key[1:])
            assert odd == (b"x" * i if i % 2 else None)


def test_spawned_workers_get_the_shared_memory_too(data):
    ds = ShardkitDataset(data, batch_size=16, decode=False, seed=2)
    dl = ShardkitDataLoader(ds, num_workers=1, multiprocessing_context="spawn", persistent_workers=True)
    got = plain(list(dl))
    assert got == reference(data)
    assert dl._ring.count(0) == len(dl)


def test_the_epochs_benchmark_prints_both_contenders_and_the_ratios(tmp_path):
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "dataloader_epochs.py")
    argv = [sys.executable, script, "--samples", "600", "--piles", "3", "--epochs", "2", "--repeats", "1", "--data", str(tmp_path)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "| shardkit.loader, one process |" in out.stdout and "| ShardkitDataLoader |" in out.stdout
    assert re.search(r"first epoch \d+\.\d\dx, later epochs \d+\.\d\dx", out.stdout)
    assert "| torch DataLoader, the same CPU a batch, no data |" in out.stdout
    assert re.search(r"\d+\.\d\dx one process\. ShardkitDataLoader reaches \d+\.\d\dx of it", out.stdout)


def test_a_batch_of_more_pieces_than_one_write_takes_is_whole():
    ring = Ring.make(1, region=1 << 16)
    pieces = [bytes([i % 251]) * (i % 7) for i in range(3000)]  # more than IOV_MAX, empty ones among them
    ends = np.cumsum([len(p) for p in pieces])
    _, at = ring.writer(0).put([pieces, [b"tail"]], int(ends[-1]) + 4)
    assert ring.cut(0, at, ends) == pieces and ring.read(0, at + int(ends[-1]), 4) == b"tail"


@pytest.mark.parametrize("workers", [0, 2])
def test_views_stay_memoryviews_in_single_samples_and_irregular_batches(tmp_path, workers):
    """Raw fields of views=True come out as memoryviews (or None where a sample lacks one) in
    samples yielded one at a time and in batches of samples whose fields differ, never as the
    lists of ints default_convert makes of a memoryview."""
    out = str(tmp_path / "irregular")
    with shardkit.PileWriter(out, piles=2, seed=1) as w:
        for i in range(40):
            w.write({"__key__": f"k{i:03d}", "bin": bytes([i]) * 50, **({"odd": b"x" * i} if i % 2 else {})})
    samples = list(ShardkitDataLoader(ShardkitDataset(out, decode=False, views=True, seed=0), num_workers=workers))
    assert len(samples) == 40
    for s in samples:
        assert type(s["bin"]) is memoryview and bytes(s["bin"]) == bytes([int(s["__key__"][1:])]) * 50
    batches = list(ShardkitDataLoader(ShardkitDataset(out, batch_size=8, decode=False, views=True, seed=0), num_workers=workers))
    assert {type(v) for b in batches for v in b["odd"]} == {memoryview, type(None)}
    for b in batches:
        for key, odd in zip(b["__key__"], b["odd"], strict=True):
            i = int(key[1:])
            assert (None if odd is None else bytes(odd)) == (b"x" * i if i % 2 else None)


def test_views_with_pinned_memory_are_refused_where_pinning_happens(dataset, monkeypatch):
    """Pinning (only where an accelerator is) rebuilds what is no tensor: each memoryview would
    become a list of ints. Refused there; on a machine without one, torch skips pinning and the
    loader reads as usual."""
    ds = ShardkitDataset(dataset, batch_size=4, decode=False, views=True, world_size=1, rank=0)
    with pytest.warns(UserWarning, match="no accelerator is found"):
        assert type(next(iter(ShardkitDataLoader(ds, pin_memory=True)))["bin"][0]) is memoryview
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    with pytest.raises(shardkit.ConfigError, match="views=True with pin_memory=True: pinning is for tensors"):
        ShardkitDataLoader(ds, pin_memory=True)
    ShardkitDataLoader(ds, pin_memory=False)
