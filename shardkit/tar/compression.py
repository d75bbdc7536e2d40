"""Whole-shard compression: the codecs (zstd, gzip), their file suffixes and magic bytes, a
streaming compressor, and decompression whose every failure names the shard.

A compressed shard is one tar compressed whole (``pile-000000.tar.zst``, ``.tar.gz``), never
member by member, so ``tar --zstd``, ``tar -z``, Python's ``tarfile`` and webdataset read it as
they read any compressed tar. zstd writes independent frames of a fixed size with a seek table
(:mod:`shardkit.tar.zstd_frames`), so a reader decompresses a pile on several threads; the bytes
depend only on the tar and the level, not on the machine or its threads, so piles stay
byte-identical whatever wrote them. Every zstd frame carries its content size and a checksum.
Older piles (one frame, no table) and other tools' files are read as a stream. gzip goes
through zlib-ng, which is faster than the standard zlib.

    packer = Compressor("zstd", level=3)
    data = packer.compress(tar) + packer.finish()
    assert decompress(data, "zstd", "x.tar.zst", size=len(tar)) == tar
"""

from __future__ import annotations

from typing import Any

from shardkit._util import check_int, shown
from shardkit.errors import ConfigError, CorruptShardError
from shardkit.tar import zstd_frames

# the codecs, in the order they are offered; None (no compression) is the default everywhere
CODECS = ("zstd", "gzip")
SUFFIX = {"zstd": ".zst", "gzip": ".gz"}
# other endings a shard compressed with the codec may have (read, never written)
_READ_SUFFIXES = {"zstd": (".tar.zst", ".tzst", ".zst"), "gzip": (".tar.gz", ".tgz", ".gz")}
# the names of tar shards, plain or compressed, that readers and listings recognise
SHARD_SUFFIXES = (".tar", *(ending for endings in _READ_SUFFIXES.values() for ending in endings if ending.startswith((".tar", ".t"))))
MAGIC = {"zstd": b"\x28\xb5\x2f\xfd", "gzip": b"\x1f\x8b"}
# the levels each codec takes, and the default (chosen by benchmarks/compression.py: see BENCHMARKS.md)
LEVELS = {"zstd": (1, 22), "gzip": (1, 9)}
DEFAULT_LEVEL = {"zstd": 3, "gzip": 6}
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

    Args:
        codec: ``"zstd"`` or ``"gzip"``.
        level: the codec's level (see :func:`check_level`).

    Example:
        packer = Compressor("gzip", level=6)
        out = b"".join(packer.compress(chunk) for chunk in chunks) + packer.finish()
    """

    def __init__(self, codec: str, *, level: int) -> None:
        self.codec = codec
        if codec == "zstd":
            self._stream: Any = zstd_frames.FrameWriter(level=level)
        elif codec == "gzip":
            from zlib_ng import zlib_ng

            # wbits 31: a gzip member (header and CRC trailer), with mtime 0, so output is reproducible
            self._stream = zlib_ng.compressobj(level, zlib_ng.DEFLATED, 31)
        else:
            check_compression(codec)

    def compress(self, data: Any) -> bytes:
        """The compressed bytes ready after ``data`` (often none: codecs buffer)."""
        return self._stream.compress(data)

    def finish(self) -> bytes:
        """The rest of the compressed stream, its end included. Call once, last."""
        return self._stream.finish() if self.codec == "zstd" else self._stream.flush()


def compress(data: Any, codec: str, *, level: int) -> bytes:
    """``data`` compressed whole with ``codec`` (see :class:`Compressor`)."""
    packer = Compressor(codec, level=level)
    return packer.compress(data) + packer.finish()


def decompress(buf: Any, codec: str, url: str, *, size: int | None = None, threads: int | None = None) -> bytes:
    """The tar inside the compressed shard ``buf`` read from ``url``.

    A zstd shard with a seek table has its frames decompressed on ``threads`` of libzstd's
    threads (None: one a core, a few at most; see :func:`zstd_frames.decompress`); any other zstd or gzip
    stream, of one frame or member or several, is read whole as a stream. ``size``, the tar's
    length when a manifest says it, is checked.

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
        return zstd_frames.decompress(buf, frames, url, threads=threads)
    try:
        out = _zstd(buf, size) if codec == "zstd" else _gzip(buf)
    except Exception as e:  # the codecs' own errors (zstd.ZstdError, zlib.error, EOFError...): say which shard and why
        raise CorruptShardError(f"{url}: not valid {codec}: corrupt or truncated ({_reason(e)})") from None
    if size is not None and len(out) != size:
        found = f"over {size}" if len(out) > size else str(len(out))
        raise CorruptShardError(f"{url}: decompresses to {found} bytes, the manifest says {size} (the tar inside changed)")
    return out


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


def _gzip(buf: Any) -> bytes:
    from zlib_ng import gzip_ng

    return gzip_ng.decompress(memoryview(buf))  # a view: it takes bytes-like objects, not a memory map itself


def _reason(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text.removeprefix("decompression error: ").removeprefix("zstd decompress error: ")
