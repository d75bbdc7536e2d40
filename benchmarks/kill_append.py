"""Kill appends that split piles and rewrite segments (SIGKILL, Ctrl-C) and check what they leave.

Each round writes a small dataset with a small ``max_pile_bytes`` (some rounds: split by pass 1,
compressed with zstd or lz4, grown once before), then runs an append (some with ``window=``) in a
child process and stops it: with SIGKILL after a random delay, with SIGKILL at a random step of
its publishing (the n-th rename, link or unlink the driver makes), or with SIGINT (Ctrl-C).
After each stop the directory must read as exactly the old generation or exactly the new one
(every key once, ``shardkit verify`` clean apart from leftovers), and a loader pinned to the old
generation must still read it. An old generation is appended to again (``resume=True``), maybe
killed again; the finished dataset must equal an uninterrupted append's (every file it lists
byte-identical, the manifest equal but for the generations' times), ``shardkit gc`` must
delete no file a kept manifest lists, and the next append must go through.

    python benchmarks/kill_append.py                 # 12 rounds, 1-3 stops each
    python benchmarks/kill_append.py --rounds 3 --seed 5

It prints one row a round and a summary of the stops and their outcomes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import kill_resume  # noqa: E402  (its count of committed units)

PILES = 3
SAMPLES = 6  # per unit
BASE_UNITS = 16
APPEND_UNITS = 16
LIMIT = 8192  # a sample is about 1 KiB of tar: piles of ~32 samples split into leaves
STEP = "KILL_APPEND_STEP"  # the child kills itself at this step of its file operations
STEPS = "KILL_APPEND_STEPS"  # the child writes how many steps it made here
UNITS_LOG = "KILL_APPEND_UNITS"  # the child notes each unit its function is called on here


def samples(unit: int, delay: float = 0.0):
    """A unit's samples (``delay`` seconds a unit, so a timed kill lands in the middle of a job)."""
    if delay:
        time.sleep(delay)
    for k in range(SAMPLES):
        yield {"__key__": f"u{unit:04d}-{k:02d}", "txt": f"unit {unit} sample {k} " * (1 + (unit * 7 + k) % 13)}


class slow_samples:
    """:func:`samples` with a delay; named alike in every run, so a resumed job is the same job."""

    def __repr__(self) -> str:
        return "slow_samples"

    def __call__(self, unit: int):
        path = os.environ.get(UNITS_LOG)
        if path:
            with open(path, "a") as f:  # appends of a line are atomic
                f.write(f"{unit}\n")
        yield from samples(unit, 0.03)


def grow(out: str, units: list[int], *, mode: str, resume: bool = False, slow: bool = False, **options: Any) -> None:
    """Write (``mode="create"``) or append ``units`` to the dataset ``out``."""
    import shardkit
    from shardkit.piles import resume as resume_module

    every = resume_module.COMMIT_SECONDS
    resume_module.COMMIT_SECONDS = 0.0  # commit after every chunk: kills find committed work
    fn = slow_samples() if slow else samples
    try:
        shardkit.preprocess(units, fn, out, piles=PILES, seed=7, workers=1, mode=mode, resume=resume, quiet=True, **options)
    finally:
        resume_module.COMMIT_SECONDS = every


def _count_steps() -> None:
    """Count the driver's renames, links and unlinks; kill it with SIGKILL at step ``$KILL_APPEND_STEP``.
    ``$KILL_APPEND_STEPS`` gets the step publishing began at and the steps in all."""
    from shardkit.piles import append

    target, driver, done, began = int(os.environ.get(STEP, "0")), os.getpid(), [0], [0]
    publish = append.finish

    def noted(*args, **kwargs):
        began[0] = done[0] + 1
        return publish(*args, **kwargs)

    append.finish = noted  # preprocess looks it up on the module each time

    def counted(fn):
        def step(*args, **kwargs):
            if os.getpid() == driver:
                done[0] += 1
                if done[0] == target:
                    os.kill(driver, signal.SIGKILL)
            return fn(*args, **kwargs)

        return step

    for name in ("replace", "rename", "link", "unlink"):
        setattr(os, name, counted(getattr(os, name)))
    path = os.environ.get(STEPS)
    if path:
        import atexit

        atexit.register(lambda: Path(path).write_text(f"{began[0]} {done[0]}"))


def child_main(out: str, units: list[int], options: dict[str, Any], resume: bool) -> None:
    _count_steps()
    grow(out, units, mode="append", resume=resume, slow=True, **options)


