"""Stop pass 1 in each of its phases, resume it, and print what each stop cost; and how fast Ctrl-C acts.

A round starts a pass-1 job (``kill_resume.run_job``) in a child process and stops it in one phase:

- ``units``: at a random moment while the units are written (80 ms a unit, 48 units, 2 workers);
- ``merge``: at a random moment while the piles are assembled and compressed (zstd, 48 MiB);
- ``install``: just before the install gives its k-th pile its name in the dataset (k random);
- ``published``: after the manifest went in, before the job removed its staging;
- ``removing``: once the job renamed its staging to a leftover's name, before it deleted any;

with SIGKILL or SIGINT (Ctrl-C), then runs it again with ``resume=True`` and counts the units
the resumed run did against the units no commit named when the job stopped (lost). The resumed
dataset must be byte-identical to an uninterrupted run's, with no warning logged. Then, for each
compression and level, jobs are stopped with SIGINT during their merge, and the time from the
signal to the process's exit is measured.

    python benchmarks/kill_phases.py                          # 2 rounds a phase and signal, 3 Ctrl-C a level
    python benchmarks/kill_phases.py --rounds 1 --latency-rounds 5

It prints one row a stop, then ``units redone / units lost`` per phase and the Ctrl-C latency
per compression level (median and max).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import kill_resume  # noqa: E402

PHASES = ("units", "merge", "install", "published", "removing")
# the compressions whose Ctrl-C latency is measured during the merge: (codec, level)
LEVELS = ((None, None), ("zstd", 3), ("zstd", 19), ("gzip", 9), ("lz4", 0), ("lz4", 16))
# the merge phase's job: 48 MiB of words into 2 piles at this zstd level (a merge of seconds)
MERGE_JOB = {"compression": "zstd", "level": 3, "big": True}


def _wait_for_merge(proc: subprocess.Popen, out: str) -> bool:
    """Wait until the job's merge began; False when the job ended first."""
    merging = os.path.join(out, ".shardkit-pass1", "piles")
    while not os.path.isdir(merging):
        if proc.poll() is not None:
            return False
        time.sleep(0.005)
    return True


def stop_round(work: str, rng: random.Random, phase: str, sig: signal.Signals, references: dict) -> dict | None:
    """Stop one job in ``phase`` with ``sig``, resume it: a row, or None when the job ended before the stop."""
    out = os.path.join(work, "out")
    shutil.rmtree(out, ignore_errors=True)
    job: dict = dict(MERGE_JOB) if phase == "merge" else {}
    first = os.path.join(work, "first.log")
    Path(first).write_text("")
    if phase in ("install", "published", "removing"):
        where = f"install:{rng.randrange(kill_resume.PILES)}" if phase == "install" else phase
        proc = kill_resume.child(out, 2, "local", resume=False, log=first, stop_at=f"{where}:{sig.name}", **job)
        proc.communicate()
        stopped_s = None
    else:
        proc = kill_resume.child(out, 2, "local", resume=False, log=first, **job)
        if phase == "units":  # once its first unit began (the imports take a while on a busy machine)
            while not Path(first).read_text() and proc.poll() is None:
                time.sleep(0.005)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(rng.uniform(0.1, 1.5))
        elif _wait_for_merge(proc, out):
            time.sleep(rng.uniform(0.02, 0.3))
        if proc.poll() is not None:
            proc.communicate()
            return None
        sent = time.perf_counter()
        proc.send_signal(sig)
        proc.communicate()
        stopped_s = time.perf_counter() - sent
    staged = any(name.startswith(".shardkit-pass1") for name in os.listdir(out))
    if proc.returncode == 0 or (os.path.exists(os.path.join(out, "shardkit.json")) and not staged):
        return None  # it finished before the stop (or as the interpreter exited, its work all done)
    # a job stopped once its manifest was in lost nothing (its commits may be in a staging renamed away)
    lost = 0 if os.path.exists(os.path.join(out, "shardkit.json")) else kill_resume.UNITS - kill_resume.committed(out)
    log = os.path.join(work, "resumed.log")
    Path(log).write_text("")
    resumed = kill_resume.child(out, 2, "local", resume=True, log=log, **job)
    _, err = resumed.communicate()
    if resumed.returncode != 0:
        raise RuntimeError(f"the resumed run failed after a stop in {phase}: {err.decode()[-2000:]}")
    lines = err.decode().splitlines()
    key = "merge" if phase == "merge" else "plain"
    if key not in references:
        ref = os.path.join(work, f"reference-{key}")
        kill_resume.run_job(ref, workers=1, executor="local", resume=False, **{k: v for k, v in job.items()})
        references[key] = kill_resume.files(ref)
        shutil.rmtree(ref)
    return {
        "phase": phase,
        "signal": sig.name,
        "stop_s": stopped_s,
        "lost": lost,
        "redone": len(Path(log).read_text().split()),
        "warnings": sum(line.startswith("WARNING") for line in lines),
        "said": next((line.split(": ", 2)[-1] for line in lines if "resuming:" in line), "(nothing said)"),
        "identical": kill_resume.files(out) == references[key],
    }


