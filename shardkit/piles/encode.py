"""Encode one sample dict into the tar members of a pile, refusing what readers would misread.

A sample is ``{"__key__": key, ext: value, ...}``; each field becomes the member ``KEY.EXT``,
fields in sorted order, values encoded by extension (:mod:`shardkit.codecs`). The key is checked
here, once, for everything that would make WebDataset readers split or merge it.

    data, exts = encode_sample({"__key__": "000017", "jpg": image, "cls": 3})
    parts, size, exts = encode_parts({"__key__": "000017", "jpg": image, "cls": 3})
    key, exts, values, size = encode_values({"__key__": "000017", "jpg": image, "cls": 3})
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any, NoReturn

from shardkit.codecs import DEFAULT, Codecs, encode_field
from shardkit.errors import SampleError
from shardkit.storage import Chunk
from shardkit.tar import write
from shardkit.tar.scan import BLOCK

# C0 and C1 control characters, DEL: tar cuts a name at NUL, and none belongs in a file name
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
# keys that pass every check below at a glance (most do): ASCII letters, digits, '-' and '_' in
# '/'-separated components, none empty, none starting with '_' (so none is '__name__'), no dot
_PLAIN = re.compile(r"[0-9A-Za-z-][0-9A-Za-z_-]*(?:/[0-9A-Za-z-][0-9A-Za-z_-]*)*")


def check_key(key: Any) -> str:
    """``key`` if it is a valid sample key, else a SampleError saying why not."""
    if type(key) is str and _PLAIN.fullmatch(key):
        return key
    return _check_key(key)


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise SampleError(f"sample key must be a non-empty str, got {key!r}")
    if not key.isascii():
        _check_bytes(f"sample key {key!r}", key)
    if _CONTROL.search(key):
        raise SampleError(f"sample key {key!r} contains a control character (NUL, newline, tab...): keys must be printable")
    parts = key.split("/")
    if key.startswith("/") or ".." in parts or "" in parts:
        raise SampleError(f"sample key {key!r}: no leading '/', empty or '..' path components allowed")
    if "." in parts[-1]:
        raise SampleError(f"sample key {key!r} has a dot in its file name: readers would split the key at it (use '_' instead)")
    if any(len(part) >= 4 and part.startswith("__") and part.endswith("__") for part in parts):
        # WebDataset treats such names as metadata and silently skips the member
        raise SampleError(f"sample key {key!r}: a path component like '__name__' is reserved (WebDataset readers skip it)")
    return key


def encode_sample(sample: Mapping[str, Any], codecs: Codecs = DEFAULT, *, max_pile_bytes: int | None = None) -> tuple[bytes, list[str]]:
    """Encode a WebDataset sample dict into tar members; returns (bytes, extensions).

    Fields are written in sorted order; keys starting with ``__`` other than ``__key__`` are
    metadata and are not written.

    Raises:
        SampleError: a bad key, an empty or duplicate extension, a value with no encoder, or a
            sample that alone would not fit in a pile of ``max_pile_bytes``.
    """
    parts, _, exts = encode_parts(sample, codecs, max_pile_bytes=max_pile_bytes)
    return b"".join(parts), list(exts)


def encode_parts(
    sample: Mapping[str, Any], codecs: Codecs = DEFAULT, *, max_pile_bytes: int | None = None
) -> tuple[list[Chunk], int, tuple[str, ...]]:
    """:func:`encode_sample`'s bytes as the pieces they are made of, their total size, and the extensions.

    The pieces are headers, the field values themselves (no copy) and padding: a writer that
    gathers them at its next write never copies a sample into a buffer of its own, which for
    samples of a few KB costs more than the rest of encoding (fresh memory, page by page). The
    extensions are one tuple for every sample with the same field names.

    Raises:
        SampleError: as :func:`encode_sample`.
    """
    key, exts, values, size = encode_values(sample, codecs, max_pile_bytes=max_pile_bytes)
    parts: list[Chunk] = []
    for ext, value in zip(exts, values, strict=True):
        parts.extend(write.member_parts(f"{key}.{ext}", value))
    return parts, size, exts


def encode_values(
    sample: Mapping[str, Any], codecs: Codecs = DEFAULT, *, max_pile_bytes: int | None = None
) -> tuple[str, tuple[str, ...], list[bytes], int]:
    """The checks and field encoding of :func:`encode_parts`, without the tar headers: the key,
    the extensions (one tuple for every sample with the same field names), each field's bytes in
    their order, and the size the members will take in a pile.

    A writer that keeps the values until it writes them makes the headers of many samples at once
    then (:func:`shardkit.tar.write.headers`), which costs a fraction of making them one by one.

    Raises:
        SampleError: as :func:`encode_sample`, before anything is kept.
    """
    if "__key__" not in sample:
        raise SampleError(f"sample has no '__key__' (fields: {sorted(sample)})")
    key = check_key(sample["__key__"])
    found = _field_order(tuple(sample))
    if found is None:  # something is wrong with the field names: say what
        _refuse_fields(key, sample)
    order, exts, room = found
    values: list[bytes] = []
    size = 0
    for name, ext in order:
        value = sample[name]
        if type(value) is not bytes:  # bytes pass as they are (most values, in a writer's hot loop)
            value = encode_field(codecs, key, ext, value)
            if type(value) is not bytes:  # kept until the writer's next write: a buffer its maker may reuse is copied now
                value = bytes(value)
        values.append(value)
        size += len(value) + (-len(value) & _ROUND)
    size += BLOCK * len(values)
    if len(key) > room or size > write.MAX_OCTAL_SIZE or not key.isascii():  # a member needs a pax header (rare)
        size = sum(len(part) for ext, value in zip(exts, values, strict=True) for part in write.member_parts(f"{key}.{ext}", value))
    if max_pile_bytes is not None and size + len(write.TRAILER) > max_pile_bytes:
        raise SampleError(f"sample {key!r} is {size} bytes, larger than max_pile_bytes ({max_pile_bytes}) on its own")
    return key, exts, values, size


# what rounds a member's data up to whole blocks
_ROUND = BLOCK - 1


def _check_bytes(what: str, text: str) -> None:
    """A name is written as its UTF-8 bytes, an escaped undecodable byte (U+DC80..U+DCFF, as
    Python reads a name that is not UTF-8) as that byte; any other surrogate has no bytes."""
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise SampleError(
            f"{what} holds {text[e.start]!r} at position {e.start}, a surrogate that is no byte of a file name "
            "(bytes that are not UTF-8 are read as U+DC80..U+DCFF, and only those are written back)"
        ) from None


@functools.lru_cache(maxsize=1024)
def _field_order(names: tuple[str, ...]) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...], int] | None:
    """(field name, extension) of the fields a sample with these names writes, by extension, the
    extensions alone, and the longest ASCII key whose member names all fit a ustar header (-1 if
    an extension is not ASCII: every member then has a pax header).

    Samples of one dataset share their field names, so this runs once per kind of sample.
    None when the names are not valid (:func:`_refuse_fields` says why).
    """
    fields: dict[str, str] = {}
    for name in names:
        if name.startswith("__"):
            continue
        ext = name[1:] if name.startswith(".") else name
        if not ext or "/" in ext or ext in fields or not _writable(ext):
            return None
        fields[ext] = name
    exts = tuple(sorted(fields))
    if not exts:
        return None
    room = write.NAME_BYTES - 1 - max(map(len, exts)) if all(ext.isascii() for ext in exts) else -1
    return tuple((fields[ext], ext) for ext in exts), exts, room


def _writable(text: str) -> bool:
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def _refuse_fields(key: str, sample: Mapping[str, Any]) -> NoReturn:
    seen: set[str] = set()
    for name in sample:
        if name.startswith("__"):
            continue
        ext = name[1:] if name.startswith(".") else name
        if not ext:
            raise SampleError(
                f"sample {key!r}: a field with an empty name (in a tar shard, a member named {key!r}, with no '.EXTENSION' "
                "after its key): field names are extensions, as in WebDataset's KEY.EXTENSION member names"
            )
        if "/" in ext:
            raise SampleError(f"sample {key!r}: field name {name!r} is not a valid extension")
        _check_bytes(f"sample {key!r}: field name {name!r}", ext)
        if ext in seen:
            raise SampleError(f"sample {key!r}: two fields with extension {ext!r}")
        seen.add(ext)
    raise SampleError(f"sample {key!r} has no fields besides its key")
