"""PileReader: results in order, reads in parallel, never more than ``slots`` alive, clean close."""

from __future__ import annotations

import threading

import pytest

import shardkit
from shardkit._prefetch import Failure, PileReader

WAIT = 10  # seconds before a synchronisation that should happen at once is declared broken


def _drain(reader: PileReader) -> list:
    out = []
    while (item := reader.get()) is not None:
        out.append(item)
        reader.release()
    return out


def test_results_come_in_order_when_reads_finish_out_of_order():
    later_done = threading.Event()
    finished: list[int] = []

    def read(i: int) -> int:
        if i == 0:
            assert later_done.wait(WAIT)  # item 0 finishes only after items 1 and 2
        finished.append(i)
        if len(finished) == 2:
            later_done.set()
        return i * 10

    reader = PileReader(range(5), read, slots=3, threads=3)
    try:
        assert _drain(reader) == [0, 10, 20, 30, 40]
    finally:
        reader.close()
    assert finished[:2] == [1, 2]


def test_threads_read_at_the_same_time():
    barrier = threading.Barrier(2, timeout=WAIT)  # breaks unless two reads are in flight together

    def read(i: int) -> int:
        barrier.wait()
        return i

    reader = PileReader(range(4), read, slots=2, threads=2)
    try:
        assert _drain(reader) == [0, 1, 2, 3]
    finally:
        reader.close()


@pytest.mark.parametrize(("slots", "threads"), [(1, 1), (2, 1), (2, 2), (3, 2), (4, 4)])
def test_alive_results_never_exceed_slots(slots, threads):
    lock = threading.Lock()
    alive = [0]
    peak = [0]

    def read(i: int) -> int:
        with lock:
            alive[0] += 1
            peak[0] = max(peak[0], alive[0])
        return i

    reader = PileReader(range(20), read, slots=slots, threads=threads)
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

    reader = PileReader(range(3), read, slots=2, threads=2)
    try:
        first, second, third = _drain(reader)
    finally:
        reader.close()
    assert first == 0 and third == 2
    assert isinstance(second, Failure) and second.index == 1 and isinstance(second.error, KeyError)


def test_close_stops_threads_waiting_for_a_slot():
    baseline = set(threading.enumerate())
    reader = PileReader(range(10), lambda i: i, slots=2, threads=2, name="test-reader")
    assert reader.get() == 0  # not released: the threads fill the other slot, then wait
    reader.close()
    reader.close()  # idempotent
    assert set(threading.enumerate()) == baseline


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least 1"):
        PileReader([1], lambda i: i, slots=0)
    with pytest.raises(ValueError, match="at least 1"):
        PileReader([1], lambda i: i, slots=1, threads=0)


def test_loader_order_does_not_depend_on_prefetch(dataset):
    orders = []
    for prefetch in (0, 1, 3):
        with shardkit.loader(dataset, decode=False, seed=4, prefetch=prefetch) as loader:
            orders.append([s["__key__"] for s in loader])
    assert orders[0] == orders[1] == orders[2]
    assert sorted(orders[0]) == sorted(set(orders[0])) and len(orders[0]) == 200
