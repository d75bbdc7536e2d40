"""What is left of an epoch after ranks read part of it, and how another number of ranks splits it. Pure.

An epoch is read in *phases*. A phase is a world size and a batch size (and, under
:mod:`shardkit.torch`, a number of DataLoader workers per rank) splitting a sequence of global
positions of the epoch's order: each rank reads a contiguous slice of it (:func:`plan.rank_span`,
padding and dropping as usual), each worker a contiguous sub-slice (:func:`plan.worker_span`).
The first phase splits the whole order ``[0, N)``. When a job comes back with another world
size (or batch size, or number of workers), its phase ends: every worker of every rank has read
a prefix of its slice, of the same length on every rank, since ranks move in step. What nobody
read is a few ranges of the global order; the next phase splits those ranges, kept in global
order and read as if they were the whole epoch, by the same rules.

A finished phase is recorded as ``(world_size, batch_size, read)``, ``read`` holding how far
each worker of a rank got (one number without DataLoader workers): a few integers per change,
whatever the size of the dataset. The ranges left are recomputed from them, so the order of the
rest of the epoch is a pure function of ``(seed, epoch, counts, phases)``.

An order may have an *open end* (a blend's, whose sources read on): then each phase first
rounds what it splits up to whole batches on every rank with positions after the last one yet
(:func:`grown`), so no phase pads or drops, and the ranges stay in global order.

    rest = remaining(1000, [Phase(8, 32, (96,))], drop_last=True)
    ranges = share(rest, world=6, rank=2, drop_last=True, batch_size=32)
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shardkit.loading.plan import rank_span, slice_span, worker_span

Range = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Phase:
    """A finished phase: ``world_size`` ranks of ``batch_size`` read ``read[w]`` positions of
    worker ``w``'s sub-slice of their slice (one entry: the whole slice of a rank)."""

    world_size: int
    batch_size: int | None
    read: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "batch_size": self.batch_size, "read": list(self.read)}


class RestOf(Protocol):
    """The global ranges of an epoch a phase of ``world`` ranks of ``batch_size`` splits after the
    phases ``done`` (:meth:`shardkit.loading.source.Source.rest`); ValueError for phases that
    cannot be."""

    def __call__(self, done: Sequence[Phase], *, world: int, batch_size: int | None, drop_last: bool) -> list[Range]: ...


def whole(total: int) -> list[Range]:
    """The sequence of a phase that starts an epoch: the global order ``[0, total)``."""
    return [(0, total)] if total else []


def length(ranges: Sequence[Range]) -> int:
    return sum(b - a for a, b in ranges)


def cut(rest: Sequence[Range], lo: int, hi: int) -> list[Range]:
    """Global ranges of positions ``lo .. hi - 1`` of the sequence ``rest``, in reading order.

    Positions from ``length(rest)`` on wrap round to its start: the padding of ``drop_last=False``.
    """
    return _cut(rest, _starts(rest), lo, hi)


def _starts(rest: Sequence[Range]) -> list[int]:
    """Where each range of ``rest`` starts in the sequence, and its length last."""
    starts = [0]
    for a, b in rest:
        starts.append(starts[-1] + b - a)
    return starts


def _cut(rest: Sequence[Range], starts: list[int], lo: int, hi: int) -> list[Range]:
    total = starts[-1]
    if not total or lo >= hi:
        return []
    out: list[Range] = []
    at = lo
    while at < hi:
        v = at % total
        i = bisect.bisect_right(starts, v) - 1
        g = rest[i][0] + v - starts[i]
        size = min(hi - at, rest[i][1] - g)
        out.append((g, g + size))
        at += size
    return out


def share(
    rest: Sequence[Range], *, world: int, rank: int, drop_last: bool, batch_size: int | None, workers: int = 1, worker: int = 0
) -> list[Range]:
    """The global ranges one worker of one rank reads of ``rest``, in reading order."""
    lo, hi = slice_span(length(rest), world=world, rank=rank, drop_last=drop_last, batch_size=batch_size, workers=workers, worker=worker)
    return cut(rest, lo, hi)


def worker_lengths(rest: Sequence[Range], *, world: int, drop_last: bool, batch_size: int | None, workers: int) -> list[int]:
    """Positions each of ``workers`` workers of a rank reads of ``rest`` (the same on every rank)."""
    lo, hi = rank_span(length(rest), world=world, rank=0, drop_last=drop_last, batch_size=batch_size)
    spans = [worker_span(lo, hi, workers=workers, worker=w, batch_size=batch_size) for w in range(workers)]
    return [b - a for a, b in spans]


