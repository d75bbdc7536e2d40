"""A small slice of the reliability campaign (benchmarks/stress.py --quick): every row must find nothing."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "stress.py")


def test_the_quick_campaign_finds_nothing(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, "--quick", "--work", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| row")]
    assert len(rows) == 15 and all(" | 0 | " in row for row in rows), done.stdout
