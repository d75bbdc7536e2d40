"""The pile router: a pure, seeded function of (seed, unit, ordinal), uniform over piles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from shardkit.piles.router import PileRouter, route, split_assignment


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
