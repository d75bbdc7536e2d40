"""Fuzz what a user hands shardkit besides data: loader, torch and blend states, and YAML jobs.

A seeded mutator rewrites one place of a real state (or job) at a time: a value replaced by an
extreme or a wrong type (``2**40 + 1``, ``2**63``, ``-1``, ``1e308``, ``"a\\0b"``, a list, a
mapping...), a key dropped or added. Each mutant is loaded (``load_state_dict``, ``load_job``
as ``shardkit run --check`` does) and, when accepted, used (a state's epoch is read to its end;
a job is run), in a child process with a deadline. A case passes with a result or one
:class:`~shardkit.ShardkitError`; it fails with any other exception (a raw traceback), a hang
past the deadline, or a job that ``--check`` accepted and ``run`` then failed on as a bad input.

    python benchmarks/stress_inputs.py --states 1000 --jobs 1000
    python benchmarks/stress.py --rows states,jobs      # the same rows in the campaign's table
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import io
import json
import multiprocessing
import os
import random
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from typing import Any

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import shardkit

FORK = multiprocessing.get_context("fork")
# values a fuzzer tries first: the issue's own, the edges of int64, and every wrong type
EVIL: tuple[Any, ...] = (
    2**40 + 1,
    2**63,
    2**64 + 7,
    -1,
    -(2**63),
    0,
    1,
    10**30,
    1e308,
    float("nan"),
    0.5,
    True,
    None,
    "",
    "a\0b",
    "x" * 5000,
    "99999999999999999999d",
    "-1",
    [],
    [2**40],
    {},
    {"a": 1},
)


def mutate(doc: Any, rng: random.Random) -> Any:
    """A deep copy of the JSON-like ``doc`` with one place changed: a value replaced, a key
    dropped or added, a list emptied or grown."""
    doc = copy.deepcopy(doc)
    places = list(_places(doc, ()))
    path = rng.choice(places)
    parent, key = _parent(doc, path)
    how = rng.randrange(10)
    if how < 6 or parent is None:
        value = rng.choice(EVIL) if how < 5 else _nudge(_get(doc, path), rng)
        if parent is None:
            return value
        parent[key] = value
    elif how == 6 and isinstance(parent, dict):
        del parent[key]
    elif how == 7 and isinstance(parent, dict):
        parent[rng.choice(["unknown", "extra_" + str(rng.randrange(9)), "__class__"])] = rng.choice(EVIL)
    elif how == 8 and isinstance(parent, list):
        parent.extend([parent[key]] * rng.choice([1, 3, 1000]))
    else:
        parent[key] = [parent[key]] if rng.random() < 0.5 else {"value": parent[key]}
    return doc


def _places(doc: Any, path: tuple[Any, ...]):
    yield path
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _places(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _places(v, (*path, i))


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _parent(doc: Any, path: tuple[Any, ...]) -> tuple[Any, Any]:
    if not path:
        return None, None
    return _get(doc, path[:-1]), path[-1]


def _nudge(value: Any, rng: random.Random) -> Any:
    """A near miss of ``value``: off by one, scaled, negated, or as text."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice([value + 1, value - 1, -value, value * 2**32, value * 10**18])
    if isinstance(value, float):
        return rng.choice([value * 1e300, -value])
    if isinstance(value, str):
        return rng.choice([value + "\0", value * 3, value.upper(), value[:1]])
    return value


# ------------------------------------------------------------------------------------ the cases


def make_dataset(work: str) -> str:
    """Two small datasets, ``data`` and ``data-b`` (a blend needs two); returns the first."""
    for name, count in (("data", 120), ("data-b", 70)):
        out = os.path.join(work, name)
        if not os.path.exists(out):
            with shardkit.PileWriter(out, piles=4, seed=1) as w:
                for i in range(count):
                    w.write({"__key__": f"k{i:05d}", "txt": str(i)})
    return os.path.join(work, "data")


def _loader(kind: str, data: str) -> Any:
    if kind == "blend":
        return shardkit.loader({"a": data, "b": data + "-b"}, weights={"a": 0.7, "b": 0.3}, batch_size=8, decode=False)
    if kind == "torch":
        from shardkit.torch import ShardkitDataset

        return ShardkitDataset(data, batch_size=8, decode=False, world_size=1, rank=0)
    return shardkit.loader(data, batch_size=8, decode=False)


def seed_states(data: str) -> list[tuple[str, dict[str, Any]]]:
    """Real states of every kind, taken part way through an epoch."""
    found = []
    # torch states only where PyTorch is installed (the torch extra)
    for kind in ("loader", "blend", *(("torch",) if importlib.util.find_spec("torch") is not None else ())):
        loader = _loader(kind, data)
        if kind == "torch":
            it = iter(loader)
            for _ in range(3):
                next(it)
            found.append((kind, loader.state_dict(yielded=3)))
            continue
        it = iter(loader)
        for _ in range(3):
            next(it)
        found.append((kind, json.loads(json.dumps(loader.state_dict()))))
    return found


def state_case(kind: str, state: Any, data: str) -> str | None:
    """Load a (mutated) state into a fresh loader and read the rest of its epoch; None when
    that worked or was refused with a ShardkitError, else what went wrong."""
    loader = _loader(kind, data)
    try:
        loader.load_state_dict(state)
        for n, _ in enumerate(loader):
            if n > 10_000:
                return "an accepted state reads more batches than the dataset holds"
    except shardkit.ShardkitError as e:
        if "\n" in str(e):
            return f"a ShardkitError of several lines: {str(e)[:200]!r}"
    return None


