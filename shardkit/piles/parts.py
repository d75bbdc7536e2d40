"""Per-pile part files written through a bounded memory buffer, with segments and checksums.

A :class:`PileSink` is what one process writes pass 1 into: M append-only part files in a
staging directory. It remembers which input unit wrote which byte range of each part (so parts
from several processes can be merged back into input order) and the CRC-32 of each part as it
goes (so publishing never reads a part back just to checksum it).
"""

from __future__ import annotations

import os
import zlib
from array import array
from collections.abc import Sequence

import numpy as np

from shardkit import manifest, storage
from shardkit.errors import SampleError

# numbers per row of PileSink.segments: unit, start, end, samples, first key hash, last key hash
SEGMENT = 6


def key_hash(key: str | bytes) -> int:
    """A hash of a sample key that is the same in every process (``hash()`` is salted per process)."""
    return zlib.crc32(key.encode("utf-8", "surrogateescape") if isinstance(key, str) else key)


def duplicate_key(key: str | bytes, pile: int, units: str) -> SampleError:
    """The error for two adjacent samples with one key in ``pile``; ``units`` says where they came from."""
    shown = key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else key
    return SampleError(
        f"pile {pile}: two samples with key {shown!r} ({units}) would be adjacent, and readers would "
        "merge them into one sample: keys must be unique across all inputs. Give each sample a unique "
        "'__key__' in fn (e.g. prefix the input's name), or re-pile shards whose keys restart with "
        "key_prefix='unit' (shardkit pile --key-prefix unit)"
    )


