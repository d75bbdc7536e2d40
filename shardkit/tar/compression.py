"""Whole-shard compression: the codecs (zstd, gzip, lz4), their file suffixes and magic bytes, a
streaming compressor, and decompression whose every failure names the shard.

A compressed shard is one tar compressed whole (``pile-000000.tar.zst``, ``.tar.gz``,
``.tar.lz4``), never member by member, so ``tar --zstd``, ``tar -z``, ``lz4 -d``, Python's
``tarfile`` and webdataset read it as they read any compressed tar (webdataset knows gzip only). zstd writes independent frames of a fixed size with a seek table
(:mod:`shardkit.tar.zstd_frames`), so a reader decompresses a pile on several threads; the bytes
depend only on the tar and the level, not on the machine or its threads, so piles stay
byte-identical whatever wrote them. Every zstd frame carries its content size and a checksum.
Older piles (one frame, no table) and other tools' files are read as a stream. gzip goes
through zlib-ng, which is faster than the standard zlib. lz4 writes one LZ4 frame of independent
4 MiB blocks with a content checksum: it compresses less than zstd but decompresses several times
faster, which is what a loader that decompresses beside a training loop needs on few cores.

    packer = Compressor("zstd", level=3)
    data = packer.compress(tar) + packer.finish()
    assert decompress(data, "zstd", "x.tar.zst", size=len(tar)) == tar
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shardkit._util import check_int, crc32, shown
from shardkit.errors import ConfigError, CorruptShardError
from shardkit.tar import lz4_blocks, zstd_frames

if TYPE_CHECKING:
    from shardkit.storage.scratch import Scratch

# the codecs, in the order they are offered; None (no compression) is the default everywhere
CODECS = ("zstd", "gzip", "lz4")
SUFFIX = {"zstd": ".zst", "gzip": ".gz", "lz4": ".lz4"}
# other endings a shard compressed with the codec may have (read, never written)
_READ_SUFFIXES = {"zstd": (".tar.zst", ".tzst", ".zst"), "gzip": (".tar.gz", ".tgz", ".gz"), "lz4": (".tar.lz4", ".lz4")}
# the names of tar shards, plain or compressed, that readers and listings recognise
SHARD_SUFFIXES = (".tar", *(ending for endings in _READ_SUFFIXES.values() for ending in endings if ending.startswith((".tar", ".t"))))
# what a written shard's name may end with after ``.tar``, as a regular expression: one of :data:`SUFFIX`'s
SUFFIX_PATTERN = "(?:" + "|".join(ending.replace(".", r"\.") for ending in SUFFIX.values()) + ")"
MAGIC = {"zstd": b"\x28\xb5\x2f\xfd", "gzip": b"\x1f\x8b", "lz4": b"\x04\x22\x4d\x18"}
# the levels each codec takes, and the default (chosen by benchmarks/compression.py: see BENCHMARKS.md)
# (lz4: 0-2 are its fast mode, 3-16 its high-compression mode, which writes slower and reads as fast)
LEVELS = {"zstd": (1, 22), "gzip": (1, 9), "lz4": (0, 16)}
DEFAULT_LEVEL = {"zstd": 3, "gzip": 6, "lz4": 0}
# lz4's frame: blocks of 4 MiB that do not refer to each other, and a checksum of the whole content
_LZ4_FRAME = {"block_size": 7, "block_linked": False, "content_checksum": True}
# compressed bytes a stream is read by: past the manifest's size, what one piece decompresses to is all that is read
_PIECE = 1 << 20


def check_compression(value: Any, *, name: str = "compression") -> str | None:
    """``value`` if it is a codec name or None; else a ConfigError listing the choices."""
    if value is None or (isinstance(value, str) and value in CODECS):
        return value
    choices = ", ".join(repr(c) for c in CODECS)
    raise ConfigError(f"{name}: expected one of {choices} or None (no compression), got {shown(value)}")


def check_level(codec: str | None, level: Any) -> int | None:
    """The level ``codec`` compresses at: ``level`` checked against the codec's range, or its default.

    Raises:
        ConfigError: a level without a codec, or one outside the codec's range.
    """
    if codec is None:
        if level is not None:
            raise ConfigError(f"compression_level: only used with a compression ({', '.join(CODECS)}), got {shown(level)}")
        return None
    if level is None:
        return DEFAULT_LEVEL[codec]
    low, high = LEVELS[codec]
    return check_int("compression_level", level, low=low, high=high)


def suffix(codec: str | None) -> str:
    """What a compressed tar's name ends with after ``.tar``: ``.zst``, ``.gz`` or nothing."""
    return SUFFIX[codec] if codec is not None else ""


def from_name(name: str) -> str | None:
    """The codec a shard's file name says it is compressed with (``a.tar.zst``: zstd), or None."""
    lowered = name.lower()
    for codec, endings in _READ_SUFFIXES.items():
        if lowered.endswith(endings):
            return codec
    return None


