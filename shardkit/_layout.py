"""Index a tar shard as arrays: each member's header, data and name, and the samples they form.

Re-piling copies samples without decoding them, so it needs positions, not Python objects. A
plain archive (every member a single ustar header, as shardkit and most tools write short names,
optionally with a pax header per member that changes neither name nor size, as webdataset
writes) is indexed with numpy: every block that can be a header is checked at once (magic, octal
size, a safe name without prefix), the chain of headers is followed from block 0, so data that
happens to look like a header is never taken for one, and checksums are verified on the chain.
Anything else (pax paths, GNU long names, old formats, damage) goes through
:func:`shardkit._tar.walk`, which also raises the errors; both give the same :class:`Layout`.

    layout = index(buf, "src-000000.tar")
    starts = layout.samples()   # sample i has members starts[i]:starts[i + 1]
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from shardkit import _tar
from shardkit._fastwalk import zeros_from

if TYPE_CHECKING:
    from shardkit.storage import Buffer

BLOCK = _tar.BLOCK
NAME = _tar.NAME_BYTES
_SLASH, _DOT = ord("/"), ord(".")


@dataclass(frozen=True, eq=False)
class Layout:
    """The regular-file members of an in-memory tar, as arrays.

    Attributes:
        heads: offset of each member's ustar header; its data starts 512 bytes later.
        sizes: data size of each member.
        rows: (n, w) uint8, each name's UTF-8 bytes NUL-padded to w, the longest name that fits
            in 100 bytes (a longer name gets a row of zeros). Narrow rows keep the array work
            proportional to the names, not to the header field.
        lengths: name length in bytes, or -1 when it does not fit in 100 bytes.
        names: the names as str when the careful walk made them, else None.
        plain: every member is one header with nothing before or between members (no pax),
            so a sample's bytes run from its first header to its last member's padded end.
        canonical: per member, its header is exactly the one shardkit writes for it (all False
            when :func:`index` was told the bytes were ``checked`` and did not compare them).
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
        return self.names if self.names is not None else [self.name(i) for i in range(len(self))]

    def key_lengths(self) -> np.ndarray:
        """Bytes of each name before its WebDataset extension (the first dot after the last slash)."""
        cols = np.arange(self.rows.shape[1])
        inside = self.lengths[:, None] > cols
        slash = np.where((self.rows == _SLASH) & inside, cols, -1).max(axis=1, initial=-1)
        dots = (self.rows == _DOT) & inside & (slash[:, None] < cols)
        return np.where(dots.any(axis=1), dots.argmax(axis=1), self.lengths)

    def samples(self, keylen: np.ndarray | None = None) -> np.ndarray:
        """Member index where each sample starts, plus ``len(self)`` at the end (WebDataset grouping).

        Raises:
            CorruptShardError: two members of one sample have the same extension.
        """
        n = len(self)
        if n and self.lengths.min() < 0:  # a name too long for the rows: group the str names
            _, grouped = _tar.group(_tar.Members(self.all_names(), [], [], 0), self.source)
            return np.asarray(grouped, dtype=np.int64)
        keylen = self.key_lengths() if keylen is None else keylen
        new = np.ones(n, dtype=bool)
        if n > 1:
            differ = (self.rows[1:] != self.rows[:-1]) & (keylen[1:, None] > np.arange(self.rows.shape[1]))
            new[1:] = (keylen[1:] != keylen[:-1]) | differ.any(axis=1)
        starts = np.append(np.flatnonzero(new), n)
        # names that do not increase inside a sample may repeat an extension: group() decides
        if n > 1 and (~new[1:] & ~self.increasing()[1:]).any():
            offsets = (self.heads + BLOCK).tolist()
            _tar.group(_tar.Members(self.all_names(), offsets, self.sizes.tolist(), 0), self.source)
        return starts

    def sample_bounds(self, starts: np.ndarray) -> np.ndarray:
        """Byte bounds of the samples: sample i is ``buf[b[i]:b[i + 1]]``, headers included.

        As :func:`shardkit._tar.sample_spans`: a sample runs from the end of the one before
        (any pax header in front of its first member included) to its last member's padded end.
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
        CorruptShardError: as :func:`shardkit._tar.walk`.
    """
    layout = _plain(buf, source, checked)
    return layout if layout is not None else _careful(buf, source)


