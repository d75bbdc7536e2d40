"""Pass 1 inside a transaction: run the units not done yet through the executor, order every pile's bytes by unit, publish.

The front doors (``preprocess``, ``pile``, ``repile``, an append) check their options and build
their units; :func:`run_pass1` does the rest in the transaction they opened. Every pile's
segments are sorted by unit, then by position (one process writes a whole unit, in order), so
the piles are byte-identical whatever ran the units and however often the job was resumed. A
skipped unit's bytes are left out; two samples of one pile with one key stop the job.

    with Dataset(out).transaction(mode="create") as txn:
        stage = txn.hold(resume.open_staging(txn.path, job_doc, resume=False, overwrite=False))
        result = run_pass1(txn, stage, job, units, options, workers=2, mp_context=None, quiet=True, extra=None, base=None)
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardkit._util import bar, format_size
from shardkit.dataset.transaction import Transaction
from shardkit.errors import SampleError
from shardkit.manifest import Manifest
from shardkit.piles import append, resume
from shardkit.piles import repeat as repeat_rules
from shardkit.piles.executor import Executor, Tally, run_local
from shardkit.piles.merge_records import begin_merge
from shardkit.piles.options import PileOptions
from shardkit.piles.parts import ADVICE, PREFIXED_ADVICE, SEGMENT
from shardkit.piles.publish import Mapper, Run, publish
from shardkit.piles.unique_keys import check_unique
from shardkit.piles.units import Part, UnitWork, describe, reused_part, skip_record

log = logging.getLogger(__name__)


def run_pass1(
    txn: Transaction,
    stage: resume.Staging,
    job: UnitWork,
    units: list[Any],
    options: PileOptions,
    *,
    workers: int,
    mp_context: str | None,
    quiet: bool,
    extra: Mapping[str, Any] | None,
    base: append.Base | None,
) -> Manifest:
    """Run the units the transaction has not done through the executor, then publish in it."""
    tally = Tally(units, quiet=quiet)
    reused = [reused_part(directory, commit) for directory, commit in stage.commits.items()]
    for commit in stage.commits.values():
        tally.add(len(commit.units) + len(commit.failures), commit.samples, commit.nbytes, commit.failures, log_failures=False)
    done = txn.done
    todo = [i for i in range(len(units)) if i not in done]
    run, mapper = executor_for(options, workers, mp_context)
    with tally.bar:
        parts = run(job, units, stage.path, todo=todo, attempt=stage.attempt(), buffer_size=int(options.buffer_size), tally=tally)
    staging = stage.merging
    begin_merge(staging, {"compression": options.compression, "level": options.level})  # what finished piles a resume keeps were made with
    threads = min(workers, len(units))
    extra = {**(extra or {}), "units": len(units)}
    try:
        result = publish_parts(
            txn, staging, [*reused, *parts], options, extra, tally, threads, units, mapper, base, advice=_repeat_advice(job, options)
        )
    except SampleError:
        stage.remove()  # two inputs share a key: the job must change before it can succeed, so nothing is to resume
        raise
    stage.remove()  # published: nothing left to resume
    return result


def executor_for(options: PileOptions, workers: int, mp_context: str | None) -> tuple[Executor, Mapper | None]:
    """The executor ``options.executor`` names, and where it merges the piles (None: threads
    here); Ray is imported only when it is asked for."""
    if options.executor == "ray":
        from shardkit.piles import ray_executor

        address = options.ray_address
        return functools.partial(ray_executor.run_ray, address=address), functools.partial(ray_executor.ray_map, address=address)
    return functools.partial(run_local, workers=workers, mp_context=mp_context), None


# how many skipped units the manifest lists by name (all are counted)
MAX_LISTED_SKIPS = 1000


def merge_plan(parts: Sequence[Part], pile: int, skipped: np.ndarray) -> tuple[np.ndarray, int]:
    """Pile ``pile``'s byte ranges in output order as rows (part, offset, length), and its count.

    Segments are sorted by unit, then by position (one process writes a whole unit, in order);
    a skipped unit's segments are left out; ranges that continue each other are joined.
    """
    tables = [_segments(part, pile) for part in parts]
    rows = np.concatenate(
        [np.column_stack([t, np.full(len(t), k, dtype=np.int64)]) for k, t in enumerate(tables)]
        + [np.zeros((0, SEGMENT + 1), dtype=np.int64)]
    )
    if len(skipped):
        rows = rows[~np.isin(rows[:, 0], skipped)]
    if not len(rows):
        return np.zeros((0, 3), dtype=np.int64), 0
    rows = rows[np.lexsort((rows[:, 1], rows[:, 0]))]
    _, start, end, count, part = rows.T
    # a new run starts where the part changes or the bytes do not continue the previous range
    new = np.ones(len(rows), dtype=bool)
    new[1:] = (part[1:] != part[:-1]) | (start[1:] != end[:-1])
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(rows)) - 1
    return np.column_stack([part[first], start[first], end[last] - start[first]]), int(count.sum())


def _segments(part: Part, pile: int) -> np.ndarray:
    """Pile ``pile``'s segments in ``part`` as rows of SEGMENT numbers."""
    return np.frombuffer(part.segments[pile], dtype=np.int64).reshape(-1, SEGMENT)