def sniff(buf: Any) -> str | None:
    """The codec whose magic bytes ``buf`` starts with, or None (a plain tar, or neither)."""
    head = bytes(buf[:4])
    for codec, magic in MAGIC.items():
        if head.startswith(magic):
            return codec
    return None


class Compressor:
    """Compress one stream (a whole tar) with ``codec``, chunk by chunk.

    The codec is fed in pieces of :data:`zstd_frames.PIECE` bytes at most, cut at fixed offsets
    of the stream: each call into it is short, and the bytes written do not depend on how the
    caller cut the stream into chunks (gzip's would).

    Args:
        codec: ``"zstd"``, ``"gzip"`` or ``"lz4"``.
        level: the codec's level (see :func:`check_level`).
        between: called before each piece is compressed; what it raises stops the compressor
            there (a job told to stop).

    Example:
        packer = Compressor("gzip", level=6)
        out = b"".join(packer.compress(chunk) for chunk in chunks) + packer.finish()
    """

    def __init__(self, codec: str, *, level: int, between: Callable[[], None] | None = None) -> None:
        self.codec = codec
        self._between = between
        self._pending = bytearray()  # gzip and lz4: the stream's bytes since the last whole piece
        if codec == "zstd":
            self._stream: Any = zstd_frames.FrameWriter(level=level, between=between)
        elif codec == "gzip":
            from zlib_ng import zlib_ng

            # wbits 31: a gzip member (header and CRC trailer), with mtime 0, so output is reproducible
            self._stream = zlib_ng.compressobj(level, zlib_ng.DEFLATED, 31)
        elif codec == "lz4":
            self._stream = _Lz4Writer(level)
        else:
            check_compression(codec)

    def compress(self, data: Any) -> bytes:
        """The compressed bytes ready after ``data`` (often none: codecs buffer)."""
        if self.codec == "zstd":  # its frames are cut into pieces already
            return self._stream.compress(data)
        view = memoryview(data).cast("B")
        out = []
        if self._pending:
            take = _PIECE_IN - len(self._pending)
            self._pending += view[:take]
            view = view[take:]
            if len(self._pending) == _PIECE_IN:
                out.append(self._piece(self._pending))
                self._pending = bytearray()
        while len(view) >= _PIECE_IN:
            out.append(self._piece(view[:_PIECE_IN]))
            view = view[_PIECE_IN:]
        self._pending += view
        return b"".join(out)

    def finish(self) -> bytes:
        """The rest of the compressed stream, its end included. Call once, last."""
        if self.codec == "zstd":
            return self._stream.finish()
        last = self._piece(self._pending) if self._pending else b""
        self._pending = bytearray()
        return last + (self._stream.flush() if self.codec == "gzip" else self._stream.finish())

    def _piece(self, piece: Any) -> bytes:
        if self._between is not None:
            self._between()
        return self._stream.compress(piece)


# input bytes one call into gzip or lz4 takes (see zstd_frames.PIECE)
_PIECE_IN = zstd_frames.PIECE


def compress(data: Any, codec: str, *, level: int, between: Callable[[], None] | None = None) -> bytes:
    """``data`` compressed whole with ``codec`` (see :class:`Compressor`)."""
    packer = Compressor(codec, level=level, between=between)
    return packer.compress(data) + packer.finish()


def decompress(
    buf: Any,
    codec: str,
    url: str,
    *,
    size: int | None = None,
    threads: int | None = None,
    checked: bool = False,
    into: Scratch | None = None,
    crcs: list[int] | None = None,
) -> bytes | mmap.mmap:
    """The tar inside the compressed shard ``buf`` read from ``url``.

    A zstd shard with a seek table has its frames decompressed on ``threads`` of libzstd's
    threads (None: one a core, a few at most; see :func:`zstd_frames.decompress`); any other zstd or gzip
    stream, of one frame or member or several, is read whole as a stream, and so is lz4. ``size``, the tar's
    length when a manifest says it, is checked. ``checked`` says the caller checks the bytes
    against a checksum of its own (a manifest's CRC-32 of the tar): an lz4 frame's content
    checksum would repeat that check and is skipped, and its blocks are decoded one by one
    (see :func:`~shardkit.tar.lz4_blocks.read_checked`). ``into``: an lz4 frame read that way, or a
    zstd file with a seek table, is written into one of its maps (memory written before).
    ``crcs``: the tar's CRC-32 is appended to it where the read took it on the way (see
    :func:`decompress_with_crc`).

    Raises:
        CorruptShardError: naming ``url``: not this codec's data (wrong magic bytes), a stream
            that ends early (truncated), corrupt data or a failed checksum (naming the frame when
            there is a seek table), a seek table that disagrees with the file, or a tar of
            another length than ``size``.
    """
    magic = MAGIC[codec]
    head = bytes(buf[: len(magic)])
    if head != magic:
        found = " ".join(f"{b:02x}" for b in head) or "an empty file"
        raise CorruptShardError(f"{url}: not {codec} data: expected the magic bytes {' '.join(f'{b:02x}' for b in magic)}, found {found}")
    frames = zstd_frames.table(buf, url, size=size) if codec == "zstd" else None
    if frames is not None:
        return zstd_frames.decompress(buf, frames, url, threads=threads, into=into)
    try:
        out = lz4_blocks.read_checked(buf, size, into=into, crcs=crcs) if codec == "lz4" and checked and size is not None else None
        if out is None:
            out = _READERS[codec](buf, size)
    except Exception as e:  # the codecs' own errors (zstd.ZstdError, zlib.error, EOFError...): say which shard and why
        raise CorruptShardError(f"{url}: not valid {codec}: corrupt or truncated ({_reason(e)})") from None
    if size is not None and len(out) != size:
        found = f"over {size}" if len(out) > size else str(len(out))
        raise CorruptShardError(f"{url}: decompresses to {found} bytes, the manifest says {size} (the tar inside changed)")
    return out


