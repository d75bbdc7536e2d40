"""Per-pile part files written through a bounded memory buffer, with segments, checksums and key hashes.

A :class:`PileSink` is what one process writes pass 1 into: M append-only part files in a
staging directory. It remembers which input unit wrote which byte range of each part (so parts
from several processes can be merged back into input order), the CRC-32 of each part as it
goes (so publishing never reads a part back just to checksum it), and, in one file beside the
parts (:data:`KEYS`), a 64-bit hash of every sample's key: :func:`~shardkit.piles.unique_keys.check_unique` finds a key
repeated anywhere in the dataset (in one pile or in two) from the hashes of every part, and
reads only the samples whose hashes meet.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardkit import manifest, storage
from shardkit.errors import SampleError
from shardkit.tar.keys import key_hashes, repeated_key, sample_at

# numbers per row of PileSink.segments: unit, start, end, samples
SEGMENT = 4
# what a repeated key's message says after "keys must be unique"
ADVICE = (
    " across all inputs. Give each sample a unique '__key__' (e.g. prefix the input's name), or, for shards "
    "whose keys restart, run again with key_prefix='unit' (--key-prefix unit for shardkit pile and shuffle, key_prefix: unit in a job file)"
)
# the same, for keys already prefixed with their shard's name: only shards named alike still meet
PREFIXED_ADVICE = (
    " across all inputs. Each key starts with its shard's file name (key_prefix='unit'), so two input shards with one "
    "file name (in two folders, or one shard named twice) give their samples the same keys: rename one, or name each shard once"
)


def part_name(pile: int) -> str:
    """The name of pile ``pile``'s part file in a part directory."""
    return f"{pile:06d}.part"


def part_file(directory: str, pile: int) -> str:
    """Pile ``pile``'s part file in the part directory ``directory``."""
    return os.path.join(directory, part_name(pile))


# the file of key hashes in a part directory: 8 bytes a sample, each flush's by pile
KEYS = "keys"
# numbers per row of PileSink.key_runs: the first hash's place in the key file (in hashes), and how many
RUN = 2


def keys_file(directory: str) -> str:
    """The file of key hashes in the part directory ``directory``."""
    return os.path.join(directory, KEYS)


@dataclass(frozen=True)
class Hashes:
    """Where one part file's key hashes are: ``runs`` (``(n, RUN)`` int64) of the key file
    ``path``, in the part's order."""

    path: str
    runs: np.ndarray

    @classmethod
    def of(cls, directory: str, runs: array[int]) -> Hashes:
        return cls(keys_file(directory), np.frombuffer(runs, dtype=np.int64).reshape(-1, RUN))