def _repeat_advice(job: UnitWork, options: PileOptions) -> str:
    """What the message for a key two inputs share advises: with keys prefixed by their shard's
    name (``key_prefix`` resolved to "unit"), only shards named alike meet; else the job's own advice."""
    return PREFIXED_ADVICE if options.key_prefix == "unit" else job.repeat_advice


def publish_parts(
    txn: Transaction,
    staging: str,
    parts: Sequence[Part],
    options: PileOptions,
    extra: dict[str, Any],
    tally: Tally,
    workers: int,
    units: Sequence[Any],
    mapper: Mapper | None,
    base: append.Base | None = None,
    *,
    advice: str = ADVICE,
) -> Manifest:
    """Publish the piles ``parts`` hold in ``txn`` (an append's next generation when ``base`` is
    given), assembled on ``workers`` threads or by ``mapper``; skipped units are listed in the
    manifest (the first :data:`MAX_LISTED_SKIPS`), a repeat rule's factors recorded.

    Raises:
        SampleError: two samples have one key, in one pile or in two (see
            :func:`shardkit.piles.unique_keys.check_unique`); nothing is published.
    """
    skipped = np.array(sorted(f.index for f in tally.failures), dtype=np.int64)
    # keys unique across every pile, in the memory the buffers held (free now)
    check_unique(
        [[(_segments(part, p), part.paths[p], part.hashes(p)) for part in parts] for p in range(options.piles)],
        budget=int(options.buffer_size),
        scratch=staging,
        skipped=skipped,
        unit_name=lambda u: f"input unit {u} ({describe(units[u])})",
        advice=advice,
    )
    runs, counts = [], []
    for p in range(options.piles):
        plan, count = merge_plan(parts, p, skipped)
        pile_runs = [Run(parts[k].paths[p], offset, length) for k, offset, length in plan.tolist()]
        if len(pile_runs) == 1 and pile_runs[0].offset == 0:  # maybe a whole part file: its CRC is known
            pile_runs[0] = dataclasses.replace(pile_runs[0], crc=parts[int(plan[0, 0])].crcs[p])
        runs.append(pile_runs)
        counts.append(count)
    if tally.failures:
        failures = sorted(tally.failures, key=lambda f: f.index)
        extra["skipped"] = [skip_record(f, units[f.index]) for f in failures[:MAX_LISTED_SKIPS]]
    fields = set().union(*(part.fields for part in parts))
    if options.repeat is not None:
        factors: Counter[int] = Counter()
        for part in parts:
            factors.update(part.factors)
        extra["repeat"] = repeat_rules.record(options.repeat, factors)
    # piles are assembled in parallel: merging is copying and checksumming, which release the GIL
    with bar(total=len(runs), desc="merging", unit="pile", quiet=tally.quiet) as merging:
        result = (publish if base is None else functools.partial(append.finish, base))(
            txn,
            runs,
            counts,
            options=options,
            fields=fields,
            staging=staging,
            skipped_units=len(tally.failures),
            extra=extra,
            threads=workers,
            progress=merging.update,
            mapper=mapper,
        )
    elapsed = time.perf_counter() - tally.start
    log.info(
        "%s: %d samples from %d units into %d piles (%s) in %.1fs; %d units skipped",
        txn.path,
        result.samples,
        extra["units"],
        len(result.piles),
        format_size(result.bytes),
        elapsed,
        len(tally.failures),
    )
    return result
