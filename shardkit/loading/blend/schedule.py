"""What one rank (or worker) reads of a blend epoch: global ranges of positions, as blocks and pile uses.

A global position ``p`` of a blend epoch holds source ``s = sources(frames, p)`` and, in that
source's endless stream, position ``start[s] + (positions of s before p)``; the stream position
names a pile and an index in it through the source's own epoch plan. A rank's share is a few
global ranges (one, unless the epoch was resumed on another split: :mod:`shardkit.loading.elastic`),
read one after the other; positions past the epoch's last frame repeat the frames' pattern.

    sched = BlendSchedule(source, frames, start, [(0, 512)], options)
    uses, blocks = sched.uses(), list(sched.blocks())
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from shardkit.loading import plan
from shardkit.loading.blend.frames import Frames, composition, sources, taken_before
from shardkit.loading.blend.source import BlendedSource
from shardkit.loading.elastic import Range
from shardkit.loading.options import LoaderOptions

# blocks are cells of about this many positions (whole batches); a pile's use is tracked to the
# cells it is read in, so it may be loaded up to a cell early and released up to a cell late
CELL = 4096


class BlendSchedule:
    """The global ``ranges`` of a blend epoch with schedule ``frames``, each source's stream
    starting at ``start[s]``, read one after the other (slice positions ``0 .. len - 1``).

    Example:
        sched = BlendSchedule(source, frames, np.zeros(2, np.int64), [(0, 512)], opts)
        uses, blocks = sched.uses(), list(sched.blocks())
    """

    def __init__(self, source: BlendedSource, frames: Frames, start: np.ndarray, ranges: Sequence[Range], options: LoaderOptions) -> None:
        self.source, self.frames, self.start, self.options = source, frames, start, options
        self.pieces: list[tuple[int, int, int]] = []  # (slice offset, global lo, global hi)
        at = 0
        for a, b in ranges:
            if a < b:
                self.pieces.append((at, a, b))
                at += b - a
        self._length = at
        self._offsets = source.offsets
        self._orders: dict[tuple[int, int], plan.EpochOrder] = {}

    def __len__(self) -> int:
        return self._length

    def stream_at(self, pos: int) -> np.ndarray:
        """Each source's stream position at global position ``pos`` of this epoch."""
        return self.start + taken_before(self.frames, pos)

    def global_at(self, position: int) -> int:
        """The global position of slice position ``position`` (the end of the last range at the end)."""
        for off, lo, hi in self.pieces:
            if position < off + hi - lo:
                return lo + position - off
        return self.pieces[-1][2] if self.pieces else 0

    def _order(self, s: int, cycle: int) -> plan.EpochOrder:
        key = (s, cycle)
        if key not in self._orders:
            if len(self._orders) > 2 * len(self.source.parts):
                self._orders.pop(next(iter(self._orders)))
            o = self.options
            self._orders[key] = plan.EpochOrder(self.source.parts[s].counts, seed=o.seed, epoch=cycle, shuffle=o.shuffle, mix=o.mix)
        return self._orders[key]

    def _cycles(self, s: int, p0: int, p1: int) -> Iterator[tuple[int, int, int]]:
        """``(source epoch, first, end)`` pieces of stream positions ``p0 .. p1 - 1`` of source ``s``."""
        n = self.source.parts[s].samples
        if p1 <= p0:  # nothing to read: an empty source given a zero share has no cycles to count
            return
        for cycle in range(p0 // n, -(-p1 // n)):
            yield cycle, max(p0, cycle * n) - cycle * n, min(p1, (cycle + 1) * n) - cycle * n

    def _stream(self, s: int, p0: int, p1: int) -> tuple[np.ndarray, np.ndarray]:
        n = self.source.parts[s].samples
        if 0 < n < p1 - p0 and (n == 1 or not self.options.shuffle):  # every cycle of the source is read in one order
            first = self._order(s, 0).take(0, n)
            at = np.arange(p0, p1) % n
            return first[0][at] + self._offsets[s], first[1][at]
        piles, index = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for cycle, a, b in self._cycles(s, p0, p1):
            p, i = self._order(s, cycle).take(a, b)
            piles.append(p + self._offsets[s])
            index.append(i)
        return np.concatenate(piles), np.concatenate(index)

    def _chunks(self, a: int, b: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(global position, piles, index)`` runs covering global positions ``a .. b - 1``."""
        at = self.stream_at(a)
        # one block a cell, as the uses count them: the piles a block needs are in use together
        for x in range(a, b, self._cell()):
            y = min(b, x + self._cell())
            src = sources(self.frames, x, y)
            piles, index = np.empty(y - x, np.int64), np.empty(y - x, np.int64)
            for s in range(len(self.source.parts)):
                mask = src == s
                count = int(np.count_nonzero(mask))
                if count:
                    piles[mask], index[mask] = self._stream(s, int(at[s]), int(at[s]) + count)
                    at[s] += count
            yield x, piles, index

    def _from(self, start: int, stop: int | None = None) -> Iterator[tuple[int, int, int]]:
        """``(slice offset of a, a, b)``: the global pieces of slice positions ``start .. stop - 1``."""
        stop = self._length if stop is None else stop
        for off, lo, hi in self.pieces:
            a, b = max(lo, lo + start - off), min(hi, lo + stop - off)
            if a < b:
                yield off + a - lo, a, b

    def blocks(self, start: int = 0) -> Iterator[plan.Block]:
        """Blocks covering slice positions ``start .. len(self) - 1`` in order."""
        for off, a, b in self._from(start):
            for x, piles, index in self._chunks(a, b):
                yield plan.Block(off + x - a, piles, index)

    def take(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Piles and in-pile indices of slice positions ``start .. stop - 1`` (materialized)."""
        parts = [(p, i) for _, a, b in self._from(start, stop) for _, p, i in self._chunks(a, b)]
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate([p for p, _ in parts]), np.concatenate([i for _, i in parts])

    def _cell(self) -> int:
        """Positions per cell: whole frames, about :data:`CELL`."""
        return max(1, CELL // self.frames.frame) * self.frames.frame

    def _cell_counts(self, a: int, b: int) -> tuple[int, np.ndarray]:
        """Cell size and, per cell from global position ``a`` (on a frame boundary) to ``b``, the running count of each source."""
        width = self.frames.frame
        per = self._cell() // width
        f0, f1 = a // width, -(-b // width)
        rows = []
        for x in range(f0, f1, per * 256):
            y = min(f1, x + per * 256)
            comp = composition(self.frames, x, y)
            rows.append(np.add.reduceat(comp, np.arange(0, y - x, per), axis=0))
        counts = np.concatenate(rows) if rows else np.zeros((0, len(self.source.parts)), np.int64)
        return per * width, np.cumsum(counts, axis=0)

    def uses(self, start: int = 0) -> list[plan.PileUse]:
        """Pile uses from slice position ``start`` on, in load order; bounds rounded out to cells."""
        found = [use for off, a, b in self._from(start) for use in self._piece_uses(off, a, b)]
        return _merged(sorted(found, key=lambda u: (u.first, u.pile)))

    def _piece_uses(self, off: int, a: int, b: int) -> list[plan.PileUse]:
        """Pile uses of global positions ``a .. b - 1``, which start at slice position ``off``."""
        # cells count from the frame boundary at or before a (after a change of batch size a
        # piece may start inside a frame); a use is rounded out to whole cells, then clipped
        g = a // self.frames.frame * self.frames.frame
        size, running = self._cell_counts(g, b)
        origin, at, end = self.stream_at(g), self.stream_at(a), self.stream_at(b)
        shift = off + g - a  # slice position of global position g
        found: list[plan.PileUse] = []
        for s in range(len(self.source.parts)):
            n = self.source.parts[s].samples
            if _every_cell_cycles(running[:, s], n) and at[s] < end[s]:
                # a source read whole in every cell: (nearly) each of its piles is in use in every cell
                # of the piece anyway, and all of them hold no more than a cell's worth; one use each, not
                # one a pile a cycle (a 1-sample source at half a 10^6 epoch counts half a million cycles)
                piles = np.flatnonzero(np.asarray(self.source.parts[s].counts) > 0) + self._offsets[s]
                found.extend(plan.PileUse(int(p), off, off + b - a - 1) for p in piles)
                continue
            for cycle, x, y in self._cycles(s, int(at[s]), int(end[s])):
                for use in self._order(s, cycle).uses(x, y):
                    # stream offsets from g -> the cells holding them -> slice positions
                    k = np.array([use.first, use.last]) + cycle * n - int(origin[s])
                    cell = np.searchsorted(running[:, s], k, side="right")
                    first = max(off, shift + int(cell[0]) * size)
                    last = min(off + b - a - 1, shift + (int(cell[1]) + 1) * size - 1)
                    found.append(plan.PileUse(use.pile + self._offsets[s], first, last))
        return found


def _every_cell_cycles(running: np.ndarray, n: int) -> bool:
    """Whether a source of ``n`` samples, taken ``running`` times up to the end of each cell, is read
    whole in every cell but the last: twice, and every one of its piles is used in each of them; once,
    and the piles not used in a cell (the end of one cycle's order and the start of the next leave
    some out) hold less than the cell reads of it."""
    if n <= 0 or len(running) < 3:
        return False
    return bool(np.diff(running[:-1], prepend=0).min() >= n)


def _merged(uses: Sequence[plan.PileUse]) -> list[plan.PileUse]:
    """``uses`` with overlapping uses of one pile (a pile ending one source epoch and starting the next) made one."""
    out: list[plan.PileUse] = []
    open_: dict[int, int] = {}  # pile -> its latest use in out
    for u in uses:
        j = open_.get(u.pile)
        if j is not None and out[j].last >= u.first:
            out[j] = plan.PileUse(u.pile, out[j].first, max(out[j].last, u.last))
            continue
        open_[u.pile] = len(out)
        out.append(u)
    return out
