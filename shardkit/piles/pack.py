"""Compress piles as they are written: the codec and level a job uses, and a file end that
compresses a tar on its way to disk while counting both sides.

The codecs themselves are :mod:`shardkit.tar.compression`'s; this module adds what a writer of
piles needs around them: the tar's size and CRC-32 (for the manifest's ``tar_bytes`` and
``tar_checksum``) are the caller's, the compressed file's are counted here.

    pack = Pack.of(options)                      # None: plain tars
    packed = Packed(fd, pack)
    packed.write(chunk); ...; packed.finish()    # then packed.size, packed.crc
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from shardkit import manifest, storage
from shardkit.tar import compression

T = TypeVar("T")
R = TypeVar("R")

# the stop event of the merge a thread works for (see run_stoppable)
_merge = threading.local()


class Stopped(Exception):
    """The merge this thread works for was told to stop; never seen outside the merge."""


def run_stoppable(stop: threading.Event, fn: Callable[[T], R], item: T) -> R:
    """``fn(item)`` in a merge thread that stops at its next chunk once ``stop`` is set."""
    _merge.stop = stop
    try:
        return fn(item)
    finally:
        _merge.stop = None


def check_stop() -> None:
    """Raise :class:`Stopped` if this thread's merge was told to stop: called between chunks and
    before each write, so a stopped merge writes nothing more (the caller does not wait for it)."""
    stop = getattr(_merge, "stop", None)
    if stop is not None and stop.is_set():
        raise Stopped


@dataclass(frozen=True)
class Pack:
    """How piles are compressed as they are assembled: a codec of :mod:`shardkit.tar.compression` and its level."""

    codec: str
    level: int

    @classmethod
    def of(cls, options: Any) -> Pack | None:
        """The packing ``options`` (with ``compression`` and ``level``) ask for, or None."""
        return None if options.compression is None else cls(options.compression, options.level)


class Packed:
    """The writing end of a compressed pile: a tar's bytes in, compressed bytes out to ``fd``,
    their size and CRC-32 counted as they are written."""

    def __init__(self, fd: int, pack: Pack) -> None:
        self.fd = fd
        self.packer = compression.Compressor(pack.codec, level=pack.level, between=check_stop)
        self.size = 0
        self.crc = 0

    def write(self, chunk: Any) -> None:
        check_stop()
        packed = self.packer.compress(chunk)
        check_stop()  # a stop that came while compressing: nothing more reaches the file
        self._put(packed)

    def finish(self) -> None:
        self._put(self.packer.finish())

    def _put(self, data: bytes) -> None:
        if data:
            self.crc = manifest.checksum(data, self.crc)
            self.size += len(data)
            storage.write_fully(self.fd, data)
