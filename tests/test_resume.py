"""resume=True: a pass 1 killed (SIGKILL, Ctrl-C) resumes from its commits, byte-identical; leftovers are refused otherwise.

The jobs run in child processes through ``benchmarks/kill_resume.py`` (its full campaign kills
at 20+ random moments); here the kills wait until some units are committed, so each test knows
there is work to reuse.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

import shardkit
from shardkit.errors import ConfigError, DatasetExistsError
from shardkit.piles import commits, fingerprint, resume

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import kill_resume


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("reference") / "out")
    kill_resume.run_job(out, workers=1, executor="local", resume=False)
    return kill_resume.files(out)


def _interrupt(out: str, tmp_path: Path, *, sig: int = signal.SIGKILL, workers: int = 2, least: int = 8) -> int:
    """Start the job in a child, stop it with ``sig`` once ``least`` units are committed; returns how many were."""
    proc = kill_resume.child(out, workers, "local", resume=False, log=str(tmp_path / "first.log"))
    try:
        deadline = time.monotonic() + 60
        while kill_resume.committed(out) < least:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the job committed nothing in 60 s"
            time.sleep(0.02)
        proc.send_signal(sig)
        proc.wait(30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode != 0
    assert not os.path.exists(os.path.join(out, shardkit.manifest.MANIFEST))  # nothing looks like a dataset
    return kill_resume.committed(out)


def _resume(out: str, tmp_path: Path, *, workers: int) -> list[int]:
    return kill_resume.run_job(out, workers=workers, executor="local", resume=True, log=str(tmp_path / "resumed.log"))


@pytest.mark.parametrize(("sig", "workers"), [(signal.SIGKILL, 1), (signal.SIGINT, 2)])
def test_a_killed_job_resumes_where_it_stopped_byte_identical(tmp_path, reference, sig, workers):
    out = str(tmp_path / "out")
    done = _interrupt(out, tmp_path, sig=sig)
    assert done >= 8
    assert os.path.isdir(os.path.join(out, resume.STAGING))  # a folder the job made stays while it holds work to resume
    redone = _resume(out, tmp_path, workers=workers)  # another number of workers than the killed run
    assert len(redone) == kill_resume.UNITS - done  # only what no commit named
    assert kill_resume.files(out) == reference
    assert not os.path.exists(os.path.join(out, resume.STAGING))


def test_a_resume_stopped_before_it_wrote_its_job_record_resumes_again(tmp_path, reference, monkeypatch):
    # the resumed job clears what it does not keep, then replaces the job record: a Ctrl-C between
    # the two once left commits without a record ("another job: fn was None, ..."), never resumable
    out = str(tmp_path / "out")
    done = _interrupt(out, tmp_path)

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(resume, "_said_resume", stopped)
    with pytest.raises(KeyboardInterrupt):
        _resume(out, tmp_path, workers=1)
    monkeypatch.undo()
    assert len(_resume(out, tmp_path, workers=1)) == kill_resume.UNITS - done
    assert kill_resume.files(out) == reference


def test_random_kills_then_resume_are_byte_identical(tmp_path, reference):
    rng = random.Random(5)
    for _ in range(2):
        row = kill_resume.one_round(reference, str(tmp_path), rng, kills=2, executors=["local"])
        assert row["identical"] and not row["staging_left"], row
        assert row.get("finished_early") or row["redone"] == row["expected"], row


def test_leftovers_are_refused_without_resume_and_discarded_with_overwrite(tmp_path, reference):
    out = str(tmp_path / "out")
    _interrupt(out, tmp_path)
    with pytest.raises(DatasetExistsError) as info:
        kill_resume.run_job(out, workers=1, executor="local", resume=False)
    said = str(info.value)
    assert out in said and "interrupted pass 1" in said and "resume=True" in said and "--resume" in said and "overwrite=True" in said
    assert "of 48 input units committed" in said
    shardkit.preprocess(
        list(range(kill_resume.UNITS)), kill_resume.slow_samples, out, piles=kill_resume.PILES, seed=11, overwrite=True, quiet=True
    )
    assert kill_resume.files(out) == reference


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"seed": 12}, "seed was 11, is 12"),
        ({"piles": 7}, "piles was 6, is 7"),
        ({"repeat": "cls:1=2"}, "repeat was None, is shardkit.piles.repeat.ByField"),
        ({"units": list(range(kill_resume.UNITS - 1))}, "units was 48, is 47"),
        ({"units": list(range(1, kill_resume.UNITS + 1))}, "the input units differ"),
        ({"fn": lambda unit: kill_resume.slow_samples(unit)}, "fn was kill_resume._logging, is test_resume.<lambda>"),
    ],
)
def test_a_different_job_is_refused_naming_what_differs(tmp_path, change, said):
    out = str(tmp_path / "out")
    _interrupt(out, tmp_path)
    kwargs = {"units": list(range(kill_resume.UNITS)), "fn": kill_resume._logging(str(tmp_path / "x.log")), "seed": 11, "piles": 6}
    kwargs.update(change)
    with pytest.raises(ConfigError) as info:
        shardkit.preprocess(kwargs.pop("units"), kwargs.pop("fn"), out, resume=True, quiet=True, **kwargs)
    assert "cannot resume" in str(info.value) and said in str(info.value)
    assert "Compared: the input units (in order), fn (qualified name and a hash of its code)" in str(info.value)
    assert kill_resume.committed(out) > 0  # the leftovers are untouched


def test_fn_with_other_code_under_the_same_name_is_refused():
    def make(k):
        def fn(unit):
            yield {"__key__": str(unit), "txt": "x" * k}

        return fn

    a, b = fingerprint.describe_fn(make(1)), fingerprint.describe_fn(make(2))
    assert a["name"] == b["name"] and a["code"] == b["code"]  # a closure's cell is data, not code
    c = fingerprint.describe_fn(lambda unit: [{"__key__": str(unit)}])
    assert c["code"] and c["code"] != a["code"]
    said = fingerprint.differences({"fn": a}, {"fn": c})
    assert said == [f"fn was {a['name']}, is {c['name']}"]
    said = fingerprint.differences({"fn": a}, {"fn": {**a, "code": "0" * 16}})
    assert said == [f"fn {a['name']} has other code than it had"]


def test_a_committed_part_that_fails_its_check_is_done_again(tmp_path, reference, caplog):
    out = str(tmp_path / "out")
    done = _interrupt(out, tmp_path, workers=1)
    staging = resume.staging_path(out)
    (directory,) = commits.committed(staging)  # one worker: one part directory
    part = next(p for p in sorted(Path(directory).glob("*.part")) if p.stat().st_size)
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    redone = _resume(out, tmp_path, workers=2)
    assert len(redone) == kill_resume.UNITS  # its units were all in the damaged directory
    assert done > 0 and "does not match its checksum" in caplog.text
    assert kill_resume.files(out) == reference


def test_two_commits_naming_one_unit_keep_the_first(tmp_path, reference, caplog):
    # what a Ray task of a killed run can leave: a second committed directory with units a later
    # run wrote too; the later one by name is dropped and its units are done once
    out = str(tmp_path / "out")
    done = _interrupt(out, tmp_path, workers=1)
    staging = resume.staging_path(out)
    (directory,) = commits.committed(staging)
    shutil.copytree(directory, os.path.join(staging, "part-zzzzzzzz-w0"))
    redone = _resume(out, tmp_path, workers=1)
    assert len(redone) == kill_resume.UNITS - done
    assert "part-zzzzzzzz-w0: holds units another committed part holds" in caplog.text
    assert kill_resume.files(out) == reference


def test_an_uncommitted_tail_is_cut_off(tmp_path, reference):
    out = str(tmp_path / "out")
    _interrupt(out, tmp_path, workers=1)
    (directory,) = commits.committed(resume.staging_path(out))
    for part in [*Path(directory).glob("*.part"), Path(directory) / "keys"]:  # written after the last commit, by a unit that never finished
        with open(part, "ab") as f:
            f.write(b"\0" * 704)
    _resume(out, tmp_path, workers=1)
    assert kill_resume.files(out) == reference


def test_a_key_file_shorter_than_its_commit_says_is_done_again(tmp_path, reference, caplog):
    out = str(tmp_path / "out")
    done = _interrupt(out, tmp_path, workers=1)
    (directory,) = commits.committed(resume.staging_path(out))
    have = commits.read_commit(directory).hashed * 8 - 8
    os.truncate(Path(directory) / "keys", have)  # the disk lost the last hash the commit counts
    redone = _resume(out, tmp_path, workers=1)
    assert done > 0 and len(redone) == kill_resume.UNITS
    assert f"keys holds {have} bytes, the commit says {have + 8}" in caplog.text
    assert kill_resume.files(out) == reference


def test_a_failed_job_without_commits_leaves_nothing(tmp_path):
    def bad(unit):
        raise ValueError("no")
        yield

    out = tmp_path / "out"
    with pytest.raises(shardkit.InputError):
        shardkit.preprocess([1, 2], bad, out, piles=2, quiet=True)
    assert not out.exists()  # the folder it made goes again


def test_cli_takes_resume(tmp_path):
    from shardkit.cli import main

    src = tmp_path / "src"
    shardkit.preprocess(list(range(6)), kill_resume.slow_samples, src, piles=2, quiet=True)
    out = str(tmp_path / "out")
    assert main(["pile", str(src / "*.tar"), "-o", out, "--piles", "3", "--resume", "-q"]) == 0
    assert shardkit.manifest.read(out).samples == 6 * kill_resume.SAMPLES
