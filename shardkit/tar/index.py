"""Index a tar shard's samples as arrays: the one place members are grouped into WebDataset samples.

Built on :func:`shardkit.tar.scan.scan`, which finds and checks the headers of an archive of
plain headers with numpy; anything else goes through :func:`shardkit.tar.walk.walk`, which also
raises the errors. Two views of the result:

- :func:`groups` for the loader: sample keys, where each sample starts, and its fields (named
  once when every sample has the same ones, as a writer of one schema makes them);
- :func:`index` for re-piling, which copies samples without decoding them: a :class:`Layout` of
  header offsets, sizes, name rows and whether each header is already the one shardkit writes.

Both split names the WebDataset way: the key is the name up to the first dot after the last
slash, and adjacent members with equal keys form a sample.

    layout = index(buf, "src-000000.tar")
    starts = layout.samples()   # sample i has members starts[i]:starts[i + 1]
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from shardkit.errors import CorruptShardError
from shardkit.tar import scan as _scan
from shardkit.tar import write
from shardkit.tar.scan import BLOCK, NAME, split_rows
from shardkit.tar.walk import walk

if TYPE_CHECKING:
    from shardkit.storage import Buffer

_SLASH, _DOT = ord("/"), ord(".")


@dataclass(frozen=True, slots=True)
class Groups:
    """How members form samples: ``keys[i]`` owns members ``starts[i]:starts[i + 1]``.

    Either ``exts`` names every member's extension, or ``fields`` says that every sample has
    exactly these extensions, in this order (then ``exts`` is None). Duplicate extensions within
    a sample are not checked here (the loader does it when it hands the sample out).
    ``key_rows`` are the keys as zero-padded UTF-8 rows, for checks that need them as bytes.

    Example:
        chain = scan(buf)
        found = groups(chain.rows, chain.lengths)
        found.keys[0], found.starts[:2]   # the first sample's key and members
    """

    keys: list[str]
    starts: list[int]
    exts: list[str] | None
    fields: tuple[str, ...] | None
    key_rows: np.ndarray

    def key_bytes(self) -> np.ndarray:
        """The keys as numpy bytes (UTF-8), for :func:`shardkit.tar.keys.first_repeat`."""
        return as_bytes(self.key_rows)


def groups(rows: np.ndarray, lengths: np.ndarray) -> Groups:
    """The samples of the members whose names are ``rows`` (zero-padded, ``lengths`` bytes each;
    see :class:`Groups`)."""
    keylen = key_lengths(rows, lengths)
    starts = sample_starts(rows, keylen)
    firsts = starts[:-1]
    krows = key_rows(rows[firsts], keylen[firsts])
    keys = split_rows(krows, keylen[firsts])
    fields = _repeated_fields(rows, keylen, lengths, firsts)
    exts = None if fields is not None else _extensions(rows, keylen, lengths)
    return Groups(keys, starts.tolist(), exts, fields, krows)


def key_lengths(rows: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Bytes of each name before its extension: up to the first dot after the last slash, the
    whole name when there is none. ``rows`` are names zero-padded (as :func:`name_rows` makes them)."""
    width = rows.shape[1]
    flat = rows.ravel()
    if (flat == _SLASH).any():
        cols = np.arange(width)
        slash = np.where(rows == _SLASH, cols, -1).max(axis=1, initial=-1)
        dots = (rows == _DOT) & (slash[:, None] < cols)
        return np.where(dots.any(axis=1), dots.argmax(axis=1), lengths)
    # no slashes (most shards): the first dot of each row, from one pass over all of them
    dots = np.flatnonzero(flat == _DOT)
    row = dots // width
    first = np.ones(len(dots), dtype=bool)
    first[1:] = row[1:] != row[:-1]
    keylen = lengths.copy()
    keylen[row[first]] = dots[first] - row[first] * width
    return keylen


def key_rows(rows: np.ndarray, keylen: np.ndarray) -> np.ndarray:
    """The keys as zero-padded rows, as narrow as the longest key allows."""
    width = max(int(keylen.max(initial=0)), 0)
    if len(rows) and (keylen == width).all():  # keys of one length (numbered samples): a slice
        return rows[:, :width]
    return np.where(keylen[:, None] > np.arange(width), rows[:, :width], 0).astype(np.uint8, copy=False)


