"""One epoch's reading: a schedule's piles read ahead, handed out as samples or batches, the position kept.

A loader makes a :class:`Reading` for each iteration; the reading walks the schedule's blocks,
loads each pile before its first block (a background :class:`~shardkit.loading.prefetch.PileReader`
reads the next ones; the epoch's first pile may hand out checked ranges before it is read whole,
:mod:`~shardkit.loading.early`), releases it after its last, and yields raw samples, raw batches
built a field at a time, or what the step (decode, map, collate) makes of them, here or in the
worker processes. It keeps the slice position after the last item yielded, which a state records.
What stays the same for every epoch of a loader is its :class:`Setup`.

    reading = Reading(source, setup(source, options, policy, remote_reads(options)), workers=None, start=0)
    for item in reading.run(schedule, name="shardkit-reader-e0"): ...
    reading.where()          # the slice position after the last item yielded
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from shardkit import storage
from shardkit.errors import Failure, ShardkitError
from shardkit.loading import located, plan
from shardkit.loading.batch import Result, ShardBlock, Step, cut_tasks, raw_batches
from shardkit.loading.decode import Transform
from shardkit.loading.early import EarlyPile
from shardkit.loading.early import lookup as early_lookup
from shardkit.loading.on_error import Policy
from shardkit.loading.options import LoaderOptions
from shardkit.loading.prefetch import PileReader, read_ahead
from shardkit.loading.source import Fetched, Source
from shardkit.tar.shard import Shard
from shardkit.workers import Pool


class Schedule(Protocol):
    """What a rank reads of an epoch, in slice positions ``0 .. len - 1``: a plain dataset's
    :class:`~shardkit.loading.plan.Schedule` or a blend's
    :class:`~shardkit.loading.blend.schedule.BlendSchedule`."""

    def __len__(self) -> int: ...
    def uses(self, start: int = 0) -> list[plan.PileUse]: ...
    def blocks(self, start: int = 0) -> Iterator[plan.Block]: ...
    def take(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class Setup:
    """How a loader reads every epoch, fixed when it is made.

    Attributes:
        ahead: piles read ahead; readers: piles read at once (several from an object store).
        plain: raw samples, no decoding, no batching (the hot path).
        columnar: raw batches with the default collate, built a field at a time.
        views: raw fields as views of the pile in memory.
        located: raw batches' fields from local plain piles as :class:`~shardkit.loading.located.Located`
            (where they lie), for a process that maps the same files (see :meth:`Loader.locate_fields`).
        scratch: the memory compressed piles are decoded into, used again from pile to pile and
            epoch to epoch (fresh memory costs more to touch than the decoding).
    """

    options: LoaderOptions
    policy: Policy
    step: Step
    reads: storage.RemoteReads
    ahead: int
    readers: int
    plain: bool
    columnar: bool
    views: bool
    located: bool = False
    scratch: storage.Scratch = field(default_factory=storage.Scratch, compare=False)


def setup(source: Source, options: LoaderOptions, policy: Policy, reads: storage.RemoteReads) -> Setup:
    """The :class:`Setup` of a loader of ``source`` with ``options`` (rank and world resolved),
    reading an object store's piles with ``reads`` (see :func:`remote_reads`)."""
    o, codecs = options, options.codecs()
    ahead, readers, reads = _read_ahead(source, o, reads)
    return Setup(
        options=o,
        policy=policy,
        step=Step(Transform(codecs, o.map), o.collate, o.batch_size is not None, o.on_error),
        reads=reads,
        ahead=ahead,
        readers=readers,
        plain=codecs is None and o.map is None and o.batch_size is None,
        columnar=codecs is None and o.map is None and o.collate is None and o.batch_size is not None and not o.num_workers,
        views=codecs is None and o.views,
    )


