"""Random streams never coincide across purposes, keys or path lengths."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from shardkit import seeds as _seeds
from shardkit.loading import plan
from shardkit.piles import router
from shardkit.seeds import Stream


def _draws(rng: np.random.Generator) -> list[int]:
    return rng.integers(0, 2**62, size=4).tolist()


def test_router_and_plan_streams_differ_for_the_seed_pairs_that_used_to_collide():
    # formerly: writer seed 1 on unit 7 drew the same numbers as the pile order for seed 7, epoch 0
    routed = router.route(piles=1000, seed=1, unit=7, count=50)
    order = plan.EpochOrder([1] * 1000, seed=7, epoch=0).pile_order
    assert not np.array_equal(routed, order[:50])
    assert _draws(_seeds.stream(Stream.ROUTE, 1, 7)) != _draws(_seeds.stream(Stream.PILE_ORDER, 7, 0))


def test_every_tag_gives_a_distinct_stream_for_the_same_values():
    values = {tag: (3, 1, 4, 1)[: _seeds._ARITY[tag]] for tag in _seeds._ARITY}
    draws = [tuple(_draws(_seeds.stream(tag, *vals))) for tag, vals in values.items()]
    assert len(set(draws)) == len(draws)


def test_split_streams_of_a_pile_and_of_its_first_sub_pile_differ():
    # (seed, 5) and (seed, 5, 0) would be one stream to SeedSequence without the depth
    a = router.split_assignment(parts=1000, seed=2, path=(5,), count=20)
    b = router.split_assignment(parts=1000, seed=2, path=(5, 0), count=20)
    assert not np.array_equal(a, b)


@pytest.mark.parametrize(("tag", "values"), [(Stream.ROUTE, (1,)), (Stream.IN_PILE, (1, 2)), (Stream.SPLIT, (1, 2, 3))])
def test_a_wrong_number_of_values_is_refused(tag, values):
    with pytest.raises(ValueError, match="take"):
        _seeds.stream(tag, *values)


def test_tags_are_unique():
    assert len({int(t) for t in Stream}) == len(Stream)
    assert all(a != b for a, b in itertools.combinations([int(t) for t in Stream], 2))
