"""One shardkit process against ShardkitDataLoader, epoch by epoch: what the workers' start costs.

Case f of ``run.py`` reads one epoch from a fresh process, so the DataLoader's rows carry the
start of its workers (forking a process that has imported torch, and each worker's first pile)
on few samples. Here each contender reads several epochs of the same raw ~5 KB samples in a
fresh process: the first epoch with that start, the later ones with it behind them (the
DataLoader's workers persistent, the one process's loader kept). Runs alternate their order;
medians of ``--repeats``; ratios are the DataLoader's samples/s over the one process's. The
runner only waits for each process (``run.py``'s harness polls the process tree's memory every
5 ms, which takes CPU from a contender that needs both cores).

    python benchmarks/dataloader_epochs.py                         # 30,000 samples (12 piles), 4 epochs
    python benchmarks/dataloader_epochs.py --samples 100000 --piles 40 --epochs 3
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import json
import subprocess

import harness
from _timing import cpu_seconds

GOAL = 0.8


def build(root: str, samples: int, piles: int) -> str:
    """Raw samples of 2,500-7,500 random bytes (about 5 KB) and a class label, in ``piles`` piles (reused when present)."""
    import numpy as np

    import shardkit

    out = os.path.join(root, f"raw5k-{samples}-{piles}")
    if os.path.exists(os.path.join(out, "shardkit.json")):
        return out
    rng = np.random.default_rng(0)
    with shardkit.PileWriter(out, piles=piles, seed=0) as w:
        for i in range(samples):
            w.write({"__key__": f"{i:09d}", "bin": rng.bytes(int(rng.integers(2500, 7500))), "cls": i * 10 // samples})
    return out


def one_process(p: dict[str, Any]) -> dict[str, Any]:
    """``shardkit.loader(decode=False)``: one sample at a time, one loader for every epoch."""
    import shardkit

    t0 = time.perf_counter()
    cpu0 = cpu_seconds()
    loader = shardkit.loader(p["dir"], decode=False, seed=0)

    def read(epoch: int) -> int:
        loader.set_epoch(epoch)
        return sum(1 for _ in loader)

    figures = _run(read, p["epochs"], t0)
    loader.close()
    figures["cpu_s"] = cpu_seconds() - cpu0
    return figures


def dataloader(p: dict[str, Any]) -> dict[str, Any]:
    """``ShardkitDataLoader(ShardkitDataset(decode=False, batch_size=B), num_workers=k, persistent_workers=True)``."""
    from shardkit.torch import ShardkitDataLoader, ShardkitDataset

    t0 = time.perf_counter()
    cpu0 = cpu_seconds()
    dataset = ShardkitDataset(p["dir"], batch_size=p["batch_size"], decode=False, seed=0)
    loader = ShardkitDataLoader(dataset, num_workers=p["workers"], persistent_workers=True)

    def read(epoch: int, loader: ShardkitDataLoader = loader) -> int:
        dataset.set_epoch(epoch)
        return sum(len(b["__key__"]) for b in loader)

    figures = _run(read, p["epochs"], t0)
    del read, loader  # its workers stop and are waited for: their CPU time is counted
    gc.collect()
    figures["cpu_s"] = cpu_seconds() - cpu0
    return figures


def _tree_cpu() -> float:
    """CPU seconds of this process and of its live children (persistent DataLoader workers)."""
    import psutil

    total = 0.0
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _run(read: Any, epochs: int, t0: float) -> dict[str, Any]:
    """Run the epochs; samples/s of the first (from before the loader was made) and of the later
    ones, and the CPU a sample of the later ones took, workers included."""
    ends, counts = [], []
    for epoch in range(epochs):
        if epoch == 1:
            cpu1 = _tree_cpu()
        counts.append(read(epoch))
        ends.append(time.perf_counter() - t0)
    later_cpu = (_tree_cpu() - cpu1) / sum(counts[1:])
    return {
        "first_epoch": counts[0] / ends[0],
        "later_epochs": sum(counts[1:]) / (ends[-1] - ends[0]),
        "later_cpu": later_cpu,
        "samples": sum(counts),
    }


def _fresh(contender: str, params: dict[str, Any]) -> dict[str, Any]:
    """``contender(params)`` in a fresh interpreter, as the harness would start it."""
    code = f"import json, sys; import dataloader_epochs as d; print(json.dumps(d.{contender}(json.loads(sys.argv[1]))))"
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(params)], env=harness.child_env(), capture_output=True, text=True, timeout=1800
    )
    if out.returncode != 0:
        raise RuntimeError(f"{contender}: exit {out.returncode}: {out.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=30000)
    parser.add_argument("--piles", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", default=os.path.join(harness.HERE, "results", "dataloader_epochs"))
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs: at least 2 (the first epoch carries the start, the later ones do not)")
    path = build(args.data, args.samples, args.piles)
    params = {"dir": path, "epochs": args.epochs, "workers": args.workers, "batch_size": args.batch_size}
    contenders = {"shardkit.loader, one process": "one_process", "ShardkitDataLoader": "dataloader"}
    load = os.getloadavg()[0]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    for r in range(args.repeats):
        order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for name in order:
            runs[name].append(_fresh(contenders[name], params))
    med = {
        name: {k: statistics.median(run[k] for run in rs) for k in ("first_epoch", "later_epochs", "cpu_s", "later_cpu", "samples")}
        for name, rs in runs.items()
    }
    one, dl = med["shardkit.loader, one process"], med["ShardkitDataLoader"]
    lines = [
        f"Command: `python benchmarks/dataloader_epochs.py {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip(),
        f"{args.samples:,} raw ~5 KB samples in {args.piles} piles, {args.epochs} epochs a process; DataLoader: {args.workers} "
        f"workers, batch {args.batch_size}. {args.repeats} fresh processes each, alternating, medians; warm page cache; "
        f"load average {load:.2f} before and {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} cores.",
        "",
        "| contender | first epoch samples/s | later epochs samples/s | CPU µs/sample, all epochs | CPU µs/sample, later epochs |",
        "|---|---|---|---|---|",
    ]
    for name, m in med.items():
        lines.append(
            f"| {name} | {m['first_epoch']:,.0f} | {m['later_epochs']:,.0f} | {m['cpu_s'] / m['samples'] * 1e6:.1f} "
            f"| {m['later_cpu'] * 1e6:.1f} |"
        )
    first, later = dl["first_epoch"] / one["first_epoch"], dl["later_epochs"] / one["later_epochs"]
    cores = min(os.cpu_count() or 1, args.workers + 1)
    # None where the later epochs were too short for the clock of CPU time (10 ms steps)
    bound = min(1.0, cores * one["later_cpu"] / dl["later_cpu"]) if dl["later_cpu"] > 0 else None
    lines += [
        "",
        f"ShardkitDataLoader over one process: first epoch {first:.2f}x, later epochs {later:.2f}x "
        f"(goal ≥ {GOAL}x: {'met' if later >= GOAL else 'missed'} once the workers run).",
        f"CPU bound on {cores} idle cores for the later epochs: {cores} x {one['later_cpu'] * 1e6:.1f} / "
        f"{dl['later_cpu'] * 1e6:.1f} = {bound:.2f}x (the one process uses one core; the DataLoader's processes all of them)."
        if bound is not None
        else "CPU bound: not measured (the later epochs took less CPU time than the clock resolves; read more samples).",
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
