"""What a pass-1 job costs at scale, on paper and in a dry run through the real router.

:func:`plan` gives, from the job's shape alone (samples, units, piles M, mean sample size, the
executor and its parallelism, a local or object-store output), the files and objects a job
makes, the requests it sends to an object store, the merge's fan-in and the memory of a task
and of the driver. :func:`simulate` checks the counts that depend on the draw: it routes every
sample of every unit with the router pass 1 uses (``(seed, unit, ordinal)`` -> pile) and counts
pile sizes, the piles that would be split, and the (unit, pile) segments the driver keeps.
Nothing is read or written.

    shape = Shape(samples=10**9, units=10**4, piles=10**4, sample_bytes=4096, executor="ray")
    print(format_plan(plan(shape), simulate(shape)))     # or: shardkit plan --samples 1e9 ...

The formulas (P writers: ``workers`` processes, or ``min(units, 4 x CPUs, 256)`` Ray tasks; n samples of
b bytes; M piles; s = n / M):

- part files on the staging disk: P (M + 1) (the bytes of each pile, and one file of 8-byte key
  hashes a writer); each pile is merged from at most P runs (the fan-in), one pile a task.
- objects in an object-store output: M' + 1 (the piles after splits, and the manifest), plus
  the journal (written, rewritten, deleted); PUT requests: sum over piles of
  ceil(pile bytes / 16 MiB) (+2 for each pile sent in parts), the manifest, and 4 for the journal
  (written and deleted when the job starts, and around the install).
- driver memory: 32 bytes a (unit, pile) segment, at most min(units x M, n) of them, plus
  16 bytes a sample of the one pile whose keys are being checked.
- a task's memory: its share of ``buffer_size`` (split among the processes running at once),
  the keys of the unit it runs, and what ``fn`` holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit._util import format_size
from shardkit.piles import router
from shardkit.piles.publish import capacity
from shardkit.piles.ray_executor import chunk_units

# bytes of one segment row the driver keeps: unit, start, end, samples (int64 each)
SEGMENT_BYTES = 32
# bytes one request uploads (storage.remote.UPLOAD_CHUNK)
UPLOAD_CHUNK = 16 << 20
# what S3 documents per prefix and second
S3_PUTS = 3500
S3_GETS = 5500


@dataclass(frozen=True)
class Shape:
    """The shape of a pass-1 job."""

    samples: int
    units: int
    piles: int
    sample_bytes: int = 4096
    executor: str = "local"
    # processes running at once: local workers, or the CPUs of the Ray cluster
    workers: int = 8
    remote: bool = True
    max_pile_bytes: int | None = None
    buffer_size: int = 64 << 20
    seed: int = 0


def writers(shape: Shape) -> int:
    """Processes or tasks that each write a part per pile."""
    if shape.executor == "ray":
        return math.ceil(shape.units / chunk_units(shape.units, shape.workers))
    return min(shape.workers, shape.units)


def plan(shape: Shape) -> dict[str, Any]:
    """The job's costs from its shape, by the formulas of the module's docstring."""
    n, m, p = shape.samples, shape.piles, writers(shape)
    mean = n / m
    data = n * shape.sample_bytes
    pile_bytes = mean * shape.sample_bytes
    requests_per_pile = max(1, math.ceil(pile_bytes / UPLOAD_CHUNK)) + (2 if pile_bytes > UPLOAD_CHUNK else 0)
    segments = min(shape.units * m, n)
    return {
        "writers": p,
        "mean_pile_samples": mean,
        "pile_sd": math.sqrt(mean * (1 - 1 / m)),
        "pile_bytes": pile_bytes,
        "data_bytes": data,
        "staging_files": p * (m + 1),
        "merge_fan_in": p,
        "objects": m + 1 if shape.remote else 0,
        "put_requests": m * requests_per_pile + 1 + 4 if shape.remote else 0,
        "driver_segments": segments,
        "driver_bytes": segments * SEGMENT_BYTES + 16 * mean,
        "task_buffer": shape.buffer_size // max(1, shape.workers),
    }


def simulate(shape: Shape, *, progress: Any = None) -> dict[str, Any]:
    """Route every sample with the real router and count what the draw decides.

    Samples are spread over the units as evenly as whole numbers allow. Counts the pile sizes,
    how many piles ``max_pile_bytes`` would split, and the (unit, pile) segments: a unit's
    samples in one pile are one segment.
    """
    per_unit, extra = divmod(shape.samples, shape.units)
    totals = np.zeros(shape.piles, dtype=np.int64)
    segments = 0
    for unit in range(shape.units):
        count = per_unit + (unit < extra)
        hits = np.bincount(router.route(piles=shape.piles, seed=shape.seed, unit=unit, count=count), minlength=shape.piles)
        totals += hits
        segments += int(np.count_nonzero(hits))
        if progress is not None:
            progress(1)
    most = capacity(shape.max_pile_bytes, shape.samples, shape.samples * shape.sample_bytes)
    split = int(np.count_nonzero(totals > most)) if most is not None else 0
    return {
        "samples": int(totals.sum()),
        "largest_pile": int(totals.max()),
        "smallest_pile": int(totals.min()),
        "pile_sd": float(totals.std()),
        "split_piles": split,
        "driver_segments": segments,
        "driver_bytes": segments * SEGMENT_BYTES + 16 * int(totals.max()),
    }


def format_plan(planned: dict[str, Any], simulated: dict[str, Any] | None = None) -> str:
    """The plan (and the simulation beside it) as a table."""
    rows = [
        ("writers (processes or Ray tasks)", f"{planned['writers']:,}", ""),
        ("samples a pile (mean, sd)", f"{planned['mean_pile_samples']:,.0f} +- {planned['pile_sd']:,.0f}", ""),
        ("bytes a pile", format_size(int(planned["pile_bytes"])), ""),
        ("part files while staging", f"{planned['staging_files']:,}", ""),
        ("merge fan-in (runs a pile)", f"<= {planned['merge_fan_in']:,}", ""),
        ("objects written", f"{planned['objects']:,}", ""),
        ("PUT requests", f"{planned['put_requests']:,}", f"{planned['put_requests'] / S3_PUTS:,.1f} s of one prefix's PUT budget"),
        ("segments the driver keeps", f"<= {planned['driver_segments']:,}", ""),
        ("driver memory", f"<= {format_size(int(planned['driver_bytes']))}", ""),
        ("write buffer a task", format_size(int(planned["task_buffer"])), ""),
    ]
    lines = [f"{'':34} {'formula':>22}  {'simulated':>22}"]
    simulated_values = {}
    if simulated is not None:
        simulated_values = {
            "samples a pile (mean, sd)": f"{simulated['smallest_pile']:,}..{simulated['largest_pile']:,} (sd {simulated['pile_sd']:,.0f})",
            "segments the driver keeps": f"{simulated['driver_segments']:,}",
            "driver memory": format_size(simulated["driver_bytes"]),
        }
    for name, value, note in rows:
        lines.append(f"{name:34} {value:>22}  {simulated_values.get(name, ''):>22}  {note}".rstrip())
    if simulated is not None:
        lines.append(f"{'piles max_pile_bytes splits':34} {'':>22}  {simulated['split_piles']:>22,}")
    return "\n".join(lines)
