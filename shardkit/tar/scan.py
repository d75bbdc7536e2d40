"""Find the chain of headers of an in-memory tar with numpy, check it, and read its names.

Most shards are a chain of plain ustar headers: shardkit writes one per member for short ASCII
names, webdataset and Python's tarfile put a pax header (for a float mtime) in front of each, and
``tar cf`` of a directory adds an entry for each directory, which is skipped (as webdataset
does). Every 512-byte block that can be such a header is checked at once (typeflag, magic, octal
size, a name without prefix); then the chain is followed from block 0, so data that happens to
look like a header is never taken for one. The members' names must be safe, their checksums hold,
a directory entry holds no data and a pax header may not change a member's name or size.
Anything else (long or prefixed names, GNU headers, links, damage) gives None: the
member-by-member walk in :mod:`shardkit.tar.walk` decides, and names the error.

    chain = scan(buf)
    if chain is not None:
        names = chain.names()   # member i: header at chain.heads[i], chain.sizes[i] bytes of data
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from shardkit.storage import Buffer

BLOCK = 512
NAME = 100  # bytes of a ustar name field
_REGULAR, _PAX, _DIRECTORY = ord("0"), ord("x"), ord("5")
_SLASH, _DOT = ord("/"), ord(".")
_U64 = np.uint64
_USTAR = _U64(int.from_bytes(b"ustar", "little"))
# header bytes as little-endian words: 124..127 and 128..134 hold the size's eleven digits
_SIZE_HIGH, _SIZE_LOW = _U64(0xF8F8F8F800000000), _U64(0x00F8F8F8F8F8F8F8)
_DIGITS_HIGH, _DIGITS_LOW = _U64(0x3030303000000000), _U64(0x0030303030303030)
_WEIGHTS = 8.0 ** np.arange(11, -1, -1)  # float64 is exact up to 2**53: twelve octal digits fit
_ONES = np.ones(8)  # a matrix product sums short rows faster than a reduction (measured)


@dataclass(frozen=True, slots=True, eq=False)
class Chain:
    """The regular-file members of an archive of plain headers.

    Attributes:
        heads: byte offset of each member's ustar header; its data starts 512 bytes later.
        sizes: data size of each member.
        rows: (n, w) uint8, each name zero-padded to w <= 100 bytes (one more than the longest
            name when it fits), nothing after a name's end.
        lengths: name length in bytes.
        end: offset of the end-of-archive marker (or of the end of the data when there is none).
        gaps: a pax header or a directory entry stands between members (so they are not back to
            back).
    """

    heads: np.ndarray
    sizes: np.ndarray
    rows: np.ndarray
    lengths: np.ndarray
    end: int
    gaps: bool

    def names(self) -> list[str]:
        """The member names (UTF-8, undecodable bytes kept as surrogates, as the walk reads them)."""
        return split_rows(self.rows, self.lengths)


def blocks_of(buf: Buffer | memoryview) -> np.ndarray:
    """The whole 512-byte blocks of ``buf`` as an (n, 512) uint8 view."""
    return np.frombuffer(buf, dtype=np.uint8, count=len(buf) // BLOCK * BLOCK).reshape(-1, BLOCK)


def split_rows(rows: np.ndarray, lengths: np.ndarray) -> list[str]:
    """Zero-padded rows of UTF-8 text as str (undecodable bytes kept as surrogates);
    ``lengths`` says where each row's text ends."""
    if not len(rows) or lengths.min() <= 0:
        return [bytes(row[:n]).decode("utf-8", "surrogateescape") for row, n in zip(rows, lengths.tolist(), strict=True)]
    if lengths.max() >= rows.shape[1]:  # a full row: add the zero column that separates them
        padded = np.zeros((len(rows), rows.shape[1] + 1), dtype=np.uint8)
        padded[:, :-1] = rows
        rows = padded
    # one decode and one split in C; the padding between rows gives empty pieces
    return list(filter(None, rows.tobytes().decode("utf-8", "surrogateescape").split("\0")))


