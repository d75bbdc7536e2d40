"""Random access: the latency of ``ds[i]`` at random indices, shardkit.open against Mosaic's and litdata's StreamingDataset.

The same samples (a key, a ``--bytes``-byte payload and an integer label) are written once in
each library's own format on local disk: shardkit piles (``PileWriter``, 16 piles), MosaicML
MDS (``MDSWriter``, uncompressed) and litdata chunks (its ``BinaryWriter``, what
``litdata.optimize`` writes with). Each contender then
runs in a fresh process: it opens its dataset, reads ``--warmup`` random samples (shardkit's
index is built and stored by its first open, which is not timed; the files sit in the page
cache: a warm local cache), then times ``--reads`` random ``ds[i]`` one by one, the same
indices for everyone. Figures are the medians over ``--repeats`` processes of each run's p50 and
p99 latency; ratios are against shardkit.

    python benchmarks/random_access.py                          # 100,000 samples of 1 KiB, 10,000 reads, 3 repeats
    python benchmarks/random_access.py --samples 2000 --reads 200 --repeats 1   # seconds
    python benchmarks/random_access.py --index-only --samples 1000000   # the index alone: build time, size, load time
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CONTENDERS = ("shardkit.open", "mosaic StreamingDataset", "litdata StreamingDataset")


def _sample(i: int, payload: int) -> dict[str, Any]:
    return {"key": f"sample-{i:09d}", "bin": i.to_bytes(8, "little") * (payload // 8), "cls": i % 1000}


def write_shardkit(out: str, n: int, payload: int) -> None:
    import shardkit

    with shardkit.PileWriter(out, piles=16, seed=0) as w:
        for i in range(n):
            s = _sample(i, payload)
            w.write({"__key__": s["key"], "bin": s["bin"], "cls": s["cls"]})
    shardkit.open(out)[0]  # builds and stores the index: a user pays this once, not per read


def write_mds(out: str, n: int, payload: int) -> None:
    from bench_read import _import_streaming

    streaming, _ = _import_streaming()
    with streaming.MDSWriter(out=out, columns={"key": "str", "bin": "bytes", "cls": "int"}, compression=None) as w:
        for i in range(n):
            w.write(_sample(i, payload))


def write_litdata(out: str, n: int, payload: int) -> None:
    """litdata's chunk format, written in this process by the writer ``litdata.optimize`` runs in its workers."""
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(cache_dir=out, chunk_bytes="64MB")
    for i in range(n):
        writer[i] = _sample(i, payload)
    writer.done()
    writer.merge(1)


def open_contender(name: str, root: str) -> Any:
    if name == "shardkit.open":
        import shardkit

        return shardkit.open(os.path.join(root, "shardkit"))
    if name == "mosaic StreamingDataset":
        from bench_read import _import_streaming

        streaming, _ = _import_streaming()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        return streaming.StreamingDataset(local=os.path.join(root, "mds"), shuffle=False, batch_size=1)
    if name == "litdata StreamingDataset":
        import litdata

        return litdata.StreamingDataset(input_dir=os.path.join(root, "litdata"))
    raise SystemExit(f"unknown contender {name!r}")


def index_figures(n: int) -> None:
    """Build, store and load the index of an ``n``-sample, 64-pile dataset of small samples; print its figures."""
    import shardkit
    from shardkit import manifest
    from shardkit.loading import index

    root = tempfile.mkdtemp(prefix="shardkit-index-")
    try:
        out = os.path.join(root, "ds")
        with shardkit.PileWriter(out, piles=64, seed=0) as w:
            for i in range(n):
                w.write({"__key__": f"sample-{i:09d}", "cls": i % 1000})
        m = manifest.read(out)
        start = time.perf_counter()
        built = index.build(out, m)
        build = time.perf_counter() - start
        data = index.encode(built, m)
        start = time.perf_counter()
        index.decode(data, m, "index")
        load = time.perf_counter() - start
        print(
            f"{n:,} samples: index built in {build:.2f} s (every pile read and indexed), {built.nbytes / 1e6:.1f} MB in memory "
            f"({built.nbytes / n:.1f} B a sample), {len(data) / 1e6:.1f} MB stored, loaded and checked in {load:.3f} s; "
            f"{os.cpu_count()} CPUs"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_child(name: str, root: str, reads: int, warmup: int, seed: int) -> dict[str, Any]:
    """In a fresh process: open, warm up, then time ``reads`` random ``ds[i]``."""
    import numpy as np

    ds = open_contender(name, root)
    n = len(ds)
    rng = np.random.default_rng(seed)
    for i in rng.integers(0, n, size=warmup).tolist():
        ds[i]
    indices = rng.integers(0, n, size=reads).tolist()
    times = np.empty(reads)
    clock = time.perf_counter
    for k, i in enumerate(indices):
        start = clock()
        sample = ds[i]
        times[k] = clock() - start
    key = sample["__key__"] if "__key__" in sample else sample["key"]
    if int(sample["cls"]) != int(key.rsplit("-", 1)[1]) % 1000:  # each library's own order: check by key
        raise SystemExit(f"{name}: ds[{indices[-1]}] is {key!r} with label {sample['cls']}, which that key was not written with")
    return {"len": n, "p50_us": float(np.percentile(times, 50) * 1e6), "p99_us": float(np.percentile(times, 99) * 1e6)}


def measure(name: str, root: str, reads: int, warmup: int, seed: int) -> dict[str, Any]:
    spec = json.dumps({"name": name, "root": root, "reads": reads, "warmup": warmup, "seed": seed})
    done = subprocess.run([sys.executable, __file__, "--child", spec], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--bytes", type=int, default=1024, help="payload bytes per sample")
    parser.add_argument("--reads", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--index-only", action="store_true", help="measure the index alone (build, size, load)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.index_only:
        index_figures(args.samples)
        return {}
    if args.child is not None:
        spec = json.loads(args.child)
        print(json.dumps(run_child(spec["name"], spec["root"], spec["reads"], spec["warmup"], spec["seed"])))
        return {}
    root = tempfile.mkdtemp(prefix="shardkit-random-access-")
    try:
        write_shardkit(os.path.join(root, "shardkit"), args.samples, args.bytes)
        write_mds(os.path.join(root, "mds"), args.samples, args.bytes)
        write_litdata(os.path.join(root, "litdata"), args.samples, args.bytes)
        print(
            f"{args.samples:,} samples of {args.bytes} B, {args.reads:,} random ds[i] after {args.warmup:,} warm-up reads, "
            f"local disk, median of {args.repeats} fresh processes each, {os.cpu_count()} CPUs"
        )
        results: dict[str, dict[str, float]] = {}
        for name in CONTENDERS:
            runs = [measure(name, root, args.reads, args.warmup, seed) for seed in range(args.repeats)]
            if any(r["len"] != args.samples for r in runs):
                raise SystemExit(f"{name}: len(ds) is {runs[0]['len']}, expected {args.samples}")
            results[name] = {k: statistics.median(r[k] for r in runs) for k in ("p50_us", "p99_us")}
        base = results["shardkit.open"]
        print("| contender | p50 (µs) | p99 (µs) | p50 vs shardkit | p99 vs shardkit |")
        print("|---|---:|---:|---:|---:|")
        for name, r in results.items():
            print(
                f"| {name} | {r['p50_us']:.1f} | {r['p99_us']:.1f} | {r['p50_us'] / base['p50_us']:.2f}x | "
                f"{r['p99_us'] / base['p99_us']:.2f}x |"
            )
        return results
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
