"""Read a MosaicML Streaming (MDS) directory with the library's own reader: a unit is one shard.

The shards listed in ``index.json`` are read with ``streaming``'s ``MDSReader`` (compressed
shards are decompressed in memory). Columns whose MDS encoding is already a file's bytes
(``bytes``, ``str``, ``jpeg``, ``png``, ``json``) are written as stored, byte for byte; the others
are decoded by the library and encoded as :class:`ColumnSpec` says (``int`` in decimal, ``ndarray``
as ``npy``, ``pil`` as PNG...). Keys are the samples' indices across the shards, ``000000017``,
unless ``key`` names a column. Needs the ``mds`` extra (``mosaicml-streaming``).

    shardkit.pile("mds-out/", "piles/", piles=64)                    # found by its index.json
    shardkit.pile("mds-out/", "piles/", piles=64, format=Mds(fields={"image": "jpg"}))
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.errors import ConfigError, CorruptShardError, DatasetNotFoundError
from shardkit.piles.readers.base import key_prefixes, local_folders, row_key, unreadable
from shardkit.piles.readers.columns import ColumnSpec

# encodings whose stored bytes are already what the field should hold
_AS_STORED = frozenset({"bytes", "str", "jpeg", "png", "json"})


def streaming_format() -> Any:
    """``streaming.base.format``: mosaicml-streaming's own MDS reader and its encodings.

    The ``streaming`` package's ``__init__`` imports every dataset it ships (vision ones import
    torchvision, which fails where torchvision was built for another torch) and
    ``streaming.base``'s the whole loader; the format modules need none of it. Unless the
    package is imported already, they are imported under placeholder parents, which are taken
    away again so that a later ``import streaming`` runs the real ``__init__``.
    """
    loaded = sys.modules.get("streaming.base.format")
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("streaming")
    if spec is None or spec.submodule_search_locations is None:
        raise ConfigError("reading MDS directories needs the mds extra (pip install 'shardkit[mds]'): streaming is not installed")
    if "streaming" in sys.modules:
        return importlib.import_module("streaming.base.format")
    stubs = {}
    for name, folder in (("streaming", ""), ("streaming.base", "base")):
        stubs[name] = types.ModuleType(name)
        stubs[name].__path__ = [os.path.join(location, folder) for location in spec.submodule_search_locations]
    sys.modules.update(stubs)
    try:
        return importlib.import_module("streaming.base.format")
    except Exception as e:
        raise ConfigError(f"reading MDS directories needs mosaicml-streaming's format modules, which do not import: {e}") from None
    finally:
        for name, stub in stubs.items():
            if sys.modules.get(name) is stub:
                del sys.modules[name]


@dataclass(frozen=True)
class MdsShard:
    """Shard ``shard`` of the MDS directory ``path`` (its entry in ``index.json``), whose first sample is number ``first``."""

    path: str
    prefix: str
    shard: int
    first: int
    info: str  # the shard's entry in index.json, as JSON

    def __repr__(self) -> str:
        return f"{self.path} shard {self.shard} ({json.loads(self.info)['raw_data']['basename']})"


def read_index(path: str) -> list[dict[str, Any]]:
    """The shard entries of an MDS ``index.json``."""
    index = os.path.join(path, "index.json")
    try:
        with open(index, encoding="utf-8") as f:
            doc = json.load(f)
        shards = doc["shards"]
        if doc.get("version") != 2 or not isinstance(shards, list):
            raise ValueError(f"expected version 2 with a list of shards, got version {doc.get('version')!r}")
        for k, info in enumerate(shards):
            if not _entry(info):
                raise ValueError(f"shard {k}: expected 'samples' (a count) and 'raw_data': {{'basename': ...}}, got {info!r:.200}")
        return shards
    except FileNotFoundError:
        raise DatasetNotFoundError(f"{path}: no index.json: not a directory MDSWriter wrote") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise unreadable(index, "not an MDS index", e) from None


def _entry(info: Any) -> bool:
    """Whether ``info`` has what this reader looks up in an index entry itself: the sample count and the file name."""
    if not isinstance(info, dict) or not isinstance(info.get("raw_data"), dict):
        return False
    count = info.get("samples")
    return isinstance(count, int) and not isinstance(count, bool) and count >= 0 and isinstance(info["raw_data"].get("basename"), str)


def _raw(path: str, info: dict[str, Any]) -> bytes:
    """The shard's uncompressed bytes: the raw file, or the compressed one decompressed here."""
    raw = os.path.join(path, info["raw_data"]["basename"])
    if os.path.exists(raw):
        with open(raw, "rb") as f:
            return f.read()
    if not info.get("zip_data"):
        raise DatasetNotFoundError(f"{raw}: shard file missing")
    streaming_format()
    from streaming.base.compression import decompress

    packed = os.path.join(path, info["zip_data"]["basename"])
    with open(packed, "rb") as f:
        data = f.read()
    try:
        return bytes(decompress(info["compression"], data))
    except Exception as e:  # each codec's library has errors of its own
        raise CorruptShardError(f"{packed}: cannot decompress it ({info['compression']}): {type(e).__name__}: {e}") from None


