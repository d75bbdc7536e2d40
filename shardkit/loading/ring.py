"""Shared memory that DataLoader workers write batches into and the main process reads them from.

A :class:`Ring` is one anonymous shared file (``memfd``) made in the main process before the
workers start, mapped there and inherited (fork) or handed over (spawn, forkserver) by each
worker. Worker ``w`` owns region ``w`` of it: it copies a batch's bytes in, sends only where they
lie through the DataLoader's queue, and the main process copies them out as the batch is
unpickled and marks the batch read. A batch that finds no room in its worker's region (or a
ring that could not be made) travels through the queue as before, so nothing ever waits on
the ring. The file has no name: it goes away with the last process that maps it, a crashed
worker included, and nothing is left behind in ``/dev/shm``.

Room is handed out lowest offset first, so the pages a region touches stay near what its
batches in flight need (at most the DataLoader's ``prefetch_factor`` of them, plus one).

    ring = Ring.make(workers=2)                  # main process, before the workers start
    seq, offset = ring.writer(0).put([[b"abc", b"de"]], 5)   # worker 0 (None: no room now)
    ring.cut(0, offset, np.array([3, 5])); ring.done(0, seq)  # main process: [b"abc", b"de"]
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import struct
import weakref
from collections import deque
from collections.abc import Sequence
from multiprocessing import context
from multiprocessing.reduction import DupFd
from typing import Any

import numpy as np

# room per worker: address space only until a batch touches it (the file is sparse)
REGION = 256 << 20
try:
    _IOV_MAX = max(16, os.sysconf("SC_IOV_MAX"))
except (AttributeError, ValueError, OSError):  # pragma: no cover - a platform without the name
    _IOV_MAX = 16
_HEADER = 4096  # one int64 a worker: how many of its batches the main process has read
_LIVE: weakref.WeakValueDictionary[str, Ring] = weakref.WeakValueDictionary()  # rings of this process, by token


class Ring:
    """One region a worker in a shared file: see the module docstring.

    Args:
        fd: the file (owned: closed with the ring).
        workers: regions.
        token: the ring's name in messages (random).
        region: bytes a region.
    """

    def __init__(self, fd: int, workers: int, token: str, region: int = REGION) -> None:
        self.fd, self.workers, self.token, self.region = fd, workers, token, region
        self.map = mmap.mmap(fd, _HEADER + workers * region)
        self._writers: dict[int, Writer] = {}
        _LIVE[token] = self
        weakref.finalize(self, _close, self.map, fd)

    @classmethod
    def make(cls, workers: int, region: int | None = None) -> Ring | None:
        """A ring for ``workers`` workers of ``region`` bytes each (default :data:`REGION`), or None
        where shared files cannot be made (then batches go through the DataLoader's queue)."""
        region = REGION if region is None else region
        if workers < 1 or workers > _HEADER // 8 or not hasattr(os, "memfd_create"):
            return None
        try:
            fd = os.memfd_create("shardkit-batches", os.MFD_CLOEXEC)
        except OSError:
            return None
        try:
            os.ftruncate(fd, _HEADER + workers * region)
            return cls(fd, workers, secrets.token_hex(8), region)
        except (OSError, ValueError):
            os.close(fd)
            return None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # only to a process being started (the descriptor travels with it); elsewhere, no ring
        if context.get_spawning_popen() is None:
            return _none, ()
        return _rebuild, (DupFd(self.fd), self.workers, self.token, self.region)

    # -- the worker's side ---------------------------------------------------------------------
    def writer(self, worker: int) -> Writer:
        """Worker ``worker``'s writer (one a process)."""
        if worker not in self._writers:
            self._writers[worker] = Writer(self, worker)
        return self._writers[worker]

    # -- the main process's side ---------------------------------------------------------------
    def read(self, worker: int, offset: int, size: int) -> bytes:
        """A copy of ``size`` bytes at ``offset`` of region ``worker``."""
        start = _HEADER + worker * self.region + offset
        return self.map[start : start + size]

    def cut(self, worker: int, offset: int, ends: np.ndarray) -> list[bytes]:
        """Copies of the byte strings that end at ``ends``, packed from ``offset`` of region ``worker``."""
        start = _HEADER + worker * self.region + offset
        stops = (ends + start).tolist()
        return list(map(self.map.__getitem__, map(slice, [start, *stops[:-1]], stops)))

    def count(self, worker: int) -> int:
        """How many of worker ``worker``'s batches the main process has read out of the ring."""
        return int(struct.unpack_from("q", self.map, 8 * worker)[0])

    def done(self, worker: int, seq: int) -> None:
        """Batch ``seq`` of worker ``worker`` was read (its batches are read in the order sent)."""
        struct.pack_into("q", self.map, 8 * worker, seq + 1)


class Writer:
    """Where worker ``worker`` of a ring puts its batches, in the worker's process."""

    def __init__(self, ring: Ring, worker: int) -> None:
        self.ring, self.worker = ring, worker
        self.base = _HEADER + worker * ring.region
        # batches sent and not yet read: (seq, start, end), in the order sent. A fresh process
        # goes on from the count the main process has read: whatever an earlier one sent is gone
        self.sent: deque[tuple[int, int, int]] = deque()
        self.seq = ring.count(worker)

    def _room(self, size: int) -> int | None:
        """The lowest offset with ``size`` bytes free, or None."""
        read = self.ring.count(self.worker)
        sent = self.sent
        while sent and sent[0][0] < read:
            sent.popleft()
        at = 0
        for _, start, end in sorted(sent, key=lambda s: s[1]):
            if start - at >= size:
                return at
            at = max(at, end)
        return at if self.ring.region - at >= size else None

    def put(self, pieces: Sequence[Sequence[bytes | memoryview]], size: int) -> tuple[int, int] | None:
        """Copy ``pieces`` (lists of byte strings, ``size`` bytes in all, one after another) into
        this worker's region: ``(seq, offset)`` of the batch, or None when there is no room for it now."""
        at = self._room(size)
        if at is None:
            return None
        pos = self.base + at
        try:  # one call a field (IOV_MAX pieces at most), the kernel copying each piece
            for field in pieces:
                for i in range(0, len(field), _IOV_MAX):
                    chunk = field[i : i + _IOV_MAX]
                    want = sum(map(len, chunk))
                    if os.pwritev(self.ring.fd, chunk, pos) != want:
                        return None  # short of memory: this batch goes through the queue
                    pos += want
        except OSError:
            return None
        seq = self.seq
        self.sent.append((seq, at, at + size))
        self.seq += 1
        return seq, at


def find(token: str) -> Ring:
    """The ring ``token`` of this process."""
    ring = _LIVE.get(token)
    if ring is None:
        raise RuntimeError(f"a DataLoader batch names shared memory {token} that this process no longer holds")
    return ring


def _rebuild(fd: Any, workers: int, token: str, region: int) -> Ring:
    return Ring(fd.detach(), workers, token, region)


def _none() -> None:
    return None


def _close(m: mmap.mmap, fd: int) -> None:
    with contextlib.suppress(BufferError):  # a view of it is still held: the mapping goes with the process
        m.close()
    os.close(fd)
