"""Per-pile part files written through a bounded memory buffer, with segments and checksums.

A :class:`PileSink` is what one process writes pass 1 into: M append-only part files in a
staging directory. It remembers which input unit wrote which byte range of each part (so parts
from several processes can be merged back into input order) and the CRC-32 of each part as it
goes (so publishing never reads a part back just to checksum it).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence

import numpy as np

from shardkit import manifest

Buffer = bytes | bytearray | memoryview


class PileSink:
    """Per-pile append-only part files in one directory, fed through a bounded memory buffer.

    Each pile's part file records which input unit wrote which byte range (``segments``), so
    parts written by several processes can be merged back into input order. ``segments[p]`` is
    a flat ``array('q')`` of ``[unit, start, end, samples]`` quads: compact enough to keep one
    per (unit, pile) pair for millions of units and to send between processes. ``crcs[p]`` is
    the CRC-32 of part file p, kept as it is written so publishing never reads it back.

        sink = PileSink("staging/part-0", piles=64, buffer_size=64 << 20)
        sink.add(pile=3, data=member_bytes, unit=0)
        sink.flush()
    """

    def __init__(self, directory: str, piles: int, buffer_size: int) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self._chunks: list[list[Buffer]] = [[] for _ in range(piles)]
        self._buffered = 0
        self._maps = 0
        self._limit = buffer_size
        self.counts = [0] * piles
        self.sizes = [0] * piles
        self.crcs = [0] * piles
        self.segments: list[array[int]] = [array("q") for _ in range(piles)]

    def part(self, pile: int) -> str:
        return os.path.join(self.directory, f"{pile:06d}.part")

    def _record(self, pile: int, unit: int, nbytes: int, samples: int) -> None:
        start = self.sizes[pile]
        seg = self.segments[pile]
        if seg and seg[-4] == unit and seg[-2] == start:
            seg[-2] = start + nbytes
            seg[-1] += samples
        else:
            seg.extend((unit, start, start + nbytes, samples))
        self.sizes[pile] = start + nbytes
        self.counts[pile] += samples

    def add(self, pile: int, data: bytes, unit: int) -> None:
        self._chunks[pile].append(data)
        # checksummed now, while the bytes just made are still in the CPU cache
        self.crcs[pile] = manifest.checksum(data, self.crcs[pile])
        self._record(pile, unit, len(data), 1)
        self._buffered += len(data)
        if self._buffered >= self._limit:
            self.flush()

    def extend(self, unit: int, piles: np.ndarray, chunks: Sequence[Buffer], sizes: np.ndarray, *, mapped: bool = False) -> None:
        """Add every sample of one unit at once: ``chunks[i]`` (``sizes[i]`` bytes) goes to ``piles[i]``.

        The chunks may be views into a larger buffer; it stays alive until the next flush.
        ``mapped``: that buffer is a memory map, which holds a file descriptor while it lives;
        the sink flushes after ``_MAX_MAPS`` of them, whatever ``buffer_size`` is.
        """
        queues, crcs, checksum = self._chunks, self.crcs, manifest.checksum
        # in input order the source is read front to back: the checksum streams through memory
        for chunk, pile in zip(chunks, piles.tolist(), strict=True):
            queues[pile].append(chunk)
            crcs[pile] = checksum(chunk, crcs[pile])
        counts = np.bincount(piles, minlength=len(queues))
        totals = np.bincount(piles, weights=sizes, minlength=len(queues))
        for pile in np.flatnonzero(counts).tolist():
            self._record(pile, unit, int(totals[pile]), int(counts[pile]))
        self._buffered += int(sizes.sum())
        self._maps += mapped
        if self._buffered >= self._limit or self._maps >= _MAX_MAPS:
            self.flush()

    def flush(self) -> None:
        for pile, chunks in enumerate(self._chunks):
            if chunks:
                fd = os.open(self.part(pile), os.O_WRONLY | os.O_APPEND | os.O_CREAT | _O_BINARY, 0o644)
                try:
                    _write_all(fd, chunks)
                finally:
                    os.close(fd)
                chunks.clear()
        self._buffered = 0
        self._maps = 0


_O_BINARY = getattr(os, "O_BINARY", 0)
# memory maps extend() may keep alive at once, each with an open file descriptor
_MAX_MAPS = 64
# writev takes at most IOV_MAX buffers a call (1024 on Linux)
_IOV_MAX = 1024


def _write_all(fd: int, chunks: list[Buffer]) -> None:
    """Append ``chunks`` in order to ``fd``, up to IOV_MAX of them a call."""
    for lo in range(0, len(chunks), _IOV_MAX):
        batch = chunks[lo : lo + _IOV_MAX]
        _write_batch(fd, batch, sum(map(len, batch)))


def _write_batch(fd: int, batch: list[Buffer], size: int) -> None:
    if not hasattr(os, "writev"):
        _write_fully(fd, b"".join(batch))
        return
    done = os.writev(fd, batch)
    if done < size:  # a short write (signal, nearly full disk): finish one buffer at a time
        for chunk in batch:
            if done >= len(chunk):
                done -= len(chunk)
                continue
            _write_fully(fd, memoryview(chunk)[done:])
            done = 0


def _write_fully(fd: int, data: Buffer) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
