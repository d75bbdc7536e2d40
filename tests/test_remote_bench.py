"""The object-storage benchmark (benchmarks/remote.py --size smoke) runs end to end and prints its tables."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "remote.py")


def test_the_smoke_run_prints_its_table(tmp_path):
    done = subprocess.run(
        [sys.executable, SCRIPT, "--size", "smoke", "--work", str(tmp_path / "work")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("| contender | setting | samples/s") for line in lines), done.stdout
    for row in (
        "shardkit.loader, default remote_concurrency",
        "(a) s3fs cat_file",
        "(b) s3fs cat_ranges",
        "(c) webdataset via fsspec",
        "pass 1 to S3",
    ):
        assert any(line.startswith(f"| {row}") for line in lines), row
    assert sum(line.startswith("| loader / ") or line.startswith("| epoch 2 from cache_dir") for line in lines) == 4, done.stdout
    assert "20 ms to the first byte" in done.stdout and "40 MB/s per connection" in done.stdout