def decompress_with_crc(buf: Any, codec: str, url: str, *, size: int, into: Scratch | None = None) -> tuple[bytes | mmap.mmap, int]:
    """:func:`decompress` for a caller that checks the tar against the manifest's CRC-32 (``checked``),
    and that CRC-32 of the tar: an lz4 frame whose blocks are shared between threads has each
    block's CRC-32 taken by the thread that decoded it (see :class:`~shardkit.tar.lz4_blocks.Blocks`),
    any other read has it taken after."""
    crcs: list[int] = []
    out = decompress(buf, codec, url, size=size, checked=True, into=into, crcs=crcs)
    return out, crcs[0] if crcs else crc32(out)


def _zstd(buf: Any, size: int | None) -> bytes:
    """The frames of ``buf`` decompressed one after another; at most ``size`` bytes and a piece
    more, so a stream that holds more than the manifest says is not read whole first.

    Raises:
        EOFError: the last frame ends early (truncated).
    """
    import zstandard

    unpacker = zstandard.ZstdDecompressor()
    if size is not None and zstandard.frame_content_size(buf) == size:  # one frame holding it all (older piles): one allocation
        return unpacker.decompress(buf, max_output_size=size)
    view = memoryview(buf)
    parts, total, frame, begins = [], 0, None, 0
    try:
        for at in range(0, len(view), _PIECE):
            piece: Any = view[at : at + _PIECE]
            while piece:
                if frame is None:
                    frame, begins = unpacker.decompressobj(), at + min(_PIECE, len(view) - at) - len(piece)
                parts.append(frame.decompress(piece))
                total += len(parts[-1])
                # only the decoder sees where a frame ends: a stream that stops inside one is truncated
                piece, frame = (frame.unused_data, None) if frame.eof else (b"", frame)
            if size is not None and total > size:
                return b"".join(parts)
    finally:
        view.release()
    if frame is not None:
        raise EOFError(f"the frame at byte {begins} ends early, at byte {len(buf)}")
    return b"".join(parts)


def _gzip(buf: Any, size: int | None) -> bytes:
    from zlib_ng import gzip_ng

    return gzip_ng.decompress(memoryview(buf))  # a view: it takes bytes-like objects, not a memory map itself


class _Lz4Writer:
    """One LZ4 frame written chunk by chunk (:data:`_LZ4_FRAME`); its bytes depend only on the input and the level."""

    def __init__(self, level: int) -> None:
        import lz4.frame

        self._frame = lz4.frame.LZ4FrameCompressor(compression_level=level, **_LZ4_FRAME)
        self._head: bytes | None = self._frame.begin()

    def compress(self, data: Any) -> bytes:
        head, self._head = self._head or b"", None
        return head + self._frame.compress(data)

    def finish(self) -> bytes:
        head, self._head = self._head or b"", None
        return head + self._frame.flush()


def _lz4(buf: Any, size: int | None) -> bytes:
    """The LZ4 frames of ``buf`` decompressed one after another (other tools may join several).

    Raises:
        EOFError: the last frame ends early (truncated).
    """
    import lz4.frame

    parts, rest, begins, total = [], memoryview(buf), 0, 0
    while rest:
        frame = lz4.frame.LZ4FrameDecompressor()
        # bounded one byte past the manifest's size: one allocation instead of a growing buffer (3x faster),
        # and a frame that holds more still shows
        parts.append(frame.decompress(rest) if size is None else frame.decompress(rest, max_length=size - total + 1))
        total += len(parts[-1])
        if size is not None and total > size:
            break
        if not frame.eof:  # lz4 hands back what it could and waits for more: a file that stops inside a frame is truncated
            raise EOFError(f"the frame at byte {begins} ends early, at byte {len(buf)}")
        left = frame.unused_data or b""  # None when the frame ended the buffer
        begins += len(rest) - len(left)
        rest = memoryview(left)
    return parts[0] if len(parts) == 1 else b"".join(parts)


_READERS = {"zstd": _zstd, "gzip": _gzip, "lz4": _lz4}


def _reason(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return (
        text.removeprefix("decompression error: ")
        .removeprefix("zstd decompress error: ")
        .removeprefix("LZ4F_decompress failed with code: ")
    )
