"""Hand out a pile's samples before the whole pile is read: each read by range and checked on its own.

A loader starts its epoch on a pile it must read whole (checksum, header scan) before it can
hand out a sample. When the dataset's random-access index (:mod:`shardkit.loading.index`) is
there, it holds each sample's byte bounds and CRC-32: then :class:`EarlyPile` serves the
samples the order asks for one range at a time, each checked against its CRC-32 before it is
handed out, while the background thread reads the pile whole; as soon as that read is in, it
hands out from the pile in memory. The order is the loader's own: only the bytes come sooner.

A sample whose range does not match its CRC-32, or that is not in the simple form
:func:`~shardkit.loading.one_sample.parse` reads, is never handed out from its range: the
pile read whole (checked against the manifest) answers for it, and raises what is wrong.

    found = lookup(root, generation, info, url)        # None: no index with sample checksums
    pile = EarlyPile(url, *found, take=reader.get, accept=open_it)
    pile.sample(17)                                    # a range, checked; later, the pile in memory
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from shardkit import manifest, storage
from shardkit.dataset import layout
from shardkit.errors import CorruptShardError, DatasetNotFoundError, Failure
from shardkit.loading.index import file_checks
from shardkit.loading.one_sample import parse
from shardkit.manifest import PileInfo
from shardkit.tar.shard import Sample, Shard, Spans

log = logging.getLogger(__name__)


def lookup(root: str, generation: int | None, info: PileInfo | None, url: str) -> tuple[storage.Buffer, np.ndarray, np.ndarray] | None:
    """The pile at ``url`` mapped, with its sample bounds and CRC-32s from the stored index of
    ``generation`` of the dataset ``root``; None when that cannot be had cheaply and safely (an
    object store, a compressed or segmented pile, no index, an index of the first version or
    of other bytes, a file of another size than the manifest's). A damaged index is logged and
    passed over: the pile is then read whole first, as without an index.
    """
    if info is None or generation is None or info.compression is not None or info.segments is not None:
        return None
    store, name = storage.locate(url)
    index, index_name = storage.locate(storage.join(root, layout.index_name(generation)))
    if not (store.supports_mapping and index.supports_mapping):
        return None  # the bytes travel: a ranged request costs about what the first range of the whole read does
    where = index.url(index_name)
    if not index.exists(index_name) or index.is_dir(index_name):
        return None
    try:
        data = index.read_whole(index_name)
    except DatasetNotFoundError:
        return None
    try:
        found = file_checks(data, info, where)
    except CorruptShardError as e:
        log.warning("%s: not used to start the first pile early: %s", where, e)
        return None
    if found is None:
        return None
    try:
        buf = store.read_whole(name)
    except DatasetNotFoundError:
        return None  # the whole read says so
    if len(buf) != info.bytes or int(found[0][-1]) > len(buf):
        return None
    return buf, found[0], found[1]


class EarlyPile:
    """A pile's samples, by range until the pile read whole is in, then from it (see the module).

    It stands in for the pile's :class:`~shardkit.tar.shard.Shard` in the loader's blocks.

    Args:
        url: the pile (named in errors).
        buf: its bytes, mapped (pages are read as ranges are asked for).
        bounds: sample ``j`` is ``buf[bounds[j]:bounds[j + 1]]``.
        crcs: the CRC-32 of each sample's bytes.
        take: the pile read whole, checked (blocks until it is in): what the reader thread hands over.
        ready: whether ``take`` would return at once.
        accept: the pile's Shard from what ``take`` returned; raises what is wrong with it.
        begin: start the whole read (called once the first sample is ready: until then the
            read would only compete with it for the CPU).
        views: hand out fields as read-only ``memoryview`` objects.

    Attributes:
        ranged: samples handed out from their range so far.
    """

    def __init__(
        self,
        url: str,
        buf: storage.Buffer,
        bounds: np.ndarray,
        crcs: np.ndarray,
        *,
        take: Callable[[], Any],
        ready: Callable[[], bool],
        accept: Callable[[Any], Shard | None],
        begin: Callable[[], None] = lambda: None,
        views: bool = False,
    ) -> None:
        self.url = url
        self._buf: storage.Buffer | None = buf
        self._bounds, self._crcs = bounds, crcs
        self._take, self._ready, self._accept, self._begin = take, ready, accept, begin
        self._views = views
        self._get: Callable[[int], Sample] | None = None
        self._full: Shard | None = None
        self._done = False  # the reader's result was taken (settled, or finished without it)
        self.ranged = 0

    def __len__(self) -> int:
        return len(self._crcs)

    @property
    def uniform(self) -> bool:
        """True: :meth:`sampler` may be used for every sample (it fails only by raising)."""
        return True

    def sampler(self) -> Callable[[int], Sample]:
        return self.sample

    def as_views(self) -> EarlyPile:
        self._views = True
        return self

    def sample(self, i: int) -> Sample:
        """Sample ``i``: from its range, checked, while the whole pile is not in; then from the pile."""
        if self._get is None:
            if not self._ready():
                found = self._ranged(i)
                if found is not None:
                    return found
            self.settle()
            assert self._get is not None
        return self._get(i)

    def columns(self, index: list[int]) -> dict[str, list[Any]] | None:
        """The pile's :meth:`~shardkit.tar.shard.Shard.columns` once it is in; None before (then
        the caller takes the samples one by one)."""
        if self._full is None and not (self._ready() and self.settle() is not None):
            return None
        assert self._full is not None
        return self._full.columns(index)

    def spans(self, index: list[int]) -> Spans | None:
        """The pile's :meth:`~shardkit.tar.shard.Shard.spans` once it is in; None before."""
        if self._full is None and not (self._ready() and self.settle() is not None):
            return None
        assert self._full is not None
        return self._full.spans(index)

    def settle(self) -> Shard | None:
        """Wait for the pile read whole and hand out from it from now on (a no-op once done)."""
        if not self._done:
            self._done = True
            self._buf = None
            full = self._accept(self._take())
            if full is None:  # the policy skipped it: nothing more comes from this pile
                raise CorruptShardError(f"{self.url}: the pile could not be read whole after its first samples")
            self._full, self._get = full, full.sampler()
        return self._full

    def finish(self) -> None:
        """The loader is done with this pile: take the reader's result (raising a failure to read
        it, as the pile would have) without indexing it."""
        if not self._done:
            self._done = True
            self._buf = None
            item = self._take()
            if isinstance(item, Failure):
                self._accept(item)

    def _ranged(self, i: int) -> Sample | None:
        """Sample ``i`` read from its range when its bytes match their CRC-32 and it is in the
        simple form, else None."""
        assert self._buf is not None
        lo, hi = int(self._bounds[i]), int(self._bounds[i + 1])
        data = bytes(self._buf[lo:hi])
        if manifest.checksum(data) != int(self._crcs[i]):
            log.debug("%s: sample %d at offset %d does not match its checksum in the index; reading the pile whole", self.url, i, lo)
            return None
        found = parse(data)
        if found is None:
            return None
        if self._views:
            found = {k: v if k == "__key__" else memoryview(v) for k, v in found.items()}
        if not self.ranged:
            self._begin()
        self.ranged += 1
        return found
