"""The pile router: which pile each sample goes to, a pure function of (seed, generation, unit, ordinal).

The choice never looks at the data, which is what makes pass 1 of the two-pass shuffle exact.
Draws come in blocks from a generator seeded by ``(seed, unit)``, so the pile of the k-th sample
of unit u is the same whichever process handles u, and output does not depend on worker count.
An append (generation g > 0) draws from ``(seed, g, unit)``: its samples land in piles
independent of every earlier generation's.

    router = PileRouter(piles=64, seed=0, unit=3)
    pile = router.next()  # the pile of sample 0 of unit 3
"""

from __future__ import annotations

import math

import numpy as np

from shardkit.seeds import Stream, stream

_BLOCK = 4096


class PileRouter:
    """Stream of uniformly drawn pile indices for the samples of one input unit."""

    __slots__ = ("_block", "_pos", "_rng", "piles")

    def __init__(self, *, piles: int, seed: int, unit: int = 0, generation: int = 0) -> None:
        self.piles = piles
        self._rng = _stream(seed, generation, unit)
        self._block: list[int] = []
        self._pos = 0

    def next(self) -> int:
        if self._pos == len(self._block):
            self._block = self._rng.integers(0, self.piles, size=_BLOCK).tolist()
            self._pos = 0
        pile = self._block[self._pos]
        self._pos += 1
        return pile


def _stream(seed: int, generation: int, unit: int) -> np.random.Generator:
    return stream(Stream.ROUTE, seed, unit) if generation == 0 else stream(Stream.APPEND, seed, generation, unit)


def route(*, piles: int, seed: int, unit: int, count: int, generation: int = 0) -> np.ndarray:
    """The piles of samples ``0..count-1`` of ``unit``: the same values ``PileRouter`` yields."""
    rng = _stream(seed, generation, unit)
    blocks = [rng.integers(0, piles, size=_BLOCK) for _ in range(-(-count // _BLOCK))]
    return np.concatenate(blocks)[:count] if blocks else np.zeros(0, dtype=np.int64)


def split_assignment(*, parts: int, seed: int, path: tuple[int, ...], count: int) -> np.ndarray:
    """Random sub-pile for each of ``count`` samples of an oversized pile (data-blind too).

    ``path`` names the pile being split: ``(pile,)``, or ``(pile, part, ...)`` for a sub-pile
    that is split again.
    """
    return stream(Stream.SPLIT, seed, len(path), *path).integers(0, parts, size=count)


def sub_piles(count: int, *, capacity: int, seed: int, trail: tuple[int, ...]) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """How an oversized pile of ``count`` samples is split: random sub-piles of at most ``capacity``.

    A pile over ``capacity`` goes into ``ceil(count / capacity)`` parts drawn by
    :func:`split_assignment`, each part split again the same way if still over. Returns the final
    sub-piles in name order, each as its trail (``(pile, part, ...)``) and the indices of its
    samples in the pile, in pile order. Depends on counts and seeds only, never on the samples.
    """
    if count <= capacity:
        return [(trail, np.arange(count))]
    parts = math.ceil(count / capacity)
    assignment = split_assignment(parts=parts, seed=seed, path=trail, count=count)
    leaves = []
    for part in range(parts):
        chosen = np.flatnonzero(assignment == part)
        if len(chosen):
            leaves += [(leaf, chosen[inner]) for leaf, inner in sub_piles(len(chosen), capacity=capacity, seed=seed, trail=(*trail, part))]
    return leaves
