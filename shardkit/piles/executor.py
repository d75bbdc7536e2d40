"""Run pass 1's input units, here or in worker processes, and collect what each process wrote.

An executor takes the job, the units and a staging directory and gives back one
:class:`~shardkit.piles.units.Part` per process that wrote (its part files and which unit wrote
which bytes), keeping the parent's :class:`Tally` (counts, skipped units, progress) up to date.
The result does not depend on the executor or its number of workers: each unit's samples are
routed by ``(seed, unit, ordinal)`` and publishing orders every pile's bytes by unit.

Every executor is an :class:`Executor`: ``run(job, units, staging, *, todo, attempt, buffer_size,
tally)`` processes the units whose indices are in ``todo`` (all of them, or those a resumed job
has not done) into part directories named from ``attempt`` (or from their unit range) that
commit as they go (:mod:`shardkit.piles.resume`);
:func:`shardkit.piles.preprocess` picks the one a job's options name. The local executor runs
the units in this process (``workers=1``) or hands them out in small chunks to a
:class:`shardkit.workers.Pool`, two chunks in flight per worker, so fast workers take more and
the parent always knows which units a worker holds.

    tally = Tally(units, quiet=True)
    parts = run_local(job, units, staging, todo=range(len(units)), attempt="part-1a2b3c4d",
                      buffer_size=64 << 20, workers=4, tally=tally)

The Ray executor (``executor="ray"``) is in :mod:`shardkit.piles.ray_executor`, imported only
when asked for.
"""

from __future__ import annotations

import functools
import logging
import pickle
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

from shardkit._util import bar, format_size
from shardkit.errors import ConfigError, Failure, InputError, WorkerError
from shardkit.piles.units import FINISH, ChunkDone, Part, UnitWork, UnitWorker, UnitWriter, describe, part_directory, unit_error
from shardkit.workers import Pool

log = logging.getLogger(__name__)

Chunk = list[tuple[int, Any]]
# chunks a worker holds at once: one, so a worker is only ever sent a task while it waits for one
# (with a second queued, a worker sending a large reply and the parent sending to it would wait
# on each other); it idles one round trip per chunk, microseconds against a chunk's work
_IN_FLIGHT = 1
_POLL = 1.0  # seconds between checks that no worker died while the parent waits


class Tally:
    """Counts, skipped units and the progress bar of a running job (lives in the parent)."""

    def __init__(self, units: Sequence[Any], *, quiet: bool) -> None:
        self.units = units
        self.samples = 0
        self.bytes = 0
        self.failures: list[Failure] = []
        self.start = time.perf_counter()
        self.quiet = quiet
        self.bar = bar(total=len(units), desc="piling", unit="unit", quiet=quiet)

    def add(self, units: int, samples: int, nbytes: int, failures: Sequence[Failure] = (), *, log_failures: bool = True) -> None:
        """Count finished units; ``log_failures=False`` for skips an earlier run of a resumed job logged."""
        self.samples += samples
        self.bytes += nbytes
        for failure in failures:
            if log_failures:
                unit = describe(self.units[failure.index])
                log.warning("skipping input unit %d (%s): %s: %s", failure.index, unit, failure.kind, failure.message)
            self.failures.append(failure)
        rate = self.samples / max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix_str(f"{self.samples} samples, {format_size(self.bytes)}, {rate:.0f} samples/s", refresh=False)
        self.bar.update(units)


class Executor(Protocol):
    """Runs ``units[i]`` for each ``i`` in ``todo`` into part files under ``staging``, keeping
    ``tally``; one Part per writer."""

    def __call__(
        self, job: UnitWork, units: Sequence[Any], staging: str, *, todo: Sequence[int], attempt: str, buffer_size: int, tally: Tally
    ) -> list[Part]: ...


