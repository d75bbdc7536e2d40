"""Pass 1 from Parquet: shardkit.pile against HF datasets' shuffle and litdata.optimize, same files.

Every contender starts from the same Parquet files (written once, ``--rows`` rows of an id, a
label, a caption and a ``--bytes``-byte binary payload, ``--files`` files of 8 row groups) and
ends with the data on local disk in its own training format:

- ``shardkit.pile``: M random piles (the first half of the two-pass shuffle; the loader does the
  rest in RAM, so this output is already shuffled for training);
- ``datasets shuffle+flatten``: ``load_dataset("parquet")`` into a fresh Arrow cache, then
  ``.shuffle(seed).flatten_indices()``, which writes the permuted copy (HF's way to a shuffled
  dataset that reads sequentially);
- ``litdata.optimize``: one task per row group into litdata chunks (a conversion, not a shuffle:
  litdata shuffles chunks and samples at read time).

Each run is a fresh process (imports included in its wall time); the figures are the medians of
``--repeats`` runs, with samples/s and peak RSS (the main process's and its largest worker's).

    python benchmarks/from_parquet.py                       # 200,000 rows of 1 KiB, 3 repeats
    python benchmarks/from_parquet.py --rows 5000 --repeats 1   # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

CONTENDERS = ("shardkit.pile", "datasets shuffle+flatten", "litdata.optimize")


def write_parquet(directory: str, rows: int, files: int, payload: int) -> list[str]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    paths, per_file = [], -(-rows // files)
    for f in range(files):
        start, stop = f * per_file, min(rows, (f + 1) * per_file)
        blob = rng.integers(0, 256, size=(stop - start) * payload, dtype=np.uint8).tobytes()
        table = pa.table(
            {
                "id": np.arange(start, stop),
                "label": rng.integers(0, 1000, size=stop - start),
                "caption": [f"caption of row {i}" for i in range(start, stop)],
                "payload": [blob[i * payload : (i + 1) * payload] for i in range(stop - start)],
            }
        )
        path = os.path.join(directory, f"part-{f:05d}.parquet")
        pq.write_table(table, path, row_group_size=max(1, -(-(stop - start) // 8)))
        paths.append(path)
    return paths


def _row_group(unit: tuple[str, int]) -> Iterator[dict[str, object]]:
    import pyarrow.parquet as pq

    table = pq.ParquetFile(unit[0]).read_row_group(unit[1])
    yield from table.to_pylist()


def run_child(name: str, files: list[str], out: str, workers: int) -> int:
    """Run one contender in this (fresh) process; returns the samples written."""
    if name == "shardkit.pile":
        import shardkit

        return shardkit.pile(files, out, piles=64, workers=workers, quiet=True).samples
    if name == "datasets shuffle+flatten":
        import datasets

        datasets.disable_progress_bars()
        ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=out)
        shuffled = ds.shuffle(seed=0).flatten_indices(num_proc=workers if workers > 1 else None)
        return len(shuffled)
    if name == "litdata.optimize":
        import litdata
        import pyarrow.parquet as pq

        units = [(f, g) for f in files for g in range(pq.ParquetFile(f).num_row_groups)]
        litdata.optimize(fn=_row_group, inputs=units, output_dir=out, chunk_bytes="64MB", num_workers=workers, mode="overwrite")
        return sum(c["chunk_size"] for c in json.load(open(os.path.join(out, "index.json")))["chunks"])
    raise SystemExit(f"unknown contender {name!r}")


def measure(name: str, files: list[str], scratch: str, workers: int) -> dict[str, float]:
    """One fresh process running ``name``; its wall time, samples and peak memory."""
    out = os.path.join(scratch, "out")
    shutil.rmtree(out, ignore_errors=True)
    spec = json.dumps({"name": name, "files": files, "out": out, "workers": workers})
    start = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", spec], check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    shutil.rmtree(out, ignore_errors=True)
    return {"seconds": wall, **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--bytes", type=int, default=1024, help="payload bytes per row")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        spec = json.loads(args.child)
        samples = run_child(spec["name"], spec["files"], spec["out"], spec["workers"])
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(json.dumps({"samples": samples, "rss_mib": own, "worker_rss_mib": workers}))
        return
    scratch = tempfile.mkdtemp(prefix="shardkit-from-parquet-")
    try:
        os.makedirs(os.path.join(scratch, "in"))
        files = write_parquet(os.path.join(scratch, "in"), args.rows, args.files, args.bytes)
        size = sum(os.path.getsize(f) for f in files)
        print(
            f"{args.rows:,} rows of {args.bytes} B in {args.files} Parquet files ({size / 2**20:.0f} MiB), {args.workers} workers, "
            f"median of {args.repeats} fresh processes each, {os.cpu_count()} CPUs"
        )
        results = {}
        for name in CONTENDERS:
            runs = [measure(name, files, scratch, args.workers) for _ in range(args.repeats)]
            results[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        base = results["shardkit.pile"]["seconds"]
        print("| contender | samples | seconds | samples/s | peak RSS main / worker (MiB) | time vs shardkit |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, r in results.items():
            print(
                f"| {name} | {int(r['samples']):,} | {r['seconds']:.2f} | {r['samples'] / r['seconds']:,.0f} | "
                f"{r['rss_mib']:.0f} / {r['worker_rss_mib']:.0f} | {r['seconds'] / base:.2f}x |"
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
