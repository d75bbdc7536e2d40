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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from shardkit import storage
from shardkit._util import check_int
from shardkit.codecs import Codecs
from shardkit.loading import elastic
from shardkit.loading.blend.epochs import BlendEpochs
from shardkit.loading.blend.source import BlendedSource
from shardkit.loading.elastic import Phase
from shardkit.loading.epochs import Epochs, PileEpochs, rank_ranges, step_keys
from shardkit.loading.on_error import LoaderStats, Policy
from shardkit.loading.options import LoaderOptions, resolve_world
from shardkit.loading.reading import Reading, Schedule, remote_reads, setup
from shardkit.loading.source import Source, SourceLike, resolve
from shardkit.option_fields import from_call
from shardkit.workers import Pool

log = logging.getLogger(__name__)


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
        rank, world = resolve_world(options.rank, options.world_size)
        self.options = replace(options, rank=rank, world_size=world)
        self.stats = LoaderStats()
        policy = Policy(self.options.on_error, self.stats)
        if not isinstance(source, Source):
            storage.use(source, self.options.storage_options)
        reads = remote_reads(self.options)
        # a plain shard that cannot even be counted is a pile the policy skips (0 samples)
        source = source if isinstance(source, Source) else resolve(source, skip=policy.pile)
        self._setup = setup(source, self.options, policy, reads)
        self._epochs: Epochs = BlendEpochs(source, self.options) if isinstance(source, BlendedSource) else PileEpochs(source, self.options)
        self._epoch = 0
        self._start = 0
        self._done: tuple[Phase, ...] = ()  # phases of the epoch read before a change of world size
        self._running: int | None = None  # epoch of the iteration in progress (or abandoned)
        self._running_done: tuple[Phase, ...] = ()
        self._reading: Reading | None = None  # the iteration in progress (or abandoned)
        self._active: weakref.ref[Iterator[Any]] | None = None
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
        epoch = self._epoch if epoch is None else epoch
        done = self._done_in(epoch) if done is None else tuple(done)
        return step_keys(self._epochs, self.options, step=step, epoch=epoch, done=done, workers=workers, reads=self._setup.reads)

    @property
    def samples_per_epoch(self) -> int:
        """Samples (positions) this rank reads per epoch, padding included: in an epoch resumed
        on another world size, those of its slice of what was left."""
        epoch = self._epoch if self._running is None else self._running
        return elastic.length(rank_ranges(self.source.rest, self._done_in(epoch), self.options))

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
        self._stop_active()
        if self._workers is not None and self._workers.broken:
            self._workers.terminate()
            self._workers = None
        if self.options.num_workers and self._workers is None:
            # start the processes before the reader thread exists: forking copies no thread state
            step = self._setup.step
            self._workers = Pool(self.options.num_workers, lambda k: step, name="shardkit-worker")
        gen = self._run(self._epoch, self._start, self._done)
        self._active = weakref.ref(gen)
        return gen

    def _run(self, epoch: int, start: int, done: tuple[Phase, ...]) -> Iterator[Any]:
        reading = Reading(self.source, self._setup, workers=self._workers, start=start)
        self._running, self._reading, self._start, self._running_done, self._done = epoch, reading, 0, done, ()
        skipped = self.stats.skipped_samples
        yield from reading.run(self._schedule(epoch, done), name=f"shardkit-reader-e{epoch}")
        if self.stats.skipped_samples > skipped:
            log.warning("epoch %d: skipped %d samples (on_error=%r)", epoch, self.stats.skipped_samples - skipped, self.options.on_error)
        self._epoch, self._running, self._reading, self._running_done = epoch + 1, None, None, ()

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this rank is: the position after the last item yielded, as a small JSON-able dict.

        Taken between batches, it lets a new loader on the same data and options yield exactly
        the rest of the epoch. Ranks move in step, so every rank's state is the same and any one
        of them resumes every rank, with the same world size and batch size or others (see
        :meth:`load_state_dict`). A blend's state also holds each source's position.
        """
        if self._running is not None and self._reading is not None:
            epoch, position, done = self._running, self._reading.where(), self._running_done
        else:
            epoch, position, done = self._epoch, self._start, self._done
        return self._epochs.state(epoch, position, done)

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
        the latest is, while g's files exist; the next :func:`loader` reads the latest.

        Raises:
            ConfigError: the state is malformed, or was taken on other data or with options that
                change the order (each difference is named).
            DatasetNotFoundError: the state's generation is gone (its files were deleted).
        """
        generation = self._epochs.pins(state)
        if generation is not None:
            self._stop_active()
            self._epochs = self._epochs.at_generation(generation)
        resume = self._epochs.resume(state)
        self._stop_active()
        self._epoch, self._start, self._done, self._running = resume.epoch, resume.position, resume.done, None

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
