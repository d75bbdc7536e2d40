"""Read a whole tar shard into memory once, index its samples, and hand them out by number.

One sequential read (a ``.tar.zst`` or ``.tar.gz`` is decompressed in memory), one pass over the headers, then
any sample by index in any order. This is the read side of every shard shardkit touches: the
loader's piles, re-piling, the eager shuffle and ``verify`` all go through :class:`Shard`.

    shard = Shard("a.tar", read_shard("a.tar"))
    sample = shard.sample(17)   # {"__key__": "...", "jpg": b"...", "cls": b"3"}
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from shardkit import storage
from shardkit.errors import CorruptShardError
from shardkit.tar import compression, index, scan
from shardkit.tar.keys import refuse_repeat
from shardkit.tar.scan import BLOCK, Chain
from shardkit.tar.walk import walk
from shardkit.tar.write import TRAILER

Sample = dict[str, Any]

log = logging.getLogger(__name__)
# shards already said to lack their end-of-archive marker (a loader reads a plain shard every epoch)
_UNENDED: set[str] = set()
_UNENDED_LOCK = threading.Lock()


class Spans(NamedTuple):
    """Samples of one shard field by field, as bounds: field ``name``'s value of the ``j``-th
    sample is ``buf[starts[j]:ends[j]]`` (see :meth:`Shard.spans`)."""

    keys: list[str]
    buf: storage.Buffer
    fields: list[tuple[str, np.ndarray, np.ndarray]]


class Layout:
    """A shard's index without its bytes: keys, each sample's members (``starts``), their
    extensions and byte bounds (numpy, compact while it is kept), and the field-by-field bounds
    made on first use. Shards made from one layout share it and never change it, so a shard read
    again from the same bytes (checked against the same manifest entry) reuses it instead of
    scanning its headers and indexing them again (see :mod:`shardkit.loading.layouts`).
    """

    __slots__ = ("arrays", "ends", "exts", "fields", "heads", "keys", "offsets", "starts")

    def __init__(
        self,
        keys: list[str],
        starts: list[int],
        exts: list[str] | None,
        fields: list[str] | None,
        heads: np.ndarray,
        offsets: np.ndarray,
        ends: np.ndarray,
    ) -> None:
        self.keys, self.starts, self.exts, self.fields = keys, starts, exts, fields
        self.heads, self.offsets, self.ends = heads, offsets, ends
        self.arrays: list[tuple[str, np.ndarray, np.ndarray]] | None = None  # Shard.spans, made on first use

    @property
    def nbytes(self) -> int:
        """About the memory it holds, a little over: a sample's key and start as Python objects,
        its members' bounds in numpy (154 bytes a sample of two fields and a 9-character key,
        measured with tracemalloc; this says 177), and each member's field name where the
        samples' fields differ."""
        exts = 0 if self.exts is None else 60 * len(self.exts)  # samples whose fields differ: a name a member
        return 16 + sum(map(len, self.keys)) + 88 * len(self.keys) + 40 * len(self.offsets) + exts


