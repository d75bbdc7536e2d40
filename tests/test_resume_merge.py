"""A pass 1 stopped during its merge resumes from the piles it finished: no unit done again, no warning."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

import shardkit
from shardkit.piles import publish

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import kill_resume


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    """The benchmark's job without its 80 ms a unit: here the stop comes in the merge, not in the units."""
    monkeypatch.setattr(kill_resume, "DELAY", 0.0)


def _stop_merge_after(monkeypatch, piles: int) -> None:
    """Ctrl-C in the merge once ``piles`` piles are finished (one merge thread: workers=1)."""
    finish, done = publish.finish_pile, []

    def finish_then_stop(work):
        if len(done) == piles:
            raise KeyboardInterrupt
        done.append(work.pile)
        return finish(work)

    monkeypatch.setattr(publish, "finish_pile", finish_then_stop)


@pytest.mark.parametrize(("stopped_after", "compression"), [(0, None), (3, None), (5, "zstd")])
def test_a_merge_stopped_by_ctrl_c_resumes_without_redoing_units(tmp_path, monkeypatch, caplog, stopped_after, compression):
    reference = str(tmp_path / "reference")
    kill_resume.run_job(reference, workers=1, executor="local", resume=False, compression=compression)
    out = str(tmp_path / "out")
    with monkeypatch.context() as patch:
        _stop_merge_after(patch, stopped_after)
        with pytest.raises(KeyboardInterrupt):
            kill_resume.run_job(out, workers=1, executor="local", resume=False, log=str(tmp_path / "first"), compression=compression)
    assert not shardkit.manifest.is_dataset(out)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="shardkit"):
        redone = kill_resume.run_job(out, workers=1, executor="local", resume=True, log=str(tmp_path / "log"), compression=compression)
    assert redone == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    said = [r.getMessage() for r in caplog.records if "resuming" in r.getMessage()]
    merged = f", {stopped_after} piles already merged" if stopped_after else ""
    assert said == [
        f"{out}: resuming: keeping {kill_resume.UNITS} of {kill_resume.UNITS} input units (1 committed parts{merged}), processing 0 again"
    ]
    assert kill_resume.files(out) == kill_resume.files(reference)


def test_finished_piles_of_another_compression_are_made_again(tmp_path, monkeypatch, caplog):
    out = str(tmp_path / "out")
    with monkeypatch.context() as patch:
        _stop_merge_after(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            kill_resume.run_job(out, workers=1, executor="local", resume=False, log=str(tmp_path / "first"), compression="zstd")
    with caplog.at_level(logging.INFO, logger="shardkit"):
        redone = kill_resume.run_job(out, workers=1, executor="local", resume=True, log=str(tmp_path / "log"))
    # the piles made for zstd are of no use to plain tars: their parts were merged, so their units are done again
    assert sorted(redone) == list(range(kill_resume.UNITS))
    reference = str(tmp_path / "reference")
    kill_resume.run_job(reference, workers=1, executor="local", resume=False)
    assert kill_resume.files(out) == kill_resume.files(reference)


def test_an_upload_stopped_by_ctrl_c_resumes_from_the_finished_piles(s3, tmp_path, monkeypatch, caplog):
    pytest.importorskip("s3fs", reason="the remote extra is needed for s3:// outputs")
    from shardkit import storage

    out = s3.url("stopped")
    sent = []

    def then_stop(upload):  # the third upload is stopped, plain or conditional (moto takes If-None-Match)
        def upload_then_stop(local, url, **kwargs):
            if len(sent) == 2:
                raise KeyboardInterrupt
            sent.append(url)
            return upload(local, url, **kwargs)

        return upload_then_stop

    with monkeypatch.context() as patch:
        patch.setattr(storage, "upload", then_stop(storage.upload))
        patch.setattr(storage, "upload_if_absent", then_stop(storage.upload_if_absent))
        with pytest.raises(KeyboardInterrupt):
            kill_resume.run_job(out, workers=1, executor="local", resume=False, log=str(tmp_path / "first"))
    assert not shardkit.manifest.is_dataset(out)
    with caplog.at_level(logging.INFO, logger="shardkit"):
        redone = kill_resume.run_job(out, workers=1, executor="local", resume=True, log=str(tmp_path / "log"))
    assert redone == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any(f"{kill_resume.PILES} piles already merged" in r.getMessage() for r in caplog.records)
    reference = str(tmp_path / "reference")
    kill_resume.run_job(reference, workers=1, executor="local", resume=False)
    assert shardkit.verify(out, quiet=True) == []
    assert shardkit.manifest.read(out).piles == shardkit.manifest.read(reference).piles
