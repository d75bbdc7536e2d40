"""Walk the members of an in-memory tar one header at a time: every kind of member, every error named.

Archives of plain ustar headers (what shardkit, GNU tar and webdataset write for short names)
take the vectorized :func:`shardkit.tar.scan.scan` instead; this walk handles the rest (pax and
GNU long names, prefixes, old formats) and is the one that says exactly what is wrong and where.
Python's ``tarfile`` costs tens of microseconds a member, this a few; header checksums are
verified for all members at once with numpy.

    members = walk(buf, "shard-000003.tar")
    members.names[0], members.offsets[0], members.sizes[0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from shardkit.errors import CorruptShardError
from shardkit.tar.scan import BLOCK, bad_checksums, blocks_of, checksums, parse_pax, scan, zeros_from

if TYPE_CHECKING:
    from shardkit.storage import Buffer


@dataclass(frozen=True, slots=True)
class Members:
    """The regular-file members of an in-memory tar, as parallel lists (directory entries,
    which ``tar cf`` adds and webdataset skips, are left out).

    ``names[i]`` is stored at ``buf[offsets[i] : offsets[i] + sizes[i]]``; ``end`` is the offset
    of the end-of-archive trailer (or of the end of the data when the trailer is missing).
    """

    names: list[str]
    offsets: list[int]
    sizes: list[int]
    end: int


def _fail(source: str, index: int, name: str | None, offset: int, what: str) -> CorruptShardError:
    where = f"member {index}" + (f" ({name!r})" if name else "")
    if offset == 0 and name is None:  # the very first header does not parse: most likely not a tar file at all
        what += "; expected a tar header at the start of the file: is it a tar archive? (a WebDataset shard is one)"
    return CorruptShardError(f"{source}: {where} at offset {offset}: {what}")


def _parse_octal(field: bytes) -> int:
    """A size field: octal digits (spaces around, NUL-ended) or GNU base-256; ValueError if not.

    ``int(text, 8)`` alone would take a sign: a size of ``-1000`` sends a walk backwards forever.
    """
    if field[:1] == b"\x80":  # GNU base-256 for huge sizes; 0xff starts a negative one
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\x00", 1)[0].strip(b" ")
    if text.translate(None, b"01234567") or field[:1] == b"\xff":
        raise ValueError(f"not an unsigned octal number: {bytes(field)!r}")
    return int(text, 8) if text else 0


def _check_name(source: str, index: int, name: str, offset: int) -> None:
    if not name or name.startswith("/") or ".." in name.split("/") or "\x00" in name:
        raise _fail(source, index, name, offset, "unsafe member name (empty, leading '/', '..' or a NUL)")


def walk(buf: Buffer, source: str) -> Members:
    """Index every regular-file member of the tar archive held in ``buf``.

    Archives of plain ustar members (what shardkit, GNU tar and webdataset write for short
    names) take a vectorized path; anything else, and every error, goes member by member.

    Raises:
        CorruptShardError: a truncated archive, a header that fails its checksum, a size that
            runs past the end, an unsafe name, a member that is neither a regular file nor a
            directory (links, devices, fifos), or a directory entry that holds data.
    """
    fast = _walk_plain(buf)
    return fast if fast is not None else _walk_members(buf, source)


def _walk_plain(buf: Buffer) -> Members | None:
    """The members of an archive of plain headers, found with numpy (see :mod:`shardkit.tar.scan`)."""
    chain = scan(buf)
    if chain is None:
        return None
    return Members(chain.names(), (chain.heads + BLOCK).tolist(), chain.sizes.tolist(), chain.end)


def _walk_members(buf: Buffer, source: str) -> Members:
    """Walk header by header: every kind of member, and the precise error for a bad one."""
    names: list[str] = []
    offsets: list[int] = []
    sizes: list[int] = []
    headers: list[int] = []
    total = len(buf)
    pos = 0
    zero = bytes(BLOCK)
    while True:
        if pos + BLOCK > total:
            if pos == total:
                break  # no trailer: tolerated, the last member was complete
            raise _fail(source, len(names), None, pos, "archive is truncated inside a header")
        typeflag = buf[pos + 156]
        if typeflag == 48 or (typeflag == 0 and buf[pos : pos + BLOCK] != zero):  # b"0" or old-style regular
            # the hot path: a plain ustar regular member
            field = buf[pos + 124 : pos + 135]
            try:
                # int() would also take a sign, spaces and underscores; a 12th digit is legal
                if not field.isdigit() or buf[pos + 135] not in (0, 32):
                    raise ValueError
                size = int(field, 8)
            except ValueError:
                size = _size_field(buf, pos, source, len(names))
            raw = buf[pos : pos + 100]
            if raw[99]:
                name = _ustar_name(buf, pos)
            else:
                name = raw[: raw.index(0)].decode("utf-8", "surrogateescape")
                if buf[pos + 345] and buf[pos + 257 : pos + 262] == b"ustar":
                    name = _ustar_name(buf, pos)
        elif typeflag == 0:
            _check_end(buf, pos, source)
            break
        else:
            pos = _special(buf, pos, source, names, offsets, sizes, headers)
            continue
        headers.append(pos)
        start = pos + BLOCK
        pos = start + size + (-size % BLOCK)
        if typeflag == 0 and name[-1:] == "/":  # an old-style directory entry (as tarfile reads it)
            _check_directory(source, len(names), name, start - BLOCK, size)
            continue
        if size < 0:  # sizes are checked unsigned; this keeps every step of the walk forward
            raise _fail(source, len(names), name, start - BLOCK, f"negative size {size}")
        if start + size > total:
            raise _fail(source, len(names), name, start - BLOCK, f"data of {size} bytes runs past the end of the file ({total} bytes)")
        if not name or name[0] == "/" or (".." in name and ".." in name.split("/")):
            _check_name(source, len(names), name, start - BLOCK)
        names.append(name)
        offsets.append(start)
        sizes.append(size)
    _verify_checksums(buf, headers, source)
    return Members(names, offsets, sizes, pos)


def _size_field(buf: Buffer, pos: int, source: str, index: int) -> int:
    field = buf[pos + 124 : pos + 136]
    try:
        return _parse_octal(field)
    except ValueError:
        raise _fail(source, index, None, pos, f"size field {bytes(field)!r} is not an unsigned octal number") from None


def _pax_size(value: str, source: str, index: int, name: str | None, pos: int) -> int:
    if not (value.isascii() and value.isdigit()) or len(value) > 20:
        raise _fail(source, index, name, pos, f"pax size record {value[:40]!r} is not an unsigned decimal number below 10**20")
    return int(value)


def _check_end(buf: Buffer, end: int, source: str) -> None:
    """Only zeros may follow the end-of-archive marker (GNU tar pads to 10240 bytes)."""
    if not zeros_from(buf, end):
        raise CorruptShardError(
            f"{source}: data follows the end-of-archive marker at offset {end}: a concatenated tar? strip each part's trailer"
        )


def _special(buf: Buffer, pos: int, source: str, names: list[str], offsets: list[int], sizes: list[int], headers: list[int]) -> int:
    """Handle the members off the hot path: pax and GNU long names, links, devices...

    Consumes the extended header(s) and the member they describe; returns the next position.
    """
    total = len(buf)
    pending: dict[str, str] = {}
    longname: str | None = None
    while True:
        if pos + BLOCK > total:
            raise _fail(source, len(names), None, pos, "archive is truncated inside a header")
        typeflag = buf[pos + 156 : pos + 157]
        headers.append(pos)
        size = _size_field(buf, pos, source, len(names))
        start = pos + BLOCK
        if "size" in pending and typeflag in (b"0", b"\x00", b"7"):
            size = _pax_size(pending["size"], source, len(names), pending.get("path") or longname, pos)
        if start + size > total:
            raise _fail(
                source,
                len(names),
                pending.get("path") or longname,
                pos,
                f"data of {size} bytes runs past the end of the file ({total} bytes)",
            )
        nxt = start + size + (-size % BLOCK)
        if nxt <= pos:  # cannot happen with unsigned sizes; a walk must never step back
            raise _fail(source, len(names), None, pos, f"negative size {size}")
        if typeflag == b"x":
            try:
                pending = parse_pax(buf[start : start + size])
            except (ValueError, UnicodeDecodeError):
                raise _fail(source, len(names), None, pos, "malformed pax header") from None
        elif typeflag == b"L":
            longname = buf[start : start + size].rstrip(b"\x00").decode("utf-8", "surrogateescape")
        elif typeflag in (b"g", b"K"):
            if not pending and longname is None:
                return nxt  # global pax headers and GNU long link names carry nothing a sample needs
        elif typeflag == b"5":
            _check_directory(source, len(names), pending.get("path") or longname or _ustar_name(buf, pos), pos, size)
            return nxt
        elif typeflag in (b"0", b"\x00", b"7"):
            name = pending.get("path") or longname or _ustar_name(buf, pos)
            _check_name(source, len(names), name, pos)
            names.append(name)
            offsets.append(start)
            sizes.append(size)
            return nxt
        else:
            kinds = {b"1": "hard link", b"2": "symlink", b"3": "character device", b"4": "block device", b"6": "fifo"}
            name = pending.get("path") or longname or _ustar_name(buf, pos)
            kind = kinds.get(typeflag, f"type {typeflag!r}")
            raise _fail(source, len(names), name, pos, f"expected a regular file, found a {kind}")
        pos = nxt


def _check_directory(source: str, index: int, name: str, pos: int, size: int) -> None:
    """A directory entry is skipped (it holds no sample); one with data is not a directory."""
    if size:
        raise _fail(source, index, name, pos, f"a directory entry holds {size} bytes of data: expected none")


def _ustar_name(buf: Buffer, pos: int) -> str:
    name = buf[pos : pos + 100].split(b"\x00", 1)[0]
    if not name:
        return ""
    if buf[pos + 257 : pos + 262] == b"ustar":
        prefix = buf[pos + 345 : pos + 500].split(b"\x00", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def _verify_checksums(buf: Buffer, headers: list[int], source: str, chunk: int = 4096) -> None:
    """Check every header's checksum, vectorized over ``chunk`` headers at a time."""
    blocks = blocks_of(buf)
    for lo in range(0, len(headers), chunk):
        starts = np.asarray(headers[lo : lo + chunk], dtype=np.int64)
        block = np.take(blocks, starts // BLOCK, axis=0)  # headers start on block boundaries
        bad = bad_checksums(block)
        if len(bad):
            i = int(bad[0])
            stored, computed = checksums(block[i : i + 1])
            raise _fail(source, lo + i, None, int(starts[i]), f"header checksum is {int(stored[0])}, expected {int(computed[0])}")
