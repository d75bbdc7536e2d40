"""Exact first-epoch uniformity through the real writer with oversized piles split, read by the plan."""

from __future__ import annotations

import itertools
import os
from collections import Counter

import numpy as np
import pytest
from scipy import stats

import shardkit
from shardkit.compare import order_from_plan, scan_dataset

N = 5
SAMPLE_BYTES = 2048  # two members of one 512-byte header and one 512-byte data block each
# piles of 3+ samples (3 * 2048 + 1024 trailer bytes) are over the limit: every dataset of 5
# samples in 2 piles has at least one pile split into random sub-piles, some split twice
LIMIT = 2 * SAMPLE_BYTES + 1024
LOADER_SEED = 100_000  # loader seeds kept apart from writer seeds


def _write(out: str, seed: int) -> shardkit.Manifest:
    with shardkit.PileWriter(out, piles=2, seed=seed, max_pile_bytes=LIMIT, overwrite=True) as w:
        for i in range(N):
            w.write({"__key__": f"s{i}", "bin": b"x", "cls": i})
    assert w.manifest is not None
    return w.manifest


@pytest.mark.slow
def test_first_epoch_is_uniform_with_oversized_piles_split(tmp_path):
    out = os.path.join(tmp_path, "ds")
    seen: Counter[tuple[int, ...]] = Counter()
    seeds = 1800
    split_twice = 0
    for seed in range(seeds):
        m = _write(out, seed)
        assert m.split_piles >= 1
        split_twice += any(p.name.count("-") > 2 for p in m.piles)
        index = scan_dataset(out)
        seen[tuple(order_from_plan(index, seed=LOADER_SEED + seed, epoch=0).tolist())] += 1
    assert split_twice > 0  # the recursive split ran too
    perms = list(itertools.permutations(range(N)))
    observed = np.array([seen[p] for p in perms])
    assert observed.sum() == seeds
    chi2 = stats.chisquare(observed)
    assert chi2.pvalue > 1e-4, (chi2, seen.most_common(3))
