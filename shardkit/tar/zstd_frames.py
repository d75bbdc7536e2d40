"""Seekable zstd: a tar compressed as independent frames of a fixed size with a seek table at the
end, whose frames libzstd decompresses on a few threads of its own in one call.

libzstd decompresses one frame on one core; independent frames are what lets several cores share
a pile. The layout is zstd's own seekable format (``contrib/seekable_format`` in the zstd
repository): the frames, then a skippable frame (magic ``0x184D2A5E``) holding one entry per
frame (compressed size, decompressed size) and a footer (frame count, descriptor, magic
``0x8F92EAB1``). Readers that do not know the table skip it, so ``zstd -d``, ``tar --zstd`` and any
zstd stream reader read the file as the concatenated frames it is. Frames are cut every
``FRAME_SIZE`` bytes of tar and each is compressed alone, so the bytes depend on the tar and the
level only: not on the machine, nor on how many threads wrote or read them.

    writer = FrameWriter(level=3)
    data = writer.compress(tar) + writer.finish()
    assert decompress(data, table(data, "x.tar.zst"), "x.tar.zst") == tar
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardkit.errors import CorruptShardError

if TYPE_CHECKING:
    from shardkit.storage.scratch import Scratch

# tar bytes per frame: 2 MiB keeps level 3's whole 2 MiB window (the size costs under 0.5%
# against one frame) and gives a 100 MB pile 50 pieces to share among threads (benchmarks/compression.py)
FRAME_SIZE = 2 << 20
# tar bytes one call into a compressor takes (a frame is fed in such pieces): about one zstd
# block's work, a fraction of a second even at level 19, so a thread compressing leaves the
# codec soon after it is told to stop (or after its process began to exit, which its work would
# otherwise slow down by taking a core)
PIECE = 128 << 10
# from this level up a 128 KiB block takes most of a second on a busy core: such frames are fed
# in pieces of SLOW_PIECE, each ended as a block of its own (0.7% larger at level 19, no slower)
SLOW_LEVEL = 10
SLOW_PIECE = 32 << 10
# threads decompressing one pile: more gains little, and a loader's other work needs cores too
MAX_THREADS = 4
SKIPPABLE_MAGIC = 0x184D2A5E
SEEKABLE_MAGIC = 0x8F92EAB1
_FOOTER = struct.Struct("<IBI")  # frame count, descriptor, seekable magic
_HEADER = struct.Struct("<II")  # skippable magic, size of what follows
_CHECKSUM_FLAG = 0x80
_RESERVED_BITS = 0x7C
# the seekable format's limit: a frame count past it is a damaged footer, not a real file
_MAX_FRAMES = 0x8000000
# a zstd frame header's longest (magic, descriptor, window, dictionary id, content size), and a
# block's most output: a block takes 4 bytes at least (3 of header, one repeated byte)
_MAX_HEADER = 18
_BLOCK = 128 << 10


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of a seekable file: where it is stored and where its bytes go in the tar."""

    start: int  # offset in the compressed file
    stored: int  # compressed size
    offset: int  # offset in the tar
    size: int  # decompressed size


class FrameWriter:
    """Compress one stream as frames of ``frame_size`` bytes, then the seek table.

    Args:
        level: the zstd level.
        frame_size: tar bytes per frame (fixed: it decides the bytes written).
        between: called before each piece of a frame (:data:`PIECE`, or :data:`SLOW_PIECE`
            from :data:`SLOW_LEVEL` up) is compressed; what it raises stops the writer there
            (a job told to stop).

    Example:
        writer = FrameWriter(level=3)
        out = b"".join(writer.compress(chunk) for chunk in chunks) + writer.finish()
    """

    def __init__(self, *, level: int, frame_size: int = FRAME_SIZE, between: Callable[[], None] | None = None) -> None:
        import zstandard

        # no worker threads: one frame's bytes are then libzstd's single-threaded output, the same everywhere
        self._packer = zstandard.ZstdCompressor(level=level, write_checksum=True)
        self._piece = SLOW_PIECE if level >= SLOW_LEVEL else PIECE
        self._end_block = zstandard.COMPRESSOBJ_FLUSH_BLOCK if level >= SLOW_LEVEL else None
        self._frame_size = frame_size
        self._between = between
        self._pending = bytearray()
        self._entries: list[tuple[int, int]] = []

    def compress(self, data: Any) -> bytes:
        """The frames completed by ``data`` (none until ``frame_size`` bytes have come)."""
        view = memoryview(data).cast("B")
        out = []
        if self._pending:
            take = self._frame_size - len(self._pending)
            self._pending += view[:take]
            view = view[take:]
            if len(self._pending) == self._frame_size:
                out.append(self._frame(self._pending))
                self._pending = bytearray()
        while len(view) >= self._frame_size:  # whole frames straight from the input: no copy
            out.append(self._frame(view[: self._frame_size]))
            view = view[self._frame_size :]
        self._pending += view
        return b"".join(out)

    def finish(self) -> bytes:
        """The last (short) frame and the seek table. Call once, last."""
        last = self._frame(self._pending) if self._pending or not self._entries else b""
        self._pending = bytearray()
        return last + seek_table(self._entries)

    def _frame(self, data: Any) -> bytes:
        # streamed in fixed pieces with the size pledged: the bytes depend on the data and level only
        view = memoryview(data).cast("B")
        stream = self._packer.compressobj(size=len(view))
        out = []
        for at in range(0, len(view), self._piece):
            if self._between is not None:
                self._between()
            out.append(stream.compress(view[at : at + self._piece]))
            if self._end_block is not None and at + self._piece < len(view):
                out.append(stream.flush(self._end_block))
        out.append(stream.flush())
        frame = b"".join(out)
        self._entries.append((len(frame), len(view)))
        return frame


