"""Read a whole tar shard into memory once, index its samples, and hand them out by number.

This is the read side shared by the loader, re-piling, the eager shuffle and ``verify``: one
sequential read, one walk over the headers, then any sample by index in any order.

    pile = read_pile("data/pile-000003.tar")
    sample = pile.sample(17)   # {"__key__": "...", "jpg": b"...", "cls": b"3"}
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from shardkit import _chain, _layout, _tar, manifest, storage
from shardkit._chain import Chain
from shardkit.errors import CorruptShardError, ManifestError, PileTooLargeError
from shardkit.manifest import PileInfo


class PileData:
    """An in-memory tar shard with its samples indexed.

    Args:
        plain: the :func:`~shardkit._chain.scan` of ``buf`` when it was already computed
            (None: not an archive of plain headers); True scans it here.
        checked: ``buf`` matched the checksum recorded for the whole file, so per-header
            checksums need not be summed again.

    Attributes:
        url: where it was read from (named in every error).
        keys: sample keys in archive order; ``len(pile)`` samples.

    Example:
        pile = PileData("a.tar", open("a.tar", "rb").read())
        sample = pile.sample(0)            # {"__key__": ..., "jpg": b"...", ...}
        get = pile.sampler()               # the same, faster, for many calls
    """

    __slots__ = ("_ends", "_exts", "_fields", "_offsets", "_sampler", "_starts", "buf", "keys", "url")

    def __init__(self, url: str, buf: storage.Buffer, *, checked: bool = False, plain: Chain | bool | None = True) -> None:
        self.url = url
        self.buf = buf
        self._sampler: Callable[[int], dict[str, Any]] | None = None
        if plain is True:
            plain = _chain.scan(buf, checksums=not checked)
        elif plain is False:
            plain = None
        if plain is not None:
            # the common case, vectorized; duplicate extensions are caught by sample()
            found = _layout.groups(plain)
            self.keys, self._starts, self._exts, fields = found.keys, found.starts, found.exts, found.fields
            offsets = plain.heads + _tar.BLOCK
            self._offsets, self._ends = offsets.tolist(), (offsets + plain.sizes).tolist()
        else:
            members = _tar.walk(buf, url)
            self.keys, self._starts, self._exts = _tar.index(members, url)
            self._offsets = members.offsets
            self._ends = [o + n for o, n in zip(members.offsets, members.sizes, strict=True)]
            fields = _repeated(self._exts, len(self.keys))
        # every sample has these fields in this order, no two alike: sampler() can skip checks
        valid = fields is not None and len(set(fields)) == len(fields) and "__key__" not in fields
        self._fields = fields if valid else None
        if self._exts is None and fields is not None and not valid:
            self._exts = list(fields) * len(self.keys)  # sample() reports the duplicate

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        return len(self.buf)

    def _member_exts(self) -> list[str]:
        """Each member's extension (spelled out on first use when all samples share fields)."""
        if self._exts is None:
            self._exts = list(self._fields or ()) * len(self.keys)
        return self._exts

    def sample(self, index: int) -> dict[str, Any]:
        """Sample ``index`` as a WebDataset dict of raw bytes, ``__key__`` included.

        Raises:
            CorruptShardError: the sample has two members of one extension.
        """
        buf, exts, offsets, ends = self.buf, self._member_exts(), self._offsets, self._ends
        lo, hi = self._starts[index], self._starts[index + 1]
        out: dict[str, Any] = {"__key__": self.keys[index]}
        for j in range(lo, hi):
            out[exts[j]] = buf[offsets[j] : ends[j]]
        if len(out) != hi - lo + 1:
            self._duplicate(index)
        return out

    @property
    def uniform(self) -> bool:
        """Every sample has the same fields in the same order, none twice: :meth:`sampler`
        then returns a function that cannot fail."""
        return self._fields is not None

    def sampler(self) -> Callable[[int], dict[str, Any]]:
        """A function equal to :meth:`sample`, specialised for speed when the pile is
        :attr:`uniform` (the field names and each field's byte spans are laid out once, here)."""
        if self._fields is None:
            return self.sample
        if self._sampler is None:  # made once: mix > 1 asks for it in every short block
            width = len(self._fields)
            spans = [(name, self._offsets[f::width], self._ends[f::width]) for f, name in enumerate(self._fields)]
            self._sampler = _sampler(self.keys, self.buf, spans)
        return self._sampler

    def _duplicate(self, index: int) -> None:
        """Raise for sample ``index``: a repeated extension, else a member named '__key__'."""
        lo, hi = self._starts[index], self._starts[index + 1]
        exts = self._member_exts()
        seen: set[str] = set()
        for j in range(lo, hi):
            if exts[j] in seen:
                break
            seen.add(exts[j])
        else:
            j = exts.index("__key__", lo, hi)
        key, head = self.keys[index], self._offsets[j] - _tar.BLOCK
        # only archives of plain headers get here (the careful walk checks while grouping)
        name = bytes(self.buf[head : head + 100]).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        raise CorruptShardError(f"{self.url}: member {j} ({name!r}) at offset {head}: sample {key!r} already has a {exts[j]!r} member")

    def raw_spans(self) -> list[int]:
        """Byte boundaries of each sample's members in ``buf`` (headers included)."""
        sizes = [e - o for o, e in zip(self._offsets, self._ends, strict=True)]
        return _tar.sample_spans(_tar.Members([], self._offsets, sizes, 0), self._starts)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self.keys)):
            yield self.sample(i)


def _repeated(exts: list[str], samples: int) -> tuple[str, ...] | None:
    """The extensions of each sample when every sample has these, in this order."""
    if samples == 0 or len(exts) % samples:
        return None
    pattern = tuple(exts[: len(exts) // samples])
    return pattern if exts == list(pattern) * samples else None


def _sampler(keys: list[str], buf: storage.Buffer, spans: list[tuple[str, list[int], list[int]]]) -> Callable[[int], dict[str, Any]]:
    """``i -> {"__key__": keys[i], name: buf[start[i]:end[i]], ...}``; one, two and three fields
    (most datasets) build the dict in one expression, which is measurably faster per sample."""
    if len(spans) == 1:
        ((f0, a0, b0),) = spans
        return lambda i: {"__key__": keys[i], f0: buf[a0[i] : b0[i]]}
    if len(spans) == 2:
        (f0, a0, b0), (f1, a1, b1) = spans
        return lambda i: {"__key__": keys[i], f0: buf[a0[i] : b0[i]], f1: buf[a1[i] : b1[i]]}
    if len(spans) == 3:
        (f0, a0, b0), (f1, a1, b1), (f2, a2, b2) = spans
        return lambda i: {"__key__": keys[i], f0: buf[a0[i] : b0[i]], f1: buf[a1[i] : b1[i]], f2: buf[a2[i] : b2[i]]}

    def sample(i: int) -> dict[str, Any]:
        out: dict[str, Any] = {"__key__": keys[i]}
        for name, a, b in spans:
            out[name] = buf[a[i] : b[i]]
        return out

    return sample


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
    url: str, buf: storage.Buffer, *, expected: PileInfo | None = None, checked: bool = False, plain: Chain | bool | None = True
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