def as_bytes(rows: np.ndarray) -> np.ndarray:
    """Zero-padded rows as numpy bytes, one string a row (trailing zeros are padding to numpy)."""
    rows = np.ascontiguousarray(rows)
    return rows.view(f"S{rows.shape[1]}").ravel() if rows.shape[1] else np.zeros(len(rows), dtype="S1")


def sample_starts(rows: np.ndarray, keylen: np.ndarray) -> np.ndarray:
    """Member index where each sample starts (where the key changes), then the number of members."""
    n = len(rows)
    width = max(int(keylen.max(initial=0)), 0)
    new = np.zeros(n, dtype=bool)
    new[:1] = True
    if width and n > 1:
        # trailing NULs are padding to numpy's strings, so keys of different lengths differ
        text = _strings(rows if keylen.min() == width else key_rows(rows, keylen), 0, width)
        new[1:] = text[1:] != text[:-1]
    return np.append(np.flatnonzero(new), n)


def _strings(rows: np.ndarray, start: int, width: int) -> np.ndarray:
    """Columns ``start:start + width`` of each row as one fixed-width numpy string, without a
    copy: numpy compares them in C, faster than row by row."""
    rows = np.ascontiguousarray(rows)
    return np.ndarray((len(rows),), dtype=f"S{width}", buffer=rows, offset=start, strides=(rows.shape[1],))


def _repeated_fields(rows: np.ndarray, keylen: np.ndarray, lengths: np.ndarray, firsts: np.ndarray) -> tuple[str, ...] | None:
    """The extensions every sample has in the same order, or None when samples differ."""
    members, samples = len(rows), len(firsts)
    if samples == 0 or members % samples:
        return None
    width = members // samples
    if not (firsts == np.arange(0, members, width)).all():
        return None
    if (keylen == keylen[0]).all():  # the dot (or its absence) and the extension, in place
        start = max(int(keylen[0]), 0)
        tails = _strings(rows, start, rows.shape[1] - start) if start < rows.shape[1] else None
    else:
        ext = _ext_rows(rows, keylen, lengths)
        tails = _strings(ext, 0, ext.shape[1]) if ext.shape[1] else None
    if tails is not None and not (tails.reshape(samples, width) == tails[:width]).all():
        return None
    begin, end = np.minimum(keylen[:width] + 1, lengths[:width]).tolist(), lengths[:width].tolist()
    return tuple(bytes(rows[j, begin[j] : end[j]]).decode("utf-8", "surrogateescape") for j in range(width))


