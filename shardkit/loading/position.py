"""Where a reader stands in an epoch: one value for a loader, a blend and a DataLoader's workers. Pure.

A :class:`Position` is an epoch, the phases of it read before a change of split (world size,
batch size, DataLoader workers; :mod:`shardkit.loading.elastic`), the phase in progress with
how far each of its workers got, and what pins the data: a blend's stream position of each
source when the epoch began, a dataset's generation. Every reader saves one
(:mod:`shardkit.loading.state` writes it as a state dict) and resumes from one: it settles
(:func:`settle`) the position on its own split, which ends the position's phase when the
split differs, and reads on from its own worker's count.

    pos = fresh(2, world=8, batch_size=32)
    pos = after_items(pos, 10, rest=source.rest, drop_last=True)   # a rank yielded 10 batches
    pos = settle(pos, world=4, batch_size=32, workers=2, rest=source.rest, drop_last=True)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from shardkit.loading import elastic
from shardkit.loading.elastic import Phase, RestOf
from shardkit.loading.turns import round_robin, worker_items


@dataclass(frozen=True, slots=True)
class Position:
    """Epoch ``epoch``, after the phases ``done``, in the phase ``phase``: ``phase.world_size``
    ranks of ``phase.batch_size``, each with ``len(phase.read)`` workers (one: a loader), worker
    ``w`` of every rank having read ``phase.read[w]`` positions of its share.

    ``start``: a blend's stream position of each source when the epoch began (None: one dataset,
    or an epoch nobody resumed, whose start follows from the epoch). ``generation``: the
    generation of the dataset the position was taken on (None: none named).
    """

    epoch: int
    phase: Phase
    done: tuple[Phase, ...] = ()
    start: tuple[int, ...] | None = None
    generation: int | None = None

    @property
    def split(self) -> tuple[int, int | None, int]:
        """World size, batch size and workers a rank of the phase in progress."""
        return self.phase.world_size, self.phase.batch_size, len(self.phase.read)

    @property
    def taken(self) -> int:
        """Items (batches, or samples unbatched) each rank yielded in the phase in progress, its workers together."""
        unit = self.phase.batch_size or 1
        return sum(-(-n // unit) for n in self.phase.read)


def fresh(epoch: int, *, world: int, batch_size: int | None, workers: int = 1) -> Position:
    """The start of ``epoch`` on ``world`` ranks of ``batch_size`` with ``workers`` workers each."""
    return Position(epoch, Phase(world, batch_size, (0,) * workers))


def span(position: Position, *, rest: RestOf, drop_last: bool) -> list[elastic.Range]:
    """The global ranges the phase of ``position`` splits (``rest``: its source's :meth:`rest`)."""
    world, batch, _ = position.split
    return rest(position.done, world=world, batch_size=batch, drop_last=drop_last)


def items(position: Position, *, rest: RestOf, drop_last: bool) -> list[int]:
    """Items each worker of a rank yields in the whole phase of ``position``."""
    world, batch, workers = position.split
    return worker_items(span(position, rest=rest, drop_last=drop_last), world=world, batch_size=batch, workers=workers, drop_last=drop_last)


def at_items(position: Position, taken: int, *, rest: RestOf, drop_last: bool) -> Position:
    """``position`` once each rank yielded ``taken`` items of its phase, its workers taking turns
    (:func:`~shardkit.loading.turns.round_robin`); ValueError past the phase's end."""
    world, batch, workers = position.split
    ranges = span(position, rest=rest, drop_last=drop_last)
    counts = worker_items(ranges, world=world, batch_size=batch, workers=workers, drop_last=drop_last)
    given, _ = round_robin(counts, taken)
    sizes = elastic.worker_lengths(ranges, world=world, drop_last=drop_last, batch_size=batch, workers=workers)
    read = tuple(min(g * (batch or 1), size) for g, size in zip(given, sizes, strict=True))
    return replace(position, phase=Phase(world, batch, read))


def after_items(position: Position, more: int, *, rest: RestOf, drop_last: bool) -> Position:
    """``position`` once each rank yielded ``more`` items after it."""
    return at_items(position, position.taken + more, rest=rest, drop_last=drop_last)


def turn(position: Position, *, rest: RestOf, drop_last: bool) -> int:
    """The worker a DataLoader asks next in the phase of ``position``."""
    return round_robin(items(position, rest=rest, drop_last=drop_last), position.taken)[1]


def settle(position: Position, *, world: int, batch_size: int | None, workers: int, rest: RestOf, drop_last: bool) -> Position:
    """``position`` for ranks of ``world`` and ``batch_size`` with ``workers`` workers each.

    Unchanged when that is the position's own split. Otherwise its phase ends where each of
    its workers had got to and a new phase starts: a phase that read nothing is dropped, one
    that read all of its shares ended the epoch (the next one starts, with no ``start``).
    """
    if position.split == (world, batch_size, workers):
        return position
    phase, done, epoch, start = position.phase, position.done, position.epoch, position.start
    if any(phase.read):
        ranges = span(position, rest=rest, drop_last=drop_last)
        sizes = elastic.worker_lengths(
            ranges, world=phase.world_size, drop_last=drop_last, batch_size=phase.batch_size, workers=len(phase.read)
        )
        if list(phase.read) == sizes:
            epoch, done, start = epoch + 1, (), None
        else:
            done = (*done, phase)
    return Position(epoch, Phase(world, batch_size, (0,) * workers), done, start, position.generation)


class Place:
    """Which epoch a loader reads next and from where, and the epoch it is reading (or left):
    what its :class:`Position` is taken from and resumed into.

    Example:
        place = Place()
        place.begin(0, (), reading.where)     # an iteration of epoch 0 starts
        place.position(world=1, batch_size=32), place.end(0)
    """

    def __init__(self) -> None:
        self.epoch = 0  # the epoch the next iteration reads
        self.start = 0  # from this position of its slice
        self.done: tuple[Phase, ...] = ()  # after these phases of it (read before a change of split)
        self.running: int | None = None  # the epoch of the iteration in progress (or abandoned)
        self._running_done: tuple[Phase, ...] = ()
        self._where: Callable[[], int] | None = None  # that iteration's position after the last item yielded
        # the phases before a change of split of each epoch last read after one: the ledger names
        # an epoch's steps through its change after it was read, not only while
        self._read_after: dict[int, tuple[Phase, ...]] = {}

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` next, from its start, unless it is the one a resume left to read. The
        epoch an iteration is reading changes nothing: that iteration goes on, then the next epoch."""
        if epoch == self.running:
            return
        resuming = self.running is None and epoch == self.epoch
        self.epoch, self.running = epoch, None
        self.start, self.done = (self.start, self.done) if resuming else (0, ())

    def begin(self, epoch: int, done: tuple[Phase, ...], where: Callable[[], int]) -> None:
        """An iteration of ``epoch`` after the phases ``done`` started; ``where`` says how far it got."""
        self.running, self._running_done, self._where, self.start, self.done = epoch, done, where, 0, ()
        if done:
            self._read_after[epoch] = done
        else:
            self._read_after.pop(epoch, None)

    def end(self, epoch: int) -> None:
        """The iteration of ``epoch`` read it to its end: the next epoch starts, unless
        :meth:`set_epoch` or :meth:`resume` already said what to read next while it ran."""
        if self.running != epoch:
            return
        self.epoch, self.running, self._where, self._running_done = epoch + 1, None, None, ()

    @property
    def current(self) -> int:
        """The epoch being read, or else the one read next."""
        return self.epoch if self.running is None else self.running

    def done_in(self, epoch: int) -> tuple[Phase, ...]:
        """The phases read before a change of split in ``epoch``: the one being read, resumed, or
        read last (when it was read before)."""
        if self.running is not None and epoch == self.running:
            return self._running_done
        if self.running is None and epoch == self.epoch:
            return self.done
        return self._read_after.get(epoch, ())

    def position(self, *, world: int, batch_size: int | None) -> Position:
        """Where the loader is, on its split of ``world`` ranks of ``batch_size`` (one worker: its own share)."""
        if self.running is not None and self._where is not None:
            epoch, at, done = self.running, self._where(), self._running_done
        else:
            epoch, at, done = self.epoch, self.start, self.done
        return Position(epoch, Phase(world, batch_size, (at,)), done)

    def resume(self, position: Position, worker: int) -> None:
        """Read on from ``position`` (settled on the loader's split), from worker ``worker``'s count."""
        self.epoch, self.start, self.done, self.running = position.epoch, position.phase.read[worker], position.done, None