class Reading:
    """One epoch's reading of ``source`` from slice position ``start``; see the module docstring.

    Example:
        reading = Reading(source, loader_setup, workers=None, start=0)
        items = list(reading.run(schedule, name="shardkit-reader-e0"))
    """

    def __init__(self, source: Source, setup: Setup, *, workers: Pool | None, start: int) -> None:
        self.source, self.setup, self.workers = source, setup, workers
        self.position = start
        self.cursor: tuple[int, Iterator[int]] | None = None  # (block end, its index iterator) on the hot path
        self.versions: dict[str, str | None] = {}  # each pile's file version as read, for located fields

    def where(self) -> int:
        """The slice position after the last item yielded."""
        if self.cursor is None:
            return self.position
        end, rest = self.cursor
        return end - operator.length_hint(rest)  # a list iterator knows exactly what is left

    def run(self, sched: Schedule, *, name: str) -> Iterator[Any]:
        """The items of ``sched`` from this reading's start on, its piles read by threads named ``name``."""
        start, s = self.position, self.setup
        uses = sched.uses(start)
        slots = max(1, plan.peak(uses)) + s.ahead
        s.scratch.room(slots + s.readers)  # every pile held or being read at once
        reader: PileReader[int, Fetched] = PileReader(
            [u.pile for u in uses], self._reader(), slots=slots, readers=s.readers, name=name, paused=True
        )
        try:
            blocks = self._blocks(sched, start, uses, reader)
            if s.plain:
                yield from self._samples(blocks)
            elif s.columnar:
                yield from self._columns(blocks, start, len(sched))
            else:
                yield from self._processed(blocks, start, len(sched))
        finally:
            reader.close()

    def _reader(self) -> Callable[[int], Fetched]:
        # the thread maps, checksums and scans headers with numpy (all mostly without the GIL);
        # the consumer finishes the index
        source, o, reads, scratch = self.source, self.setup.options, self.setup.reads, self.setup.scratch
        limit, verify, locate = o.max_pile_bytes, o.verify, self.setup.located

        def read(index: int) -> Fetched:
            # the version is looked at before the read: a file replaced after it is then refused where its fields are
            # cut, never cut from the new file at the old file's offsets
            version = located.version(source.piles[index]) if locate else None
            fetched = source.fetch(index, max_bytes=limit, verify=verify, reads=reads, scratch=scratch)  # type: ignore[arg-type]
            return fetched if version is None else replace(fetched, version=version)

        return read

    def _blocks(self, sched: Schedule, start: int, uses: Sequence[plan.PileUse], reader: PileReader[int, Fetched]) -> Iterator[ShardBlock]:
        """The schedule's blocks with their piles loaded (None where a pile is skipped); each pile
        is released to the reader as soon as the schedule is done with it."""
        resident: dict[int, Shard | None] = {}
        active: list[plan.PileUse] = []
        pulled = 0
        early = None
        try:
            early = self._early(uses, reader)
        finally:
            if early is None:
                reader.resume()
        if early is not None:  # the first pile hands out checked ranges until its whole read is in
            active.append(uses[0])
            resident[uses[0].pile], pulled = early, 1  # type: ignore[assignment]

        def need(pile: int, at: int) -> Shard | None:
            nonlocal pulled
            while pile not in resident:
                if early is not None:
                    early.settle()  # its whole read comes first out of the reader
                item = reader.get()
                if item is None:
                    raise RuntimeError(f"internal error: the pile reader ended before pile {pile}")
                use = uses[pulled]
                pulled += 1
                if use.last < at:
                    # a use no block needed (with mix > 1, at the end of a piece of the slice):
                    # its slot goes back at once, or the next piece's piles could not all load
                    reader.release()
                    continue
                active.append(use)
                resident[use.pile] = self._accept(item, use)
            return resident[pile]

        for block in sched.blocks(start):
            piles = block.piles
            first = int(piles[0])
            if piles[-1] == first and (piles == first).all():
                yield ShardBlock(block.start, block.index.tolist(), [need(first, block.start)])
            else:
                distinct, which = np.unique(piles, return_inverse=True)
                yield ShardBlock(block.start, block.index.tolist(), [need(p, block.start) for p in distinct.tolist()], which.tolist())
            end = block.start + len(piles)
            for use in [u for u in active if u.last < end]:
                active.remove(use)
                if early is not None and resident[use.pile] is early:
                    early.finish()
                del resident[use.pile]
                reader.release()

    def _early(self, uses: Sequence[plan.PileUse], reader: PileReader[int, Fetched]) -> EarlyPile | None:
        """The epoch's first pile as an :class:`EarlyPile` when the dataset's index can check its
        samples one by one (a local plain pile, ``mix=1``, ``on_error="raise"``), else None."""
        o = self.setup.options
        if not uses or o.mix != 1 or o.on_error != "raise":
            return None
        use, pile = uses[0], self.source.piles[uses[0].pile]
        found = early_lookup(self.source.name, self.source.generation, pile.info, pile.url)
        if found is None:
            return None
        return EarlyPile(
            pile.url,
            *found,
            take=reader.get,
            ready=reader.ready,
            accept=lambda item: self._accept(item, use),
            begin=reader.resume,
            views=self.setup.views,
        )

    def _accept(self, item: Fetched | Failure, use: plan.PileUse) -> Shard | None:
        url = self.source.piles[use.pile].url
        if isinstance(item, Failure):
            self.setup.policy.pile(item.exception(), url)
            return None
        try:
            shard = self.source.open(use.pile, item)
            self.versions[url] = item.version
            return shard.as_views() if self.setup.views else shard
        except (ShardkitError, OSError) as e:
            self.setup.policy.pile(e, url)
            return None

    def _samples(self, blocks: Iterator[ShardBlock]) -> Iterator[dict[str, Any]]:
        """The hot path: raw samples, no decoding, no batching. A skipped sample is not yielded."""
        getters: list[Callable[[int], dict[str, Any]]] | None = None
        policy = self.setup.policy
        for block in blocks:
            start, index, shards = block.start, block.index, block.shards
            if all(s is not None and s.uniform for s in shards):
                # nothing here can fail: hand the samples straight through; the position is
                # read off the index iterator (see where)
                rest = iter(index)
                self.cursor = (start + len(index), rest)
                if block.which is None:
                    yield from map(shards[0].sampler(), rest)  # type: ignore[union-attr]
                else:  # mix > 1: positions alternate between piles
                    getters = [s.sampler() for s in shards]  # type: ignore[union-attr]
                    yield from (getters[w](i) for w, i in zip(block.which, rest, strict=True))
            else:
                for n, (shard, i) in enumerate(block.pairs()):
                    sample = policy.sample(shard, i)
                    if sample is not None:
                        self.position = start + n + 1
                        yield sample
                shard = None
            self.position, self.cursor = start + len(index), None
            # drop this block's piles before asking for the next: a pile the plan released must
            # not stay alive here while the reader thread fills its slot
            block = shards = getters = None  # type: ignore[assignment]

    def _columns(self, blocks: Iterator[ShardBlock], start: int, length: int) -> Iterator[dict[str, Any]]:
        """Raw batches with the default collate, in this process: the same batches as
        :meth:`_processed` gives, built a field at a time."""
        batch_size = self.setup.options.batch_size
        assert batch_size is not None
        columns = self._located() if self.setup.located else None
        for end, batch in raw_batches(blocks, self.setup.policy.sample, start=start, length=length, batch_size=batch_size, columns=columns):
            self.position = end
            yield batch

    def _located(self) -> Callable[[Any, list[int]], dict[str, Any] | None]:
        """A pile's columns with the fields of a local plain pile left where they lie (see
        :mod:`shardkit.loading.located`); values elsewhere, and until an early pile is read whole."""

        def take(shard: Any, index: list[int]) -> dict[str, Any] | None:
            found = self.versions.get(shard.url)
            spans = shard.spans(index) if found is not None else None
            return shard.columns(index) if spans is None else located.located_columns(shard.url, found, spans)  # type: ignore[arg-type]

        return take

    def _processed(self, blocks: Iterator[ShardBlock], start: int, length: int) -> Iterator[Any]:
        """What the step makes of the raw samples (decoded, mapped, batched), in order, here or in the workers."""
        s = self.setup
        tasks = cut_tasks(blocks, s.policy.sample, start=start, length=length, batch_size=s.options.batch_size)
        results: Iterator[Result] = self.workers.ordered(tasks) if self.workers is not None else map(s.step, tasks)
        try:
            for result in results:
                s.policy.failed(result.failures)
                for end, item in result.items:
                    self.position = end
                    yield item
        finally:
            close = getattr(results, "close", None)
            if close is not None:
                close()  # collects the tasks still in the workers


