"""A blend resumed on another world size, batch size or number of DataLoader workers: each
scheduled sample of each source read once, equal counts on every rank, sources continued."""

from __future__ import annotations

import collections
import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardkit
from shardkit.loading import elastic
from shardkit.loading.elastic import Phase
from tests.test_blend_loader import make

WEIGHTS = {"web": 0.7, "code": 0.3}
SIZES = {"web": 90, "code": 40}
SEED = 3


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("blend_elastic")
    return {name: make(root, name, n, piles=3, seed=i) for i, (name, n) in enumerate(SIZES.items())}


def stream(path: str, samples: int, **options) -> list[str]:
    """The first ``samples`` keys of a source's endless stream: its own epoch orders, one after another."""
    found: list[str] = []
    with shardkit.loader(path, decode=False, seed=SEED, **options) as alone:
        for epoch in itertools.count():
            if len(found) >= samples:
                return found[:samples]
            alone.set_epoch(epoch)
            found += [s["__key__"] for s in alone]
    raise AssertionError("unreachable")


def check_streams(pair, keys: list[str], **options) -> None:
    """Each source's keys are exactly a prefix of its stream: none skipped, none twice too early."""
    for name, path in pair.items():
        mine = [k for k in keys if k.startswith(name)]
        assert collections.Counter(mine) == collections.Counter(stream(path, len(mine), **options)), name


def blend_loader(pair, world, batch, rank, **extra):
    return shardkit.loader(pair, weights=WEIGHTS, batch_size=batch, world_size=world, rank=rank, decode=False, seed=SEED, **extra)


def without_ranks(state: dict) -> dict:
    """A blend state less where the rank itself stands in each source (the only field ranks differ in)."""
    out = json.loads(json.dumps(state))
    for fields in out["sources"].values():
        fields.pop("epoch"), fields.pop("position")
    return out


def read_phases(pair, specs, *, epoch=1, **extra):
    """Read ``epoch`` in phases ``(world, batch, steps)`` (the last to its end), each resumed from
    the state the one before left; returns each phase's batches per rank and the final state."""
    state, read = None, []
    for i, (world, batch, steps) in enumerate(specs):
        loaders = [blend_loader(pair, world, batch, r, **extra) for r in range(world)]
        for loader in loaders:
            loader.set_epoch(epoch)
            if state is not None:
                loader.load_state_dict(state)
        assert len({len(loader) for loader in loaders}) == 1, "every rank yields as many batches"
        last = i == len(specs) - 1
        its = [iter(loader) for loader in loaders]
        count = len(loaders[0]) - loaders[0].state_dict()["position"] // batch
        phase = [[list(next(it)["__key__"]) for it in its] for _ in range(count if last else min(steps, count - 1))]
        if last:
            assert all(next(it, None) is None for it in its), "every rank ends at the same step"
        states = [loader.state_dict() for loader in loaders]
        assert all(without_ranks(s) == without_ranks(states[0]) for s in states), "ranks move in step"
        state = json.loads(json.dumps(states[0]))
        read.append(phase)
        for it in its:
            it.close()
    return read, state


def state_after(loader, steps: int) -> dict:
    """``loader``'s state after ``steps`` batches of its epoch."""
    it = iter(loader)
    for _ in range(steps):
        next(it)
    state = loader.state_dict()
    it.close()
    return state


def whole_epoch(pair, world, batch, epoch, state=None, **extra) -> list[list[list[str]]]:
    """Every rank's batches of ``epoch`` (after ``state``), step by step."""
    loaders = [blend_loader(pair, world, batch, r, **extra) for r in range(world)]
    for loader in loaders:
        loader.set_epoch(epoch)
        if state is not None:
            loader.load_state_dict(state)
    return [list(step) for step in zip(*([list(b["__key__"]) for b in loader] for loader in loaders), strict=True)]


def within_one(batch: list[str], size: int) -> bool:
    web = sum(k.startswith("web") for k in batch)
    return abs(web - size * WEIGHTS["web"]) < 1


