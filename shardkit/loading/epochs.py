"""What differs between reading one dataset and a blend: each epoch's schedule and what a position holds.

A :class:`~shardkit.Loader` and a :class:`~shardkit.torch.ShardkitDataset` are the same
machines for one dataset and for a blend; each holds an :class:`Epochs`, which says which
schedule reads a rank's global ranges of an epoch, how a
:class:`~shardkit.loading.position.Position` is saved as a state and read back from one, and
where a position resumes. :class:`PileEpochs` serves one dataset (its piles in the order of
:mod:`~shardkit.loading.plan`), and :class:`~shardkit.loading.blend.epochs.BlendEpochs` a blend.
Both share :func:`rank_ranges` (what a rank reads of an epoch) and :func:`step_keys` (the ledger).

    epochs = PileEpochs(source, options)
    schedule = epochs.schedule(0, (), [(0, 1024)], world=1, batch_size=32)
    position = epochs.resume(epochs.load(epochs.save(position)), workers=1)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from shardkit import storage
from shardkit.errors import ConfigError
from shardkit.loading import elastic, plan, state, turns
from shardkit.loading.elastic import Phase, Range
from shardkit.loading.options import LoaderOptions
from shardkit.loading.position import Position, settle
from shardkit.loading.reading import Schedule
from shardkit.loading.source import Source, at_generation

log = logging.getLogger(__name__)


class Epochs(Protocol):
    """How a loader's epochs are read and resumed (see the module docstring)."""

    @property
    def source(self) -> Source:
        """What is read."""
        ...

    @property
    def fingerprint(self) -> str:
        """What identifies the data (a state names it)."""
        ...

    def schedule(self, epoch: int, done: Sequence[Phase], ranges: Sequence[Range], *, world: int, batch_size: int | None) -> Schedule:
        """What reads the global ``ranges`` of ``epoch`` (split by ``world`` ranks of ``batch_size``
        after the phases ``done``)."""
        ...

    def save(self, position: Position, *, torch: bool = False) -> dict[str, Any]:
        """The state of ``position`` (a loader's, or with ``torch`` a ``shardkit.torch`` dataset's)."""
        ...

    def load(self, state: Any, *, torch: bool = False) -> Position:
        """The position ``state`` records, once checked against this data and these options."""
        ...

    def resume(self, position: Position, *, workers: int) -> Position:
        """``position`` settled on these options' ranks and batch size with ``workers`` workers a
        rank; the epochs after it follow on from it."""
        ...

    def pins(self, state: Any) -> Any:
        """The generation ``state`` was taken on, when it is not the one read (a blend's: each
        such source's, by name); else None."""
        ...

    def at_generation(self, generation: Any) -> Epochs:
        """These epochs on generation ``generation`` of the dataset (a blend's: of each source named)."""
        ...


class PileEpochs:
    """The epochs of one dataset: each an :class:`~shardkit.loading.plan.EpochOrder` of its piles.

    Example:
        epochs = PileEpochs(source, options)
        sched = epochs.schedule(0, (), [(0, len(source))], world=1, batch_size=None)
    """

    def __init__(self, source: Source, options: LoaderOptions) -> None:
        self.source, self.options = source, options
        self.fingerprint = source.fingerprint()

    def schedule(self, epoch: int, done: Sequence[Phase], ranges: Sequence[Range], *, world: int, batch_size: int | None) -> plan.Schedule:
        o = self.options
        order = plan.EpochOrder(self.source.counts, seed=o.seed, epoch=epoch, shuffle=o.shuffle, mix=o.mix)
        return plan.Schedule.over(order, ranges)

    def save(self, position: Position, *, torch: bool = False) -> dict[str, Any]:
        pinned = replace(position, generation=self.source.generation)
        fmt = state.TORCH if torch else state.LOADER
        return state.write(pinned, fmt, options=self.options, dataset=self.fingerprint, samples=self.source.samples)

    def load(self, found: Any, *, torch: bool = False) -> Position:
        src, fmt = self.source, state.TORCH if torch else state.LOADER
        found = state.check_format(found, fmt)
        return state.read(found, fmt, options=self.options, dataset=self.fingerprint, samples=src.samples, name=src.name, rest=src.rest)

    def resume(self, position: Position, *, workers: int) -> Position:
        return on_split(position, self.options, self.source, workers=workers)

    def pins(self, found: Any) -> int | None:
        generation = state.pinned_generation(found)
        return None if generation is None or self.source.generation in (None, generation) else generation

    def at_generation(self, generation: int) -> PileEpochs:
        pinned = PileEpochs(at_generation(self.source.name, generation), self.options)
        log.info("%s: reading generation %d, the one the state was taken on", self.source.name, generation)
        return pinned


def step_keys(
    epochs: Epochs,
    options: LoaderOptions,
    *,
    step: int,
    epoch: int,
    done: tuple[Phase, ...],
    workers: int,
    reads: storage.RemoteReads,
) -> list[list[str]]:
    """The keys of the samples global step ``step`` of ``epoch`` reads on every rank
    (``keys[rank]``), after the phases ``done``, for ``workers`` DataLoader workers a rank; see
    :meth:`shardkit.Loader.keys`."""
    o, source = options, epochs.source
    assert o.world_size is not None
    at = turns.locate(
        step, rest=source.rest, done=done, world=o.world_size, batch_size=o.batch_size, workers=workers, drop_last=o.drop_last
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
        schedule = epochs.schedule(epoch, done[: at.phase], ranges, world=at.world, batch_size=at.batch_size)
        piles, index = schedule.take(at.item * per, min((at.item + 1) * per, len(schedule)))
        for pile in set(piles.tolist()) - names.keys():
            names[pile] = source.open(pile, source.fetch(pile, reads=reads)).keys
        found.append([names[p][i] for p, i in zip(piles.tolist(), index.tolist(), strict=True)])
    return found


def on_split(position: Position, options: LoaderOptions, source: Source, *, workers: int) -> Position:
    """``position`` settled on ``options``' ranks and batch size with ``workers`` workers a rank."""
    assert options.world_size is not None
    return settle(
        position, world=options.world_size, batch_size=options.batch_size, workers=workers, rest=source.rest, drop_last=options.drop_last
    )


def rank_ranges(rest: Callable[..., list[Range]], done: Sequence[Phase], options: LoaderOptions) -> list[Range]:
    """The global ranges a loader with ``options`` reads of an epoch whose phases ``done`` were
    read before (``rest``: its source's :meth:`~shardkit.loading.source.Source.rest`)."""
    o = options
    assert o.rank is not None and o.world_size is not None
    left = rest(done, world=o.world_size, batch_size=o.batch_size, drop_last=o.drop_last)
    index, workers = o.worker
    return elastic.share(
        left, world=o.world_size, rank=o.rank, drop_last=o.drop_last, batch_size=o.batch_size, workers=workers, worker=index
    )
