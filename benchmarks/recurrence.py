"""How often pile-mates meet again in later epochs, and what mix=k and repile do about it.

Prints the co-batch recurrence (pairs sharing a batch in epoch e and e+1, over what two
independent uniform shuffles give) for the loader's own epoch plan, on a model of a pass-1
dataset: each of n samples gets a pile from the writer's router, pile contents keep source order.
Nothing is written to disk; a repiled dataset is the same model with a new router seed.

Next to each mix=k figure, "model" is 1 + (R1 - 1) * ((k - 1/3) / k^2)^2, with R1 the figure for
mix=1: mix=k spreads a pile over k + 1 piles' worth of positions (a trapezoid), which shrinks
both the chance that two batch-mates are pile-mates and the chance that pile-mates share a batch
by (k - 1/3) / k^2, so the pairs beyond those of fresh shuffles shrink by its square.

    python benchmarks/recurrence.py --samples 1000000 --piles 100 --batch-size 256
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from shardkit.piles import router
from shardkit.tools import quality
from shardkit.tools.compare import DatasetIndex, order_from_plan


def piled(n: int, piles: int, seed: int) -> DatasetIndex:
    pile = router.route(piles=piles, seed=seed, unit=0, count=n)
    return DatasetIndex(counts=np.bincount(pile, minlength=piles), source=np.argsort(pile, kind="stable"))


def mean_recurrence(first: DatasetIndex, second: DatasetIndex, *, mix: int, batch: int, pairs: int) -> tuple[float, float]:
    """Mean and spread of the ratio over ``pairs`` epoch pairs (epoch e on first, e+1 on second)."""
    ratios = []
    for e in range(pairs):
        a = order_from_plan(first, seed=0, epoch=e, mix=mix)
        b = order_from_plan(second, seed=0, epoch=e + 1, mix=mix)
        ratios.append(quality.recurrence(a, b, batch).value)
    return float(np.mean(ratios)), float(np.std(ratios))


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--piles", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--pairs", type=int, default=4, help="epoch pairs averaged per figure")
    parser.add_argument("--mix", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    args = parser.parse_args()
    n, m, b = args.samples, args.piles, args.batch_size
    start = time.perf_counter()
    data = piled(n, m, seed=1)
    print(f"n={n} M={m} (pile ~{n // m} samples) batch={b}; uniform = 1.0, fixed piles ~ M = {m}")
    # batch-mates of a sample that were its batch-mates the epoch before, under fresh shuffles
    again = 2 * quality.expected_recurring_pairs(n, b) / n
    print(f"a sample meets {again:.3f} of its {b - 1} batch-mates again under fresh shuffles; x recurrence below")
    print(f"{'remedy':<24}{'recurrence':>12}{'sd':>8}{'model':>8}{'cut':>8}{'met again':>11}   resident piles")
    base, sd = mean_recurrence(data, data, mix=1, batch=b, pairs=args.pairs)
    print(f"{'none (mix=1)':<24}{base:>12.2f}{sd:>8.2f}{'':>8}{1.0:>8.2f}{base * again:>11.2f}   2 (1 + prefetch)")
    for k in args.mix:
        if k == 1:
            continue
        value, sd = mean_recurrence(data, data, mix=k, batch=b, pairs=args.pairs)
        model = 1 + (base - 1) * ((k - 1 / 3) / k**2) ** 2
        resident = f"{k + 2} ({k + 1} + prefetch)"
        print(f"{f'mix={k}':<24}{value:>12.2f}{sd:>8.2f}{model:>8.2f}{base / value:>8.2f}{value * again:>11.2f}   {resident}")
    fresh = piled(n, m, seed=2)
    value, sd = mean_recurrence(data, fresh, mix=1, batch=b, pairs=args.pairs)
    print(f"{'repile (new seed)':<24}{value:>12.2f}{sd:>8.2f}{'':>8}{base / value:>8.2f}{value * again:>11.2f}   2; one read + one write")
    print(f"({time.perf_counter() - start:.1f}s)")


if __name__ == "__main__":
    main()