def seek_table(entries: Sequence[tuple[int, int]]) -> bytes:
    """The seek table frame for ``entries`` (compressed size, decompressed size), without checksums."""
    body = b"".join(struct.pack("<II", stored, size) for stored, size in entries)
    footer = _FOOTER.pack(len(entries), 0, SEEKABLE_MAGIC)
    return _HEADER.pack(SKIPPABLE_MAGIC, len(body) + len(footer)) + body + footer


def table(buf: Any, url: str, *, size: int | None = None) -> list[Frame] | None:
    """The frames ``buf``'s seek table lists, or None when it has no table that lists all of it
    (an older single-frame pile, another tool's file, seekable files joined end to end, a table
    of a later format version): read it as a stream then, which checks every frame all the same.

    Raises:
        CorruptShardError: naming ``url``: a table whose entries do not add up to the file
            (truncated, or damaged), or to ``size`` (the tar's length the manifest says).
    """
    end = len(buf)
    if end < _HEADER.size + _FOOTER.size or struct.unpack_from("<I", buf, end - 4)[0] != SEEKABLE_MAGIC:
        return None
    count, descriptor, _ = _FOOTER.unpack_from(buf, end - _FOOTER.size)
    if descriptor & _RESERVED_BITS:  # a later version of the format: the frames are still a stream
        return None
    width = 12 if descriptor & _CHECKSUM_FLAG else 8
    start = end - _FOOTER.size - count * width - _HEADER.size
    if count > _MAX_FRAMES or start < 0:
        raise CorruptShardError(f"{url}: the seek table lists {count} frames, more than its {end}-byte file holds (truncated?)")
    magic, length = _HEADER.unpack_from(buf, start)
    if magic != SKIPPABLE_MAGIC or length != count * width + _FOOTER.size:
        raise CorruptShardError(
            f"{url}: the seek table of {count} frames should start at byte {start} with a skippable frame header "
            f"of size {count * width + _FOOTER.size}, found magic {magic:#010x} and size {length}"
        )
    frames, stored_at, tar_at = [], 0, 0
    for i in range(count):
        stored, frame_size = struct.unpack_from("<II", buf, start + _HEADER.size + i * width)
        frames.append(Frame(stored_at, stored, tar_at, frame_size))
        stored_at, tar_at = stored_at + stored, tar_at + frame_size
    if stored_at > start:
        raise CorruptShardError(
            f"{url}: the seek table's {count} frames take {stored_at} bytes, but the table starts at byte {start} (truncated or damaged)"
        )
    if stored_at < start:  # frames before the listed ones (seekable files joined end to end): a stream, then
        return None
    if size is not None and tar_at != size:
        raise CorruptShardError(f"{url}: the seek table's frames hold {tar_at} bytes of tar, the manifest says {size}")
    return frames


def threads_for(frames: int, threads: int | None = None) -> int:
    """How many threads decompress ``frames`` frames: ``threads`` if given, else one a core this
    process may use, at most :data:`MAX_THREADS`; never more than there are frames."""
    if threads is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = min(cores, MAX_THREADS)
    return max(1, min(threads, frames))