class PileSink:
    """Per-pile append-only part files in one directory, fed through a bounded memory buffer.

    Each pile's part file records which input unit wrote which byte range (``segments``), so
    parts written by several processes can be merged back into input order. ``segments[p]`` is
    a flat ``array('q')`` of ``[unit, start, end, samples]`` rows (``SEGMENT`` numbers each):
    compact enough to keep one per (unit, pile) pair for millions of units and to send between
    processes. ``crcs[p]`` is the CRC-32 of part file p, kept as it is written so publishing
    never reads it back. One key file for all piles (:func:`keys_file`) holds the 64-bit hash
    of each sample's key, written with the bytes at every flush, pile after pile;
    ``key_runs[p]`` (flat ``[first, count]`` rows, ``RUN`` numbers each) says where pile p's
    are. Memory holds only the hashes of what is buffered, and :func:`~shardkit.piles.unique_keys.check_unique` looks for a
    key repeated anywhere once every part is written. One file, not one a pile: each
    file made costs the disk more than a flush's bytes of a small pile.

        sink = PileSink("staging/part-0", piles=64, buffer_size=64 << 20)
        sink.add(pile=3, parts=[member_bytes], size=len(member_bytes), unit=0, key="000017")
        sink.flush()
    """

    def __init__(self, directory: str, piles: int, buffer_size: int) -> None:
        self.directory = directory
        storage.makedirs(directory)
        # the part directory's store: pass 1 stages on this machine's disk (Store.open_fd)
        self.store = storage.store_for(directory)
        self._chunks: list[list[storage.Chunk]] = [[] for _ in range(piles)]
        self._buffered = 0
        self._maps = 0
        self.limit = buffer_size
        self.counts = [0] * piles
        self.sizes = [0] * piles
        self.crcs = [0] * piles
        self.segments: list[array[int]] = [array("q") for _ in range(piles)]
        self.key_runs: list[array[int]] = [array("q") for _ in range(piles)]
        # hashes in the key file
        self.hashed = 0
        # keys add() appended since the last flush (hashed together), then the hashes to write
        self._keys: list[list[bytes]] = [[] for _ in range(piles)]
        self._hashes: list[list[np.ndarray]] = [[] for _ in range(piles)]
        # key and offset of the last sample add() appended to each pile
        self._last: list[tuple[str, int] | None] = [None] * piles

    def part(self, pile: int) -> str:
        return part_file(self.directory, pile)

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

    def add(self, pile: int, parts: Sequence[storage.Chunk], size: int, unit: int, key: str) -> None:
        """Append one sample's bytes (``parts``, ``size`` bytes in all; its key is ``key``) to
        ``pile``; ``unit`` labels the segment. The parts are held, not copied, until the next
        flush: they must not change meanwhile.

        Raises:
            SampleError: the sample ``unit`` appended to ``pile`` just before has the same key
                (checked before anything changes). Read back, the two would be one sample, and a
                repeat anywhere else is found by :func:`~shardkit.piles.unique_keys.check_unique` reading segments back.
        """
        last, start, seg = self._last[pile], self.sizes[pile], self.segments[pile]
        end = start + size
        if seg and seg[-4] == unit and seg[-2] == start:  # the range goes on (inlined: the hot path)
            if last is not None and last[0] == key:
                n = self.counts[pile]
                said = repeated_key(key, sample_at(n, f"offset {start}"), sample_at(n - 1, f"offset {last[1]}"))
                raise SampleError(f"pile {pile}: {said}{ADVICE}")
            seg[-2] = end
            seg[-1] += 1
        else:
            seg.extend((unit, start, end, 1))
        self.sizes[pile] = end
        self.counts[pile] += 1
        self._last[pile] = (key, start)
        self._keys[pile].append(key.encode("utf-8", "surrogateescape"))
        self._chunks[pile].extend(parts)
        # checksummed now, while the bytes just made are still in the CPU cache
        crc, checksum = self.crcs[pile], manifest.checksum
        for part in parts:
            crc = checksum(part, crc)
        self.crcs[pile] = crc
        self._buffered += size
        if self._buffered >= self.limit:
            self.flush()

    def extend(
        self, unit: int, piles: np.ndarray, chunks: Sequence[storage.Chunk], sizes: np.ndarray, keys: np.ndarray, *, mapped: bool = False
    ) -> None:
        """Add every sample of one unit at once: ``chunks[i]`` (``sizes[i]`` bytes, key ``keys[i]``) goes to ``piles[i]``.

        ``keys`` is an array of UTF-8 keys (numpy bytes). The chunks may be views into a larger
        buffer; it stays alive until the next flush. ``mapped``: that buffer is a memory map,
        which holds a file descriptor while it lives; the sink flushes after ``MAX_MAPS`` of
        them, whatever ``buffer_size`` is.
        """
        queues, crcs, checksum = self._chunks, self.crcs, manifest.checksum
        # in input order the source is read front to back: the checksum streams through memory
        for chunk, pile in zip(chunks, piles.tolist(), strict=True):
            queues[pile].append(chunk)
            crcs[pile] = checksum(chunk, crcs[pile])
        counts = np.bincount(piles, minlength=len(queues))
        totals = np.bincount(piles, weights=sizes, minlength=len(queues))
        hashes = key_hashes(keys)[np.argsort(piles, kind="stable")]  # by pile, in input order within one
        bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
        for pile in np.flatnonzero(counts).tolist():
            self._settle(pile)
            self._last[pile] = None  # a range of this unit's: add() never continues it
            self._hashes[pile].append(hashes[bounds[pile] : bounds[pile + 1]])
            self._record(pile, unit, int(totals[pile]), int(counts[pile]))
        self._buffered += int(sizes.sum())
        self._maps += mapped
        if self._buffered >= self.limit or self._maps >= MAX_MAPS:
            self.flush()

    def _settle(self, pile: int) -> None:
        """Hash the keys :meth:`add` appended to ``pile`` so far, all at once."""
        if self._keys[pile]:
            self._hashes[pile].append(key_hashes(np.array(self._keys[pile], dtype=bytes)))
            self._keys[pile].clear()

    def _settle_all(self) -> None:
        """:meth:`_settle` every pile, hashing all their keys in one call (not one a pile)."""
        piles = [pile for pile, keys in enumerate(self._keys) if keys]
        if not piles:
            return
        hashes = key_hashes(np.array([key for pile in piles for key in self._keys[pile]], dtype=bytes))
        at = 0
        for pile in piles:
            n = len(self._keys[pile])
            self._hashes[pile].append(hashes[at : at + n])
            self._keys[pile].clear()
            at += n

    def flush(self) -> None:
        """Append the buffered bytes to the part files, and their keys' hashes to the key file."""
        self._settle_all()
        self._write_parts()
        self._write_hashes()
        self._buffered = 0
        self._maps = 0

    def _write_parts(self) -> None:
        for pile, chunks in enumerate(self._chunks):
            if chunks:
                _append(self.store, part_name(pile), chunks)
                chunks.clear()

    def _write_hashes(self) -> None:
        """Append every pile's hashes held in memory to the key file, pile after pile."""
        hashes: list[np.ndarray] = []
        at = self.hashed
        for pile, held in enumerate(self._hashes):
            if not held:
                continue
            mine = (held[0] if len(held) == 1 else np.concatenate(held)).astype(HASH, copy=False)
            held.clear()
            runs = self.key_runs[pile]
            if runs and runs[-2] + runs[-1] == at:  # one run for a pile the only one written
                runs[-1] += len(mine)
            else:
                runs.extend((at, len(mine)))
            hashes.append(mine)
            at += len(mine)
        if hashes:
            _append(self.store, KEYS, [np.concatenate(hashes).tobytes()])
            self.hashed = at


def _append(store: storage.Store, name: str, chunks: Sequence[storage.Chunk]) -> None:
    """Append ``chunks`` to the file ``name``; a failure (a full disk...) is a StorageError naming it."""
    with storage.guard(store.url(name), "write", size=sum(map(len, chunks))):
        fd = store.open_fd(name, append=True)
        try:
            storage.write_chunks(fd, chunks)
        finally:
            os.close(fd)


# how a key file stores each hash
HASH = np.dtype("<u8")


# memory maps extend() may keep alive at once, each with an open file descriptor
MAX_MAPS = 64