class Shard:
    """An in-memory tar shard with its samples indexed.

    Args:
        url: where it was read from (named in every error).
        buf: the archive's bytes (``bytes`` or a read-only memory map).
        chain: the :func:`~shardkit.tar.scan.scan` of ``buf`` when the caller already made it
            (a background thread can); None walks it member by member; left out, it is made here.
        checked: ``buf`` matched a checksum of the whole file, so header checksums need not be
            summed again.
        layout: the :attr:`layout` of a shard of these same bytes: nothing is scanned or
            indexed (nor checked: it was when the layout was made).
        unique: refuse a key that names two samples (a shard whose members of one key are not
            adjacent): for shards no writer of shardkit's checked. One comparison a sample when
            keys increase, as numbered ones do; a hash and a sort otherwise (about 5% of
            indexing a shard, measured).

    Attributes:
        keys: sample keys in archive order; ``len(shard)`` samples. The list is shared with the
            shard's :attr:`layout` and every shard made from it: read it, never change it.

    Example:
        shard = Shard("a.tar", open("a.tar", "rb").read())
        sample = shard.sample(0)            # {"__key__": ..., "jpg": b"...", ...}
        get = shard.sampler()               # the same, faster, for many calls
    """

    __slots__ = (
        "_data",
        "_ends",
        "_exts",
        "_fields",
        "_heads",
        "_layout",
        "_offsets",
        "_sampler",
        "_spans",
        "_starts",
        "buf",
        "keys",
        "url",
    )

    _UNSET: Any = object()

    def __init__(
        self,
        url: str,
        buf: storage.Buffer,
        *,
        chain: Chain | Any | None = _UNSET,
        checked: bool = False,
        unique: bool = False,
        layout: Layout | None = None,
    ) -> None:
        self.url = url
        self.buf = buf
        self._data: storage.Buffer | memoryview = buf  # what fields are sliced from (see as_views)
        self._sampler: Callable[[int], Sample] | None = None
        self._spans: list[tuple[str, list[int], list[int]]] | None = None
        if layout is not None:  # the index of these same bytes, made before
            self._layout = layout
            self.keys, self._starts, self._exts, self._fields = layout.keys, layout.starts, layout.exts, layout.fields
            self._heads, self._offsets, self._ends = layout.heads, layout.offsets.tolist(), layout.ends.tolist()
            return
        if chain is Shard._UNSET:
            chain = scan.scan(buf, checksums=not checked)
        if chain is not None:  # the common case, vectorized
            rows, lengths, heads, sizes = chain.rows, chain.lengths, chain.heads, chain.sizes
        else:
            members = walk(buf, url)
            rows, lengths = index.name_rows(members.names, width=None)
            heads = np.asarray(members.offsets, dtype=np.int64) - BLOCK
            sizes = np.asarray(members.sizes, dtype=np.int64)
        found = index.groups(rows, lengths)  # duplicate extensions are caught by sample()
        self.keys, self._starts, self._exts, fields = found.keys, found.starts, found.exts, found.fields
        self._heads = heads
        if unique:
            refuse_repeat(url, found.key_bytes(), lambda i: int(heads[self._starts[i]]))
        offsets = heads + BLOCK
        ends = offsets + sizes
        self._offsets, self._ends = offsets.tolist(), ends.tolist()
        # every sample has these fields in this order, no two alike: sampler() can skip checks
        valid = fields is not None and len(set(fields)) == len(fields) and "__key__" not in fields
        self._fields = fields if valid else None
        if self._exts is None and fields is not None and not valid:
            self._exts = list(fields) * len(self.keys)  # sample() reports the duplicate
        self._layout = Layout(self.keys, self._starts, self._exts, self._fields, heads, offsets, ends)

    @property
    def layout(self) -> Layout:
        """The index without the bytes: a :class:`Shard` of the same bytes made from it skips the
        header scan and the index (see ``layout=``)."""
        return self._layout

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

    def sample(self, i: int) -> Sample:
        """Sample ``i`` as a WebDataset dict of raw bytes, ``__key__`` included.

        Raises:
            CorruptShardError: the sample has two members of one extension.
        """
        buf, exts, offsets, ends = self._data, self._member_exts(), self._offsets, self._ends
        lo, hi = self._starts[i], self._starts[i + 1]
        out: Sample = {"__key__": self.keys[i]}
        for j in range(lo, hi):
            out[exts[j]] = buf[offsets[j] : ends[j]]
        if len(out) != hi - lo + 1:
            self._duplicate(i)
        return out

    @property
    def uniform(self) -> bool:
        """Every sample has the same fields in the same order, none twice: :meth:`sampler`
        then returns a function that cannot fail."""
        return self._fields is not None

    def sampler(self) -> Callable[[int], Sample]:
        """A function equal to :meth:`sample`, specialised for speed when the shard is
        :attr:`uniform` (the field names and each field's byte spans are laid out once, here)."""
        if self._fields is None:
            return self.sample
        if self._sampler is None:  # made once: mix > 1 asks for it in every short block
            self._sampler = _sampler(self.keys, self._data, self._field_spans())
        return self._sampler

    def _field_spans(self) -> list[tuple[str, list[int], list[int]]]:
        """Each field's name, start offsets and end offsets, one entry a sample (uniform shards)."""
        assert self._fields is not None
        if self._spans is None:
            width = len(self._fields)
            self._spans = [(name, self._offsets[f::width], self._ends[f::width]) for f, name in enumerate(self._fields)]
        return self._spans

    def columns(self, index: list[int]) -> dict[str, list[Any]] | None:
        """Samples ``index`` field by field, ``{"__key__": [keys], field: [values], ...}``: what
        collating their :meth:`sample` dicts gives, built a field at a time. None when the shard
        is not :attr:`uniform` (then the samples must be checked one by one)."""
        if self._fields is None:
            return None
        keys, data = self.keys, self._data
        picked = index.tolist() if isinstance(index, np.ndarray) else index  # Python ints index lists several times faster
        out: dict[str, list[Any]] = {"__key__": [keys[i] for i in picked]}
        for name, starts, ends in self._field_spans():
            out[name] = [data[starts[i] : ends[i]] for i in picked]
        return out

    def spans(self, index: list[int]) -> Spans | None:
        """Samples ``index`` field by field as byte bounds in :attr:`buf`: what :meth:`columns`
        slices, left unsliced (for a reader that maps the same file itself). None when the shard
        is not :attr:`uniform`."""
        if self._fields is None:
            return None
        layout = self._layout
        if layout.arrays is None:
            starts, ends, width = layout.offsets, layout.ends, len(self._fields)
            layout.arrays = [(name, starts[f::width], ends[f::width]) for f, name in enumerate(self._fields)]
        at = np.asarray(index, dtype=np.intp)
        keys = self.keys
        return Spans([keys[i] for i in at.tolist()], self.buf, [(name, a[at], b[at]) for name, a, b in layout.arrays])

    def as_views(self) -> Shard:
        """Hand out fields as read-only ``memoryview`` slices of the shard's buffer from now on,
        instead of copies; each view keeps the whole buffer alive while it is held. Returns self."""
        self._data = memoryview(self.buf).toreadonly()
        self._sampler = None
        return self

    def check(self) -> None:
        """Check every sample (what :meth:`sample` checks as each is read), at once.

        Raises:
            CorruptShardError: a sample has two members of one extension.
        """
        if self._fields is None:
            for i in range(len(self.keys)):
                self.sample(i)

    def sample_offsets(self) -> list[int]:
        """The offset of each sample's first header in the archive."""
        return self._heads[self._starts[:-1]].tolist() if self.keys else []

    def _duplicate(self, i: int) -> None:
        """Raise for sample ``i``: a repeated extension, else a member named '__key__'."""
        lo, hi = self._starts[i], self._starts[i + 1]
        exts = self._member_exts()
        seen: set[str] = set()
        for j in range(lo, hi):
            if exts[j] in seen:
                break
            seen.add(exts[j])
        else:
            j = exts.index("__key__", lo, hi)
        key, head = self.keys[i], int(self._heads[j])
        name = bytes(self.buf[head : head + 100]).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if index.split_name(name)[0] != key:  # a long name behind a pax header
            name = f"{key}.{exts[j]}"
        raise CorruptShardError(f"{self.url}: member {j} ({name!r}) at offset {head}: sample {key!r} already has a {exts[j]!r} member")

    def __iter__(self) -> Iterator[Sample]:
        for i in range(len(self.keys)):
            yield self.sample(i)


