"""shardkit.json: the dataset manifest, read, validated and written atomically (always last).

A directory is a shardkit dataset exactly when it holds this file, so a job that dies before
the end never leaves something that looks like a whole dataset. A dataset that grows has
generations: generation g's manifest is also kept as ``shardkit.g<g>.json`` (see
:func:`generation_name`), and a pile may be a list of immutable segment files (:class:`Segment`),
read as one tar.
"""

from __future__ import annotations

import datetime
import errno
import json
import mmap
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shardkit import storage
from shardkit._util import check_path
from shardkit.dataset import layout
from shardkit.dataset.layout import GENERATION_FILE as GENERATION_FILE
from shardkit.dataset.layout import generation_name as generation_name
from shardkit.dataset.layout import keys_name as keys_name
from shardkit.dataset.layout import leaf_name as leaf_name
from shardkit.dataset.layout import pile_number as pile_number
from shardkit.dataset.layout import whole_pile as whole_pile
from shardkit.errors import DatasetNotFoundError, ManifestError, StorageError
from shardkit.tar.compression import CODECS
from shardkit.tar.write import TRAILER

MANIFEST = layout.MANIFEST
FORMAT = "shardkit"
FORMAT_VERSION = 1
# a dataset that grows (generations, segmented piles); plain manifests stay version 1 so older readers read them
GROWING_VERSION = 2


try:  # zlib-ng computes the same CRC-32 with carry-less multiplication: ~12 GB/s here, zlib ~3.6
    from zlib_ng.zlib_ng import crc32 as _crc32
except ImportError:  # pragma: no cover - a platform without zlib-ng wheels
    from zlib import crc32 as _crc32


def checksum(data: bytes | bytearray | memoryview | mmap.mmap, previous: int = 0) -> int:
    """Running CRC-32 (zlib's); pass the last value to continue over more bytes."""
    return _crc32(data, previous)


def format_checksum(crc: int) -> str:
    return f"crc32:{crc:08x}"


# the optional fields of a compressed file's entry (a pile or a segment): all three, or none
_COMPRESSED = ("compression", "tar_bytes", "tar_checksum")


def _entry(info: Any) -> dict[str, Any]:
    """A pile's or segment's manifest entry: the compression fields only for a compressed file."""
    doc = {"name": info.name, "samples": info.samples, "bytes": info.bytes, "checksum": info.checksum}
    if info.compression is not None:
        doc.update(compression=info.compression, tar_bytes=info.tar_bytes, tar_checksum=info.tar_checksum)
    return doc


@dataclass(frozen=True, kw_only=True)
class Segment:
    """One immutable file of a pile that grows: its name, samples, bytes, checksum, generation.

    The file is a whole tar (with its end-of-archive trailer), or one compressed whole like a
    pile (``pile-000003.g000001.tar.zst``, with ``compression``, ``tar_bytes`` and
    ``tar_checksum`` as a compressed pile has them); a pile of several segments is their tars
    concatenated without the inner trailers. Beside it, ``<stem>.keys`` holds the sorted 64-bit
    hashes of its keys (see :func:`keys_name`), so an append checks its keys against the
    dataset's without reading the old data.

    ``resolution`` and ``leaf`` say which samples it may hold: those whose draw u (see
    :func:`shardkit.piles.router.draws`) has ``floor(u * resolution) == leaf``. Any file holds
    leaf 0 of resolution 1 (the default, which the manifest then leaves out); a pile an append
    split into leaves is made of finer ones.
    """

    name: str
    samples: int
    bytes: int
    checksum: str
    generation: int
    compression: str | None = None
    tar_bytes: int | None = None
    tar_checksum: str | None = None
    resolution: int = 1
    leaf: int = 0

    @property
    def tar_size(self) -> int:
        """The size of the tar it holds (the file's size when it is not compressed)."""
        return self.bytes if self.tar_bytes is None else self.tar_bytes

    def info(self) -> PileInfo:
        """The segment as a file entry of its own, checked and read as a pile is."""
        return PileInfo(
            name=self.name,
            samples=self.samples,
            bytes=self.bytes,
            checksum=self.checksum,
            compression=self.compression,
            tar_bytes=self.tar_bytes,
            tar_checksum=self.tar_checksum,
        )

    def to_dict(self) -> dict[str, Any]:
        doc = {**_entry(self), "generation": self.generation}
        if self.resolution != 1:
            doc.update(resolution=self.resolution, leaf=self.leaf)
        return doc