phase = st.tuples(st.integers(1, 4), st.sampled_from([2, 4, 6]), st.integers(0, 8))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(phase, min_size=2, max_size=4), drop_last=st.booleans(), mix=st.sampled_from([1, 2]))
def test_changes_of_world_and_batch_read_each_scheduled_sample_once(pair, specs, drop_last, mix):
    extra = {"drop_last": drop_last, "mix": mix}
    world0, batch0, _ = specs[0]
    before = whole_epoch(pair, world0, batch0, 0, **extra)  # so that the sources are mid-stream
    read, state = read_phases(pair, specs, **extra)
    assert (state["epoch"], state["position"], state["done"]) == (2, 0, [])
    for i, ((_, batch, _), steps) in enumerate(zip(specs, read, strict=True)):
        assert all(len(rank) == batch for step in steps for rank in step), "whole batches, equal on every rank"
        if all(b == batch0 for _, b, _ in specs[: i + 1]):  # the epoch's own batches, whatever the world sizes
            assert all(within_one(rank, batch) for step in steps for rank in step)
    world, batch, _ = specs[-1]
    after = whole_epoch(pair, world, batch, 2, state, **extra)  # the next epoch follows on in every source
    keys = [k for steps in [before, *read, after] for step in steps for rank in step for k in rank]
    check_streams(pair, keys, mix=mix)


def test_two_changes_in_one_epoch_then_the_next_epoch(pair):
    specs = [(2, 4, 3), (3, 6, 2), (1, 2, 0)]
    read, state = read_phases(pair, specs)
    again, same = read_phases(pair, specs)
    assert (read, state) == (again, same), "the rest is a pure function of the state"
    assert [len(steps) for steps in read[:2]] == [3, 2]
    after = whole_epoch(pair, 2, 4, 2, state)
    keys = [k for steps in [whole_epoch(pair, 2, 4, 0), *read, after] for step in steps for rank in step for k in rank]
    check_streams(pair, keys)
    # the epoch after reads its own shape again: 130 positions, 128 in whole batches on 2 ranks
    assert len(after) * 2 * 4 == 128 and all(within_one(rank, 4) for step in after for rank in step)


def test_the_ledger_follows_a_changed_epoch(pair):
    specs = [(3, 4, 2), (2, 4, 0)]
    read, _ = read_phases(pair, specs)
    ledger = blend_loader(pair, 3, 4, 0)
    ledger.set_epoch(1)
    state = state_after(ledger, 2)
    resumed = blend_loader(pair, 2, 4, 1)
    resumed.load_state_dict(state)
    steps = [step for phase in read for step in phase]
    assert [resumed.keys(k, epoch=1) for k in range(len(steps))] == steps


def test_the_state_grows_by_a_few_integers_a_change_whatever_the_data(pair, tmp_path):
    big = {name: make(tmp_path, f"{name}", 20 * n, piles=5, seed=7) for name, n in SIZES.items()}
    sizes = {}
    for label, data in (("small", pair), ("big", big)):
        state, lengths = None, []
        for world, batch in ((2, 4), (3, 2), (1, 6), (4, 4)):
            loader = blend_loader(data, world, batch, 0)
            if state is not None:
                loader.load_state_dict(state)
            state = state_after(loader, 1)
            lengths.append(len(json.dumps(state)))
        assert len(state["done"]) == 3
        sizes[label] = lengths
    for lengths in sizes.values():
        assert max(b - a for a, b in itertools.pairwise(lengths)) < 80, "a change adds a few integers"
    assert abs(sizes["big"][-1] - sizes["small"][-1]) <= 40, "only counts have more digits"


def test_an_open_end_rounds_each_phase_up_and_never_pads():
    done = [Phase(2, 4, (8,)), Phase(3, 2, (2,))]
    rest = elastic.rest_for(48, done, world=5, batch_size=3, drop_last=True, open_end=True)
    assert elastic.length(rest) % 15 == 0 and rest == sorted(rest)
    assert elastic.extent(48, done, world=5, batch_size=3, drop_last=True) == rest[-1][1]
    shares = [elastic.share(rest, world=5, rank=r, drop_last=True, batch_size=3) for r in range(5)]
    read = [p for ranges in shares for a, b in ranges for p in range(a, b)]
    assert len(read) == len(set(read)) == elastic.length(rest), "nothing padded, nothing dropped"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"weights": {"web": 0.5, "code": 0.5}}, "source 'web': the state has wanted=91, this blend has wanted=65"),
        ({"seed": 4}, "the state was taken with seed=3, this loader has seed=4"),
    ],
)
def test_a_state_of_another_blend_is_refused_on_any_split(pair, change, message):
    state = state_after(blend_loader(pair, 2, 4, 0), 1)
    options = {"weights": WEIGHTS, "batch_size": 6, "world_size": 3, "rank": 1, "decode": False, "seed": SEED} | change
    with pytest.raises(shardkit.ConfigError, match=message):
        shardkit.loader(pair, **options).load_state_dict(state)
    other = {"web": pair["web"], "more": pair["code"]}
    with pytest.raises(shardkit.ConfigError, match=r"taken on sources \['code', 'web'\], this blend has \['more', 'web'\]"):
        shardkit.loader(other, weights={"web": 0.7, "more": 0.3}, batch_size=6, world_size=3, rank=1, seed=SEED).load_state_dict(state)