# the jobs mutated: a pile job that replaces its output, and one that appends within a window
JOBS = (
    """\
job: pile
inputs: src/*.tar
output:
  path: out
  piles: 3
  seed: 0
  max_pile_bytes: 1MiB
  overwrite: true
workers: 1
on_error: raise
""",
    """\
job: pile
inputs: [src/s0.tar, src/s1.tar]
output: {path: grown, piles: 2, buffer_size: 64KiB, mode: append, window: 2d}
storage_options: {client_kwargs: {region_name: us-east-1}, anon: false}
""",
)


def make_job_dir(work: str) -> str:
    """A job folder with two small WebDataset shards in ``src/``."""

    base = os.path.join(work, "job")
    src = os.path.join(base, "src")
    os.makedirs(src, exist_ok=True)
    for k in range(2):
        with tarfile.open(os.path.join(src, f"s{k}.tar"), "w") as tar:
            for i in range(10):
                payload = f"{k} {i}".encode()
                info = tarfile.TarInfo(f"s{k}_{i:03d}.txt")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return base


def job_case(doc: Any, base: str, name: str) -> str | None:
    """Check a (mutated) job as ``shardkit run --check`` does and, when accepted, run it; None
    when both agree, else what went wrong."""
    from shardkit.cli.jobs import load_job, run_job

    # a folder of its own (its src/ the shared inputs): no case meets another's output
    folder = os.path.join(base, name.removesuffix(".yaml"))
    os.makedirs(folder, exist_ok=True)
    if not os.path.exists(os.path.join(folder, "src")):
        os.symlink(os.path.join(base, "src"), os.path.join(folder, "src"))
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(yaml.safe_dump(doc, allow_unicode=True) if not isinstance(doc, str) else doc)
    try:
        job = load_job(path)
    except shardkit.ShardkitError as e:
        return f"a ShardkitError of several lines: {str(e)[:200]!r}" if "\n" in str(e) else None
    try:
        run_job(job, quiet=True)
    except shardkit.ConfigError as e:
        return f"--check accepted it, run refused it: {e}"
    except shardkit.ShardkitError:
        pass  # data or storage trouble only running can find
    return None


# -------------------------------------------------------------------------------------- driver


def _child(cases: list[Callable[[], str | None]], results: Any) -> None:
    for i, case in enumerate(cases):
        try:
            results.put((i, case()))
        except BaseException as e:
            results.put((i, f"{type(e).__name__}: {str(e)[:200]}"))


def run_cases(cases: list[tuple[str, Callable[[], str | None]]], timeout: float, batch: int = 100) -> tuple[int, list[str]]:
    """Run ``cases`` in forked children, ``batch`` to a child; (tried, what failed), a case
    that gives no answer within ``timeout`` seconds counting as a hang (the rest of its batch
    goes on in a fresh child)."""
    tried, failures = 0, []
    pending = list(cases)
    while pending:
        chunk, pending = pending[:batch], pending[batch:]
        results = FORK.Queue()
        child = FORK.Process(target=_child, args=([c for _, c in chunk], results))
        child.start()
        seen = 0
        while seen < len(chunk):
            try:
                i, problem = results.get(timeout=timeout)
            except Exception:  # no answer: the case in hand hangs (or the child died)
                failures.append(f"{chunk[seen][0]}: no answer within {timeout}s")
                tried += 1
                pending = chunk[seen + 1 :] + pending
                break
            seen += 1
            tried += 1
            if problem is not None:
                failures.append(f"{chunk[i][0]}: {problem}")
        child.kill()
        child.join()
    return tried, failures


def state_cases(work: str, trials: int, rng: random.Random) -> list[tuple[str, Callable[[], str | None]]]:
    data = make_dataset(work)
    seeds = seed_states(data)
    cases = []
    for n in range(trials):
        kind, state = seeds[n % len(seeds)]
        mutant = mutate(state, rng)
        cases.append((f"{kind} state {n} {json.dumps(mutant, default=str)[:160]}", lambda k=kind, m=mutant: state_case(k, m, data)))
    return cases


def job_cases(work: str, trials: int, rng: random.Random) -> list[tuple[str, Callable[[], str | None]]]:
    base = make_job_dir(work)
    docs = [yaml.safe_load(text) for text in JOBS]
    cases = []
    for n in range(trials):
        mutant = mutate(docs[n % len(docs)], rng)
        name = f"job-{n:05d}.yaml"
        cases.append((f"job {n} {json.dumps(mutant, default=str)[:160]}", lambda m=mutant, f=name: job_case(m, base, f)))
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--states", type=int, default=1000, help="mutated states (default 1000)")
    parser.add_argument("--jobs", type=int, default=1000, help="mutated YAML jobs (default 1000)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds a case may take (default 30)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.ERROR)
    rng = random.Random(args.seed)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="shardkit-inputs-") as work:
        for name, cases in (("states", state_cases(work, args.states, rng)), ("jobs", job_cases(work, args.jobs, rng))):
            started = time.perf_counter()
            tried, failures = run_cases(cases, args.timeout)
            failed += len(failures)
            print(f"{name}: {tried} tried, {len(failures)} failed, {time.perf_counter() - started:.0f} s")
            for line in failures[:40]:
                print("  " + line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
