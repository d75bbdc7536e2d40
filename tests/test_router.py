"""The pile router: a pure, seeded function of (seed, unit, ordinal), uniform over piles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from shardkit.piles.router import PileRouter, draws, leaves, resolution, route, split_assignment


@settings(max_examples=60, deadline=None)
@given(piles=st.integers(1, 1000), seed=st.integers(0, 2**63), unit=st.integers(0, 2**40), count=st.integers(0, 9000))
def test_route_is_what_the_router_yields(piles, seed, unit, count):
    router = PileRouter(piles=piles, seed=seed, unit=unit)
    drawn = [router.next() for _ in range(count)]
    assert route(piles=piles, seed=seed, unit=unit, count=count).tolist() == drawn
    assert all(0 <= p < piles for p in drawn)


@pytest.mark.parametrize("piles", [1, 2, 7, 64, 256])
def test_assignment_is_uniform(piles):
    counts = np.bincount(route(piles=piles, seed=12345, unit=0, count=piles * 400), minlength=piles)
    if piles == 1:
        assert counts.tolist() == [400]
    else:
        assert stats.chisquare(counts).pvalue > 1e-4


def test_streams_depend_on_seed_and_unit_and_nothing_else():
    base = route(piles=50, seed=1, unit=2, count=500)
    assert np.array_equal(base, route(piles=50, seed=1, unit=2, count=500))
    assert not np.array_equal(base, route(piles=50, seed=2, unit=2, count=500))
    assert not np.array_equal(base, route(piles=50, seed=1, unit=3, count=500))
    # ordinals are a prefix property: more samples never move the earlier ones
    assert np.array_equal(base[:100], route(piles=50, seed=1, unit=2, count=100))


def test_consecutive_draws_are_independent():
    """Pile of sample k+1 is independent of pile of sample k (a 2-D contingency test)."""
    draws = route(piles=8, seed=7, unit=0, count=40_000)
    table = np.zeros((8, 8), dtype=np.int64)
    np.add.at(table, (draws[:-1], draws[1:]), 1)
    assert stats.chi2_contingency(table).pvalue > 1e-4


def test_split_assignment_is_deterministic_uniform_and_tagged_apart():
    a = split_assignment(parts=4, seed=3, path=(5,), count=4000)
    assert np.array_equal(a, split_assignment(parts=4, seed=3, path=(5,), count=4000))
    assert not np.array_equal(a, split_assignment(parts=4, seed=3, path=(5, 1), count=4000))
    assert set(a.tolist()) == {0, 1, 2, 3}
    assert stats.chisquare(np.bincount(a)).pvalue > 1e-4
    # a split never reuses the routing stream of a unit
    assert not np.array_equal(a[:100], route(piles=4, seed=3, unit=5, count=100))


# --- the leaf draws of piles an append splits ---------------------------------------------------


def test_a_draw_depends_on_the_seed_and_the_key_only():
    keys = [f"k{i}" for i in range(2000)]
    a = draws(7, keys)
    assert a.dtype == np.uint64 and np.array_equal(a, draws(7, keys))
    assert np.array_equal(a[::-1], draws(7, keys[::-1]))  # nothing of a key's neighbours or position
    assert np.array_equal(a[:5], draws(7, [k.encode() for k in keys[:5]]))  # str or its UTF-8 bytes
    assert not np.array_equal(a, draws(8, keys))
    assert stats.chisquare(np.bincount(leaves(a, 16), minlength=16)).pvalue > 1e-4


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**80), keys=st.lists(st.text(min_size=1), min_size=1, max_size=50, unique=True), bits=st.integers(0, 20))
def test_leaves_nest_across_powers_of_two(seed, keys, bits):
    drawn = draws(seed, keys)
    fine = leaves(drawn, 2 ** (bits + 1))
    assert np.array_equal(fine // 2, leaves(drawn, 2**bits))
    # floor(u * k) with u = draw / 2**64, in exact integers rather than by the shift
    assert leaves(drawn, 2**bits).tolist() == [int(h) * 2**bits // 2**64 for h in drawn.tolist()]


def test_resolution_is_the_smallest_power_of_two_that_fits():
    assert [resolution(n, 5) for n in (0, 5, 6, 10, 11, 20, 21, 40, 41)] == [1, 1, 2, 2, 4, 4, 8, 8, 16]
    assert resolution(10**6, None) == 1
    with pytest.raises(ValueError, match="power of two"):
        leaves(np.zeros(3, dtype=np.uint64), 3)
