"""The pass-1 dry run: its formulas agree with routing every sample through the real router."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shardkit.cli import main
from shardkit.piles import router, scale


def test_the_simulation_counts_what_the_router_draws():
    shape = scale.Shape(samples=12_345, units=17, piles=23, sample_bytes=100, max_pile_bytes=40_000)
    found = scale.simulate(shape)
    sizes = np.zeros(23, dtype=np.int64)
    segments = 0
    for unit in range(17):
        hits = np.bincount(router.route(piles=23, seed=0, unit=unit, count=12_345 // 17 + (unit < 12_345 % 17)), minlength=23)
        sizes += hits
        segments += int(np.count_nonzero(hits))
    assert found["samples"] == 12_345 == sizes.sum()
    assert found["largest_pile"] == sizes.max() and found["driver_segments"] == segments
    most = math.floor(0.9 * 40_000 / 100)
    assert found["split_piles"] == int(np.count_nonzero(sizes > most)) > 0


def test_the_formulas_bound_the_simulation():
    shape = scale.Shape(samples=400_000, units=300, piles=400, executor="ray", sample_bytes=64 << 10, workers=100)
    planned, found = scale.plan(shape), scale.simulate(shape)
    assert planned["writers"] == 300 // 2  # 2 units a task, at most 256 tasks
    assert found["driver_segments"] <= planned["driver_segments"] == 300 * 400
    assert abs(found["pile_sd"] - planned["pile_sd"]) < 0.15 * planned["pile_sd"]
    # 62.5 MiB piles go up in 16 MiB requests, each pile as one multipart upload (+2)
    assert planned["put_requests"] == 400 * (4 + 2) + 1 + 4
    assert planned["objects"] == 401 and planned["staging_files"] == 150 * 401


def test_the_plan_command_prints_the_table(capsys):
    assert main(["plan", "--samples", "1e5", "--units", "1e2", "--piles", "16", "--executor", "ray"]) == 0
    out = capsys.readouterr().out
    assert "driver memory" in out and "PUT requests" in out and "simulated" in out
    with pytest.raises(SystemExit):
        main(["plan", "--samples", "10", "--units", "0.5", "--piles", "2"])
    assert "--units: expected a whole count >= 1, got '0.5'" in capsys.readouterr().err


@pytest.mark.parametrize("workers", ["0", "-2"])
def test_the_plan_command_refuses_fewer_than_one_worker(capsys, workers):
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--samples", "1e3", "--units", "10", "--piles", "10", "--executor", "ray", "--workers", workers])
    assert exit_.value.code == 2
    assert f"--workers: expected a whole count >= 1, got '{workers}'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--piles", "1e20"], "piles: expected at most 1000000 (each is a file)"),  # a traceback from numpy before
        (["--piles", "1e12"], "piles: expected at most 1000000"),  # 7 TiB asked of numpy before
        (["--max-pile-bytes", "1"], "max_pile_bytes: expected at least 1536 bytes"),  # as pile refuses it
        (["--units", "1e7"], "routing every sample takes too long past 1,000,000 units"),  # ran for minutes before
        (["--samples", "1e20", "--units", "10"], "pass --no-simulate for the formulas alone"),
    ],
)
def test_plan_refuses_what_pile_refuses_and_what_it_cannot_simulate(argv, said, capsys):
    shape = {"--samples": "1e3", "--units": "1e4", "--piles": "10"}
    for flag, value in zip(argv[::2], argv[1::2], strict=True):
        shape[flag] = value
    assert main(["plan", *(x for kv in shape.items() for x in kv)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("shardkit plan: error: ") and said in err and "Traceback" not in err