class PileSink:
    """Per-pile append-only part files in one directory, fed through a bounded memory buffer.

    Each pile's part file records which input unit wrote which byte range (``segments``), so
    parts written by several processes can be merged back into input order. ``segments[p]`` is
    a flat ``array('q')`` of ``[unit, start, end, samples, first, last]`` rows (``SEGMENT``
    numbers each), ``first`` and ``last`` being :func:`key_hash` of the range's first and last
    sample keys: compact enough to keep one per (unit, pile) pair for millions of units and to
    send between processes, and enough to find two equal keys meeting where ranges of
    different units are joined. ``crcs[p]`` is the CRC-32 of part file p, kept as it is written
    so publishing never reads it back.

    Two adjacent samples with one key would read back as one sample (WebDataset groups members
    by key), so the sink refuses a sample whose key is the one just appended to the same pile
    by the same unit, before changing anything.

        sink = PileSink("staging/part-0", piles=64, buffer_size=64 << 20)
        sink.add(pile=3, data=member_bytes, unit=0, key="000017")
        sink.flush()
    """

    def __init__(self, directory: str, piles: int, buffer_size: int) -> None:
        self.directory = directory
        storage.makedirs(directory)
        self._chunks: list[list[storage.Chunk]] = [[] for _ in range(piles)]
        self._buffered = 0
        self._maps = 0
        self._limit = buffer_size
        self.counts = [0] * piles
        self.sizes = [0] * piles
        self.crcs = [0] * piles
        self.segments: list[array[int]] = [array("q") for _ in range(piles)]
        self._last: list[str | None] = [None] * piles

    def part(self, pile: int) -> str:
        return os.path.join(self.directory, f"{pile:06d}.part")

    def _record(self, pile: int, unit: int, nbytes: int, samples: int, first: int, last: int) -> None:
        start = self.sizes[pile]
        seg = self.segments[pile]
        if seg and seg[-6] == unit and seg[-4] == start:
            seg[-4] = start + nbytes
            seg[-3] += samples
            seg[-1] = last
        else:
            seg.extend((unit, start, start + nbytes, samples, first, last))
        self.sizes[pile] = start + nbytes
        self.counts[pile] += samples

    def add(self, pile: int, data: bytes, unit: int, key: str) -> None:
        """Append one sample's bytes (its key is ``key``) to ``pile``.

        ``unit`` labels the segment; a negative one (a single writer) is not named in errors.

        Raises:
            SampleError: the sample just appended to ``pile`` by ``unit`` has the same key.
        """
        seg, last = self.segments[pile], self._last[pile]
        start, end = self.sizes[pile], self.sizes[pile] + len(data)
        if seg and seg[-6] == unit and seg[-4] == start:
            if key == last:
                raise duplicate_key(key, pile, f"both from input unit {unit}" if unit >= 0 else "written one after the other")
            seg[-4] = end
            seg[-3] += 1
        else:
            if last is not None:
                seg[-1] = key_hash(last)  # the range before is complete: its last key is known
            seg.extend((unit, start, end, 1, key_hash(key), 0))
        # the last key's hash is filled in when the range ends (a new one starts, or flush)
        self._last[pile] = key
        self._chunks[pile].append(data)
        # checksummed now, while the bytes just made are still in the CPU cache
        self.crcs[pile] = manifest.checksum(data, self.crcs[pile])
        self.sizes[pile] = end
        self.counts[pile] += 1
        self._buffered += len(data)
        if self._buffered >= self._limit:
            self.flush()

    def extend(
        self, unit: int, piles: np.ndarray, chunks: Sequence[storage.Chunk], sizes: np.ndarray, keys: np.ndarray, *, mapped: bool = False
    ) -> None:
        """Add every sample of one unit at once: ``chunks[i]`` (``sizes[i]`` bytes, key ``keys[i]``) goes to ``piles[i]``.

        ``keys`` is an array of UTF-8 keys (numpy bytes). The chunks may be views into a larger
        buffer; it stays alive until the next flush. ``mapped``: that buffer is a memory map,
        which holds a file descriptor while it lives; the sink flushes after ``MAX_MAPS`` of
        them, whatever ``buffer_size`` is.

        Raises:
            SampleError: two samples of the unit with one key would be adjacent in a pile.
        """
        ends = _pile_ends(unit, piles, keys)
        queues, crcs, checksum = self._chunks, self.crcs, manifest.checksum
        # in input order the source is read front to back: the checksum streams through memory
        for chunk, pile in zip(chunks, piles.tolist(), strict=True):
            queues[pile].append(chunk)
            crcs[pile] = checksum(chunk, crcs[pile])
        counts = np.bincount(piles, minlength=len(queues))
        totals = np.bincount(piles, weights=sizes, minlength=len(queues))
        for pile, (first, last) in ends.items():
            before = self._last[pile]
            if before is not None:  # a range add() wrote comes before: complete it
                self.segments[pile][-1] = key_hash(before)
                self._last[pile] = None
            self._record(pile, unit, int(totals[pile]), int(counts[pile]), key_hash(first), key_hash(last))
        self._buffered += int(sizes.sum())
        self._maps += mapped
        if self._buffered >= self._limit or self._maps >= MAX_MAPS:
            self.flush()

    def _seal(self) -> None:
        """Fill in the last key hash of each range :meth:`add` is writing (it may go on after)."""
        for pile, key in enumerate(self._last):
            if key is not None:
                self.segments[pile][-1] = key_hash(key)

    def flush(self) -> None:
        """Append the buffered bytes to the part files; ``segments`` is complete after it."""
        self._seal()
        for pile, chunks in enumerate(self._chunks):
            if chunks:
                path = self.part(pile)
                with storage.guard(path, "write", size=sum(map(len, chunks))):
                    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | storage.O_BINARY, 0o644)
                    try:
                        storage.write_chunks(fd, chunks)
                    finally:
                        os.close(fd)
                chunks.clear()
        self._buffered = 0
        self._maps = 0


def _pile_ends(unit: int, piles: np.ndarray, keys: np.ndarray) -> dict[int, tuple[bytes, bytes]]:
    """{pile: (first key, last key)} of one unit's samples; raises if two in a row share a key."""
    order = np.argsort(piles, kind="stable")
    by_pile, by_key = piles[order], keys[order]
    same = (by_pile[1:] == by_pile[:-1]) & (by_key[1:] == by_key[:-1])
    if same.any():
        at = int(np.argmax(same))
        raise duplicate_key(bytes(by_key[at]), int(by_pile[at]), f"both from input unit {unit}")
    starts = np.flatnonzero(np.concatenate([[True], by_pile[1:] != by_pile[:-1]]))
    lasts = np.append(starts[1:], len(order)) - 1
    return {int(by_pile[a]): (bytes(by_key[a]), bytes(by_key[b])) for a, b in zip(starts.tolist(), lasts.tolist(), strict=True)}


# memory maps extend() may keep alive at once, each with an open file descriptor
MAX_MAPS = 64