def scan(buf: Buffer, *, checksums: bool = True) -> Chain | None:
    """The :class:`Chain` of ``buf``, or None when it is not an archive of plain headers.

    ``checksums``: verify every member header's checksum. Pass False when the bytes matched a
    checksum of the whole file, or when the caller checks the headers itself (pax headers and
    directory entries are always checked).
    """
    blocks = blocks_of(buf)
    nblocks = len(blocks)
    if nblocks == 0:
        return None
    flags = blocks[:, 156].copy()  # one strided pass over the file; the rest is contiguous
    cand = np.flatnonzero((flags == _REGULAR) | (flags == _PAX) | (flags == _DIRECTORY))
    # whole blocks: gathering scattered headers costs cache misses, not bytes (measured)
    rows = np.take(blocks, cand, axis=0)
    ok = np.flatnonzero(_plausible(rows))
    sizes = octal(np.take(rows[:, 124:135], ok, axis=0))
    chain, end = _follow(cand[ok], sizes, nblocks)
    if end > nblocks or (end == nblocks and len(buf) % BLOCK) or not zeros_from(buf, end * BLOCK):
        return None  # truncated, a block that is not a plain header, or data after the end marker
    at = ok[chain]
    heads, sizes = cand[at] * BLOCK, sizes[chain]
    pax = flags[cand[at]] == _PAX
    if pax.any():
        if not _pax_harmless(buf, pax, heads[pax], sizes[pax]) or len(bad_checksums(rows, at[pax])):
            return None
        at, heads, sizes = at[~pax], heads[~pax], sizes[~pax]
    folder = flags[cand[at]] == _DIRECTORY
    if folder.any():  # skipped, as webdataset skips them, once their headers are checked
        if sizes[folder].any() or len(bad_checksums(rows, at[folder])):
            return None  # the walk names the entry
        at, heads, sizes = at[~folder], heads[~folder], sizes[~folder]
    if checksums and len(bad_checksums(rows, at)):
        return None  # the walk names the header
    named = _names(rows, at)
    if named is None:
        return None
    return Chain(heads, sizes, *named, end * BLOCK, bool(pax.any() or folder.any()))


def _plausible(rows: np.ndarray) -> np.ndarray:
    """Per candidate block: ustar magic, eleven octal size digits ended by NUL or space, no
    prefix, a name."""
    words = rows.view("<u8")
    ok = ((words[:, 32] >> _U64(8)) & _U64(0xFF_FFFF_FFFF)) == _USTAR  # bytes 257..261
    ok &= (words[:, 43] & _U64(0xFF00)) == 0  # byte 345: the first byte of the name prefix
    ok &= (words[:, 0] & _U64(0xFF)) != 0
    ok &= (words[:, 15] & _SIZE_HIGH) == _DIGITS_HIGH
    ok &= (words[:, 16] & _SIZE_LOW) == _DIGITS_LOW
    end = words[:, 16] >> _U64(56)  # byte 135 ends the size field; 12 digits go to the walk
    ok &= (end == 0) | (end == 32)
    return ok


