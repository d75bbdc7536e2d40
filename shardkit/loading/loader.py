"""The loader: epoch plan -> pile prefetch -> in-pile order -> decode -> map -> batch, resumable.

Each epoch reads the piles in the order of :mod:`shardkit.plan`; a background thread reads
the next pile while the current one is handed out (small piles in an object store: several
threads, several piles), so at most ``1 + prefetch`` piles (``mix + 1
+ prefetch`` with ``mix > 1``) are in memory per rank. ``num_workers`` processes decode, map
and collate while the reader stays in the main process. The order does not depend on
``num_workers`` or the world size, every rank yields the same count (of batches, even when
``on_error`` skips samples or piles), and ``state_dict()`` resumes mid-epoch exactly. Local
piles are memory-mapped while in use: replace pile files (as shardkit does), never truncate one
in place under a running loader. When the dataset has its random-access index, the epoch's
first pile hands out samples as ranges checked against the index's CRC-32s before it is read
whole (:mod:`shardkit.loading.early`).

    with shardkit.loader("data/", batch_size=256, seed=0) as loader:
        for epoch in range(10):
            loader.set_epoch(epoch)
            for batch in loader: ...
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from shardkit import storage
from shardkit._util import check_int
from shardkit.codecs import Codecs
from shardkit.errors import ConfigError, Failure, ShardkitError
from shardkit.loading import elastic, plan, turns
from shardkit.loading.batch import Result, ShardBlock, Step, cut_tasks, raw_batches
from shardkit.loading.decode import Transform
from shardkit.loading.early import EarlyPile
from shardkit.loading.early import lookup as early_lookup
from shardkit.loading.elastic import Phase
from shardkit.loading.on_error import LoaderStats, Policy
from shardkit.loading.options import LoaderOptions, resolve_world
from shardkit.loading.prefetch import PileReader, read_ahead
from shardkit.loading.source import Fetched, Source, SourceLike, at_generation, resolve
from shardkit.loading.state import Resume, check_state, make_state, pinned_generation
from shardkit.option_fields import from_call
from shardkit.tar.shard import Shard
from shardkit.workers import Pool

log = logging.getLogger(__name__)


class Loader:
    """Iterate a pile dataset (or any WebDataset shards) epoch by epoch; see :func:`loader`.

    Example:
        loader = shardkit.loader("data/", batch_size=32)
        state = loader.state_dict()       # between batches; JSON-able
        shardkit.loader("data/", batch_size=32).load_state_dict(state)
    """

    def __init__(self, source: SourceLike | Source, options: LoaderOptions) -> None:
        rank, world = resolve_world(options.rank, options.world_size)
        self.options = replace(options, rank=rank, world_size=world)
        self.stats = LoaderStats()
        self._policy = Policy(self.options.on_error, self.stats)
        if not isinstance(source, Source):
            storage.use(source, self.options.storage_options)
        self._reads = _remote_reads(self.options)
        # a plain shard that cannot even be counted is a pile the policy skips (0 samples)
        self.source = source if isinstance(source, Source) else resolve(source, skip=self._policy.pile)
        self._ahead, self._readers, self._reads = _read_ahead(self.source, self.options, self._reads)
        self._fingerprint = self.source.fingerprint()
        codecs = self.options.codecs()
        self._step = Step(
            Transform(codecs, self.options.map), self.options.collate, self.options.batch_size is not None, self.options.on_error
        )
        o = self.options
        self._plain = codecs is None and o.map is None and o.batch_size is None
        # raw batches with the default collate: built a field at a time (batch.raw_batches)
        self._columnar = codecs is None and o.map is None and o.collate is None and o.batch_size is not None and not o.num_workers
        self._views = codecs is None and o.views
        self._epoch = 0
        self._start = 0
        self._done: tuple[Phase, ...] = ()  # phases of the epoch read before a change of world size
        self._running: int | None = None  # epoch of the iteration in progress (or abandoned)
        self._running_done: tuple[Phase, ...] = ()
        self._position = 0
        self._cursor: tuple[int, Iterator[int]] | None = None  # (block end, its index iterator) on the hot path
        self._active: weakref.ref[Iterator[Any]] | None = None
        self._workers: Pool | None = None
        self._closed = False

    # -- sizes and order ---------------------------------------------------------------------
    def _ranges(self, done: Sequence[Phase]) -> list[elastic.Range]:
        """The global ranges this loader reads of an epoch whose phases ``done`` were read before."""
        o = self.options
        assert o.rank is not None and o.world_size is not None
        rest = self.source.rest(done, world=o.world_size, batch_size=o.batch_size, drop_last=o.drop_last)
        index, workers = o.worker
        return elastic.share(
            rest, world=o.world_size, rank=o.rank, drop_last=o.drop_last, batch_size=o.batch_size, workers=workers, worker=index
        )

    def _schedule(self, epoch: int, done: tuple[Phase, ...] = ()) -> plan.Schedule:
        o = self.options
        assert o.world_size is not None
        return self._over(epoch, done, self._ranges(done), o.world_size, o.batch_size)

    def _over(
        self, epoch: int, done: Sequence[Phase], ranges: Sequence[elastic.Range], world: int, batch_size: int | None
    ) -> plan.Schedule:
        """The schedule reading the global ``ranges`` of ``epoch`` (split by ``world`` ranks of
        ``batch_size`` after the phases ``done``, which a blend's schedule depends on)."""
        o = self.options
        order = plan.EpochOrder(self.source.counts, seed=o.seed, epoch=epoch, shuffle=o.shuffle, mix=o.mix)
        return plan.Schedule.over(order, ranges)

    def _done_in(self, epoch: int) -> tuple[Phase, ...]:
        """The phases read before a change of world size in ``epoch`` (the one being read or resumed)."""
        if self._running is not None:
            return self._running_done if epoch == self._running else ()
        return self._done if epoch == self._epoch else ()

    def keys(self, step: int, *, epoch: int | None = None, num_workers: int = 0, done: Sequence[Phase] | None = None) -> list[list[str]]:
        """The keys of the samples global step ``step`` reads on every rank: ``keys[rank]`` is
        that rank's batch (its sample, unbatched), in order. The ledger of a run.

        Computed from the epoch plan, which depends only on (seed, epoch, piles, options): no
        training run is needed, and only the piles holding those samples are read, for their
        keys. ``epoch`` defaults to the one the loader reads next. It is the plan's order: a
        sample skipped under ``on_error`` is listed. For a run under ``shardkit.torch``, pass
        the DataLoader's ``num_workers``: its workers take turns, and ``step`` counts the
        DataLoader's batches (``ShardkitDataLoader.keys`` does this). An epoch resumed on other
        ranks counts its steps on from before the change.

            loader = shardkit.loader("data/", batch_size=256, world_size=8, rank=0)
            loader.keys(4711, epoch=2)[3]      # the keys rank 3 read at step 4711 of epoch 2

        Args:
            done: the phases of the epoch read before a change of ranks (default: those of the
                state this loader resumed, in its epoch).

        Raises:
            ConfigError: ``step`` or ``epoch`` is not an integer >= 0, or the step is past the
                end of the epoch.
        """
        check_int("step", step, low=0)
        check_int("epoch", epoch, low=0, none=True)
        workers = max(1, check_int("num_workers", num_workers, low=0))
        o = self.options
        assert o.world_size is not None
        epoch = self._epoch if epoch is None else epoch
        done = self._done_in(epoch) if done is None else tuple(done)
        at = turns.locate(
            step,
            rest=self.source.rest,
            done=done,
            world=o.world_size,
            batch_size=o.batch_size,
            workers=workers,
            drop_last=o.drop_last,
        )
        if isinstance(at, int):
            raise ConfigError(f"step: {step} is past the end of the epoch ({at} steps a rank)")
        per = at.batch_size or 1
        names: dict[int, list[str]] = {}
        found = []
        for rank in range(at.world):
            ranges = elastic.share(
                at.rest, world=at.world, rank=rank, drop_last=o.drop_last, batch_size=at.batch_size, workers=at.workers, worker=at.worker
            )
            schedule = self._over(epoch, done[: at.phase], ranges, at.world, at.batch_size)
            piles, index = schedule.take(at.item * per, min((at.item + 1) * per, len(schedule)))
            for pile in set(piles.tolist()) - names.keys():
                names[pile] = self.source.open(pile, self.source.fetch(pile, reads=self._reads)).keys
            found.append([names[p][i] for p, i in zip(piles.tolist(), index.tolist(), strict=True)])
        return found

    @property
    def samples_per_epoch(self) -> int:
        """Samples (positions) this rank reads per epoch, padding included: in an epoch resumed
        on another world size, those of its slice of what was left."""
        epoch = self._epoch if self._running is None else self._running
        return elastic.length(self._ranges(self._done_in(epoch)))

    def __len__(self) -> int:
        """Batches (or samples, unbatched) this rank yields per epoch; equal on every rank."""
        n, b = self.samples_per_epoch, self.options.batch_size
        return n if b is None else -(-n // b)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (as ``DistributedSampler.set_epoch``).

        It starts from the beginning of the epoch, except right after :meth:`load_state_dict` for
        that same epoch: then the next iteration resumes where the state was taken, so the usual
        ``for epoch in range(start, n): loader.set_epoch(epoch)`` loop resumes instead of silently
        restarting. Without ``set_epoch``, each completed epoch moves on to the next.
        """
        check_int("epoch", epoch, low=0)
        resuming = self._running is None and epoch == self._epoch
        self._epoch, self._running = epoch, None
        self._start, self._done = (self._start, self._done) if resuming else (0, ())

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise RuntimeError("this Loader was closed; create a new one with shardkit.loader(...)")
        self._stop_active()
        if self._workers is not None and self._workers.broken:
            self._workers.terminate()
            self._workers = None
        if self.options.num_workers and self._workers is None:
            # start the processes before the reader thread exists: forking copies no thread state
            step = self._step
            self._workers = Pool(self.options.num_workers, lambda k: step, name="shardkit-worker")
        epoch, start, done = self._epoch, self._start, self._done
        gen = self._run(epoch, start, done)
        self._active = weakref.ref(gen)
        return gen

    def _run(self, epoch: int, start: int, done: tuple[Phase, ...]) -> Iterator[Any]:
        self._running, self._position, self._start, self._cursor = epoch, start, 0, None
        self._running_done, self._done = done, ()
        sched = self._schedule(epoch, done)
        uses = sched.uses(start)
        slots = max(1, plan.peak(uses)) + self._ahead
        read = self._reader()
        reader: PileReader[int, Fetched] = PileReader(
            [u.pile for u in uses], read, slots=slots, readers=self._readers, name=f"shardkit-reader-e{epoch}", paused=True
        )
        skipped = self.stats.skipped_samples
        try:
            blocks = self._blocks(sched, start, uses, reader)
            if self._plain:
                yield from self._samples(blocks)
            elif self._columnar:
                yield from self._columns(blocks, start, len(sched))
            else:
                yield from self._processed(blocks, start, len(sched))
        finally:
            reader.close()
        if self.stats.skipped_samples > skipped:
            log.warning("epoch %d: skipped %d samples (on_error=%r)", epoch, self.stats.skipped_samples - skipped, self.options.on_error)
        self._epoch, self._running, self._position, self._cursor, self._running_done = epoch + 1, None, 0, None, ()

    def _reader(self) -> Callable[[int], Fetched]:
        # the thread maps, checksums and scans headers with numpy (all mostly without the GIL);
        # the consumer finishes the index
        source, limit, verify, reads = self.source, self.options.max_pile_bytes, self.options.verify, self._reads
        return lambda index: source.fetch(index, max_bytes=limit, verify=verify, reads=reads)  # type: ignore[arg-type]

    def _blocks(self, sched: plan.Schedule, start: int, uses: list[plan.PileUse], reader: PileReader[int, Fetched]) -> Iterator[ShardBlock]:
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

    def _early(self, uses: list[plan.PileUse], reader: PileReader[int, Fetched]) -> EarlyPile | None:
        """The epoch's first pile as an :class:`EarlyPile` when the dataset's index can check its
        samples one by one (a local plain pile, ``mix=1``, ``on_error="raise"``), else None."""
        o = self.options
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
            views=self._views,
        )

    def _accept(self, item: Fetched | Failure, use: plan.PileUse) -> Shard | None:
        url = self.source.piles[use.pile].url
        if isinstance(item, Failure):
            self._policy.pile(item.exception(), url)
            return None
        try:
            shard = self.source.open(use.pile, item)
            return shard.as_views() if self._views else shard
        except (ShardkitError, OSError) as e:
            self._policy.pile(e, url)
            return None

    def _samples(self, blocks: Iterator[ShardBlock]) -> Iterator[dict[str, Any]]:
        """The hot path: raw samples, no decoding, no batching. A skipped sample is not yielded."""
        getters: list[Callable[[int], dict[str, Any]]] | None = None
        for block in blocks:
            start, index, shards = block.start, block.index, block.shards
            if all(s is not None and s.uniform for s in shards):
                # nothing here can fail: hand the samples straight through; the position is
                # read off the index iterator (see _where)
                rest = iter(index)
                self._cursor = (start + len(index), rest)
                if block.which is None:
                    yield from map(shards[0].sampler(), rest)  # type: ignore[union-attr]
                else:  # mix > 1: positions alternate between piles
                    getters = [s.sampler() for s in shards]  # type: ignore[union-attr]
                    yield from (getters[w](i) for w, i in zip(block.which, rest, strict=True))
            else:
                for n, (shard, i) in enumerate(block.pairs()):
                    sample = self._policy.sample(shard, i)
                    if sample is not None:
                        self._position = start + n + 1
                        yield sample
                shard = None
            self._position, self._cursor = start + len(index), None
            # drop this block's piles before asking for the next: a pile the plan released must
            # not stay alive here while the reader thread fills its slot
            block = shards = getters = None  # type: ignore[assignment]

    def _columns(self, blocks: Iterator[ShardBlock], start: int, length: int) -> Iterator[dict[str, Any]]:
        """Raw batches with the default collate, in this process: the same batches as
        :meth:`_processed` gives, built a field at a time."""
        assert self.options.batch_size is not None
        for end, batch in raw_batches(blocks, self._policy.sample, start=start, length=length, batch_size=self.options.batch_size):
            self._position = end
            yield batch

    def _processed(self, blocks: Iterator[ShardBlock], start: int, length: int) -> Iterator[Any]:
        """What the step makes of the raw samples (decoded, mapped, batched), in order, here or in the workers."""
        tasks = cut_tasks(blocks, self._policy.sample, start=start, length=length, batch_size=self.options.batch_size)
        results: Iterator[Result] = self._workers.ordered(tasks) if self._workers is not None else map(self._step, tasks)
        try:
            for result in results:
                self._policy.failed(result.failures)
                for end, item in result.items:
                    self._position = end
                    yield item
        finally:
            close = getattr(results, "close", None)
            if close is not None:
                close()  # collects the tasks still in the workers

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this rank is: the position after the last item yielded, as a small JSON-able dict.

        Taken between batches, it lets a new loader on the same data and options yield exactly
        the rest of the epoch. Ranks move in step, so every rank's state is the same and any one
        of them resumes every rank, with the same world size and batch size or others (see
        :meth:`load_state_dict`).
        """
        epoch, position, done = self._point()
        return make_state(
            epoch=epoch,
            position=position,
            options=self.options,
            dataset=self._fingerprint,
            samples=self.source.samples,
            done=done,
            generation=self.source.generation,
        )

    def _point(self) -> tuple[int, int, tuple[Phase, ...]]:
        """The epoch, this rank's position in its slice, and the phases read before (what a state records)."""
        if self._running is not None:
            return self._running, self._where(), self._running_done
        return self._epoch, self._start, self._done

    def _where(self) -> int:
        """The slice position after the last item yielded."""
        if self._cursor is None:
            return self._position
        end, rest = self._cursor
        return end - operator.length_hint(rest)  # a list iterator knows exactly what is left

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields the rest of that epoch.

        The state may come from a job with another ``world_size`` or ``batch_size`` (a state of
        any of its ranks): then the rest of the epoch is every sample no rank had read, split
        among this job's ranks in equal shares by the usual rules (``drop_last`` drops what
        does not fill a batch on every rank, or pads by wrapping round), in an order that is a
        pure function of the state. This composes over any number of changes; the state grows
        by a few integers per change.

        A state taken on generation g of a dataset that grows resumes on generation g, whatever
        the latest is, while g's files exist; the next :func:`loader` reads the latest.

        Raises:
            ConfigError: the state is malformed, or was taken on other data or with options that
                change the order (each difference is named).
            DatasetNotFoundError: the state's generation is gone (its files were deleted).
        """
        self._pin(pinned_generation(state))
        src = self.source
        resume = check_state(state, options=self.options, dataset=self._fingerprint, samples=src.samples, name=src.name, rest=src.rest)
        self._resume(resume)

    def _resume(self, resume: Resume) -> None:
        """Read from ``resume`` on: the next iteration yields the rest of its epoch."""
        self._stop_active()
        self._epoch, self._start, self._done, self._running = resume.epoch, resume.position, resume.done, None

    def _pin(self, generation: int | None) -> None:
        """Read generation ``generation`` of the dataset from now on (a state taken on it resumes)."""
        if generation is None or self.source.generation is None or generation == self.source.generation:
            return
        self._stop_active()
        self.source = at_generation(self.source.name, generation)
        self._fingerprint = self.source.fingerprint()
        log.info("%s: reading generation %d, the one the state was taken on", self.source.name, generation)

    # -- lifecycle -------------------------------------------------------------------------
    def _stop_active(self) -> None:
        gen = self._active() if self._active is not None else None
        self._active = None
        if gen is not None:
            gen.close()  # type: ignore[attr-defined]

    def close(self) -> None:
        """Stop the reader thread and worker processes. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop_active()
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown there is nothing left to stop
            self.close()

    def __repr__(self) -> str:
        o = self.options
        return f"<Loader {self.source.name}: {self.source.samples} samples in {len(self.source.piles)} piles, rank {o.rank}/{o.world_size}, epoch {self._epoch}>"


def _remote_reads(options: LoaderOptions) -> storage.RemoteReads:
    """How this loader reads piles in an object store: ranges at once, and its cache."""
    cache = None
    if options.cache_dir is not None:
        from shardkit.storage.cache import PileCache

        cache = PileCache(options.cache_dir, options.cache_limit)
    return storage.RemoteReads(concurrency=options.remote_concurrency, cache=cache)


def _read_ahead(source: Source, options: LoaderOptions, reads: storage.RemoteReads) -> tuple[int, int, storage.RemoteReads]:
    """(piles read ahead, piles read at once, how each is read): ``prefetch``, else chosen from the
    pile size and where the piles are (see :func:`~shardkit.loading.prefetch.read_ahead`). Piles in an
    object store are read as many at once as are read ahead, sharing ``remote_concurrency`` requests."""
    remote = bool(source.piles) and not storage.locate(source.piles[0].url)[0].supports_mapping  # the bytes travel
    sizes = [p.info.bytes for p in source.piles if p.info is not None]
    largest = max(sizes) if sizes and len(sizes) == len(source.piles) else None
    ahead = options.prefetch
    if ahead is None:
        ahead = read_ahead(largest, remote=remote, concurrency=options.remote_concurrency, least_range=storage.remote.MIN_RANGE)
    if not remote:
        return ahead, 1, reads
    readers = max(1, ahead)
    return ahead, readers, replace(reads, concurrency=-(-options.remote_concurrency // readers))


def loader(
    source: SourceLike,
    *,
    options: LoaderOptions | None = None,
    batch_size: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    decode: bool | str | Codecs = True,
    map: Callable[[dict[str, Any]], Any] | None = None,
    num_workers: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    drop_last: bool = True,
    prefetch: int | None = None,
    on_error: str = "raise",
    mix: int = 1,
    max_pile_bytes: int | str | None = None,
    verify: bool = True,
    allow_pickle: bool = False,
    views: bool = False,
    collate: Callable[[list[dict[str, Any]]], Any] | None = None,
    remote_concurrency: int = storage.remote.DEFAULT_CONCURRENCY,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Loader:
    """Read a pile dataset (or WebDataset shards) shuffled, one epoch per iteration.

    Args:
        source: a shardkit dataset directory (``shardkit.json``), or tar shard URLs: a list, a
            glob or a brace pattern (``"shards/train-{000..099}.tar"``); their sample counts are
            found by walking each once (cached per process).
        options: a :class:`~shardkit.LoaderOptions` instead of the keyword options below (not
            both: with ``options``, a keyword other than its default is a ``ConfigError``).
        batch_size: yield batches of this many samples (per rank) instead of single samples:
            ``{"__key__": [keys], field: numpy array or list}``.
        shuffle: permute pile order and in-pile order every epoch; False reads manifest order.
        seed: the order is a pure function of (seed, epoch, dataset).
        decode: True (images -> HWC uint8 numpy), ``"pil"``, False (raw bytes), or a
            :class:`~shardkit.Codecs` registry.
        map: a function applied to each decoded sample.
        num_workers: worker processes for decode, map and collation (0 = in this process);
            the output is identical, in order, whatever the count.
        rank, world_size: default to ``RANK``/``WORLD_SIZE``, else torch.distributed, else 0/1.
        drop_last: True: each rank reads ``N // world_size`` samples and only full batches.
            False: the order is padded by wrapping round to its start to a multiple of
            ``world_size``, and the last batch may be partial (the same size on every rank).
        prefetch: piles read ahead in the background (memory: ``1 + prefetch`` piles, or
            ``mix + 1 + prefetch``). None: 1, or for small piles in an object store as many as
            keep ``remote_concurrency`` requests busy within 256 MiB (piles under 16 MiB are one
            request each, so 8 of them at once by default), read at once.
        on_error: ``"raise"``, or ``"skip"``/``"warn"`` (also logs each) a pile that cannot be
            read, or a sample that is malformed or fails to decode or map; counts in
            ``loader.stats``. Batched, a skip never changes how many batches a rank yields:
            each batch keeps its slot, so a failed sample makes its batch smaller, and a batch
            whose samples all failed is yielded empty: ``collate([])``, by default
            ``{"__key__": []}`` (check ``len(batch["__key__"])``; under DDP every rank must still
            take its step, e.g. with a loss weighted zero). Unbatched, a failed sample is not
            yielded, so a rank may yield fewer than ``len(loader)`` samples: batch here, not
            after the loader, when ranks must stay in step.
        mix: spread each pile over ``mix + 1`` piles' worth of positions, reading from ``mix +
            1`` piles at once (memory ``mix + 1 + prefetch`` piles). The first epoch stays
            exactly uniform; in later epochs pile-mates share a batch again about ``mix ** 2``
            times less often (while that stays well below the number of piles).
        max_pile_bytes: refuse, before reading, a pile larger than this (``"2GiB"``).
        verify: check each pile's checksum against the manifest.
        allow_pickle: decode ``.pyd``/``.pickle`` fields (runs code from the data).
        views: with ``decode=False``, yield raw fields as read-only ``memoryview`` slices of the
            pile in memory instead of ``bytes`` copies (faster for large fields). A view keeps
            its whole pile in memory while it is held: copy (``bytes(view)``) what you keep.
        collate: ``fn(list of samples) -> batch`` instead of the default.
        remote_concurrency: requests in flight at once when piles are read from an object
            store (``s3://``...), shared by the piles read at once; a pile is one request, or
            ranges of at least 8 MiB when it is larger. Each pile's checksum is checked, and a pile whose
            bytes come back wrong is read again before it is an error.
        cache_dir: a local directory where copies of remote piles are kept, so later epochs
            read them from disk; processes and ranks on one machine can share it. Copies are
            checked against the manifest on every read; the source is never touched.
        cache_limit: the most the cache holds (``"200GiB"``); least recently used copies are
            evicted first. A pile larger than the limit is read without caching. Default: no limit.
        storage_options: options for the object store, given to fsspec as they are
            (``{"endpoint_url": ..., "anon": True}``); otherwise its usual environment applies
            (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``...). Never logged or shown.

    Raises:
        ConfigError: an option is invalid (the message names it).
    """
    keywords = {
        "batch_size": batch_size,
        "shuffle": shuffle,
        "seed": seed,
        "decode": decode,
        "map": map,
        "num_workers": num_workers,
        "rank": rank,
        "world_size": world_size,
        "drop_last": drop_last,
        "prefetch": prefetch,
        "on_error": on_error,
        "mix": mix,
        "max_pile_bytes": max_pile_bytes,
        "verify": verify,
        "allow_pickle": allow_pickle,
        "views": views,
        "collate": collate,
        "remote_concurrency": remote_concurrency,
        "cache_dir": os.fspath(cache_dir) if isinstance(cache_dir, os.PathLike) else cache_dir,
        "cache_limit": cache_limit,
        "storage_options": storage_options,
    }
    return Loader(source, from_call(LoaderOptions, options, keywords))
