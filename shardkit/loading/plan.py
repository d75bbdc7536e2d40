"""The epoch plan: which sample of which pile comes at each position of an epoch. Pure, no I/O.

The global order of an epoch is a function of ``(seed, epoch, pile counts, shuffle, mix)`` only:

* the pile order is a permutation drawn from the stream ``(PILE_ORDER, seed, epoch)``;
* pile ``p`` is read in the order of a permutation drawn from ``(IN_PILE, seed, epoch, p)``
  (streams: :mod:`shardkit._seeds`);
* with ``mix=1`` the piles follow each other. With ``mix=k`` the sample read ``r``-th of the
  ``j``-th pile (of ``s``) in that order sits at ``u = j + r / s``, moves to ``t = u + k * J``
  with ``J`` uniform in ``[0, 1)``, and the epoch reads in order of ``t`` (:class:`_Spread`).
  A pile then spreads over ``k + 1`` piles' worth of positions, at most about one sample in
  ``k`` of any stretch is its own, and exactly ``k + 1`` piles are in use at any time.
* ``shuffle=False`` reads piles and samples in manifest order.

The first epoch is an exactly uniform permutation for any ``mix``: given the pile sizes, the
``mix=1`` order of a pass-1 dataset is one (the pile contents are a uniformly random partition,
each pile is read in a uniformly random order), and moving its positions by jitters drawn from
the pile counts and the seed alone keeps it one.

The order has ``N = sum(counts)`` positions and is never materialized: ranks take contiguous
slices (:func:`rank_span`), workers contiguous sub-slices of those (:func:`worker_span`), and a
:class:`Schedule` hands its slice out as blocks of ``(pile ids, in-pile indices)`` together with
the pile uses (which pile, from when, until when) a loader needs to load and release piles.

    order = EpochOrder([120, 80, 100], seed=0, epoch=3, mix=2)
    sched = Schedule(order, *slice_span(order.total, world=2, rank=1, drop_last=True))
    for block in sched.blocks(start=10): ...
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit._util import check_int
from shardkit.seeds import Stream, stream

PILE_ORDER, IN_PILE, MIX = Stream.PILE_ORDER, Stream.IN_PILE, Stream.MIX
# longest block handed out at once, so a huge pile never costs a huge index array
MAX_BLOCK = 1 << 16
# the last epoch a loader reads: far past any real job, shared with DataLoader workers as a signed
# 64-bit integer, and one below the last a state may name (a state taken at an epoch's end names the next)
MOST_EPOCH = (1 << 40) - 1
# jitters are drawn for runs of this many positions, one stream (MIX, seed, epoch, run) each, so
# any stretch of the order is rebuilt from the runs it touches alone
JITTER_RUN = 1 << 16
# about how many samples a mix=k block holds (the t axis is cut this finely)
CELL = 8192
_EMPTY = np.zeros(0, dtype=np.int64)


def check_epoch(epoch: Any) -> int:
    """``epoch``, checked: an integer from 0 to :data:`MOST_EPOCH`."""
    return check_int("epoch", epoch, low=0, high=MOST_EPOCH)


def generator(tag: Stream, *values: int) -> np.random.Generator:
    """A generator for one of the plan's streams, such as ``(IN_PILE, seed, epoch, pile)``."""
    return stream(tag, *values)


@dataclass(frozen=True, slots=True)
class PileUse:
    """Pile ``pile`` is read at slice positions ``first`` to ``last`` (inclusive)."""

    pile: int
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class Block:
    """Positions ``start .. start + len(piles) - 1`` of a slice: sample ``index[j]`` of ``piles[j]``."""

    start: int
    piles: np.ndarray
    index: np.ndarray


def _cells_per_pile(mean: float) -> int:
    # a power of two, so t * cells is exact: blocks of a few thousand samples, whatever the piles
    return 1 << max(0, math.ceil(math.log2(max(mean, 1.0) / CELL)))


