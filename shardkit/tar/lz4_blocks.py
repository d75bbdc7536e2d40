"""Read a whole LZ4 frame block by block into one buffer, for a caller that checks the content itself.

The loader reads a pile compressed with ``compression="lz4"`` through :func:`read_checked`:
liblz4's block decoder (the one python-lz4 bundles, called through ctypes without the GIL)
decodes each block of the frame straight into the buffer returned: a map of the loader's
:class:`~shardkit.storage.scratch.Scratch` (memory decoded into before), else a bytes object made
unset rather than zeroed (:func:`unfilled_bytes`). Anything else (several frames, a dictionary, another size than
the manifest's, a block that does not decode, no decoder at hand) gives None, and the caller
reads the frame the full way (:func:`shardkit.tar.compression.decompress`), which names the fault.

    tar = read_checked(stored, size=info.tar_bytes, into=scratch)   # None: read it the full way
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import queue
import sys
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from shardkit._util import crc32, crc32_combine
from shardkit.assist import BOARD

if TYPE_CHECKING:
    from shardkit.storage.scratch import Scratch

# the frame descriptor's flag bits (FLG) this module looks at: the version (01), independent
# blocks, block checksums, content size and dictionary id fields that lengthen the header, and
# the content checksum at the frame's end
_VERSION, _INDEPENDENT, _BLOCK_CHECKSUM = 0xC0, 0x20, 0x10
_CONTENT_SIZE, _CONTENT_CHECKSUM, _DICT_ID = 0x08, 0x04, 0x01
# a block's size word: the high bit says the block is stored as it is, not compressed
_STORED = 1 << 31
# what a linked block may refer back to in the output before it
_WINDOW = 64 << 10


def read_checked(buf: Any, size: int, *, into: Scratch | None = None, crcs: list[int] | None = None) -> bytes | mmap.mmap | None:
    """A single LZ4 frame of ``size`` bytes of content, which the caller checks against a
    checksum of its own, decoded block by block into one buffer; None when ``buf`` is not such a
    frame, a block does not decode, or liblz4's block decoder is not at hand (the caller then
    reads it the full way, which names any fault).

    python-lz4's frame reader decodes into a buffer it guesses and grows, hashes the content
    (xxHash-32, with no switch to skip it), then copies it all into a bytes object while it
    holds the GIL: three buffers of fresh memory a pile, and on a virtual machine touching fresh
    memory costs more than decoding into it. Here each block is decoded straight into the one
    bytes object returned (liblz4's own ``LZ4_decompress_safe_usingDict``, through ctypes,
    without the GIL), made without zeroing it first (see :func:`unfilled_bytes`). Only output
    its caller checks against the manifest comes from here, so the frame's content checksum (and
    any block checksums) are left unread: a repeated check, never the only one. With ``into``, the
    frame is decoded into one of its maps instead (memory decoded into before, no page to fault in).
    ``crcs``: where the blocks are shared between threads (:class:`Blocks`), each thread takes the
    CRC-32 of the blocks it decoded, and the content's CRC-32 is appended to ``crcs``; else
    ``crcs`` is left as it is, for the caller to take it.
    """
    decode = decoder()
    if decode is None:
        return None
    with memoryview(buf) as view:
        blocks = frame_blocks(view, size)
        if blocks is None or size > blocks[0] * len(blocks[1]):
            return None  # more than the frame's blocks can hold (a wrong size): the full read says so
        out, dst = _reused(into, size) or unfilled_bytes(size) or _zeroed(size)
        try:
            done = _decoded(decode, np.frombuffer(view, dtype=np.uint8), dst, blocks, crcs)
        except BaseException:
            del out, dst  # a traceback keeps the frame: it must not hold bytes never written
            raise
        del dst
    if done != size:
        return None  # ``out`` is dropped unseen: nothing reads bytes the decoder did not write
    return out if isinstance(out, (bytes, mmap.mmap)) else bytes(out)


def _reused(into: Scratch | None, size: int) -> tuple[mmap.mmap, np.ndarray] | None:
    """A map of ``into`` to decode into, and a writable view of it; None without one."""
    out = into.take(size) if into is not None else None
    return (out, np.frombuffer(out, dtype=np.uint8)) if out is not None else None


def _zeroed(size: int) -> tuple[bytearray, np.ndarray]:
    """Where :func:`unfilled_bytes` cannot help: zeroed memory, copied into bytes once filled."""
    out = bytearray(size)
    return out, np.frombuffer(out, dtype=np.uint8)


def unfilled_bytes(size: int) -> tuple[bytes, np.ndarray] | None:
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
    out = make(None, size)  # a new object for any size above 0 (only a copied byte is shared)
    place = (ctypes.c_char * size).from_address(data(out))
    place._owner = out  # type: ignore[attr-defined]  # the view keeps the bytes alive, whoever holds it
    return out, np.frombuffer(memoryview(place).cast("B"), dtype=np.uint8)


@functools.lru_cache(maxsize=1)
def _bytes_api() -> tuple[Any, Any] | None:
    """CPython's ``PyBytes_FromStringAndSize`` and ``PyBytes_AsString`` through ctypes, or None."""
    if sys.implementation.name != "cpython":  # pragma: no cover - another Python's bytes are not CPython's
        return None
    try:
        make, data = ctypes.pythonapi.PyBytes_FromStringAndSize, ctypes.pythonapi.PyBytes_AsString
    except AttributeError:  # pragma: no cover - not CPython
        return None
    make.argtypes, make.restype = (ctypes.c_char_p, ctypes.c_ssize_t), ctypes.py_object
    data.argtypes, data.restype = (ctypes.py_object,), ctypes.c_void_p
    return make, data


