"""States, YAML jobs and storage options checked by type and range when read: each bad one is one
line of ShardkitError, at once (no hang, no OverflowError), and `run --check` catches what `run`
would fail on."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

import shardkit
from shardkit.cli import main
from shardkit.cli.jobs import load_job

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))


@pytest.fixture
def two(tmp_path, dataset) -> dict[str, str]:
    other = str(tmp_path / "other")
    with shardkit.PileWriter(other, piles=3, seed=1) as w:
        for i in range(90):
            w.write({"__key__": f"o{i:04d}", "txt": str(i)})
    return {"a": dataset, "b": other}


def _one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text
    return text


def _taken(loader, batches: int = 2) -> dict:
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return json.loads(json.dumps(loader.state_dict()))


def test_a_torch_state_with_2_40_workers_is_refused_at_once(dataset):
    pytest.importorskip("torch", reason="needs torch: pip install 'shardkit[torch]'")
    import shardkit.torch as torch_mod

    ds = torch_mod.ShardkitDataset(dataset, batch_size=8, decode=False, world_size=1, rank=0)
    it = iter(ds)
    next(it)
    state = ds.state_dict(yielded=1)
    started = time.monotonic()
    for field, value in (("workers", 2**40 + 1), ("world_size", 2**40), ("epoch", 2**63)):
        with pytest.raises(shardkit.ConfigError, match=f"load_state_dict: {field}: expected at most"):
            torch_mod.ShardkitDataset(dataset, batch_size=8, decode=False, world_size=1, rank=0).load_state_dict({**state, field: value})
    assert time.monotonic() - started < 5


def test_a_blend_state_with_a_start_past_int64_is_refused(two):
    loader = shardkit.loader(two, weights={"a": 0.7, "b": 0.3}, batch_size=8, decode=False)
    state = _taken(loader)
    for start in (2**63, 2**62, -1, "0", 1.5):
        state["sources"]["a"]["start"] = start
        with pytest.raises(shardkit.ConfigError) as info:
            shardkit.loader(two, weights={"a": 0.7, "b": 0.3}, batch_size=8, decode=False).load_state_dict(state)
        assert _one_line(info.value).startswith("load_state_dict: sources['a'].start: expected ")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.update(done=[{"world_size": 1, "batch_size": 8, "read": [0]}] * 5000), "done: expected at most 4096 phases"),
        (lambda s: s.update(done=[{"world_size": 1, "batch_size": 8, "read": [1] * 5000}]), "done[0].read: expected one count per worker"),
        (lambda s: s.update(done=[{"world_size": 1, "batch_size": 8, "read": []}]), "done[0].read: expected one count per worker"),
        (
            lambda s: s.update(done=[{"world_size": 1, "batch_size": 8, "read": [2**63]}]),
            "done[0].read[0]: expected at most 4611686018427387904 (int64)",
        ),
        (
            lambda s: s.update(done=[{"world_size": 2**21, "batch_size": 8, "read": [1]}]),
            "done[0].world_size: expected at most 1048576 (ranks of one job)",
        ),
        (lambda s: s.update(world_size=2**21), "world_size: expected at most 1048576 (ranks of one job)"),
        (lambda s: s.update(batch_size=2**63), "batch_size: expected at most"),
        (lambda s: s.update(epoch=2**41), "epoch: expected at most 1099511627776 (epochs of one run)"),
        (lambda s: s.update(done="x" * 100_000), "done: expected a list of phases, got str"),
        (lambda s: s.update(done=[{"a" * 100_000: 1}]), "done[0]: expected {'world_size'"),
    ],
)
def test_loader_state_sizes_and_counts_are_bounded(dataset, change, message):
    state = _taken(shardkit.loader(dataset, batch_size=8, decode=False))
    change(state)
    with pytest.raises(shardkit.ConfigError) as info:
        shardkit.loader(dataset, batch_size=8, decode=False).load_state_dict(state)
    text = _one_line(info.value)
    assert message in text and len(text) < 400


def _job(tmp_path, text: str) -> str:
    src = tmp_path / "src"
    if not src.exists():
        src.mkdir()
        with shardkit.PileWriter(str(tmp_path / "seed"), piles=1) as w:
            w.write({"__key__": "a", "txt": "1"})
        os.replace(tmp_path / "seed" / "pile-000000.tar", src / "s0.tar")
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "output: {path: out, piles: 2, mode: append, window: 99999999999999999999d}\n",
            "output.window: expected a duration of at most 1000 years",
        ),
        (
            "output: {path: out, piles: 2, mode: append, window: 99999999999999999999}\n",
            "output.window: expected an integer between 1 and 1000000",
        ),
        (
            "output: {path: out, piles: 2}\nstorage_options: {client_kwargs: notadict}\n",
            "storage_options: client_kwargs: expected a mapping",
        ),
        ('output: {path: "a\\0b", piles: 2}\n', "output.path: expected a path, got 'a\\x00b'"),
        ("output: {path: out, piles: 2}\nworkers: 1099511627777\n", "workers: expected at most 16384"),
    ],
)
def test_run_check_catches_what_run_would_fail_on(tmp_path, capsys, body, message):
    path = _job(tmp_path, "job: pile\ninputs: src/*.tar\n" + body)
    assert main(["run", "--check", path]) == 1
    err = capsys.readouterr().err
    assert err.startswith("shardkit run: error: ") and message in err and err.count("\n") == 1, err
    with pytest.raises(shardkit.ConfigError):
        load_job(path)


def test_inputs_with_a_nul_are_refused_by_check(tmp_path):
    path = _job(tmp_path, 'job: pile\ninputs: ["src/*.tar", "a\\0b"]\noutput: {path: out, piles: 2}\n')
    with pytest.raises(shardkit.ConfigError, match=r"inputs\[1\]: expected a path"):
        load_job(path)


def test_a_path_with_a_nul_is_a_config_error_in_python(tmp_path):
    with pytest.raises(shardkit.ConfigError, match="out: a path or URL cannot hold a NUL character"):
        shardkit.PileWriter(str(tmp_path / "a\0b"), piles=2)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"client_kwargs": "notadict"}, "storage_options: client_kwargs: expected a mapping of options, got a str"),
        ({"anon": "yes"}, "storage_options: anon: expected true or false, got a str"),
        ({"key": 5}, "storage_options: key: expected a string, got a int"),
        ({"client_kwargs": {"region_name": ["x"]}}, "storage_options.client_kwargs: region_name: expected a string, got a list"),
        ({"a": {"b": {"c": {"d": {"e": 1}}}}}, "options nested more than 4 deep"),
    ],
)
def test_storage_options_of_the_wrong_type(options, message):
    for make in (lambda: shardkit.PileOptions(piles=2, storage_options=options), lambda: shardkit.LoaderOptions(storage_options=options)):
        with pytest.raises(shardkit.ConfigError) as info:
            make()
        assert message in _one_line(info.value)


def test_a_storage_option_of_the_wrong_type_on_the_command_line(tmp_path, capsys):
    assert main(["--storage-option", "client_kwargs=notadict", "info", "s3://bucket/x"]) == 1
    err = capsys.readouterr().err
    assert err == "shardkit info: error: --storage-option: client_kwargs: expected a mapping of options, got a str\n"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_workers": 2**40}, "num_workers: expected at most 1024"),
        ({"prefetch": 2**40}, "prefetch: expected at most 1024"),
        ({"world_size": 2**40, "rank": 0}, "world_size: expected at most 1048576"),
        ({"remote_concurrency": 2**40}, "remote_concurrency: expected at most 1024"),
    ],
)
def test_loader_counts_are_bounded(options, message):
    with pytest.raises(shardkit.ConfigError, match=message):
        shardkit.LoaderOptions(**options)


def test_a_slice_of_the_fuzzed_states_and_jobs(tmp_path):
    import random

    import stress_inputs

    rng = random.Random(11)
    cases = stress_inputs.state_cases(str(tmp_path), 60, rng) + stress_inputs.job_cases(str(tmp_path), 60, rng)
    tried, failures = stress_inputs.run_cases(cases, timeout=30)
    assert tried == 120 and failures == []


def test_job_sizes_are_bounded_by_check(tmp_path):
    path = tmp_path / "demo.yaml"
    path.write_text("job: demo\nsamples: 1000000000000\n")
    with pytest.raises(shardkit.ConfigError, match=r"demo.yaml: line 2: samples: expected at most 10000000 \(the demo holds"):
        load_job(str(path))
    (tmp_path / "img" / "cat").mkdir(parents=True)
    path = tmp_path / "images.yaml"
    path.write_text("job: preprocess\ninputs: img\ntransform: images\nargs: {size: 1099511627776}\noutput: {path: out, piles: 2}\n")
    with pytest.raises(shardkit.ConfigError, match=r"images.yaml: line 4: args.size: expected at most 65536"):
        load_job(str(path))
