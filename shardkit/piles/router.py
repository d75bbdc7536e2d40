"""The pile router: which pile each sample goes to, a pure function of (seed, generation, unit, ordinal).

The choice never looks at the data, which is what makes pass 1 of the two-pass shuffle exact.
A pile that an append grows past its limit is split by a second draw, one per sample, keyed
by the sample's key (:func:`draws`, :func:`leaves`, :func:`resolution`).
Draws come in blocks from a generator seeded by ``(seed, unit)``, so the pile of the k-th sample
of unit u is the same whichever process handles u, and output does not depend on worker count.
An append (generation g > 0) draws from ``(seed, g, unit)``: its samples land in piles
independent of every earlier generation's.

    router = PileRouter(piles=64, seed=0, unit=3)
    pile = router.next()  # the pile of sample 0 of unit 3
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

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


# the blake2b personalisation of the leaf draws: no other hash shardkit makes can equal one
_LEAF_PERSON = b"shardkit.leaf"


def draws(seed: int, keys: Iterable[str | bytes]) -> np.ndarray:
    """Each key's draw ``u``, scaled to 64 bits: ``u = draws(...)[i] / 2**64`` is in [0, 1).

    A keyed hash (blake2b, keyed by a digest of ``seed``) of the key's UTF-8 bytes, so a sample
    keeps its draw in every generation, whichever file holds it, and nothing but ``seed`` and the
    key decides it. Keys are unique in a dataset, so as ``seed`` varies the draws of its samples
    act as independent uniforms, independent of the piles the router drew for them too.
    """
    secret = hashlib.blake2b(str(seed).encode(), digest_size=32, person=_LEAF_PERSON).digest()
    found = [
        int.from_bytes(
            hashlib.blake2b(k.encode("utf-8", "surrogateescape") if isinstance(k, str) else k, digest_size=8, key=secret).digest(), "little"
        )
        for k in keys
    ]
    return np.array(found, dtype=np.uint64)


def leaves(drawn: np.ndarray, resolution: int) -> np.ndarray:
    """The leaf ``floor(u * resolution)`` of each draw: the top bits of the 64-bit draw.

    Leaves nest: at twice the resolution, leaf j splits into leaves 2j and 2j+1, so a file of
    one leaf at resolution r holds whole leaves of every coarser resolution.

    Raises:
        ValueError: ``resolution`` is not a power of two (a programming error).
    """
    bits = resolution.bit_length() - 1
    if resolution < 1 or resolution != 1 << bits or bits > 64:
        raise ValueError(f"resolution must be a power of two from 1 to 2**64, got {resolution}")
    if bits == 0:  # numpy shifts by 64 bits are undefined
        return np.zeros(len(drawn), dtype=np.int64)
    return (np.asarray(drawn, dtype=np.uint64) >> np.uint64(64 - bits)).astype(np.int64)


def resolution(count: int, capacity: int | None) -> int:
    """Leaves a pile of ``count`` samples is split into: the smallest power of two k with
    ``count <= k * capacity`` (1 without a capacity).

    Why the first epoch stays exactly uniform: the loader permutes piles uniformly and shuffles
    each, so it is enough that the law of the partition of samples into piles is exchangeable.
    Each sample's pile (the router) and draw u (:func:`draws`) are independent uniforms; a pile's
    k depends on counts only, and a sample's leaf on its own u, so relabelling the samples leaves
    the law of the partition as it was. A rule that looked at which samples came when (split
    only the new ones, or decide by the history of counts) would not have this symmetry.
    """
    if capacity is None or count <= capacity:
        return 1
    return 1 << (math.ceil(count / capacity) - 1).bit_length()