def frame_blocks(view: memoryview, size: int) -> tuple[int, list[tuple[int, int, bool]], bool] | None:
    """Where the blocks of the single LZ4 frame ``view`` are: its maximum block size, each
    block's ``(offset, length, stored as it is)``, and whether a block may refer to the output
    before it (linked blocks); None when ``view`` is anything else (no frame header of version
    01 with a good check byte, a dictionary id, another content size than ``size``, a block that
    runs past the end, more after the frame)."""
    if len(view) < 7 or view[4] & _VERSION != 0x40 or view[4] & _DICT_ID:
        return None
    flags, most = view[4], 1 << (8 + 2 * ((view[5] >> 4) & 7))  # the block descriptor's maximum block size
    at = 6 + (8 if flags & _CONTENT_SIZE else 0)  # the header's check byte
    if len(view) <= at or header_check(bytes(view[4:at])) != view[at]:
        return None
    if flags & _CONTENT_SIZE and int.from_bytes(view[6:14], "little") != size:
        return None
    at += 1
    trailer = 4 if flags & _BLOCK_CHECKSUM else 0
    blocks = []
    while True:
        if at + 4 > len(view):
            return None
        word = int.from_bytes(view[at : at + 4], "little")
        at += 4
        if not word:  # the end mark
            break
        length = word & ~_STORED
        if length > most or at + length + trailer > len(view):
            return None
        blocks.append((at, length, bool(word & _STORED)))
        at += length + trailer
    at += 4 if flags & _CONTENT_CHECKSUM else 0
    return (most, blocks, not flags & _INDEPENDENT) if at == len(view) else None


def _decoded(
    decode: Any, src: np.ndarray, dst: np.ndarray, frame: tuple[int, list[tuple[int, int, bool]], bool], crcs: list[int] | None
) -> int:
    """:func:`decode_blocks`, its blocks shared with the thread waiting for this read when the
    reading thread has a :data:`~shardkit.assist.BOARD` and the blocks are independent and full
    (see :class:`Blocks`), the content's CRC-32 appended to ``crcs`` then; a frame whose blocks
    are not all full is decoded again in order."""
    board = BOARD.get()
    if board is None or frame[2] or len(frame[1]) < 2:
        return decode_blocks(decode, src, dst, frame)
    job = Blocks(decode, src, dst, frame, crc=crcs is not None and crc32_combine is not None)
    board.offer(job.step)
    try:
        done = job.finish()
    finally:
        board.withdraw()
    if done < 0:
        return decode_blocks(decode, src, dst, frame)
    if crcs is not None and job.crc is not None:
        crcs.append(job.crc)
    return done


