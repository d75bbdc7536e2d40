"""Readers: the formats users hold (Parquet, Arrow, Hugging Face, MDS, litdata, CSV) as pass-1 input.

Each reader is a frozen dataclass that plans input units (``prepare(inputs) -> (units, extra)``)
and turns a unit into sample dicts (calling it), like the built-in transforms, so
:func:`shardkit.preprocess` runs it in any number of workers with byte-identical output;
:func:`shardkit.pile` picks one from the inputs' suffixes (:func:`detect`) or by name
(``format="parquet"``). Units and keys are fixed by the inputs alone. Columns become fields as
:mod:`~shardkit.piles.readers.columns` says. :mod:`shardkit.tools.export` goes the other way,
from a dataset to Parquet.

    reader = make("parquet", fields={"image": "jpg"})
    units, extra = reader.prepare(["data/*.parquet"])
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from shardkit import storage
from shardkit.errors import ConfigError, CorruptShardError, DatasetNotFoundError

# name -> (module, class); modules import their libraries only when a unit is read
READERS: dict[str, tuple[str, str]] = {
    "parquet": ("shardkit.piles.readers.parquet", "Parquet"),
    "arrow": ("shardkit.piles.readers.arrow", "Arrow"),
    "hf": ("shardkit.piles.readers.hf", "HuggingFace"),
    "mds": ("shardkit.piles.readers.mds", "Mds"),
    "litdata": ("shardkit.piles.readers.lit", "Litdata"),
    "csv": ("shardkit.piles.readers.delimited", "Csv"),
}
# what ``format`` may also say for WebDataset tar shards (no reader: they are copied as they are)
SHARDS = ("shards", "tar", "webdataset")
_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow", ".csv": "csv", ".tsv": "csv"}


def reader_class(name: str) -> type:
    """The class of the reader ``name`` (see :data:`READERS`)."""
    if name not in READERS:
        raise ConfigError(f"format: expected one of {', '.join([*READERS, *SHARDS])}, got {name!r}")
    module, cls = READERS[name]
    return getattr(importlib.import_module(module), cls)


def make(name: str, **args: Any) -> Any:
    """The reader ``name`` made with ``args``; an unknown argument is a ConfigError naming the choices."""
    cls = reader_class(name)
    allowed = [f.name for f in fields(cls) if f.name != "dataset"]
    for arg in args:
        if arg not in allowed:
            raise ConfigError(f"{arg}: unknown argument for format {name!r} (expected one of: {', '.join(allowed)})")
    return cls(**args)


def is_reader(value: Any) -> bool:
    """Whether ``value`` is one of the readers of :data:`READERS`."""
    from shardkit.piles.readers.columns import ColumnSpec

    return isinstance(value, ColumnSpec)


def _directory_format(path: str) -> str | None:
    if os.path.isfile(os.path.join(path, "state.json")) or os.path.isfile(os.path.join(path, "dataset_dict.json")):
        return "hf"
    index = os.path.join(path, "index.json")
    if not os.path.isfile(index):
        return None
    try:
        with open(index, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError:
        return None
    except ValueError as e:
        if not _looks_like_an_index(index):  # some other file of that name: a folder like any
            return None
        # the folder of an MDS or litdata writer, damaged: say so, not "a directory, not a file"
        raise CorruptShardError(
            f"{index}: not valid JSON ({e}); a folder with an index.json is read as the output of MDSWriter or "
            "litdata.optimize, whose index this should be: copy the folder again, or write it again"
        ) from None
    if isinstance(doc, dict) and "shards" in doc:
        return "mds"
    if isinstance(doc, dict) and "chunks" in doc:
        return "litdata"
    return None


def _looks_like_an_index(index: str) -> bool:
    """Whether the start of the file ``index`` reads like the index MDSWriter or litdata.optimize
    writes: a JSON object that names its shards or chunks."""
    with open(index, "rb") as f:
        head = f.read(4096)
    return head.lstrip().startswith(b"{") and (b'"shards"' in head or b'"chunks"' in head)


def detect(source: Any) -> str | None:
    """The reader for one input by its suffix or, for a local folder, its marker files; None
    for WebDataset shards (and anything else, which ``pile`` then reads as shards)."""
    from shardkit.piles.readers.hf import is_dataset

    if is_dataset(source):
        return "hf"
    if not isinstance(source, (str, os.PathLike)):
        return None
    path = os.fspath(source)
    local = storage.store_for(path).local_file()
    if local is not None and os.path.isdir(local):
        return _directory_format(local)
    name = path.lower().rstrip("/")
    name = name.removesuffix(".gz")
    return next((fmt for suffix, fmt in _SUFFIXES.items() if name.endswith(suffix)), None)


def refuse_datasets(inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> None:
    """Refuse a local shardkit dataset's folder named as an input of ``pile`` or ``shuffle``.

    Its files are no input: they hold generations its window retired (kept until ``gc``), and
    ``DIR/*.tar`` misses its compressed segments; ``repile`` reads what its manifest lists.

    Raises:
        DatasetNotFoundError: naming the folder and ``shardkit repile``.
    """
    from shardkit import manifest

    for url in [inputs] if isinstance(inputs, (str, os.PathLike)) else inputs:
        local = storage.store_for(url).local_file()
        if local is not None and os.path.isdir(local) and manifest.is_dataset(local):
            raise DatasetNotFoundError(
                f"{url}: a shardkit dataset, not a file: to pile its samples again, run shardkit repile {url} -o OUT "
                "(shardkit.repile), which reads what its manifest lists"
            )


def refuse_own_files(urls: Sequence[str], out: str | os.PathLike[str], command: str = "pile") -> None:
    """Refuse an input in the output folder ``out`` with a name ``command`` gives its own data
    files there (``pile-*.tar`` for pile, ``shard-*.tar`` for shuffle), or one the dataset
    ``out`` holds lists in its manifest: read into ``out`` again, as a pattern like
    ``'*.tar'`` in that folder does on a rerun, its samples would be there twice. A user's other
    files there are inputs like any (``shard-*.tar`` is also what webdataset's ShardWriter writes).

    Raises:
        ConfigError: naming the file, the folder and what to do instead.
    """
    from shardkit import manifest
    from shardkit.dataset import layout

    written = {"pile": layout.PILE_FILE, "shuffle": layout.SHARD_FILE}[command]
    folder = storage.store_for(os.fspath(out)).local_file()
    if folder is None:
        return
    folder = os.path.realpath(folder)
    listed = set(manifest.read(folder).files()) if os.path.isdir(folder) and manifest.is_dataset(folder) else set()
    for url in urls:
        local = storage.store_for(url).local_file()
        if local is None or os.path.dirname(os.path.realpath(local)) != folder:
            continue
        name = os.path.basename(local)
        if written.fullmatch(name) or name in listed:
            what = f"a file {command} writes there" if written.fullmatch(name) else "a data file of the dataset there"
            raise ConfigError(
                f"{url}: an input in the output folder {os.fspath(out)} with the name of {what} (an earlier run's): read "
                "into it again, its samples would be there twice. Name your own files only (a pattern that leaves out "
                f"{name.split('-')[0]}-*.tar), write elsewhere, or write a dataset's samples anew with shardkit repile "
                f"{os.fspath(out)} -o OTHER"
            )


def unknown_file(path: str, command: str = "pile") -> str | None:
    """Why ``command`` (pile, or shuffle, which reads tar shards only) cannot read the local file
    ``path`` as a tar shard, or None: a name without a shard suffix (``.tar``, ``.tar.zst``...)
    whose first bytes are neither a tar header nor a codec's magic. Other inputs (a URL, a shard
    by its name) are read, and any fault named there."""
    import numpy as np

    from shardkit.tar import compression
    from shardkit.tar.scan import checksums

    local = storage.store_for(path).local_file()
    if local is None or path.lower().endswith(compression.SHARD_SUFFIXES) or not os.path.isfile(local):
        return None
    with storage.guard(path, "read"), open(local, "rb") as f:
        head = f.read(512)
    if compression.sniff(head) is not None or head[257:262] == b"ustar":
        return None
    if len(head) == 512:  # a tar without the ustar magic (the old V7 form): its header checksum holds
        stored, computed = checksums(np.frombuffer(head, dtype=np.uint8).reshape(1, 512))
        if stored[0] == computed[0]:
            return None
    known = ", ".join(sorted(set(_SUFFIXES)))
    if command == "shuffle":
        return (
            f"inputs: {path} is not a tar shard (no '.tar' in its name, no tar header at its start) nor a file of a format "
            f"read by its suffix ({known}), and shuffle takes no format: make piles of it with shardkit pile --format "
            "FORMAT, and read them with the loader, which shuffles them"
        )
    return (
        f"inputs: {path} is not a tar shard (no '.tar' in its name, no tar header at its start) nor a file of a format "
        f"pile reads by its suffix ({known}); name the format with format= (--format), or read other files with a "
        "preprocess job (YAML 'transform: jsonl' for JSON lines)"
    )


def resolve(inputs: Any, format: Any = None) -> tuple[Any, list[Any]] | None:
    """The reader for ``inputs`` and the inputs it takes, or None when they are tar shards.

    ``format`` is None (detect it from every input, which must agree), a name from
    :data:`READERS` (or ``"shards"``), or a reader object. A ``datasets.Dataset`` among the
    inputs is handed to a Hugging Face reader as its ``dataset``.
    """
    from shardkit.piles.readers.hf import is_stream

    items = list(inputs) if isinstance(inputs, Sequence) and not isinstance(inputs, (str, bytes)) else [inputs]
    if any(map(is_stream, items)):
        raise ConfigError(
            f"inputs: datasets.{next(type(i).__name__ for i in items if is_stream(i))} (streaming=True) cannot be piled: the hf reader "
            "splits a dataset into ranges of rows, which a stream does not have; load it without streaming=True"
        )
    if isinstance(format, str) and format in SHARDS:
        return None
    if format is None:
        found = {detect(item) for item in items}
        if found <= {None}:  # tar shards, or nothing: pile's own checks say what is wrong
            return None
        if len(found) > 1:
            named = ", ".join(sorted(f or "tar shards" for f in found))
            raise ConfigError(f"inputs: mix formats ({named}): pile one format at a time, or name it with format=")
        reader = make(found.pop())  # type: ignore[arg-type]
    elif isinstance(format, str):
        reader = make(format)
    elif callable(format) and hasattr(format, "prepare"):
        reader = format
    else:
        raise ConfigError(f"format: expected a format name ({', '.join(READERS)}) or a reader object, got {format!r}")
    objects = [item for item in items if not isinstance(item, (str, os.PathLike))]
    if objects:
        from shardkit.piles.readers.hf import HuggingFace, is_dataset

        if len(objects) != 1 or len(items) != 1 or not is_dataset(objects[0]):
            raise ConfigError("inputs: pass one datasets.Dataset object alone, or paths and URLs")
        if not isinstance(reader, HuggingFace):
            raise ConfigError(f"format: a datasets.Dataset is read by the 'hf' reader, got {type(reader).__name__}")
        return dataclasses.replace(reader, dataset=objects[0]), []
    return reader, [os.fspath(item) for item in items]
