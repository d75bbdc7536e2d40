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
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from shardkit import storage
from shardkit._util import check_int
from shardkit.loading import elastic, plan
from shardkit.loading.batch import Step
from shardkit.loading.blend.epochs import BlendEpochs
from shardkit.loading.blend.source import BlendedSource
from shardkit.loading.elastic import Phase
from shardkit.loading.epochs import Epochs, PileEpochs, rank_ranges, step_keys
from shardkit.loading.on_error import LoaderStats, Policy
from shardkit.loading.one_generation import one_generation
from shardkit.loading.options import LOADER, LoaderOptions, check_world_kept, resolve_world, world_by_default
from shardkit.loading.position import Place, Position
from shardkit.loading.reading import Reading, Schedule, remote_reads, setup
from shardkit.loading.source import Source, SourceLike, resolve
from shardkit.workers import Pool

log = logging.getLogger(__name__)


class _Iteration:
    """One iteration of a :class:`Loader`: its reading's items once it began, and why it was
    ended before its last item, if it was (a newer iteration began, a state was loaded, the
    loader was closed). Such an iterator raises at its next item instead of ending as if its
    epoch were read: a loop that goes on with it would lose the rest without a word."""

    __slots__ = ("ended", "items", "read_out", "superseded")

    def __init__(self) -> None:
        self.items: Iterator[Any] | None = None
        self.read_out: Callable[[], bool] | None = None  # whether its last item was handed out
        self.superseded = False  # another iteration, a state loaded or close() ended it
        self.ended: str | None = None  # why, when that came before its last item

    def check(self) -> None:
        if self.ended is not None:
            raise RuntimeError(
                f"this iteration of the loader was ended before its last item: {self.ended}. A loader reads one iteration at "
                "a time; take what you need from one before starting the next, or make a second loader for a second order"
            )


