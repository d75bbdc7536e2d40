"""Read a whole tar shard into memory once, index its samples, and hand them out by number.

This is the read side shared by the loader, re-piling, the eager shuffle and ``verify``: one
sequential read, one walk over the headers, then any sample by index in any order.

    pile = read_pile("data/pile-000003.tar")
    sample = pile.sample(17)   # {"__key__": "...", "jpg": b"...", "cls": b"3"}
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shardkit import _tar, manifest, storage
from shardkit.errors import CorruptShardError, ManifestError, PileTooLargeError
from shardkit.manifest import PileInfo


class PileData:
    """An in-memory tar shard with its samples indexed.

    Attributes:
        url: where it was read from (named in every error).
        keys: sample keys in archive order; ``len(pile)`` samples.
    """

    __slots__ = ("_fields", "_members", "_starts", "buf", "keys", "url")

    def __init__(self, url: str, buf: bytes) -> None:
        self.url = url
        self.buf = buf
        members = _tar.walk(buf, url)
        self.keys, starts = _tar.group(members, url)
        # per sample: ((ext, start, end), ...), precomputed so handing a sample out is cheap
        fields: list[tuple[tuple[str, int, int], ...]] = []
        names, offsets, sizes = members.names, members.offsets, members.sizes
        for i in range(len(self.keys)):
            lo, hi = starts[i], starts[i + 1]
            entry = []
            for j in range(lo, hi):
                name = names[j]
                dot = name.find(".", name.rfind("/") + 1)
                entry.append((name[dot + 1 :] if dot >= 0 else "", offsets[j], offsets[j] + sizes[j]))
            fields.append(tuple(entry))
        self._fields = fields
        self._members = members
        self._starts = starts

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        return len(self.buf)

    def sample(self, index: int) -> dict[str, Any]:
        """Sample ``index`` as a WebDataset dict of raw bytes, ``__key__`` included."""
        buf = self.buf
        out: dict[str, Any] = {"__key__": self.keys[index]}
        for ext, lo, hi in self._fields[index]:
            out[ext] = buf[lo:hi]
        return out

    def raw_spans(self) -> list[int]:
        """Byte boundaries of each sample's members in ``buf`` (headers included)."""
        return _tar.sample_spans(self._members, self._starts)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self.keys)):
            yield self.sample(i)


def read_pile(url: str, *, expected: PileInfo | None = None, max_bytes: int | None = None, verify: bool = True) -> PileData:
    """Read and index one shard, checking it against its manifest entry when one is given.

    Args:
        expected: the pile's manifest entry; size, checksum (when ``verify``) and sample count
            must match it.
        max_bytes: refuse, before reading, a file larger than this.

    Raises:
        PileTooLargeError, CorruptShardError, ManifestError, DatasetNotFoundError.
    """
    if max_bytes is not None or expected is not None:
        nbytes = storage.size(url)
        if max_bytes is not None and nbytes > max_bytes:
            raise PileTooLargeError(
                f"{url}: {nbytes} bytes is over the memory limit max_pile_bytes={max_bytes}; raise the limit or split the piles (shardkit repile --max-pile-bytes)"
            )
        if expected is not None and nbytes != expected.bytes:
            raise CorruptShardError(f"{url}: file is {nbytes} bytes, the manifest says {expected.bytes} (truncated or replaced?)")
    buf = storage.read_bytes(url)
    if expected is not None:
        if len(buf) != expected.bytes:
            raise CorruptShardError(f"{url}: file is {len(buf)} bytes, the manifest says {expected.bytes}")
        if verify:
            found = manifest.format_checksum(manifest.checksum(buf))
            if found != expected.checksum:
                raise CorruptShardError(
                    f"{url}: checksum is {found}, the manifest says {expected.checksum}: the bytes changed after writing"
                )
    pile = PileData(url, buf)
    if expected is not None and len(pile) != expected.samples:
        raise ManifestError(f"{url}: holds {len(pile)} samples, the manifest says {expected.samples}")
    return pile


def read_shard(url: str, *, mapped: bool = False) -> bytes:
    """The bytes of a tar shard; ``.tar.gz``/``.tgz`` shards are decompressed in memory.

    ``mapped``: a local shard may come back as a read-only memory map (see
    :func:`shardkit.storage.map_bytes`); it reads like bytes.
    """
    buf: Any = storage.map_bytes(url) if mapped else storage.read_bytes(url)
    if url.endswith((".gz", ".tgz")):
        import gzip

        try:
            buf = gzip.decompress(buf)
        except (OSError, EOFError) as e:
            raise CorruptShardError(f"{url}: not valid gzip ({e})") from None
    return buf


def iter_shard(url: str) -> Iterator[dict[str, Any]]:
    """Every sample of a WebDataset tar shard, raw bytes, in archive order.

    ``.tar.gz``/``.tgz`` shards are decompressed in memory.
    """
    yield from PileData(url, read_shard(url))
