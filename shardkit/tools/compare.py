"""Measure a dataset's shuffle: the loader's epoch plan next to sequential and WebDataset-style orders.

Nothing is decoded. What measuring needs from a shardkit dataset:

- ``shardkit.json`` (the pile counts): the loader's order is computed from them by its own epoch
  plan, exactly as training would read it;
- a *source position* per sample, i.e. where it was in the data before piling. By default it is
  the rank of the sample's key in natural order (``s9 < s10``; zero-padded counters, the usual
  WebDataset keys, sort the same either way). ``source_field`` names a field holding an integer
  instead (its rank is used, so gaps are fine);
- optionally a *label* field (``cls`` by default in the CLI): its bytes are the class, compared as
  integers when they parse as such.

Each pile is read once, sequentially, for its keys and the two small fields. The reference orders
see the data in source order cut into ``source_shards`` equal shards (default: as many as there
are piles), as if the data had been written with ``webdataset.ShardWriter`` before any shuffle.

    result = compare_shuffles("data/", batch_size=256, epochs=2)
    print(result.table())
    result.plot("quality.png")
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardkit import _util, manifest, storage
from shardkit._util import check_bool, check_int, shown
from shardkit.errors import ConfigError
from shardkit.loading.pile import read_pile
from shardkit.tools import orders, quality

__all__ = ["Comparison", "DatasetIndex", "compare_shuffles", "order_from_plan", "scan_dataset"]

_DIGITS = re.compile(r"(\d+)")


def _natural(key: str) -> tuple[Any, ...]:
    parts = _DIGITS.split(key)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def natural_order(keys: Sequence[str]) -> np.ndarray:
    """Indices that sort ``keys`` naturally (digit runs compared as numbers: ``s9 < s10``).

    Fast path: when every key has the same length and digits at the same places (``s0000042``,
    ``train/00012_3``), natural order is plain string order, sorted by numpy.
    """
    if not keys:
        return np.zeros(0, dtype=np.int64)
    arr = np.array(keys)
    width = arr.dtype.itemsize // 4
    if width and all(len(k) == width for k in keys[:: max(1, len(keys) // 1000)]):
        codes = arr.view(np.uint32).reshape(len(keys), width)
        digits = (codes >= 48) & (codes <= 57)
        if np.all(codes != 0) and np.array_equal(digits.min(axis=0), digits.max(axis=0)):
            return np.argsort(arr, kind="stable")
    return np.array(sorted(range(len(keys)), key=lambda i: _natural(keys[i])), dtype=np.int64)


@dataclass(frozen=True, eq=False)
class DatasetIndex:
    """Per-sample facts of a dataset, in manifest order (pile 0's samples, then pile 1's...).

    Attributes:
        counts: samples in each pile, in manifest order.
        source: source position of each sample (a permutation of ``0..n-1``).
        labels: label of each sample, or None.

    Example::

        index = scan_dataset("data/", label_field="cls")
        order = order_from_plan(index, seed=0, epoch=0)       # source positions, loader order
        labels = index.by_source(index.labels)
    """

    counts: np.ndarray
    source: np.ndarray
    labels: np.ndarray | None = None
    label_field: str | None = None

    @property
    def samples(self) -> int:
        return len(self.source)

    def by_source(self, values: np.ndarray) -> np.ndarray:
        """Re-index a per-sample array (manifest order) by source position."""
        out = np.empty_like(values)
        out[self.source] = values
        return out


def _label_values(raw: list[bytes]) -> np.ndarray:
    try:
        return np.array([int(v) for v in raw], dtype=np.int64)
    except ValueError:
        return np.array(raw, dtype=object)


def _field(sample: dict[str, Any], name: str, url: str) -> bytes:
    if name not in sample:
        raise ConfigError(
            f"{url}: sample {sample['__key__']!r} has no {name!r} field (fields: {sorted(k for k in sample if k != '__key__')})"
        )
    return bytes(sample[name])


def _read_fields(directory: str, m: manifest.Manifest, fields: list[str], quiet: bool) -> tuple[list[str], dict[str, list[bytes]]]:
    """Every key, and the bytes of ``fields`` for every sample, in manifest order."""
    keys: list[str] = []
    values: dict[str, list[bytes]] = {f: [] for f in fields}
    with _util.bar(total=len(m.piles), desc="scan", unit="pile", quiet=quiet) as bar:
        for info in m.piles:
            url = storage.join(directory, info.name)
            pile = read_pile(url, expected=info, verify=False)
            keys.extend(pile.keys)
            if fields:
                for sample in pile:
                    for f in fields:
                        values[f].append(_field(sample, f, url))
            bar.update(1)
    return keys, values


def scan_dataset(directory: str, *, label_field: str | None = None, source_field: str | None = None, quiet: bool = True) -> DatasetIndex:
    """Read a dataset's keys and small fields (no decoding) into a :class:`DatasetIndex`.

    Raises:
        ConfigError: a named field is not in the dataset, or a sample lacks it, or a source
            field is not an integer.
    """
    m = manifest.read(directory)
    for what, name in (("label_field", label_field), ("source_field", source_field)):
        if name is not None and name not in m.fields:
            raise ConfigError(f"{directory}: {what} {name!r} is not a field of this dataset (fields: {', '.join(m.fields)})")
    keys, values = _read_fields(directory, m, [f for f in dict.fromkeys((label_field, source_field)) if f], quiet)
    if source_field:
        positions = np.array(
            [_position(directory, source_field, k, v) for k, v in zip(keys, values[source_field], strict=True)], dtype=np.int64
        )
        rank = np.argsort(positions, kind="stable")
    else:
        rank = natural_order(keys)
    source = np.empty(len(keys), dtype=np.int64)
    source[rank] = np.arange(len(keys))
    counts = np.array([p.samples for p in m.piles], dtype=np.int64)
    labels = _label_values(values[label_field]) if label_field else None
    return DatasetIndex(counts=counts, source=source, labels=labels, label_field=label_field)


def _position(directory: str, field: str, key: str, value: Any) -> int:
    try:
        return int(value)
    except ValueError:  # int()'s own message quotes the whole value: a JPEG would fill the screen
        raise ConfigError(f"{directory}: source_field {field!r} must hold integers: sample {key!r} holds {shown(value)}") from None


def order_from_plan(
    index: DatasetIndex | Sequence[int], *, seed: int = 0, epoch: int = 0, shuffle: bool = True, mix: int = 1
) -> np.ndarray:
    """The loader's global order of ``epoch``, as source positions (or manifest-order sample ids).

    Computed by the loader's own pure epoch plan from the pile counts alone, so it is exactly the
    order training reads. ``index`` is a :class:`DatasetIndex` (result: source positions) or the
    pile counts (result: sample ids in manifest order).
    """
    from shardkit.loading.plan import EpochOrder

    counts = index.counts if isinstance(index, DatasetIndex) else np.asarray(index, dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(counts)))
    plan = EpochOrder(counts.tolist(), seed=seed, epoch=epoch, shuffle=shuffle, mix=mix)
    ids = np.empty(plan.total, dtype=np.int64)
    for pos, piles, inner in plan.blocks(0, plan.total):
        ids[pos : pos + len(piles)] = offsets[piles] + inner
    return index.source[ids] if isinstance(index, DatasetIndex) else ids


@dataclass(frozen=True, eq=False)
class Comparison:
    """Reports for shardkit, sequential and WebDataset-style orders of one dataset.

    Example::

        result = compare_shuffles("data/", epochs=2)
        print(result.table())
        result.plot("quality.png")
    """

    reports: tuple[quality.QualityReport, ...]
    orders: dict[str, list[np.ndarray]] = field(repr=False)
    labels: np.ndarray | None = field(repr=False)
    batch_size: int = 256

    def table(self) -> str:
        return quality.side_by_side(self.reports)

    def to_dict(self) -> dict[str, Any]:
        return {r.name: r.to_dict() for r in self.reports}

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Write one PNG: position vs source, displacement histogram, classes per batch, and the
        co-batch recurrence of later epochs, each against a uniform shuffle."""
        from shardkit.tools.plot import plot_comparison

        plot_comparison(self, os.fspath(path))


