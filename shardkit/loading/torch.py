"""PyTorch adapter: a shardkit loader as an ``IterableDataset`` for DataLoader workers and DDP.

Each DataLoader worker reads its own contiguous share of its rank's slice of the epoch (split on
batch boundaries), so no sample is read twice and every rank yields the same count. Rank and
world size come from the options, ``RANK``/``WORLD_SIZE`` or an initialized torch.distributed.
The epoch and a resume point live in shared memory, so ``set_epoch`` and ``load_state_dict``
in the main process reach the workers, persistent or not. A state resumes on another world
size, batch size or number of DataLoader workers (a blend too): the rest of the epoch is every sample not yet
read, split anew (:mod:`shardkit.loading.elastic`).

    ds = ShardkitDataset("data/", batch_size=64, seed=0)
    dl = ShardkitDataLoader(ds, num_workers=4)      # a DataLoader that counts for state_dict()
    for epoch in range(10):
        ds.set_epoch(epoch)
        for batch in dl: ...
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Generator, Iterator
from dataclasses import replace
from typing import Any

try:
    from torch.utils.data import DataLoader, IterableDataset, default_convert, get_worker_info
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("shardkit.torch needs PyTorch: pip install 'shardkit[torch]'") from e

from shardkit._util import check_int
from shardkit.errors import ConfigError, ShardkitError
from shardkit.loading import plan
from shardkit.loading.blend.source import BlendedSource, resolve_blend
from shardkit.loading.blend.spec import Blend, is_blend
from shardkit.loading.dataloader_arguments import check_arguments, rebatching
from shardkit.loading.handoff import Handoff, SendableViews, convert, taken
from shardkit.loading.loader import Loader
from shardkit.loading.located import Vanished
from shardkit.loading.one_generation import blend_of_first, one_generation
from shardkit.loading.options import LoaderOptions, check_world_kept, resolve_world, world_by_default
from shardkit.loading.ring import Ring
from shardkit.loading.shared_place import SharedPlace
from shardkit.loading.source import Source, SourceLike, resolve
from shardkit.loading.turns import round_robin

__all__ = ["ShardkitDataLoader", "ShardkitDataset", "round_robin"]

log = logging.getLogger(__name__)


def _batched_again(dataset: Any, caller: Any) -> bool:
    """Whether the code that called ``iter(dataset)`` (its frame ``caller``) batches its items again.

    A dataset has no handle on the DataLoader reading it. What shows its batching is the fetcher
    PyTorch makes for an iterable dataset: its ``__init__`` calls ``iter(dataset)``, in the main
    process with ``num_workers=0`` and in each worker otherwise, after setting ``auto_collation``,
    which is true whenever the DataLoader's ``batch_size`` is not None. Looked up by duck typing:
    a caller without those attributes (a plain ``for`` loop, another reader) is not checked.
    """
    fetcher = caller.f_locals.get("self") if caller is not None else None
    return getattr(fetcher, "dataset", None) is dataset and getattr(fetcher, "auto_collation", False) is True


def _hands_off(caller: Any) -> bool:
    """Whether the DataLoader worker whose fetcher (``caller``, as in :func:`_batched_again`) applies
    the default conversion to each item: then items go packed (:class:`~shardkit.loading.handoff.Handoff`),
    which it passes through and which unpickles as the converted item."""
    fetcher = caller.f_locals.get("self") if caller is not None else None
    collate = getattr(fetcher, "collate_fn", None)
    return collate is default_convert or collate is convert


def _raising(error: BaseException) -> Generator[Any, None, None]:
    """An iterator that raises ``error`` when its first item is asked for."""
    raise error
    yield


class ShardkitDataset(IterableDataset):
    """A shardkit dataset for ``torch.utils.data.DataLoader`` (use ``batch_size=None`` there and
    batch here, so batches are formed from the shuffled order).

    Given a ``batch_size`` it yields batches, and a DataLoader that would batch them again
    (PyTorch's default ``batch_size=1`` adds a leading dimension of 1 to every array) is refused
    with a ``ConfigError`` when its iteration starts: use :class:`ShardkitDataLoader` or
    ``DataLoader(ds, batch_size=None)``.

    Args:
        source: what :func:`shardkit.loader` takes: one dataset, or a blend (with ``weights=``
            and ``epoch_size=`` among the options, as there).
        **options: :func:`shardkit.loader` options; ``num_workers`` here means decode processes
            per DataLoader worker and is usually left at 0.

    Epochs: call :meth:`set_epoch` before each epoch, as with ``DistributedSampler``; it reaches
    the DataLoader's workers whether they are persistent or not. An iteration without it reads
    the same epoch again (a warning says so). Inside a :class:`ShardkitDataLoader` loop it applies
    to the next iteration, once every worker of this one has read where to start (see
    :meth:`SharedPlace.wait_for_workers`).

    Resume: :meth:`state_dict` records the epoch and how many items the DataLoader yielded;
    :meth:`load_state_dict` makes the next iteration yield exactly the rest of that epoch. With
    the same world size, batch size and number of DataLoader workers, it is the same order
    (each worker skips what it had given and they take turns where they left off); with others,
    it is every sample no worker of any rank had read, split anew among the ranks and workers
    (equal counts on every rank); a blend's rest is shaped as
    :meth:`shardkit.loading.blend.epochs.BlendEpochs.resume` says.
    With workers, only the DataLoader knows how many items it yielded: use
    :class:`ShardkitDataLoader`, or pass the count to :meth:`state_dict`.

    Example:
        ds = ShardkitDataset("data/", batch_size=32)
        for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
            ...
    """

    def __init__(self, source: SourceLike | Blend, **options: Any) -> None:
        weights, epoch_size = options.pop("weights", None), options.pop("epoch_size", None)
        opts = LoaderOptions.from_dict(options)
        by_default = world_by_default(opts.rank, opts.world_size)  # checked again when it reads (SharedPlace)
        rank, world = resolve_world(opts.rank, opts.world_size)
        self.options = replace(opts, rank=rank, world_size=world)
        # counted once here, not once per worker
        self.source: Source | BlendedSource
        if is_blend(source) or weights is not None or epoch_size is not None:
            self.source = blend_of_first(resolve_blend(Blend(source, weights=weights, epoch_size=epoch_size), self.options), self.options)
        else:
            self.source = one_generation(resolve(source), source, self.options)  # type: ignore[arg-type]  # a Blend was taken above
        self._place = SharedPlace(self.source, self.options, world_by_default=by_default)  # epoch, loaded position: every worker's
        self._yielded = 0  # items this process yielded in its current iteration (num_workers=0)
        # times the next iteration was moved elsewhere (set_epoch to another epoch, load_state_dict,
        # an epoch read again): items a DataLoader yielded before the latest move were of what was read before it
        self._moves = 0
        # (epoch, moves) when this process saw an iteration of that epoch yield its last item: read
        # again with no move in between, the epoch is read whole (see _read_anew)
        self._ended: tuple[int, int] | None = None
        # shared memory the workers of a DataLoader hand batches over in (set by ShardkitDataLoader while it starts them)
        self._ring: Ring | None = None

    # -- epochs --------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` on the next iteration, in every worker (a pending resume of
        that same epoch is kept)."""
        plan.check_epoch(epoch)
        self._place.wait_for_workers(f"set_epoch({epoch})")  # inside a loop: its workers read the epoch before
        if epoch != self._place.epoch:
            self._yielded, self._moves = 0, self._moves + 1
        else:
            self._read_anew()  # the epoch set again once read to its end: its next read is whole
        self._place.set_epoch(epoch)

    def _read_anew(self) -> bool:
        """In the main process, before the epoch is read (or set) again: when this process saw
        its last read yield every item, the next read is of the whole epoch, from its start (a
        position loaded for it was spent), and what was yielded is of the read before; whether so."""
        epoch = self._place.epoch
        if self._ended != (epoch, self._moves):
            return False
        self._place.spend(epoch)
        self._ended, self._yielded, self._moves = None, 0, self._moves + 1
        return True

    def _left(self, workers: int) -> int:
        """Items the next iteration yields, its ``workers`` DataLoader workers together (0: in
        this process), from where it starts (as :meth:`SharedPlace.after` counts them)."""
        place = self._place
        start = place.settle(place.pending(place.epoch), max(1, workers))
        return place.length(start) - start.taken

    @property
    def epoch(self) -> int:
        return self._place.epoch

    def __len__(self) -> int:
        """Batches (or samples) this rank yields per epoch, all workers together; more when the
        rest of a loaded epoch is (a blend's, rounded up to whole batches on another split)."""
        return self._place.most(self._place.workers)

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        caller = sys._getframe(1)
        again = _batched_again(self, caller)
        if again and self.options.batch_size is not None:
            raise rebatching(self.options.batch_size)
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        place = self._place  # read once, at the start: the main process may change it later
        epoch = place.epoch
        if info is None and self._read_anew():  # ShardkitDataLoader does so before its workers start
            _read_again(epoch, "from its start")
        try:
            finished, pending = place.finished(epoch), place.pending(epoch)
            place.workers = info.num_workers if info is not None else 0
            place.rebatched = again and info is not None  # its workers' turns are the DataLoader's batches
            if worker == 0 and finished:  # a plain DataLoader's workers: nothing in the main process saw the end
                _read_again(epoch, "from its start" if pending == place.fresh(epoch) else "from the position load_state_dict() gave")
            handoff = info is not None and _hands_off(caller)
            check_world_kept(place.world_by_default)
            # raw batches handed off are copied as they are packed: the loader need not copy each value first
            borrow = handoff and self._raw_batches()
            loader: Loader | Generator[Any, None, None] = place.worker_loader(pending, worker=worker, workers=workers, views=borrow)
        except ShardkitError as e:  # raised at its first item: a persistent worker raising here would exit
            loader = _raising(e)
        finally:
            if info is not None:
                place.started(worker)  # nothing below reads the place: the main process may move it
        items = self._iterate(loader, epoch, first=worker == 0, main=info is None, left=self._left(0) if info is None else 0)
        if not handoff:
            return items
        ring, views = self._ring, self.options.views
        writer = ring.writer(worker) if ring is not None and worker < ring.workers else None
        # packed as each is pickled for the main process (see Handoff): byte strings into the ring's
        # shared memory where there is room; the loader's memoryviews (borrowed) stand for bytes
        return (Handoff(item, views, writer, borrow and not views) for item in items)

    def _raw_batches(self) -> bool:
        """Whether the items are batches of raw fields, made by the loader's default collate."""
        o = self.options
        return o.batch_size is not None and o.map is None and o.collate is None and o.codecs() is None

    def _iterate(self, loader: Loader | Generator[Any, None, None], epoch: int, *, first: bool, main: bool, left: int) -> Iterator[Any]:
        """The loader's items; in this process (``main``), counted, and the epoch's end noted as
        its last (``left``-th) item is handed out: a loop may take exactly that many and stop."""
        if main:
            self._yielded = 0
        moves = self._moves
        complete = False
        try:
            for item in loader:
                if main and self._moves == moves:  # after a move, what it yields is of what was read before
                    self._yielded += 1
                    if self._yielded == left:
                        self._ended = (epoch, moves)
                yield item
            complete = True
        finally:
            loader.close()
        if first and complete:
            self._place.finish(epoch)
        if main and complete and self._moves == moves:
            self._ended = (epoch, moves)

    # -- the ledger ----------------------------------------------------------------------------
    def keys(self, step: int, *, epoch: int | None = None, num_workers: int = 0) -> list[list[str]]:
        """The keys of the samples DataLoader step ``step`` of ``epoch`` reads on every rank
        (``keys[rank]``), for a DataLoader of ``num_workers`` workers; see :meth:`shardkit.Loader.keys`.

        An epoch resumed from a loaded state counts its steps from the start of the epoch, through
        the phases the state records and then this dataset's ranks, batch size and workers, until
        that epoch is read (or set) again once read to its end: then it is read whole, and counted so.
        ``ShardkitDataLoader.keys`` passes its own ``num_workers``.
        """
        check_int("num_workers", num_workers, low=0)
        place = self._place
        epoch = place.epoch if epoch is None else plan.check_epoch(epoch)
        done = place.settle(place.pending(epoch), max(1, num_workers)).done
        with place.loader(self.options) as loader:
            return loader.keys(step, epoch=epoch, num_workers=num_workers, done=done)

    # -- resume --------------------------------------------------------------------------------
    def state_dict(self, yielded: int | None = None) -> dict[str, Any]:
        """Where the current epoch stands, as a small JSON-able dict.

        Args:
            yielded: items the DataLoader yielded since its current iteration began: needed with
                worker processes (:class:`ShardkitDataLoader` passes it), else counted here.

        Raises:
            RuntimeError: the DataLoader reads in worker processes and ``yielded`` is missing.
        """
        workers = self._place.workers
        check_int("state_dict: yielded", yielded, low=0, none=True)
        if yielded is None:
            if workers > 0:
                raise RuntimeError(
                    f"the DataLoader reads in {workers} worker processes, which this process cannot follow: "
                    "use ShardkitDataLoader, or pass state_dict(yielded=...) (items the DataLoader yielded in this iteration)"
                )
            yielded = self._yielded
        return self._place.epochs.save(self._place.after(yielded), torch=True)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration yield exactly the rest of the epoch ``state`` was taken in.

        The state may come from a job with another world size, batch size or number of
        DataLoader workers (any rank's state: ranks move in step); see the class docstring.
        As a loader's, it resumes on the generation it was taken on (a blend's, each source's).

        Raises:
            ConfigError: the state is malformed, or was taken on other data or with options that
                change the order (each difference is named); for a blend, on other sources or
                shares (the source is named). DatasetNotFoundError: its generation is gone.
        """
        self._place.wait_for_workers("load_state_dict()")
        self._place.load(state)
        self.source = self._place.source
        self._yielded, self._moves = 0, self._moves + 1


class _StartOrFail:
    """A DataLoader's ``worker_init_fn`` run in each worker; when it raises, the worker will
    never read where its iteration starts, so it counts as started: a ``set_epoch`` inside the
    loop then does not wait for it, and the DataLoader raises its error at once (see
    :meth:`SharedPlace.wait_for_workers`)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        try:
            self.inner(worker_id)
        except BaseException:
            info = get_worker_info()
            if info is not None and isinstance(info.dataset, ShardkitDataset):
                info.dataset._place.started(worker_id)
            raise


def _pinning() -> bool:
    """Whether a DataLoader's ``pin_memory=True`` pins here: only where an accelerator is (torch
    warns and skips it elsewhere)."""
    import torch

    accelerator = getattr(torch, "accelerator", None)  # torch 2.6 and later
    return bool(accelerator.is_available() if accelerator is not None else torch.cuda.is_available())


def _read_again(epoch: int, where: str) -> None:
    log.warning("epoch %d is read again %s: call set_epoch() before each epoch (as with DistributedSampler)", epoch, where)


# batches of raw fields each DataLoader worker may have in flight (the DataLoader's default is 2):
# later epochs of ~5 KB samples read 1.06-1.12x faster with 4 on 2 cores, and 8 gained nothing more
RAW_PREFETCH = 4


class ShardkitDataLoader(DataLoader):
    """A ``DataLoader`` over a :class:`ShardkitDataset` that counts the items it yields, so its
    :meth:`state_dict` is exact with worker processes too. ``batch_size`` is None (the dataset
    batches; any other value is a ``ConfigError``, and so are ``drop_last=True``, the dataset's
    option, and ``in_order=False`` with workers, whose turns the order, the state and the ledger
    count: :mod:`shardkit.loading.dataloader_arguments`); every other argument is the DataLoader's.
    Its workers hand raw batches over in shared memory (:mod:`shardkit.loading.ring`) instead
    of through the DataLoader's queue, or as where their fields lie in local plain piles
    (:mod:`shardkit.loading.located`). Holding such batches costs little, so for raw batches
    ``prefetch_factor`` defaults to :data:`RAW_PREFETCH` instead of the DataLoader's 2: a worker
    that stops to take its next pile then has batches queued to cover the pause.

    Example:
        dl = ShardkitDataLoader(ShardkitDataset("data/", batch_size=32), num_workers=2)
        state = dl.state_dict()            # between batches; JSON-able
        dl.load_state_dict(state)          # the next iteration yields the rest of that epoch
    """

    def __init__(self, dataset: ShardkitDataset, **kwargs: Any) -> None:
        if not isinstance(dataset, ShardkitDataset):
            raise ConfigError(f"dataset: expected a ShardkitDataset, got {type(dataset).__name__}")
        check_arguments(dataset.options.batch_size, kwargs)
        # raw fields stay bytes or memoryviews in this process too (default_convert makes a
        # memoryview a list of ints); in workers the batches are packed either way
        kwargs.setdefault("collate_fn", convert)
        if dataset.options.views and kwargs.get("pin_memory") and _pinning():
            # torch's pinning thread rebuilds whatever is no tensor: each memoryview would become a list of ints
            raise ConfigError(
                "ShardkitDataLoader: views=True with pin_memory=True: pinning is for tensors, and it would turn each "
                "memoryview into a list of ints; pass pin_memory=False, or read with views=False"
            )
        if dataset.options.views and kwargs["collate_fn"] not in (convert, default_convert, None):
            kwargs["collate_fn"] = SendableViews(kwargs["collate_fn"])
        if kwargs.get("num_workers", 0) > 0 and dataset._raw_batches():
            kwargs.setdefault("prefetch_factor", RAW_PREFETCH)
        super().__init__(dataset, **kwargs)
        self._yielded = 0
        self._moves = 0  # the dataset's moves when this count began (see ShardkitDataset._moves)
        self._ring: Ring | None = None  # the persistent workers' shared memory
        self._iterations = 0  # iterations begun: an earlier one refuses to go on (see __iter__)

    def __setattr__(self, name: str, value: Any) -> None:
        # given to the constructor or set afterwards, a worker_init_fn that raises marks its worker started
        if name == "worker_init_fn" and value is not None and not isinstance(value, _StartOrFail):
            value = _StartOrFail(value)
        super().__setattr__(name, value)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        dataset: ShardkitDataset = self.dataset  # type: ignore[assignment]
        if dataset._read_anew():  # here, before its workers read where to start
            _read_again(dataset._place.epoch, "from its start")
        self._yielded, self._moves = 0, dataset._moves
        # with persistent workers torch hands every iteration the same iterator, reset: an earlier
        # iteration must not go on reading what the newer one reads (the batches of both would mix)
        shared = self.num_workers > 0 and self.persistent_workers
        self._iterations += 1
        mine = self._iterations
        epoch, left = dataset._place.epoch, dataset._left(self.num_workers)
        ring = self._ring  # held while this iteration runs: its batches are read out of it
        if self.num_workers > 0 and (ring is None or not self.persistent_workers):
            # fresh workers get fresh memory: an earlier iteration's workers may still be writing theirs
            ring = Ring.make(self.num_workers)
            self._ring = ring if self.persistent_workers else None
        dataset._ring = ring  # seen by the workers started (or resumed) here, and only by them
        place = dataset._place
        iteration = place.begin(self.num_workers)  # a set_epoch inside the loop waits until they read where to start
        try:
            try:
                batches = super().__iter__()
            finally:
                dataset._ring = None
            items = taken(batches)
            while True:
                if shared and self._iterations != mine:
                    raise RuntimeError(
                        "this iteration of the ShardkitDataLoader was ended before its last batch: a newer iteration began "
                        "(iter() or a for loop over it again), and with persistent_workers=True both would read from the same "
                        "workers. Take what you need from one iteration before starting the next"
                    )
                try:
                    item = next(items)
                except StopIteration:
                    break
                except Vanished as e:  # cut here, from a file a worker read: the dataset's manifest may say why it went
                    raise e.explained(dataset.source) from None
                self._yielded += 1
                if self._yielded == left:  # its last batch: a loop may take exactly these and stop
                    dataset._ended = (epoch, self._moves)
                yield item
            if self.num_workers > 0:  # every batch yielded here (a worker's own end says only that its share ran out)
                dataset._ended = (epoch, self._moves)
        finally:
            place.end(iteration)

    def state_dict(self) -> dict[str, Any]:
        """The dataset's state after the items this DataLoader yielded (see :meth:`ShardkitDataset.state_dict`)."""
        dataset: ShardkitDataset = self.dataset  # type: ignore[assignment]
        # after set_epoch to another epoch or load_state_dict, what it yielded is of what was read
        # before: counted on the epoch the dataset reads now, it would skip that much of it (all of it
        # when the epoch before was read to its end: a state taken at the top of an epoch named the next)
        yielded = self._yielded if self._moves == dataset._moves else 0
        return dataset.state_dict(yielded=yielded)

    def keys(self, step: int, *, epoch: int | None = None) -> list[list[str]]:
        """The keys of the samples this DataLoader's step ``step`` reads on every rank (see
        :meth:`ShardkitDataset.keys`).

            dl.keys(4711, epoch=2)[3]      # what rank 3's DataLoader yielded at step 4711 of epoch 2
        """
        return self.dataset.keys(step, epoch=epoch, num_workers=self.num_workers)  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the dataset at ``state`` (taken with any number of workers)."""
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]
