"""Per-batch composition of a blend: shardkit's stratified schedule against the iid draw peers use.

litdata's ``CombinedStreamingDataset(weights)``, HF ``interleave_datasets(probabilities)`` and
WebDataset's ``RandomMix`` draw each sample's source independently, so a batch's share of a
source is Binomial around its target. shardkit's schedule fixes each batch's count to the floor or
the ceiling of the target. For each mixture and batch size this prints, per source and for both,
how far batches stray from the target (mean and worst absolute difference, in samples, the share of
batches more than one sample off, and the standard deviation), over the same number of batches.
Then it reads real blends through ``shardkit.loader`` to check the loader holds what the schedule
says, times a blend against one dataset of the same samples (median of the repeats), and times a
blend whose second source holds 1 or 10 samples at half its share.

    python benchmarks/blend.py                  # a minute or so
    python benchmarks/blend.py --size smoke     # seconds; what tests/test_blend_bench.py runs
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time

import numpy as np

import shardkit
from shardkit.loading.blend.frames import Frames, apportion, composition, iid_sources

MIXTURES = {"70/30": (0.7, 0.3), "50/30/20": (0.5, 0.3, 0.2), "90/5/5": (0.9, 0.05, 0.05), "8 even": (1,) * 8}
SIZES = {"smoke": {"batches": 200, "samples": 2_000, "repeats": 1}, "small": {"batches": 20_000, "samples": 60_000, "repeats": 3}}


def deviations(counts: np.ndarray, target: np.ndarray) -> dict[str, np.ndarray]:
    """Per source: mean and worst |count - target|, share of batches off by more than one, sd."""
    off = np.abs(counts - target[None, :])
    return {"mean": off.mean(axis=0), "max": off.max(axis=0), "over1": (off > 1).mean(axis=0), "sd": counts.std(axis=0)}


def compare(weights: tuple[float, ...], batch: int, batches: int, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    length = batch * batches
    shares = apportion(list(weights), length)
    target = np.array(shares) * batch / length
    tight = composition(Frames(tuple(shares), frame=batch, seed=seed, epoch=0), 0, batches)
    drawn = iid_sources(weights, length, np.random.default_rng(seed)).reshape(batches, batch)
    iid = np.stack([(drawn == s).sum(axis=1) for s in range(len(weights))], axis=1)
    return deviations(tight, target), deviations(iid, target)


def _cell(d: dict[str, np.ndarray], s: int) -> str:
    return f"{d['mean'][s]:.2f} / {d['max'][s]:.2f} / {d['over1'][s]:.1%} / {d['sd'][s]:.2f}"


def composition_table(batches: int) -> list[str]:
    rows = [
        "| mixture | batch | source | target | shardkit mean / max / >1 off / sd | iid draw mean / max / >1 off / sd |",
        "|---|---:|---|---:|---|---|",
    ]
    for name, weights in MIXTURES.items():
        for batch in (32, 256):
            tight, iid = compare(weights, batch, batches)
            total = sum(weights)
            shown = range(len(weights)) if len(weights) <= 3 else [0]
            for s in shown:
                rows.append(f"| {name} | {batch} | {s} | {batch * weights[s] / total:.2f} | {_cell(tight, s)} | {_cell(iid, s)} |")
    return rows


def make(root: str, name: str, n: int, seed: int) -> str:
    out = os.path.join(root, name)
    rng = np.random.default_rng(seed)
    with shardkit.PileWriter(out, piles=16, seed=seed) as w:
        for i in range(n):
            w.write({"__key__": f"{name}{i:07d}", "bin": rng.bytes(512), "cls": i % 10})
    return out


def through_the_loader(root: str, samples: int, repeats: int) -> list[str]:
    """Worst per-batch deviation as read by shardkit.loader, and blend vs single-dataset speed."""
    a, b = make(root, "a", samples * 7 // 10, 1), make(root, "b", samples * 3 // 10, 2)
    whole = make(root, "whole", samples, 3)
    lines = []
    blend = {"a": a, "b": b}
    loader = shardkit.loader(blend, weights={"a": 0.7, "b": 0.3}, batch_size=256, decode=False)
    worst = 0.0
    for _ in range(2):
        for batch in loader:
            worst = max(worst, abs(sum(k.startswith("a") for k in batch["__key__"]) - 256 * 0.7))
    lines.append(f"loader, 70/30, batch 256, 2 epochs of {len(loader)} batches: worst |count - target| = {worst:.2f} samples")

    def rate(make_loader) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            n = sum(len(batch["__key__"]) for batch in make_loader())
            times.append(n / (time.perf_counter() - start))
        return statistics.median(times)

    one = rate(lambda: shardkit.loader(whole, batch_size=256, decode=False))
    two = rate(lambda: shardkit.loader(blend, weights={"a": 0.7, "b": 0.3}, batch_size=256, decode=False))
    lines.append(
        f"read, batch 256, 512-byte samples: one dataset {one:,.0f} samples/s, blend of two {two:,.0f} samples/s ({two / one:.2f}x)"
    )
    lines.extend(tiny_sources(root, a, samples * 16))
    return lines


def tiny_sources(root: str, big: str, epoch_size: int) -> list[str]:
    """A source of 1 or 10 samples at half a blend epoch of ``epoch_size``: seconds to the first
    batch of 256, and samples/s over the next 400 batches (a source read whole many times a batch)."""
    lines = []
    for n in (1, 10):
        tiny = make(root, f"tiny{n}", n, 4)
        start = time.perf_counter()
        batches = iter(
            shardkit.loader({"big": big, "tiny": tiny}, weights={"big": 1, "tiny": 1}, epoch_size=epoch_size, batch_size=256, decode=False)
        )
        next(batches)
        first = time.perf_counter() - start
        start, count = time.perf_counter(), 0
        for batch in itertools.islice(batches, 400):
            count += len(batch["__key__"])
        lines.append(
            f"a {n}-sample source at half a blend epoch of {epoch_size:,}: first batch after {first:.2f} s, "
            f"then {count / (time.perf_counter() - start):,.0f} samples/s"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    print(f"per-batch composition over {size['batches']} batches (|count - target| in samples):")
    print("\n".join(composition_table(size["batches"])))
    with tempfile.TemporaryDirectory() as root:
        print("\n".join(through_the_loader(root, size["samples"], size["repeats"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
