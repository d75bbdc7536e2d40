"""Where a ``shardkit.torch`` dataset's DataLoader stands, shared by the main process and its workers.

A DataLoader's workers hold copies of the dataset made when they started (persistent workers
keep theirs), so :meth:`~shardkit.torch.ShardkitDataset.set_epoch` and ``load_state_dict`` in
the main process reach them through shared memory, whether they were forked or spawned: the
epoch, and the :class:`~shardkit.loading.position.Position` loaded last with whether its epoch is
still to be resumed and the generations its state names (a worker whose copy reads others follows). The workers write back how many of them there are and that the epoch was
read to its end. From these and the items the DataLoader yielded, :class:`SharedPlace` makes
the positions a state saves and each worker's loader resumes, through the loader's own
:class:`~shardkit.loading.epochs.Epochs` and :meth:`~shardkit.Loader.resume`.

No lock: the main process writes between iterations, each worker reads once as its iteration
starts, and a slot a worker writes is one aligned 64-bit word. A move the main process makes
while an iteration of :class:`~shardkit.torch.ShardkitDataLoader` runs (``set_epoch`` inside
the loop) first waits until every worker of that iteration has read where to start
(:meth:`SharedPlace.begin`, :meth:`SharedPlace.started`, :meth:`SharedPlace.wait_for_workers`):
a worker slow to start would otherwise read the new epoch while the others read the old one.

    place = SharedPlace(source, options)
    place.load(state)                       # in the main process
    loader = place.worker_loader(place.pending(place.epoch), worker=0, workers=2)   # in a worker
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from multiprocessing.sharedctypes import RawArray
from typing import Any

from shardkit.errors import ConfigError, DatasetNotFoundError
from shardkit.loading.elastic import Phase
from shardkit.loading.epochs import on_split
from shardkit.loading.loader import Loader, epochs_of
from shardkit.loading.options import LoaderOptions, check_world_kept
from shardkit.loading.position import Position, at_items, fresh, items, turn
from shardkit.loading.source import Source

log = logging.getLogger(__name__)

# slots of the shared array (_POSITION: bytes of JSON in the position buffer, 0 when none is loaded;
# _ITERATION: the number of the last iteration a ShardkitDataLoader began)
# _REBATCHED: the DataLoader's workers batched the samples they read (their turns: its batches)
_EPOCH, _RESUME_EPOCH, _WORKERS, _DONE, _POSITION, _ITERATION, _REBATCHED = range(7)
POSITION_BYTES = 1 << 17  # room for the phases of about two thousand changes in one epoch
# DataLoader workers whose start a move waits for (one slot each; a worker past these is not waited for)
MAX_WORKERS = 256
# how long a move waits for the workers of the running iteration to start reading (spawned
# workers import torch first: seconds; one whose worker_init_fn failed says so at once)
START_WAIT = 20.0


class SharedPlace:
    """The epoch, the loaded position, the DataLoader's workers and the last epoch read to its
    end, in memory every worker shares, for a dataset of ``source`` read with ``options``.

    Example:
        place = SharedPlace(source, options)
        place.set_epoch(3)
        place.pending(3).taken             # 0: epoch 3 starts at its beginning
    """

    def __init__(self, source: Source, options: LoaderOptions, *, world_by_default: bool = False) -> None:
        self.source, self.options = source, options
        # the world was taken as this one process for want of any other answer (options.world_by_default)
        self.world_by_default = world_by_default
        # saves and reads states; a blend's knows where the epochs after a loaded state follow on from
        self.epochs = epochs_of(source, options)
        self._slots = RawArray("q", [0, -1, 0, 0, 0, 0, 0])
        self._position = RawArray("c", POSITION_BYTES)
        # by worker: the number of the iteration it last began reading (its place read)
        self._started = RawArray("q", MAX_WORKERS)
        self._running = 0  # in the main process: workers of the iteration a ShardkitDataLoader runs now

    def __getstate__(self) -> dict[str, Any]:
        # pickled in the main process for a spawned (or forkserver) DataLoader worker, whose own
        # torch.distributed is not initialized: the world is checked here, where it is
        check_world_kept(self.world_by_default)
        return self.__dict__

    # -- an iteration's workers starting ---------------------------------------------------------
    def begin(self, workers: int) -> int:
        """In the main process, before a ShardkitDataLoader starts (or resumes) its ``workers``
        workers: a new iteration, whose workers have not read where to start yet; its number."""
        self._slots[_ITERATION] += 1
        self._running = min(workers, MAX_WORKERS)
        return int(self._slots[_ITERATION])

    def end(self, iteration: int, _slot: int = _ITERATION) -> None:
        """In the main process: iteration ``iteration`` ended (a later one may have begun since).
        (``_slot``: bound here, as an iteration left open ends while the interpreter exits, when
        the module's names may be gone.)"""
        if self._slots[_slot] == iteration:
            self._running = 0

    def started(self, worker: int) -> None:
        """In worker ``worker``: it has read where its iteration starts (nothing later reads it)."""
        if worker < MAX_WORKERS:
            self._started[worker] = self._slots[_ITERATION]

    def wait_for_workers(self, move: str) -> None:
        """In the main process, before ``move`` (``"set_epoch(3)"``) changes the place: wait until
        every worker of the running iteration has read where to start, up to :data:`START_WAIT`
        seconds (then log that the iteration may mix what it reads)."""
        count = self._running
        if not count:
            return
        iteration = self._slots[_ITERATION]
        deadline = time.monotonic() + START_WAIT
        pause = 0.0005
        while late := sum(self._started[w] != iteration for w in range(count)):
            if time.monotonic() > deadline:
                log.warning(
                    "%s inside a DataLoader loop: %d of its workers had not started reading after %.1f s; "
                    "they may read the new place while the others read the old (call it between iterations)",
                    move,
                    late,
                    START_WAIT,
                )
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        self._running = 0  # every worker began: later moves in this iteration change nothing it reads

    # -- what is shared ------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return int(self._slots[_EPOCH])

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` next; a loaded position of that same epoch stays to be resumed."""
        s = self._slots
        if s[_RESUME_EPOCH] != epoch:
            s[_RESUME_EPOCH] = -1
        s[_EPOCH], s[_DONE], s[_REBATCHED] = epoch, 0, 0

    @property
    def workers(self) -> int:
        """The DataLoader workers of the last iteration begun (0: it read in the main process)."""
        return int(self._slots[_WORKERS])

    @workers.setter
    def workers(self, count: int) -> None:
        self._slots[_WORKERS] = count

    @property
    def rebatched(self) -> bool:
        """Whether the DataLoader of the last iteration begun batched samples in its workers."""
        return bool(self._slots[_REBATCHED])

    @rebatched.setter
    def rebatched(self, value: bool) -> None:
        self._slots[_REBATCHED] = int(value)

    def finish(self, epoch: int) -> None:
        """``epoch`` was read to its end (an iteration of it again reads it anew)."""
        self._slots[_DONE] = epoch + 1

    def finished(self, epoch: int) -> bool:
        """Whether ``epoch`` was read to its end since it was set."""
        return int(self._slots[_DONE]) == epoch + 1

    def spend(self, epoch: int) -> None:
        """``epoch`` was read to its end, as the main process saw it: its next read is of the
        whole epoch (a position loaded for it was spent by that read)."""
        s = self._slots
        if s[_RESUME_EPOCH] == epoch:
            s[_RESUME_EPOCH] = -1
        s[_DONE] = 0

    def loaded(self) -> Position | None:
        """The position loaded last (its epoch resumed or not), or None."""
        size = int(self._slots[_POSITION])
        if not size:
            return None
        doc = json.loads(bytes(self._position[:size]))
        start = None if doc["start"] is None else tuple(doc["start"])
        return Position(doc["epoch"], _phase(doc["phase"]), tuple(_phase(p) for p in doc["done"]), start)

    # -- positions -----------------------------------------------------------------------------
    def fresh(self, epoch: int) -> Position:
        """The start of ``epoch`` on the dataset's ranks."""
        o = self.options
        assert o.world_size is not None
        return fresh(epoch, world=o.world_size, batch_size=o.batch_size)

    def pending(self, epoch: int) -> Position:
        """Where ``epoch`` starts: the loaded position if it is that epoch's."""
        loaded = self.loaded() if self._slots[_RESUME_EPOCH] == epoch else None
        return loaded or self.fresh(epoch)

    def settle(self, position: Position, workers: int) -> Position:
        """``position`` on the dataset's ranks and batch size with ``workers`` DataLoader workers."""
        return on_split(position, self.options, self.source, workers=workers)

    def most(self, workers: int) -> int:
        """Items an iteration with ``workers`` DataLoader workers yields at most: a whole epoch, or
        what is left of a loaded one (which a blend rounds up to whole batches, so it may be more)."""
        start = self.settle(self.pending(self.epoch), max(1, workers))
        return max(self.length(self.fresh(0)), self.length(start) - start.taken)

    def length(self, position: Position) -> int:
        """Items a rank yields in the phase of ``position``, from its start, its workers together."""
        return sum(items(position, rest=self.source.rest, drop_last=self.options.drop_last))

    def after(self, yielded: int) -> Position:
        """Where the epoch stands once the DataLoader yielded ``yielded`` items of its iteration.

        Raises:
            ConfigError: the iteration has fewer items than that, or a DataLoader batched its
                workers' samples and yielded some (a worker's turn is a batch of a size unknown here).
        """
        if yielded and self.rebatched and self.workers:
            raise ConfigError(
                f"state_dict: a DataLoader with batch_size set batched this dataset's samples in its {self.workers} workers, "
                "which take turns a batch at a time: where the epoch stands cannot be told from a count. For exact resume, "
                "batch in the dataset: ShardkitDataLoader(ShardkitDataset(..., batch_size=B), num_workers=k)"
            )
        epoch = self.epoch
        point = self.pending(epoch)
        # the iteration read on the dataset's split, from where the point settles on it; one that
        # ended having yielded nothing (a rest too short for a whole batch on every rank) read it too
        if yielded or self.finished(epoch):
            point = self.settle(point, max(1, self.workers))
        length = self.length(point)
        if point.taken + yielded > length:
            raise ConfigError(f"state_dict: yielded={yielded} is more than the {length - point.taken} items this iteration has")
        if point.taken + yielded == length:  # the epoch is over: the next one starts from its beginning
            return self.fresh(point.epoch + 1)
        return at_items(point, point.taken + yielded, rest=self.source.rest, drop_last=self.options.drop_last) if yielded else point

    def load(self, state: Any) -> None:
        """Resume at the position of the ``shardkit.torch`` state ``state`` when its epoch is read next.

        Raises:
            ConfigError: the state is malformed, or was taken on other data or with options that
                change the order, or records more phases than the shared memory holds.
        """
        pins = self.epochs.pins(state)
        # taken on another generation: read that one, here and in every worker (see _follow), once the state reads well there
        epochs = self.epochs if pins is None else self.epochs.at_generation(pins)
        position = epochs.load(state, torch=True)
        doc = {
            "epoch": position.epoch,
            "phase": position.phase.to_dict(),
            "done": [phase.to_dict() for phase in position.done],
            "start": None if position.start is None else list(position.start),
            "generations": (generations := _generations(state)),
        }
        found = json.dumps(doc).encode()
        if len(found) > POSITION_BYTES:
            # the phases done, and a blend's starts and generations: one of each a source
            sources = len(generations.get("sources") or ()) or 1
            raise ConfigError(
                f"load_state_dict: the position takes {len(found)} bytes ({len(position.done)} phases done, {sources} "
                f"source{'s' if sources > 1 else ''}), more than the {POSITION_BYTES} shardkit.torch holds in one epoch"
            )
        self.epochs, self.source = epochs, epochs.source
        s = self._slots
        self._position[: len(found)] = found
        s[_POSITION] = len(found)
        s[_EPOCH], s[_RESUME_EPOCH], s[_DONE], s[_REBATCHED] = position.epoch, position.epoch, 0, 0
        self.epochs.resume(position, workers=position.split[2])  # a blend's epochs after it follow on from it

    def _follow(self) -> None:
        """In a worker: read the generations of the state loaded last, when this copy of the place
        was made before (a persistent worker's), as the main process does since."""
        size = int(self._slots[_POSITION])
        named: dict[str, Any] = json.loads(bytes(self._position[:size])).get("generations") or {} if size else {}
        pins = self.epochs.pins(named) if named else None
        if pins is None:
            return
        epochs = self.epochs.at_generation(pins)
        # an overwrite reuses generation numbers; kept only once checked, or the next epoch would read the other data
        if epochs.fingerprint != named.get("dataset"):
            which = f"generation {pins}" if isinstance(pins, int) else "generations " + ", ".join(f"{n}: {g}" for n, g in pins.items())
            raise DatasetNotFoundError(
                f"{self.source.name}: {which}, which the loaded state was taken on, was overwritten since (its piles are not "
                "the state's): load a state taken on the dataset there now, or start a new DataLoader without one"
            )
        self.epochs, self.source = epochs, epochs.source

    # -- loaders -------------------------------------------------------------------------------
    def loader(self, options: LoaderOptions) -> Loader:
        """A loader with ``options`` that resumed the loaded position, if any: a blend's epochs
        follow on from where it stood."""
        self._follow()
        loader = Loader(self.source, options)  # a blend's source reads as a blend
        loaded = self.loaded()
        if loaded is not None:
            loader.resume(loaded)
        return loader

    def worker_loader(self, position: Position, *, worker: int, workers: int, views: bool = False) -> Loader:
        """The loader of DataLoader worker ``worker`` of ``workers``, past what ``position`` had
        taken; with ``views``, one that yields raw fields as views whatever the options say, and
        those of local plain piles as where they lie (the main process maps the same files)."""
        o = self.options
        self._follow()
        settled = self.settle(position, workers)
        role = (
            turn(settled, rest=self.source.rest, drop_last=o.drop_last) + worker
        ) % workers  # the DataLoader asks worker 0 first: it takes the next turn
        loader = self.loader(replace(o, worker=(role, workers), views=o.views or views))
        loader.resume(position)
        return loader.locate_fields() if views else loader


def _generations(state: dict[str, Any]) -> dict[str, Any]:
    """The generations ``state`` names (its dataset's, or each source's of a blend) and its data's
    fingerprint, as a state holds them: what :meth:`~shardkit.loading.epochs.Epochs.pins` reads."""
    sources = state.get("sources")
    found: dict[str, Any] = {"generation": state.get("generation"), "dataset": state.get("dataset")}
    if isinstance(sources, dict):
        found["sources"] = {name: {"generation": part.get("generation")} for name, part in sources.items() if isinstance(part, dict)}
    return found


def _phase(doc: dict[str, Any]) -> Phase:
    return Phase(doc["world_size"], doc["batch_size"], tuple(doc["read"]))
