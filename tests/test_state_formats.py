"""State dicts keep their format: states written by this version of shardkit, pinned here as
literals (taken after a change of split, so each holds a finished phase), load and resume the
same order, and each reader writes them again field for field."""

from __future__ import annotations

import copy
import importlib.util
import itertools
import os

import pytest

import shardkit

NO_TORCH = importlib.util.find_spec("torch") is None

WEIGHTS = {"a": 2, "b": 1}

LOADER = {
    "format": "shardkit.loader",
    "version": 2,
    "epoch": 1,
    "position": 2,
    "seed": 7,
    "shuffle": True,
    "mix": 1,
    "drop_last": True,
    "world_size": 3,
    "batch_size": 2,
    "dataset": "364b57676d6cfa77",
    "samples": 45,
    "done": [{"world_size": 2, "batch_size": 4, "read": [8]}],
    "generation": 0,
}
LOADER_NEXT = [["plain033", "plain006", "plain013", "plain003"], ["plain041", "plain042", "plain007", "plain010"]]

BLEND = {
    "format": "shardkit.blend",
    "version": 2,
    "epoch": 1,
    "position": 6,
    "seed": 7,
    "shuffle": True,
    "mix": 1,
    "drop_last": True,
    "world_size": 1,
    "batch_size": 6,
    "dataset": "51cd3479a39b6e12",
    "samples": 47,
    "done": [{"world_size": 2, "batch_size": 3, "read": [6]}],
    "sources": {
        "a": {"dataset": "e422316ee1be33ca", "samples": 30, "wanted": 31, "start": 28, "epoch": 1, "position": 6, "generation": 0},
        "b": {"dataset": "72fdaa73be6a2457", "samples": 17, "wanted": 16, "start": 14, "epoch": 1, "position": 1, "generation": 0},
    },
}
BLEND_NEXT = [["a002", "b016", "a017"], ["a001", "b003", "a005"]]

TORCH = {
    "format": "shardkit.torch",
    "version": 2,
    "epoch": 1,
    "taken": 2,
    "workers": 1,
    "seed": 7,
    "shuffle": True,
    "mix": 1,
    "drop_last": True,
    "world_size": 1,
    "batch_size": 2,
    "dataset": "364b57676d6cfa77",
    "samples": 45,
    "done": [{"world_size": 2, "batch_size": 2, "read": [4, 2]}],
    "generation": 0,
}
TORCH_NEXT = [["plain032", "plain037"], ["plain041", "plain042"], ["plain034", "plain010"]]

TORCH_BLEND = {
    "format": "shardkit.torch",
    "version": 2,
    "epoch": 1,
    "taken": 1,
    "workers": 1,
    "seed": 7,
    "shuffle": True,
    "mix": 1,
    "drop_last": True,
    "world_size": 2,
    "batch_size": 3,
    "dataset": "51cd3479a39b6e12",
    "samples": 47,
    "done": [{"world_size": 1, "batch_size": 3, "read": [6, 3]}],
    "sources": {
        "a": {"dataset": "e422316ee1be33ca", "samples": 30, "wanted": 31, "start": 30, "generation": 0},
        "b": {"dataset": "72fdaa73be6a2457", "samples": 17, "wanted": 16, "start": 15, "generation": 0},
    },
}
TORCH_BLEND_NEXT = [["a002", "b016", "a017"], ["a018", "a013", "b010"], ["a001", "b003", "a005"]]


def make(root, name: str, n: int, piles: int, seed: int) -> str:
    path = os.path.join(root, name)
    with shardkit.PileWriter(path, piles=piles, seed=seed) as w:
        for i in range(n):
            w.write({"__key__": f"{name}{i:03d}", "txt": f"{name} {i}"})
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("formats")
    return {"plain": make(root, "plain", 45, 3, 1), "pair": {"a": make(root, "a", 30, 2, 2), "b": make(root, "b", 17, 2, 3)}}


def keys(items) -> list[list[str]]:
    return [list(b["__key__"]) for b in items]


def a_loader(source, world: int, batch: int, workers: int, **extra):
    """A loader of rank 0 of ``world`` reading epoch 1 (``workers`` is the DataLoader's: none here)."""
    ld = shardkit.loader(source, batch_size=batch, world_size=world, rank=0, decode=False, seed=7, **extra)
    ld.set_epoch(1)
    return ld


def a_dataloader(source, world: int, batch: int, workers: int, **extra):
    """A ``shardkit.torch`` DataLoader of ``workers`` workers on rank 0 of ``world`` reading epoch 1."""
    from shardkit.torch import ShardkitDataLoader, ShardkitDataset

    ds = ShardkitDataset(source, batch_size=batch, world_size=world, rank=0, decode=False, seed=7, **extra)
    ds.set_epoch(1)
    return ShardkitDataLoader(ds, num_workers=workers)


def phases(make, source, specs, state=None, **extra):
    """Read epoch 1 in phases ``(world, batch, workers, steps)``, each resuming the state the one
    before left; the last state and the keys of the last phase's batches."""
    got: list[list[str]] = []
    for world, batch, workers, steps in specs:
        reader = make(source, world, batch, workers, **extra)
        if state is not None:
            reader.load_state_dict(copy.deepcopy(state))
        got = keys(itertools.islice(reader, steps))
        state = reader.state_dict()
    return state, got


CASES = {
    "loader": (a_loader, "plain", [(2, 4, 0, 2), (3, 2, 0, 1)], LOADER, [(1, 4, 0, 2)], LOADER_NEXT),
    "blend": (a_loader, "pair", [(2, 3, 0, 2), (1, 6, 0, 1)], BLEND, [(2, 3, 0, 2)], BLEND_NEXT),
    "torch": (a_dataloader, "plain", [(2, 2, 2, 3), (1, 2, 0, 2)], TORCH, [(2, 2, 3, 3)], TORCH_NEXT),
    "torch_blend": (a_dataloader, "pair", [(1, 3, 2, 3), (2, 3, 0, 1)], TORCH_BLEND, [(1, 3, 2, 3)], TORCH_BLEND_NEXT),
}


@pytest.mark.parametrize("case", CASES)
def test_a_state_is_written_and_read_as_before(data, case):
    if NO_TORCH and CASES[case][0] is a_dataloader:
        pytest.skip("needs torch: pip install 'shardkit[torch]'")
    make, which, taken, state, resumed, then = CASES[case]
    extra = {"weights": WEIGHTS} if which == "pair" else {}
    assert phases(make, data[which], taken, **extra)[0] == state
    assert phases(make, data[which], resumed, state, **extra)[1] == then


@pytest.mark.parametrize("case", ["torch", "torch_blend"])
def test_a_torch_state_written_before_states_named_a_generation_still_loads(data, case):
    """States of shardkit.torch named no generation until they pinned one as a loader's do: those
    saved then resume as they did, on the generation read."""
    if NO_TORCH:
        pytest.skip("needs torch: pip install 'shardkit[torch]'")
    make, which, _, state, resumed, then = CASES[case]
    old = copy.deepcopy(state)
    old.pop("generation", None)  # a blend's names its sources' only
    for source in old.get("sources", {}).values():
        del source["generation"]
    extra = {"weights": WEIGHTS} if which == "pair" else {}
    assert phases(make, data[which], resumed, old, **extra)[1] == then
