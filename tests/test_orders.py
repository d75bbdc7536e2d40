"""Reference orders: the WebDataset-style buffer shuffle matches webdataset's own code."""

from __future__ import annotations

import numpy as np
import pytest
from webdataset.filters import _shuffle

from shardkit.tools.orders import buffer_shuffle, sequential_order, webdataset_order
from shardkit.tools.quality import measure


class _FixedPicks:
    """A stand-in for webdataset's ``random.Random``: ``randint`` takes its picks from uniforms."""

    def __init__(self, uniforms: np.ndarray) -> None:
        self._it = iter(uniforms.tolist())

    def randint(self, a: int, b: int) -> int:
        return a + int(next(self._it) * (b - a + 1))


@pytest.mark.parametrize("n", [0, 1, 2, 5, 99, 100, 101, 150, 998, 999, 1000, 1001, 4321])
@pytest.mark.parametrize(("bufsize", "initial"), [(1000, 100), (1, 1), (2, 1), (10, 100), (7, 3), (100, 100)])
def test_buffer_shuffle_is_webdatasets_shuffle(n, bufsize, initial):
    uniforms = np.random.default_rng(n * 1000 + bufsize).random(n)
    ours = buffer_shuffle(np.arange(n), bufsize=bufsize, initial=initial, uniforms=uniforms).tolist()
    theirs = list(_shuffle(iter(range(n)), bufsize, initial, rng=_FixedPicks(uniforms)))
    assert ours == theirs


def test_buffer_shuffle_needs_enough_uniforms():
    with pytest.raises(ValueError, match="need as many uniforms"):
        buffer_shuffle(np.arange(5), bufsize=3, initial=1, uniforms=[0.5] * 4)


def test_webdataset_order_is_a_permutation_with_webdataset_epoch_semantics():
    counts = [30, 50, 20, 40] * 10
    n = sum(counts)
    e0, e1 = webdataset_order(counts, seed=3, epoch=0), webdataset_order(counts, seed=3, epoch=1)
    assert sorted(e0.tolist()) == list(range(n))
    assert not np.array_equal(e0, e1)
    assert np.array_equal(e0, webdataset_order(counts, seed=3, epoch=0))
    # with a buffer of 1 the samples keep stream order, which shows the shard order itself:
    # webdataset's default shard shuffle has a fixed seed, so it repeats every epoch
    fixed = [webdataset_order(counts, seed=3, epoch=e, bufsize=1) for e in range(3)]
    assert all(np.array_equal(fixed[0], f) for f in fixed)
    assert not np.array_equal(fixed[0], sequential_order(n))
    det = [webdataset_order(counts, seed=3, epoch=e, bufsize=1, detshuffle=True) for e in range(3)]
    assert not np.array_equal(det[0], det[1]) and not np.array_equal(det[1], det[2])
    assert np.array_equal(webdataset_order(counts, shardshuffle=0, bufsize=1), sequential_order(n))


def test_webdataset_style_on_class_sorted_shards_mixes_few_classes():
    # ten class-sorted shards (one class each) and a buffer of 1000: ~1.6 of 10 classes per batch of 256
    n = 100_000
    labels = np.arange(n) * 10 // n
    report = measure(webdataset_order([n // 10] * 10, seed=0), labels=labels, batch_size=256)
    assert 1.3 < report["classes_per_batch"].value < 2.0
    assert report["dispersion"].value > 100
