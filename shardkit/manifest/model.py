"""The manifest's values: :class:`Manifest`, :class:`PileInfo` and :class:`Segment`, their JSON, and the checksum they record.

Pure values with no I/O: :mod:`shardkit.manifest` reads and writes them, and
:mod:`shardkit.manifest.validation` checks a manifest's JSON field by field on its way in.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shardkit._util import crc32 as _crc32
from shardkit.dataset.layout import keys_name, pile_number
from shardkit.storage.local import Buffer
from shardkit.tar.write import TRAILER

FORMAT = "shardkit"
FORMAT_VERSION = 1
# a dataset that grows (generations, segmented piles); plain manifests stay version 1 so older readers read them
GROWING_VERSION = 2


def checksum(data: Buffer | bytearray | memoryview, previous: int = 0) -> int:
    """Running CRC-32 (zlib's); pass the last value to continue over more bytes."""
    return _crc32(data, previous)


def format_checksum(crc: int) -> str:
    return f"crc32:{crc:08x}"


# the optional fields of a compressed file's entry (a pile or a segment): all three, or none
COMPRESSED_FIELDS = ("compression", "tar_bytes", "tar_checksum")


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

    def held_generations(self, *, with_samples: bool = False) -> set[int]:
        """The generations whose files this manifest lists (``with_samples``: files holding samples);
        a pile written whole by pass 1 is generation 0's."""
        held = {s.generation for p in self.piles for s in p.segments or () if s.samples or not with_samples}
        return held | {0} if any(p.segments is None and (p.samples or not with_samples) for p in self.piles) else held

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


def original_piles(m: Manifest) -> int:
    """The M a dataset was written with: split sub-piles (``pile-000012-001.tar``) and an
    append's leaves (``pile-000012.r4-1.tar``) count once."""
    bases = [number for p in m.piles if (number := pile_number(p.name)) is not None]
    if len(bases) != len(m.piles):
        return len(m.piles)
    return max(bases) + 1 if bases else 0
