"""How a DataLoader's workers take turns, and which worker reads a given step. Pure: no torch, no I/O.

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

from shardkit.loading import elastic
from shardkit.loading.elastic import Phase, RestOf


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


def worker_items(rest: Sequence[elastic.Range], *, world: int, batch_size: int | None, workers: int, drop_last: bool) -> list[int]:
    """Items (batches, or samples) each DataLoader worker of a rank yields of what ``rest`` holds."""
    unit = batch_size or 1
    sizes = elastic.worker_lengths(rest, world=world, drop_last=drop_last, batch_size=batch_size, workers=workers)
    return [-(-n // unit) for n in sizes]


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
            # the DataLoader passes over a worker that has ended: the step is the next one's that still gives
            worker = next(k % n for k in range(turn, turn + n) if given[k % n] < items[k % n])
            return StepAt(i, span, w, b, n, worker, given[worker])
        first += count
    return first
