"""Shuffle-quality metrics, each reported next to its exact value under a uniform permutation.

An *order* is the array of original indices in output order: ``order[p]`` is the source index
of the sample the loader yields at position ``p``. Every metric below has a known distribution
when the order is a uniformly random permutation, so a value far from it (a large ``z``, or a
ratio far from 1) means the shuffle is not uniform in that respect:

- Spearman rho and Kendall tau between source and output position (null mean 0);
- normalized displacement ``|pos - src| / n`` (uniform: density 2(1-x), mean 1/3, median 0.293);
- classes per batch (hypergeometric expectation) and the dispersion ratio of per-batch class
  counts (Pearson chi-square over its hypergeometric expectation: 1 when uniform);
- distinct source shards per window of ``w`` samples;
- cross-epoch co-batch recurrence: pairs sharing a batch in epoch e and e+1 over what two
  independent uniform shuffles give (about M for a fixed partition into M piles).

    order = np.random.default_rng(0).permutation(100_000)
    report = measure(order, labels=labels, batch_size=256, name="uniform")
    print(report.table())
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardkit._util import check_int
from shardkit.errors import ConfigError
from shardkit.seeds import Stream, stream
from shardkit.tools.report import Metric, QualityReport, side_by_side

__all__ = [
    "Metric",
    "QualityReport",
    "check_order",
    "classes_per_window",
    "dispersion",
    "displacement",
    "distinct_series",
    "expected_recurring_pairs",
    "inversions",
    "kendall",
    "measure",
    "recurrence",
    "side_by_side",
    "spearman",
]

# Kendall tau is exact (O(n log n)) up to this many samples, else taken on a random subsample
KENDALL_LIMIT = 4_000_000
MEDIAN_UNIFORM = 1 - 1 / math.sqrt(2)  # median of |U - V| for independent uniforms
KS_MEAN = math.sqrt(math.pi / 2) * math.log(2)  # mean of the Kolmogorov distribution


# ---------------------------------------------------------------------------- rank correlations


def check_order(order: Any, where: str = "order") -> np.ndarray:
    """Return ``order`` as int64 after checking it is a permutation of ``0..n-1``.

    Raises:
        ConfigError: not one-dimensional, or not a permutation (names a missing index).
    """
    a = np.asarray(order)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise ConfigError(f"{where}: expected a 1-D integer array of source indices, got shape {a.shape} dtype {a.dtype}")
    a = a.astype(np.int64, copy=False)
    n = len(a)
    if n and (a.min() < 0 or a.max() >= n or np.bincount(a, minlength=n).max() != 1):
        seen = np.zeros(n + 1, dtype=bool)
        seen[np.clip(a, 0, n)] = True
        missing = int(np.flatnonzero(~seen[:n])[0]) if not seen[:n].all() else -1
        raise ConfigError(f"{where}: not a permutation of 0..{n - 1}: index {missing} is missing or a value is out of range")
    return a


def inversions(order: np.ndarray) -> int:
    """Number of pairs p < q with ``order[p] > order[q]``, for a permutation of ``0..n-1``.

    O(n log n) and vectorized: a most-significant-bit-first radix pass keeps the elements
    grouped by their high bits (stable in position); at each bit, every element whose bit is 0
    is inverted with the earlier elements of its group whose bit is 1.
    """
    arr = np.asarray(order, dtype=np.int64)
    n = len(arr)
    idx = np.arange(n, dtype=np.int64)
    total = 0
    for b in reversed(range(max(n - 1, 1).bit_length())):
        bit = (arr >> b) & 1
        ones_before = np.cumsum(bit) - bit
        # a permutation's group of high bits g holds exactly the values [g << (b+1), ...),
        # so the group starts at that position in the grouped arrangement
        start = (arr >> (b + 1)) << (b + 1)
        rank_one = ones_before - ones_before[start]
        zero = bit == 0
        total += int(rank_one[zero].sum())
        rank = np.where(zero, idx - start - rank_one, rank_one)
        regrouped = np.empty_like(arr)
        regrouped[((arr >> b) << b) + rank] = arr
        arr = regrouped
    return total


def spearman(order: np.ndarray) -> Metric:
    """Spearman rho between source and output position; null mean 0, sd 1/sqrt(n-1)."""
    n = len(order)
    d = np.arange(n, dtype=np.float64) - order
    rho = 1 - 6 * float(np.dot(d, d)) / (n * (n * n - 1.0)) if n > 1 else 0.0
    z = rho * math.sqrt(n - 1) if n > 1 else 0.0
    return Metric("spearman_rho", "Spearman rho (src vs pos)", rho, 0.0, z)


def kendall(order: np.ndarray, *, limit: int = KENDALL_LIMIT, seed: int = 0) -> Metric:
    """Kendall tau between source and output position; null mean 0, sd sqrt(2(2n+5)/(9n(n-1))).

    Exact for ``n <= limit``. Above it, tau is computed on ``limit`` output positions drawn
    uniformly without replacement (seeded by ``seed``): the order restricted to them is itself a
    uniform permutation under the null, so the null sd uses the subsample size.
    """
    n = len(order)
    note = ""
    if n > limit:
        picked = np.sort(stream(Stream.SUBSAMPLE, seed).choice(n, size=limit, replace=False))
        values = order[picked]
        order = np.empty(limit, dtype=np.int64)
        order[np.argsort(values)] = np.arange(limit)  # ranks: a permutation of 0..limit-1
        n = limit
        note = f"on a random subsample of {limit} positions"
    if n < 2:
        return Metric("kendall_tau", "Kendall tau (src vs pos)", 0.0, 0.0, 0.0, note)
    tau = 1 - 4 * inversions(order) / (n * (n - 1.0))
    sd = math.sqrt(2 * (2 * n + 5) / (9 * n * (n - 1.0)))
    return Metric("kendall_tau", "Kendall tau (src vs pos)", tau, 0.0, tau / sd, note)


# ---------------------------------------------------------------------------- displacement


def displacement(order: np.ndarray) -> tuple[Metric, Metric, Metric]:
    """Mean, median and KS distance of ``|pos - src| / n`` against the density 2(1-x).

    The mean is Spearman's footrule over n^2, whose exact null mean (n^2-1)/(3n^2) and variance
    (n+1)(2n^2+7)/45/n^4 are known (Diaconis and Graham 1977). The median's and KS distance's
    nulls are the continuous limits (0.293, and the mean of the Kolmogorov distribution over
    sqrt(n), treating the n displacements as independent); they are given as ratios.
    """
    n = len(order)
    if n < 2:
        zero = Metric("displacement_mean", "displacement mean", 0.0, 0.0, 0.0)
        return zero, Metric("displacement_median", "displacement median", 0.0, 0.0), Metric("displacement_ks", "displacement KS", 0.0, 0.0)
    x = np.abs(np.arange(n, dtype=np.int64) - order) / n
    mean = float(x.mean())
    expected = (n * n - 1.0) / (3.0 * n * n)
    sd = math.sqrt((n + 1) * (2.0 * n * n + 7) / 45) / (n * n)
    xs = np.sort(x)
    cdf = 2 * xs - xs * xs  # F(x) = 1 - (1 - x)^2
    ranks = np.arange(1, n + 1) / n
    ks = float(max(np.max(ranks - cdf), np.max(cdf - (ranks - 1 / n))))
    return (
        Metric("displacement_mean", "displacement mean |pos-src|/n", mean, expected, (mean - expected) / sd),
        Metric("displacement_median", "displacement median", float(np.median(x)), MEDIAN_UNIFORM),
        Metric("displacement_ks", "displacement KS vs 2(1-x)", ks, KS_MEAN / math.sqrt(n), note="null: Kolmogorov mean / sqrt(n)"),
    )


# ---------------------------------------------------------------------------- categories per window


_SMALL = 256
_LOG_FACT_SMALL = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, _SMALL, dtype=np.float64)))))


def _log_factorial(m: np.ndarray) -> np.ndarray:
    """log(m!) elementwise: a table below 256, Stirling's series (error < 1e-16) above."""
    m = np.asarray(m, dtype=np.float64)
    big = np.maximum(m, _SMALL)
    inv = 1 / big
    stirling = big * np.log(big) - big + 0.5 * np.log(2 * np.pi * big) + inv * (1 / 12 - inv * inv * (1 / 360 - inv * inv / 1260))
    small = _LOG_FACT_SMALL[np.clip(m, 0, _SMALL - 1).astype(np.int64)]
    return np.where(m < _SMALL, small, stirling)