def child(
    out: str, options: dict[str, Any], *, resume: bool, step: int = 0, steps: str | None = None, units_log: str | None = None
) -> subprocess.Popen:
    """Start an append of the round's units in a child process (``units_log`` gets the units it does)."""
    units = list(range(1000, 1000 + APPEND_UNITS))
    code = (
        f"import sys; sys.path.insert(0, {str(HERE)!r}); import kill_append; "
        f"kill_append.child_main({out!r}, {units!r}, {options!r}, {resume})"
    )
    env = {**os.environ, STEP: str(step), "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    if steps:
        env[STEPS] = steps
    if units_log:
        Path(units_log).write_text("")
        env[UNITS_LOG] = units_log
    return kill_resume.start(code, env)


def keys(out: str) -> list[str]:
    import shardkit

    with shardkit.loader(out, decode=False, seed=3) as loader:
        return [s["__key__"] for s in loader]


def pinned_state(out: str) -> tuple[list[str], dict[str, Any]]:
    """The keys a loader of ``out`` read in its first batch, and its state: a loader pinned to this generation."""
    import shardkit

    with shardkit.loader(out, decode=False, batch_size=4, seed=2) as loader:
        head = list(next(iter(loader))["__key__"])
        return head, loader.state_dict()


def read_pinned(out: str, head: list[str], state: dict[str, Any]) -> list[str]:
    """Every key the pinned loader reads, its first batch included."""
    import shardkit

    with shardkit.loader(out, decode=False, batch_size=4, seed=2) as loader:
        loader.load_state_dict(state)
        return sorted(head + [k for b in loader for k in b["__key__"]])


def listed(out: str) -> dict[str, bytes]:
    """The files the manifest lists and their bytes, and the manifest (its times left out) as ``shardkit.json``."""
    from shardkit import manifest

    m = manifest.read(out)
    found = {name: Path(out, name).read_bytes() for name in m.files()}
    doc = json.loads(Path(out, manifest.MANIFEST).read_text())
    doc["generations"] = sorted(doc.get("generations", {}))
    found[manifest.MANIFEST] = json.dumps(doc, sort_keys=True).encode()
    return found


def check(out: str, old: tuple[int, list[str]], new: tuple[int, list[str]], pin: tuple[list[str], dict[str, Any]]) -> str:
    """What an interrupted append left in ``out``: ``"old"`` or ``"new"``; raises AssertionError if neither, whole."""
    import shardkit
    from shardkit import manifest

    generation = manifest.read(out).generation
    if generation not in (old[0], new[0]):
        raise AssertionError(f"{out}: generation {generation}, expected {old[0]} or {new[0]}")
    expected = old[1] if generation == old[0] else new[1]
    found = keys(out)
    if sorted(found) != expected:
        raise AssertionError(
            f"{out}: generation {generation} reads {len(found)} keys ({len(set(found))} distinct), expected {len(expected)}"
        )
    problems = [p for p in shardkit.verify(out, quiet=True) if p.kind != "leftover"]
    if problems:
        raise AssertionError(f"{out}: verify: {'; '.join(map(str, problems))}")
    if read_pinned(out, *pin) != old[1]:
        raise AssertionError(f"{out}: a loader pinned to generation {old[0]} does not read it whole")
    return "old" if generation == old[0] else "new"


def check_gc(out: str, pin: tuple[list[str], dict[str, Any]], old_keys: list[str]) -> None:
    """``shardkit gc`` deletes no file a kept manifest lists: the pinned loader reads within the grace, all reads after."""
    import shardkit
    from shardkit import manifest

    for grace in ("1h", 0):
        shardkit.gc(out, grace=grace)
        for name in os.listdir(out):
            if name == manifest.MANIFEST or manifest.GENERATION_FILE.fullmatch(name):
                m = manifest.parse(Path(out, name).read_text(), name)
                missing = [f for f in m.files() if not os.path.exists(os.path.join(out, f))]
                if missing:
                    raise AssertionError(f"{out}: gc(grace={grace!r}) deleted {missing[:3]}, which {name} lists")
        if grace == "1h" and read_pinned(out, *pin) != old_keys:
            raise AssertionError(f"{out}: after gc(grace='1h') a loader pinned to the old generation does not read it whole")
    problems = shardkit.verify(out, quiet=True)
    if problems:
        raise AssertionError(f"{out}: verify after gc: {'; '.join(map(str, problems))}")


def scenario(rng: random.Random) -> dict[str, Any]:
    """How a round's dataset is written and grown: pass-1 split or not, compressed (zstd or lz4) or not, a window or not."""
    split, packed, grown = rng.random() < 0.5, rng.random() < 0.4, rng.random() < 0.5
    codec = rng.choice(["zstd", "lz4"]) if packed else None
    base = {"max_pile_bytes": LIMIT if split else None, "compression": codec}
    append = {"max_pile_bytes": LIMIT, "compression": codec}
    if grown and rng.random() < 0.6:
        append["window"] = 2
    return {"split": split, "codec": codec, "grown": grown, "base": base, "append": append}


def build(out: str, s: dict[str, Any]) -> None:
    grow(out, list(range(BASE_UNITS)), mode="create", **s["base"])
    if s["grown"]:
        grow(out, list(range(500, 500 + BASE_UNITS // 2)), mode="append", **s["append"] | {"window": None})


def finish(proc: subprocess.Popen, what: str) -> None:
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}): {err.decode()[-3000:]}")


def one_round(work: str, rng: random.Random, *, stops: int) -> dict[str, Any]:
    from shardkit import manifest

    s = scenario(rng)
    base, ref, out = (os.path.join(work, n) for n in ("base", "ref", "out"))
    for d in (base, ref, out):
        shutil.rmtree(d, ignore_errors=True)
    build(base, s)
    g0, old_keys = manifest.read(base).generation, sorted(keys(base))
    pin = pinned_state(base)
    shutil.copytree(base, ref)
    shutil.copytree(base, out)
    counted = os.path.join(work, "steps")
    began = time.perf_counter()
    finish(child(ref, s["append"], resume=False, steps=counted), "the uninterrupted append")
    took = time.perf_counter() - began
    publishing, steps = map(int, Path(counted).read_text().split())
    new = (g0 + 1, sorted(keys(ref)))
    row: dict[str, Any] = {**{k: s[k] for k in ("split", "codec", "grown")}, "window": s["append"].get("window"), "stops": []}
    for k in range(stops):
        how = rng.choice(["time", "step", "step", "int"])
        # most steps commit pass 1's parts: two kills in three land while the append publishes
        step = rng.randint(rng.choice([1, publishing, publishing]), steps) if how == "step" else 0
        proc = child(out, s["append"], resume=k > 0, step=step)
        delay = rng.uniform(0.2, took) if how != "step" else None
        if delay is not None:
            try:
                proc.wait(delay)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT if how == "int" else signal.SIGKILL)
        _, err = proc.communicate()
        if proc.returncode == 0:
            row["stops"].append((how, step or round(delay or 0, 2), "finished"))
            break
        # Python ends a process Ctrl-C stopped with SIGINT once its handlers ran (-2), or its traceback says so
        if how == "int" and proc.returncode != -signal.SIGINT and b"KeyboardInterrupt" not in err:
            raise RuntimeError(f"the append stopped by Ctrl-C failed otherwise ({proc.returncode}): {err.decode()[-3000:]}")
        outcome = check(out, (g0, old_keys), new, pin)
        row["stops"].append((how, step or round(delay or 0, 2), outcome))
        if outcome == "new":
            break
    if manifest.read(out).generation == g0:
        lost = APPEND_UNITS - kill_resume.committed(out)
        done = os.path.join(work, "resumed-units")
        finish(child(out, s["append"], resume=True, units_log=done), "the resumed append")
        row["redone"], row["lost"] = len(Path(done).read_text().split()), lost
    row["identical"] = listed(out) == listed(ref)
    check_gc(out, pin, old_keys)
    # and the dataset grows on: whatever the stops left is no interrupted job for the next append
    for d in (out, ref):
        grow(d, list(range(3000, 3002)), mode="append", **s["append"])
    if sorted(keys(out)) != sorted(keys(ref)):
        raise AssertionError(f"{out}: the next append does not read as it does after an uninterrupted append")
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    logging.getLogger("shardkit").setLevel(logging.ERROR)  # the appends' notes on leaves over the limit
    rows, failed = [], 0
    with tempfile.TemporaryDirectory() as work:
        for r in range(args.rounds):
            try:
                row = one_round(work, rng, stops=rng.choice([1, 2, 2, 3]))
            except (AssertionError, RuntimeError) as e:
                failed += 1
                print(f"round {r:2d}: FAILED: {e}", flush=True)
                continue
            rows.append(row)
            kind = ", ".join(k if row[k] is True else str(row[k]) for k in ("split", "codec", "grown") if row[k]) or "plain"
            stops = ", ".join(f"{how}@{at}->{outcome}" for how, at, outcome in row["stops"])
            cost = f"; the finishing run redid {row['redone']} units, {row['lost']} lost" if "lost" in row else ""
            print(f"round {r:2d} [{kind}; window={row['window']}]: {stops}{cost}; identical={row['identical']}", flush=True)
    outcomes = Counter((how, outcome) for row in rows for how, _, outcome in row["stops"])
    stops = sum(n for (_, outcome), n in outcomes.items() if outcome != "finished")
    same = sum(row["identical"] for row in rows)
    print(
        f"{args.rounds} rounds, {stops} stops "
        f"({', '.join(f'{how}->{outcome}: {n}' for (how, outcome), n in sorted(outcomes.items()))}); "
        f"{same} rounds identical to an uninterrupted append, {failed} failed"
    )
    redone, lost = sum(row.get("redone", 0) for row in rows), sum(row.get("lost", 0) for row in rows)
    print(f"units redone / units lost at the last stop (rounds that ended resumed): {redone} / {lost}")
    exact = all(row.get("redone") == row.get("lost") for row in rows)
    return 1 if failed or same != len(rows) or not exact else 0


if __name__ == "__main__":
    sys.exit(main())