_USTAR = np.frombuffer(b"ustar", dtype=np.uint8)
_OCTAL_WEIGHTS = 8 ** np.arange(10, -1, -1, dtype=np.int64)


def _plain(buf: Buffer, source: str, checked: bool = False) -> Layout | None:
    """The vectorized index, or None when the archive is not plain (the careful walk decides).

    A pax header in front of a member (webdataset and Python's tarfile write one per member
    for a float mtime) is accepted when its records cannot change the member's name or size.
    """
    nblocks = len(buf) // BLOCK
    if nblocks == 0:
        return None
    blocks = np.frombuffer(buf, dtype=np.uint8, count=nblocks * BLOCK).reshape(nblocks, BLOCK)
    flags = blocks[:, 156]
    cand = np.flatnonzero((flags == _REGULAR) | (flags == _PAX))
    rows = np.take(blocks, cand, axis=0)
    digits = rows[:, 124:135].astype(np.int64) - ord("0")
    ok = ((digits >= 0) & (digits <= 7)).all(axis=1) & (rows[:, 257:262] == _USTAR).all(axis=1) & (rows[:, 345] == 0) & (rows[:, 0] != 0)
    sizes = digits @ _OCTAL_WEIGHTS
    chain, end = _follow(cand[ok], sizes[ok], nblocks)
    if end > nblocks or (end == nblocks and len(buf) % BLOCK) or not zeros_from(buf, end * BLOCK):
        return None  # truncated, a block that is not a plain header, or data after the end marker
    picked = np.flatnonzero(ok)[chain]
    headers = rows if len(picked) == len(rows) else rows[picked]
    pax = headers[:, 156] == _PAX
    if pax.any():
        if not _pax_harmless(buf, pax, cand[picked[pax]], sizes[picked[pax]]) or not _checksums_hold(headers[pax]):
            return None
        picked, headers = picked[~pax], headers[~pax]
    heads, sizes = cand[picked], sizes[picked]
    nul = headers[:, :NAME] == 0
    lengths = np.where(nul.any(axis=1), nul.argmax(axis=1), NAME)
    width = max(int(lengths.max(initial=0)), 1)
    names = np.where(lengths[:, None] > np.arange(width), headers[:, :width], 0).astype(np.uint8)
    if not _safe(names, lengths):
        return None
    if checked:
        canonical = np.zeros(len(heads), dtype=bool)
    else:
        canonical = _canonical_headers(headers, names, sizes)
        if not _checksums_hold(headers[~canonical]):
            return None  # the careful walk accepts the old signed form, or names the bad header
    return Layout(buf, source, heads * BLOCK, sizes, names, lengths, None, not pax.any(), canonical)


_REGULAR, _PAX = ord("0"), ord("x")


def _pax_harmless(buf: Buffer, pax: np.ndarray, blocks: np.ndarray, sizes: np.ndarray) -> bool:
    """Each pax header (``pax`` marks them on the chain) comes right before a member, its
    records (at ``blocks``) parse, and none sets ``path`` or ``size``."""
    if pax[-1] or (pax[:-1] & pax[1:]).any():
        return False
    starts = ((blocks + 1) * BLOCK).tolist()
    for start, size in zip(starts, sizes.tolist(), strict=True):
        data = bytes(buf[start : start + size])
        space = data.find(b" ")
        # the common case, one record ("30 mtime=1700000000.123456789\n"), checked without parsing
        if 0 < space < 8 and data[:space].isdigit() and int(data[:space]) == size and data.endswith(b"\n"):
            keyword = data[space + 1 : data.find(b"=")]
            if keyword in (b"path", b"size") or not keyword.isascii():
                return False
            continue
        try:
            records = _tar._parse_pax(data)
        except (ValueError, UnicodeDecodeError):
            return False  # the careful walk names it
        if "path" in records or "size" in records:
            return False
    return True