def remote_reads(options: LoaderOptions) -> storage.RemoteReads:
    """How a loader reads piles in an object store: ranges at once, and its cache."""
    cache = None
    if options.cache_dir is not None:
        from shardkit.storage.cache import PileCache

        cache = PileCache(options.cache_dir, options.cache_limit)
    return storage.RemoteReads(concurrency=options.remote_concurrency, cache=cache)


def _read_ahead(source: Source, options: LoaderOptions, reads: storage.RemoteReads) -> tuple[int, int, storage.RemoteReads]:
    """(piles read ahead, piles read at once, how each is read): ``prefetch``, else chosen from the
    pile size and where the piles are (see :func:`~shardkit.loading.prefetch.read_ahead`). Piles in an
    object store are read as many at once as are read ahead, sharing ``remote_concurrency`` requests.
    Local compressed piles are decoded two at once by a loader that is not one of several
    DataLoader workers (those already read side by side) where this process may use more than
    one core."""
    remote = bool(source.piles) and not storage.locate(source.piles[0].url)[0].supports_mapping  # the bytes travel
    infos = [p.info for p in source.piles if p.info is not None]
    whole = bool(infos) and len(infos) == len(source.piles)
    largest = max(i.bytes for i in infos) if whole else None
    packed = whole and any(part.compression is not None for i in infos for part in i.parts)
    decoded = packed and not remote and options.worker[1] == 1 and _cores() > 1
    ahead = options.prefetch
    if ahead is None:
        held = max(i.tar_size for i in infos) if decoded else largest  # a decoded pile takes its tar's size
        ahead = read_ahead(
            held, remote=remote, concurrency=options.remote_concurrency, least_range=storage.remote.MIN_RANGE, decoded=decoded
        )
    if not remote:
        return ahead, min(ahead, 2) if decoded else 1, reads
    readers = max(1, ahead)
    return ahead, readers, replace(reads, concurrency=-(-options.remote_concurrency // readers))


def _cores() -> int:
    """The cores this process may run on (its affinity, where the platform says), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1