def decompress(
    buf: Any, frames: Sequence[Frame], url: str, *, threads: int | None = None, into: Scratch | None = None
) -> bytes | mmap.mmap:
    """The tar of the seekable file ``buf`` whose frames ``table`` found, decompressed on
    ``threads`` threads (see :func:`threads_for`), joined into one of ``into``'s maps when given
    (memory written before) or else a new bytes object.

    All frames go to libzstd in one call, which decompresses them on its own threads: the GIL is
    let go once per pile, not once per frame. (Frame by frame, each frame's thread must take the
    GIL back before the next, and with a consumer thread holding it that wait, up to the 5 ms
    switch interval, cost more than the decompression: 48 ms a 13 MB pile instead of 9.)

    Raises:
        CorruptShardError: naming ``url``, the frame and its offset: corrupt data, a failed
            checksum, or a frame that holds more or fewer bytes than its table entry says.
    """
    import zstandard

    listed = [f for f in frames if f.size]  # an empty or skippable frame holds nothing of the tar
    source = memoryview(buf)
    try:
        for i, f in enumerate(frames):
            _check_frame(source[f.start : f.start + f.stored], f, _where(url, frames, i))
        if not listed:
            return b""
        parts = [source[f.start : f.start + f.stored] for f in listed]
        sizes = struct.pack(f"<{len(listed)}Q", *(f.size for f in listed))
        # never fewer than two threads: libzstd's one-thread path here measured 22 ms a 13 MB pile against 8
        workers = max(2, threads_for(len(listed), threads)) if len(listed) > 1 else 1
        out = zstandard.ZstdDecompressor().multi_decompress_to_buffer(parts, decompressed_sizes=sizes, threads=workers)
    except zstandard.ZstdError as e:
        raise _frame_error(url, frames, listed, str(e)) from None
    finally:
        source.release()
    parts_out = [memoryview(out[i]) for i in range(len(out))]
    whole = into.take(sum(map(len, parts_out))) if into is not None else None
    if whole is None:
        return b"".join(parts_out)
    at = 0
    for part in parts_out:  # every byte of ``whole`` written: the sizes were summed from these parts
        whole[at : at + len(part)] = part
        at += len(part)
    return whole


def _check_frame(stored: memoryview, frame: Frame, where: str) -> None:
    """Refuse a frame whose header disagrees with its table entry, before any of its output is
    allocated (a forged size must not cost gigabytes), and one listed as empty that holds data."""
    import zstandard

    try:
        content = zstandard.frame_content_size(bytes(stored[:_MAX_HEADER]))
        if frame.size == 0 and content == 0:  # listed as empty: nothing must come out of it, nor follow it
            unpacker = zstandard.ZstdDecompressor().decompressobj()
            if unpacker.decompress(stored) or not unpacker.eof or unpacker.unused_data:
                raise CorruptShardError(f"{where}: listed as empty, but it is not one empty or skippable frame")
    except zstandard.ZstdError as e:
        raise CorruptShardError(f"{where}: not a zstd frame ({e})") from None
    finally:
        stored.release()
    if content == -1:  # no size in the header (another tool's): the table's, checked as it decompresses
        content = frame.size
    if content > (frame.stored // 4 + 1) * _BLOCK:  # a forged header and table alike: more than its blocks can hold
        content = None
    if content != frame.size:
        said = "more than its blocks can hold" if content is None else f"{content} bytes"
        raise CorruptShardError(f"{where}: its header says it holds {said}, the seek table says {frame.size}")


def _where(url: str, frames: Sequence[Frame], i: int) -> str:
    frame = frames[i]
    return f"{url}: zstd frame {i} of {len(frames)} (bytes {frame.start}-{frame.start + frame.stored})"


_ITEM = re.compile(r"error decompressing item (\d+): (.*)")
_SIZES = re.compile(r"decompressed (\d+) bytes; expected (\d+)")


def _frame_error(url: str, frames: Sequence[Frame], listed: Sequence[Frame], message: str) -> CorruptShardError:
    """What libzstd's ``message`` about one of the ``listed`` frames means, naming the frame."""
    found = _ITEM.search(message)
    if found is None or int(found.group(1)) >= len(listed):
        return CorruptShardError(f"{url}: not valid zstd: corrupt or truncated ({message})")
    where = _where(url, frames, frames.index(listed[int(found.group(1))]))
    reason = found.group(2)
    sizes = _SIZES.match(reason)
    if sizes is not None:
        return CorruptShardError(f"{where}: decompresses to {sizes.group(1)} bytes, the seek table says {sizes.group(2)}")
    return CorruptShardError(f"{where}: not valid zstd: corrupt or truncated ({reason})")
