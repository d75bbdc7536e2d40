"""Kill pass 1's driver with SIGKILL at random moments, resume it, and compare the bytes.

Each round starts a pass-1 job (``shardkit.preprocess``) in a child process and kills it
(``kill -9``) after a random delay, sometimes several times in a row, each kill followed by a
run with ``resume=True``; the last run is let finish. The dataset it publishes must be
byte-identical (every file, the manifest included) to one written by an uninterrupted run, and
the resumed runs must have redone only the units no commit named. The executor and the number
of workers may change between the runs of one round.

    python benchmarks/kill_resume.py                    # 20 rounds, local executor, 1-2 workers
    python benchmarks/kill_resume.py --rounds 5 --ray   # Ray runs too (a local Ray per run)

It prints one row a round: when each kill came, how many units were committed when it did,
how many units the finishing runs processed, and whether the bytes matched.
``benchmarks/kill_phases.py`` stops jobs in each phase (units, merge, install, after the
manifest) and measures Ctrl-C's latency per compression level, with this module's job.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
UNITS = 48
SAMPLES = 12  # per unit
PILES = 6
DELAY = 0.08  # seconds a unit takes
BIG = 512 << 10  # bytes a sample of big_samples


def big_samples(unit: int):
    """Two 512 KiB samples a unit, of words (compressible, as text is): piles big enough that a
    merge at a high zstd level runs for seconds."""
    import numpy as np

    words = np.array([b"pile ", b"shuffle ", b"sample ", b"epoch ", b"tar ", b"seed ", b"unit ", b"frame "])
    for k in range(2):
        chosen = words[np.random.default_rng((unit, k)).integers(0, len(words), BIG // 4)]
        yield {"__key__": f"b{unit:04d}-{k}", "txt": b"".join(chosen.tolist())[:BIG]}


def slow_samples(unit: int):
    """A unit's samples, made slowly enough (:data:`DELAY`, 80 ms a unit) that a kill lands in the middle of a job."""
    time.sleep(DELAY)
    for k in range(SAMPLES):
        yield {"__key__": f"u{unit:04d}-{k:02d}", "txt": f"unit {unit} sample {k} " * (1 + (unit * 7 + k) % 13)}


def run_job(
    out: str,
    *,
    workers: int,
    executor: str,
    resume: bool,
    log: str | None = None,
    address: str | None = None,
    compression: str | None = None,
    level: int | None = None,
    big: bool = False,
    stop_at: str | None = None,
) -> list[int]:
    """The job every run of a round runs (in this process); ``log`` gets the units this run
    processed, which are returned too. ``compression`` and ``level`` compress the piles; ``big``
    writes :func:`big_samples` into 2 piles, so the merge is the long part. ``stop_at`` kills
    this process with SIGKILL at a step of publishing (see :func:`_kill_at`): only in a child."""
    import shardkit
    from shardkit.piles import resume as resume_module

    if stop_at:
        _kill_at(stop_at)

    every = resume_module.COMMIT_SECONDS
    resume_module.COMMIT_SECONDS = 0.0  # commit after every chunk: kills find committed work
    if log:
        Path(log).write_text("")
    fn = _logging(log, big) if log else big_samples if big else slow_samples
    ray = {"ray_address": address} if executor == "ray" and address else {}
    units = list(range(UNITS))
    try:
        shardkit.preprocess(
            units,
            fn,
            out,
            piles=2 if big else PILES,
            seed=11,
            workers=workers,
            executor=executor,
            resume=resume,
            quiet=True,
            compression=compression,
            compression_level=level,
            **ray,
        )
    finally:
        resume_module.COMMIT_SECONDS = every
    return [int(x) for x in Path(log).read_text().split()] if log else []