# -- under shardkit.torch, with real DataLoader workers ------------------------------------------


def torch_phases(pair, specs, *, epoch=1):
    """Read ``epoch`` through ShardkitDataLoaders in phases ``(world, batch, workers, steps)``."""
    from shardkit.torch import ShardkitDataLoader, ShardkitDataset

    state, read = None, []
    for i, (world, batch, workers, steps) in enumerate(specs):
        last = i == len(specs) - 1
        ranks, taken = [], []
        for rank in range(world):
            ds = ShardkitDataset(pair, weights=WEIGHTS, batch_size=batch, decode=False, world_size=world, rank=rank, seed=SEED)
            dl = ShardkitDataLoader(ds, num_workers=workers)
            ds.set_epoch(epoch)
            if state is not None:
                dl.load_state_dict(state)
            ranks.append([list(b["__key__"]) for b in (dl if last else itertools.islice(dl, steps))])
            taken.append(json.loads(json.dumps(dl.state_dict())))
        assert all(t == taken[0] for t in taken), "ranks move in step: every rank's state is the same"
        assert len({len(r) for r in ranks}) == 1, "every rank reads as many batches"
        assert all(len(b) == batch for r in ranks for b in r), "whole batches"
        state = taken[0]
        read.append(ranks)
        if state["epoch"] == epoch + 1:
            break
    return read, state


torch_phase = st.tuples(st.integers(1, 3), st.sampled_from([2, 4]), st.sampled_from([0, 2, 3]), st.integers(0, 6))


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(torch_phase, min_size=2, max_size=3))
def test_torch_workers_world_and_batch_changes_read_each_scheduled_sample_once(pair, specs):
    pytest.importorskip("torch")
    from shardkit.torch import ShardkitDataLoader, ShardkitDataset

    read, state = torch_phases(pair, specs)
    assert (state["epoch"], state["taken"], state["done"]) == (2, 0, [])
    world, batch, workers, _ = specs[len(read) - 1]
    after = []
    for rank in range(world):  # the next epoch, on the last split, follows on in every source
        ds = ShardkitDataset(pair, weights=WEIGHTS, batch_size=batch, decode=False, world_size=world, rank=rank, seed=SEED)
        dl = ShardkitDataLoader(ds, num_workers=workers)
        dl.load_state_dict(state)
        after.append([list(b["__key__"]) for b in dl])
    before = whole_epoch(pair, specs[0][0], specs[0][1], 0)
    keys = [k for steps in before for step in steps for k in step]
    keys += [k for phase in [*read, after] for rank in phase for b in rank for k in b]
    check_streams(pair, keys)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_torch_ledger_of_a_blend_counts_dataloader_steps_through_a_change(pair):
    pytest.importorskip("torch")
    from shardkit.torch import ShardkitDataLoader, ShardkitDataset

    def dataloader(world, batch, workers, rank):
        ds = ShardkitDataset(pair, weights=WEIGHTS, batch_size=batch, decode=False, world_size=world, rank=rank, seed=SEED)
        ds.set_epoch(1)
        return ShardkitDataLoader(ds, num_workers=workers)

    first = [dataloader(2, 4, 2, rank) for rank in range(2)]
    before = [[list(b["__key__"]) for b in itertools.islice(dl, 3)] for dl in first]
    state = first[0].state_dict()
    second = [dataloader(3, 2, 3, rank) for rank in range(3)]
    for dl in second:
        dl.load_state_dict(state)
    after = [[list(b["__key__"]) for b in dl] for dl in second]
    steps = [list(s) for s in zip(*before, strict=True)] + [list(s) for s in zip(*after, strict=True)]
    ledger = dataloader(3, 2, 3, 0)
    ledger.load_state_dict(state)
    assert [ledger.keys(k, epoch=1) for k in range(len(steps))] == steps