def latency_round(work: str, rng: random.Random, codec: str | None, level: int | None) -> float | None:
    """Seconds from SIGINT to the exit of a job stopped during its merge (None: it ended first)."""
    out = os.path.join(work, "latency")
    shutil.rmtree(out, ignore_errors=True)
    proc = kill_resume.child(out, 2, "local", resume=False, log=None, compression=codec, level=level, big=True)
    if not _wait_for_merge(proc, out):
        proc.communicate()
        return None
    time.sleep(rng.uniform(0.005, 0.1))  # a plain merge of 48 MiB takes a fraction of a second
    if proc.poll() is not None:
        proc.communicate()
        return None
    sent = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    proc.communicate()
    took = time.perf_counter() - sent
    published = os.path.exists(os.path.join(out, "shardkit.json"))  # the signal came as it exited, done
    return None if proc.returncode == 0 or published else took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="stops a phase and signal")
    parser.add_argument("--latency-rounds", type=int, default=3, help="Ctrl-C stops a compression level")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    rows, references = [], {}
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory() as work:
        for phase in PHASES:
            for sig in (signal.SIGKILL, signal.SIGINT):
                done = tries = 0
                while done < args.rounds and tries < 4 * args.rounds:
                    tries += 1
                    row = stop_round(work, rng, phase, sig, references)
                    if row is None:
                        continue
                    done += 1
                    rows.append(row)
                    took = "" if row["stop_s"] is None else f", exited {row['stop_s']:.2f} s after the signal"
                    print(
                        f"{phase:9s} {row['signal']:7s}: {row['lost']:2d} units lost, {row['redone']:2d} redone{took}; "
                        f"{row['warnings']} warnings; identical={row['identical']}\n    {row['said']}",
                        flush=True,
                    )
        latencies = {}
        for codec, level in LEVELS:
            name = "none" if codec is None else f"{codec} {level}"
            got: list[float] = []
            for _ in range(4 * args.latency_rounds):  # a job whose merge ended before the signal is tried again
                if len(got) == args.latency_rounds:
                    break
                if (took := latency_round(work, rng, codec, level)) is not None:
                    got.append(took)
            latencies[name] = got
            print(f"Ctrl-C in the merge, {name}: " + ", ".join(f"{t:.2f}" for t in got) + " s", flush=True)
    print("\nunits redone / units lost, per phase (kill -9 and Ctrl-C together):")
    for phase in PHASES:
        mine = [r for r in rows if r["phase"] == phase]
        redone, lost = sum(r["redone"] for r in mine), sum(r["lost"] for r in mine)
        clean = sum(r["identical"] and not r["warnings"] and r["redone"] == r["lost"] for r in mine)
        print(f"  {phase:9s} {redone:3d} / {lost:3d}   ({len(mine)} stops; {clean} resumed byte-identical, exact, without a warning)")
    units_stops = [r["stop_s"] for r in rows if r["signal"] == "SIGINT" and r["stop_s"] is not None and r["phase"] == "units"]
    print("Ctrl-C to exit (median, max), seconds:")
    if units_stops:
        print(f"  writing units     {statistics.median(units_stops):.2f}  {max(units_stops):.2f}")
    for name, got in latencies.items():
        if got:
            print(f"  merge, {name:10s} {statistics.median(got):.2f}  {max(got):.2f}   ({len(got)} stops)")
    bad = [r for r in rows if not r["identical"] or r["warnings"] or r["redone"] != r["lost"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
