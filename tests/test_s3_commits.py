"""One writer on S3 by the store itself: conditional writes, racing jobs, gc beside a running job, fresh listings (moto on loopback)."""

from __future__ import annotations

import os
import random
import socket
import sys

import pytest

import shardkit
from shardkit import manifest, storage
from shardkit.dataset.lock import claim
from shardkit.dataset.transaction import Dataset

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))


def _samples(prefix: str, n: int) -> list[dict]:
    return [{"__key__": f"{prefix}{i:04d}", "bin": bytes([i % 251]) * 300} for i in range(n)]


def _same(unit):
    return unit


def test_put_if_absent_and_if_unchanged_let_one_writer_through(s3):
    url = s3.url("c/shardkit.json")
    assert storage.can_put_if_absent(url)  # moto takes If-None-Match and If-Match
    assert storage.version(url) is None
    assert storage.put_if_absent(url, b"first")
    assert not storage.put_if_absent(url, b"second")
    seen = storage.version(url)
    assert storage.put_if_unchanged(url, b"third", seen=seen)
    assert not storage.put_if_unchanged(url, b"fourth", seen=seen)  # the version it began from is gone
    assert storage.read_bytes(url) == b"third"
    assert not storage.put_if_unchanged(s3.url("c/missing.json"), b"x", seen=seen)


def test_put_if_absent_on_local_files_is_atomic_and_never_replaces(tmp_path):
    path = str(tmp_path / "a.json")
    assert storage.can_put_if_absent(path)
    assert storage.put_if_absent(path, b"one")
    assert not storage.put_if_absent(path, b"two")
    with open(path, "rb") as f:
        assert f.read() == b"one"
    assert os.listdir(tmp_path) == ["a.json"]  # no temporary left behind


def test_a_listing_leaves_no_cache_that_hides_what_another_process_adds(s3):
    url = s3.url("ds")
    shardkit.preprocess([_samples("a", 20)], _same, url, piles=2, workers=1, quiet=True)
    assert shardkit.verify(url, quiet=True) == []  # lists the dataset in this process
    other = s3.client()  # another client, as another process would be
    other.pipe_file(s3.path("ds/late.bin"), b"12345")
    assert storage.exists(storage.join(url, "late.bin"))
    assert storage.size(storage.join(url, "late.bin")) == 5
    assert "late.bin" in storage.listdir(url)


@pytest.mark.parametrize("kind", ["s3appends", "s3gc", "s3overwrites"])
def test_racing_jobs_on_s3_publish_one_whole_dataset(s3, kind):
    import s3_races

    env = dict(os.environ)
    why = s3_races.trial(kind, s3.url(kind), env, random.Random(0), fresh_process=False)
    assert why is None, why


def test_gc_spares_a_running_jobs_uploads_and_the_next_commit_clears_a_dead_ones(s3):
    url = s3.url("ds")
    shardkit.preprocess([_samples("a", 20)], _same, url, piles=2, workers=1, quiet=True)
    job = claim(url, overwrite=True)  # a job about to publish: its journal names its upload
    name = "pile-000000.g000001-deadbeef.tar"
    job.journal([name])
    s3.client().pipe_file(s3.path(f"ds/{name}"), b"x" * 1024)
    report = shardkit.gc(url, grace=0)
    assert name not in report.deleted and name in s3.names("ds")  # the job may still publish it
    # another job publishes: the first can never commit now, and its upload is a leftover
    shardkit.preprocess([_samples("b", 20)], _same, url, piles=2, workers=1, mode="append", quiet=True)
    assert name not in s3.names("ds")
    assert not any(n.startswith(".shardkit-install-") for n in s3.names("ds"))
    assert shardkit.verify(url, quiet=True) == []


def test_a_first_job_stopped_while_publishing_on_s3_is_named_and_overwrite_clears_it(s3):
    """A first write to an empty prefix killed after its uploads: no lock on S3 tells whether that
    job still runs, so the next job refuses, but names the journal and what to do (it said the
    files would be 'left as they are'); an overwrite then writes the dataset and removes them."""
    url = s3.url("ds")
    job = claim(url, overwrite=False)  # a job about to publish into an empty prefix, killed there
    job.journal(["pile-000000.tar"])
    s3.client().pipe_file(s3.path("ds/pile-000000.tar"), b"x" * 1024)
    with pytest.raises(shardkit.DatasetExistsError) as refused:
        shardkit.preprocess([_samples("a", 20)], _same, url, piles=2, workers=1, quiet=True)
    assert (
        f"{url}: holds pile-000000.tar but no shardkit.json: a file of a job that began to publish here and has not finished (its journal .shardkit-install-"
        in str(refused.value)
    )
    assert "If that job still runs, let it finish; if it was stopped, run it again with resume=True" in str(refused.value)
    assert "or with overwrite=True (--overwrite, YAML overwrite: true under output) to write the dataset anew" in str(refused.value)
    shardkit.preprocess([_samples("a", 20)], _same, url, piles=2, workers=1, overwrite=True, quiet=True)
    assert shardkit.verify(url, quiet=True) == []
    assert not any(n.startswith(".shardkit-install-") for n in s3.names("ds"))