def check_phase(rest: Sequence[Range], phase: Phase, *, drop_last: bool) -> None:
    """Raise ValueError when ``phase`` cannot have read ``rest``: a worker past its slice or off a batch boundary."""
    if phase.world_size < 1 or not phase.read:
        raise ValueError(f"expected world_size >= 1 and at least one read count, got {phase.to_dict()}")
    sizes = worker_lengths(rest, world=phase.world_size, drop_last=drop_last, batch_size=phase.batch_size, workers=len(phase.read))
    for w, (n, size) in enumerate(zip(phase.read, sizes, strict=True)):
        if not 0 <= n <= size:
            raise ValueError(f"read[{w}]: expected an integer between 0 and {size} (that slice's length), got {n}")
        if phase.batch_size and n % phase.batch_size and n != size:
            raise ValueError(f"read[{w}]: {n} is not on a batch boundary (batch_size={phase.batch_size})")


def after(rest: Sequence[Range], phase: Phase, *, drop_last: bool) -> list[Range]:
    """What is left of ``rest`` once ``phase`` read it as far as it got (see :func:`check_phase`)."""
    total = length(rest)
    taken: list[Range] = []  # positions of ``rest`` read, folded back into [0, total)
    for rank in range(phase.world_size):
        lo, hi = rank_span(total, world=phase.world_size, rank=rank, drop_last=drop_last, batch_size=phase.batch_size)
        for w, n in enumerate(phase.read):
            a = worker_span(lo, hi, workers=len(phase.read), worker=w, batch_size=phase.batch_size)[0]
            b = a + n
            while a < b:  # padding wraps round to the start (at most once: a slice is never longer than rest)
                v = a % total
                size = min(b - a, total - v)
                taken.append((v, v + size))
                a += size
    left, at = [], 0
    for a, b in sorted(taken):
        if a > at:
            left.append((at, a))
        at = max(at, b)
    if at < total:
        left.append((at, total))
    starts = _starts(rest)
    return [g for a, b in left for g in _cut(rest, starts, a, b)]


def remaining(total: int, done: Sequence[Phase], *, drop_last: bool, open_end: bool = False) -> list[Range]:
    """The global ranges of an epoch of ``total`` positions that the phases ``done`` left unread.

    ``open_end``: the order runs on past ``total`` (a blend's sources read on), and each phase
    first rounds what it splits up to whole batches on every rank with the positions after the
    last one yet (:func:`grown`), so it pads nothing and drops nothing.

    Raises:
        ValueError: a phase that cannot have read what the phases before it left (the message
            says which, counting from 0).
    """
    return _fold(total, done, drop_last=drop_last, open_end=open_end)[0]


def rest_for(
    total: int, done: Sequence[Phase], *, world: int, batch_size: int | None, drop_last: bool, open_end: bool = False
) -> list[Range]:
    """The global ranges a phase of ``world`` ranks of ``batch_size`` splits after the phases ``done``."""
    rest, end = _fold(total, done, drop_last=drop_last, open_end=open_end)
    return grown(rest, end, world=world, batch_size=batch_size) if open_end else rest


def extent(total: int, done: Sequence[Phase], *, world: int, batch_size: int | None, drop_last: bool) -> int:
    """Where an order with an open end stops once a phase of ``world`` and ``batch_size`` after ``done`` read all it splits."""
    rest, end = _fold(total, done, drop_last=drop_last, open_end=True)
    return end + -length(rest) % (world * (batch_size or 1))


def grown(rest: Sequence[Range], end: int, *, world: int, batch_size: int | None) -> list[Range]:
    """``rest`` with positions ``end, end + 1, ..`` after it, up to whole batches on each of ``world`` ranks."""
    unit = world * (batch_size or 1)
    more = -length(rest) % unit
    if not more:
        return list(rest)
    if rest and rest[-1][1] == end:  # one range, not two touching ones
        return [*rest[:-1], (rest[-1][0], end + more)]
    return [*rest, (end, end + more)]


def _fold(total: int, done: Sequence[Phase], *, drop_last: bool, open_end: bool) -> tuple[list[Range], int]:
    """What the phases ``done`` left, and where the order ends after what they read on into."""
    rest, end = whole(total), total
    for i, phase in enumerate(done):
        if open_end:
            rest = grown(rest, end, world=phase.world_size, batch_size=phase.batch_size)
            end = max(end, rest[-1][1]) if rest else end
        try:
            check_phase(rest, phase, drop_last=drop_last)
        except ValueError as e:
            raise ValueError(f"done[{i}]: {e}") from None
        rest = after(rest, phase, drop_last=drop_last)
    return rest, end
