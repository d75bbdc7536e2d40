"""Check a manifest's JSON text field by field into a :class:`~shardkit.manifest.model.Manifest`.

Every error is a :class:`~shardkit.ManifestError` that names the file and the field (``piles[3]:
segments[0]: field 'bytes'``); counts, sizes, generations and names are bounded, so damage never
reads as data.
"""

from __future__ import annotations

import datetime
import json
import re
from typing import Any

from shardkit.dataset import layout
from shardkit.errors import ManifestError
from shardkit.manifest.model import (
    COMPRESSED_FIELDS,
    FORMAT,
    GROWING_VERSION,
    Manifest,
    PileInfo,
    Segment,
    joined,
)
from shardkit.tar.compression import CODECS
from shardkit.tar.scan import BLOCK

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
    given = [key for key in COMPRESSED_FIELDS if p.get(key) is not None]
    if not given:
        return {}
    if len(given) != len(COMPRESSED_FIELDS):
        missing = ", ".join(repr(k) for k in COMPRESSED_FIELDS if k not in given)
        raise ManifestError(f"{at}: a compressed pile needs {', '.join(map(repr, COMPRESSED_FIELDS))}; missing {missing}")
    codec = _expect(p, "compression", str, at)
    if codec not in CODECS:
        raise ManifestError(f"{at}: field 'compression': expected one of {', '.join(map(repr, CODECS))}, got {codec!r}")
    tar_checksum = _expect(p, "tar_checksum", str, at)
    if not _CHECKSUM.fullmatch(tar_checksum):
        raise ManifestError(f"{at}: field 'tar_checksum': expected 'crc32:' and 8 lowercase hex digits, got {tar_checksum!r}")
    return {"compression": codec, "tar_bytes": _count(p, "tar_bytes", at), "tar_checksum": tar_checksum}


def _room(name: str, samples: int, tar_size: int, at: str) -> None:
    """Refuse a count no tar of ``tar_size`` bytes can hold: each sample has a member, and each
    member a header of 512 bytes (a reader would set aside room for the count before reading)."""
    if samples > tar_size // BLOCK:
        raise ManifestError(
            f"{at}: {name!r} says {samples} samples in a tar of {tar_size} bytes, which holds at most "
            f"{tar_size // BLOCK} (a header of {BLOCK} bytes each): the manifest is damaged"
        )


def _pile(p: Any, at: str) -> PileInfo:
    name, samples, nbytes, checksum = _file(p, at)
    if p.get("segments") is None:
        pile = PileInfo(name=name, samples=samples, bytes=nbytes, checksum=checksum, **_compressed(p, at))
        _room(name, samples, pile.tar_size, at)
        return pile
    if _compressed(p, at):
        raise ManifestError(f"{at}: pile {name!r} has segments and compression fields; each segment says how it is compressed")
    segments = []
    for i, doc in enumerate(_expect(p, "segments", list, at)):
        where = f"{at}: segments[{i}]"
        seg_name, count, size, crc = _file(doc, where)
        generation = _count(doc, "generation", where, most=MOST_GENERATION)
        segment = Segment(
            name=seg_name, samples=count, bytes=size, checksum=crc, generation=generation, **_compressed(doc, where), **_leaf(doc, where)
        )
        _room(seg_name, count, segment.tar_size, where)
        segments.append(segment)
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
