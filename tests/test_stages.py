"""cut_tasks: the loader's raw samples cut into tasks on fixed position boundaries."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.loading.batch import CHUNK, ShardBlock, Step, cut_tasks
from shardkit.loading.decode import Transform


class Pile:
    """Stands in for Shard: cut_tasks reads only ``url``."""

    def __init__(self, url: str) -> None:
        self.url = url


A, B = Pile("a.tar"), Pile("b.tar")


def as_blocks(items) -> list[ShardBlock]:
    """``(start, pile or one pile per position, indices)`` tuples as the loader's blocks."""
    out = []
    for start, data, index in items:
        if isinstance(data, list):
            distinct = list(dict.fromkeys(data))
            out.append(ShardBlock(start, index, distinct, [distinct.index(p) for p in data]))
        else:
            out.append(ShardBlock(start, index, [data]))
    return out


def taker(skip: Collection[tuple[str, int]] = ()) -> Callable[[Pile | None, int], dict[str, Any] | None]:
    """``take`` for cut_tasks: sample ``i`` of ``pile`` as ``{"__key__": "URL:i"}``; None for ``skip``."""

    def take(pile: Pile | None, i: int) -> dict[str, Any] | None:
        if pile is None or (pile.url, i) in skip:
            return None
        return {"__key__": f"{pile.url}:{i}"}

    return take


def shape(tasks) -> list[tuple[int, list[int], list[str]]]:
    return [(t.end, t.ends, [s["__key__"] for s in t.samples]) for t in tasks]


def test_batches_end_on_multiples_of_batch_size():
    tasks = list(cut_tasks(as_blocks([(0, A, list(range(10)))]), taker(), start=0, length=10, batch_size=4))
    assert [(t.end, t.ends) for t in tasks] == [(4, [1, 2, 3, 4]), (8, [5, 6, 7, 8]), (10, [9, 10])]
    assert all(t.urls == ["a.tar"] * len(t.samples) for t in tasks)


def test_a_batch_spans_blocks_and_per_position_piles():
    blocks = [(0, A, [5, 6, 7]), (3, [B, A, None, B], [0, 8, 3, 1])]
    tasks = list(cut_tasks(as_blocks(blocks), taker(), start=0, length=7, batch_size=4))
    assert shape(tasks) == [
        (4, [1, 2, 3, 4], ["a.tar:5", "a.tar:6", "a.tar:7", "b.tar:0"]),
        (7, [5, 7], ["a.tar:8", "b.tar:1"]),  # position 6 was in a skipped pile
    ]
    assert tasks[1].urls == ["a.tar", "b.tar"]


def test_skipped_samples_keep_every_batch_slot():
    skip = {("a.tar", i) for i in range(4)}
    tasks = list(cut_tasks(as_blocks([(0, A, list(range(8)))]), taker(skip), start=0, length=8, batch_size=4))
    assert shape(tasks) == [(4, [], []), (8, [5, 6, 7, 8], ["a.tar:4", "a.tar:5", "a.tar:6", "a.tar:7"])]


def test_unbatched_chunks_drop_when_empty():
    n = 2 * CHUNK + 5
    skip = {("a.tar", i) for i in range(CHUNK)}
    tasks = list(cut_tasks(as_blocks([(0, A, list(range(n)))]), taker(skip), start=0, length=n, batch_size=None))
    assert [(t.end, len(t.samples)) for t in tasks] == [(2 * CHUNK, CHUNK), (n, 5)]
    assert list(cut_tasks(as_blocks([(0, A, [0, 1])]), taker({("a.tar", 0), ("a.tar", 1)}), start=0, length=2, batch_size=None)) == []


def test_resuming_mid_slice_keeps_the_boundaries():
    tasks = list(cut_tasks(as_blocks([(6, A, [0, 1, 2, 3])]), taker(), start=6, length=10, batch_size=4))
    assert [(t.end, t.ends) for t in tasks] == [(8, [7, 8]), (10, [9, 10])]
    assert list(cut_tasks([], taker(), start=10, length=10, batch_size=4)) == []


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(0, 40),
    batch=st.integers(1, 9),
    start_frac=st.floats(0, 1),
    cuts=st.lists(st.integers(1, 7), max_size=12),
    skipped=st.sets(st.integers(0, 39)),
)
def test_same_batches_whatever_the_blocks_and_skips(length, batch, start_frac, cuts, skipped):
    """Every batch from ``start`` on is a task ending on its boundary, holding exactly its unskipped samples."""
    start = int(start_frac * length) // batch * batch
    blocks, pos = [], start
    for c in [*cuts, length]:
        if pos >= length:
            break
        n = min(c, length - pos)
        blocks.append((pos, A, list(range(pos, pos + n))))
        pos += n
    tasks = list(cut_tasks(as_blocks(blocks), taker({("a.tar", i) for i in skipped}), start=start, length=length, batch_size=batch))
    ends = list(range(start + batch, length, batch)) + ([length] if length > start else [])
    assert [t.end for t in tasks] == ends
    for t in tasks:
        first = t.end - batch if t.end % batch == 0 else t.end - t.end % batch
        assert t.ends == [p + 1 for p in range(first, t.end) if p not in skipped]


@pytest.mark.parametrize("batched", [False, True])
def test_step_turns_a_task_into_items_at_their_positions(batched):
    task = next(cut_tasks(as_blocks([(0, A, [0, 1])]), taker(), start=0, length=2, batch_size=2 if batched else None))
    result = Step(Transform(None, None), None, batched, "raise")(task)
    expected = [(2, {"__key__": ["a.tar:0", "a.tar:1"]})] if batched else [(1, {"__key__": "a.tar:0"}), (2, {"__key__": "a.tar:1"})]
    assert result.items == expected and result.failures == []