class Loader:
    """Iterate a pile dataset (or any WebDataset shards, or a blend) epoch by epoch; see :func:`loader`.

    The loader keeps which epoch is read and where, the worker processes and the lifecycle; each
    iteration is a :class:`~shardkit.loading.reading.Reading`, and what depends on the source
    (each epoch's schedule, the state) is its :class:`~shardkit.loading.epochs.Epochs`.

    Example:
        loader = shardkit.loader("data/", batch_size=32)
        state = loader.state_dict()       # between batches; JSON-able
        shardkit.loader("data/", batch_size=32).load_state_dict(state)
    """

    def __init__(self, source: SourceLike | Source, options: LoaderOptions) -> None:
        self._world_by_default = world_by_default(options.rank, options.world_size)  # checked again when it reads
        rank, world = resolve_world(options.rank, options.world_size)
        self.options = replace(options, rank=rank, world_size=world)
        self.stats = LoaderStats()
        policy = Policy(self.options.on_error, self.stats)
        if not isinstance(source, Source):
            storage.use(source, self.options.storage_options)
        reads = remote_reads(self.options)
        # a plain shard that cannot even be counted is a pile the policy skips (0 samples)
        source = source if isinstance(source, Source) else one_generation(resolve(source, skip=policy.pile), source, self.options)
        self._setup = setup(source, self.options, policy, reads)
        self._epochs = epochs_of(source, self.options)
        self._place = Place()  # which epoch is read next and from where, and the one being read
        self._active: tuple[weakref.ref[Iterator[Any]], _Iteration] | None = None  # the iteration in progress
        self._workers: Pool | None = None
        self._closed = False

    @property
    def source(self) -> Source:
        """What this loader reads: its piles, their counts, where they are."""
        return self._epochs.source

    # -- sizes and order ---------------------------------------------------------------------
    def _schedule(self, epoch: int, done: tuple[Phase, ...] = ()) -> Schedule:
        o = self.options
        assert o.world_size is not None
        return self._epochs.schedule(epoch, done, rank_ranges(self.source.rest, done, o), world=o.world_size, batch_size=o.batch_size)

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
        check_int("epoch", epoch, low=0, high=plan.MOST_EPOCH, none=True)
        workers = max(1, check_int("num_workers", num_workers, low=0))
        epoch = self._place.epoch if epoch is None else epoch
        done = self._place.done_in(epoch) if done is None else tuple(done)
        return step_keys(self._epochs, self.options, step=step, epoch=epoch, done=done, workers=workers, reads=self._setup.reads)

    @property
    def samples_per_epoch(self) -> int:
        """Samples (positions) this rank reads per epoch, padding included: in an epoch resumed
        on another world size, those of its slice of what was left."""
        return elastic.length(rank_ranges(self.source.rest, self._place.done_in(self._place.current), self.options))

    def __len__(self) -> int:
        """Batches (or samples, unbatched) this rank yields per epoch; equal on every rank."""
        n, b = self.samples_per_epoch, self.options.batch_size
        return n if b is None else -(-n // b)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return self._place.epoch

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (as ``DistributedSampler.set_epoch``).

        It starts from the beginning of the epoch, except right after :meth:`load_state_dict` for
        that same epoch: then the next iteration resumes where the state was taken, so the usual
        ``for epoch in range(start, n): loader.set_epoch(epoch)`` loop resumes instead of silently
        restarting. Without ``set_epoch``, each completed epoch moves on to the next. Called while
        an iteration runs, it applies to the next one (a state taken after it names the start of
        ``epoch``); naming the epoch being read changes nothing.
        """
        plan.check_epoch(epoch)
        self._place.set_epoch(epoch)

    def locate_fields(self) -> Loader:
        """From now on, yield raw batches whose fields from local, uncompressed piles are
        :class:`~shardkit.loading.located.Located` (the file and the bounds of each value) instead
        of values: for a DataLoader worker whose main process cuts them from its own map of the
        same files. Only raw batches with the default collate change. Returns self."""
        self._setup = replace(self._setup, located=self._setup.columnar)
        return self

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise RuntimeError("this Loader was closed; create a new one with shardkit.loader(...)")
        check_world_kept(self._world_by_default)
        self._stop_active("a newer iteration of this loader began (iter() or a for loop over it again)")
        self._workers = ready_pool(self._workers, self.options.num_workers, self._setup.step)
        place = self._place
        iteration = _Iteration()
        gen = self._run(place.epoch, place.start, place.done, iteration)
        self._active = (weakref.ref(gen), iteration)
        return gen

    def _run(self, epoch: int, start: int, done: tuple[Phase, ...], iteration: _Iteration) -> Iterator[Any]:
        iteration.check()
        reading = Reading(self.source, self._setup, workers=self._workers, start=start)
        self._place.begin(epoch, done, reading.where)
        skipped = self.stats.skipped_samples
        schedule = self._schedule(epoch, done)
        iteration.read_out = lambda: reading.where() >= len(schedule)
        iteration.items = reading.run(schedule, name=f"shardkit-reader-e{epoch}")
        yield from iteration.items
        iteration.check()  # its items were closed before their end: it must not end as if the epoch were read
        if iteration.superseded:  # ended by another after its last item: it ends, the place is the newer one's
            return
        if self.stats.skipped_samples > skipped:
            log.warning("epoch %d: skipped %d samples (on_error=%r)", epoch, self.stats.skipped_samples - skipped, self.options.on_error)
        self._place.end(epoch)

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this rank is: the position after the last item yielded, as a small JSON-able dict.

        Taken between batches, it lets a new loader on the same data and options yield exactly
        the rest of the epoch. Ranks move in step, so every rank's state is the same and any one
        of them resumes every rank, with the same world size and batch size or others (see
        :meth:`load_state_dict`). A blend's state also holds each source's position.
        """
        o = self.options
        assert o.world_size is not None
        return self._epochs.save(self._place.position(world=o.world_size, batch_size=o.batch_size))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields the rest of that epoch.

        The state may come from a job with another ``world_size`` or ``batch_size`` (a state of
        any of its ranks): then the rest of the epoch is every sample no rank had read, split
        among this job's ranks in equal shares by the usual rules (``drop_last`` drops what
        does not fill a batch on every rank, or pads by wrapping round), in an order that is a
        pure function of the state. This composes over any number of changes; the state grows
        by a few integers per change. (A blend's rest: see
        :meth:`~shardkit.loading.blend.epochs.BlendEpochs.resume`.)

        A state taken on generation g of a dataset that grows resumes on generation g, whatever
        the latest is, while g's files exist (a blend's, each source on its own); the next
        :func:`loader` reads the latest.

        Raises:
            ConfigError: the state is malformed, or was taken on other data or with options that
                change the order (each difference is named).
            DatasetNotFoundError: the state's generation is gone (its files were deleted).
        """
        generation = self._epochs.pins(state)
        # read on the state's generation, and kept only once the state reads well there: a state refused changes nothing
        epochs = self._epochs if generation is None else self._epochs.at_generation(generation)
        position = epochs.load(state)
        self._stop_active("load_state_dict() was called")
        self._epochs = epochs
        self.resume(position)

    def read_state(self, state: Any, *, torch: bool = False) -> Position:
        """The position ``state`` records (a ``shardkit.torch`` dataset's state, with ``torch``),
        checked against this loader's data and options; see :meth:`load_state_dict`."""
        return self._epochs.load(state, torch=torch)

    def resume(self, position: Position) -> None:
        """Continue from ``position`` (a state read back, or a DataLoader worker's share of one):
        settled on this loader's split, the next iteration reads on from its worker's count."""
        index, workers = self.options.worker
        settled = self._epochs.resume(position, workers=workers)
        self._stop_active("the loader was resumed from a state")
        self._place.resume(settled, index)

    # -- lifecycle -------------------------------------------------------------------------
    def _stop_active(self, why: str) -> None:
        """End the iteration in progress, if any, letting go of its piles and reader thread now:
        its iterator raises ``why`` at its next item."""
        if self._active is None:
            return
        ref, iteration = self._active
        self._active = None
        gen = ref()
        if gen is None or gen.gi_frame is None:  # type: ignore[attr-defined]  # dropped, or read to its end
            return
        iteration.superseded = True
        if iteration.read_out is None or not iteration.read_out():  # its last item not yet handed out
            iteration.ended = why
        if iteration.items is not None:
            iteration.items.close()  # type: ignore[attr-defined]

    def close(self) -> None:
        """Stop the reader thread and worker processes, and let go of the memory kept for decoding
        piles. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop_active("the loader was closed")
        if self._workers is not None:
            self._workers.close()
            self._workers = None
        self._setup.scratch.room(0)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown there is nothing left to stop
            self.close()

    def __repr__(self) -> str:
        o = self.options
        return f"<Loader {self.source.name}: {self.source.samples} samples in {len(self.source.piles)} piles, rank {o.rank}/{o.world_size}, epoch {self._place.epoch}>"


def ready_pool(pool: Pool | None, count: int, step: Step) -> Pool | None:
    """The worker processes an iteration decodes in: ``pool``, or a new one in place of a broken
    one (None when ``count`` is 0). Called before the reader thread exists: forking copies no
    thread state."""
    if pool is not None and pool.broken:
        pool.terminate()
        pool = None
    if count and pool is None:
        pool = Pool(count, lambda k: step, name="shardkit-worker")
    return pool


def epochs_of(source: Source, options: LoaderOptions) -> Epochs:
    """The :class:`~shardkit.loading.epochs.Epochs` a reader of ``source`` with ``options`` holds."""
    return BlendEpochs(source, options) if isinstance(source, BlendedSource) else PileEpochs(source, options)


@LOADER
def loader(
    source: SourceLike,
    *,
    options: LoaderOptions | None = None,
    **keywords: Any,
) -> Loader:
    """Read a pile dataset (or WebDataset shards) shuffled, one epoch per iteration.

    Args:
        source: a shardkit dataset directory (``shardkit.json``), or tar shard URLs: a list, a
            glob or a brace pattern (``"shards/train-{000..099}.tar"``); their sample counts are
            found by walking each once (cached per process).
        options: a :class:`~shardkit.LoaderOptions` instead of the keyword options below (not
            both: with ``options``, a keyword other than its default is a ``ConfigError``).

    Raises:
        ConfigError: an option is invalid (the message names it).
    """
    if isinstance(keywords.get("cache_dir"), os.PathLike):
        keywords["cache_dir"] = os.fspath(keywords["cache_dir"])
    return Loader(source, LOADER.options(options, keywords))