def _sampler(keys: list[str], buf: storage.Buffer | memoryview, spans: list[tuple[str, list[int], list[int]]]) -> Callable[[int], Sample]:
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

    def sample(i: int) -> Sample:
        out: Sample = {"__key__": keys[i]}
        for name, a, b in spans:
            out[name] = buf[a[i] : b[i]]
        return out

    return sample


def read_shard(url: str, *, mapped: bool = False) -> storage.Buffer:
    """The bytes of a tar shard; a compressed one (``.tar.zst``, ``.tar.gz``, ``.tgz``) is
    decompressed in memory (see :mod:`shardkit.tar.compression`).

    ``mapped``: a local shard may come back as a read-only memory map (see
    :func:`shardkit.storage.map_bytes`); it reads like bytes.

    Raises:
        CorruptShardError: a compressed shard whose data is not its codec's, or is truncated or
            corrupt; a shard named as a plain tar whose bytes are compressed.
    """
    buf: Any = storage.map_bytes(url) if mapped else storage.read_bytes(url)
    codec = compression.from_name(url)
    if codec is None and (found := compression.sniff(buf)) is not None:
        # the codec is taken from the name, so `gzip -c a.tar > b.tar` would otherwise fail in the
        # tar walk as a header truncated at offset 0, which points at the wrong fault
        stem = url.rsplit("/", 1)[-1]
        stem = stem[:-4] if stem.lower().endswith(".tar") else stem
        raise CorruptShardError(
            f"{url}: at offset 0: expected a tar header, found {found} data (its magic bytes); "
            f"a compressed shard is read by its name: name it {stem}.tar{compression.SUFFIX[found]}"
        )
    tar = buf if codec is None else compression.decompress(buf, codec, url)
    _check_ends(url, tar, codec)
    return tar


def _check_ends(url: str, tar: storage.Buffer, codec: str | None = None) -> None:
    """Refuse an empty file; warn (once per shard and process) about one without the two zero
    blocks that end a tar archive. Every tool that writes tars ends them so, and the loader
    and pile read such a file up to its last whole member: a download or copy cut short at a
    member's end would otherwise lose the rest of the shard without a word.

    Raises:
        CorruptShardError: the file holds no byte at all.
    """
    if len(tar) == 0:
        what = "an empty file (0 bytes)" if codec is None else f"its {codec} data holds no byte of tar"
        raise CorruptShardError(
            f"{url}: {what}; expected a tar archive, which holds at least its end-of-archive marker (a download or copy cut short?)"
        )
    if len(tar) >= len(TRAILER) and tar[len(tar) - len(TRAILER) :] == TRAILER:
        return
    if len(tar) % BLOCK or tar[257:262] != b"ustar":  # not cut where a member ends, or no tar: the walk names the fault
        return
    with _UNENDED_LOCK:
        if url in _UNENDED:
            return
        _UNENDED.add(url)
    log.warning(
        "%s: no end-of-archive marker (two zero blocks) after its last member, at offset %d: the file may have been cut "
        "short (an interrupted download or copy); its whole members are read, anything after them is not there",
        url,
        len(tar),
    )


def iter_shard(url: str) -> Iterator[Sample]:
    """Every sample of a WebDataset tar shard, raw bytes, in archive order.

    Compressed shards (``.tar.zst``, ``.tar.gz``) are decompressed in memory. A key that names two samples (its
    members are not adjacent) is refused, as :func:`shardkit.pile` refuses it.
    """
    yield from Shard(url, read_shard(url), unique=True)