def compare_shuffles(
    source: str | os.PathLike[str],
    *,
    batch_size: int = 256,
    epochs: int = 2,
    seed: int = 0,
    mix: int = 1,
    label_field: str | None = "cls",
    source_field: str | None = None,
    source_shards: int | None = None,
    quiet: bool = True,
) -> Comparison:
    """Measure the loader's shuffle of a dataset next to sequential and WebDataset-style reading.

    Args:
        source: a shardkit dataset directory.
        batch_size: the batch for label mixing and recurrence (and the source-shard window).
        epochs: epochs to plan; with 2 or more, co-batch recurrence between epochs is reported.
        seed, mix: the loader's ``seed`` and ``mix``; the WebDataset-style order uses ``seed`` too.
        label_field: the field holding the class, or None.
        source_field: an integer field holding the source position (default: key order).
        source_shards: shards the reference orders read the source order as (default: the
            number of piles, or of samples when there are fewer).
    """
    if not isinstance(source, (str, os.PathLike)):  # a blend's order is not measured: os.fspath's TypeError said none of it
        raise ConfigError(
            f"source: expected a shardkit dataset directory or URL, got {shown(source)} (for a blend, measure one of its datasets)"
        )
    for name, value in (("batch_size", batch_size), ("epochs", epochs), ("mix", mix)):
        check_int(name, value, low=1)
    check_int("source_shards", source_shards, low=1, none=True)
    check_int("seed", seed, low=0)  # a negative one would reach numpy's seeding as a bare ValueError
    check_bool("quiet", quiet)
    index = scan_dataset(os.fspath(source), label_field=label_field, source_field=source_field, quiet=quiet)
    n = index.samples
    if n < batch_size:
        raise ConfigError(f"{source}: {n} samples is fewer than one batch of {batch_size}")
    shards = source_shards or min(len(index.counts), n)
    check_int("source_shards", shards, low=1, high=n)
    shard_of = np.arange(n, dtype=np.int64) * shards // n
    shard_counts = np.bincount(shard_of, minlength=shards)
    labels = index.by_source(index.labels) if index.labels is not None else None
    candidates = {
        "shardkit" + (f" mix={mix}" if mix > 1 else ""): [order_from_plan(index, seed=seed, epoch=e, mix=mix) for e in range(epochs)],
        "sequential": [orders.sequential_order(n)] * epochs,
        "webdataset": [orders.webdataset_order(shard_counts, seed=seed, epoch=e) for e in range(epochs)],
    }
    reports = tuple(
        quality.measure(o, labels=labels, source_shards=shard_of, batch_size=batch_size, name=name, seed=seed)
        for name, o in candidates.items()
    )
    return Comparison(reports=reports, orders=candidates, labels=labels, batch_size=batch_size)
