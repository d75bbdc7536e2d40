"""Race writers and gc on one S3 dataset and count what breaks: racing appends, append against gc, racing overwrites.

Each trial runs the jobs in processes of their own against a moto S3 server on 127.0.0.1, then
judges the dataset in a fresh process (one that never listed it before: a stale listing cannot
hide or invent an object). A failure is a torn dataset (``shardkit verify`` finds a problem), a
lost update (a job reported success and its samples are not there), a refused job whose samples
are there, both racing overwrites reporting success, or an error that is not a DatasetExistsError.

    python benchmarks/s3_races.py                       # 30 trials of each row
    python benchmarks/s3_races.py --trials 5 --rows appends,gc

Rows (``benchmarks/stress.py --rows s3appends,s3gc,s3overwrites`` runs the same):
- s3appends: two processes append 200 samples each to one dataset at the same instant.
- s3gc: one process appends while another runs ``shardkit.gc(grace=0)`` at a random moment.
- s3overwrites: two processes overwrite one dataset with different samples at the same instant.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import random
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import shardkit  # noqa: E402

FORK = multiprocessing.get_context("fork")
# the fresh process that judges a dataset: verify it, and say which samples it holds
_JUDGE = """
import json, sys
import shardkit
url = sys.argv[1]
try:
    problems = [str(p) for p in shardkit.verify(url, quiet=True) if not p.warning]
    keys = sorted(s["__key__"] for s in shardkit.loader(url, decode=False))
except shardkit.ShardkitError as e:
    problems, keys = [f"unreadable: {e}"], []
