"""The blend schedule: exact per-source totals, every batch within one sample of its share, purity."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.loading.blend import frames as blend
from shardkit.loading.blend.frames import Frames, apportion, composition, epoch_length, sources, taken_before


def test_apportion_is_exact_and_breaks_ties_to_the_earlier():
    assert apportion([0.7, 0.3], 10) == [7, 3]
    assert apportion([1, 1, 1], 10) == [4, 3, 3]
    assert apportion([0.1, 0.2, 0.7], 1000) == [100, 200, 700]  # no float drift
    assert apportion([3, 0], 5) == [5, 0]
    for bad in ([0, 0], [-1, 2], []):
        with pytest.raises(ValueError):
            apportion(bad, 10)


def test_epoch_length_is_whole_frames_on_every_rank():
    assert epoch_length(1000, world=3, frame=16, drop_last=True) == 960
    assert epoch_length(1000, world=3, frame=16, drop_last=False) == 1008
    assert epoch_length(960, world=3, frame=16, drop_last=False) == 960


@settings(max_examples=150, deadline=None)
@given(
    weights=st.lists(st.integers(0, 50), min_size=1, max_size=7).filter(lambda w: sum(w) > 0),
    frame=st.integers(1, 64),
    frames=st.integers(1, 300),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 5),
)
def test_every_frame_holds_each_share_to_within_one_sample(weights, frame, frames, seed, epoch):
    length = frame * frames
    counts = apportion(weights, length)
    sched = Frames(tuple(counts), frame=frame, seed=seed, epoch=epoch)
    comp = composition(sched, 0, frames)
    target = np.array([Fraction(frame * c, length) for c in counts], dtype=object)
    # within one sample of the target, strictly, in every frame
    assert all(abs(Fraction(int(x)) - t) < 1 for row in comp for x, t in zip(row, target, strict=True))
    assert (comp.sum(axis=1) == frame).all()
    assert comp.sum(axis=0).tolist() == counts  # each source fills exactly its count
    order = sources(sched, 0, length)
    assert np.bincount(order, minlength=len(counts)).tolist() == counts
    # the positions of each frame hold that frame's composition
    per_frame = np.stack([np.bincount(order[f * frame : (f + 1) * frame], minlength=len(counts)) for f in range(frames)])
    assert (per_frame == comp).all()


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.integers(1, 9), min_size=2, max_size=5),
    frame=st.integers(1, 16),
    frames=st.integers(1, 80),
    cuts=st.lists(st.floats(0, 1), min_size=1, max_size=4),
)
def test_any_stretch_is_computed_alone(weights, frame, frames, cuts):
    sched = Frames(tuple(apportion(weights, frame * frames)), frame=frame, seed=5, epoch=2)
    whole = sources(sched, 0, sched.length)
    points = sorted({0, sched.length, *(int(c * sched.length) for c in cuts)})
    pieces = np.concatenate([sources(sched, a, b) for a, b in itertools.pairwise(points)])
    assert (pieces == whole).all()
    for p in points:
        assert taken_before(sched, p).tolist() == np.bincount(whole[:p], minlength=len(weights)).tolist()


def test_pure_in_seed_and_epoch_and_different_across_them(monkeypatch):
    a = Frames((70, 30), frame=10, seed=1, epoch=0)
    assert (sources(a, 0, 100) == sources(Frames((70, 30), frame=10, seed=1, epoch=0), 0, 100)).all()
    assert (sources(a, 0, 100) != sources(Frames((70, 30), frame=10, seed=1, epoch=1), 0, 100)).any()
    assert (sources(a, 0, 100) != sources(Frames((70, 30), frame=10, seed=2, epoch=0), 0, 100)).any()
    # small key runs: stretches crossing runs give the same answer
    monkeypatch.setattr(blend, "KEY_RUN", 25)
    monkeypatch.setattr(blend, "TALLY", 3)
    b = Frames((70, 30), frame=10, seed=1, epoch=0)
    whole = sources(b, 0, 100)
    assert (np.concatenate([sources(b, 0, 37), sources(b, 37, 100)]) == whole).all()
    assert taken_before(b, 73).tolist() == np.bincount(whole[:73], minlength=2).tolist()


def test_extras_spread_over_the_epoch():
    # a source with a fractional share per batch gets its extra samples evenly, not in one run
    sched = Frames(tuple(apportion([1, 1, 1], 3 * 1000)), frame=4, seed=0, epoch=0)
    comp = composition(sched, 0, sched.frames)
    for s in range(3):
        running = np.cumsum(comp[:, s]) - np.arange(1, sched.frames + 1) * 4 / 3
        assert np.abs(running).max() < 4  # a Kronecker sequence: far below the sqrt(F) of a random order


def test_iid_draw_wanders():
    rng = np.random.default_rng(0)
    draw = blend.iid_sources([0.7, 0.3], 256 * 100, rng).reshape(100, 256)
    assert np.abs((draw == 1).sum(axis=1) - 76.8).max() > 5
