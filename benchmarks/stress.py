"""Attack shardkit on purpose and count what breaks: kills, concurrent writers, mutated tars, a full disk, a soak.

Each row runs many trials and counts the failures, where a failure is anything a user must never
see: a torn dataset (a manifest whose files do not verify), a lost dataset, two writers both
reporting success, an exception that is not a ``ShardkitError`` (a raw traceback), a hang past
the per-case timeout, leftovers after a successful re-run, memory or threads growing over epochs.

    python benchmarks/stress.py                  # the full campaign (minutes)
    python benchmarks/stress.py --quick          # a small slice of every row (seconds; the test suite runs it)
    python benchmarks/stress.py --rows kill,fuzz --kills 200 --fuzz 20000

Rows:
- kill: SIGKILL a pass-1 job (``shardkit.pile``, 2 workers, overwriting an existing dataset) at a
  random moment, the publish included; the output must hold the old or the new dataset whole,
  and the next run must succeed and leave nothing behind.
- writers: two processes start writing one output at the same instant; exactly one must succeed,
  the other must be refused with a DatasetExistsError, and the dataset must verify.
- fuzz: flip bytes, truncate, or rewrite header fields of small tars, then read them with the
  loader (as plain shards), re-pile them and verify them, each under a timeout: each must give a
  result or a ShardkitError.
- diskfull: (root, Linux) a pass-1 job on a 4 MiB tmpfs that cannot hold its output must fail
  with a ShardkitError naming the place, and leave no manifest and no staging behind.
- disk: the peak disk use of a pass-1 job with 2 workers, over the size of the dataset it makes
  (part files are deleted as each pile is assembled, so it should stay near 1x).
- soak: many epochs of a loader with prefetch and worker processes: every epoch exact, resident
  memory and thread count flat.
- states: loader, blend and torch states with one place mutated (``2**40 + 1`` workers, a start
  past int64, a wrong type, a key dropped...), loaded and read to the end of the epoch, each under
  the timeout: a result or one line of ShardkitError (benchmarks/stress_inputs.py).
- jobs: YAML jobs mutated the same way: refused by ``load_job`` (what ``shardkit run --check``
  does) or run; a job ``--check`` accepts must not fail on a bad field when it runs.
- secrets: canary credentials as ``--storage-option`` through CLI jobs at ``-vv`` against a moto
  server (pile, append, verify, gc, info at ``-vvv``, a ``user:password`` endpoint, a job refused
  by a lock); no file, object or printed line may hold one (benchmarks/stress_secrets.py).
- userfiles, manifests, links, appendfull: what shardkit may delete (see stress_trust.py): user
  files beside a dataset under gc and overwrite, crafted manifests, links at every staging path,
  a full disk during an append.
- s3appends, s3gc, s3overwrites: (moto on loopback, see ``benchmarks/s3_races.py``) two appends,
  an append and ``gc(grace=0)``, two overwrites race on one ``s3://`` dataset; judged by verify
  in a fresh process: none torn, no success lost, one of two overwrites refused. Not in
  ``--quick`` (the test suite runs a slice of them in tests/test_s3_commits.py).
- outage, cache: S3 outages of 1-20 s mid-epoch, and changed cache copies read with
  ``verify=False`` (see benchmarks/stress_s3.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the rows kept in modules of their own

import stress_s3
import stress_trust

import shardkit
from shardkit import manifest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORK = multiprocessing.get_context("fork")


@dataclass
class Row:
    name: str
    tried: int = 0
    failed: int = 0
    notes: list[str] = field(default_factory=list)

    def fail(self, note: str) -> None:
        self.failed += 1
        if len(self.notes) < 5:
            self.notes.append(note)


def make_shards(directory: str, shards: int, per_shard: int, size: int, seed: int) -> list[str]:
    """Plain WebDataset shards (Python's tarfile, as many tools write them) with unique keys."""
    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    paths = []
    for k in range(shards):
        path = os.path.join(directory, f"src-{k:04d}.tar")
        with tarfile.open(path, "w") as tar:
            for i in range(per_shard):
                for ext, data in (("bin", rng.randbytes(size)), ("cls", b"%d" % (i % 10))):
                    info = tarfile.TarInfo(f"s{k:04d}_{i:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


# ------------------------------------------------------------------------------------------ kill

_PILE_JOB = textwrap.dedent(
    """
    import sys, shardkit
    print("start", flush=True)
    shardkit.pile(sys.argv[2:], sys.argv[1], piles=32, workers=2, seed=int(sys.argv[1][-3:]) % 97, overwrite=True, quiet=True)
    """
)


def _sound(out: str) -> str | None:
    """Why ``out`` is not a whole dataset, or None."""
    try:
        problems = [p for p in shardkit.verify(out, quiet=True) if not p.warning]
    except shardkit.ShardkitError as e:
        return f"unreadable: {e}"
    return f"{len(problems)} verify problems: {problems[0]}" if problems else None


def row_kill(work: str, trials: int, rng: random.Random) -> Row:
    row = Row("kill: SIGKILL during pass 1 (2 workers, overwrite)")
    inputs = make_shards(os.path.join(work, "kill-in"), 8, 400, 2000, seed=1)
    out = os.path.join(work, "kill-out-001")
    shardkit.pile(inputs, out, piles=8, quiet=True)
    expected = manifest.read(out).samples
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", _PILE_JOB, out, *inputs], cwd=ROOT, check=True, capture_output=True)
    duration = time.perf_counter() - started
    for _ in range(trials):
        row.tried += 1
        child = subprocess.Popen(
            [sys.executable, "-c", _PILE_JOB, out, *inputs], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        assert child.stdout is not None
        child.stdout.readline()
        time.sleep(rng.uniform(0, duration))
        child.send_signal(signal.SIGKILL)
        child.wait()
        why = _sound(out)
        if why is not None or manifest.read(out).samples != expected:
            row.fail(f"after a kill: {why}")
            continue
        done = subprocess.run([sys.executable, "-c", _PILE_JOB, out, *inputs], cwd=ROOT, capture_output=True)
        left = sorted(n for n in os.listdir(out) if n.startswith(".") or ".partial-" in n)
        if done.returncode != 0 or _sound(out) is not None or left or shardkit.verify(out, quiet=True):
            row.fail(f"re-run: exit {done.returncode}, {_sound(out)}, left {left[:3]}")
    return row


# --------------------------------------------------------------------------------------- writers


def _writer(out: str, seed: int, start: threading.Event, results: multiprocessing.Queue) -> None:
    start.wait()
    try:
        with shardkit.PileWriter(out, piles=8, seed=seed) as w:
            for i in range(500):
                w.write({"__key__": f"k{i:05d}", "bin": os.urandom(200)})
        results.put("ok")
    except shardkit.DatasetExistsError:
        results.put("refused")
    except BaseException as e:  # anything else is a failure of the row
        results.put(f"{type(e).__name__}: {e}")


def row_writers(work: str, trials: int) -> Row:
    row = Row("writers: two processes write one output at once")
    for t in range(trials):
        row.tried += 1
        out = os.path.join(work, f"writers-{t}")
        start, results = FORK.Event(), FORK.Queue()
        procs = [FORK.Process(target=_writer, args=(out, seed, start, results)) for seed in (1, 2)]
        for p in procs:
            p.start()
        start.set()
        for p in procs:
            p.join(120)
        outcomes = sorted(results.get(timeout=10) for _ in procs)
        if outcomes != ["ok", "refused"] or _sound(out) is not None:
            row.fail(f"outcomes {outcomes}, {_sound(out)}")
    return row


# ------------------------------------------------------------------------------------------ fuzz


def _mutate(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    how = rng.randrange(4)
    if how == 0:  # flip a few bytes anywhere
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    elif how == 1:  # truncate
        del buf[rng.randrange(len(buf)) :]
    elif how == 2:  # rewrite a header field of a random header block (name, size, typeflag, checksum)
        block = rng.randrange(len(buf) // 512) * 512
        start, width = rng.choice([(0, 100), (124, 12), (156, 1), (148, 8), (257, 6), (345, 155)])
        buf[block + start : block + start + width] = bytes(rng.choice(b"0123456789 /.-x\x00\xff") for _ in range(width))
    else:  # append garbage after the end
        buf += bytes(rng.randrange(256) for _ in range(rng.randint(1, 2000)))
    return bytes(buf)


def _fuzz_case(path: str, work: str) -> str | None:
    """Read, re-pile and verify one mutated shard; None, or what went wrong."""
    try:
        for _ in shardkit.loader(path, decode=False, on_error="raise"):
            pass
    except shardkit.ShardkitError:
        pass
    out = os.path.join(work, "fuzz-out")
    try:
        shardkit.pile([path], out, piles=2, overwrite=True, quiet=True)
        problems = [p for p in shardkit.verify(out, quiet=True) if not p.warning]
        if problems:
            return f"pile succeeded but verify found {problems[0]}"
    except shardkit.ShardkitError:
        pass
    return None


def _fuzz_child(paths: list[str], work: str, results: multiprocessing.Queue) -> None:
    for path in paths:
        try:
            results.put((path, _fuzz_case(path, work)))
        except BaseException as e:
            results.put((path, f"{type(e).__name__}: {e}"))


def row_fuzz(work: str, trials: int, rng: random.Random, timeout: float) -> Row:
    row = Row("fuzz: mutated tars through loader, pile and verify")
    seeds = make_shards(os.path.join(work, "fuzz-src"), 3, 6, 300, seed=2)
    originals = []
    for path in seeds:
        with open(path, "rb") as f:
            originals.append(f.read())
    cases = os.path.join(work, "fuzz-cases")
    os.makedirs(cases, exist_ok=True)
    batch = 50
    for lo in range(0, trials, batch):
        paths = []
        for i in range(lo, min(trials, lo + batch)):
            path = os.path.join(cases, f"case-{i:06d}.tar")
            with open(path, "wb") as f:
                f.write(_mutate(rng.choice(originals), rng))
            paths.append(path)
        results = FORK.Queue()
        child = FORK.Process(target=_fuzz_child, args=(paths, os.path.join(work, f"fuzz-{lo}"), results))
        child.start()
        seen = 0
        while seen < len(paths):
            try:
                path, problem = results.get(timeout=timeout)
            except Exception:  # the child hangs or died: every case not answered counts
                row.tried += len(paths) - seen
                for _ in range(len(paths) - seen):
                    row.fail(f"no answer within {timeout}s near {paths[seen]}")
                break
            seen += 1
            row.tried += 1
            if problem is not None:
                row.fail(f"{os.path.basename(path)}: {problem}")
        child.kill()
        child.join()
        for path in paths:
            os.unlink(path)
    return row


# -------------------------------------------------------------------------------------- diskfull


def row_diskfull(work: str, trials: int) -> Row:
    row = Row("diskfull: pass 1 into a 4 MiB tmpfs")
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        row.notes.append("skipped: needs root on Linux to mount a tmpfs")
        return row
    inputs = make_shards(os.path.join(work, "full-in"), 4, 300, 10_000, seed=3)  # ~12 MB: cannot fit
    mount = os.path.join(work, "tmpfs")
    os.makedirs(mount, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mount], capture_output=True).returncode != 0:
        row.notes.append("skipped: mounting a tmpfs was refused here")
        return row
    try:
        for t in range(trials):
            row.tried += 1
            out = os.path.join(mount, f"out-{t}")
            try:
                shardkit.pile(inputs, out, piles=4, workers=1 + t % 2, quiet=True)
                row.fail("a job that cannot fit reported success")
            except shardkit.ShardkitError as e:
                if out not in str(e) and mount not in str(e):
                    row.fail(f"the error does not name the place: {e}")
            except BaseException as e:
                row.fail(f"not a ShardkitError: {type(e).__name__}: {e}")
            if os.path.exists(out) and (manifest.is_dataset(out) or [n for n in os.listdir(out) if n.startswith(".shardkit-staging")]):
                row.fail(f"left a manifest or staging behind: {os.listdir(out)}")
            shutil.rmtree(out, ignore_errors=True)
    finally:
        subprocess.run(["umount", mount], capture_output=True)
    return row


# ------------------------------------------------------------------------------------------ disk


def _tree_bytes(path: str) -> int:
    """The disk space the files under ``path`` take: a file with several names (hard links) counts once."""
    seen: dict[tuple[int, int], int] = {}
    for here, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(here, name))
                seen[st.st_dev, st.st_ino] = st.st_blocks * 512
    return sum(seen.values())


def _watch(path: str, peak: list[int], done: threading.Event) -> None:
    """Keep ``peak[0]`` at the most bytes ``path`` held, until ``done``."""
    while not done.is_set():
        peak[0] = max(peak[0], _tree_bytes(path))
        time.sleep(0.005)


def row_disk(work: str, trials: int) -> Row:
    row = Row("disk: peak disk use of pass 1 (2 workers) over the dataset's size")
    inputs = make_shards(os.path.join(work, "disk-in"), 8, 500, 20_000, seed=4)  # ~80 MB
    for t in range(trials):
        row.tried += 1
        out = os.path.join(work, f"disk-out-{t}")
        peak, done = [0], threading.Event()
        watcher = threading.Thread(target=_watch, args=(out, peak, done), daemon=True)
        watcher.start()
        try:
            shardkit.pile(inputs, out, piles=16, workers=2, quiet=True)
        finally:
            done.set()
            watcher.join()
        ratio = peak[0] / max(1, _tree_bytes(out))
        row.notes.append(f"peak {ratio:.2f}x the dataset")
        if ratio > 1.5:
            row.fail(f"pass 1 held {ratio:.2f}x the dataset's size on disk")
        shutil.rmtree(out)
    return row


# ------------------------------------------------------------------------------------------ soak


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def row_soak(work: str, epochs: int) -> Row:
    row = Row(f"soak: {epochs} epochs, prefetch 2, 2 decode workers")
    out = os.path.join(work, "soak")
    with shardkit.PileWriter(out, piles=16, seed=0) as w:
        for i in range(4000):
            w.write({"__key__": f"k{i:05d}", "bin": os.urandom(500), "cls": i % 10})
    keys = {f"k{i:05d}" for i in range(4000)}
    threads = threading.active_count()
    rss: list[int] = []
    with shardkit.loader(out, batch_size=100, num_workers=2, prefetch=2, decode=True) as loader:
        for epoch in range(epochs):
            row.tried += 1
            loader.set_epoch(epoch)
            seen = [k for batch in loader for k in batch["__key__"]]
            if sorted(seen) != sorted(keys):
                row.fail(f"epoch {epoch}: {len(seen)} samples, {len(set(seen))} distinct")
            rss.append(_rss())
    if threading.active_count() != threads:
        row.fail(f"threads: {threads} before, {threading.active_count()} after")
    if len(rss) > 10 and rss[-1] > 1.2 * rss[len(rss) // 5] + (32 << 20):
        row.fail(f"resident memory grew: {rss[len(rss) // 5] >> 20} MiB -> {rss[-1] >> 20} MiB")
    row.notes.append(f"resident memory {min(rss) >> 20}-{max(rss) >> 20} MiB over the epochs")
    return row


# ------------------------------------------------------------------------------------------ main


# ------------------------------------------------------------- fuzzed states, fuzzed jobs, secrets


def _input_row(name: str, cases: list, timeout: float) -> Row:
    from stress_inputs import run_cases

    row = Row(name)
    row.tried, failures = run_cases(cases, timeout)
    for failure in failures:
        row.fail(failure[:300])
    return row


def row_states(work: str, trials: int, rng: random.Random, timeout: float) -> Row:
    """Mutated loader, blend and torch states: loaded and read to the end of the epoch, or refused."""
    from stress_inputs import state_cases

    return _input_row("states: fuzzed loader, blend and torch states", state_cases(os.path.join(work, "states"), trials, rng), timeout)


def row_jobs(work: str, trials: int, rng: random.Random, timeout: float) -> Row:
    """Mutated YAML jobs: refused by load_job (run --check), or run without a ConfigError."""
    from stress_inputs import job_cases

    return _input_row("jobs: fuzzed YAML jobs, --check then run", job_cases(os.path.join(work, "jobs"), trials, rng), timeout)


def row_secrets(work: str, quick: bool) -> Row:
    """Canary credentials through CLI jobs at -vv against a moto server: files, objects and output searched."""
    from stress_secrets import run_canary

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from s3_server import S3Bucket, start_moto

    row = Row("secrets: canary credentials at -vv (places searched)")
    place = os.path.join(work, "secrets")
    os.makedirs(place, exist_ok=True)
    with start_moto() as moto:
        bucket = S3Bucket.create(moto.endpoint)
        leaks, row.tried = run_canary(moto.endpoint, bucket.bucket, bucket.client(), place, quick=quick)
    for leak in leaks:
        row.fail(leak[:300])
    return row


def row_s3(name: str, trials: int, seed: int) -> Row:
    """A race row of ``benchmarks/s3_races.py`` (on a moto server started for it)."""
    import s3_races

    ((title, tried, failed, notes),) = s3_races.run_rows([name], trials, seed)
    return Row(title, tried, failed, notes)


# rows that start a moto server and read it through s3fs
_REMOTE_ROWS = {"secrets", "outage", "cache", "s3appends", "s3gc", "s3overwrites"}


def _missing_remote() -> str:
    """The packages of the remote extra the S3 rows need that are not installed ('' when none)."""
    import importlib.util

    return " and ".join(m for m in ("moto", "s3fs") if importlib.util.find_spec(m) is None)


def table(rows: list[Row]) -> str:
    lines = ["| row | tried | failed | notes |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.name} | {r.tried} | {r.failed} | {'; '.join(r.notes)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small slice of every row (the test suite runs this)")
    parser.add_argument("--rows", default=None, help="comma-separated rows to run (default: all; --quick: all but the S3 race ones)")
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--writers", type=int, default=20)
    parser.add_argument("--fuzz", type=int, default=5000)
    parser.add_argument("--diskfull", type=int, default=6)
    parser.add_argument("--disk", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--states", type=int, default=2000, help="fuzzed loader, blend and torch states")
    parser.add_argument("--jobs", type=int, default=2000, help="fuzzed YAML jobs")
    parser.add_argument("--userfiles", type=int, default=100)
    parser.add_argument("--manifests", type=int, default=1000)
    parser.add_argument("--links", type=int, default=100)
    parser.add_argument("--appendfull", type=int, default=5)
    parser.add_argument("--s3", type=int, default=30, help="trials of each S3 race row")
    parser.add_argument("--outages", type=int, default=24, help="S3 outages mid-epoch (1-20 s)")
    parser.add_argument("--caches", type=int, default=24, help="changed cache copies")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a fuzz batch may go without an answer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=None, help="scratch directory (default: a temporary one, removed)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the rows provoke warnings on purpose (plain shards, dead jobs' locks)
    if args.quick:
        args.kills, args.writers, args.fuzz, args.diskfull, args.disk, args.epochs = 3, 3, 100, 1, 1, 3
        args.states, args.jobs = 100, 100
        args.userfiles, args.manifests, args.links, args.appendfull = 4, 60, 14, 1
        args.outages, args.caches = 2, 2
    rng = random.Random(args.seed)
    work = args.work or tempfile.mkdtemp(prefix="shardkit-stress-")
    runs: dict[str, Callable[[], Row]] = {
        "kill": lambda: row_kill(work, args.kills, rng),
        "writers": lambda: row_writers(work, args.writers),
        "fuzz": lambda: row_fuzz(work, args.fuzz, rng, args.timeout),
        "diskfull": lambda: row_diskfull(work, args.diskfull),
        "disk": lambda: row_disk(work, args.disk),
        "soak": lambda: row_soak(work, args.epochs),
        "states": lambda: row_states(work, args.states, rng, args.timeout),
        "jobs": lambda: row_jobs(work, args.jobs, rng, args.timeout),
        "secrets": lambda: row_secrets(work, args.quick),
        "userfiles": lambda: stress_trust.row_userfiles(
            Row("userfiles: user files beside a dataset under gc and overwrite"), work, args.userfiles, rng
        ),
        "manifests": lambda: stress_trust.row_manifests(
            Row("manifests: crafted manifests through read, gc, overwrite, append, an epoch, verify"), work, args.manifests, rng
        ),
        "links": lambda: stress_trust.row_links(Row("links: a symbolic link at every staging path"), work, args.links, rng),
        "appendfull": lambda: stress_trust.row_appendfull(
            Row("appendfull: an append with 2 workers fills a 4 MiB disk"), work, args.appendfull, rng
        ),
        **{name: (lambda name=name: row_s3(name, args.s3, args.seed)) for name in ("s3appends", "s3gc", "s3overwrites")},
        "outage": lambda: stress_s3.row_outage(Row("S3 outage of 1-20 s mid-epoch"), args.outages, rng),
        "cache": lambda: stress_s3.row_cache(Row("changed cache copy, verify=False"), args.caches, rng, work),
    }
    if args.rows is None:
        args.rows = "kill,writers,fuzz,diskfull,disk,soak,states,jobs,secrets,userfiles,manifests,links,appendfull,outage,cache"
        args.rows += "" if args.quick else ",s3appends,s3gc,s3overwrites"
    rows = []
    missing = _missing_remote()
    try:
        for name in args.rows.split(","):
            started = time.perf_counter()
            if name.strip() in _REMOTE_ROWS and missing:
                row = Row(f"{name.strip()}: skipped, it needs {missing}: pip install 'shardkit[remote]'")
                rows.append(row)
                print(row.name, file=sys.stderr, flush=True)
                continue
            row = runs[name.strip()]()
            row.notes.append(f"{time.perf_counter() - started:.0f} s")
            rows.append(row)
            print(f"{row.name}: {row.tried} tried, {row.failed} failed", file=sys.stderr, flush=True)
    finally:
        if args.work is None:
            with contextlib.suppress(OSError):
                shutil.rmtree(work)
    print(table(rows))
    return 1 if any(r.failed for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