@dataclass(frozen=True, kw_only=True)
class PileInfo:
    """One pile: file name relative to the dataset, sample count, byte size, checksum.

    ``bytes`` and ``checksum`` are the file's as stored. A compressed pile
    (``pile-000000.tar.zst``) also names its ``compression`` and the size and checksum of the
    tar inside (``tar_bytes``, ``tar_checksum``): what a loader holds in memory. A plain pile
    has None there, and its manifest entry does not hold these fields at all.

    ``segments`` is None for a pile that is one file, ``name``. Otherwise the pile is those
    segment files read as one tar (an empty tuple: an empty pile), ``name`` names the pile,
    ``bytes`` is the size of the concatenated tar and ``checksum`` a checksum of the segments'
    checksums; each segment says how it is stored (compressed or not).

        info.tar_size        # bytes in memory once read: tar_bytes, or bytes for a plain pile
    """

    name: str
    samples: int
    bytes: int
    checksum: str
    compression: str | None = None
    tar_bytes: int | None = None
    tar_checksum: str | None = None
    segments: tuple[Segment, ...] | None = None

    @property
    def tar_size(self) -> int:
        """The tar's size: what a reader holds in memory (the file's size for a plain pile)."""
        return self.bytes if self.tar_bytes is None else self.tar_bytes

    @property
    def files(self) -> list[str]:
        """The file names this pile is read from."""
        return [self.name] if self.segments is None else [s.name for s in self.segments]

    @property
    def parts(self) -> list[PileInfo]:
        """The files this pile is read from, each as an entry of its own (itself, or its segments)."""
        return [self] if self.segments is None else [s.info() for s in self.segments]

    @property
    def stored_bytes(self) -> int:
        """Bytes of its files as stored (compressed or not)."""
        return sum(part.bytes for part in self.parts)

    def to_dict(self) -> dict[str, Any]:
        """The manifest entry: the compression fields only for a compressed pile, the segments
        only for a pile that has them."""
        doc = _entry(self)
        if self.segments is not None:
            doc["segments"] = [s.to_dict() for s in self.segments]
        return doc


def joined(segments: Sequence[Segment], name: str) -> PileInfo:
    """The pile ``name`` that is ``segments`` read as one tar, without reading a byte.

    ``bytes`` is the size of the concatenated tar (each segment's end-of-archive trailer but the
    last left out); ``checksum`` is a CRC-32 of the segments' checksums: each segment file is
    checked against its own when it is read.
    """
    digest = checksum(" ".join(s.checksum for s in segments).encode())
    body = sum(s.tar_size - TRAILER_BYTES for s in segments)
    return PileInfo(
        name=name,
        samples=sum(s.samples for s in segments),
        bytes=body + TRAILER_BYTES,
        checksum=format_checksum(digest),
        segments=tuple(segments),
    )