def _canonical_headers(headers: np.ndarray, names: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per member: its header is byte for byte the one shardkit writes (so its checksum holds)."""
    return _tar.canonical(headers, names, sizes) & (names < 128).all(axis=1)  # other names get a pax header


def _checksums_hold(headers: np.ndarray) -> bool:
    field = headers[:, 148:156].astype(np.int64)
    computed = headers.sum(axis=1, dtype=np.int64) - field.sum(axis=1) + 8 * ord(" ")
    return bool((_tar._octal_columns(field) == computed).all())


def _follow(cands: np.ndarray, sizes: np.ndarray, nblocks: int) -> tuple[np.ndarray, int]:
    """Candidates on the header chain from block 0, and the block where the chain stops.

    Sizes come from octal digits only (never negative), so each step moves at least one block.
    """
    nxt = cands + 1 + (sizes + BLOCK - 1) // BLOCK
    if not len(cands) or cands[0] != 0:
        return np.zeros(0, dtype=np.int64), 0
    if (nxt[:-1] == cands[1:]).all():
        return np.arange(len(cands)), int(nxt[-1])
    # data blocks that look like headers: walk the chain through a lookup
    where = dict(zip(cands.tolist(), range(len(cands)), strict=True))
    steps = nxt.tolist()
    chain: list[int] = []
    block = 0
    while block < nblocks and (c := where.get(block)) is not None:
        chain.append(c)
        block = steps[c]
    return np.asarray(chain, dtype=np.int64), block


def _safe(names: np.ndarray, lengths: np.ndarray) -> bool:
    """No name is empty, starts with '/' or has a '..' component (the walk's rule)."""
    if (lengths == 0).any() or (names[:, 0] == _SLASH).any():
        return False
    dotdot = (names[:, :-1] == _DOT) & (names[:, 1:] == _DOT)
    if not dotdot.any():
        return True
    bounded = np.pad(names, ((0, 0), (1, 1)), constant_values=_SLASH)  # name edges count as '/'
    cols = np.arange(names.shape[1] - 1)
    before = bounded[:, :-3] == _SLASH
    after = (bounded[:, 3:] == _SLASH) | (cols + 2 >= lengths[:, None])
    return not (dotdot & before & after).any()


def _careful(buf: Buffer, source: str) -> Layout:
    members = _tar.walk(buf, source)
    names = members.names
    heads = np.asarray(members.offsets, dtype=np.int64) - BLOCK
    sizes = np.asarray(members.sizes, dtype=np.int64)
    rows, lengths = _rows(names)
    padded = sizes + (-sizes % BLOCK)
    plain = bool(len(heads) == 0 or (heads[0] == 0 and (heads[1:] == heads[:-1] + BLOCK + padded[:-1]).all()))
    canonical = np.zeros(len(heads), dtype=bool)
    if plain and len(heads) and lengths.min() >= 0:
        blocks = np.frombuffer(buf, dtype=np.uint8, count=len(buf) // BLOCK * BLOCK).reshape(-1, BLOCK)
        canonical = _canonical_headers(blocks[heads // BLOCK], rows, sizes)
    return Layout(buf, source, heads, sizes, rows, lengths, names, plain, canonical)


def _rows(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Names as NUL-padded rows; a name over 100 bytes gets length -1 and a zero row."""
    encoded = [n.encode("utf-8", "surrogateescape") for n in names]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    fits = lengths <= NAME
    if not fits.all():
        encoded = [e if f else b"" for e, f in zip(encoded, fits.tolist(), strict=True)]
    width = max(int(lengths[fits].max(initial=0)), 1)
    blob = b"".join(e.ljust(width, b"\x00") for e in encoded)
    rows = np.frombuffer(blob, dtype=np.uint8).reshape(len(names), width).copy()
    return rows, np.where(fits, lengths, -1)
