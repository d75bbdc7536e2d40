"""Run pass 1's input units as Ray tasks, on this machine or across a cluster (``executor="ray"``).

The units are cut into contiguous chunks whose size depends only on the number of units, and
each chunk is one Ray task. A task writes its own part directory, named from its chunk
(``part-u000000120-000000135``), clearing it first: when Ray retries a task whose worker died,
the retry replaces the first attempt's files, so no sample is lost or written twice. The driver
keeps the :class:`~shardkit.piles.executor.Tally` as tasks finish and raises a failing unit
exactly as the local executor does; publishing then orders every pile's bytes by unit, so the
output is byte-identical to ``executor="local"``.

The staging directory must be a path every node sees (a shared filesystem): Ray moves the
units and the parts' bookkeeping, never the part files.

    parts = run_ray(job, units, staging, buffer_size=64 << 20, tally=tally, address="auto")
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from typing import Any

from shardkit import storage
from shardkit.errors import ConfigError, InputError
from shardkit.piles.executor import Tally, account
from shardkit.piles.units import ChunkDone, Part, UnitWork, UnitWriter, chunk_directory, run_chunk

log = logging.getLogger(__name__)

# how many times Ray runs a task again whose worker died (killed, out of memory, node lost)
RETRIES = 3
# the most tasks a job is cut into: each task writes a part file per pile, so this bounds the
# files publishing merges; more tasks balance a cluster better and redo less when one is retried
MAX_TASKS = 256
_POLL = 1.0  # seconds between progress bar refreshes while no task finishes

INSTALL_HINT = "executor='ray' needs Ray: pip install 'shardkit[ray]'"


def chunk_units(units: int) -> int:
    """Units per task: a function of the number of units only, never of the cluster's size."""
    return max(1, -(-units // MAX_TASKS))


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ConfigError(f"{INSTALL_HINT} ({e})") from None
    return ray


def connect(ray: Any, address: str | None) -> None:
    """Start or join Ray: None starts a light one here (or uses the session already open)."""
    if ray.is_initialized():
        return  # an open session is used as it is, whatever address it was opened with
    if address is None:
        ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, ignore_reinit_error=True)


def run_ray(job: UnitWork, units: Sequence[Any], staging: str, *, buffer_size: int, tally: Tally, address: str | None = None) -> list[Part]:
    """Process ``units`` as Ray tasks; one Part per task, in unit order.

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
    size = chunk_units(len(units))
    chunks = {}
    for start in range(0, len(units), size):
        chunk = [(i, units[i]) for i in range(start, min(start + size, len(units)))]
        chunks[task.remote(job_ref, chunk, staging, max(1, buffer_size // cpus))] = (chunk[0][0], chunk[-1][0])
    pending = list(chunks)
    parts: dict[int, Part] = {}
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=_POLL)
            for ref in done:
                part, reply = _result(ray, ref, chunks[ref])
                account(reply, job, tally)
                parts[chunks[ref][0]] = part
    finally:
        if pending:  # stop the tasks left before the caller removes the staging directory
            for ref in pending:
                ray.cancel(ref, force=True)
            ray.wait(pending, num_returns=len(pending), timeout=30)
    return [parts[first] for first in sorted(parts)]


def _result(ray: Any, ref: Any, span: tuple[int, int]) -> tuple[Part, ChunkDone]:
    try:
        return ray.get(ref)
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.OwnerDiedError) as e:
        raise InputError(
            f"the Ray worker running input units {span[0]}..{span[1]} died {RETRIES + 1} times "
            f"({type(e).__name__}); fn may have crashed it (out of memory? a native library?)"
        ) from None
    except ray.exceptions.RayTaskError as e:  # not a unit's failure (those come back as Failures): a full disk...
        raise e.as_instanceof_cause() from None


def _run_task(job: UnitWork, chunk: list[tuple[int, Any]], staging: str, buffer_size: int) -> tuple[Part, ChunkDone]:
    """One Ray task: write the units of ``chunk`` into the chunk's own part directory."""
    storage.remote.restore(job.storage)
    directory = chunk_directory(staging, chunk[0][0], chunk[-1][0])
    shutil.rmtree(directory, ignore_errors=True)  # a retried task starts over: nothing is written twice
    writer = UnitWriter(job, directory, buffer_size)
    reply = run_chunk(writer, chunk)
    return writer.finish(), reply
