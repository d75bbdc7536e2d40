"""shardkit.json: the dataset manifest, read, validated and written atomically (always last).

A directory is a shardkit dataset exactly when it holds this file, so a job that dies before
the end never leaves something that looks like a whole dataset.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from shardkit import storage
from shardkit._util import check_path
from shardkit.errors import DatasetNotFoundError, ManifestError, StorageError
from shardkit.tar.compression import CODECS

MANIFEST = "shardkit.json"
FORMAT = "shardkit"
FORMAT_VERSION = 1


try:  # zlib-ng computes the same CRC-32 with carry-less multiplication: ~12 GB/s here, zlib ~3.6
    from zlib_ng.zlib_ng import crc32 as _crc32
except ImportError:  # pragma: no cover - a platform without zlib-ng wheels
    from zlib import crc32 as _crc32


def checksum(data: bytes | bytearray | memoryview | mmap.mmap, previous: int = 0) -> int:
    """Running CRC-32 (zlib's); pass the last value to continue over more bytes."""
    return _crc32(data, previous)


def format_checksum(crc: int) -> str:
    return f"crc32:{crc:08x}"


@dataclass(frozen=True, kw_only=True)
class PileInfo:
    """One pile: file name relative to the dataset, sample count, byte size, checksum.

    ``bytes`` and ``checksum`` are the file's as stored. A compressed pile
    (``pile-000000.tar.zst``) also names its ``compression`` and the size and checksum of the
    tar inside (``tar_bytes``, ``tar_checksum``): what a loader holds in memory. A plain pile
    has None there, and its manifest entry does not hold these fields at all.

        info.tar_size        # bytes in memory once read: tar_bytes, or bytes for a plain pile
    """

    name: str
    samples: int
    bytes: int
    checksum: str
    compression: str | None = None
    tar_bytes: int | None = None
    tar_checksum: str | None = None

    @property
    def tar_size(self) -> int:
        """The tar's size: what a reader holds in memory (the file's size for a plain pile)."""
        return self.bytes if self.tar_bytes is None else self.tar_bytes

    def to_dict(self) -> dict[str, Any]:
        """The manifest entry: the compression fields only for a compressed pile."""
        return {k: v for k, v in asdict(self).items() if v is not None or k not in _COMPRESSED}


# the optional fields of a compressed pile's entry: all three, or none
_COMPRESSED = ("compression", "tar_bytes", "tar_checksum")


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """What a dataset directory holds. Written by the writer, trusted by the loader."""

    piles: tuple[PileInfo, ...]
    seed: int
    fields: tuple[str, ...]
    created_by: str
    skipped_units: int = 0
    split_piles: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def samples(self) -> int:
        return sum(p.samples for p in self.piles)

    @property
    def bytes(self) -> int:
        """Bytes of the pile files as stored (compressed or not)."""
        return sum(p.bytes for p in self.piles)

    @property
    def tar_bytes(self) -> int:
        """Bytes of the piles' tars, uncompressed: what readers hold in memory."""
        return sum(p.tar_size for p in self.piles)

    def to_json(self) -> str:
        doc = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "created_by": self.created_by,
            "seed": self.seed,
            "samples": self.samples,
            "bytes": self.bytes,
            "fields": list(self.fields),
            "skipped_units": self.skipped_units,
            "split_piles": self.split_piles,
            "extra": self.extra,
            "piles": [p.to_dict() for p in self.piles],
        }
        return json.dumps(doc, indent=1, sort_keys=False) + "\n"


_CHECKSUM = re.compile(r"crc32:[0-9a-f]{8}")


