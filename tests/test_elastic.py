"""Resume across world sizes: what is left of an epoch, split among other ranks, exactly once."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardkit
from shardkit.errors import ConfigError
from shardkit.loading import elastic
from shardkit.loading.elastic import Phase
from shardkit.loading.plan import EpochOrder, Schedule, slice_span
from tests.conftest import make_samples

N = 300  # samples in the `piles` fixture


def positions(ranges) -> list[int]:
    return [p for a, b in ranges for p in range(a, b)]


def check_reads(counts: collections.Counter, total: int, *, drop_last: bool, padding: int, dropped: int) -> None:
    """Every position read once; ``drop_last=False`` may read up to ``padding`` extra times, ``True`` leave ``dropped`` unread."""
    assert set(counts) <= set(range(total))
    extra = sum(c - 1 for c in counts.values())
    unread = total - len(counts)
    if drop_last:
        assert extra == 0, "no sample is read twice"
        assert unread <= dropped
    else:
        assert unread == 0, "every sample is read"
        assert extra <= padding


phase_spec = st.tuples(
    st.integers(1, 7), st.sampled_from([None, 1, 3, 4]), st.integers(1, 3), st.lists(st.floats(0, 1), min_size=3, max_size=3)
)


@settings(max_examples=300, deadline=None)
@given(total=st.integers(0, 250), drop_last=st.booleans(), specs=st.lists(phase_spec, min_size=1, max_size=5))
def test_phases_read_every_position_once(total, drop_last, specs):
    rest, counts, padding, done = elastic.whole(total), collections.Counter(), 0, []
    for i, (world, batch, workers, fractions) in enumerate(specs):
        last = i == len(specs) - 1
        sizes = elastic.worker_lengths(rest, world=world, drop_last=drop_last, batch_size=batch, workers=workers)
        read = []
        for size, f in zip(sizes, fractions, strict=False):
            n = size if last else min(size, int(f * size) // (batch or 1) * (batch or 1))
            read.append(n)
        shares = [
            [
                elastic.share(rest, world=world, rank=r, drop_last=drop_last, batch_size=batch, workers=workers, worker=w)
                for w in range(workers)
            ]
            for r in range(world)
        ]
        lengths = {tuple(elastic.length(s) for s in rank) for rank in shares}
        assert lengths == {tuple(sizes)}, "every rank's workers read equal shares"
        for rank in shares:
            for w, ranges in enumerate(rank):
                counts.update(positions(ranges)[: read[w]])
        padding += world - 1
        phase = Phase(world, batch, tuple(read))
        elastic.check_phase(rest, phase, drop_last=drop_last)
        if not last:
            rest = elastic.after(rest, phase, drop_last=drop_last)
            assert len(rest) <= 1 + sum(s[0] * s[2] for s in specs[: i + 1]), "the ranges left grow by at most one per reader"
            done.append(phase)
            assert elastic.remaining(total, done, drop_last=drop_last) == rest
    world, batch = specs[-1][0], specs[-1][1] or 1
    check_reads(counts, total, drop_last=drop_last, padding=padding, dropped=world * batch + world)


def test_remaining_composes_and_is_pure():
    done = [Phase(4, 8, (16,)), Phase(3, None, (5,)), Phase(6, 2, (2, 0))]
    rest = elastic.whole(500)
    for phase in done:
        rest = elastic.after(rest, phase, drop_last=True)
    assert elastic.remaining(500, done, drop_last=True) == rest == elastic.remaining(500, done, drop_last=True)
    assert elastic.length(rest) == 500 - 4 * 16 - 3 * 5 - 6 * 2


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("mix", [1, 2])
def test_one_phase_is_the_plain_plan(drop_last, mix):
    order = EpochOrder([13, 0, 9, 21, 5], seed=4, epoch=1, mix=mix)
    for world, workers, batch in [(1, 1, None), (3, 2, 4), (4, 3, 5), (7, 1, None)]:
        for rank in range(world):
            for w in range(workers):
                span = slice_span(order.total, world=world, rank=rank, drop_last=drop_last, batch_size=batch, workers=workers, worker=w)
                ranges = elastic.share(
                    elastic.whole(order.total), world=world, rank=rank, drop_last=drop_last, batch_size=batch, workers=workers, worker=w
                )
                plain, over = Schedule(order, *span), Schedule.over(order, ranges)
                assert len(plain) == len(over)
                assert [x.tolist() for x in plain.take(0, len(plain))] == [x.tolist() for x in over.take(0, len(over))]


def test_a_phase_that_cannot_be_is_refused():
    rest = elastic.whole(100)
    with pytest.raises(ValueError, match=r"read\[0\]: expected an integer between 0 and 25"):
        elastic.check_phase(rest, Phase(4, None, (26,)), drop_last=True)
    with pytest.raises(ValueError, match=r"read\[1\]: 3 is not on a batch boundary \(batch_size=4\)"):
        elastic.check_phase(rest, Phase(2, 4, (4, 3)), drop_last=True)
    with pytest.raises(ValueError, match=r"done\[1\]: read\[0\]"):
        elastic.remaining(100, [Phase(2, None, (10,)), Phase(2, None, (41,))], drop_last=True)


# -- through the real loader ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def piles(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("elastic") / "ds")
    samples = make_samples(N)
    shardkit.preprocess([samples[i : i + 50] for i in range(0, N, 50)], lambda u: u, out, piles=7, quiet=True)
    return out


def flat(item) -> list[str]:
    k = item["__key__"]
    return list(k) if isinstance(k, list) else [k]


def run_phases(piles, specs, *, drop_last, mix, epoch=1):
    """Read ``epoch`` in phases ``(world, batch, steps)`` (the last to its end), each resumed from the
    state of the one before; returns the keys each rank read at each step and the state after each phase."""
    state, read, states = None, [], []
    for i, (world, batch, steps) in enumerate(specs):
        options = dict(decode=False, world_size=world, batch_size=batch, drop_last=drop_last, mix=mix, seed=5)
        loaders = [shardkit.loader(piles, rank=r, **options) for r in range(world)]
        for loader in loaders:
            loader.set_epoch(epoch)
            if state is not None:
                loader.load_state_dict(state)
        assert len({len(loader) for loader in loaders}) == 1
        last = i == len(specs) - 1
        its = [iter(loader) for loader in loaders]
        phase = []
        left = len(loaders[0]) - -(-loaders[0].state_dict()["position"] // (batch or 1))
        for _ in range(left if last else min(steps, left - 1)):
            phase.append([flat(next(it)) for it in its])
        if last:
            assert all(next(it, None) is None for it in its), "every rank ends at the same step"
        ranks = [json.loads(json.dumps(loader.state_dict())) for loader in loaders]
        assert all(s == ranks[0] for s in ranks), "ranks move in step: every rank's state is the same"
        state = ranks[0]
        read.append(phase)
        states.append(state)
        for it in its:
            it.close()
    return read, states


world_spec = st.tuples(st.integers(1, 5), st.sampled_from([None, 4, 8]), st.integers(0, 12))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(world_spec, min_size=2, max_size=4), drop_last=st.booleans(), mix=st.sampled_from([1, 2]))
def test_resume_on_other_world_sizes_reads_each_sample_once(piles, specs, drop_last, mix):
    read, states = run_phases(piles, specs, drop_last=drop_last, mix=mix)
    end = states[-1]
    assert (end["epoch"], end["position"], end["done"]) == (2, 0, []), "the resumed epoch completes and moves on"
    counts = collections.Counter(k for phase in read for step in phase for rank in step for k in rank)
    world, batch = specs[-1][0], specs[-1][1] or 1
    ids = collections.Counter({int(k[1:]): c for k, c in counts.items()})
    check_reads(ids, N, drop_last=drop_last, padding=sum(s[0] - 1 for s in specs), dropped=world * batch + world)


def test_the_rest_is_a_pure_function_of_the_state_and_the_ledger_follows_it(piles):
    specs = [(4, 8, 3), (3, 4, 5), (2, 8, 0)]
    read, _ = run_phases(piles, specs, drop_last=False, mix=2)
    again, _ = run_phases(piles, specs, drop_last=False, mix=2)
    assert read == again
    # the ledger numbers the steps of a resumed epoch on through its phases
    state = run_phases(piles, specs, drop_last=False, mix=2)[1][-2]  # taken on 3 ranks, loaded on 2
    ledger = shardkit.loader(piles, decode=False, world_size=2, rank=0, batch_size=8, drop_last=False, mix=2, seed=5)
    ledger.load_state_dict(state)
    steps = [step for phase in read for step in phase]
    assert [ledger.keys(k, epoch=1) for k in range(len(steps))] == steps
    with pytest.raises(ConfigError, match=f"step: {len(steps)} is past the end of the epoch"):
        ledger.keys(len(steps), epoch=1)


def test_the_ledger_of_a_resumed_epoch_outlives_its_reading(piles):
    """Once the epoch resumed on other ranks is read to its end, its steps are still named through the change."""
    read, states = run_phases(piles, [(2, 8, 3), (3, 8, 0)], drop_last=True, mix=1)
    for rank in range(3):
        loader = shardkit.loader(piles, decode=False, world_size=3, rank=rank, batch_size=8, seed=5)
        loader.set_epoch(1)
        loader.load_state_dict(states[0])
        got = [flat(batch) for batch in loader]
        assert loader.epoch == 2
        assert [loader.keys(3 + k, epoch=1)[rank] for k in range(len(got))] == got
    assert [loader.keys(k, epoch=1) for k in range(3)] == read[0], "the steps before the change: 2 ranks each"


def test_state_stays_small_and_old_states_load(piles):
    options = dict(decode=False, batch_size=4, seed=5)
    sizes, state = [], None
    for world in (8, 5, 7, 3, 6, 2):
        loader = shardkit.loader(piles, rank=0, world_size=world, **options)
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        it.close()
        sizes.append(len(json.dumps(state)))
    assert len(state["done"]) == 5
    assert max(np.diff(sizes)) < 80, "a change adds a few integers to the state, whatever the dataset"
    # a version 1 state (no "done") resumes, on its world size or another
    loader = shardkit.loader(piles, rank=1, world_size=3, **options)
    it = iter(loader)
    head = [flat(next(it)) for _ in range(2)]
    old = {k: v for k, v in loader.state_dict().items() if k != "done"} | {"version": 1}
    it.close()
    same = shardkit.loader(piles, rank=1, world_size=3, **options)
    same.load_state_dict(old)
    assert head + [flat(b) for b in same] == [flat(b) for b in shardkit.loader(piles, rank=1, world_size=3, **options)]
    other = shardkit.loader(piles, rank=0, world_size=2, **options)
    other.load_state_dict(old)
    assert other.state_dict()["done"] == [{"world_size": 3, "batch_size": 4, "read": [8]}]


@pytest.mark.parametrize(
    ("done", "message"),
    [
        ("x", "done: expected a list of phases, got str"),
        ([{"world_size": 2}], r"done\[0\]: expected \{'world_size'"),
        ([{"world_size": 0, "batch_size": None, "read": [1]}], r"done\[0\].world_size: expected an integer >= 1, got 0"),
        ([{"world_size": 2, "batch_size": None, "read": [-1]}], r"done\[0\].read\[0\]: expected an integer >= 0, got -1"),
        ([{"world_size": 2, "batch_size": None, "read": [151]}], r"done\[0\]: read\[0\]: expected an integer between 0 and 150"),
    ],
)
def test_bad_phases_are_refused(piles, done, message):
    state = shardkit.loader(piles, decode=False).state_dict() | {"done": done}
    with pytest.raises(ConfigError, match=message):
        shardkit.loader(piles, decode=False).load_state_dict(state)
