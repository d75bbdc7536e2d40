"""Read a Hugging Face ``datasets.Dataset`` (an object, or a directory ``save_to_disk`` wrote).

A unit is a range of ``rows_per_unit`` rows in the dataset's order (its indices mapping, after
``shuffle`` or ``select``, included); rows are read as Arrow, so images (``{"bytes", "path"}``)
come out as their encoded bytes (read from the file a value names by path, as ``save_to_disk``
would) and class labels as integers. A ``DatasetDict`` needs ``split``.
Keys are ``ROW`` (``SPLIT/ROW`` with a split) unless ``key`` names a column.

    reader = HuggingFace(split="train", fields={"image": "jpg", "label": "cls"})
    shardkit.pile("saved/mnist", "piles/", piles=64, format=reader)
    shardkit.pile(dataset, "piles/", piles=64)          # a Dataset object in hand
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardkit._util import check_int
from shardkit.errors import ConfigError, DatasetNotFoundError, SampleError
from shardkit.piles.readers.base import key_prefixes, local_folders, row_key, stamp, unreadable
from shardkit.piles.readers.columns import ColumnSpec


def is_saved(path: str) -> bool:
    """Whether ``path`` is a directory ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` wrote."""
    return os.path.isfile(os.path.join(path, "state.json")) or os.path.isfile(os.path.join(path, "dataset_dict.json"))


def is_dataset(value: Any) -> bool:
    """Whether ``value`` is a ``datasets.Dataset`` or ``DatasetDict`` (without importing datasets)."""
    return type(value).__module__.startswith("datasets.") and type(value).__name__ in ("Dataset", "DatasetDict")


def is_stream(value: Any) -> bool:
    """Whether ``value`` is a ``datasets.IterableDataset`` or ``IterableDatasetDict`` (``streaming=True``)."""
    return type(value).__module__.startswith("datasets.") and type(value).__name__ in ("IterableDataset", "IterableDatasetDict")


@functools.lru_cache(maxsize=4)
def _load(path: str, version: tuple[int, int, int]) -> Any:  # version: a stamp of its index file, to key the cache
    import datasets

    return datasets.load_from_disk(path)


def _arrow_error() -> type[Exception]:
    """pyarrow's base error (``datasets`` requires pyarrow)."""
    import pyarrow

    return pyarrow.ArrowException


@dataclass(frozen=True)
class Rows:
    """Rows ``start..stop`` of the dataset saved at ``path`` (None: the reader's own dataset)."""

    path: str | None
    prefix: str
    start: int
    stop: int

    def __repr__(self) -> str:
        return f"{self.path or 'dataset'} rows {self.start}..{self.stop}"


@dataclass(frozen=True, kw_only=True)
class HuggingFace(ColumnSpec):
    """A ``datasets`` dataset -> samples, a column a field (see :class:`ColumnSpec`).

    Args:
        split: the split of a ``DatasetDict`` to read.
        rows_per_unit: rows per input unit.
        dataset: the ``Dataset`` object to read (then ``prepare`` takes no paths); it travels to
            worker processes by pickling (by reference to its cache files when it has them).
    """

    split: str | None = None
    rows_per_unit: int = 10_000
    dataset: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("rows_per_unit", self.rows_per_unit, low=1)
        if self.split is not None and (not isinstance(self.split, str) or not self.split):
            raise ConfigError(f"split: expected a split name or None, got {self.split!r}")
        if self.dataset is not None:
            object.__setattr__(self, "dataset", self._split(self.dataset, "dataset"))

    def __repr__(self) -> str:  # the resume fingerprint tells one dataset from another by this
        fingerprint = getattr(self.dataset, "_fingerprint", None)
        return f"HuggingFace(split={self.split!r}, rows_per_unit={self.rows_per_unit}, spec={self.columns, self.fields, self.encode, self.key}, dataset={fingerprint})"

    def _split(self, value: Any, where: str) -> Any:
        if type(value).__name__ == "DatasetDict" or isinstance(value, dict):
            if self.split is None:
                raise ConfigError(f"{where}: holds the splits {', '.join(value)}: name one with split=")
            if self.split not in value:
                raise ConfigError(f"{where}: has no split {self.split!r} (splits: {', '.join(value)})")
            return value[self.split]
        if not is_dataset(value):
            raise ConfigError(f"{where}: expected a datasets.Dataset or DatasetDict, got {type(value).__name__}")
        return value

    def _open(self, path: str | None) -> Any:
        if path is None:
            return self.dataset
        if not is_saved(path):
            raise DatasetNotFoundError(f"{path}: not a directory Dataset.save_to_disk wrote (no state.json or dataset_dict.json)")
        try:
            import datasets  # noqa: F401  # missing, it is the extra to install, not a damaged folder
        except ImportError as e:
            raise ConfigError(
                f"{path}: reading a saved Hugging Face dataset needs the hf extra (pip install 'shardkit[hf]'): {e}"
            ) from None
        try:
            marker = "state.json" if os.path.isfile(os.path.join(path, "state.json")) else "dataset_dict.json"
            found = _load(os.path.abspath(path), stamp(os.path.join(path, marker)))
        except (ValueError, KeyError, IndexError, FileNotFoundError, _arrow_error()) as e:
            # what datasets and pyarrow raise for a damaged folder: JSONDecodeError, KeyError, ArrowInvalid,
            # a file gone; other errors (permissions, a bug) keep their own kind
            raise unreadable(path, "not a readable folder Dataset.save_to_disk wrote", e) from None
        return self._split(found, path)

    def prepare(self, inputs: Sequence[Any]) -> tuple[list[Rows], dict[str, Any]]:
        """Ranges of rows of each input (saved directories), or of ``dataset`` when no input is given."""
        sources: list[str | None] = [*local_folders(inputs, "saved Hugging Face")] if inputs else [None]
        if self.dataset is None and not inputs:
            raise ConfigError("inputs: name a directory save_to_disk wrote, or pass the dataset object")
        # several saved datasets: each one's keys start with its directory's name
        prefixes = key_prefixes([str(p) for p in sources], ()) if len(sources) > 1 else [""]
        units = []
        for path, prefix in zip(sources, prefixes, strict=True):
            rows = len(self._open(path))
            prefix = "/".join(p for p in (prefix, self.split or "") if p)
            units += [Rows(path, prefix, s, min(s + self.rows_per_unit, rows)) for s in range(0, rows, self.rows_per_unit)]
        return units, {}

    def units(self, inputs: Sequence[Any]) -> list[Rows]:
        return self.prepare(inputs)[0]

    def __call__(self, unit: Rows) -> Iterator[dict[str, Any]]:
        where = f"{unit.path or 'dataset'}: rows {unit.start}..{unit.stop}"
        table = _embedded(self._open(unit.path).with_format("arrow")[unit.start : unit.stop], where)
        names = table.schema.names
        columns = [table.column(n).to_pylist() for n in names]
        keys = [row_key(unit.prefix, r) for r in range(unit.start, unit.stop)]
        yield from self.samples(names, columns, keys, where, first=unit.start)


def _embedded(table: Any, where: str) -> Any:
    """``table`` with the files its Image and Audio values name by path read into their bytes.

    ``load_dataset("imagefolder")`` and ``cast_column(..., Image())`` keep only the path until the
    dataset is saved; without this its JSON, not the image, would be written.
    """
    from datasets.table import embed_table_storage

    try:
        return embed_table_storage(table)
    except OSError as e:
        raise SampleError(f"{where}: cannot read a file an image or audio value names ({e})") from None