def _names(blocks: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Name rows and lengths of the headers ``blocks[at]`` (up to the first NUL, as the walk
    reads them); None if a name is unsafe."""
    nul = blocks[:, :NAME] == 0
    lengths = nul.argmax(axis=1)[at]
    long = np.flatnonzero(blocks[at, NAME - 1])  # a name reaching the last byte may have no NUL
    lengths[long[~nul[at[long], lengths[long]]]] = NAME
    width = min(int(lengths.max(initial=0)) + 1, NAME)
    rows = blocks[at, :width]
    if np.count_nonzero(rows) != int(lengths.sum()):  # bytes after a name's NUL: not part of it
        rows = np.where(lengths[:, None] > np.arange(width), rows, 0).astype(np.uint8)
    return (rows, lengths) if _safe(rows, lengths) else None


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


def _safe(rows: np.ndarray, lengths: np.ndarray) -> bool:
    """No name is empty, starts with '/' or has a '..' component (the walk's rule)."""
    if (lengths == 0).any() or (rows[:, 0] == _SLASH).any():
        return False
    flat = rows.ravel()  # one pass; a '..' across two rows only sends it to the exact check
    if not ((flat[:-1] == _DOT) & (flat[1:] == _DOT)).any():
        return True
    dotdot = (rows[:, :-1] == _DOT) & (rows[:, 1:] == _DOT)
    bounded = np.pad(rows, ((0, 0), (1, 1)), constant_values=_SLASH)  # name edges count as '/'
    cols = np.arange(rows.shape[1] - 1)
    before = bounded[:, :-3] == _SLASH
    after = (bounded[:, 3:] == _SLASH) | (cols + 2 >= lengths[:, None])
    return not (dotdot & before & after).any()


def octal(field: np.ndarray) -> np.ndarray:
    """The values of (n, k) octal text fields: the first run of digits (what comes before it,
    spaces in practice, and after it, NUL or spaces, is skipped); -1 where there is none."""
    field = np.ascontiguousarray(field)  # short rows: one copy, then every step runs flat
    digit = (field & 0xF8) == 0x30
    whole = bool(digit.all())
    count = field.shape[1] if whole else int(digit[0].argmin())
    if whole or (count and not digit[:, count].any() and all(digit[:, j].all() for j in range(count))):
        # the common forms: every field is ``count`` digits, then a NUL or a space
        return (field[:, :count] @ _WEIGHTS[-count:] - 48 * _WEIGHTS[-count:].sum()).astype(np.int64)
    value = np.zeros(len(field), dtype=np.int64)
    started = np.zeros(len(field), dtype=bool)
    done = np.zeros(len(field), dtype=bool)
    for col in range(field.shape[1]):
        is_digit = digit[:, col] & ~done
        value = np.where(is_digit, value * 8 + (field[:, col] & 7), value)
        started |= is_digit
        done |= started & ~digit[:, col]
    return np.where(started, value, -1)


def bad_checksums(blocks: np.ndarray, at: np.ndarray | None = None) -> np.ndarray:
    """Which of the (n, 512) header ``blocks`` (or of ``blocks[at]``: indices into ``at``) fail
    their checksum: the field is neither the unsigned sum of the header's bytes (the field counted
    as spaces) nor the signed sum some old writers made."""
    stored, computed = checksums(blocks, at)
    bad = np.flatnonzero(stored != computed)
    if len(bad):  # rare: try the signed form on those only
        signed = (blocks[bad] if at is None else blocks[at[bad]]).view(np.int8)
        alt = signed.sum(axis=1, dtype=np.int64) - signed[:, 148:156].sum(axis=1, dtype=np.int64) + 8 * 32
        bad = bad[alt != stored[bad]]
    return bad


def checksums(blocks: np.ndarray, at: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The checksum each of the (n, 512) header ``blocks`` (or ``blocks[at]``) stores (-1: not
    a number), and the unsigned one its bytes give. Every row is summed: pass ``at`` only when
    it picks most of them."""
    total = np.add.reduce(blocks, axis=1, dtype=np.uint32)  # all rows: cheaper than copying some
    field = np.ascontiguousarray(blocks[:, 148:156] if at is None else blocks[at, 148:156])
    if at is not None:
        total = total[at]
    return octal(field), total.astype(np.int64) - (field @ _ONES).astype(np.int64) + 8 * 32


def zeros_from(buf: Buffer, offset: int) -> bool:
    """Whether every byte of ``buf`` from ``offset`` on is zero (true past the end)."""
    if offset >= len(buf):
        return True
    return not np.frombuffer(buf, dtype=np.uint8, offset=offset).any()


def _pax_harmless(buf: Buffer, pax: np.ndarray, heads: np.ndarray, sizes: np.ndarray) -> bool:
    """Each pax header (``pax`` marks them on the chain) comes right before a member, its
    records (after the headers at ``heads``) parse, and none sets ``path`` or ``size``."""
    if pax[-1] or (pax[:-1] & pax[1:]).any():
        return False
    unsure = ~_one_record(blocks_of(buf), heads // BLOCK + 1, sizes)
    for start, size in zip((heads[unsure] + BLOCK).tolist(), sizes[unsure].tolist(), strict=True):
        try:
            records = parse_pax(bytes(buf[start : start + size]))
        except (ValueError, UnicodeDecodeError):
            return False  # the walk names it
        if "path" in records or "size" in records:
            return False
    return True


_RECORD = 64  # bytes of a pax header's data looked at with numpy
_PATH, _SIZE = (np.frombuffer(word, dtype=np.uint8) for word in (b"path", b"size"))


def _one_record(blocks: np.ndarray, at: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per pax data block ``blocks[at]``: it certainly holds one ASCII record that sets neither
    path nor size, like the ``28 mtime=1795338852.4349883`` webdataset writes (False: not sure)."""
    data = blocks[at, :_RECORD]
    rows = np.arange(len(at))
    two = sizes >= 10  # the record's length field: the data size in one or two digits
    sure = (sizes > 0) & (sizes <= _RECORD) & (data < 128).all(axis=1)
    sure &= data[rows, np.clip(sizes - 1, 0, _RECORD - 1)] == ord("\n")
    sure &= data[:, 0] == np.where(two, sizes // 10, sizes) + ord("0")
    sure &= np.where(two, (data[:, 1] == sizes % 10 + ord("0")) & (data[:, 2] == ord(" ")), data[:, 1] == ord(" "))
    keyword = np.take_along_axis(data, np.where(two, 3, 2)[:, None] + np.arange(4), axis=1)
    return sure & ~(keyword == _PATH).all(axis=1) & ~(keyword == _SIZE).all(axis=1)


def parse_pax(data: bytes) -> dict[str, str]:
    """The records of a pax extended header; ValueError or UnicodeDecodeError when malformed."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.index(b" ", pos)
        digits = data[pos:space]
        length = int(digits) if digits.isdigit() and len(digits) < 20 else 0
        if length < len(digits) + 2 or pos + length > len(data) or data[pos + length - 1] != 10:
            raise ValueError("bad pax record length")  # each record: "LEN KEYWORD=VALUE\n"
        keyword, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        records[keyword.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records
