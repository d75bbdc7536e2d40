"""Pass 1 on Ray against the local executor, on this machine: the time ratio and the cost of a task.

The same job (``UNITS`` input units, each ``fn`` making ``SAMPLES`` samples of ~4 KB of JSON-like
text, into ``PILES`` piles) runs with ``executor="local", workers=2`` and with ``executor="ray"``
on a two-node Ray cluster started here (``ray.cluster_utils.Cluster``, one CPU a node), round
robin, ``--repeats`` times; medians are quoted. The outputs are checked byte-identical. Then the
overhead of a task: the same number of tasks with units that yield nothing, on Ray, divided by
the number of tasks. Ray's start-up is outside every timing (the cluster is up before).

    python benchmarks/ray_pass1.py                 # ~2 minutes
    python benchmarks/ray_pass1.py --size smoke    # seconds (tests/test_benchmarks.py)

Goal: Ray within 1.3x of the local executor's time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"smoke": (8, 50, 4, 1), "small": (96, 1500, 32, 3)}  # units, samples a unit, piles, repeats


def make(unit: int, samples: int = 1500):
    """``samples`` JSON-like text samples of ~4 KB for one unit (some CPU work a sample, like parsing)."""
    words = [f"w{(unit * 7919 + k * 104729) % 100003}" for k in range(512)]
    for k in range(samples):
        text = " ".join(words[(k + j) % 512] for j in range(600))
        yield {"__key__": f"u{unit:05d}-{k:05d}", "json": {"unit": unit, "k": k, "text": text}}


def nothing(unit: int):
    return iter(())


def _files(directory: str) -> dict[str, bytes]:
    return {n: Path(directory, n).read_bytes() for n in sorted(os.listdir(directory))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    units, samples, piles, repeats = SIZES[args.size]
    repeats = args.repeats or repeats

    import functools

    import ray
    from ray import cluster_utils

    import shardkit
    from shardkit.piles.ray_executor import chunk_units

    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import ray_pass1  # the module by the name Ray workers import it by

    fn = functools.partial(ray_pass1.make, samples=samples)
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    times: dict[str, list[float]] = {"local": [], "ray": []}
    try:
        with tempfile.TemporaryDirectory() as work:
            for r in range(repeats):
                for name, kw in (("local", {"workers": 2}), ("ray", {"executor": "ray", "ray_address": cluster.address})):
                    out = os.path.join(work, f"{name}-{r}")
                    start = time.perf_counter()
                    m = shardkit.preprocess(range(units), fn, out, piles=piles, seed=1, quiet=True, **kw)
                    times[name].append(time.perf_counter() - start)
                    print(f"run {r}: {name:5} {times[name][-1]:7.2f} s  ({m.samples:,} samples, {m.bytes / 1e6:,.0f} MB)", flush=True)
                assert _files(os.path.join(work, f"local-{r}")) == _files(os.path.join(work, f"ray-{r}")), "outputs differ"
            tasks = -(-units // chunk_units(units, 2))
            empty = []
            for r in range(repeats):
                start = time.perf_counter()
                shardkit.preprocess(
                    range(units), ray_pass1.nothing, os.path.join(work, f"empty-{r}"), piles=piles, quiet=True, executor="ray"
                )
                empty.append(time.perf_counter() - start)
    finally:
        ray.shutdown()
        cluster.shutdown()
    local, on_ray, idle = (statistics.median(t) for t in (times["local"], times["ray"], empty))
    print(f"\n{units} units x {samples} samples into {piles} piles, medians of {repeats}:")
    print(f"  local executor, workers=2: {local:7.2f} s")
    print(f"  Ray, two local nodes:      {on_ray:7.2f} s   ratio {on_ray / local:.2f}x (goal <= 1.3x)")
    print(f"  a job of {tasks} empty tasks (+{piles} merge tasks) on Ray: {idle:.2f} s, {1000 * idle / (tasks + piles):.1f} ms a task")
    print("  outputs byte-identical: yes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
