"""A pass 1 killed while it installs its piles, or after its manifest went in, resumes redoing no unit."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import pytest

import shardkit
from shardkit import manifest
from shardkit.errors import DatasetExistsError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import kill_resume


@pytest.mark.parametrize(
    ("stop_at", "compression", "said"),
    [
        ("install:0", None, "(1 committed parts, 6 piles already merged)"),
        ("install:4", "zstd", "(1 committed parts, 6 piles already merged)"),
        ("published", None, "(the job published its dataset before it stopped)"),
        ("removing", "zstd", "(the job published its dataset before it stopped)"),
    ],
)
def test_a_job_killed_while_it_publishes_resumes_without_redoing_units(tmp_path, monkeypatch, caplog, stop_at, compression, said):
    monkeypatch.setattr(kill_resume, "DELAY", 0.0)
    out = str(tmp_path / "out")
    killed = kill_resume.child(
        out, 1, "local", resume=False, log=str(tmp_path / "first"), delay=0.0, stop_at=stop_at, compression=compression
    )
    _, err = killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL, err.decode()[-2000:]
    if stop_at.startswith("install"):
        assert not manifest.is_dataset(out)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="shardkit"):
        redone = kill_resume.run_job(out, workers=1, executor="local", resume=True, log=str(tmp_path / "log"), compression=compression)
    assert redone == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    lines = [r.getMessage() for r in caplog.records if "resuming" in r.getMessage()]
    units = kill_resume.UNITS
    assert lines == [f"{out}: resuming: keeping {units} of {units} input units {said}, processing 0 again"]
    reference = str(tmp_path / "reference")
    kill_resume.run_job(reference, workers=1, executor="local", resume=False, compression=compression)
    assert kill_resume.files(out) == kill_resume.files(reference)
    assert shardkit.verify(out, quiet=True) == []
    assert [name for name in os.listdir(out) if name.startswith(".shardkit")] == []  # no staging, lock or journal left


def test_resume_does_not_take_another_dataset_for_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(kill_resume, "DELAY", 0.0)
    out = str(tmp_path / "out")
    killed = kill_resume.child(out, 1, "local", resume=False, log=str(tmp_path / "first"), delay=0.0, stop_at="published")
    killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL
    # another job's resume: its fingerprint differs, so the dataset in place is not its own
    with pytest.raises(DatasetExistsError, match="already holds a shardkit dataset"):
        kill_resume.run_job(out, workers=1, executor="local", resume=True, compression="zstd")
