"""PileReader: results in order, never more than ``slots`` alive, errors in place, clean close."""

from __future__ import annotations

import threading

import pytest

import shardkit
from shardkit.errors import Failure
from shardkit.loading.prefetch import PileReader


def _drain(reader: PileReader) -> list:
    out = []
    while (item := reader.get()) is not None:
        out.append(item)
        reader.release()
    return out


@pytest.mark.parametrize("slots", [1, 2, 3, 4])
def test_alive_results_never_exceed_slots(slots):
    lock = threading.Lock()
    alive = [0]
    peak = [0]

    def read(i: int) -> int:
        with lock:
            alive[0] += 1
            peak[0] = max(peak[0], alive[0])
        return i

    reader = PileReader(range(20), read, slots=slots)
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