@dataclass(frozen=True, kw_only=True)
class Mds(ColumnSpec):
    """MDS directories -> samples (see the module's docstring).

    reader = Mds(fields={"image": "jpg", "label": "cls"})
    units = reader.units(["mds-out/"])
    """

    def prepare(self, inputs: Sequence[str]) -> tuple[list[MdsShard], dict[str, Any]]:
        """One unit per shard of every directory, from its ``index.json``."""
        paths = local_folders(inputs, "MDS")
        prefixes = key_prefixes(paths, ()) if len(paths) > 1 else [""]
        units: list[MdsShard] = []
        for path, prefix in zip(paths, prefixes, strict=True):
            first = 0
            for k, info in enumerate(read_index(path)):
                if info.get("format") != "mds":
                    raise CorruptShardError(f"{path}: shard {k} is in the {info.get('format')!r} format; only 'mds' shards are read")
                units.append(MdsShard(path, prefix, k, first, json.dumps(info, sort_keys=True)))
                first += int(info["samples"])
        return units, {}

    def units(self, inputs: Sequence[str]) -> list[MdsShard]:
        return self.prepare(inputs)[0]

    def __call__(self, unit: MdsShard) -> Iterator[dict[str, Any]]:
        reader_from_json = streaming_format().reader_from_json  # first: it imports the package's format modules
        from streaming.base.format.mds.encodings import mds_decode

        info = json.loads(unit.info)
        where = repr(unit)
        reader = reader_from_json(unit.path, None, info)
        data = _raw(unit.path, info)
        count = int(info["samples"])
        if len(data) < 4 * (count + 2):
            raise CorruptShardError(f"{where}: the shard is {len(data)} bytes, too short for the header of its {count} samples: truncated")
        if (stored := int(np.frombuffer(data, np.uint32, 1)[0])) != count:
            raise CorruptShardError(f"{where}: the shard's header says {stored} samples, index.json {count}")
        offsets = np.frombuffer(data, np.uint32, count + 1, offset=4)
        if len(data) < int(offsets[-1]):
            raise CorruptShardError(f"{where}: the shard is {len(data)} bytes, its offsets reach {int(offsets[-1])}: truncated")
        names, encodings = list(reader.column_names), list(reader.column_encodings)
        columns: list[list[Any]] = [[] for _ in names]
        for i in range(count):
            try:
                fields = _split(reader, data[int(offsets[i]) : int(offsets[i + 1])])
                for c, (encoding, value) in enumerate(zip(encodings, fields, strict=True)):
                    columns[c].append(value if encoding in _AS_STORED else mds_decode(encoding, value))
            except Exception as e:
                raise CorruptShardError(f"{where}: sample {i}: MDS cannot decode it ({type(e).__name__}: {e})") from None
        keys = [row_key(unit.prefix, unit.first + i) for i in range(count)]
        yield from self.samples(names, columns, keys, where, first=unit.first)


def _split(reader: Any, data: bytes) -> list[bytes]:
    """A sample's stored bytes, column by column (variable-size columns lead with their sizes)."""
    sizes, at = [], 0
    for size in reader.column_sizes:
        if size is None:
            size = int(np.frombuffer(data, np.uint32, 1, offset=at)[0])
            at += 4
        sizes.append(size)
    values = []
    for size in sizes:
        values.append(data[at : at + size])
        at += size
    if at != len(data):
        raise ValueError(f"the columns take {at} bytes, the sample has {len(data)}")
    return values
