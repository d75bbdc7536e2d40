"""Read Arrow IPC files (Feather v2, ``.arrow``; file or stream format) as pass-1 input.

A unit is one record batch. Local files are memory-mapped, so a unit touches only its batch's
pages, even in the stream format (which Hugging Face's caches use) where the batches before it
are walked to reach it; a remote file is read whole by each unit that needs it.

    reader = Arrow(fields={"image": "jpg"})
    shardkit.pile("cache/data-*.arrow", "piles/", piles=64, format=reader)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shardkit import storage
from shardkit._util import optional
from shardkit.errors import CorruptShardError
from shardkit.piles.readers.base import key_prefixes, row_key, unreadable
from shardkit.piles.readers.columns import ColumnSpec

SUFFIXES = (".arrow", ".feather", ".ipc")


@dataclass(frozen=True)
class Batch:
    """Record batch ``batch`` of ``url``, whose first row is file row ``row``; ``batch == -1``:
    the file could not be opened."""

    url: str
    prefix: str
    batch: int
    row: int

    def __repr__(self) -> str:
        return f"{self.url} (unreadable)" if self.batch < 0 else f"{self.url} record batch {self.batch}"


@contextlib.contextmanager
def _batches(url: str) -> Iterator[tuple[int | None, Any]]:
    """(number of batches or None for the stream format, reader) for the IPC file ``url``."""
    pa = optional("pyarrow", "parquet", f"{url}: reading Arrow files")
    store, name = storage.locate(url)
    local = store.local_file(name)
    try:
        source = pa.memory_map(local) if local is not None else pa.BufferReader(storage.read_bytes(url))
    except FileNotFoundError:
        raise
    except OSError as e:
        raise unreadable(url, "cannot open it as an Arrow IPC file", e) from None
    with source:
        try:
            file_reader = pa.ipc.open_file(source)
        except pa.ArrowInvalid:  # no file footer: maybe the stream format
            file_reader = None
        if file_reader is not None:
            yield file_reader.num_record_batches, file_reader
            return
        source.seek(0)
        try:
            stream = pa.ipc.open_stream(source)
        except Exception as e:
            raise unreadable(url, "not an Arrow IPC file or stream", e) from None
        yield None, stream


@dataclass(frozen=True, kw_only=True)
class Arrow(ColumnSpec):
    """Arrow IPC / Feather files -> samples, a column a field (see :class:`ColumnSpec`), keys
    ``FILE/ROW`` unless ``key`` names a column.

        reader = Arrow()
        units = reader.units(["table.feather"])
    """

    def prepare(self, inputs: Sequence[str]) -> tuple[list[Batch], dict[str, Any]]:
        """One unit per record batch of every file (each file's batches are counted here)."""
        urls = storage.expand(list(inputs), once=True)
        units: list[Batch] = []
        for url, prefix in zip(urls, key_prefixes(urls, SUFFIXES), strict=True):
            try:
                sizes = _batch_sizes(url)
            except CorruptShardError:
                units.append(Batch(url, prefix, -1, 0))
                continue
            row = 0
            for b, rows in enumerate(sizes):
                units.append(Batch(url, prefix, b, row))
                row += rows
        return units, {}

    def units(self, inputs: Sequence[str]) -> list[Batch]:
        return self.prepare(inputs)[0]

    def __call__(self, unit: Batch) -> Iterator[dict[str, Any]]:
        where = f"{unit.url}: record batch {unit.batch}"
        if unit.batch < 0:  # planning could not open it or count its batches: say why, read again now
            _batch_sizes(unit.url)
            raise unreadable(unit.url, "it could not be read when the job was planned", OSError("it changed since"))
        with _batches(unit.url) as (count, reader):
            try:
                batch = reader.get_batch(unit.batch) if count is not None else _nth(reader, unit.batch)
            except Exception as e:
                raise unreadable(unit.url, f"record batch {unit.batch}", e) from None
            names = batch.schema.names
            columns = [batch.column(i).to_pylist() for i in range(len(names))]
        keys = [row_key(unit.prefix, r) for r in range(unit.row, unit.row + batch.num_rows)]
        yield from self.samples(names, columns, keys, where)


def _nth(stream: Any, n: int) -> Any:
    for i, batch in enumerate(stream):
        if i == n:
            return batch
    raise IndexError(f"the stream has {n} record batches only")


def _batch_sizes(url: str) -> list[int]:
    sizes: list[int] = []
    with _batches(url) as (count, reader):
        try:
            if count is not None:
                for i in range(count):
                    sizes.append(reader.get_batch(i).num_rows)
            else:
                for batch in reader:
                    sizes.append(batch.num_rows)
        except Exception as e:
            raise unreadable(url, f"record batch {len(sizes)} (after {sum(sizes)} rows)", e) from None
    return sizes