class Blocks:
    """The independent blocks of one frame, each decoded by whichever thread claims it next: the
    thread reading the pile or the one waiting for it (:class:`~shardkit.assist.Board`).

    Each block's place in the output must be known before the blocks ahead of it are decoded, so
    every block but the last must fill the frame's block size, as LZ4 writers make them (shardkit's
    and the ``lz4`` tool's): a block that decodes to another length fails the job, and the caller
    decodes the frame again in order (:func:`decode_blocks`), which takes blocks of any length.
    A step holds the block's addresses only, never the buffers: :meth:`finish` keeps them alive
    until every step begun has ended. With ``crc``, each step also takes the CRC-32 of the block
    it decoded (without the GIL), and :attr:`crc` joins them once the job is done.

        job = Blocks(decode, src, dst, frame_blocks(view, size))
        board.offer(job.step)
        done = job.finish()          # the bytes written, or -1
    """

    def __init__(
        self, decode: Any, src: np.ndarray, dst: np.ndarray, frame: tuple[int, list[tuple[int, int, bool]], bool], *, crc: bool = False
    ) -> None:
        most, blocks, _ = frame
        self.crc: int | None = None  # the content's CRC-32 once finished, with ``crc``
        self._decode, self._size = decode, len(dst)
        # each block: (where it is, its length, stored as it is, where it goes, the bytes it must fill)
        base_src, base_dst = src.ctypes.data, dst.ctypes.data
        self._parts = [
            (base_src + at, length, stored, base_dst + k * most, min(most, self._size - k * most))
            for k, (at, length, stored) in enumerate(blocks)
        ]
        # full blocks and a last one holding the rest: every block has a place of its own
        self._fits = (len(blocks) - 1) * most < self._size <= len(blocks) * most
        self._claimed = 0
        self._ended = [False] * len(self._parts)  # set by each step as it ends, one store (a signal cannot split it)
        self._failed = False  # a block did not decode to its place: no more are claimed
        self._crcs: list[int] | None = [0] * len(self._parts) if crc else None
        # C-level primitives only: a Ctrl-C raised in the helping consumer between a Python-level
        # lock's acquire and its ``with`` block would leave the lock held and the reader stuck
        self._lock = threading.Lock()
        self._woken: queue.SimpleQueue[int] = queue.SimpleQueue()

    def step(self) -> bool:
        """Decode the next block no thread has claimed; False when none is left (or the job failed)."""
        k, ok = -1, False
        try:
            with self._lock:
                if self._claimed >= len(self._parts) or not self._fits or self._failed:
                    return False
                k = self._claimed  # claimed and ``k`` set with no check for a signal between them
                self._claimed += 1
            at, length, stored, to, room = self._parts[k]
            if stored:
                done = length == room and ctypes.memmove(to, at, length) is not None
            else:
                done = self._decode(at, to, length, room, None, 0) == room
            if done and self._crcs is not None:
                self._crcs[k] = crc32((ctypes.c_char * room).from_address(to))
            ok = done  # only once its CRC-32 is in: a step cut short by a signal fails the job, never the check
        finally:
            if k >= 0:  # a block claimed always ends, whatever was raised where
                self._failed |= not ok
                self._ended[k] = True
                self._woken.put(k)
        return True

    def finish(self) -> int:
        """Decode what no thread has claimed, wait for the steps begun elsewhere; the bytes
        written (the output's whole length), or -1 when a block failed or did not fill its place.
        Whatever it raises, it returns only once no step is writing into the output."""
        try:
            while self.step():
                pass
        finally:
            while not all(self._ended[: self._claimed]):
                with contextlib.suppress(queue.Empty):
                    self._woken.get(timeout=0.01)  # a step's notice can be lost to an interrupt: look again soon
        if not self._fits or self._failed or self._claimed < len(self._parts):
            return -1
        if self._crcs is not None and crc32_combine is not None:  # (given ``crc`` only where it is)
            joined = self._crcs[0]
            for (*_, room), part in zip(self._parts[1:], self._crcs[1:], strict=True):
                joined = crc32_combine(joined, part, room)
            self.crc = joined
        return self._size


def decode_blocks(decode: Any, src: np.ndarray, dst: np.ndarray, frame: tuple[int, list[tuple[int, int, bool]], bool]) -> int:
    """Decode the blocks of ``frame`` (see :func:`frame_blocks`) from ``src`` into ``dst`` in
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
            window = min(done, _WINDOW) if linked else 0
            base = dst.ctypes.data + done
            written = decode(src.ctypes.data + at, base, length, room, base - window, window) if room else -1
            if written < 0:
                return -1
        done += written
    return done


@functools.lru_cache(maxsize=1)
def decoder() -> Any:
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


def header_check(descriptor: bytes) -> int:
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
