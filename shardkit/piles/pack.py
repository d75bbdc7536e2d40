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

from dataclasses import dataclass
from typing import Any

from shardkit import manifest, storage
from shardkit.tar import compression


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
        self.packer = compression.Compressor(pack.codec, level=pack.level)
        self.size = 0
        self.crc = 0

    def write(self, chunk: Any) -> None:
        self._put(self.packer.compress(chunk))

    def finish(self) -> None:
        self._put(self.packer.finish())

    def _put(self, data: bytes) -> None:
        if data:
            self.crc = manifest.checksum(data, self.crc)
            self.size += len(data)
            storage.write_fully(self.fd, data)
