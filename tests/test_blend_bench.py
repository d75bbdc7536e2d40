"""The blend benchmark (benchmarks/blend.py --size smoke) runs end to end and prints both mixtures' figures."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "blend.py")


def test_the_smoke_run_prints_both_compositions_and_the_loader_check():
    out = subprocess.run([sys.executable, SCRIPT, "--size", "smoke"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert "shardkit mean / max" in out and "iid draw mean / max" in out
    assert out.count("| 70/30 |") == 4 and "| 8 even |" in out
    assert "loader, 70/30" in out and "samples/s" in out
