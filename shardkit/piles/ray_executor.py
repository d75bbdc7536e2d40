"""Run pass 1's input units as Ray tasks, on this machine or across a cluster (``executor="ray"``).

The units are cut into contiguous chunks, four a CPU of the cluster (at most 256), and each
chunk is one Ray task. A task writes its own part directory, named from its chunk
(``part-u000000120-000000135``), clearing it first: when Ray retries a task whose worker died,
the retry replaces the first attempt's files, so no sample is lost or written twice. The driver
keeps the :class:`~shardkit.piles.executor.Tally` as tasks finish and raises a failing unit
exactly as the local executor does; publishing then orders every pile's bytes by unit, so the
output is byte-identical to ``executor="local"``.

Each task commits its directory when it is done (:mod:`shardkit.piles.commits`), so a job
whose driver died resumes with only the chunks no commit covers. The per-pile merge runs as
Ray tasks too (:func:`ray_map` over :func:`shardkit.piles.publish.finish_pile`, which is safe to
retry); the driver writes the manifest last.

The staging directory must be a path every node sees (a shared filesystem): Ray moves the
units and the parts' bookkeeping, never the part files.

    parts = run_ray(job, units, staging, todo=range(len(units)), attempt="", buffer_size=64 << 20,
                    tally=tally, address="auto")
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from shardkit import storage
from shardkit.dataset.staging import remove_tree
from shardkit.errors import ConfigError, InputError, ShardkitError
from shardkit.piles.executor import Tally, account
from shardkit.piles.units import ChunkDone, Part, UnitWork, UnitWriter, chunk_directory, run_chunk

log = logging.getLogger(__name__)

# how many times Ray runs a task again whose worker died (killed, out of memory, node lost)
RETRIES = 3
# the most tasks a job is cut into: each task writes a part file per pile, so this bounds the
# files publishing merges; more tasks balance a cluster better and redo less when one is retried
MAX_TASKS = 256
# tasks per CPU of the cluster: enough to balance uneven units, few enough that the part files
# (2 x tasks x M) and the merge's fan-in stay small (a task a unit cost 1.4x the local executor
# on 2 CPUs, 4 a CPU 1.1x: benchmarks/ray_pass1.py)
TASKS_PER_CPU = 4
_POLL = 1.0  # seconds between progress bar refreshes while no task finishes

INSTALL_HINT = "executor='ray' needs Ray: pip install 'shardkit[ray]'"


def chunk_units(units: int, cpus: int) -> int:
    """Units per task: :data:`TASKS_PER_CPU` tasks a CPU of the cluster, at most :data:`MAX_TASKS`.

    The output does not depend on it (publishing orders bytes by unit), and a resumed job may
    cut its chunks differently: a chunk only holds units no commit names.
    """
    return max(1, -(-units // min(MAX_TASKS, TASKS_PER_CPU * max(1, cpus))))


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ConfigError(f"{INSTALL_HINT} ({e})") from None
    return ray


def connect(ray: Any, address: str | None) -> None:
    """Start or join Ray: None starts a light one here for this process (or uses the session
    already open, or the cluster ``RAY_ADDRESS`` names, as a job Ray runs is given)."""
    if ray.is_initialized():
        return  # an open session is used as it is, whatever address it was opened with
    if address is None:
        # "local": never join a Ray another process started here, such as the one a killed run
        # of this job left behind, still shutting down
        local = None if os.environ.get("RAY_ADDRESS") else "local"
        ray.init(address=local, ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, ignore_reinit_error=True)


def run_ray(
    job: UnitWork,
    units: Sequence[Any],
    staging: str,
    *,
    todo: Sequence[int],
    attempt: str,
    buffer_size: int,
    tally: Tally,
    address: str | None = None,
) -> list[Part]:
    """Process the units ``todo`` names as Ray tasks; one Part per task, in unit order.

    The chunks are cut from all the units (``todo`` only leaves out those a resumed job has
    done) and named from ``attempt`` and their unit ranges (a retried task starts over in its
    own directory).

    ``buffer_size`` is the total: it is shared by the tasks the cluster runs at once.

    Raises:
        ConfigError: Ray is not installed, or ``fn`` cannot be sent to Ray.
        the unit's error (:func:`~shardkit.piles.units.unit_error`) when one fails and
        ``job.on_error`` is ``"raise"``; InputError when a task's worker died more than
        :data:`RETRIES` times.
    """
    ray = _import_ray()
    connect(ray, address)
    task = ray.remote(max_retries=RETRIES)(_run_task)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    try:
        job_ref = ray.put(job)
    except Exception as e:  # fn (or a transform's state) that cloudpickle cannot send
        raise ConfigError(f"fn cannot be sent to Ray workers ({type(e).__name__}: {e})") from e
    size = chunk_units(len(units), cpus)
    chunks = {}
    for chunk in cut(todo, size):
        indexed = [(i, units[i]) for i in chunk]
        chunks[task.remote(job_ref, indexed, staging, attempt, max(1, buffer_size // cpus))] = (chunk[0], chunk[-1])
    pending = list(chunks)
    parts: dict[int, Part] = {}
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=_POLL)
            for ref in done:
                first, last = chunks[ref]
                part, reply = _get(ray, ref, f"input units {first}..{last}")
                account(reply, job, tally)
                parts[first] = part
    finally:
        _stop(ray, pending)
    return [parts[first] for first in sorted(parts)]


def ray_map(
    fn: Callable[[Any], Any], items: Sequence[Any], progress: Callable[[int], Any] | None, *, address: str | None = None
) -> list[Any]:
    """``[fn(item) for item in items]`` as one Ray task an item, all at once (the per-pile merge:
    ``fn`` must be safe to run again, as Ray retries a task whose worker died)."""
    ray = _import_ray()
    connect(ray, address)
    task = ray.remote(max_retries=RETRIES)(_apply)
    fn_ref = ray.put(fn)
    refs = {task.remote(fn_ref, item): k for k, item in enumerate(items)}
    results: list[Any] = [None] * len(items)
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=_POLL)
            for ref in done:
                results[refs[ref]] = _get(ray, ref, f"pile task {refs[ref]}")
                if progress is not None:
                    progress(1)
    finally:
        _stop(ray, pending)
    return results


def _apply(fn: Callable[[Any], Any], item: Any) -> Any:
    return fn(item)


def _stop(ray: Any, pending: Sequence[Any]) -> None:
    """Cancel the tasks left (an error, Ctrl-C) before the caller removes the staging directory."""
    if pending:
        for ref in pending:
            ray.cancel(ref, force=True)
        ray.wait(list(pending), num_returns=len(pending), timeout=30)


def cut(todo: Sequence[int], size: int) -> list[list[int]]:
    """``todo`` (sorted unit indices) in the chunks ``[k * size, (k + 1) * size)`` of all the units."""
    chunks: dict[int, list[int]] = {}
    for i in todo:
        chunks.setdefault(i // size, []).append(i)
    return [chunks[k] for k in sorted(chunks)]


def _get(ray: Any, ref: Any, what: str) -> Any:
    try:
        return ray.get(ref)
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.OwnerDiedError) as e:
        raise InputError(
            f"the Ray worker running {what} died {RETRIES + 1} times "
            f"({type(e).__name__}); fn may have crashed it (out of memory? a native library?)"
        ) from None
    except ray.exceptions.RayTaskError as e:  # not a unit's failure (those come back as Failures): a full disk...
        raise e.as_instanceof_cause() from None


def _run_task(job: UnitWork, chunk: list[tuple[int, Any]], staging: str, attempt: str, buffer_size: int) -> tuple[Part, ChunkDone]:
    """One Ray task: write the units of ``chunk`` into the chunk's own part directory."""
    storage.remote.restore(job.storage)
    directory = chunk_directory(staging, attempt, chunk[0][0], chunk[-1][0])
    with contextlib.suppress(ShardkitError):  # a retried task starts over: nothing is written twice
        remove_tree(directory)
    writer = UnitWriter(job, directory, buffer_size)
    reply = run_chunk(writer, chunk)
    return writer.finish(), reply
