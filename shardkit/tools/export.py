"""Write a pile dataset back out as Parquet, in pile order or in the shuffled order of one epoch.

The samples are read by the loader without decoding, so each field's bytes go out exactly as
they are stored: one binary column per field (the dataset's extensions) and a ``__key__``
string column, a sample without a field holding null there. Piling the file again with
``Parquet(key="__key__")`` gives back the same samples. The file is written whole or not at all.

    export("piles/train", "train.parquet")                       # pile order
    export("piles/train", "epoch3.parquet", seed=0, epoch=3)     # the order epoch 3 of a loader with seed 0 reads
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardkit import storage
from shardkit._util import bar, check_bool, check_int, check_path, optional
from shardkit.dataset import layout
from shardkit.dataset.transaction import Dataset
from shardkit.errors import ConfigError
from shardkit.loading.blend.loader import loader
from shardkit.loading.loader import Loader
from shardkit.loading.plan import check_epoch
from shardkit.manifest import Manifest
from shardkit.tools.audit import info

log = logging.getLogger(__name__)

FORMATS = ("parquet",)


@dataclass(frozen=True)
class Exported:
    """What :func:`export` wrote: the file, its rows, and its columns (``__key__`` first)."""

    path: str
    rows: int
    columns: tuple[str, ...]


def _reader(source: str, seed: int | None, storage_options: Mapping[str, Any] | None) -> Loader:
    """A loader of the samples as stored, in pile order (``seed`` None) or in ``seed``'s order."""
    # every sample, whatever ranks the environment names (a job launched with RANK and WORLD_SIZE)
    options: dict[str, Any] = {
        "decode": False,
        "shuffle": seed is not None,
        "seed": seed or 0,
        "storage_options": storage_options,
        "world_size": 1,
        "rank": 0,
    }
    return loader(source, **options)


def _read_manifest(source: str, reader: Loader) -> Manifest:
    """The manifest of the generation ``reader`` reads: the columns come from it, so a generation
    appended since the dataset was first looked at adds no field the rows lack, nor leaves one out."""
    generation = reader.source.generation
    assert generation is not None  # a dataset, checked by info() before the loader opened
    return Dataset(source).pinned(generation)


def _same_folder(a: str, b: str) -> bool:
    """Whether the folders ``a`` and ``b`` are one: local ones by their real paths (``piles/`` and
    ``./piles``, a link to it), object stores by their URLs."""
    pa, pb = storage.store_for(a).local_file(), storage.store_for(b).local_file()
    if pa is None or pb is None:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(pa) == os.path.realpath(pb)


def _target(source: str, target: str) -> str:
    """Where the Parquet file goes (:func:`~shardkit.storage.whole_file_target`: a local link is
    written through). Refused: ``-``, and a name shardkit gives a dataset's own files, in this
    dataset, another or a folder that may become one: replaced by Parquet, a dataset would be lost."""
    if target == "-":
        raise ConfigError("-: export writes a Parquet file, not to standard output: name the file (e.g. -o train.parquet)")
    target = storage.whole_file_target(target)
    folder, _, name = target.rstrip("/").rpartition("/")
    kind = layout.kind(name)
    if kind is not None:
        whose = (
            f"one of the dataset's own files ({source})"
            if _same_folder(folder or ".", source)
            else f"a name shardkit gives a dataset's {kind} files"
        )
        raise ConfigError(
            f"{target}: is {whose}; written there, Parquet would replace a dataset's file: export to another name, e.g. NAME.parquet"
        )
    return target


def export(
    dataset: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    to: str = "parquet",
    seed: int | None = None,
    epoch: int = 0,
    rows_per_group: int = 10_000,
    quiet: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> Exported:
    """Write every sample of ``dataset`` into the Parquet file ``out``.

    Args:
        dataset: a pile dataset (its directory or URL).
        out: the file to write (local or an object-store URL); replaced atomically (a local link
            there: the file it points to).
        to: the output format; ``"parquet"``.
        seed, epoch: None keeps pile order (the manifest's piles, each in stored order); a seed
            writes the order the loader with that seed reads in ``epoch`` (an epoch needs a seed).
        rows_per_group: rows per Parquet row group.
        quiet: no progress bar.
        storage_options: options for remote URLs (see :class:`~shardkit.PileOptions`).

    Raises:
        ConfigError: an unknown format or a bad option; ``out`` is named as a dataset's own files
            are, or is a directory or no regular file.
        DatasetNotFoundError: ``dataset`` holds no manifest.
    """
    if to not in FORMATS:
        raise ConfigError(f"to: expected one of {', '.join(FORMATS)}, got {to!r}")
    check_epoch(epoch)
    check_int("rows_per_group", rows_per_group, low=1)
    check_bool("quiet", quiet)
    if seed is not None:
        check_int("seed", seed, low=0)
    elif epoch:
        raise ConfigError("epoch: epochs differ only in the shuffled order: give seed= too")
    source, target = check_path("dataset", dataset), check_path("out", out)
    storage.use([source, target], storage_options)
    target = _target(source, target)
    pa, pq = optional("pyarrow", "parquet", "export"), optional("pyarrow.parquet", "parquet", "export")
    info(source, storage_options=storage_options)  # a dataset, not tar shards: its errors name what is there
    with _reader(source, seed, storage_options) as reader:
        reader.set_epoch(epoch)
        return _write(pa, pq, target, reader, _read_manifest(source, reader), rows_per_group=rows_per_group, quiet=quiet)


def _write(pa: Any, pq: Any, target: str, reader: Loader, manifest: Manifest, *, rows_per_group: int, quiet: bool) -> Exported:
    """Write the samples of ``reader`` into the Parquet file ``target``, whole or not at all
    (what an export to it that was killed left is removed first)."""
    for name in storage.remove_dead_partials(target):
        log.info("%s: removed %s, left by an export to it that did not finish", target, name)
    columns = ("__key__", *sorted(manifest.fields))
    schema = pa.schema([pa.field("__key__", pa.string(), nullable=False), *(pa.field(c, pa.large_binary()) for c in columns[1:])])
    rows = 0
    with (
        storage.atomic_write(target) as f,
        pq.ParquetWriter(f, schema) as writer,
        bar(total=manifest.samples, desc="exporting", unit="sample", quiet=quiet) as progress,
    ):
        batch: list[dict[str, Any]] = []
        for sample in reader:
            batch.append(sample)
            if len(batch) == rows_per_group:
                writer.write_table(_table(pa, schema, columns, batch))
                rows += len(batch)
                progress.update(len(batch))
                batch = []
        if batch or not rows:
            writer.write_table(_table(pa, schema, columns, batch))
            rows += len(batch)
            progress.update(len(batch))
    return Exported(target, rows, columns)


def _table(pa: Any, schema: Any, columns: tuple[str, ...], batch: list[dict[str, Any]]) -> Any:
    data = {c: [bytes(s[c]) if c in s else None for s in batch] for c in columns[1:]}
    return pa.table({"__key__": [s["__key__"] for s in batch], **data}, schema=schema)