def chunk_size(units: int, workers: int) -> int:
    """Units per chunk: small enough to balance the load, large enough to keep messages rare."""
    return max(1, min(16, units // (workers * 32)))


def run_local(
    job: UnitWork,
    units: Sequence[Any],
    staging: str,
    *,
    todo: Sequence[int],
    attempt: str,
    buffer_size: int,
    workers: int,
    tally: Tally,
    mp_context: str | None = None,
) -> list[Part]:
    """Process the units ``todo`` names here (``workers=1``) or in ``workers`` processes; one Part per process.

    ``buffer_size`` is the total: each worker buffers its share.

    Raises:
        the unit's error (:func:`~shardkit.piles.units.unit_error`) when one fails and
        ``job.on_error`` is ``"raise"``; InputError when a worker dies holding units.
    """
    workers = min(workers, len(todo))
    if not todo:
        return []
    if workers <= 1:
        return [_run_here(job, units, todo, part_directory(staging, attempt, 0), buffer_size, tally)]
    return _run_pool(
        job, units, todo, functools.partial(UnitWorker, job, staging, attempt, buffer_size // workers), workers, tally, mp_context
    )


def _run_here(job: UnitWork, units: Sequence[Any], todo: Sequence[int], directory: str, buffer_size: int, tally: Tally) -> Part:
    writer = UnitWriter(job, directory, buffer_size)
    for index in todo:
        result = writer.attempt(index, units[index])
        if isinstance(result, Failure):
            if job.on_error == "raise":
                raise unit_error(result, units[index])
            tally.add(1, 0, 0, [result])
        else:
            tally.add(1, *result)
        writer.commit_due()
    return writer.finish()


def _run_pool(
    job: UnitWork, units: Sequence[Any], todo: Sequence[int], handler: Any, workers: int, tally: Tally, context: str | None
) -> list[Part]:
    size = chunk_size(len(todo), workers)
    indexed = [(i, units[i]) for i in todo]
    chunks: deque[Chunk] = deque(indexed[i : i + size] for i in range(0, len(indexed), size))
    held: list[deque[Chunk]] = [deque() for _ in range(workers)]
    parts: dict[int, Part] = {}
    try:
        pool = Pool(workers, handler, name="shardkit-pile", context=context)
    except (pickle.PicklingError, TypeError, AttributeError) as e:  # spawn and forkserver pickle the job: fn must survive dill
        raise ConfigError(f"fn cannot be sent to worker processes ({type(e).__name__}: {e}); use workers=1 or mp_context='fork'") from e
    with pool:
        try:
            for k in range(workers):
                _feed(pool, k, chunks, held[k])
            while len(parts) < workers:
                for k in pool.ready(_POLL):
                    reply = pool.receive(k)
                    if isinstance(reply, Part):
                        parts[k] = reply
                        continue
                    held[k].popleft()
                    account(reply, job, tally)
                    _feed(pool, k, chunks, held[k])
        except WorkerError as e:
            raise _died(e, held) from None
    return [parts[k] for k in range(workers)]


def _feed(pool: Pool, k: int, chunks: deque[Chunk], held: deque[Chunk]) -> None:
    """Top worker ``k`` up to two chunks, or ask it for its part when there are none left."""
    while len(held) < _IN_FLIGHT and chunks:
        chunk = chunks.popleft()
        _send(pool, k, chunk)
        held.append(chunk)
    if not chunks and not held:  # its next reply is its part
        pool.send(k, FINISH)


def _send(pool: Pool, k: int, chunk: Chunk) -> None:
    """Send a chunk, naming the unit that cannot be pickled if one cannot."""
    try:
        pool.send(k, chunk)
    except WorkerError:
        raise  # the worker died: nothing to do with the units
    except Exception:
        import dill

        for index, unit in chunk:
            try:
                dill.dumps(unit)
            except Exception as e:
                raise InputError(f"input unit {index} ({describe(unit)}) cannot be sent to a worker process: {e}") from e
        raise


def account(reply: ChunkDone, job: UnitWork, tally: Tally) -> None:
    """Account for a finished chunk; raise its first failure when the policy is to raise."""
    if reply.failures and job.on_error == "raise":
        failure = reply.failures[0]
        raise unit_error(failure, tally.units[failure.index])
    tally.add(reply.units, reply.samples, reply.nbytes, reply.failures)


def _died(error: WorkerError, held: list[deque[Chunk]]) -> InputError:
    units = [i for chunk in held[error.worker] for i, _ in chunk] if error.worker >= 0 else []
    span = f"input units {units[0]}..{units[-1]}" if units else "no unit"
    return InputError(
        f"worker process {error.worker} died ({error.how}) while holding {span}; fn may have crashed it (out of memory? a native library?)"
    )
