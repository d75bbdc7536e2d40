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

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from shardkit._util import check_int, shown
from shardkit.errors import ConfigError, CorruptShardError
from shardkit.tar import zstd_frames

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


def decompress(buf: Any, codec: str, url: str, *, size: int | None = None, threads: int | None = None, checked: bool = False) -> bytes:
    """The tar inside the compressed shard ``buf`` read from ``url``.

    A zstd shard with a seek table has its frames decompressed on ``threads`` of libzstd's
    threads (None: one a core, a few at most; see :func:`zstd_frames.decompress`); any other zstd or gzip
    stream, of one frame or member or several, is read whole as a stream, and so is lz4. ``size``, the tar's
    length when a manifest says it, is checked. ``checked`` says the caller checks the bytes
    against a checksum of its own (a manifest's CRC-32 of the tar): an lz4 frame's content
    checksum would repeat that check and is skipped, and its blocks are decoded one by one
    (see :func:`_lz4_checked`).

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
        out = _lz4_checked(buf, size) if codec == "lz4" and checked and size is not None else None
        if out is None:
            out = _READERS[codec](buf, size)
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

# the frame descriptor's flag bits (FLG) this module looks at: the version (01), independent
# blocks, block checksums, content size and dictionary id fields that lengthen the header, and
# the content checksum at the frame's end
_LZ4_VERSION, _LZ4_INDEPENDENT, _LZ4_BLOCK_CHECKSUM = 0xC0, 0x20, 0x10
_LZ4_CONTENT_SIZE, _LZ4_CONTENT_CHECKSUM, _LZ4_DICT_ID = 0x08, 0x04, 0x01
# a block's size word: the high bit says the block is stored as it is, not compressed
_LZ4_STORED = 1 << 31
# what a linked block may refer back to in the output before it
_LZ4_WINDOW = 64 << 10


def _lz4_checked(buf: Any, size: int) -> bytes | None:
    """A single LZ4 frame of ``size`` bytes of content, which the caller checks against a
    checksum of its own, decoded block by block into one buffer; None when ``buf`` is not such a
    frame, a block does not decode, or liblz4's block decoder is not at hand (the caller then
    reads it the full way, which names any fault).

    python-lz4's frame reader decodes into a buffer it guesses and grows, hashes the content
    (xxHash-32, with no switch to skip it), then copies it all into a bytes object while it
    holds the GIL: three buffers of fresh memory a pile, and on a virtual machine touching fresh
    memory costs more than decoding into it. Here each block is decoded straight into the one
    bytes object returned (liblz4's own ``LZ4_decompress_safe_usingDict``, through ctypes,
    without the GIL), made without zeroing it first (see :func:`_unfilled_bytes`). Only output
    its caller checks against the manifest comes from here, so the frame's content checksum (and
    any block checksums) are left unread: a repeated check, never the only one.
    """
    decode = _lz4_decoder()
    if decode is None:
        return None
    with memoryview(buf) as view:
        blocks = _lz4_blocks(view, size)
        if blocks is None:
            return None
        made = _unfilled_bytes(size)
        out, dst = made if made is not None else (bytearray(size), None)  # elsewhere: zeroed, then copied once
        if dst is None:
            dst = np.frombuffer(out, dtype=np.uint8)
        src = np.frombuffer(view, dtype=np.uint8)
        done = _lz4_decode(decode, src, dst, blocks)
        del src, dst
    if done != size:
        return None  # ``out`` is dropped unseen: nothing reads bytes the decoder did not write
    return out if isinstance(out, bytes) else bytes(out)


def _unfilled_bytes(size: int) -> tuple[bytes, np.ndarray] | None:
    """A new ``bytes`` of ``size`` whose contents are not set yet, and a writable view of it, for
    the caller to fill before anyone else sees it; None where CPython's C API is not at hand.

    ``bytes(size)`` (or a ``BytesIO`` grown to the size) zeroes every byte while it holds the
    GIL: for fresh memory that is where its pages are first touched, which costs more than
    decoding into them, and stalls the thread that hands out samples meanwhile.
    ``PyBytes_FromStringAndSize(NULL, size)`` leaves the bytes for the caller to write (the C
    API's way to build a bytes object in place); the decoder then touches the pages first,
    without the GIL.
    """
    api = _bytes_api()
    if api is None or size <= 0:
        return None
    make, data = api
    out = make(None, size)
    return out, np.frombuffer(memoryview((ctypes.c_char * size).from_address(data(out))).cast("B"), dtype=np.uint8)


@functools.lru_cache(maxsize=1)
def _bytes_api() -> tuple[Any, Any] | None:
    """CPython's ``PyBytes_FromStringAndSize`` and ``PyBytes_AsString`` through ctypes, or None."""
    try:
        make, data = ctypes.pythonapi.PyBytes_FromStringAndSize, ctypes.pythonapi.PyBytes_AsString
    except AttributeError:  # pragma: no cover - not CPython
        return None
    make.argtypes, make.restype = (ctypes.c_char_p, ctypes.c_ssize_t), ctypes.py_object
    data.argtypes, data.restype = (ctypes.py_object,), ctypes.c_void_p
    return make, data


def _lz4_blocks(view: memoryview, size: int) -> tuple[int, list[tuple[int, int, bool]], bool] | None:
    """Where the blocks of the single LZ4 frame ``view`` are: its maximum block size, each
    block's ``(offset, length, stored as it is)``, and whether a block may refer to the output
    before it (linked blocks); None when ``view`` is anything else (no frame header of version
    01 with a good check byte, a dictionary id, another content size than ``size``, a block that
    runs past the end, more after the frame)."""
    if len(view) < 7 or view[4] & _LZ4_VERSION != 0x40 or view[4] & _LZ4_DICT_ID:
        return None
    flags, most = view[4], 1 << (8 + 2 * ((view[5] >> 4) & 7))  # the block descriptor's maximum block size
    at = 6 + (8 if flags & _LZ4_CONTENT_SIZE else 0)  # the header's check byte
    if len(view) <= at or _header_check(bytes(view[4:at])) != view[at]:
        return None
    if flags & _LZ4_CONTENT_SIZE and int.from_bytes(view[6:14], "little") != size:
        return None
    at += 1
    trailer = 4 if flags & _LZ4_BLOCK_CHECKSUM else 0
    blocks = []
    while True:
        if at + 4 > len(view):
            return None
        word = int.from_bytes(view[at : at + 4], "little")
        at += 4
        if not word:  # the end mark
            break
        length = word & ~_LZ4_STORED
        if length > most or at + length + trailer > len(view):
            return None
        blocks.append((at, length, bool(word & _LZ4_STORED)))
        at += length + trailer
    at += 4 if flags & _LZ4_CONTENT_CHECKSUM else 0
    return (most, blocks, not flags & _LZ4_INDEPENDENT) if at == len(view) else None


def _lz4_decode(decode: Any, src: np.ndarray, dst: np.ndarray, frame: tuple[int, list[tuple[int, int, bool]], bool]) -> int:
    """Decode the blocks of ``frame`` (see :func:`_lz4_blocks`) from ``src`` into ``dst`` in
    order; returns the bytes written, or -1 when a block does not decode or the content does not
    fit ``dst``. A linked block reads the output before it, which lies just before it in ``dst``."""
    most, blocks, linked = frame
    done, size = 0, len(dst)
    for at, length, stored in blocks:
        room = min(most, size - done)
        if stored:
            if length > room:
                return -1
            dst[done : done + length] = src[at : at + length]
            written = length
        else:
            window = min(done, _LZ4_WINDOW) if linked else 0
            base = dst.ctypes.data + done
            written = decode(src.ctypes.data + at, base, length, room, base - window, window) if room else -1
            if written < 0:
                return -1
        done += written
    return done


@functools.lru_cache(maxsize=1)
def _lz4_decoder() -> Any:
    """liblz4's ``LZ4_decompress_safe_usingDict`` as python-lz4 bundles it (its block module
    exports the library's symbols where the platform's linker does), or None."""
    try:
        import lz4.block._block as native

        call = ctypes.CDLL(native.__file__).LZ4_decompress_safe_usingDict
    except (ImportError, OSError, AttributeError):
        return None
    # (src, dst, compressed size, dst capacity, dictionary start, dictionary size) -> bytes written, < 0 on error;
    # it never reads past the compressed size nor writes past the capacity, whatever the input
    call.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
    call.restype = ctypes.c_int
    return call


_XXH_PRIMES = (2654435761, 2246822519, 3266489917, 668265263, 374761393)
_U32 = 0xFFFFFFFF


def _header_check(descriptor: bytes) -> int:
    """An LZ4 frame header's check byte: the second byte of the 32-bit xxHash (seed 0) of its
    descriptor (the flag byte up to the check byte; 2 to 14 bytes, so the hash's short form)."""
    p1, p2, p3, p4, p5 = _XXH_PRIMES

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & _U32

    h, at = (p5 + len(descriptor)) & _U32, 0
    for at in range(0, len(descriptor) - 3, 4):
        h = rotl((h + int.from_bytes(descriptor[at : at + 4], "little") * p3) & _U32, 17) * p4 & _U32
    for byte in descriptor[len(descriptor) // 4 * 4 :]:
        h = rotl((h + byte * p5) & _U32, 11) * p1 & _U32
    h ^= h >> 15
    h = h * p2 & _U32
    h ^= h >> 13
    h = h * p3 & _U32
    h ^= h >> 16
    return (h >> 8) & 0xFF


def _reason(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return (
        text.removeprefix("decompression error: ")
        .removeprefix("zstd decompress error: ")
        .removeprefix("LZ4F_decompress failed with code: ")
    )