def _expect(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in doc:
        raise ManifestError(f"{where}: missing field {key!r}")
    value = doc[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ManifestError(f"{where}: field {key!r}: expected {name}, got {value!r}")
    return value


def _count(doc: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    """A non-negative int field; ``default`` when the field may be absent."""
    if default is not None and key not in doc:
        return default
    value: int = _expect(doc, key, int, where)
    if value < 0:
        raise ManifestError(f"{where}: field {key!r}: expected a non-negative int, got {value}")
    return value


def _pile(p: Any, at: str) -> PileInfo:
    if not isinstance(p, dict):
        raise ManifestError(f"{at}: expected an object, got {p!r}")
    name = _expect(p, "name", str, at)
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise ManifestError(f"{at}: pile name {name!r} must be a plain file name")
    checksum = _expect(p, "checksum", str, at)
    if not _CHECKSUM.fullmatch(checksum):
        raise ManifestError(f"{at}: field 'checksum': expected 'crc32:' and 8 lowercase hex digits, got {checksum!r}")
    return PileInfo(name=name, samples=_count(p, "samples", at), bytes=_count(p, "bytes", at), checksum=checksum, **_compressed(p, at))


def _compressed(p: dict[str, Any], at: str) -> dict[str, Any]:
    """A compressed pile's codec, tar size and tar checksum (none of them for a plain pile)."""
    given = [key for key in _COMPRESSED if p.get(key) is not None]
    if not given:
        return {}
    if len(given) != len(_COMPRESSED):
        missing = ", ".join(repr(k) for k in _COMPRESSED if k not in given)
        raise ManifestError(f"{at}: a compressed pile needs {', '.join(map(repr, _COMPRESSED))}; missing {missing}")
    codec = _expect(p, "compression", str, at)
    if codec not in CODECS:
        raise ManifestError(f"{at}: field 'compression': expected one of {', '.join(map(repr, CODECS))}, got {codec!r}")
    tar_checksum = _expect(p, "tar_checksum", str, at)
    if not _CHECKSUM.fullmatch(tar_checksum):
        raise ManifestError(f"{at}: field 'tar_checksum': expected 'crc32:' and 8 lowercase hex digits, got {tar_checksum!r}")
    return {"compression": codec, "tar_bytes": _count(p, "tar_bytes", at), "tar_checksum": tar_checksum}


def _piles(doc: dict[str, Any], where: str) -> tuple[PileInfo, ...]:
    piles = tuple(_pile(p, f"{where}: piles[{i}]") for i, p in enumerate(_expect(doc, "piles", list, where)))
    seen: dict[str, int] = {}
    for i, pile in enumerate(piles):
        if pile.name in seen:
            raise ManifestError(f"{where}: piles[{i}]: pile name {pile.name!r} is already used by piles[{seen[pile.name]}]")
        seen[pile.name] = i
    return piles


def _fields(doc: dict[str, Any], where: str) -> tuple[str, ...]:
    fields = _expect(doc, "fields", list, where)
    for i, name in enumerate(fields):
        if not isinstance(name, str):
            raise ManifestError(f"{where}: fields[{i}]: expected str, got {name!r}")
    return tuple(fields)


def parse(text: str, where: str) -> Manifest:
    """Validate a manifest's JSON text; ``where`` names it in errors.

    Raises:
        ManifestError: not JSON, not a shardkit manifest, or a field of the wrong type or value
            (the error names the file and the field).
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ManifestError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ManifestError(f'{where}: not a shardkit manifest (expected "format": "{FORMAT}")')
    version = _expect(doc, "format_version", int, where)
    if version > FORMAT_VERSION:
        raise ManifestError(f"{where}: format_version {version} is newer than this shardkit reads ({FORMAT_VERSION}); upgrade shardkit")
    manifest = Manifest(
        piles=_piles(doc, where),
        seed=_count(doc, "seed", where),
        fields=_fields(doc, where),
        created_by=_expect(doc, "created_by", str, where) if "created_by" in doc else "",
        skipped_units=_count(doc, "skipped_units", where, default=0),
        split_piles=_count(doc, "split_piles", where, default=0),
        extra=_expect(doc, "extra", dict, where) if "extra" in doc else {},
    )
    for total in ("samples", "bytes"):  # optional summaries: when present they must add up
        if total in doc and _count(doc, total, where) != getattr(manifest, total):
            raise ManifestError(f"{where}: {total!r} is {doc[total]} but the piles add up to {getattr(manifest, total)}")
    return manifest


_PILE = re.compile(r"^pile-(\d+)(?:-\d+)*(?:\.v\d+)?\.tar(?:\.zst|\.gz)?$")


def original_piles(m: Manifest) -> int:
    """The M a dataset was written with: split sub-piles (``pile-000012-001.tar``) count once."""
    bases = [int(match.group(1)) for p in m.piles if (match := _PILE.match(p.name))]
    if len(bases) != len(m.piles):
        return len(m.piles)
    return max(bases) + 1 if bases else 0


def is_dataset(directory: str) -> bool:
    return storage.exists(storage.join(directory, MANIFEST))


def read(directory: str) -> Manifest:
    """Read and validate ``DIRECTORY/shardkit.json``.

    Raises:
        ConfigError: ``directory`` is not a path or URL; DatasetNotFoundError: no manifest there;
        StorageError: it cannot be read (a file, not a directory; no permission...);
        ManifestError: it is not a valid manifest.
    """
    directory = check_path("directory", directory)
    url = storage.join(directory, MANIFEST)
    try:
        text = storage.read_bytes(url).decode("utf-8")
    except DatasetNotFoundError:
        raise DatasetNotFoundError(f"{directory}: not a shardkit dataset (no {MANIFEST}; a job that did not finish leaves none)") from None
    except StorageError as e:
        path = storage.local_path(directory)
        if e.errno == errno.ENOTDIR and path is not None and os.path.isfile(path):
            raise StorageError(
                f"{directory}: is a file, expected a shardkit dataset directory (holding {MANIFEST})", url=url, errno=e.errno
            ) from e
        raise
    except UnicodeDecodeError:
        raise ManifestError(f"{url}: not UTF-8 text") from None
    return parse(text, url)


def write(directory: str, manifest: Manifest) -> None:
    """Write the manifest atomically. Call this last: it is what makes a dataset whole."""
    storage.write_bytes(storage.join(directory, MANIFEST), manifest.to_json().encode("utf-8"))
