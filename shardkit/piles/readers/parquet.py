"""Read Parquet files as pass-1 input: a unit is a row group, or a slice of one.

Only the footers are read to plan the units (in the calling process); each unit then reads its
row group's columns, so the units, their order and every sample's bytes are fixed by the files
alone and pass 1 is byte-identical for any number of workers. A file whose footer cannot be
read becomes a single unit that fails (naming the file), so ``on_error="skip"`` drops it and
``"raise"`` stops there.

    reader = Parquet(fields={"image": "jpg"}, rows_per_unit=10_000)
    units, _ = reader.prepare(["data/train-*.parquet"])
    shardkit.preprocess(units, reader, "piles/", piles=64)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shardkit import storage
from shardkit._util import check_int, optional
from shardkit.errors import CorruptShardError
from shardkit.piles.readers.base import key_prefixes, row_key, unreadable
from shardkit.piles.readers.columns import ColumnSpec

SUFFIXES = (".parquet", ".pq")


@dataclass(frozen=True)
class RowGroupSlice:
    """Rows ``start..stop`` of row group ``group`` of ``url``; ``row`` is the file row of ``start``.
    ``group == -1``: the file's footer could not be read."""

    url: str
    prefix: str
    group: int
    start: int
    stop: int
    row: int

    def __repr__(self) -> str:
        if self.group < 0:
            return f"{self.url} (unreadable footer)"
        return f"{self.url} row group {self.group} rows {self.start}..{self.stop}"


@contextlib.contextmanager
def open_parquet(url: str) -> Iterator[Any]:
    """A ``pyarrow.parquet.ParquetFile`` of ``url`` (local or through fsspec); bad bytes are a CorruptShardError."""
    pq = optional("pyarrow.parquet", "parquet", f"{url}: reading Parquet")
    store, name = storage.locate(url)
    local = store.local_file(name)
    with contextlib.ExitStack() as stack:
        source = local if local is not None else stack.enter_context(storage.open_read(url))
        try:
            handle = pq.ParquetFile(source)
        except FileNotFoundError:
            raise
        except Exception as e:  # pyarrow says ArrowInvalid, OSError or others for a bad footer
            raise unreadable(url, "not a readable Parquet file (footer)", e) from None
        stack.callback(handle.close)
        yield handle


@dataclass(frozen=True, kw_only=True)
class Parquet(ColumnSpec):
    """Parquet files -> samples: each column a field (see :class:`ColumnSpec` for names and
    encodings), keys ``FILE/ROW`` unless ``key`` names a column.

    Args:
        rows_per_unit: split row groups into slices of at most this many rows (each slice reads
            its whole row group, so keep it a fraction of large groups only); None: a unit per
            row group.

        reader = Parquet(encode={"embedding": "npy"})
        shardkit.pile("data/*.parquet", "piles/", piles=64, format=reader)
    """

    rows_per_unit: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("rows_per_unit", self.rows_per_unit, low=1, none=True)

    def prepare(self, inputs: Sequence[str]) -> tuple[list[RowGroupSlice], dict[str, Any]]:
        """The units of every file (footers read here) and no manifest metadata."""
        urls = storage.expand(list(inputs), once=True)
        units: list[RowGroupSlice] = []
        for url, prefix in zip(urls, key_prefixes(urls, SUFFIXES), strict=True):
            try:
                with open_parquet(url) as pf:
                    groups = [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)]
            except CorruptShardError:
                units.append(RowGroupSlice(url, prefix, -1, 0, 0, 0))
                continue
            row = 0
            for g, rows in enumerate(groups):
                step = self.rows_per_unit or max(rows, 1)
                units += [RowGroupSlice(url, prefix, g, s, min(s + step, rows), row + s) for s in range(0, rows, step)]
                row += rows
        return units, {}

    def units(self, inputs: Sequence[str]) -> list[RowGroupSlice]:
        return self.prepare(inputs)[0]

    def __call__(self, unit: RowGroupSlice) -> Iterator[dict[str, Any]]:
        with open_parquet(unit.url) as pf:
            if unit.group < 0:  # the footer read in prepare failed; it did not fail this time
                raise unreadable(unit.url, "the footer could not be read when the job was planned", OSError("it changed since"))
            where = f"{unit.url}: row group {unit.group}"
            names = pf.schema_arrow.names
            wanted = self.chosen(names, where)
            read = sorted({*wanted, *([self.key] if self.key else [])}, key=names.index)
            try:
                table = pf.read_row_group(unit.group, columns=read).slice(unit.start, unit.stop - unit.start)
            except Exception as e:
                raise unreadable(unit.url, f"row group {unit.group}", e) from None
        # every name, so that fields and encode may name a column left unread; only the read ones are used
        columns = [table.column(name).to_pylist() if name in read else [] for name in names]
        keys = [row_key(unit.prefix, r) for r in range(unit.row, unit.row + table.num_rows)]
        yield from self.samples(names, columns, keys, where, first=unit.start)
