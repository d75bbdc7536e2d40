"""Write tar members: fixed-metadata ustar headers (a pax header for long names), nothing else.

Every 512-byte header is built from constant pieces, so two runs over the same samples give
byte-identical archives: the same name and data always make the same bytes. :func:`headers`
makes the same headers for many members at once with numpy, and :func:`canonical` tells whether
a header read from a shard is already exactly the one this module would write.

Names are bytes in a tar. A name read from one with bytes that are not UTF-8 comes to Python
with each such byte as a surrogate escape (U+DC80..U+DCFF, as ``os.fsdecode``, ``tarfile`` and
webdataset give it); it is written back as those bytes, in a pax header marked
``hdrcharset=BINARY`` as ``tarfile`` writes one.

    blob = member("000017.jpg", jpeg_bytes)       # header, data, zero padding
    archive = b"".join([blob, TRAILER])
"""

from __future__ import annotations

import struct

import numpy as np

from shardkit.tar.scan import BLOCK

# two zero blocks end an archive; stream readers stop at the first pair they meet
TRAILER = bytes(2 * BLOCK)

_MODE_UID_GID = b"0000644\x000000000\x000000000\x00"
_MTIME = b"00000000000\x00"
_MAGIC = b"ustar\x0000"
_TAIL = bytes(32 + 32 + 8 + 8 + 155 + 12)
_LINKNAME = bytes(100)
MAX_OCTAL_SIZE = 8**11 - 1
# the bytes of a name that fit a ustar header; a longer one gets a pax header
NAME_BYTES = 100
# checksum of every constant byte, with the checksum field itself counted as eight spaces
_CONST_SUM = sum(_MODE_UID_GID) + sum(_MTIME) + 8 * 32 + sum(_MAGIC)
_PAX_NAME = b"././@PaxHeader"


def _header(name: bytes, size: int, typeflag: bytes) -> bytes:
    size_field = b"%011o\x00" % size
    chksum = _CONST_SUM + sum(name) + sum(size_field) + typeflag[0]
    return _LAYOUT.pack(name, _MODE_UID_GID, size_field, _MTIME, b"%06o\x00 " % chksum, typeflag, _AFTER_TYPEFLAG)


_AFTER_TYPEFLAG = _LINKNAME + _MAGIC + _TAIL
# name (NUL-padded to 100 bytes; callers keep it within), mode/uid/gid, size, mtime, checksum,
# typeflag, the rest: one pack, twice as fast as joining the pieces (it runs twice a sample)
_LAYOUT = struct.Struct(f"100s{len(_MODE_UID_GID)}s12s{len(_MTIME)}s8s1s{len(_AFTER_TYPEFLAG)}s")
# zero padding by length, shared instead of allocated for every member
_PADDING = [bytes(n) for n in range(BLOCK)]


def _padding(size: int) -> bytes:
    return _PADDING[-size % BLOCK]


def _pax_record(keyword: str, value: str | bytes) -> bytes:
    raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    body = b" %s=%s\n" % (keyword.encode(), raw)
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return str(length).encode() + body


def member(name: str, data: bytes | bytearray | memoryview) -> bytes:
    """Return one regular-file member: header, data and padding to the 512-byte boundary.

    Names that do not fit ustar's 100 ASCII bytes, and data past 8 GiB, get a pax header first.

    Raises:
        UnicodeEncodeError: ``name`` holds a surrogate that is not an escaped byte (callers
            check names first: :func:`shardkit.piles.encode.check_key`).
    """
    return b"".join(member_parts(name, data))


def member_parts(name: str, data: bytes | bytearray | memoryview) -> tuple[bytes | bytearray | memoryview, ...]:
    """The pieces of :func:`member` in order, for a caller that joins many members at once."""
    size = len(data)
    if name.isascii() and len(name) <= NAME_BYTES and size <= MAX_OCTAL_SIZE:
        return _header(name.encode("ascii"), size, b"0"), data, _PADDING[-size % BLOCK]
    raw = name.encode("utf-8", "surrogateescape")
    records = b""
    if not name.isascii() and not _is_utf8(raw):
        records += _pax_record("hdrcharset", b"BINARY")  # first, as tarfile writes it
    records += _pax_record("path", raw)
    if size > MAX_OCTAL_SIZE:
        records += _pax_record("size", str(size))
    short = raw[:100].decode("utf-8", "ignore").encode("ascii", "replace")
    return (
        _header(_PAX_NAME, len(records), b"x"),
        records,
        _padding(len(records)),
        _header(short, min(size, MAX_OCTAL_SIZE), b"0"),
        data,
        _padding(size),
    )


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


_BLANK = np.frombuffer(_header(b"", 0, b"0"), dtype=np.uint8)
_SIZE_SHIFTS = np.arange(30, -1, -3, dtype=np.int64)  # the eleven octal digits, most significant first
_TYPEFLAG = 156  # where the typeflag is: every field before it but name, size and checksum is constant


def headers(names: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The headers :func:`member` writes, for many members at once: an (n, 512) uint8 array.

    ``names`` is (n, w) uint8 with w <= 100: each ASCII name NUL-padded, as the header stores
    it; ``sizes`` are below 8 GiB. Row i equals the first 512 bytes of ``member(name_i, data_i)``.
    """
    out = np.broadcast_to(_BLANK, (len(sizes), BLOCK)).copy()
    _fill(out, names, sizes)
    return out


# the bytes of a header from its typeflag on, the same in every header :func:`headers` makes:
# a writer that joins many members puts this one object after each of :func:`header_starts`' rows
HEADER_TAIL = bytes(_BLANK[_TYPEFLAG:])


def header_starts(names: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The first :data:`_TYPEFLAG` bytes of each of :func:`headers`' rows (name to checksum), an
    (n, 156) uint8 array: followed by :data:`HEADER_TAIL`, a row is the whole header. A third of
    the bytes to make, for a writer that would otherwise copy the constant rest n times."""
    out = np.broadcast_to(_BLANK[:_TYPEFLAG], (len(sizes), _TYPEFLAG)).copy()
    _fill(out, names, sizes)
    return out


def _fill(out: np.ndarray, names: np.ndarray, sizes: np.ndarray) -> None:
    """Write the name, size and checksum fields of ``out``'s blank headers."""
    out[:, : names.shape[1]] = names
    digits = ((np.asarray(sizes, dtype=np.int64)[:, None] >> _SIZE_SHIFTS) & 7) + 48
    out[:, 124:135] = digits
    chksum = _CONST_SUM + ord("0") + names.sum(axis=1, dtype=np.int64) + digits.sum(axis=1)
    out[:, 148:154] = ((chksum[:, None] >> np.arange(15, -1, -3, dtype=np.int64)) & 7) + 48


def canonical(blocks: np.ndarray, names: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per row of ``blocks`` (n, 512): is it exactly the header :func:`headers` makes from
    ``names`` (n, w) and ``sizes``?"""
    # one pass over 64-bit words beats checking the fields one by one (measured)
    expected = headers(names, sizes).view("<u8")
    return (np.ascontiguousarray(blocks).view("<u8") == expected).all(axis=1)
