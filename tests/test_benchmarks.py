"""The benchmark's smoke mode runs end to end, so the benchmark code cannot rot.

It checks that the table and the JSON are written with every expected row and goal, never the
figures themselves: speed goals are for the benchmark's report, not for unit tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import shardkit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(ROOT, "benchmarks", "run.py")

ALWAYS = [
    ("a-5KB", "raw sequential read"),
    ("a-5KB", "webdataset"),
    ("a-50KB", "raw sequential read"),
    ("a-50KB", "webdataset"),
    ("b", "raw sequential read"),
    ("c", "raw sequential write"),
    ("c", "webdataset.TarWriter"),
    ("c", "webdataset.ShardWriter"),
    ("c", "shardkit.PileWriter M=1"),
    ("c", "shardkit.PileWriter M=64"),
    ("c", "shardkit.PileWriter M=256"),
    ("d", "raw sequential read"),
    ("d", "random access (offset index + pread)"),
    ("d", "GNU shuf (text, in RAM)"),
]
LOADER_ROWS = [
    ("a-5KB", "shardkit.loader"),
    ("a-50KB", "shardkit.loader"),
    ("b", "shardkit.loader"),
    ("e", "shardkit.loader M=16"),
    ("e", "shardkit.loader M=4"),
]
PEERS = [
    ("a-5KB", "HF datasets streaming", "datasets"),
    ("a-50KB", "HF datasets streaming", "datasets"),
    ("a-5KB", "MosaicML streaming", "streaming"),
    ("b", "webdataset + DataLoader", "torch"),
    ("b", "shardkit.torch + DataLoader", "torch"),
]


def _smoke(tmp_path_factory, cases: str):
    out = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, RUN, "--size", "smoke", "--cases", cases, "--out", str(out / "results"), "--data", str(out / "data")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "results" / "results.json") as f:
        doc = json.load(f)
    with open(out / "results" / "results.md") as f:
        table = f.read()
    return proc.stdout, table, doc


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    return _smoke(tmp_path_factory, "a,b,c,d,e")


@pytest.fixture(scope="module")
def smoke_f(tmp_path_factory):
    """Case f on its own: its own run, so its time does not add to the other cases' in one test."""
    return _smoke(tmp_path_factory, "f")


def _rows(doc):
    return {(r["group"], r["contender"]): r for r in doc["rows"]}


def _measured(row):
    m = row["median"]
    assert row["status"] == "ok", row["reason"]
    assert m["samples_per_s"] > 0 and m["mb_per_s"] > 0 and m["peak_rss_mb"] > 0
    assert len(row["runs"]) == 1


def test_prints_and_writes_the_same_table(smoke):
    stdout, table, _ = smoke
    assert stdout.strip() == table.strip()
    assert (
        "| case | data | contender | samples/s | MB/s | peak RSS MB | first sample s | bytes/sample | classes/256 | CPU µs/sample |"
        in table
    )
    assert "| goal | met? |" in table


def test_rows_always_measured(smoke):
    _, table, doc = smoke
    rows = _rows(doc)
    for key in ALWAYS:
        _measured(rows[key])
        assert f"| {key[1]} |" in table


def test_shardkit_rows_measured_where_the_feature_exists(smoke):
    _, _, doc = smoke
    rows = _rows(doc)
    for key in [*LOADER_ROWS, ("d", "shardkit.shuffle")]:
        feature = "loader" if "loader" in key[1] else "shuffle"
        if hasattr(shardkit, feature):
            _measured(rows[key])
        else:
            assert rows[key]["status"] == "skipped" and feature in rows[key]["reason"]


def test_peers_measured_or_skipped_with_a_reason(smoke):
    _, _, doc = smoke
    rows = _rows(doc)
    for group, name, module in PEERS:
        row = rows[(group, name)]
        if importlib.util.find_spec(module) is None:
            assert row["status"] == "skipped" and module in row["reason"]
        else:  # installed: it runs (mosaicml-streaming without transformers too, see bench_read._import_streaming)
            assert row["status"] == "ok", row


def test_ratios_and_goals(smoke):
    _, table, doc = smoke
    rows = _rows(doc)
    assert rows[("a-5KB", "webdataset")]["ratios"]["vs_raw"]["mb_per_s"] > 0
    assert rows[("c", "shardkit.PileWriter M=64")]["ratios"]["vs_best_peer"]["samples_per_s"] > 0
    goals = {(g["group"], g["row"], g["goal"]) for g in doc["goals"]}
    assert ("c", "shardkit.PileWriter M=64", "≥ 8× TarWriter samples/s") in goals
    assert ("c", "shardkit.PileWriter M=256", "time ≤ 1.25× M=1's") in goals
    assert ("a-50KB", "shardkit.loader", "≥ 50% of raw read MB/s") in goals
    assert ("d", "shardkit.shuffle", "peak RSS ≤ 1/8 of the data") in goals
    for g in doc["goals"]:
        if g["group"] == "b" and importlib.util.find_spec("torch") is None:
            continue  # its peer runs in torch's DataLoader: unmeasured (and said so) without torch
        writer = g["row"].startswith("shardkit.PileWriter")
        if writer or (g["row"].startswith("shardkit.loader") and hasattr(shardkit, "loader")):
            assert g["measured"] is not None and g["met"] in (True, False), g
    assert "Goals:" in table and "Notes:" in table


def test_json_has_machine_and_command(smoke):
    _, _, doc = smoke
    context = doc["context"]
    assert context["size"] == "smoke" and context["repeats"] == 1
    assert context["machine"]["cores"] >= 1 and "webdataset" in context["machine"]["versions"]
    assert context["command"].startswith("python benchmarks/run.py --size smoke")


F_PEERS = [
    ("shardkit.torch + DataLoader", "torch"),
    ("shardkit.torch + DataLoader views=True", "torch"),
    ("litdata", "litdata"),
    ("litdata StreamingDataLoader", "litdata"),
    ("webdataset + DataLoader", "torch"),
    ("MosaicML + DataLoader", "streaming"),
]


def test_case_f_rows_and_goals(smoke_f):
    _, table, doc = smoke_f
    rows = _rows(doc)
    for name in ("raw sequential read", "cat", "shardkit.loader", "shardkit.loader views=True"):
        _measured(rows[("f", name)])
        assert f"| {name} |" in table
    for name, module in F_PEERS:
        row = rows[("f", name)]
        if importlib.util.find_spec(module) is None:
            assert row["status"] == "skipped" and module in row["reason"]
        else:  # installed: it runs (mosaicml-streaming without transformers too, see bench_read._import_streaming)
            assert row["status"] == "ok", row
    goals = {(g["row"], g["goal"]): g for g in doc["goals"] if g["group"] == "f"}
    assert goals[("shardkit.loader views=True", "≥ 0.4× cat MB/s")]["measured"] > 0
    assert goals[("shardkit.loader", "first sample ≤ 0.05 s")]["measured"] > 0
    if importlib.util.find_spec("torch") is not None:
        assert goals[("shardkit.torch + DataLoader", "≥ 0.8× one shardkit.loader process")]["measured"] > 0