def _absent(n: int, w: int, size: np.ndarray) -> np.ndarray:
    """P(a uniform w-subset of n items misses all ``size`` items of a category) = C(n-size, w)/C(n, w)."""
    size = np.asarray(size, dtype=np.float64)
    rest = n - size
    out = np.zeros(size.shape)
    ok = rest >= w
    r = rest[ok]
    out[ok] = np.exp(_log_factorial(r) - _log_factorial(r - w) - _log_factorial(np.float64(n)) + _log_factorial(np.float64(n - w)))
    return out


def _distinct_null(counts: np.ndarray, n: int, w: int) -> tuple[float, float]:
    """Mean and variance of the number of distinct categories in a uniform w-subset."""
    sizes, mult = np.unique(counts[counts > 0], return_counts=True)
    q = _absent(n, w, sizes)
    mean = float(np.sum(mult * (1 - q)))
    var = float(np.sum(mult * q * (1 - q)))
    mult_f = mult.astype(np.float64)
    for lo in range(0, len(sizes), 512):  # pairs of distinct categories, grouped by size
        hi = min(lo + 512, len(sizes))
        both = _absent(n, w, sizes[lo:hi, None] + sizes[None, :]) - q[lo:hi, None] * q[None, :]
        pairs = mult_f[lo:hi, None] * mult_f[None, :]
        pairs[np.arange(hi - lo), np.arange(lo, hi)] -= mult_f[lo:hi]  # a category with itself is not a pair
        var += float(np.sum(pairs * both))
    return mean, max(var, 0.0)


