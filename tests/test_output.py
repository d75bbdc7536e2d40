"""One writer per dataset, atomic overwrite, and what a dead job leaves: the output directory's life."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types

import numpy as np
import pytest

import shardkit
from shardkit import manifest
from shardkit.cli import main
from shardkit.dataset.lock import LOCK, STAGING_PREFIX, claim
from tests.conftest import make_samples

FORK = multiprocessing.get_context("fork")


def _write(out: str, seed: int, overwrite: bool, start=None, results=None) -> None:
    if start is not None:
        start.wait()
    try:
        with shardkit.PileWriter(out, piles=4, seed=seed, overwrite=overwrite) as w:
            for s in make_samples(300, seed=seed):
                w.write(s)
        results.put(("ok", seed))
    except shardkit.DatasetExistsError as e:
        results.put(("refused", str(e)))


def test_two_writers_started_together_one_wins_the_other_is_told_why(tmp_path):
    for run in range(20):
        out = str(tmp_path / f"ds{run}")
        start, results = FORK.Event(), FORK.Queue()
        procs = [FORK.Process(target=_write, args=(out, seed, False, start, results)) for seed in (1, 2)]
        for p in procs:
            p.start()
        start.set()
        for p in procs:
            p.join(60)
        outcomes = sorted(results.get(timeout=5) for _ in procs)
        assert [kind for kind, _ in outcomes] == ["ok", "refused"], outcomes
        refusal = outcomes[1][1]
        # the lock holder is named, or (when it already finished) the dataset it published
        assert "another job is writing here (pid" in refusal or "already holds a shardkit dataset" in refusal
        assert shardkit.verify(out, quiet=True) == []
        assert manifest.read(out).samples == 300 and not os.path.exists(os.path.join(out, LOCK))


def test_a_lock_of_a_live_job_names_it(tmp_path):
    out = str(tmp_path / "ds")
    output = claim(out, overwrite=False)
    with pytest.raises(shardkit.DatasetExistsError, match=rf"another job is writing here \(pid {os.getpid()} on .*wait for it to finish"):
        shardkit.PileWriter(out, piles=2)
    output.release()
    with shardkit.PileWriter(out, piles=2) as w:  # released: free again
        w.write({"__key__": "a", "cls": 1})


def test_a_dead_jobs_lock_and_leftovers_are_taken_over(tmp_path):
    out = tmp_path / "ds"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    holder = {"pid": dead.pid, "host": os.uname().nodename, "started": "then", "command": "shardkit pile ...", "token": "x"}
    (out / LOCK).write_text(json.dumps(holder))
    dead_staging = out / f"{STAGING_PREFIX}{'0123' * 8}"
    dead_staging.mkdir()
    (dead_staging / "000000.part").write_bytes(b"x" * 100)
    (dead_staging / ".shardkit-owner.json").write_text("{}")  # the record every staging is made with
    (out / f"{STAGING_PREFIX}{'4567' * 8}").mkdir()  # killed before it wrote its record: empty
    (out / f"{STAGING_PREFIX}{'89ab' * 8}").mkdir()  # a name of the form, but no record says shardkit made it
    (out / f"{STAGING_PREFIX}{'89ab' * 8}" / "mine.txt").write_bytes(b"kept")
    (out / "shardkit.json.partial-0123456789abcdef0123456789abcdef").write_bytes(b"{")
    with shardkit.PileWriter(out, piles=2) as w:
        w.write({"__key__": "a", "cls": 1})
    assert sorted(os.listdir(out)) == [f"{STAGING_PREFIX}{'89ab' * 8}", "pile-000000.tar", "pile-000001.tar", "shardkit.json"]
    (out / LOCK).write_bytes(b'{"pid": 12')  # a job killed while writing its lock
    shardkit.PileWriter(out, piles=2, overwrite=True).abort()
    assert not (out / LOCK).exists()


def test_a_job_killed_while_holding_the_lock_leaves_it_free(tmp_path):
    out = tmp_path / "ds"
    code = f"import shardkit, time; w = shardkit.PileWriter({str(out)!r}, piles=2); print('held', flush=True); time.sleep(60)"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    with pytest.raises(shardkit.DatasetExistsError, match=rf"another job is writing here \(pid {holder.pid} "):
        shardkit.PileWriter(out, piles=2)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with shardkit.PileWriter(out, piles=2) as w:  # the system dropped the dead job's lock; its staging goes too
        w.write({"__key__": "a", "cls": 1})
    assert sorted(os.listdir(out)) == ["pile-000000.tar", "pile-000001.tar", "shardkit.json"]


def test_leftovers_beside_a_sound_dataset_are_warnings(dataset, capsys):
    os.makedirs(os.path.join(dataset, f"{STAGING_PREFIX}abc"))
    problems = shardkit.verify(dataset, quiet=True)
    assert [(p.kind, p.warning) for p in problems] == [("leftover", True)]
    assert main(["verify", dataset]) == 0
    out = capsys.readouterr().out
    assert "warning: .shardkit-staging-abc" in out and out.strip().endswith("ok (1 warning(s))")


_OVERWRITE = textwrap.dedent(
    """
    import sys, shardkit
    from tests.conftest import make_samples
    out, seed = sys.argv[1], int(sys.argv[2])
    print("start", flush=True)
    with shardkit.PileWriter(out, piles=64, seed=seed, overwrite=True) as w:
        for s in make_samples(3000, size=2000, seed=seed):
            w.write(s)
    """
)


def test_a_kill_at_any_moment_of_an_overwrite_leaves_the_old_or_the_new_dataset_whole(tmp_path):
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=8, seed=0) as w:
        for s in make_samples(100):
            w.write(s)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    delays = np.random.default_rng(0).uniform(0.0, 1.0, size=6)
    seen = set()
    for seed, delay in enumerate(delays, start=1):
        child = subprocess.Popen([sys.executable, "-c", _OVERWRITE, out, str(seed)], cwd=root, stdout=subprocess.PIPE)
        assert child.stdout is not None and child.stdout.readline() == b"start\n"
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        found = manifest.read(out).samples  # a dataset is always there
        assert found in (100, 3000)
        seen.add(found)
        assert [p for p in shardkit.verify(out, quiet=True) if not p.warning] == []
        assert sorted(s["__key__"] for s in shardkit.loader(out, decode=False)) == sorted(s["__key__"] for s in make_samples(found))
    with shardkit.PileWriter(out, piles=2, overwrite=True) as w:  # the next job clears what the kills left
        w.write({"__key__": "a", "cls": 1})
    assert shardkit.verify(out, quiet=True) == []


_ORPHAN = textwrap.dedent(
    """
    import os, sys, time, shardkit
    def slow(unit):
        time.sleep(30)
        yield {"__key__": f"u{unit}", "cls": unit}
    print(os.getpid(), flush=True)
    shardkit.preprocess(list(range(8)), slow, sys.argv[1], piles=2, workers=2, quiet=True, mp_context="fork")
    """
)


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError):
                pass
    return found


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the workers")
def test_workers_end_within_a_second_of_their_parents_death(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN, str(tmp_path / "out")], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    deadline = time.monotonic() + 30
    workers: list[int] = []
    while len(workers) < 2 and time.monotonic() < deadline:
        workers = _children(pid)
        time.sleep(0.05)
    assert len(workers) >= 2
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    time.sleep(1.0)
    assert [w for w in workers if _running(w)] == []


def test_ctrl_c_at_any_moment_exits_130_without_a_traceback(tmp_path):
    for i, delay in enumerate(np.random.default_rng(1).uniform(0.3, 1.2, size=4)):
        child = subprocess.Popen(
            [sys.executable, "-m", "shardkit", "demo", "--samples", "1000", "--out", str(tmp_path / f"d{i}"), "-q"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal starts it
        )
        time.sleep(delay)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=120)
        # -SIGINT: the signal came while the interpreter was starting or had restored the default
        # handler on its way out; a shell shows that as 130 too
        assert child.returncode in (0, 130, -signal.SIGINT) and b"Traceback" not in err, err.decode()[-2000:]


@pytest.mark.parametrize("manifest_in_place", ["old", "new"])
def test_an_install_cut_short_is_undone_or_finished_by_the_next_job(tmp_path, manifest_in_place):
    out, other = tmp_path / "ds", tmp_path / "other"
    for path, seed in ((out, 1), (other, 2)):
        with shardkit.PileWriter(path, piles=1, seed=seed) as w:
            w.write({"__key__": f"k{seed}", "cls": seed})
    os.replace(other / "pile-000000.tar", out / "pile-000000.v1.tar")  # moved in by the dead job
    (out / ".shardkit-install-dead.json").write_text(json.dumps({"files": ["pile-000000.v1.tar"], "delete": ["pile-000000.tar"]}))
    if manifest_in_place == "new":  # it died after its manifest went in, before the old pile went
        new = manifest.read(str(other))
        manifest.write(
            str(out),
            shardkit.Manifest(**{**vars(new), "piles": (shardkit.PileInfo(**{**vars(new.piles[0]), "name": "pile-000000.v1.tar"}),)}),
        )
    claim(out, overwrite=True).release()
    kept = "pile-000000.tar" if manifest_in_place == "old" else "pile-000000.v1.tar"
    assert sorted(os.listdir(out)) == [kept, "shardkit.json"]
    assert shardkit.verify(str(out), quiet=True) == []


def _failed_writer(out, error: BaseException, *, meanwhile=None) -> None:
    """A PileWriter into ``out`` that wrote a sample, ran ``meanwhile()`` and was left by ``error``."""
    with pytest.raises(type(error)), shardkit.PileWriter(out, piles=4, buffer_size=1000) as w:
        for s in make_samples(50):  # part files reach the disk
            w.write(s)
        if meanwhile is not None:
            meanwhile()
        raise error


@pytest.mark.parametrize("error", [RuntimeError("stop"), KeyboardInterrupt()], ids=["exception", "ctrl-c"])
def test_a_failed_create_removes_the_folder_it_made_and_a_rerun_writes_it(tmp_path, error):
    out = tmp_path / "new" / "ds"  # its parent is made too, and stays: another job may be making a folder beside it
    _failed_writer(out, error)
    assert os.listdir(tmp_path) == ["new"] and os.listdir(tmp_path / "new") == []
    with shardkit.PileWriter(out, piles=4) as w:
        w.write({"__key__": "a", "cls": 1})
    assert manifest.read(str(out)).samples == 1


def test_a_failed_create_keeps_a_folder_that_was_there(tmp_path):
    out = tmp_path / "ds"
    out.mkdir()
    _failed_writer(out, RuntimeError("stop"))
    assert os.listdir(out) == []  # its lock and staging gone, the folder kept
    claim(out, overwrite=False).release()
    assert out.is_dir()


def test_a_file_put_in_a_made_folder_during_the_job_keeps_it_and_the_file(tmp_path):
    out = tmp_path / "new" / "ds"
    mine = out / "notes.txt"
    _failed_writer(out, RuntimeError("stop"), meanwhile=lambda: mine.write_text("mine"))
    assert mine.read_text() == "mine"
    assert os.listdir(mine.parent) == ["notes.txt"]
    with shardkit.PileWriter(out, piles=2) as w:
        w.write({"__key__": "a", "cls": 1})
    assert mine.read_text() == "mine"


def test_a_job_waiting_for_the_lock_of_one_that_fails_makes_the_folder_again(tmp_path, monkeypatch):
    from shardkit.dataset import lock

    out = str(tmp_path / "ds")
    first = claim(out, overwrite=False)  # made the folder
    waiting, released = threading.Event(), threading.Event()

    def sleep(seconds: float) -> None:  # the second job found the lock held: it looks again once the first let go
        waiting.set()
        released.wait(30)

    monkeypatch.setattr(lock, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    got: list = []
    second = threading.Thread(target=lambda: got.append(claim(out, overwrite=False)))
    second.start()
    assert waiting.wait(30)
    first.release()  # published nothing: the folder goes
    assert not os.path.exists(out)
    released.set()
    second.join(30)
    assert len(got) == 1 and os.path.isdir(out)
    got[0].release()
    assert not os.path.exists(out)


def test_a_failed_job_leaves_the_parent_another_job_is_making_its_folder_in(tmp_path, monkeypatch):
    """Job A (-o runs/train) made runs/ and fails as job B (-o runs/val), which found runs/ there,
    makes its folder: B must not lose its parent."""
    runs = tmp_path / "runs"
    a = claim(str(runs / "train"), overwrite=False)
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        if str(path).endswith("val") and not a.released:
            a.release()
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    b = claim(str(runs / "val"), overwrite=False)
    assert os.listdir(runs) == ["val"]  # A's folder gone, B's made, their parent kept
    b.release()
    assert os.listdir(runs) == []


def test_an_output_reached_through_a_link_and_dotdot_is_made_where_the_system_puts_it(tmp_path, monkeypatch):
    (tmp_path / "disk" / "deep").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "disk" / "deep")
    monkeypatch.chdir(tmp_path)
    with shardkit.PileWriter("link/../out", piles=2, seed=0) as w:
        w.write({"__key__": "a", "txt": "x"})
    assert manifest.read(str(tmp_path / "disk" / "out")).samples == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("suffix", ["/", "/.", "//"])
def test_a_failed_create_into_out_slash_removes_the_folder_it_made(tmp_path, monkeypatch, suffix):
    """Shell completion writes -o runs/train/: the same folder, whose parent is runs."""
    monkeypatch.chdir(tmp_path)
    _failed_writer("runs/train" + suffix, RuntimeError("stop"))
    assert os.listdir(tmp_path / "runs") == []  # the output gone, its parent kept
    with shardkit.PileWriter("runs/train" + suffix, piles=2) as w:
        w.write({"__key__": "a", "cls": 1})
    assert manifest.read(str(tmp_path / "runs" / "train")).samples == 1