def _kill_at(step: str) -> None:
    """Make this process stop itself at ``step`` of publishing: ``"install:N"`` before the install
    gives its N-th pile its name in the dataset (0: the first), ``"upload:N"`` once N piles are
    uploaded into an object store (with conditional writes), ``"published"`` once the manifest
    is in, before the job removes its staging, ``"removing"`` once it renamed its staging to a
    leftover's name, before it deleted any of it; with SIGKILL, or with the signal a third part
    names (``"install:2:SIGINT"``: Ctrl-C there)."""
    from shardkit import storage
    from shardkit.dataset import install as installing
    from shardkit.dataset import leftovers
    from shardkit.piles import resume

    kind, _, rest = step.partition(":")
    count, _, name = rest.partition(":") if kind in ("install", "upload") else ("", "", rest)
    sig = signal.Signals[name or "SIGKILL"]

    def stop(*_: object) -> None:
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the signal acts here (Ctrl-C raises KeyboardInterrupt in the sleep)

    if kind == "published":
        resume.Staging.remove = stop  # type: ignore[method-assign]
        return
    if kind == "removing":  # the staging is renamed to a leftover's name, nothing of it deleted yet
        delete = leftovers.delete_owned

        def stop_deleting(directory: str, names: list[str], **kwargs: object) -> object:
            if kwargs.get("reason") == "the staging of a finished pass 1":
                stop()
            return delete(directory, names, **kwargs)

        leftovers.delete_owned = stop_deleting  # the staging is discarded there
        return
    if kind not in ("install", "upload") or not count.isdigit():
        raise ValueError(
            f"stop_at: expected 'install:N[:SIGNAL]', 'upload:N[:SIGNAL]', 'published[:SIGNAL]' or 'removing[:SIGNAL]', got {step!r}"
        )
    if kind == "upload":
        upload, sent, lock = storage.upload_if_absent, [], threading.Lock()

        def upload_then_stop(*args: Any, **kwargs: Any) -> bool:
            done = upload(*args, **kwargs)
            with lock:
                sent.append(args)
                if len(sent) == int(count):
                    stop()
            return done

        storage.upload_if_absent = upload_then_stop
        return
    link, linked = installing._link_new, []

    def link_then_stop(output: Any, src: str, name: str) -> None:
        if len(linked) == int(count):
            stop()
        linked.append(name)
        link(output, src, name)

    installing._link_new = link_then_stop


class _logging:
    """``slow_samples``, noting each unit it is called on in a file (appends are atomic lines)."""

    def __init__(self, path: str, big: bool = False) -> None:
        self.path = path
        self.big = big

    def __repr__(self) -> str:  # the job's fingerprint sees fn by name and code, not by the log's path
        return "big_samples" if self.big else "slow_samples"

    def __call__(self, unit: int):
        with open(self.path, "a") as f:
            f.write(f"{unit}\n")
        yield from (big_samples if self.big else slow_samples)(unit)


def child(
    out: str,
    workers: int,
    executor: str,
    resume: bool,
    log: str | None,
    address: str | None = None,
    delay: float = DELAY,
    **more: object,
) -> subprocess.Popen:
    """Start a run in a child process, ``delay`` seconds a unit; ``more``: run_job's other keywords
    (compression, level, big, stop_at)."""
    extra = "".join(f", {k}={v!r}" for k, v in more.items())
    code = (
        f"import sys, logging; sys.path.insert(0, {str(HERE)!r}); import kill_resume; kill_resume.DELAY = {delay!r}; "
        "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s'); "
        f"kill_resume.run_job({out!r}, workers={workers}, executor={executor!r}, resume={resume}, log={log!r}, address={address!r}{extra})"
    )
    # Ray workers import fn's module by name: this folder goes on their path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")])}
    return start(code, env)


def start(code: str, env: dict[str, str]) -> subprocess.Popen:
    """Run ``code`` in a fresh Python with ``env``; its stderr is kept for the report.

    SIGINT as a terminal gives it: a shell starting this in the background (``cmd &``) ignores
    it, and children inherit that.
    """
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def files(directory: str) -> dict[str, bytes]:
    """Every visible file of a dataset directory and its bytes."""
    return {name: Path(directory, name).read_bytes() for name in sorted(os.listdir(directory)) if not name.startswith(".")}


