"""One shardkit process against ShardkitDataLoader, epoch by epoch: what the workers' start costs.

Case f of ``run.py`` reads one epoch from a fresh process, so the DataLoader's rows carry the
start of its workers (forking a process that has imported torch, and each worker's first pile)
on few samples. Here each contender reads several epochs of the same raw ~5 KB samples in a
fresh process: the first epoch with that start, the later ones with it behind them (the
DataLoader's workers persistent, the one process's loader kept). Runs alternate their order;
medians of ``--repeats``; ratios are the DataLoader's samples/s over the one process's. The
runner only waits for each process (``run.py``'s harness polls the process tree's memory every
5 ms, which takes CPU from a contender that needs both cores).

A third row says what torch's DataLoader itself allows: a DataLoader with the same workers,
prefetch and batches whose processes only burn the CPU a batch ShardkitDataLoader's main process
and workers spent (less what the DataLoader costs a batch with no work), and hand over tiny
items. Its rate over the one process's is the best the DataLoader's hand-over of batches of that
much work reaches on this machine; ShardkitDataLoader's rate over it is what its data costs
beyond the CPU.

    python benchmarks/dataloader_epochs.py                         # 30,000 samples (12 piles), 4 epochs
    python benchmarks/dataloader_epochs.py --samples 100000 --piles 40 --epochs 3
    python benchmarks/dataloader_epochs.py --mix 2                 # piles mixed position by position
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

import harness
from _timing import cpu_seconds, load_shardkit

GOAL = 0.8
MACHINERY = "torch DataLoader, the same CPU a batch, no data"


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

    load_shardkit()  # as run.py's contenders: not in one contender's first epoch only
    t0 = time.perf_counter()
    cpu0 = cpu_seconds()
    loader = shardkit.loader(p["dir"], decode=False, seed=0, mix=p["mix"])

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

    load_shardkit()  # as run.py's contenders: not in one contender's first epoch only
    t0 = time.perf_counter()
    cpu0 = cpu_seconds()
    dataset = ShardkitDataset(p["dir"], batch_size=p["batch_size"], decode=False, seed=0, mix=p["mix"])
    loader = ShardkitDataLoader(dataset, num_workers=p["workers"], persistent_workers=True)

    def read(epoch: int, loader: ShardkitDataLoader = loader) -> int:
        dataset.set_epoch(epoch)
        return sum(len(b["__key__"]) for b in loader)

    figures = _run(read, p["epochs"], t0, batch_size=p["batch_size"])
    del read, loader  # its workers stop and are waited for: their CPU time is counted
    gc.collect()
    figures["cpu_s"] = cpu_seconds() - cpu0
    return figures


def _spin(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU time (time it is not scheduled does not count)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class _Spinning:
    """An iterable dataset whose worker spends ``worker_s`` of CPU on each of its ``items`` items (tiny ints)."""

    def __init__(self, items: int, worker_s: float) -> None:
        self.items, self.worker_s = items, worker_s

    def __iter__(self) -> Any:
        for i in range(self.items):
            _spin(self.worker_s)
            yield i


def machinery(p: dict[str, Any]) -> dict[str, Any]:
    """A torch DataLoader with the same workers, prefetch and number of batches as
    ``ShardkitDataLoader``, whose processes only spend the CPU a batch that it measured
    (``worker_s`` in a worker, ``main_s`` in the main process, each less what this DataLoader
    itself costs a batch with no work, measured first): how fast torch's DataLoader hands over
    batches of that much work on this machine, with no data at all."""
    from torch.utils.data import DataLoader, IterableDataset

    from shardkit.loading.torch import RAW_PREFETCH

    class Spinning(_Spinning, IterableDataset):  # type: ignore[misc]
        pass

    per_worker = -(-p["batches"] // p["workers"])

    def measure(worker_s: float, main_s: float, epochs: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        dataset = Spinning(per_worker, worker_s)
        loader = DataLoader(dataset, batch_size=None, num_workers=p["workers"], persistent_workers=True, prefetch_factor=RAW_PREFETCH)

        def read(epoch: int) -> int:
            n = 0
            for _ in loader:
                _spin(main_s)
                n += 1
            return n * p["batch_size"]

        return _run(read, epochs, t0, batch_size=p["batch_size"])

    idle = measure(0.0, 0.0, 11)  # what the machinery itself costs a batch, in each process (10 epochs: CPU time is read in 10 ms steps)
    worker_s = max(0.0, p["worker_s"] - idle["worker_batch_s"])
    main_s = max(0.0, p["main_s"] - idle["main_batch_s"])
    figures = measure(worker_s, main_s, p["epochs"])
    figures["cpu_s"] = 0.0
    return figures


def _tree_cpu() -> tuple[float, float]:
    """CPU seconds of this process, and of its live children (persistent DataLoader workers)."""
    import psutil

    found = [0.0, 0.0]
    for k, proc in enumerate([psutil.Process(), *psutil.Process().children(recursive=True)]):
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        found[min(k, 1)] += t.user + t.system
    return found[0], found[1]


def _run(read: Any, epochs: int, t0: float, batch_size: int | None = None) -> dict[str, Any]:
    """Run the epochs; samples/s of the first (from before the loader was made) and of the later
    ones, and the CPU a sample of the later ones took, workers included (with ``batch_size``,
    also the main process's and the workers' CPU a batch)."""
    ends, counts = [], []
    for epoch in range(epochs):
        if epoch == 1:
            main1, workers1 = _tree_cpu()
        counts.append(read(epoch))
        ends.append(time.perf_counter() - t0)
    main2, workers2 = _tree_cpu()
    later = sum(counts[1:])
    figures = {
        "first_epoch": counts[0] / ends[0],
        "later_epochs": later / (ends[-1] - ends[0]),
        "later_cpu": (main2 - main1 + workers2 - workers1) / later,
        "samples": sum(counts),
    }
    if batch_size:
        batches = -(-later // batch_size)
        figures |= {"main_batch_s": (main2 - main1) / batches, "worker_batch_s": (workers2 - workers1) / batches, "batches": batches}
    return figures


def _fresh(contender: str, params: dict[str, Any]) -> dict[str, Any]:
    """``contender(params)`` in a fresh interpreter (see :func:`harness.call_fresh`)."""
    return harness.call_fresh(f"dataloader_epochs:{contender}", params)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=30000)
    parser.add_argument("--piles", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mix", type=int, default=1, help="piles read at once, mixed position by position (the loaders' mix)")
    parser.add_argument("--data", default=os.path.join(harness.HERE, "results", "dataloader_epochs"))
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs: at least 2 (the first epoch carries the start, the later ones do not)")
    path = build(args.data, args.samples, args.piles)
    params = {"dir": path, "epochs": args.epochs, "workers": args.workers, "batch_size": args.batch_size, "mix": args.mix}
    contenders = {"shardkit.loader, one process": "one_process", "ShardkitDataLoader": "dataloader"}
    load = os.getloadavg()[0]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    for r in range(args.repeats):
        order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for name in order:
            runs[name].append(_fresh(contenders[name], params))
    keys = ("first_epoch", "later_epochs", "cpu_s", "later_cpu", "samples")
    med = {name: {k: statistics.median(run[k] for run in rs) for k in keys} for name, rs in runs.items()}
    one, dl = med["shardkit.loader, one process"], med["ShardkitDataLoader"]
    # the same CPU a batch in each process, handed over by torch's DataLoader with no data
    cost = {k: statistics.median(run[k] for run in runs["ShardkitDataLoader"]) for k in ("main_batch_s", "worker_batch_s", "batches")}
    per_epoch = round(cost["batches"] / (args.epochs - 1))
    spin = params | {"main_s": cost["main_batch_s"], "worker_s": cost["worker_batch_s"], "batches": per_epoch}
    spun = [_fresh("machinery", spin) for _ in range(args.repeats)]
    med[MACHINERY] = {k: statistics.median(run[k] for run in spun) for k in keys}
    lines = [
        f"Command: `python benchmarks/dataloader_epochs.py {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip(),
        f"{args.samples:,} raw ~5 KB samples in {args.piles} piles (mix {args.mix}), {args.epochs} epochs a process; DataLoader: {args.workers} "
        f"workers, batch {args.batch_size}. {args.repeats} fresh processes each, alternating, medians; warm page cache; "
        f"load average {load:.2f} before and {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} cores.",
        "",
        "| contender | first epoch samples/s | later epochs samples/s | CPU µs/sample, all epochs | CPU µs/sample, later epochs |",
        "|---|---|---|---|---|",
    ]
    for name, m in med.items():
        all_cpu = f"{m['cpu_s'] / m['samples'] * 1e6:.1f}" if name != MACHINERY else "—"
        lines.append(f"| {name} | {m['first_epoch']:,.0f} | {m['later_epochs']:,.0f} | {all_cpu} | {m['later_cpu'] * 1e6:.1f} |")
    first, later = dl["first_epoch"] / one["first_epoch"], dl["later_epochs"] / one["later_epochs"]
    cores = min(os.cpu_count() or 1, args.workers + 1)
    # the samples/s the DataLoader's CPU a sample allows on those cores, over the one process's
    # (which keeps more than one core busy: its pile reader thread beside the consumer); None where
    # the later epochs were too short for the clock of CPU time (10 ms steps)
    bound = cores / (dl["later_cpu"] * one["later_epochs"]) if dl["later_cpu"] > 0 else None
    lines += [
        "",
        f"ShardkitDataLoader over one process: first epoch {first:.2f}x, later epochs {later:.2f}x "
        f"(goal ≥ {GOAL}x: {'met' if later >= GOAL else 'missed'} once the workers run).",
        f"CPU bound on {cores} idle cores for the later epochs: {cores} cores / {dl['later_cpu'] * 1e6:.1f} µs a sample = "
        f"{cores / dl['later_cpu']:,.0f} samples/s, {bound:.2f}x one process (which keeps "
        f"{one['later_cpu'] * one['later_epochs']:.2f} cores busy at {one['later_cpu'] * 1e6:.1f} µs a sample)."
        if bound is not None
        else "CPU bound: not measured (the later epochs took less CPU time than the clock resolves; read more samples).",
        f"{MACHINERY}: {cost['main_batch_s'] * 1e3:.3f} ms of CPU a batch in the main process and "
        f"{cost['worker_batch_s'] * 1e3:.3f} ms in a worker, as ShardkitDataLoader spent them; "
        f"{med[MACHINERY]['later_epochs'] / one['later_epochs']:.2f}x one process. "
        f"ShardkitDataLoader reaches {dl['later_epochs'] / med[MACHINERY]['later_epochs']:.2f}x of it.",
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
