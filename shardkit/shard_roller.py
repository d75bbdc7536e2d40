"""Write samples' raw tar bytes into fixed-size shards ``shard-000000.tar ...``, each closed and checksummed.

The output side of the eager shuffle (:mod:`shardkit.eager_shuffle`): byte ranges of a mapped
pile go out with ``os.writev``, a shard is cut at ``maxcount`` samples or ``maxsize`` bytes, and
keys that would repeat within a shard, or across two in a row, are refused.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from shardkit import manifest, storage
from shardkit.dataset.layout import shard_name
from shardkit.errors import SampleError
from shardkit.manifest import PileInfo
from shardkit.piles.pack import Pack, Packed
from shardkit.storage import write_chunks
from shardkit.tar import write
from shardkit.tar.keys import first_repeat, repeated_key, sample_at

log = logging.getLogger(__name__)


class ShardRoller:
    """Append samples' raw tar bytes to ``shard-000000.tar, ...``, starting a new shard at the limits.

    Samples are taken many at a time as byte ranges of one buffer (a memory-mapped pile) and
    written with ``os.writev``, so no sample is copied in Python. Each shard is closed with an
    end-of-archive trailer; its size, sample count and CRC-32 are recorded as it is written.
    Given the samples' keys, a shard is refused when two of its samples share one, or when it
    starts with the key the shard before it ends with (a reader of the shards in sequence would
    merge the two): piles hold unique keys, but two piles may not.

    With ``pack``, each shard is compressed whole on its way to disk (``shard-000000.tar.zst``);
    the limits count the tar's bytes.

        roller = ShardRoller("staging/", maxcount=1000, maxsize=None)
        roller.extend(pile_bytes, starts, ends, keys)
        infos = roller.close()
    """

    def __init__(self, directory: str, *, maxcount: int | None, maxsize: int | None, pack: Pack | None = None) -> None:
        self.directory = directory
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.pack = pack
        self.shards: list[PileInfo] = []
        self._fd: int | None = None
        self._packed: Packed | None = None
        self._count = 0
        self._bytes = 0
        self._crc = 0
        # the open shard's keys and sample offsets, and (key, offset) of the last sample before it
        self._keys: list[np.ndarray] = []
        self._offsets: list[np.ndarray] = []
        self._last: tuple[bytes, int] | None = None
        # each finished shard is flushed to disk while the next is written; close() waits for them
        self._flushed = storage.FsyncQueue()

    def extend(self, buf: storage.Buffer, starts: np.ndarray, ends: np.ndarray, keys: np.ndarray | None = None) -> None:
        """Write samples ``buf[starts[i]:ends[i]]`` (members with their headers), in order;
        ``keys[i]`` (numpy bytes) is sample i's key, checked as each shard is finished.

        Raises:
            SampleError: two samples of one output shard have one key, or two side by side
                across a shard boundary.
        """
        sizes = ends - starts
        reach = np.concatenate([[0], np.cumsum(sizes)])  # bytes of samples [0, i) = reach[i]
        done, n = 0, len(sizes)
        while done < n:
            take = self._fitting(reach, done)
            if take == 0:
                self._finish()  # the open shard is full
                continue
            if self._fd is None:
                self._open(int(sizes[done]))
            if keys is not None:
                self._keys.append(keys[done : done + take])
                self._offsets.append(self._bytes + reach[done : done + take] - reach[done])
            self._write(buf, starts[done : done + take], ends[done : done + take])
            done += take

    def _fitting(self, reach: np.ndarray, done: int) -> int:
        """How many of the samples from ``done`` on the open (or a new) shard takes."""
        take = len(reach) - 1 - done
        if self.maxcount is not None:
            take = min(take, self.maxcount - self._count)
        if self.maxsize is not None:
            room = self.maxsize - len(write.TRAILER) - self._bytes
            take = min(take, int(np.searchsorted(reach, reach[done] + room, side="right")) - 1 - done)
        # a new shard takes at least one sample, however large
        return max(take, 0) if self._fd is not None else max(take, 1)

    def _name(self, index: int) -> str:
        return shard_name(index, None if self.pack is None else self.pack.codec)

    def _path(self) -> str:
        """The shard being written (or about to be)."""
        return os.path.join(self.directory, self._name(len(self.shards)))

    def _open(self, first: int) -> None:
        name = self._name(len(self.shards))
        with storage.guard(self._path(), "create"):
            self._fd = storage.open_fd(self._path(), append=False)
        if self.pack is not None:
            self._packed = Packed(self._fd, self.pack)
        if self.maxsize is not None and first + len(write.TRAILER) > self.maxsize:
            log.warning("%s: one sample of %d bytes is over maxsize=%d: it gets a shard of its own", name, first, self.maxsize)

    def _write(self, buf: storage.Buffer, starts: np.ndarray, ends: np.ndarray) -> None:
        assert self._fd is not None
        view = memoryview(buf)
        crc, checksum = self._crc, manifest.checksum
        # a batch of views per writev call: no sample is copied in Python
        for lo in range(0, len(starts), storage.IOV_MAX):
            chunks: list[storage.Chunk] = [
                view[a:b] for a, b in zip(starts[lo : lo + storage.IOV_MAX].tolist(), ends[lo : lo + storage.IOV_MAX].tolist(), strict=True)
            ]
            for chunk in chunks:  # in output order, as a reader of the shard sums them
                crc = checksum(chunk, crc)
            with storage.guard(self._path(), "write", size=sum(map(len, chunks))):
                if self._packed is not None:
                    self._packed.write(b"".join(chunks))  # one call into the codec per batch, not per sample
                else:
                    write_chunks(self._fd, chunks)
        self._crc = crc
        self._count += len(starts)
        self._bytes += int((ends - starts).sum())

    def _refuse_repeats(self) -> None:
        """Raise if a key is in the open shard twice, or starts it where the last one ended."""
        name = self._name(len(self.shards))
        keys, offsets = np.concatenate(self._keys), np.concatenate(self._offsets).tolist()
        pair = first_repeat(keys)
        if pair is not None:
            i, j = pair
            said = repeated_key(bytes(keys[i]), sample_at(i, f"offset {offsets[i]}"), sample_at(j, f"offset {offsets[j]}"))
        elif self._last is not None and len(keys) and bytes(keys[0]) == self._last[0]:
            before = f"the last sample of {self._name(len(self.shards) - 1)} (offset {self._last[1]})"
            said = repeated_key(bytes(keys[0]), sample_at(0, "offset 0"), before)
        else:
            self._last = (bytes(keys[-1]), offsets[-1]) if len(keys) else None
            return
        raise SampleError(
            f"shuffle: {name}: {said} across the inputs. Shards whose keys restart (000000, 000001, ... in every shard) "
            "need --key-prefix unit (key_prefix='unit'), which key_prefix='auto' chooses only when two shards start with one key"
        )

    def _finish(self) -> None:
        assert self._fd is not None
        if self._keys:
            self._refuse_repeats()
            self._keys, self._offsets = [], []
        packed = self._packed
        with storage.guard(self._path(), "write", size=len(write.TRAILER)):
            if packed is not None:
                packed.write(write.TRAILER)
                packed.finish()
            else:
                write_chunks(self._fd, [write.TRAILER])
        os.close(self._fd)
        self._fd, self._packed = None, None
        self._flushed.add(self._path())
        crc = manifest.format_checksum(manifest.checksum(write.TRAILER, self._crc))
        name, size = self._name(len(self.shards)), self._bytes + len(write.TRAILER)
        if packed is None:
            self.shards.append(PileInfo(name=name, samples=self._count, bytes=size, checksum=crc))
        else:
            stored = manifest.format_checksum(packed.crc)
            codec = packed.packer.codec
            info = PileInfo(
                name=name, samples=self._count, bytes=packed.size, checksum=stored, compression=codec, tar_bytes=size, tar_checksum=crc
            )
            self.shards.append(info)
        self._count = self._bytes = self._crc = 0

    def close(self) -> list[PileInfo]:
        """Finish the last shard (an empty input still gives one valid, empty shard) and wait
        until every shard is on disk, before a manifest lists them.

        Raises:
            StorageError: naming the shard the disk could not write.
        """
        if self._fd is None and not self.shards:
            self._open(0)
        if self._fd is not None:
            self._finish()
        self._flushed.finish()
        return self.shards

    def abort(self) -> None:
        """Let the open shard go and wait for the flushes under way (idempotent; after :meth:`close` too)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._flushed.close()