print(json.dumps({"problems": problems, "keys": keys}))
"""


def _samples(prefix: str, n: int) -> list[dict[str, Any]]:
    return [{"__key__": f"{prefix}{i:04d}", "bin": os.urandom(300)} for i in range(n)]


def _fresh_clients() -> None:
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # a client made before the fork must not be shared


def _job(kind: str, url: str, prefix: str, start: Any, delay: float, results: Any) -> None:
    """One racing job in a forked process: ``append``, ``overwrite`` or ``gc``; puts (prefix, outcome)."""
    _fresh_clients()
    start.wait()
    time.sleep(delay)
    try:
        if kind == "gc":
            shardkit.gc(url, grace=0)
        else:
            units = [_samples(prefix, 100), _samples(prefix + "x", 100)]
            mode = "append" if kind == "append" else "create"
            shardkit.preprocess(units, _same, url, piles=4, seed=0, mode=mode, overwrite=kind == "overwrite", workers=1, quiet=True)
        results.put((prefix, "ok"))
    except shardkit.DatasetExistsError:
        results.put((prefix, "refused"))
    except BaseException as e:  # anything else is a failure of the row
        results.put((prefix, f"{type(e).__name__}: {e}"))


def _same(unit: Any) -> Any:
    return unit


def judge(url: str, env: dict[str, str], *, fresh_process: bool = True) -> dict[str, Any]:
    """What a fresh process finds at ``url``: ``problems`` (verify's) and ``keys``. Without
    ``fresh_process``, this process with fresh clients (no listing cached: quicker, for tests)."""
    if not fresh_process:
        _fresh_clients()
        problems = [str(p) for p in shardkit.verify(url, quiet=True) if not p.warning]
        return {"problems": problems, "keys": sorted(s["__key__"] for s in shardkit.loader(url, decode=False))}
    done = subprocess.run([sys.executable, "-c", _JUDGE, url], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return {"problems": [f"judge failed: {done.stderr.strip()[-300:]}"], "keys": []}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _race(jobs: list[tuple[str, str, float]], url: str) -> dict[str, str]:
    start, results = FORK.Event(), FORK.Queue()
    procs = [FORK.Process(target=_job, args=(kind, url, prefix, start, delay, results)) for kind, prefix, delay in jobs]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(300)
    return dict(results.get(timeout=30) for _ in procs)


def _keys_of(prefix: str) -> set[str]:
    return {s["__key__"] for s in _samples(prefix, 100) + _samples(prefix + "x", 100)}


def trial(
    kind: str, url: str, env: dict[str, str], rng: random.Random, *, fresh_process: bool = True, seen: list[dict[str, str]] | None = None
) -> str | None:
    """One trial of row ``kind`` at the fresh prefix ``url``; why it failed, or None (judged in a
    fresh process unless told otherwise, see :func:`judge`). ``seen`` gets each job's outcome."""
    shardkit.preprocess([_samples("base", 50)], _same, url, piles=4, seed=0, workers=1, quiet=True)
    base = {f"base{i:04d}" for i in range(50)}
    if kind == "s3appends":
        outcomes = _race([("append", "a", 0.0), ("append", "b", 0.0)], url)
    elif kind == "s3gc":
        outcomes = _race([("append", "a", 0.0), ("gc", "gc", rng.uniform(0, 1.5))], url)
    else:
        outcomes = _race([("overwrite", "a", 0.0), ("overwrite", "b", 0.0)], url)
    if seen is not None:
        seen.append(outcomes)
    bad = {p: o for p, o in outcomes.items() if o not in ("ok", "refused")}
    if bad:
        return f"errors {bad}"
    found = judge(url, env, fresh_process=fresh_process)
    if found["problems"]:
        return f"torn: {found['problems'][0]}"
    keys = set(found["keys"])
    writers = {p: o for p, o in outcomes.items() if p != "gc"}
    if kind == "s3overwrites":
        won = [p for p, o in writers.items() if o == "ok"]
        if len(won) != 1 and not (len(won) == 2 and keys in (_keys_of("a"), _keys_of("b"))):
            return f"outcomes {outcomes}"
        return None if any(keys == _keys_of(p) for p in won) else f"the dataset is no winner's whole: {len(keys)} keys"
    expected = set(base)
    for prefix, outcome in writers.items():
        mine = _keys_of(prefix)
        if outcome == "ok" and not mine <= keys:
            return f"lost update: {prefix} said ok, {len(mine - keys)} of its samples are missing"
        if outcome == "refused" and mine & keys:
            return f"{prefix} was refused, yet {len(mine & keys)} of its samples are there"
        if outcome == "ok":
            expected |= mine
    if kind == "s3appends" and list(writers.values()).count("ok") == 0:
        return f"no append won: {outcomes}"
    return None if keys == expected else f"{len(keys)} keys, expected {len(expected)}"


def row(kind: str, trials: int, endpoint: str, seed: int = 0) -> tuple[int, int, list[str]]:
    """Run ``trials`` of row ``kind`` on the S3 server at ``endpoint``: (tried, failed, notes, outcomes)."""
    from s3_server import S3Bucket, aws_environment

    bucket = S3Bucket.create(endpoint)
    env = {k: v for k, v in {**os.environ, **aws_environment(endpoint)}.items() if v is not None}
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    _fresh_clients()
    rng = random.Random(seed)
    failed, notes, seen = 0, [], []
    try:
        for t in range(trials):
            why = trial(kind, bucket.url(f"{kind}-{t}"), env, rng, seen=seen)
            if why is not None:
                failed += 1
                notes.append(why)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        _fresh_clients()
    refused = sum("refused" in outcomes.values() for outcomes in seen)
    return trials, failed, [*notes[:5], f"{refused} trials with a job refused, {len(seen) - refused} with every job ok"]


ROWS = {
    "s3appends": "s3appends: two appends race on one s3:// dataset",
    "s3gc": "s3gc: gc(grace=0) runs during an append on s3://",
    "s3overwrites": "s3overwrites: two overwrites race on one s3:// dataset",
}


def run_rows(names: list[str], trials: int, seed: int = 0, endpoint: str | None = None) -> list[tuple[str, int, int, list[str]]]:
    """Run the rows ``names`` (keys of :data:`ROWS`) on ``endpoint``, or on a moto server started here."""
    from s3_server import start_moto

    server = None if endpoint else start_moto()
    try:
        done = []
        for name in names:
            tried, failed, notes = row(name, trials, endpoint or server.endpoint, seed)
            done.append((ROWS[name], tried, failed, notes))
        return done
    finally:
        if server is not None:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows")
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    started = time.perf_counter()
    rows = run_rows([n.strip() for n in args.rows.split(",")], args.trials, args.seed)
    print("| row | tried | failed | notes |\n|---|---|---|---|")
    for name, tried, failed, notes in rows:
        print(f"| {name} | {tried} | {failed} | {'; '.join(notes)} |")
    print(f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 1 if any(failed for _, _, failed, _ in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