def _categories(values: Any, n: int, what: str) -> np.ndarray:
    a = np.asarray(values)
    if a.ndim != 1 or len(a) != n:
        raise ConfigError(f"{what}: expected one value per sample ({n}), got shape {a.shape}")
    return np.unique(a, return_inverse=True)[1].reshape(-1).astype(np.int64)


def distinct_series(cats_out: np.ndarray, window: int) -> np.ndarray:
    """Distinct categories in each full window of ``window`` consecutive outputs."""
    nb = len(cats_out) // window
    k = int(cats_out.max()) + 1 if len(cats_out) else 1
    keys = np.unique(np.repeat(np.arange(nb, dtype=np.int64), window) * k + cats_out[: nb * window])
    return np.bincount(keys // k, minlength=nb)


def classes_per_window(cats_out: np.ndarray, window: int, *, key: str = "classes_per_batch", label: str = "classes per batch") -> Metric:
    """Mean number of distinct categories per full window of consecutive outputs.

    ``cats_out`` are category ids (0..K-1) in output order. The expectation is exact (each
    window of a uniform permutation is a uniform subset); the z-score's sd treats the windows as
    independent, which slightly overstates it (windows of one permutation are negatively
    correlated), so |z| errs small.
    """
    n = len(cats_out)
    nb = n // window
    if nb == 0:
        raise ConfigError(f"{label}: window {window} is larger than the {n} samples")
    k = int(cats_out.max()) + 1
    distinct = float(distinct_series(cats_out, window).mean())
    mean, var = _distinct_null(np.bincount(cats_out, minlength=k), n, window)
    sd = math.sqrt(var / nb)
    z = (distinct - mean) / sd if sd > 0 else None
    return Metric(key, label, distinct, mean, z, note="sd assumes independent windows")


def dispersion(cats_out: np.ndarray, batch_size: int) -> Metric:
    """Per-batch class counts against their hypergeometric spread: ~1 uniform, >>1 clustered.

    The value is the mean over full batches of Pearson's chi-square ``sum_c (X_c - B p_c)^2 /
    (B p_c)``, divided by its exact expectation under uniform shuffling, (K-1)(n-B)/(n-1). The
    z-score uses the multinomial variance of the chi-square (Haldane), scaled by the
    finite-population factor, with batches taken as independent: an approximation.
    """
    n = len(cats_out)
    nb = n // batch_size
    counts = np.bincount(cats_out).astype(np.float64)
    k = int(np.count_nonzero(counts))
    # a batch of all n samples is the same in every order: chi-square and its expectation are 0
    if nb == 0 or k < 2 or batch_size >= n:
        return Metric(
            "dispersion", "class-count dispersion / hypergeom.", 1.0, 1.0, None, note="needs >= 2 classes and a batch smaller than the data"
        )
    p = counts / n
    keys, x = np.unique(
        np.repeat(np.arange(nb, dtype=np.int64), batch_size) * len(counts) + cats_out[: nb * batch_size], return_counts=True
    )
    mu = batch_size * p[keys % len(counts)]
    # sum_c (X-mu)^2/mu = sum_c X^2/mu - 2B + B, the squares taken over the classes present only
    chi2 = (float(np.sum(x.astype(np.float64) ** 2 / mu)) - batch_size * nb) / nb
    fpc = (n - batch_size) / (n - 1) if n > 1 else 1.0
    expected = (k - 1) * fpc
    pn = p[p > 0]
    var = (2 * (k - 1) + (np.sum(1 / pn) - k * k - 2 * k + 2) / batch_size) * fpc * fpc
    z = (chi2 - expected) / math.sqrt(var / nb) if var > 0 else None
    return Metric("dispersion", "class-count dispersion / hypergeom.", chi2 / expected, 1.0, None if z is None else z, note="approximate z")


# ---------------------------------------------------------------------------- across epochs


def expected_recurring_pairs(n: int, batch_size: int) -> float:
    """Pairs sharing a full batch in both of two independent uniform orders of ``n`` samples.

    Each of the ``nb * B(B-1)/2`` pairs batched together in the first order is batched together
    in the second with probability ``nb * B(B-1) / (n(n-1))``.
    """
    nb = n // batch_size
    per_epoch = nb * batch_size * (batch_size - 1) / 2
    return per_epoch * nb * batch_size * (batch_size - 1.0) / (n * (n - 1.0))


def recurrence(first: np.ndarray, second: np.ndarray, batch_size: int) -> Metric:
    """Pairs sharing a batch in both orders, over the count for two independent uniform shuffles.

    Only full batches count. Pairs are counted by grouping samples on (batch in first, batch in
    second), so the cost is O(n log n), not O(n^2). About M for two epochs of the same M piles.
    """
    n = len(first)
    nb = n // batch_size
    full = nb * batch_size
    if nb == 0:
        raise ConfigError(f"recurrence: batch size {batch_size} is larger than the {n} samples")
    if batch_size < 2:  # a batch of one holds no pair: 0 pairs against 0 expected
        return Metric("recurrence", "co-batch recurrence, epoch e -> e+1", 1.0, 1.0, note="needs a batch of 2 or more")
    batch_first = np.full(n, -1, dtype=np.int64)
    batch_second = np.full(n, -1, dtype=np.int64)
    batch_first[first[:full]] = np.arange(full) // batch_size
    batch_second[second[:full]] = np.arange(full) // batch_size
    both = (batch_first >= 0) & (batch_second >= 0)
    _, g = np.unique(batch_first[both] * nb + batch_second[both], return_counts=True)
    pairs = float(np.sum(g * (g - 1.0) / 2))
    expected = expected_recurring_pairs(n, batch_size)
    return Metric("recurrence", "co-batch recurrence, epoch e -> e+1", pairs / expected, 1.0, note=f"{pairs:.0f} pairs vs {expected:.1f}")


# ---------------------------------------------------------------------------- all together


def measure(
    orders: Any,
    *,
    labels: Any = None,
    source_shards: Any = None,
    batch_size: int = 256,
    window: int | None = None,
    name: str = "order",
    seed: int = 0,
    kendall_limit: int = KENDALL_LIMIT,
) -> QualityReport:
    """Every metric for one order, or for consecutive epochs' orders.

    Args:
        orders: source indices in output order (1-D), or a sequence of such arrays for epochs
            e, e+1, ...: position metrics use the first, recurrence every consecutive pair (the
            reported value is the mean ratio).
        labels: per *source index* label (any hashable values); adds classes per batch and
            the dispersion ratio.
        source_shards: per source index, the shard it came from; adds distinct shards per window.
        batch_size: the batch for label mixing and recurrence.
        window: the window for source-shard mixing (default ``batch_size``).
        seed: seeds Kendall's subsample when ``n > kendall_limit``.
    """
    epochs = [check_order(o, f"{name} epoch {e}") for e, o in enumerate(_split_epochs(orders))]
    order = epochs[0]
    n = len(order)
    if any(len(o) != n for o in epochs):
        raise ConfigError(f"{name}: epochs have different lengths {[len(o) for o in epochs]}")
    check_int("batch_size", batch_size, low=1)
    check_int("window", window, low=1, none=True)
    metrics = [spearman(order), kendall(order, limit=kendall_limit, seed=seed), *displacement(order)]
    if labels is not None and n >= batch_size:
        cats = _categories(labels, n, "labels")[order]
        metrics.append(classes_per_window(cats, batch_size, key="classes_per_batch", label="classes per batch"))
        metrics.append(dispersion(cats, batch_size))
    w = window or batch_size
    if source_shards is not None and n >= w:
        shards = _categories(source_shards, n, "source_shards")[order]
        metrics.append(classes_per_window(shards, w, key="shards_per_window", label=f"source shards per {w} samples"))
    if len(epochs) > 1 and n >= batch_size:
        ratios = [recurrence(a, b, batch_size) for a, b in itertools.pairwise(epochs)]
        mean = float(np.mean([r.value for r in ratios]))
        note = "mean over epoch pairs: " + ", ".join(f"{r.value:.3g}" for r in ratios)
        if ratios[0].note.startswith("needs"):  # not measurable at this batch size: said, not averaged
            note = ratios[0].note
        metrics.append(Metric("recurrence", "co-batch recurrence, epoch e -> e+1", mean, 1.0, note=note))
    return QualityReport(name=name, samples=n, batch_size=batch_size, epochs=len(epochs), metrics=tuple(metrics))


def _split_epochs(orders: Any) -> list[Any]:
    if isinstance(orders, np.ndarray):
        return [orders] if orders.ndim == 1 else list(orders)
    if isinstance(orders, Sequence) and orders and not np.isscalar(orders[0]):
        return list(orders)
    return [orders]
