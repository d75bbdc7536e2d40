"""Shared fixtures: tiny datasets built in tmp_path."""

from __future__ import annotations

import os

import numpy as np
import pytest

import shardkit


def make_samples(n: int, *, size: int = 64, classes: int = 10, seed: int = 0) -> list[dict]:
    """Class-sorted samples with random payloads: key, a .bin payload and a .cls label."""
    rng = np.random.default_rng(seed)
    return [{"__key__": f"s{i:07d}", "bin": rng.bytes(size), "cls": i * classes // max(n, 1)} for i in range(n)]


def write_wds_shards(directory, name: str, count: int, sample) -> list[str]:
    """``count`` shards written by webdataset's TarWriter; ``sample(k, i)`` is sample i of shard k or None."""
    import webdataset as wds

    paths = []
    for k in range(count):
        path = os.path.join(directory, name.format(k))
        with wds.TarWriter(path) as w:
            i = 0
            while (s := sample(k, i)) is not None:
                w.write(s)
                i += 1
        paths.append(path)
    return paths


@pytest.fixture
def samples() -> list[dict]:
    return make_samples(200)


@pytest.fixture
def dataset(tmp_path, samples) -> str:
    """A 200-sample dataset in 8 piles."""
    out = os.path.join(tmp_path, "ds")
    with shardkit.PileWriter(out, piles=8, seed=3) as w:
        for s in samples:
            w.write(s)
    return out
