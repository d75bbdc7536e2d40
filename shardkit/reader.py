"""Read a whole tar shard into memory once, index its samples, and hand them out by number.

This is the read side shared by the loader, re-piling, the eager shuffle and ``verify``: one
sequential read, one walk over the headers, then any sample by index in any order.

    pile = read_pile("data/pile-000003.tar")
    sample = pile.sample(17)   # {"__key__": "...", "jpg": b"...", "cls": b"3"}
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from shardkit import _tar, manifest, storage
from shardkit._fastwalk import Plain, plain_archive
from shardkit.errors import CorruptShardError, ManifestError, PileTooLargeError
from shardkit.manifest import PileInfo


class PileData:
    """An in-memory tar shard with its samples indexed.

    Args:
        plain: the :func:`~shardkit._fastwalk.plain_archive` index of ``buf`` when it was
            already computed (None: not a plain archive); True computes it here.
        checked: ``buf`` matched the checksum recorded for the whole file, so per-header
            checksums need not be summed again.

    Attributes:
        url: where it was read from (named in every error).
        keys: sample keys in archive order; ``len(pile)`` samples.
    """

    __slots__ = ("_ends", "_exts", "_offsets", "_starts", "buf", "keys", "url")

    def __init__(self, url: str, buf: storage.Buffer, *, checked: bool = False, plain: Plain | bool | None = True) -> None:
        self.url = url
        self.buf = buf
        if plain is True:
            plain = plain_archive(buf, checked=checked)
        elif plain is False:
            plain = None
        layout = plain.layout() if plain is not None else None
        if plain is not None and layout is not None:
            # the common case, vectorized; duplicate extensions are caught by sample()
            self.keys, self._starts, self._exts = layout
            self._offsets = (plain.heads + _tar.BLOCK).tolist()
            self._ends = (plain.heads + _tar.BLOCK + plain.sizes).tolist()
        else:
            members = _tar.walk(buf, url)
            self.keys, self._starts, self._exts = _tar.index(members, url)
            self._offsets = members.offsets
            self._ends = [o + n for o, n in zip(members.offsets, members.sizes, strict=True)]

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        return len(self.buf)

    def sample(self, index: int) -> dict[str, Any]:
        """Sample ``index`` as a WebDataset dict of raw bytes, ``__key__`` included."""
        buf, exts, offsets, ends = self.buf, self._exts, self._offsets, self._ends
        lo, hi = self._starts[index], self._starts[index + 1]
        out: dict[str, Any] = {"__key__": self.keys[index]}
        for j in range(lo, hi):
            out[exts[j]] = buf[offsets[j] : ends[j]]
        if len(out) != hi - lo + 1:
            self._duplicate(index)
        return out

    def sampler(self) -> Callable[[int], dict[str, Any]]:
        """A function equal to :meth:`sample`, specialised for speed when every sample has the
        same fields in the same order (then duplicate fields are ruled out once, here)."""
        n = len(self.keys)
        if n == 0 or len(self._exts) % n:
            return self.sample
        width = len(self._exts) // n
        pattern = tuple(self._exts[:width])
        if len(set(pattern)) != width or "__key__" in pattern or self._exts != list(pattern) * n:
            return self.sample
        keys, buf, offsets, ends = self.keys, self.buf, self._offsets, self._ends

        def sample(index: int) -> dict[str, Any]:
            out: dict[str, Any] = {"__key__": keys[index]}
            j = index * width
            for ext in pattern:
                out[ext] = buf[offsets[j] : ends[j]]
                j += 1
            return out

        return sample

    def _duplicate(self, index: int) -> None:
        lo, hi = self._starts[index], self._starts[index + 1]
        seen: set[str] = set()
        for j in range(lo, hi):
            if self._exts[j] in seen or self._exts[j] == "__key__":
                key = self.keys[index]
                raise CorruptShardError(
                    f"{self.url}: member {j} ('{key}.{self._exts[j]}') at offset {self._offsets[j] - _tar.BLOCK}: sample {key!r} already has a {self._exts[j]!r} member"
                )
            seen.add(self._exts[j])

    def raw_spans(self) -> list[int]:
        """Byte boundaries of each sample's members in ``buf`` (headers included)."""
        sizes = [e - o for o, e in zip(self._offsets, self._ends, strict=True)]
        return _tar.sample_spans(_tar.Members([], self._offsets, sizes, 0), self._starts)

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
    buf = fetch_pile(url, expected=expected, max_bytes=max_bytes, verify=verify)
    return index_pile(url, buf, expected=expected, checked=verify)


def fetch_pile(
    url: str, *, expected: PileInfo | None = None, max_bytes: int | None = None, verify: bool = True, mapped: bool = False
) -> storage.Buffer:
    """The first half of :func:`read_pile`: the checked bytes (size, limit, checksum), not indexed.

    Reading and checksumming release the GIL, so a background thread can do this half while
    another thread indexes the previous pile. ``mapped``: return a read-only memory map of a
    local file (:func:`shardkit.storage.map_bytes`: one copy fewer; slices are ``bytes``).
    """
    if max_bytes is not None or expected is not None:
        nbytes = storage.size(url)
        if max_bytes is not None and nbytes > max_bytes:
            raise PileTooLargeError(
                f"{url}: {nbytes} bytes is over the memory limit max_pile_bytes={max_bytes}; raise the limit or split the piles (shardkit repile --max-pile-bytes)"
            )
        if expected is not None and nbytes != expected.bytes:
            raise CorruptShardError(f"{url}: file is {nbytes} bytes, the manifest says {expected.bytes} (truncated or replaced?)")
    buf = storage.map_bytes(url) if mapped else storage.read_bytes(url)
    if expected is not None:
        if len(buf) != expected.bytes:
            raise CorruptShardError(f"{url}: file is {len(buf)} bytes, the manifest says {expected.bytes}")
        if verify:
            found = manifest.format_checksum(manifest.checksum(buf))
            if found != expected.checksum:
                raise CorruptShardError(
                    f"{url}: checksum is {found}, the manifest says {expected.checksum}: the bytes changed after writing"
                )
    return buf


def index_pile(
    url: str, buf: storage.Buffer, *, expected: PileInfo | None = None, checked: bool = False, plain: Plain | bool | None = True
) -> PileData:
    """The second half of :func:`read_pile`: index the bytes and check the sample count.

    ``checked``: :func:`fetch_pile` verified the bytes against ``expected``'s checksum.
    ``plain``: see :class:`PileData`.
    """
    pile = PileData(url, buf, checked=checked and expected is not None, plain=plain)
    if expected is not None and len(pile) != expected.samples:
        raise ManifestError(f"{url}: holds {len(pile)} samples, the manifest says {expected.samples}")
    return pile


def read_shard(url: str, *, mapped: bool = False) -> storage.Buffer:
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