def committed(out: str) -> int:
    """Units the commits in ``out``'s staging directory name (0 when there is none)."""
    from shardkit.piles import commits, resume

    staging = resume.staging_path(out)
    if not os.path.isdir(staging):
        return 0
    return sum(len(c.units) + len(c.failures) for c in commits.committed(staging).values())


def merge_round(work: str, rng: random.Random, *, level: int, sig: int, reference: dict[str, bytes] | None) -> dict:
    """Stop a job of big samples with ``sig`` during its merge (zstd at ``level``), then resume it:
    how long the signal took to stop it, units lost (not committed) and units the resumed run did."""
    out = os.path.join(work, "merge-out")
    shutil.rmtree(out, ignore_errors=True)
    job = {"compression": "zstd", "level": level, "big": True}
    proc = child(out, 2, "local", resume=False, log=os.path.join(work, "merge-first.log"), **job)
    merging = os.path.join(out, ".shardkit-pass1", "piles")
    while not os.path.isdir(merging):
        if proc.poll() is not None:
            raise RuntimeError(f"the job ended before its merge: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.01)
    time.sleep(rng.uniform(0.05, 0.5))  # into the merge
    lost = UNITS - committed(out)
    sent = time.perf_counter()
    proc.send_signal(sig)
    proc.wait()
    took = time.perf_counter() - sent
    if proc.returncode == 0 or os.path.exists(os.path.join(out, "shardkit.json")):
        return {"finished_early": True}  # published before the signal came (it may have come during the cleanup)
    log = os.path.join(work, "merge-resumed.log")
    Path(log).write_text("")
    resumed = child(out, 2, "local", resume=True, log=log, **job)
    _, err = resumed.communicate()
    if resumed.returncode != 0:
        raise RuntimeError(f"the resumed run failed: {err.decode()[-2000:]}")
    lines = err.decode().splitlines()
    warned = [line for line in lines if line.startswith("WARNING")]
    said = [line.split(": ", 2)[-1] for line in lines if "resuming:" in line]
    redone = len(Path(log).read_text().split())
    row = {"level": level, "signal": signal.Signals(sig).name, "stop_s": round(took, 2), "lost": lost, "redone": redone}
    row["warnings"] = len(warned)
    row["said"] = said[0] if said else "(nothing said)"
    row["identical"] = reference is None or files(out) == reference
    return row


def one_round(reference: dict[str, bytes], work: str, rng: random.Random, *, kills: int, executors: list[str]) -> dict:
    """Kill a job ``kills`` times at random moments (SIGKILL or Ctrl-C), resume after each, let the last run finish."""
    out = os.path.join(work, "out")
    shutil.rmtree(out, ignore_errors=True)
    row: dict = {"kills": [], "committed": [], "redone": 0}
    for k in range(kills + 1):
        log = os.path.join(work, f"units-{k}.log")
        Path(log).write_text("")
        proc = child(out, rng.choice([1, 2]), rng.choice(executors), resume=k > 0, log=log)
        if k < kills:
            delay = rng.uniform(0.4, 2.4)
            try:
                proc.wait(delay)
            except subprocess.TimeoutExpired:
                proc.send_signal(rng.choice([signal.SIGKILL, signal.SIGINT]))
            proc.wait()
            # finished before the kill, or the kill landed after the job's last step (its staging gone, the
            # process still exiting): the dataset is whole and a resume has nothing to do
            whole = os.path.exists(os.path.join(out, "shardkit.json")) and not os.path.exists(os.path.join(out, ".shardkit-pass1"))
            if proc.returncode == 0 or whole:
                row["finished_early"] = True
                break
            row["kills"].append(round(delay, 2))
            row["committed"].append(committed(out))
        else:
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"the finishing run failed ({proc.returncode}): {err.decode()[-2000:]}")
            units = [int(x) for x in Path(log).read_text().split()]
            row["redone"] = len(units)
            row["expected"] = UNITS - row["committed"][-1] if row["committed"] else UNITS
    row["identical"] = files(out) == reference
    row["staging_left"] = os.path.exists(os.path.join(out, ".shardkit-pass1"))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ray", action="store_true", help="let some runs use executor='ray' (a local Ray each)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument(
        "--merge-rounds",
        type=int,
        default=0,
        metavar="N",
        help="instead: N rounds per zstd level (3, 19) that stop a job of 48 MiB during its merge (Ctrl-C, then kill -9), then resume",
    )
    args = parser.parse_args(argv)
    if args.merge_rounds:
        return merge_main(args.merge_rounds, random.Random(args.seed))
    rng = random.Random(args.seed)
    executors = ["local", "ray"] if args.ray else ["local"]
    with tempfile.TemporaryDirectory() as work:
        ref = os.path.join(work, "reference")
        run_job(ref, workers=1, executor="local", resume=False)
        reference = files(ref)
        rows = []
        for r in range(args.rounds):
            row = one_round(reference, work, rng, kills=rng.choice([1, 1, 2, 3]), executors=executors)
            rows.append(row)
            if not args.json:
                end = (
                    "the last resumed run finished before its kill"
                    if row.get("finished_early")
                    else f"the finishing run processed {row['redone']} units (expected {row['expected']})"
                )
                print(
                    f"round {r:2d}: killed at {row['kills']} s with {row['committed']} of {UNITS} units committed; "
                    f"{end}; identical={row['identical']}, staging left={row['staging_left']}",
                    flush=True,
                )
    if args.json:
        print(json.dumps(rows))
    bad = [r for r in rows if not r["identical"] or r["staging_left"] or r["redone"] != r.get("expected", r["redone"])]
    kills = sum(len(r["kills"]) for r in rows)
    lost, redone = sum(r.get("expected", 0) for r in rows), sum(r["redone"] for r in rows if "expected" in r)
    print(f"{len(rows)} rounds, {kills} kills of the driver (kill -9 or Ctrl-C): {len(rows) - len(bad)} rounds byte-identical and exact")
    print(f"units redone / units lost at the last kill: {redone} / {lost} = {redone / max(lost, 1):.2f}")
    return 1 if bad else 0


