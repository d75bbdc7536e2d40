"""The epoch plan: which sample of which pile comes at each position of an epoch. Pure, no I/O.

The global order of an epoch is a function of ``(seed, epoch, pile counts, shuffle, mix)`` only:

* the pile order is a permutation drawn from the stream ``(PILE_ORDER, seed, epoch)``;
* pile ``p`` is read in the order of a permutation drawn from ``(IN_PILE, seed, epoch, p)``
  (streams: :mod:`shardkit._seeds`);
* with ``mix=1`` the piles follow each other; with ``mix=k`` a window holds ``k`` piles, the next
  sample comes from a window pile chosen with probability proportional to what is left in it, and
  when a pile runs out the next pile in pile order enters. Given the pile sizes, the pile contents
  of a pass-1 dataset are a uniformly random partition, and neither schedule looks at the samples,
  so the first epoch is an exactly uniform permutation either way.
* ``shuffle=False`` reads piles and samples in manifest order.

The order has ``N = sum(counts)`` positions and is never materialized: ranks take contiguous
slices (:func:`rank_span`), workers contiguous sub-slices of those (:func:`worker_span`), and a
:class:`Schedule` hands its slice out as blocks of ``(pile ids, in-pile indices)`` together with
the pile uses (which pile, from when, until when) a loader needs to load and release piles.

    order = EpochOrder([120, 80, 100], seed=0, epoch=3, mix=2)
    sched = Schedule(order, *rank_span(order.total, world=2, rank=1, drop_last=True))
    for block in sched.blocks(start=10): ...
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from shardkit._seeds import Stream, stream

PILE_ORDER, IN_PILE, MIX, CHUNK = Stream.PILE_ORDER, Stream.IN_PILE, Stream.MIX, Stream.CHUNK
# longest block handed out at once, so a huge pile never costs a huge index array
MAX_BLOCK = 1 << 16


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


@dataclass(slots=True)
class _Segment:
    """A run of the global order drawn from the piles of one window.

    ``comp[j]`` samples come from ``piles[j]``, continuing after the ``used[j]`` it gave before;
    ``labels`` (window slot per position) is drawn lazily from ``(CHUNK, seed, epoch, event,
    chunk)`` so that skipping a segment costs nothing.
    """

    pos: int
    length: int
    piles: np.ndarray
    used: np.ndarray
    comp: np.ndarray
    event: int
    chunk: int
    labels: np.ndarray | None = None


def _chunk_size(remaining: int) -> int:
    # balances the per-chunk draw (a few microseconds) against the labels drawn for the chunk
    # in which a pile runs out
    return min(remaining, max(1024, 32 * math.isqrt(remaining)))


class EpochOrder:
    """The global order of one epoch.

    Args:
        counts: samples in each pile, in manifest order.
        seed, epoch: what the order is drawn from.
        shuffle: False reads piles and samples in manifest order.
        mix: number of piles drawn from at once (see the module docstring).

    Example:
        order = EpochOrder([3, 2], seed=1, epoch=0)
        piles, index = order.take(0, order.total)
    """

    def __init__(self, counts: Sequence[int], *, seed: int, epoch: int, shuffle: bool = True, mix: int = 1) -> None:
        if mix < 1:
            raise ValueError(f"mix must be at least 1, got {mix}")
        if not shuffle and mix != 1:
            raise ValueError("mix > 1 draws piles at random and needs shuffle=True")
        self.counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        if (self.counts < 0).any():
            raise ValueError("pile counts must not be negative")
        self.seed, self.epoch, self.shuffle, self.mix = seed, epoch, shuffle, mix
        self.total = int(self.counts.sum())
        n = len(self.counts)
        self.pile_order = generator(PILE_ORDER, seed, epoch).permutation(n) if shuffle else np.arange(n)

    def in_pile(self, pile: int) -> np.ndarray:
        """The order in which pile ``pile`` is read this epoch (a permutation of its indices)."""
        count = int(self.counts[pile])
        if not self.shuffle or count < 2:
            return np.arange(count)
        return generator(IN_PILE, self.seed, self.epoch, pile).permutation(count)

    def _segments(self) -> Iterator[_Segment]:
        order = [p for p in self.pile_order.tolist() if self.counts[p] > 0]
        window: list[int] = []
        used: list[int] = []
        nxt = pos = event = 0
        while True:
            while len(window) < self.mix and nxt < len(order):
                window.append(order[nxt])
                used.append(0)
                nxt += 1
            if not window:
                return
            left = [int(self.counts[p]) - u for p, u in zip(window, used, strict=True)]
            for seg in self._event(window, used, left, pos, event):
                yield seg
                pos += seg.length
                used = [u + int(c) for u, c in zip(used, seg.comp, strict=True)]
            done = [j for j, p in enumerate(window) if used[j] == self.counts[p]]
            assert len(done) == 1, "each event ends with exactly one pile running out"
            del window[done[0]], used[done[0]]
            event += 1

    def _event(self, window: list[int], used: list[int], left: list[int], pos: int, event: int) -> Iterator[_Segment]:
        """Segments until the first window pile runs out (the last one ends exactly there)."""
        piles, start = np.array(window), np.array(used, dtype=np.int64)
        if len(window) == 1:
            yield _Segment(pos, left[0], piles, start, np.array(left, dtype=np.int64), event, 0)
            return
        rng: np.random.Generator | None = None
        remaining = np.array(left, dtype=np.int64)
        chunk = 0
        while True:
            total = int(remaining.sum())
            size = _chunk_size(total)
            if size == total:
                comp = remaining.copy()  # the whole rest: nothing to draw
            else:
                rng = rng or generator(MIX, self.seed, self.epoch, event)
                comp = rng.multivariate_hypergeometric(remaining, size)
            seg = _Segment(pos, size, piles, start.copy(), comp, event, chunk)
            if (comp == remaining).any():
                # a pile runs out inside this chunk: cut just after its last sample
                labels = self._labels(seg)
                cut = 1 + min(int(np.flatnonzero(labels == j)[-1]) for j in np.flatnonzero(comp == remaining))
                seg.labels = labels[:cut]
                seg.length = cut
                seg.comp = np.bincount(seg.labels, minlength=len(window)).astype(np.int64)
                yield seg
                return
            yield seg
            remaining -= comp
            start += comp
            pos += size
            chunk += 1

    def _labels(self, seg: _Segment) -> np.ndarray:
        if seg.labels is None and len(seg.piles) == 1:
            return np.zeros(seg.length, dtype=np.int64)
        if seg.labels is None:
            slots = np.repeat(np.arange(len(seg.piles)), seg.comp)
            seg.labels = generator(CHUNK, self.seed, self.epoch, seg.event, seg.chunk).permutation(slots)
        return seg.labels

    def blocks(self, lo: int, hi: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(position, piles, index)`` runs covering global positions ``lo .. hi - 1`` in order."""
        if lo >= hi:
            return
        cache: dict[int, np.ndarray] = {}
        for seg in self._segments():
            end = seg.pos + seg.length
            if end <= lo:
                continue
            if seg.pos >= hi:
                return
            a, b = max(lo, seg.pos), min(hi, end)
            for p in seg.piles.tolist():
                if p not in cache:
                    cache[p] = self.in_pile(p)
            if len(seg.piles) == 1:
                p, base = int(seg.piles[0]), int(seg.used[0]) - seg.pos
                for x in range(a, b, MAX_BLOCK):
                    y = min(b, x + MAX_BLOCK)
                    yield x, np.full(y - x, p, dtype=np.int64), cache[p][base + x : base + y]
            else:
                yield a, *self._resolve(seg, cache, a - seg.pos, b - seg.pos)
            for j, p in enumerate(seg.piles.tolist()):
                if seg.used[j] + seg.comp[j] == self.counts[p]:
                    cache.pop(p, None)

    def _resolve(self, seg: _Segment, cache: dict[int, np.ndarray], a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        labels = self._labels(seg)
        index = np.empty(seg.length, dtype=np.int64)
        for j, p in enumerate(seg.piles.tolist()):
            at = np.flatnonzero(labels == j)
            index[at] = cache[p][seg.used[j] : seg.used[j] + len(at)]
        return seg.piles[labels[a:b]], index[a:b]

    def uses(self, lo: int, hi: int) -> list[PileUse]:
        """Piles read at global positions ``lo .. hi - 1``, in load order (by first position).

        ``first``/``last`` are exact for ``mix=1``; with ``mix > 1`` they may widen to the
        chunk that holds the first or last sample of a pile (never more than ``mix`` at once).
        """
        spans: dict[int, list[int]] = {}
        for seg in self._segments() if lo < hi else ():
            end = seg.pos + seg.length
            if end <= lo:
                continue
            if seg.pos >= hi:
                break
            a, b = max(lo, seg.pos), min(hi, end)
            partial = (a, b) != (seg.pos, end)
            if partial and len(seg.piles) > 1:
                present = np.unique(seg.piles[self._labels(seg)[a - seg.pos : b - seg.pos]])
            else:
                present = seg.piles[seg.comp > 0]
            for p in present.tolist():
                span = spans.setdefault(p, [a, b - 1])
                span[1] = b - 1
        uses = [PileUse(p, first, last) for p, (first, last) in spans.items()]
        return sorted(uses, key=lambda u: (u.first, u.last))

    def take(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Piles and in-pile indices of global positions ``lo .. hi - 1`` (materialized)."""
        parts = [(p, i) for _, p, i in self.blocks(lo, hi)]
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate([p for p, _ in parts]), np.concatenate([i for _, i in parts])


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


def schedule(
    counts: Sequence[int],
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    mix: int = 1,
    world: int = 1,
    rank: int = 0,
    drop_last: bool = True,
    batch_size: int | None = None,
    workers: int = 1,
    worker: int = 0,
) -> Schedule:
    """The :class:`Schedule` of one rank and worker: the plan in one call."""
    order = EpochOrder(counts, seed=seed, epoch=epoch, shuffle=shuffle, mix=mix)
    lo, hi = rank_span(order.total, world=world, rank=rank, drop_last=drop_last, batch_size=batch_size)
    lo, hi = worker_span(lo, hi, workers=workers, worker=worker, batch_size=batch_size)
    return Schedule(order, lo, hi)
