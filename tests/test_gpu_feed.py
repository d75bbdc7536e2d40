"""benchmarks/gpu_feed.py runs end to end at toy size on CPU, so the GPU benchmark cannot rot.

It checks the table has every system at every worker count, never the figures themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'shardkit[torch]')")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_feed_toy_run_prints_every_system(tmp_path):
    out = tmp_path / "runs.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "gpu_feed.py"), "--toy", "--data", str(tmp_path / "data"), "--json", str(out)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for system in ("device", "shardkit", "webdataset", "shardkit alone", "webdataset alone"):
        assert f"| 1 | {system} |" in proc.stdout
    assert "| 1 | device | " in proc.stdout and "| 1.00 |" in proc.stdout
    runs = json.loads(out.read_text())["runs"]
    assert runs["shardkit@1"][0]["images_per_s"] > 0
    # every sample of the toy data set is read once: 48 images, 3 batches of 16, 10 classes sorted
    assert 1 < runs["shardkit@1"][0]["classes_per_batch"] <= 10