def merge_main(rounds: int, rng: random.Random) -> int:
    """The --merge-rounds campaign: stop each job during its merge, resume, print what it cost."""
    import statistics

    rows = []
    with tempfile.TemporaryDirectory() as work:
        for level in (3, 19):
            ref = os.path.join(work, f"reference-{level}")
            run_job(ref, workers=2, executor="local", resume=False, compression="zstd", level=level, big=True)
            reference = files(ref)
            shutil.rmtree(ref)
            for sig in (signal.SIGINT, signal.SIGKILL):
                for _ in range(rounds):
                    row = merge_round(work, rng, level=level, sig=sig, reference=reference)
                    if row.get("finished_early"):
                        continue
                    rows.append(row)
                    print(
                        f"zstd {level:2d}, {row['signal']}: stopped in {row['stop_s']:.2f} s; {row['lost']} units lost, "
                        f"{row['redone']} redone; {row['warnings']} warnings; identical={row['identical']}\n    {row['said']}",
                        flush=True,
                    )
    for level in (3, 19):
        stops = [r["stop_s"] for r in rows if r["level"] == level and r["signal"] == "SIGINT"]
        if stops:
            print(
                f"zstd level {level}: Ctrl-C stopped the merge in {statistics.median(stops):.2f} s (median of {len(stops)}, max {max(stops):.2f})"
            )
    lost, redone = sum(r["lost"] for r in rows), sum(r["redone"] for r in rows)
    print(f"units redone / units lost: {redone} / {lost} (every unit was committed before the merge: 0 / 0 is exact)")
    bad = [r for r in rows if not r["identical"] or r["redone"] != r["lost"] or r["warnings"]]
    print(f"{len(rows)} merges stopped: {len(rows) - len(bad)} resumed byte-identical, redoing only lost units, without a warning")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