# the end-of-archive trailer shardkit writes at the end of every pile and segment
TRAILER_BYTES = len(TRAILER)


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
    # a dataset that grows: this manifest's generation, and when each generation it holds was written
    generation: int = 0
    generations: dict[int, str] = field(default_factory=dict)

    @property
    def grows(self) -> bool:
        """The dataset has generations or segmented piles (format version 2)."""
        return self.generation > 0 or bool(self.generations) or any(p.segments is not None for p in self.piles)

    def files(self) -> list[str]:
        """Every file this manifest lists: piles, segments and the key hashes beside segments."""
        found = []
        for p in self.piles:
            found += p.files if p.segments is None else [n for s in p.segments for n in (s.name, keys_name(s.name))]
        return found

    @property
    def samples(self) -> int:
        return sum(p.samples for p in self.piles)

    @property
    def bytes(self) -> int:
        """Bytes of the pile and segment files as stored (compressed or not)."""
        return sum(p.stored_bytes for p in self.piles)

    @property
    def tar_bytes(self) -> int:
        """Bytes of the piles' tars, uncompressed: what readers hold in memory."""
        return sum(p.tar_size for p in self.piles)

    def to_json(self) -> str:
        doc = {
            "format": FORMAT,
            "format_version": GROWING_VERSION if self.grows else FORMAT_VERSION,
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
        if self.grows:
            doc["generation"] = self.generation
            doc["generations"] = {str(g): t for g, t in sorted(self.generations.items())}
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


# the largest count, size or offset a manifest may hold (an exabyte): past it a field is damage, not data
MOST = 1 << 60
# the largest generation and seed a manifest may hold
MOST_GENERATION = 10**9


def _count(doc: dict[str, Any], key: str, where: str, default: int | None = None, most: int = MOST) -> int:
    """A non-negative int field up to ``most``; ``default`` when the field may be absent."""
    if default is not None and key not in doc:
        return default
    value: int = _expect(doc, key, int, where)
    if value < 0:
        raise ManifestError(f"{where}: field {key!r}: expected a non-negative int, got {value}")
    if value > most:
        raise ManifestError(f"{where}: field {key!r}: expected at most {most}, got {value}")
    return value


def _file(p: Any, at: str) -> tuple[str, int, int, str]:
    """name, samples, bytes and checksum of a pile or segment entry."""
    if not isinstance(p, dict):
        raise ManifestError(f"{at}: expected an object, got {p!r}")
    name = layout.check_name(_expect(p, "name", str, at), at)
    checksum = _expect(p, "checksum", str, at)
    if not _CHECKSUM.fullmatch(checksum):
        raise ManifestError(f"{at}: field 'checksum': expected 'crc32:' and 8 lowercase hex digits, got {checksum!r}")
    return name, _count(p, "samples", at), _count(p, "bytes", at), checksum


def _compressed(p: dict[str, Any], at: str) -> dict[str, Any]:
    """A compressed file's codec, tar size and tar checksum (none of them for a plain one)."""
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


def _pile(p: Any, at: str) -> PileInfo:
    name, samples, nbytes, checksum = _file(p, at)
    if p.get("segments") is None:
        return PileInfo(name=name, samples=samples, bytes=nbytes, checksum=checksum, **_compressed(p, at))
    if _compressed(p, at):
        raise ManifestError(f"{at}: pile {name!r} has segments and compression fields; each segment says how it is compressed")
    segments = []
    for i, doc in enumerate(_expect(p, "segments", list, at)):
        where = f"{at}: segments[{i}]"
        seg_name, count, size, crc = _file(doc, where)
        generation = _count(doc, "generation", where, most=MOST_GENERATION)
        segments.append(
            Segment(
                name=seg_name,
                samples=count,
                bytes=size,
                checksum=crc,
                generation=generation,
                **_compressed(doc, where),
                **_leaf(doc, where),
            )
        )
    pile = joined(segments, name)
    if (pile.samples, pile.bytes) != (samples, nbytes):
        raise ManifestError(
            f"{at}: pile {name!r} says {samples} samples and {nbytes} bytes, its segments add up to {pile.samples} and {pile.bytes}"
        )
    return pile


def _leaf(doc: dict[str, Any], at: str) -> dict[str, Any]:
    """A segment's resolution (a power of two) and leaf below it; none for a whole one (1 and 0)."""
    resolution = _count(doc, "resolution", at, default=1, most=1 << 30)
    if resolution < 1 or resolution & (resolution - 1):
        raise ManifestError(f"{at}: field 'resolution': expected a power of two (1, 2, 4, ...), got {resolution}")
    leaf = _count(doc, "leaf", at, default=0)
    if leaf >= resolution:
        raise ManifestError(f"{at}: field 'leaf': expected 0 to {resolution - 1} (below its resolution {resolution}), got {leaf}")
    return {"resolution": resolution, "leaf": leaf}


def parse_time(value: str) -> datetime.datetime | None:
    """An aware ISO 8601 time (``2024-01-01T00:00:00+00:00``); None for anything else."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo is not None and when.utcoffset() is not None else None


def _generations(doc: dict[str, Any], where: str) -> dict[int, str]:
    found = _expect(doc, "generations", dict, where) if "generations" in doc else {}
    times = {}
    for key, value in found.items():
        if not (key.isascii() and key.isdigit()) or int(key) > MOST_GENERATION or not isinstance(value, str):
            raise ManifestError(f"{where}: field 'generations': expected generation numbers mapped to times, got {key!r}: {value!r}")
        if parse_time(value) is None:
            raise ManifestError(
                f"{where}: field 'generations': generation {key}: expected an ISO time with its UTC offset "
                f"(2024-01-01T00:00:00+00:00), got {value!r}"
            )
        times[int(key)] = value
    return times


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


# the largest max_pile_bytes a dataset may record (as PileOptions allows)
_MOST_PILE_BYTES = 1 << 62


def _extra(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """The free-form ``extra``, with the fields shardkit reads back checked: ``max_pile_bytes``."""
    extra: dict[str, Any] = _expect(doc, "extra", dict, where) if "extra" in doc else {}
    limit = extra.get("max_pile_bytes")
    if "max_pile_bytes" in extra and (not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= _MOST_PILE_BYTES):
        raise ManifestError(f"{where}: field 'extra.max_pile_bytes': expected an int from 1 to 2**62, got {limit!r}")
    return extra


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
    if version > GROWING_VERSION:
        raise ManifestError(f"{where}: format_version {version} is newer than this shardkit reads ({GROWING_VERSION}); upgrade shardkit")
    manifest = Manifest(
        piles=_piles(doc, where),
        seed=_count(doc, "seed", where, most=(1 << 128) - 1),
        fields=_fields(doc, where),
        created_by=_expect(doc, "created_by", str, where) if "created_by" in doc else "",
        skipped_units=_count(doc, "skipped_units", where, default=0),
        split_piles=_count(doc, "split_piles", where, default=0),
        extra=_extra(doc, where),
        generation=_count(doc, "generation", where, default=0, most=MOST_GENERATION),
        generations=_generations(doc, where),
    )
    for total in ("samples", "bytes"):  # optional summaries: when present they must add up
        if total in doc and _count(doc, total, where) != getattr(manifest, total):
            raise ManifestError(f"{where}: {total!r} is {doc[total]} but the piles add up to {getattr(manifest, total)}")
    return manifest


def original_piles(m: Manifest) -> int:
    """The M a dataset was written with: split sub-piles (``pile-000012-001.tar``) and an
    append's leaves (``pile-000012.r4-1.tar``) count once."""
    bases = [number for p in m.piles if (number := pile_number(p.name)) is not None]
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
    except DatasetNotFoundError as e:
        if getattr(e, "bucket", None):  # no bucket at all: say that, not "no manifest"
            raise DatasetNotFoundError(f"{directory}: the bucket {e.bucket} does not exist (a typo? create it first)") from None  # type: ignore[attr-defined]
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


def read_generation(directory: str, generation: int) -> Manifest:
    """The manifest of generation ``generation`` of a dataset that grows (the latest one's, or
    the copy :func:`generation_name` keeps).

    Raises:
        DatasetNotFoundError: that generation's manifest is gone (removed by ``shardkit gc``, or
            never published); ManifestError: it is not a valid manifest.
    """
    latest = read(directory)
    if latest.generation == generation:
        return latest
    url = storage.join(directory, generation_name(generation))
    try:
        text = storage.read_bytes(url).decode("utf-8")
    except DatasetNotFoundError:
        raise DatasetNotFoundError(
            f"{directory}: generation {generation} is gone (no {generation_name(generation)}; the dataset is at generation "
            f"{latest.generation}, and shardkit gc removes the files of generations no manifest needs)"
        ) from None
    except UnicodeDecodeError:
        raise ManifestError(f"{url}: not UTF-8 text") from None
    found = parse(text, url)
    if found.generation != generation:
        raise ManifestError(f"{url}: holds generation {found.generation}, expected {generation}")
    return found
