"""The ledger: the keys a step reads on every rank, from the plan, equal to what the loaders yield."""

from __future__ import annotations

import json

import pytest
from conftest import make_samples

import shardkit
from shardkit.cli.main import main


@pytest.fixture(scope="module")
def piles(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("trace") / "ds")
    samples = make_samples(1000)
    shardkit.preprocess([samples[i : i + 100] for i in range(0, 1000, 100)], lambda u: u, out, piles=7, quiet=True)
    return out


@pytest.mark.parametrize(
    "options",
    [
        {"batch_size": 16, "world_size": 3, "drop_last": False, "seed": 2, "mix": 2},
        {"batch_size": 16, "world_size": 3, "drop_last": True, "seed": 2},
        {"batch_size": None, "world_size": 2, "seed": 1},
        {"batch_size": 10, "world_size": 1, "shuffle": False},
        {"batch_size": 64, "world_size": 4, "drop_last": False, "seed": 9},  # the padding wraps round
    ],
)
def test_the_ledger_is_what_every_rank_read(piles, options):
    world = options["world_size"]
    loaders = [shardkit.loader(piles, decode=False, rank=r, **options) for r in range(world)]
    for epoch in range(2):
        read = [list(loader) for loader in loaders]
        for step in range(len(loaders[0])):
            expected = [list(r[step]["__key__"]) if options["batch_size"] else [r[step]["__key__"]] for r in read]
            assert loaders[0].keys(step, epoch=epoch) == expected


def test_trace_prints_each_rank(piles, capsys):
    loader = shardkit.loader(piles, decode=False, batch_size=8, world_size=2, rank=0, seed=3)
    expected = loader.keys(5, epoch=1)
    assert main(["trace", piles, "--step", "5", "--epoch", "1", "--batch-size", "8", "--world-size", "2", "--seed", "3"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"rank {r}: {' '.join(k)}" for r, k in enumerate(expected)]
    assert main(["trace", piles, "--step", "5", "--epoch", "1", "--batch-size", "8", "--world-size", "2", "--seed", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {str(r): k for r, k in enumerate(expected)}


def test_a_step_past_the_epoch_is_refused(piles, capsys):
    loader = shardkit.loader(piles, decode=False, batch_size=100)
    with pytest.raises(shardkit.ConfigError, match=r"step: 10 is past the end of the epoch \(10 steps a rank\)"):
        loader.keys(10)
    with pytest.raises(shardkit.ConfigError, match="step"):
        loader.keys(-1)
    assert main(["trace", piles, "--step", "10", "--batch-size", "100"]) == 1
    assert "past the end of the epoch" in capsys.readouterr().err


def test_trace_follows_a_resume_on_other_ranks(piles, tmp_path, capsys):
    """A run of 3 ranks stopped after 4 steps of epoch 1 and resumed on 2: step 4 on is theirs."""
    options = {"decode": False, "batch_size": 8, "seed": 3}
    before = [shardkit.loader(piles, rank=r, world_size=3, **options) for r in range(3)]
    read = []
    for loader in before:
        loader.set_epoch(1)
        it = iter(loader)
        read.append([list(next(it)["__key__"]) for _ in range(4)])
    state = before[0].state_dict()
    after = [shardkit.loader(piles, rank=r, world_size=2, **options) for r in range(2)]
    for loader in after:
        loader.load_state_dict(state)
    rest = [[list(b["__key__"]) for b in loader] for loader in after]
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    trace = ["trace", piles, "--epoch", "1", "--batch-size", "8", "--world-size", "2", "--seed", "3", "--state", str(path), "--json"]
    for step, expected in [(2, [r[2] for r in read]), (4, [r[0] for r in rest]), (4 + len(rest[0]) - 1, [r[-1] for r in rest])]:
        assert main([*trace[:2], "--step", str(step), *trace[2:]]) == 0
        assert json.loads(capsys.readouterr().out) == {str(r): k for r, k in enumerate(expected)}


@pytest.mark.parametrize("text", [b"not json", b"\xff\xfe{}"])
def test_a_state_file_that_is_not_json_is_one_line(piles, tmp_path, capsys, text):
    path = tmp_path / "state.json"
    path.write_bytes(text)
    assert main(["trace", piles, "--step", "0", "--state", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"shardkit trace: error: {path}: ") and "JSON" in err and "Traceback" not in err


@pytest.mark.parametrize("kind", ["missing", "folder", "a list", "torch, no version"])
def test_a_state_file_that_cannot_be_read_or_is_no_state_names_the_file(piles, tmp_path, capsys, kind):
    """``--state`` of a missing file or a folder said ``[Errno 2] ...``; one that is no state said
    ``load_state_dict: ...``: neither named the flag's file."""
    path = tmp_path / "state.json"
    if kind == "folder":
        path.mkdir()
    elif kind != "missing":
        path.write_text(json.dumps([1, 2] if kind == "a list" else {"format": "shardkit.torch"}))
    assert main(["trace", piles, "--step", "0", "--state", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"shardkit trace: error: {path}: ") and err.count("\n") == 1 and "Errno" not in err
