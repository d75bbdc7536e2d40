"""How a DataLoader's workers take turns, where a ``shardkit.torch`` state left its epoch, and
which worker reads a given step. Pure: no torch, no I/O.

A DataLoader asks its workers for items in turn; each worker reads its own contiguous share of
its rank's slice (:mod:`shardkit.loading.elastic`). So the DataLoader's step ``k`` of a phase is
one worker's item, found by counting turns (:func:`round_robin`), and the step of an epoch read
in several phases counts on through them (:func:`locate`): the ledger, ``keys(step)``, needs
nothing else to name the samples of any step of a run with workers or a change of ranks.

    at = locate(4711, samples=10**6, done=(), world=8, batch_size=256, workers=4, drop_last=True)
    at.worker, at.item   # worker 3 of every rank gives step 4711, as its item 1177
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardkit._util import check_int
from shardkit.loading import elastic
from shardkit.loading.elastic import Phase
from shardkit.loading.options import LoaderOptions
from shardkit.loading.state import (
    MAX_WORKERS,
    RestOf,
    Resume,
    bounded,
    check_done,
    check_epoch,
    check_format,
    check_identity,
    check_split,
    close,
)

FORMAT = "shardkit.torch"
# version 2 adds "done", the phases of the epoch read before a change of world size, batch size
# or number of workers; a version 1 state reads as one with none
VERSION = 2
READS = (1, 2)


def round_robin(counts: Sequence[int], taken: int) -> tuple[list[int], int]:
    """How many items each worker gave after ``taken`` items of a DataLoader, and whose turn is next.

    A ``DataLoader`` (with ``in_order=True``, its default) asks its workers in turn, 0, 1, ...,
    starting at 0 every epoch, and passes over a worker whose iterator has ended; worker ``w``
    gives ``counts[w]`` items in all.

    Example:
        round_robin([3, 1, 3], 5)  # ([2, 1, 2], 0)
    """
    if not 0 <= taken <= sum(counts):
        raise ValueError(f"taken={taken} is not between 0 and {sum(counts)}")
    lo, hi = 0, max(counts, default=0)
    while lo < hi:  # the number of whole rounds: the most r with sum(min(c, r)) <= taken
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if sum(min(c, mid) for c in counts) <= taken else (lo, mid - 1)
    given = [min(c, lo) for c in counts]
    left, turn = taken - sum(given), 0
    for w, c in enumerate(counts):
        if left and c > lo:
            given[w], left, turn = given[w] + 1, left - 1, w + 1
    return given, turn % max(1, len(counts))


@dataclass(frozen=True, slots=True)
class Point:
    """Where a state left its epoch: after the phases ``done``, each of ``world_size`` ranks
    (batch size ``batch_size``, ``workers`` DataLoader workers) had yielded ``taken`` items."""

    epoch: int
    taken: int
    workers: int
    world_size: int
    batch_size: int | None
    done: tuple[Phase, ...] = ()


def worker_items(rest: Sequence[elastic.Range], *, world: int, batch_size: int | None, workers: int, drop_last: bool) -> list[int]:
    """Items (batches, or samples) each DataLoader worker of a rank yields of what ``rest`` holds."""
    unit = batch_size or 1
    sizes = elastic.worker_lengths(rest, world=world, drop_last=drop_last, batch_size=batch_size, workers=workers)
    return [-(-n // unit) for n in sizes]


def settle(point: Point, *, world: int, batch_size: int | None, workers: int, rest: Sequence[elastic.Range], drop_last: bool) -> Point:
    """``point`` for ranks of ``world``, ``batch_size`` and ``workers`` DataLoader workers. Pure.

    ``rest`` is what the point's own phase splits. Unchanged when those are the point's own.
    Otherwise the point's phase ends where each of its workers had got to (the DataLoader's
    turns, :func:`round_robin`) and a new phase starts.
    """
    if (point.world_size, point.batch_size, point.workers) == (world, batch_size, workers):
        return point
    resume = Resume(point.epoch, 0, point.done)
    if point.taken:
        items = worker_items(rest, world=point.world_size, batch_size=point.batch_size, workers=point.workers, drop_last=drop_last)
        given, _ = round_robin(items, point.taken)
        sizes = elastic.worker_lengths(
            rest, world=point.world_size, drop_last=drop_last, batch_size=point.batch_size, workers=point.workers
        )
        read = tuple(min(g * (point.batch_size or 1), size) for g, size in zip(given, sizes, strict=True))
        resume = close(resume, Phase(point.world_size, point.batch_size, read), rest, drop_last=drop_last)
    return Point(resume.epoch, 0, workers, world, batch_size, resume.done)


@dataclass(frozen=True, slots=True)
class StepAt:
    """Where a step is read: in the phase after the first ``phase`` phases of the epoch, which
    splits ``rest`` among ``world`` ranks of ``batch_size`` and ``workers`` workers each, as item
    ``item`` of worker ``worker``."""

    phase: int
    rest: list[elastic.Range]
    world: int
    batch_size: int | None
    workers: int
    worker: int
    item: int


def locate(
    step: int, *, rest: RestOf, done: Sequence[Phase], world: int, batch_size: int | None, workers: int, drop_last: bool
) -> StepAt | int:
    """Where DataLoader step ``step`` of an epoch is read, counting on through the phases ``done``
    and then the phase of ``world`` ranks, ``batch_size`` and ``workers`` workers; past the end
    of the epoch, the number of steps it has. ``rest`` gives what each phase splits (a source's
    :meth:`rest`)."""
    first = 0
    phases: list[tuple[int, int | None, int, Phase | None]] = [(p.world_size, p.batch_size, len(p.read), p) for p in done]
    phases.append((world, batch_size, workers, None))
    for i, (w, b, n, phase) in enumerate(phases):
        span = rest(done[:i], world=w, batch_size=b, drop_last=drop_last)
        items = worker_items(span, world=w, batch_size=b, workers=n, drop_last=drop_last)
        # a finished phase gave the items its workers read; the turns they took are the full phase's
        count = sum(items) if phase is None else sum(-(-r // (b or 1)) for r in phase.read)
        if step < first + count:
            given, turn = round_robin(items, step - first)
            return StepAt(i, span, w, b, n, turn, given[turn])
        first += count
    return first


def parse(state: Any, *, options: LoaderOptions, dataset: str, samples: int, name: str, rest: RestOf) -> Point:
    """Where the ``shardkit.torch`` state ``state`` left its epoch, checked against the data
    (``dataset`` fingerprint, ``samples``) and ``options``' order.

    Raises:
        ConfigError: ``state`` is malformed, or was taken on other data or with options that
            change the order (each difference is named).
    """
    state = check_format(state, FORMAT, READS, "shardkit.torch dataset")
    check_identity(state, options=options, dataset=dataset, samples=samples, name=name)
    epoch = check_epoch(state)
    world, batch = check_split(state)
    # sized and looped over below: 2**40 workers would take hours before any check could fail
    workers = bounded("load_state_dict: workers", state.get("workers"), low=1, most=MAX_WORKERS, why="DataLoader workers of a rank")
    done, span = check_done(state, rest=rest, world=world, batch_size=batch, drop_last=options.drop_last)
    length = sum(worker_items(span, world=world, batch_size=batch, workers=workers, drop_last=options.drop_last))
    taken = check_int("load_state_dict: taken", state.get("taken"), low=0, high=max(1, length) - 1)
    return Point(epoch, taken, workers, world, batch, done)


def done_before(point: Point, *, options: LoaderOptions, rest: RestOf, workers: int) -> tuple[Phase, ...]:
    """The phases of ``point``'s epoch read before a DataLoader of ``workers`` workers on
    ``options``' ranks and batch size continues it (the point's own phase ends if they differ)."""
    world, drop_last = options.world_size, options.drop_last
    assert world is not None
    span = rest(point.done, world=point.world_size, batch_size=point.batch_size, drop_last=drop_last)
    return settle(point, world=world, batch_size=options.batch_size, workers=workers, rest=span, drop_last=drop_last).done
