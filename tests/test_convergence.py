"""The convergence benchmark's quick mode runs end to end and writes its figure, table and curves.

It checks that the script runs and that every policy either trained or says why it did not,
never the figures: which policy trains best is for the benchmark's report, not a unit test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the convergence benchmark trains a PyTorch model: pip install torch==2.13.0")
pytest.importorskip("mnist1d", reason="the convergence benchmark's data come from mnist1d: pip install -e '.[bench]'")
pytest.importorskip("matplotlib", reason="the convergence benchmark plots with matplotlib: pip install -e '.[plot]'")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "convergence.py")
ALWAYS = ("sequential", "webdataset", "shardkit", "shardkit-mix4", "shardkit-repile", "reference")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("convergence")
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT, MPLBACKEND="Agg"),
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout


def test_writes_figure_table_and_curves(quick):
    out, stdout = quick
    with open(out / "convergence.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    table = (out / "convergence.md").read_text()
    assert stdout.strip() == table.strip()
    assert "| policy | classes / batch of 32 | largest class's share of a batch | steps to 90% accuracy | final accuracy % |" in table


def test_every_policy_trained_or_says_why_not(quick):
    out, _ = quick
    doc = json.loads((out / "convergence.json").read_text())
    policies = {p["key"]: p for p in doc["policies"]}
    assert set(ALWAYS) <= set(policies)
    for key, p in policies.items():
        if key in ALWAYS:
            assert p["status"] == "ok", p["reason"]
        if p["status"] == "ok":
            (run,) = p["runs"]
            assert run["steps"][0] == 0 and run["steps"][-1] == doc["config"]["steps_per_epoch"] * doc["config"]["epochs"]
            assert len(run["accuracy"]) == len(run["loss"]) == len(run["steps"])
            assert len(run["read_seconds"]) == doc["config"]["epochs"]
        else:
            assert p["status"] in ("skipped", "failed") and p["reason"]
    # the peers run wherever they are installed (mosaicml-streaming without transformers too)
    for key, module in (("hf", "datasets"), ("mosaic", "streaming")):
        if importlib.util.find_spec(module) is not None:
            assert policies[key]["status"] == "ok", policies[key].get("reason")
    assert doc["config"]["command"].startswith("python benchmarks/convergence.py --quick")


def test_replot_redraws_from_the_saved_curves(quick, tmp_path):
    out, stdout = quick
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--replot", str(out / "convergence.json"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT, MPLBACKEND="Agg"),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == stdout.strip()
    assert (tmp_path / "convergence.png").stat().st_size > 0
