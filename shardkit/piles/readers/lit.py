"""Read a directory ``litdata.optimize`` wrote, with litdata itself: a unit is one chunk.

Each item is read with ``litdata.StreamingDataset(dir)[i]`` (the library's own decoding), so
whatever litdata wrote comes back as it would in training; a dict item's keys are its columns
(a non-dict item is the column ``value``), encoded as :class:`ColumnSpec` says (numpy arrays and
tensors as ``npy``, images as PNG). Keys are the items' indices, ``000000017``, unless ``key``
names a column. Needs the ``litdata`` extra.

    shardkit.pile("optimized/", "piles/", piles=64)                  # found by its index.json
    shardkit.pile("optimized/", "piles/", piles=64, format=Litdata(fields={"image": "png"}))
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shardkit.errors import ConfigError, CorruptShardError, DatasetNotFoundError
from shardkit.piles.readers.base import key_prefixes, local_folders, row_key, stamp, unreadable
from shardkit.piles.readers.columns import ColumnSpec


@dataclass(frozen=True)
class Chunk:
    """Chunk ``chunk`` of the litdata directory ``path``: items ``start..stop``."""

    path: str
    prefix: str
    chunk: int
    start: int
    stop: int

    def __repr__(self) -> str:
        return f"{self.path} chunk {self.chunk} (items {self.start}..{self.stop})"


def chunk_sizes(path: str) -> list[int]:
    """The item count of each chunk, from the directory's ``index.json``."""
    index = os.path.join(path, "index.json")
    try:
        with open(index, encoding="utf-8") as f:
            doc = json.load(f)
        return [int(chunk["chunk_size"]) for chunk in doc["chunks"]]
    except FileNotFoundError:
        raise DatasetNotFoundError(f"{path}: no index.json: not a directory litdata.optimize wrote") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise unreadable(index, "not a litdata index", e) from None


@functools.lru_cache(maxsize=4)
def _dataset(path: str, version: tuple[int, int, int]) -> Any:  # version: a stamp of its index file, to key the cache
    try:
        from litdata import StreamingDataset
    except ImportError as e:
        raise ConfigError(f"{path}: reading litdata directories needs the litdata extra (pip install 'shardkit[litdata]'): {e}") from None
    return StreamingDataset(path)


def _as_value(value: Any) -> Any:
    """A tensor as a numpy array (numpy's bytes are the same on every machine); anything else as it is."""
    if type(value).__module__.startswith("torch") and hasattr(value, "numpy"):
        return value.detach().cpu().numpy()
    return value


@dataclass(frozen=True, kw_only=True)
class Litdata(ColumnSpec):
    """litdata optimized directories -> samples (see the module's docstring).

    reader = Litdata(encode={"tokens": "npy"})
    units = reader.units(["optimized/"])
    """

    def prepare(self, inputs: Sequence[str]) -> tuple[list[Chunk], dict[str, Any]]:
        """One unit per chunk of every directory, from its ``index.json``."""
        paths = local_folders(inputs, "litdata")
        prefixes = key_prefixes(paths, ()) if len(paths) > 1 else [""]
        units: list[Chunk] = []
        for path, prefix in zip(paths, prefixes, strict=True):
            start = 0
            for k, size in enumerate(chunk_sizes(path)):
                units.append(Chunk(path, prefix, k, start, start + size))
                start += size
        return units, {}

    def units(self, inputs: Sequence[str]) -> list[Chunk]:
        return self.prepare(inputs)[0]

    def __call__(self, unit: Chunk) -> Iterator[dict[str, Any]]:
        where = repr(unit)
        dataset = _dataset(unit.path, stamp(os.path.join(unit.path, "index.json")))
        rows = []
        for i in range(unit.start, unit.stop):
            try:
                item = dataset[i]
            except Exception as e:
                raise CorruptShardError(f"{where}: item {i}: litdata cannot read it ({type(e).__name__}: {e})") from None
            rows.append(item if isinstance(item, dict) else {"value": item})
        names = list(rows[0]) if rows else []
        for i, row in enumerate(rows):
            if list(row) != names:
                raise CorruptShardError(f"{where}: item {unit.start + i} has the columns {list(row)}, expected {names}")
        columns = [[_as_value(row[n]) for row in rows] for n in names]
        keys = [row_key(unit.prefix, i) for i in range(unit.start, unit.stop)]
        yield from self.samples(names, columns, keys, where, first=unit.start)
