"""PileReader: results in order, never more than ``slots`` alive, errors in place, clean close."""

from __future__ import annotations

import os
import threading

import pytest

import shardkit
from shardkit.errors import Failure
from shardkit.loading.prefetch import PileReader, read_ahead
from tests.conftest import make_samples


def _drain(reader: PileReader) -> list:
    out = []
    while (item := reader.get()) is not None:
        out.append(item)
        reader.release()
    return out


@pytest.mark.parametrize("readers", [1, 3])
@pytest.mark.parametrize("slots", [1, 2, 3, 4])
def test_alive_results_never_exceed_slots(slots, readers):
    lock = threading.Lock()
    alive = [0]
    peak = [0]

    def read(i: int) -> int:
        with lock:
            alive[0] += 1
            peak[0] = max(peak[0], alive[0])
        return i

    reader = PileReader(range(20), read, slots=slots, readers=readers)
    got = []
    try:
        while (item := reader.get()) is not None:
            got.append(item)
            with lock:
                alive[0] -= 1
            reader.release()
    finally:
        reader.close()
    assert got == list(range(20))
    assert 1 <= peak[0] <= slots


def test_errors_arrive_in_their_place():
    def read(i: int) -> int:
        if i == 1:
            raise KeyError("pile 1 is gone")
        return i

    reader = PileReader(range(3), read, slots=2)
    try:
        first, second, third = _drain(reader)
    finally:
        reader.close()
    assert first == 0 and third == 2
    assert isinstance(second, Failure) and second.index == 1 and isinstance(second.error, KeyError)


def test_close_stops_a_thread_waiting_for_a_slot():
    baseline = set(threading.enumerate())
    reader = PileReader(range(10), lambda i: i, slots=2, name="test-reader")
    assert reader.get() == 0  # not released: the thread fills the other slot, then waits
    reader.close()
    reader.close()  # idempotent
    assert set(threading.enumerate()) == baseline


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least 1"):
        PileReader([1], lambda i: i, slots=0)


def test_loader_order_does_not_depend_on_prefetch(dataset):
    orders = []
    for prefetch in (0, 1, 3):
        with shardkit.loader(dataset, decode=False, seed=4, prefetch=prefetch) as loader:
            orders.append([s["__key__"] for s in loader])
    assert orders[0] == orders[1] == orders[2]
    assert sorted(orders[0]) == sorted(set(orders[0])) and len(orders[0]) == 200


def test_several_readers_read_at_once_and_hand_out_in_order():
    baseline = set(threading.enumerate())
    together = threading.Barrier(3, timeout=30)  # passes only if three reads run at the same time

    def read(i: int) -> int:
        if i < 3:
            together.wait()
        if i == 4:
            raise KeyError("pile 4 is gone")
        return i

    reader = PileReader(range(9), read, slots=4, readers=3, name="test-readers")
    try:
        got = _drain(reader)
    finally:
        reader.close()
    assert got[:4] == [0, 1, 2, 3] and got[5:] == [5, 6, 7, 8]
    assert isinstance(got[4], Failure) and got[4].index == 4
    assert set(threading.enumerate()) == baseline


@pytest.mark.parametrize(
    ("pile_bytes", "remote", "expected"),
    [
        (5 << 20, False, 1),  # local piles: one ahead
        (None, True, 1),  # size unknown (plain shards)
        (5 << 20, True, 8),  # small: one request each, eight at once
        (12 << 20, True, 8),
        (24 << 20, True, 3),  # three ranges of 8 MiB each: three piles keep eight requests busy
        (64 << 20, True, 1),  # eight ranges: one pile is enough
        (200 << 20, True, 1),
        (1 << 10, True, 8),
    ],
)
def test_read_ahead_follows_the_pile_size(pile_bytes, remote, expected):
    assert read_ahead(pile_bytes, remote=remote, concurrency=8, least_range=8 << 20) == expected


def test_read_ahead_stays_within_its_budget():
    assert read_ahead(100 << 20, remote=True, concurrency=64, least_range=8 << 20, budget=256 << 20) == 2


@pytest.mark.parametrize(("tar_bytes", "expected"), [(6 << 20, 2), (128 << 20, 2), (129 << 20, 1), (None, 1)])
def test_local_piles_to_decode_are_read_two_ahead_when_two_fit(tar_bytes, expected):
    assert read_ahead(tar_bytes, remote=False, concurrency=8, least_range=8 << 20, decoded=True, budget=256 << 20) == expected


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_compressed_local_piles_are_decoded_two_at_once_by_one_process_only(tmp_path, monkeypatch, compression):
    """Two threads decode lz4 piles side by side in one process, never in a DataLoader worker
    (workers already read side by side); the epochs are the same as one thread reads them."""
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=6, seed=2, compression=compression) as w:
        for s in make_samples(120, size=200):
            w.write(s)
    started: list[tuple[int, int]] = []
    real = PileReader.__init__

    def spy(self, items, read, *, slots, readers=1, **kw):
        started.append((slots, readers))
        real(self, items, read, slots=slots, readers=readers, **kw)

    monkeypatch.setattr(PileReader, "__init__", spy)

    def epochs(**kw) -> list[list[str]]:
        loader = shardkit.loader(out, seed=4, decode=False, **kw)
        got = []
        for e in range(2):
            loader.set_epoch(e)
            got.append([s["__key__"] for s in loader])
        return got

    default = epochs()
    assert started[-1][1] == (2 if compression and len(os.sched_getaffinity(0)) > 1 else 1)
    assert epochs(prefetch=1) == default and started[-1][1] == 1
    list(shardkit.loader(out, options=shardkit.LoaderOptions(seed=4, decode=False, worker=(0, 2))))  # as in a worker
    assert started[-1][1] == 1