class _Spread:
    """The ``mix=k`` order: each sample of the ``mix=1`` order moves on by up to ``k`` piles.

    Time is counted in piles: the sample read ``r``-th of the ``j``-th pile (of ``s``) sits at
    ``u = j + r / s`` in the ``mix=1`` order and moves to ``t = u + k * J``, ``J`` uniform in
    ``[0, 1)``; the epoch reads by ``t``, ties (rare) going to the earlier position. Pile ``j``
    spans ``t`` in ``[j, j + k + 1)``, so exactly ``k + 1`` piles share any ``t`` whatever their
    sizes. ``J`` is drawn per run of :data:`JITTER_RUN` positions. The ``t`` axis is cut into
    ``cells`` cells per pile, cut ``m`` at ``t = m / cells``; :meth:`offset` (the position of the
    first sample at or after a cut) needs the jitters of the ``k + 1`` piles before the cut alone.
    """

    def __init__(self, bounds: np.ndarray, k: int, seed: int, epoch: int) -> None:
        self.bounds, self.k, self.seed, self.epoch = bounds, k, seed, epoch
        self.piles, self.total = len(bounds) - 1, int(bounds[-1])
        self.cells = _cells_per_pile(self.total / self.piles)
        self.end = (self.piles + k) * self.cells  # the last cut: every t is below it
        self._inverse = 1.0 / np.diff(bounds)
        # below j + k + 1: rounding must never carry a sample past its pile's span
        self._limit = np.nextafter(np.arange(self.piles) + float(k + 1), -np.inf)
        self._recent: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _run(self, run: int) -> tuple[np.ndarray, np.ndarray]:
        """``t`` and pile rank ``j`` of the positions of jitter run ``run`` (the last few are kept)."""
        if run not in self._recent:
            if len(self._recent) >= 4:
                del self._recent[next(iter(self._recent))]
            self._recent[run] = self._draw(run)
        return self._recent[run]

    def _draw(self, run: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = run * JITTER_RUN, min(self.total, (run + 1) * JITTER_RUN)
        jitter = stream(MIX, self.seed, self.epoch, run).random(b - a)
        j0, j1 = (np.searchsorted(self.bounds, [a, b - 1], side="right") - 1).tolist()
        j = np.repeat(np.arange(j0, j1 + 1), np.diff(np.clip(self.bounds[j0 : j1 + 2], a, b)))
        t = j + (np.arange(a, b) - self.bounds[j]) * self._inverse[j] + self.k * jitter
        return np.minimum(t, self._limit[j], out=t), j

    def times(self, lo: int, hi: int) -> np.ndarray:
        """``t`` of positions ``lo .. hi - 1`` of the ``mix=1`` order."""
        parts = []
        for run in range(lo // JITTER_RUN, -(-hi // JITTER_RUN)):
            base = run * JITTER_RUN
            parts.append(self._run(run)[0][max(0, lo - base) : hi - base])
        return np.concatenate(parts) if parts else np.zeros(0)

    def _span(self, m0: int, m1: int) -> tuple[int, int]:
        """Positions ``q`` whose ``t`` may fall between cuts ``m0`` and ``m1``: piles ``t - k - 1 < j < t``."""
        low = min(self.piles, max(0, m0 // self.cells - self.k))
        high = min(self.piles, max(low, -(-m1 // self.cells)))
        return int(self.bounds[low]), int(self.bounds[high])

    def offset(self, m: int) -> int:
        """How many ``t`` lie below cut ``m``."""
        lo, hi = self._span(m, m)
        return lo + (int(np.count_nonzero(self.times(lo, hi) < m / self.cells)) if lo < hi else 0)

    def tally(self, m0: int, m1: int) -> np.ndarray:
        """``offset(m)`` for each cut ``m0 .. m1``."""
        counts = np.zeros(m1 - m0, dtype=np.int64)
        lo, hi = self._span(m0, m1)
        for a in range(lo, hi, JITTER_RUN):
            cell = (self.times(a, min(hi, a + JITTER_RUN)) * self.cells).astype(np.int64)
            cell = cell[(cell >= m0) & (cell < m1)]
            counts += np.bincount(cell - m0, minlength=m1 - m0)
        return self.offset(m0) + np.concatenate(([0], np.cumsum(counts)))

    def locate(self, pos: int) -> tuple[int, int]:
        """The last cut ``m`` with ``offset(m) <= pos`` (``0 <= pos < total``) and that offset."""
        # with pos in pile P of the mix=1 order, offset(P * cells) <= pos < offset((P + k + 1) * cells)
        pile = int(np.searchsorted(self.bounds, pos, side="right")) - 1
        m0 = pile * self.cells
        offsets = self.tally(m0, (pile + self.k + 1) * self.cells)
        i = int(np.searchsorted(offsets, pos, side="right")) - 1
        return m0 + i, int(offsets[i])

    def cells_from(self, first: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Positions ``q`` and pile ranks of cells ``first, first + 1, ..`` in the order they are read."""
        live: list[list[Any]] = []  # [t, q, j sorted by t, next unread] of each jitter run in use
        run = self._span(first, first)[0] // JITTER_RUN
        for m in range(first, self.end):
            while run * JITTER_RUN < self._span(m + 1, m + 1)[1]:
                t, j = self._run(run)
                order = _by_time(t)
                t = t[order]
                live.append([t, order + run * JITTER_RUN, j[order], int(np.searchsorted(t, m / self.cells))])
                run += 1
            parts = []
            for item in live:
                t, q, j, at = item
                stop = at + int(np.searchsorted(t[at:], (m + 1) / self.cells))
                if stop > at:
                    parts.append((t[at:stop], q[at:stop], j[at:stop]))
                item[3] = stop
            live = [item for item in live if item[3] < len(item[0])]
            if len(parts) == 1:
                yield parts[0][1], parts[0][2]
            elif parts:
                t, q, j = (np.concatenate(x) for x in zip(*parts, strict=True))
                order = np.argsort(t, kind="stable")  # merges sorted runs; ties keep the earlier run first
                yield q[order], j[order]
            elif run * JITTER_RUN >= self.total and not live:
                return  # every run was read to its end
            else:
                yield _EMPTY, _EMPTY


def _by_time(t: np.ndarray) -> np.ndarray:
    """The order of ``t``, ties (rare, but not impossible in billions of samples) broken by position."""
    order = np.argsort(t)
    s = t[order]
    return order if not (s[1:] == s[:-1]).any() else np.argsort(t, kind="stable")


class EpochOrder:
    """The global order of one epoch.

    Args:
        counts: samples in each pile, in manifest order.
        seed, epoch: what the order is drawn from.
        shuffle: False reads piles and samples in manifest order.
        mix: how many piles' worth of positions each sample may move by (see the module docstring).

    Example:
        order = EpochOrder([3, 2], seed=1, epoch=0)
        piles, index = order.take(0, order.total)
    """

    def __init__(self, counts: Sequence[int], *, seed: int, epoch: int, shuffle: bool = True, mix: int = 1) -> None:
        check_int("mix", mix, low=1, error=ValueError)
        if not shuffle and mix != 1:
            raise ValueError("mix > 1 draws piles at random and needs shuffle=True")
        self.counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        if (self.counts < 0).any():
            raise ValueError("pile counts must not be negative")
        self.seed, self.epoch, self.shuffle, self.mix = seed, epoch, shuffle, mix
        self.total = int(self.counts.sum())
        n = len(self.counts)
        # (one pile or none: its order is the only one, no generator needed)
        self.pile_order = generator(PILE_ORDER, seed, epoch).permutation(n) if shuffle and n > 1 else np.arange(n)
        # the piles read, in order, and where each starts and ends in the mix=1 order
        self._read = self.pile_order[self.counts[self.pile_order] > 0]
        self._bounds = np.concatenate(([0], np.cumsum(self.counts[self._read])))
        self._spread = _Spread(self._bounds, mix, seed, epoch) if mix > 1 and self.total else None

    def in_pile(self, pile: int) -> np.ndarray:
        """The order in which pile ``pile`` is read this epoch (a permutation of its indices)."""
        count = int(self.counts[pile])
        if not self.shuffle or count < 2:
            return np.arange(count)
        return generator(IN_PILE, self.seed, self.epoch, pile).permutation(count)

    def blocks(self, lo: int, hi: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(position, piles, index)`` runs covering global positions ``lo .. hi - 1`` in order."""
        if lo >= hi:
            return
        yield from (self._sequential(lo, hi) if self._spread is None else self._spread_blocks(self._spread, lo, hi))

    def _sequential(self, lo: int, hi: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        bounds = self._bounds
        for j in range(int(np.searchsorted(bounds, lo, side="right")) - 1, len(self._read)):
            if bounds[j] >= hi:
                return
            pile, a, b = int(self._read[j]), max(lo, int(bounds[j])), min(hi, int(bounds[j + 1]))
            perm = self.in_pile(pile)
            for x in range(a, b, MAX_BLOCK):
                y = min(b, x + MAX_BLOCK)
                yield x, np.full(y - x, pile, dtype=np.int64), perm[x - bounds[j] : y - bounds[j]]

    def _spread_blocks(self, spread: _Spread, lo: int, hi: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        first, pos = spread.locate(lo) if lo else (0, 0)
        # the in-pile orders of the piles in use, pile rank r in slot r % slots: a cell holds
        # k + 1 consecutive ranks, and a rank k + 2 back is done before the next one is needed
        slots, width = self.mix + 2, int(self.counts.max())
        perms = np.empty(slots * width, dtype=np.int64)
        held = [-1] * slots
        for m, (q, j) in enumerate(spread.cells_from(first), start=first):
            start, pos = pos, pos + len(q)
            a, z = max(lo, start), min(hi, pos)
            if a < z:
                q, j = q[a - start : z - start], j[a - start : z - start]
                top = m // spread.cells  # the cell lies in [top, top + 1): piles top - k .. top
                for r in range(max(0, top - self.mix), min(top + 1, len(self._read))):
                    if held[r % slots] != r:
                        held[r % slots] = r
                        at = r % slots * width
                        perms[at : at + self.counts[self._read[r]]] = self.in_pile(int(self._read[r]))
                piles, index = self._read[j], perms[j % slots * width + (q - self._bounds[j])]
                for x in range(0, z - a, MAX_BLOCK):
                    yield a + x, piles[x : x + MAX_BLOCK], index[x : x + MAX_BLOCK]
            if pos >= hi:
                return

    def uses(self, lo: int, hi: int) -> list[PileUse]:
        """Piles read at global positions ``lo .. hi - 1``, in load order (by first position).

        Exact for ``mix=1``. With ``mix=k`` the ``j``-th pile read is in use from the cut at
        ``t = j`` to the cut at ``t = j + k + 1`` (see :class:`_Spread`): never more than ``k + 1``
        piles at once, each from about ``sqrt(2 k s)`` positions before its first sample (of
        ``s``) to as many after its last.
        """
        if lo >= hi:
            return []
        bounds, read = self._bounds, self._read
        if self._spread is None:
            j = np.flatnonzero((bounds[:-1] < hi) & (bounds[1:] > lo))
            return [PileUse(int(read[r]), max(lo, int(bounds[r])), min(hi, int(bounds[r + 1])) - 1) for r in j]
        spread, cells = self._spread, self._spread.cells
        m0, m1 = spread.locate(lo)[0], spread.locate(hi - 1)[0] + 1
        offsets = spread.tally(m0, m1)  # cuts outside m0 .. m1 only matter clipped to lo .. hi
        j = np.arange(max(0, m0 // cells - self.mix), min(len(read), -(-m1 // cells)))
        first = np.maximum(offsets[np.clip(j * cells, m0, m1) - m0], lo)
        last = np.minimum(offsets[np.clip((j + self.mix + 1) * cells, m0, m1) - m0], hi) - 1
        return [PileUse(int(read[r]), int(a), int(b)) for r, a, b in zip(j, first, last, strict=True) if a <= b]

    def take(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Piles and in-pile indices of global positions ``lo .. hi - 1`` (materialized)."""
        parts = [(p, i) for _, p, i in self.blocks(lo, hi)]
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate([p for p, _ in parts]), np.concatenate([i for _, i in parts])


def peak(uses: Sequence[PileUse]) -> int:
    """The most uses that share a position: how many piles a reader of ``uses`` holds at once."""
    if not uses:
        return 0
    firsts = np.sort([u.first for u in uses])
    lasts = np.sort([u.last for u in uses])
    # at the first position of each use: uses begun by then minus uses ended before it
    return int((np.searchsorted(firsts, firsts, side="right") - np.searchsorted(lasts, firsts, side="left")).max())


def rank_span(total: int, *, world: int, rank: int, drop_last: bool, batch_size: int | None = None) -> tuple[int, int]:
    """Padded global positions ``[lo, hi)`` of rank ``rank``; every rank gets the same length.

    ``drop_last=True``: each rank gets ``total // world`` positions, and with ``batch_size`` only
    whole batches of those (the remainder of each rank's slice is not read).
    ``drop_last=False``: the order is padded to ``ceil(total / world) * world`` positions by
    wrapping round to its start (as ``DistributedSampler`` does), so a few samples are read twice;
    with ``batch_size`` the last batch of every rank may be partial (the same size on all ranks).
    """
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of size {world}")
    per = total // world if drop_last else -(-total // world)
    lo = rank * per
    if drop_last and batch_size:
        per -= per % batch_size
    return lo, lo + per


def worker_span(lo: int, hi: int, *, workers: int, worker: int, batch_size: int | None = None) -> tuple[int, int]:
    """Worker ``worker``'s contiguous share of ``[lo, hi)``, split on batch boundaries."""
    if workers < 1 or not 0 <= worker < workers:
        raise ValueError(f"worker {worker} is not one of {workers} workers")
    unit = batch_size or 1
    units = -(-(hi - lo) // unit)
    a, b = worker * units // workers, (worker + 1) * units // workers
    return lo + a * unit, min(hi, lo + b * unit)


def slice_span(
    total: int, *, world: int, rank: int, drop_last: bool, batch_size: int | None = None, workers: int = 1, worker: int = 0
) -> tuple[int, int]:
    """Global positions ``[lo, hi)`` one worker of one rank reads: :func:`rank_span`, then :func:`worker_span`."""
    lo, hi = rank_span(total, world=world, rank=rank, drop_last=drop_last, batch_size=batch_size)
    return worker_span(lo, hi, workers=workers, worker=worker, batch_size=batch_size)


class Schedule:
    """What one rank (or one worker of a rank) reads in an epoch: padded positions ``[lo, hi)``.

    Slice positions run from 0 to ``len(schedule) - 1``. Padded positions past the end of the
    epoch wrap round to its start.

    Example:
        sched = Schedule(EpochOrder([5, 4], seed=0, epoch=0), 0, 9)
        uses = sched.uses()
        blocks = list(sched.blocks(start=3))
    """

    def __init__(self, order: EpochOrder, lo: int, hi: int) -> None:
        self.order, self.lo, self.hi = order, lo, hi
        # (slice offset, global lo, global hi) pieces; more than one only where padding wraps
        self.pieces: list[tuple[int, int, int]] = []
        n, at = order.total, lo
        while at < hi and n:
            g = at % n
            size = min(hi - at, n - g)
            self.pieces.append((at - lo, g, g + size))
            at += size

    @classmethod
    def over(cls, order: EpochOrder, ranges: Sequence[tuple[int, int]]) -> Schedule:
        """The schedule that reads the global ranges ``[a, b)`` of ``ranges`` one after the other
        (what is left of an epoch after a change of world size: :mod:`shardkit.loading.elastic`)."""
        sched = cls(order, 0, 0)
        at = 0
        for a, b in ranges:
            if not 0 <= a <= b <= order.total:
                raise ValueError(f"range [{a}, {b}) is not within the epoch's {order.total} positions")
            if a < b:
                sched.pieces.append((at, a, b))
                at += b - a
        sched.hi = at
        return sched

    def __len__(self) -> int:
        return self.hi - self.lo if self.order.total else 0

    def uses(self, start: int = 0) -> list[PileUse]:
        """Pile uses from slice position ``start`` on, in the order the piles must be loaded."""
        out: list[PileUse] = []
        for off, glo, ghi in self.pieces:
            a = max(glo, glo + start - off)
            if a < ghi:
                out.extend(PileUse(u.pile, u.first - glo + off, u.last - glo + off) for u in self.order.uses(a, ghi))
        return out

    def blocks(self, start: int = 0) -> Iterator[Block]:
        """Blocks covering slice positions ``start .. len(self) - 1`` in order."""
        for off, glo, ghi in self.pieces:
            a = max(glo, glo + start - off)
            for pos, piles, index in self.order.blocks(a, ghi):
                yield Block(pos - glo + off, piles, index)

    def take(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Piles and in-pile indices of slice positions ``start .. stop - 1`` (materialized)."""
        piles, index = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for off, glo, ghi in self.pieces:
            a, b = max(glo, glo + start - off), min(ghi, glo + stop - off)
            if a < b:
                p, i = self.order.take(a, b)
                piles.append(p)
                index.append(i)
        return np.concatenate(piles), np.concatenate(index)