@pytest.mark.parametrize("uploaded", [2, 6])
def test_a_first_job_killed_after_uploads_to_s3_resumes_without_redoing_units(s3, tmp_path, monkeypatch, caplog, uploaded):
    """A first write killed with some or all of its piles uploaded and no manifest: run again with
    resume=True, it goes on from its finished piles (no unit processed again), publishes, and
    removes what the stopped job had uploaded."""
    import signal

    import kill_resume

    monkeypatch.setattr(kill_resume, "DELAY", 0.0)
    url = s3.url("ds")
    killed = kill_resume.child(url, 1, "local", resume=False, log=str(tmp_path / "first"), delay=0.0, stop_at=f"upload:{uploaded}")
    _, err = killed.communicate(timeout=180)
    assert killed.returncode == -signal.SIGKILL, err.decode()[-2000:]
    left = [n for n in s3.names("ds") if n.startswith("pile-")]
    assert len(left) >= uploaded and not manifest.is_dataset(url)
    with pytest.raises(shardkit.DatasetExistsError, match="run it again with resume=True"):
        kill_resume.run_job(url, workers=1, executor="local", resume=False)
    with monkeypatch.context() as elsewhere:  # another machine has no staging to go on from: refused, not started over
        elsewhere.setattr(socket, "gethostname", lambda: "machine-b")
        with pytest.raises(
            shardkit.DatasetExistsError, match=r"resume=True finds no staging of it on this machine \(machine-b; the output records /"
        ):
            kill_resume.run_job(url, workers=1, executor="local", resume=True)
    # the stopped job still running on this machine holds its staging: a second launch is refused and touches nothing
    from shardkit.dataset import layout
    from shardkit.dataset.staging import recorded

    held = storage.lock_file(os.path.join(recorded(url), layout.STAGING_JOB_LOCK), wait=False)
    try:
        with pytest.raises(shardkit.DatasetExistsError, match="another pass-1 job is writing into"):
            kill_resume.run_job(url, workers=1, executor="local", resume=True)
    finally:
        os.close(held)
    assert [n for n in s3.names("ds") if n.startswith("pile-")] == left
    caplog.clear()
    with caplog.at_level("INFO", logger="shardkit"):
        redone = kill_resume.run_job(url, workers=1, executor="local", resume=True, log=str(tmp_path / "log"))
    assert redone == []
    units = kill_resume.UNITS
    said = [r.getMessage() for r in caplog.records if "resuming" in r.getMessage()]
    assert said == [
        f"{url}: resuming: keeping {units} of {units} input units (1 committed parts, {kill_resume.PILES} piles already merged), processing 0 again"
    ]
    assert shardkit.verify(url, quiet=True) == []
    keys = sorted(k for b in shardkit.loader(url, decode=False, batch_size=64, drop_last=False) for k in b["__key__"])
    reference = str(tmp_path / "reference")
    kill_resume.run_job(reference, workers=1, executor="local", resume=False)
    assert keys == sorted(k for b in shardkit.loader(reference, decode=False, batch_size=64, drop_last=False) for k in b["__key__"])
    listed = set(manifest.read(url).files())
    assert {n for n in s3.names("ds") if n.startswith("pile-")} == listed, "the stopped job's uploads are gone"
    assert not any(n.startswith(".shardkit-install-") for n in s3.names("ds"))


def test_gc_on_s3_keeps_what_was_written_within_the_grace(s3):
    url = s3.url("ds")
    shardkit.preprocess([_samples("a", 20)], _same, url, piles=2, workers=1, quiet=True)
    shardkit.preprocess([_samples("b", 20)], _same, url, piles=2, workers=1, mode="append", window=1, quiet=True)
    retired = set(Dataset(url).pinned(0).files()) - set(manifest.read(url).files())
    assert retired
    assert shardkit.gc(url, grace="1h").deleted == []  # the retired files were written seconds ago
    assert set(shardkit.gc(url, grace=0).deleted) >= retired


def test_a_commit_and_uploads_whose_answers_are_lost_still_publish(s3, faulty_s3):
    import s3_races

    faulty_s3.only = {"PUT"}
    faulty_s3.reset_midbody = 1.0  # the store takes the PUT, its answer never comes back
    faulty_s3.reset_fraction = 0.3
    url = s3.url("ds")
    shardkit.preprocess([_samples("a", 40)], _same, url, piles=3, workers=1, quiet=True)
    shardkit.preprocess([_samples("b", 40)], _same, url, piles=3, workers=1, mode="append", quiet=True)
    assert faulty_s3.resets > 0
    faulty_s3.reset_fraction = 0.0
    found = s3_races.judge(url, dict(os.environ))  # a fresh process
    assert found["problems"] == []
    assert found["keys"] == sorted(s["__key__"] for s in _samples("a", 40) + _samples("b", 40))
