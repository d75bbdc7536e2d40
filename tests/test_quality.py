"""Shuffle-quality metrics: exact against brute force and scipy, calibrated under the null."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from shardkit.errors import ConfigError
from shardkit.tools import quality
from shardkit.tools.quality import measure


def brute_inversions(order) -> int:
    o = list(order)
    return sum(1 for i in range(len(o)) for j in range(i + 1, len(o)) if o[i] > o[j])


@given(st.permutations(list(range(40))).flatmap(lambda p: st.integers(0, 40).map(lambda k: p[:k])))
@settings(max_examples=200, deadline=None)
def test_inversions_match_brute_force(prefix):
    # re-rank the prefix to a permutation of 0..k-1
    order = np.argsort(np.argsort(prefix)) if prefix else np.zeros(0, np.int64)
    assert quality.inversions(order) == brute_inversions(order)


@pytest.mark.parametrize("n", [2, 3, 10, 257, 5000])
def test_rank_correlations_match_scipy(n):
    rng = np.random.default_rng(n)
    for order in (rng.permutation(n), np.arange(n), np.arange(n)[::-1], np.roll(np.arange(n), n // 3)):
        pos = np.arange(n)
        tau = quality.kendall(order).value
        rho = quality.spearman(order).value
        assert tau == pytest.approx(stats.kendalltau(pos, order).statistic, abs=1e-12)
        assert rho == pytest.approx(stats.spearmanr(pos, order).statistic, abs=1e-12)


def test_kendall_null_sd_and_subsample():
    n = 20_000
    order = np.sort(np.random.default_rng(1).permutation(n).reshape(200, 100), axis=1).reshape(-1)  # sorted runs
    exact = quality.kendall(order)
    sub = quality.kendall(order, limit=3000, seed=5)
    assert "subsample of 3000" in sub.note
    sd_sub = math.sqrt(2 * (2 * 3000 + 5) / (9 * 3000 * 2999))
    assert abs(sub.value - exact.value) < 4 * sd_sub
    assert sub.z == pytest.approx(sub.value / sd_sub)
    assert exact.z == pytest.approx(exact.value / math.sqrt(2 * (2 * n + 5) / (9 * n * (n - 1))))


@pytest.mark.parametrize("n", [4, 5, 6])
def test_footrule_null_moments_are_exact(n):
    # mean normalized displacement over all n! permutations equals the stated null mean and sd
    values = [float(np.mean(np.abs(np.arange(n) - np.array(p)))) / n for p in itertools.permutations(range(n))]
    mean, _, _ = quality.displacement(np.arange(n))
    sd = math.sqrt((n + 1) * (2 * n * n + 7) / 45) / (n * n)
    assert np.mean(values) == pytest.approx(mean.expected)
    assert np.std(values) == pytest.approx(sd)


def test_displacement_against_brute_force_and_scipy():
    n = 3001
    order = np.random.default_rng(2).permutation(n)
    mean, median, ks = quality.displacement(order)
    x = np.abs(np.arange(n) - order) / n
    assert mean.value == pytest.approx(x.mean())
    assert median.value == pytest.approx(np.median(x))
    assert median.expected == pytest.approx(0.2929, abs=1e-4)
    assert ks.value == pytest.approx(stats.kstest(x, lambda t: 2 * t - t * t).statistic)


def _enumerate_distinct(cats: np.ndarray, w: int) -> tuple[float, float]:
    d = [len(set(cats[list(c)])) for c in itertools.combinations(range(len(cats)), w)]
    return float(np.mean(d)), float(np.var(d))


@pytest.mark.parametrize(("counts", "w"), [([1, 2, 5], 3), ([3, 3, 3, 1], 4), ([6, 1, 1, 1, 1], 2), ([2, 2, 2, 2, 2], 5), ([9, 1], 9)])
def test_distinct_null_is_exact(counts, w):
    cats = np.repeat(np.arange(len(counts)), counts)
    mean, var = quality._distinct_null(np.array(counts), len(cats), w)
    want_mean, want_var = _enumerate_distinct(cats, w)
    assert mean == pytest.approx(want_mean)
    assert var == pytest.approx(want_var, abs=1e-12)


def test_distinct_null_with_large_counts_matches_simulation():
    counts = np.array([40_000, 30_000, 20_000, 9_000, 990, 10])
    n, w = int(counts.sum()), 64
    mean, var = quality._distinct_null(counts, n, w)
    q = np.prod([(n - counts - i) / (n - i) for i in range(w)], axis=0)  # exact absence probability
    assert mean == pytest.approx(float(np.sum(1 - q)), rel=1e-8)
    cats = np.repeat(np.arange(len(counts)), counts)
    rng = np.random.default_rng(3)
    sims = [len(np.unique(cats[rng.choice(n, w, replace=False)])) for _ in range(4000)]
    assert abs(np.mean(sims) - mean) < 4 * math.sqrt(var / 4000)


def test_dispersion_expectation_is_exact():
    # over all 6! orders of 3 classes x 2 samples in batches of 3, the mean chi-square is (K-1)(n-B)/(n-1)
    labels = np.array([0, 0, 1, 1, 2, 2])
    values = []
    for p in itertools.permutations(range(6)):
        values.append(quality.dispersion(labels[list(p)], 3).value)
    assert np.mean(values) == pytest.approx(1.0)


def _brute_recurrence(a, b, batch):
    n = len(a)
    full = n // batch * batch
    ba = {int(s): i // batch for i, s in enumerate(a[:full])}
    bb = {int(s): i // batch for i, s in enumerate(b[:full])}
    return sum(
        1 for i in range(n) for j in range(i + 1, n) if i in ba and j in ba and i in bb and j in bb and ba[i] == ba[j] and bb[i] == bb[j]
    )


def test_recurrence_counts_pairs_like_brute_force():
    rng = np.random.default_rng(4)
    n, batch = 103, 10
    for _ in range(5):
        a, b = rng.permutation(n), rng.permutation(n)
        for second in (b, a, np.sort(b)):
            m = quality.recurrence(a, second, batch)
            pairs = _brute_recurrence(a, second, batch)
            assert m.note.startswith(f"{pairs} pairs")


def test_recurrence_expectation_is_exact():
    # a fixed first order against every second order of 6 samples in batches of 2 (drop 1 sample: n=7)
    first = np.arange(7)
    ratios = [quality.recurrence(first, np.array(p), 2).value for p in itertools.permutations(range(7))]
    assert np.mean(ratios) == pytest.approx(1.0)


def test_null_z_scores_within_4_sd():
    n = 200_000
    rng = np.random.default_rng(5)
    labels = np.arange(n) * 7 // n
    shards = np.arange(n) // 2000
    for _ in range(3):
        report = measure([rng.permutation(n), rng.permutation(n)], labels=labels, source_shards=shards, batch_size=128)
        for m in report.metrics:
            if m.z is not None:
                assert abs(m.z) < 4, m
        assert abs(report["dispersion"].value - 1) < 0.05
        assert report["displacement_median"].value == pytest.approx(0.2929, abs=0.01)
        assert report["displacement_ks"].value < 4 * report["displacement_ks"].expected
        assert report["recurrence"].value == pytest.approx(1.0, abs=0.15)


def _local_shuffle(n: int, block: int, rng) -> np.ndarray:
    return np.concatenate([rng.permutation(np.arange(lo, min(lo + block, n))) for lo in range(0, n, block)])


def test_clustered_orders_are_flagged():
    n = 100_000
    rng = np.random.default_rng(6)
    labels = np.arange(n) * 10 // n
    shards = np.arange(n) // 1000
    cases = {
        "sequential": np.arange(n),
        "reversed": np.arange(n)[::-1].copy(),
        "local shuffle": _local_shuffle(n, 1000, rng),
        "interleaved": np.arange(n).reshape(10, -1).T.reshape(-1),  # one of each class in turn
    }
    reports = {name: measure(order, labels=labels, source_shards=shards, batch_size=100, name=name) for name, order in cases.items()}
    for name in ("sequential", "local shuffle"):
        r = reports[name]
        assert r["kendall_tau"].z > 100 and r["spearman_rho"].z > 100
        assert r["displacement_mean"].z < -100
        assert r["dispersion"].value > 50
        assert r["classes_per_batch"].value < 2
        assert r["shards_per_window"].z < -100
    assert reports["reversed"]["kendall_tau"].value == pytest.approx(-1)
    assert reports["reversed"]["dispersion"].value > 50
    # perfectly balanced batches are too even for chance: dispersion far below 1
    assert reports["interleaved"]["dispersion"].value < 0.05
    assert reports["interleaved"]["dispersion"].z < -10


def test_recurrence_of_fixed_piles_is_about_m():
    n, piles, batch = 200_000, 20, 64
    rng = np.random.default_rng(7)
    member = rng.integers(0, piles, n)
    groups = [np.flatnonzero(member == p) for p in range(piles)]

    def epoch() -> np.ndarray:
        return np.concatenate([rng.permutation(groups[p]) for p in rng.permutation(piles)])

    ratio = measure([epoch(), epoch(), epoch()], batch_size=batch)["recurrence"].value
    # batches straddling pile boundaries take a little off M
    assert piles * 0.85 < ratio < piles * 1.1


def test_report_table_dict_and_side_by_side():
    n = 5000
    labels = np.arange(n) % 3
    a = measure(np.random.default_rng(8).permutation(n), labels=labels, batch_size=50, name="shardkit")
    b = measure(np.arange(n), labels=labels, batch_size=50, name="sequential")
    text = a.table()
    for label in ("Spearman rho", "Kendall tau", "displacement mean", "classes per batch", "dispersion"):
        assert label in text
    doc = json.loads(json.dumps(a.to_dict()))
    assert doc["metrics"]["kendall_tau"]["expected"] == 0.0 and doc["samples"] == n
    both = quality.side_by_side([a, b])
    assert "shardkit" in both and "sequential" in both and "uniform" in both
    with pytest.raises(KeyError, match="no metric"):
        a["nope"]


@pytest.mark.parametrize(
    ("order", "match"),
    [([0, 1, 1], "not a permutation"), ([0, 3, 1], "out of range"), (np.zeros((2, 2, 2), dtype=int), "1-D"), ([0.0, 1.0], "integer")],
)
def test_bad_orders_are_refused(order, match):
    with pytest.raises(ConfigError, match=match):
        measure(order, batch_size=1)


def test_bad_labels_and_batch():
    with pytest.raises(ConfigError, match="one value per sample"):
        measure(np.arange(10), labels=[0, 1], batch_size=2)
    with pytest.raises(ConfigError, match="batch_size"):
        measure(np.arange(10), batch_size=0)
    with pytest.raises(ConfigError, match="different lengths"):
        measure([np.arange(10), np.arange(9)], batch_size=2)


def test_batch_of_one_or_of_every_sample_has_no_ratio_to_divide():
    # a batch of 1 holds no pair (recurrence expects 0 pairs), a batch of all n samples is the
    # same in every order (dispersion expects a chi-square of 0): both ratios are 0/0
    labels = np.arange(8) % 2
    assert "needs" in quality.recurrence(np.arange(8), np.arange(8)[::-1], 1).note
    one = measure([np.arange(8), np.arange(8)[::-1]], labels=labels, batch_size=1)
    assert one["recurrence"].value == 1.0 and one["recurrence"].note == "needs a batch of 2 or more"
    whole = measure([np.arange(8), np.arange(8)[::-1]], labels=labels, batch_size=8)
    assert whole["dispersion"].value == 1.0 and "needs" in whole["dispersion"].note
    assert all(math.isfinite(m.value) for m in (*one.metrics, *whole.metrics))
