"""The blend schedule: which source fills each position of a blended epoch. Pure, no I/O.

A blended epoch has ``L`` positions; source ``s`` fills ``n[s]`` of them. The epoch is cut into
frames of ``B`` positions (the batch size; ``L`` is a multiple of it), and every frame holds
``q[s] = B * n[s] // L`` or ``q[s] + 1`` samples of source ``s``: within one sample of its target
``B * n[s] / L``, in every frame, by construction (not on average). A frame's extras (``r = B -
sum(q)`` of them) go to the sources whose stretch of ``[0, r * F)`` holds one of the points
``U(f) + m * F``, with ``U(f) = (f * g + phase) mod F``: the stretches have the lengths ``e[s] = n[s]
- F * q[s] < F``, so no source gets two extras in a frame, and ``g`` prime to ``F`` makes ``U`` a
permutation of ``0 .. F - 1``, so source ``s`` gets exactly ``e[s]`` extras in the epoch. With
``g / F`` near the golden ratio, any run of frames gets its share of each source's extras
(a Kronecker sequence), so the mixture is tight over longer stretches too.

Which source fills a position depends on ``(seed, epoch, n, B)`` only, never on the data: the
phase and the order of the sources' stretches are drawn from ``(BLEND, seed, epoch, 0)``, and the
positions inside each frame are shuffled by keys drawn per run of frames from ``(BLEND, seed,
epoch, 1 + run)``. Everything is computed for any stretch of positions without the ones before it.

    sched = Frames((700, 300), frame=10, seed=0, epoch=0)
    composition(sched, 0, sched.frames)       # [[7, 3], [7, 3], ...]: every batch exactly 7 / 3
    sources(sched, 0, 20)                     # the source of each of the first 20 positions
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from shardkit.seeds import Stream, stream

# g / F is taken near this (the golden ratio's fractional part): the most even spread of frames
GOLDEN = (math.sqrt(5) - 1) / 2
# positions whose in-frame keys one generator draws (whole frames)
KEY_RUN = 1 << 16
# frames counted at once when the positions before a point are tallied
TALLY = 1 << 20
# U(f) = (f * g + phase) mod F is computed in int64: f * g must stay below 2**63
MAX_FRAMES = 1 << 31


def apportion(shares: Sequence[int | float | Fraction], total: int) -> list[int]:
    """``total`` split in proportion to ``shares`` (largest remainders; ties go to the earlier).

    Exact for integers and floats alike (floats are taken at their exact binary value), so the
    split never depends on rounding. Shares must not be negative and must not all be zero.

        apportion([0.7, 0.3], 10)   # [7, 3]
        apportion([1, 1, 1], 10)    # [4, 3, 3]
    """
    exact = [Fraction(s) for s in shares]
    whole = sum(exact)
    if whole <= 0 or any(s < 0 for s in exact):
        raise ValueError(f"shares must be >= 0 and not all zero, got {list(shares)}")
    ideal = [s * total / whole for s in exact]
    counts = [math.floor(x) for x in ideal]
    left = total - sum(counts)
    by_remainder = sorted(range(len(ideal)), key=lambda i: (-(ideal[i] - counts[i]), i))
    for i in by_remainder[:left]:
        counts[i] += 1
    return counts


def epoch_length(wanted: int, *, world: int, frame: int, drop_last: bool) -> int:
    """Positions an epoch has when ``wanted`` are asked for: whole frames on every rank.

    ``drop_last=True`` rounds down to a multiple of ``world * frame`` (as the plain loader drops
    the end that does not fill a batch on every rank); ``drop_last=False`` rounds up (a blend has
    no end to wrap round to: its sources read on).
    """
    unit = world * frame
    whole = wanted // unit if drop_last else -(-wanted // unit)
    return whole * unit


def spread_step(frames: int) -> int:
    """The step ``g``: prime to ``frames``, ``g / frames`` near :data:`GOLDEN`."""
    g = max(1, round(frames * GOLDEN))
    while math.gcd(g, frames) != 1:
        g += 1
    return g


@dataclass(frozen=True)
class Frames:
    """One epoch's blend schedule: ``counts[s]`` positions of source ``s``, in frames of ``frame``.

    Args:
        counts: positions of each source this epoch; their sum is a multiple of ``frame``.
        frame: positions per frame (the batch size; 1 when unbatched).
        seed, epoch: what the phase, the stretch order and the in-frame orders are drawn from.

    Example:
        sched = Frames((6, 3, 3), frame=4, seed=1, epoch=0)
        composition(sched, 0, 3)   # each row sums to 4 and holds 2, 1, 1
    """

    counts: tuple[int, ...]
    frame: int
    seed: int
    epoch: int
    base: np.ndarray = field(init=False, repr=False)  # q[s]
    extra: np.ndarray = field(init=False, repr=False)  # e[s]
    start: np.ndarray = field(init=False, repr=False)  # where source s's stretch starts
    phase: int = field(init=False)
    step: int = field(init=False)

    def __post_init__(self) -> None:
        counts = np.asarray(self.counts, dtype=np.int64)
        length = int(counts.sum())
        if self.frame < 1 or length % self.frame or (counts < 0).any():
            raise ValueError(f"counts {self.counts} must be >= 0 and sum to a multiple of frame={self.frame}")
        frames = length // self.frame
        if frames >= MAX_FRAMES:
            raise ValueError(f"{frames} frames in one epoch; at most {MAX_FRAMES - 1}")
        base = self.frame * counts // max(length, 1)
        extra = counts - frames * base
        rng = stream(Stream.BLEND, self.seed, self.epoch, 0)
        order = rng.permutation(len(counts))  # the order of the stretches on [0, r * F)
        start = np.zeros(len(counts), dtype=np.int64)
        start[order] = np.concatenate(([0], np.cumsum(extra[order])[:-1]))
        set_ = object.__setattr__
        set_(self, "base", base)
        set_(self, "extra", extra)
        set_(self, "start", start)
        set_(self, "phase", int(rng.integers(max(frames, 1))))
        set_(self, "step", spread_step(max(frames, 1)))

    @property
    def length(self) -> int:
        return int(sum(self.counts))

    @property
    def frames(self) -> int:
        return self.length // self.frame


def composition(sched: Frames, f0: int, f1: int) -> np.ndarray:
    """Samples of each source in frames ``f0 .. f1 - 1``: an ``(f1 - f0, sources)`` int array."""
    count = sched.frames
    f = np.arange(f0, f1, dtype=np.int64)
    u = (f * sched.step + sched.phase) % max(count, 1)
    extra = (u[:, None] - sched.start[None, :]) % max(count, 1) < sched.extra[None, :]
    return sched.base[None, :] + extra


def in_frame_keys(sched: Frames, f0: int, f1: int) -> np.ndarray:
    """Sort keys of the positions of frames ``f0 .. f1 - 1`` (``(f1 - f0, frame)``), drawn per run of frames."""
    per = max(1, KEY_RUN // sched.frame)
    parts = []
    for run in range(f0 // per, -(-f1 // per)):
        a, b = max(f0, run * per), min(f1, (run + 1) * per)
        keys = stream(Stream.BLEND, sched.seed, sched.epoch, 1 + run).random((per, sched.frame))
        parts.append(keys[a - run * per : b - run * per])
    return np.concatenate(parts) if parts else np.zeros((0, sched.frame))


def sources(sched: Frames, lo: int, hi: int) -> np.ndarray:
    """The source of each position ``lo .. hi - 1`` (``0 <= lo <= hi <= length``)."""
    if lo >= hi:
        return np.zeros(0, dtype=np.int64)
    width = sched.frame
    f0, f1 = lo // width, -(-hi // width)
    counts = composition(sched, f0, f1)
    k = counts.shape[1]
    # each frame's sources, grouped, then put in the frame's drawn order
    grouped = np.repeat(np.tile(np.arange(k, dtype=np.int64), f1 - f0), counts.ravel()).reshape(f1 - f0, width)
    order = np.argsort(in_frame_keys(sched, f0, f1), axis=1)
    placed = np.take_along_axis(grouped, order, axis=1).ravel()
    return placed[lo - f0 * width : hi - f0 * width]


def taken_before(sched: Frames, pos: int) -> np.ndarray:
    """How many positions of each source lie before position ``pos``."""
    width = sched.frame
    whole = pos // width
    total = whole * sched.base
    for a in range(0, whole, TALLY):
        total = total + (composition(sched, a, min(whole, a + TALLY)) - sched.base).sum(axis=0)
    tail = sources(sched, whole * width, pos)
    return total + np.bincount(tail, minlength=len(sched.counts))


def iid_sources(weights: Sequence[float], length: int, rng: np.random.Generator) -> np.ndarray:
    """What peers do (litdata, ``interleave_datasets``, WebDataset ``RandomMix``): each position's
    source drawn independently with probabilities ``weights``. For comparison only."""
    p = np.asarray(weights, dtype=np.float64)
    return rng.choice(len(p), size=length, p=p / p.sum())