def _ext_rows(rows: np.ndarray, keylen: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each name's extension, left-aligned and zero-padded."""
    begin = np.minimum(keylen + 1, lengths)
    longest = int((lengths - begin).max(initial=0))
    cols = np.arange(longest)
    at = np.minimum(begin[:, None] + cols, rows.shape[1] - 1)
    picked = np.take_along_axis(rows, at, axis=1)
    return np.where(begin[:, None] + cols < lengths[:, None], picked, 0).astype(np.uint8)


def distinct_extensions(rows: np.ndarray, keylen: np.ndarray, lengths: np.ndarray) -> set[str]:
    """The distinct extensions of the members whose names are ``rows``."""
    ext = np.ascontiguousarray(_ext_rows(rows, keylen, lengths))
    if not len(ext):
        return set()
    if not ext.shape[1]:
        return {""}
    unique = np.unique(ext.view(f"V{ext.shape[1]}").ravel())
    return {bytes(u).rstrip(b"\x00").decode("utf-8", "surrogateescape") for u in unique}


def _extensions(rows: np.ndarray, keylen: np.ndarray, lengths: np.ndarray) -> list[str]:
    """Each name's extension as str ("" for a name without one)."""
    return split_rows(_ext_rows(rows, keylen, lengths), lengths - np.minimum(keylen + 1, lengths))


@dataclass(frozen=True, eq=False)
class Layout:
    """The regular-file members of an in-memory tar, as arrays.

    Attributes:
        heads: offset of each member's ustar header; its data starts 512 bytes later.
        sizes: data size of each member.
        rows: (n, w) uint8, each name's UTF-8 bytes zero-padded to w <= 100 bytes (a name too
            long for 100 bytes gets a row of zeros). Narrow rows keep the array work
            proportional to the names, not to the header field.
        lengths: name length in bytes, or -1 when it does not fit in 100 bytes.
        names: the names as str when the careful walk made them, else None.
        plain: every member is one header with nothing before or between members (no pax),
            so a sample's bytes run from its first header to its last member's padded end.
        canonical: per member, its header is exactly the one shardkit writes for it (all False
            when :func:`index` was told the bytes were ``checked`` and did not compare them).

    Example:
        layout = index(buf, "src-000000.tar")
        starts = layout.samples()
        bounds = layout.sample_bounds(starts)   # sample i is buf[bounds[i]:bounds[i + 1]]
    """

    buf: Buffer | memoryview | Any = field(repr=False)
    source: str
    heads: np.ndarray
    sizes: np.ndarray
    rows: np.ndarray
    lengths: np.ndarray
    names: list[str] | None
    plain: bool
    canonical: np.ndarray

    def __len__(self) -> int:
        return len(self.sizes)

    def name(self, i: int) -> str:
        if self.names is not None:
            return self.names[i]
        return self.rows[i, : self.lengths[i]].tobytes().decode("utf-8", "surrogateescape")

    def all_names(self) -> list[str]:
        return self.names if self.names is not None else split_rows(self.rows, self.lengths)

    def key_lengths(self) -> np.ndarray:
        """Bytes of each name before its WebDataset extension (the first dot after the last slash)."""
        return key_lengths(self.rows, self.lengths)

    def samples(self, keylen: np.ndarray | None = None) -> np.ndarray:
        """Member index where each sample starts, plus ``len(self)`` at the end (WebDataset grouping).

        Raises:
            CorruptShardError: two members of one sample have the same extension.
        """
        n = len(self)
        if n and self.lengths.min() < 0:  # a name too long for the rows: group rows as wide as the names
            rows, lengths = name_rows(self.all_names(), width=None)
            starts = sample_starts(rows, key_lengths(rows, lengths))
            check_extensions(self.all_names(), starts, self.heads, self.source)
            return starts
        keylen = self.key_lengths() if keylen is None else keylen
        starts = sample_starts(self.rows, keylen)
        # inside a sample, names that do not increase may repeat an extension, and so may "k"
        # and "k." (both have the empty one): group() decides, and names the member
        inside = np.ones(n, dtype=bool)
        inside[starts[:-1]] = False
        if (inside & (~self.increasing() | (self.lengths <= keylen + 1))).any():
            check_extensions(self.all_names(), starts, self.heads, self.source)
        return starts

    def sample_keys(self, firsts: np.ndarray, keylen: np.ndarray | None = None) -> np.ndarray:
        """The UTF-8 key of each sample whose first member is ``firsts[i]``, as numpy bytes."""
        if len(firsts) and self.lengths.min() < 0:  # a name too long for the rows: split the str names
            names = self.all_names()
            return np.array([split_name(names[i])[0].encode("utf-8", "surrogateescape") for i in firsts.tolist()], dtype=bytes)
        keylen = self.key_lengths() if keylen is None else keylen
        return as_bytes(key_rows(self.rows[firsts], keylen[firsts]))

    def sample_bounds(self, starts: np.ndarray) -> np.ndarray:
        """Byte bounds of the samples: sample i is ``buf[b[i]:b[i + 1]]``, headers included.

        A sample runs from the end of the one before (any pax header in front of its first
        member included) to its last member's padded end.
        """
        last = starts[1:] - 1
        ends = self.heads[last] + BLOCK + self.sizes[last] + (-self.sizes[last] % BLOCK)
        return np.concatenate([[0], ends]).astype(np.int64)

    @functools.cached_property
    def _increasing(self) -> np.ndarray:
        rows, at = self.rows, np.arange(1, len(self))
        col = (rows[1:] != rows[:-1]).argmax(axis=1)  # first differing byte (0 when equal)
        return np.concatenate([[True], rows[at, col] > rows[at - 1, col]])

    def increasing(self) -> np.ndarray:
        """Per member: its name sorts (bytewise) after the previous member's; True for the first."""
        return self._increasing if len(self) else np.zeros(0, dtype=bool)


def index(buf: Buffer, source: str, *, checked: bool = False) -> Layout:
    """The :class:`Layout` of the tar held in ``buf``; ``source`` names it in errors.

    ``checked``: the bytes already matched a checksum recorded for the whole file (a pile
    against its manifest), so the plain index neither sums header checksums nor compares
    headers with shardkit's (``canonical`` is then all False: not known).

    Raises:
        CorruptShardError: as :func:`shardkit.tar.walk.walk`.
    """
    layout = _plain(buf, source, checked)
    return layout if layout is not None else _careful(buf, source)


def _plain(buf: Buffer, source: str, checked: bool = False) -> Layout | None:
    """The vectorized index, or None when the archive is not plain (the careful walk decides).

    A pax header in front of a member (webdataset and Python's tarfile write one per member
    for a float mtime) is accepted when its records cannot change the member's name or size.
    """
    chain = _scan.scan(buf, checksums=False)
    if chain is None:
        return None
    canonical = np.zeros(len(chain.heads), dtype=bool)
    if not checked:
        headers = np.take(_scan.blocks_of(buf), chain.heads // BLOCK, axis=0)
        canonical = _canonical_headers(headers, chain.rows, chain.sizes)
        if len(_scan.bad_checksums(headers[~canonical])):
            return None  # the careful walk names the bad header
    return Layout(buf, source, chain.heads, chain.sizes, chain.rows, chain.lengths, None, not chain.gaps, canonical)


def _canonical_headers(headers: np.ndarray, names: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per member: its header is byte for byte the one shardkit writes (so its checksum holds)."""
    return write.canonical(headers, names, sizes) & (names < 128).all(axis=1)  # other names get a pax header


def _careful(buf: Buffer, source: str) -> Layout:
    members = walk(buf, source)
    names = members.names
    heads = np.asarray(members.offsets, dtype=np.int64) - BLOCK
    sizes = np.asarray(members.sizes, dtype=np.int64)
    rows, lengths = name_rows(names)
    padded = sizes + (-sizes % BLOCK)
    plain = bool(len(heads) == 0 or (heads[0] == 0 and (heads[1:] == heads[:-1] + BLOCK + padded[:-1]).all()))
    canonical = np.zeros(len(heads), dtype=bool)
    if plain and len(heads) and lengths.min() >= 0:
        canonical = _canonical_headers(np.take(_scan.blocks_of(buf), heads // BLOCK, axis=0), rows, sizes)
    return Layout(buf, source, heads, sizes, rows, lengths, names, plain, canonical)


def name_rows(names: list[str], *, width: int | None = NAME) -> tuple[np.ndarray, np.ndarray]:
    """Names as zero-padded UTF-8 rows and their lengths in bytes.

    ``width``: the widest row; a longer name gets length -1 and a row of zeros (what a ustar
    header can hold is compared this way). None: as wide as the longest name.
    """
    encoded = [n.encode("utf-8", "surrogateescape") for n in names]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    fits = lengths <= (width if width is not None else int(lengths.max(initial=0)))
    if not fits.all():
        encoded = [e if f else b"" for e, f in zip(encoded, fits.tolist(), strict=True)]
    longest = max(int(lengths[fits].max(initial=0)), 1)
    blob = b"".join(e.ljust(longest, b"\x00") for e in encoded)
    rows = np.frombuffer(blob, dtype=np.uint8).reshape(len(names), longest).copy()
    return rows, np.where(fits, lengths, -1)


def split_name(name: str) -> tuple[str, str]:
    """Split a member name into WebDataset's (key, extension) at the first dot of the file name.

    ``"a/b.c/d.e.jpg"`` -> ``("a/b.c/d", "e.jpg")``; a name without a dot has extension ``""``.
    (:func:`key_lengths` is the same rule over many names at once.)
    """
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :]


def check_extensions(names: list[str], starts: np.ndarray, heads: np.ndarray, source: str) -> None:
    """Raise for the first sample (members ``starts[i]:starts[i + 1]``) with two members of one
    extension: reading it back would keep only one of them."""
    bounds = starts.tolist()
    for lo, hi in itertools.pairwise(bounds):
        seen: set[str] = set()
        for j in range(lo, hi):
            key, ext = split_name(names[j])
            if ext in seen:
                raise CorruptShardError(
                    f"{source}: member {j} ({names[j]!r}) at offset {int(heads[j])}: sample {key!r} already has a {ext!r} member"
                )
            seen.add(ext)
