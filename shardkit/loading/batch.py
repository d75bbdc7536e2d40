"""Cut the loader's samples into tasks by position and turn each into what is yielded: batches.

The loader's raw samples come as :class:`ShardBlock` runs of positions. They are cut into
:class:`Task` chunks by slice position (one batch, or a run of :data:`CHUNK` samples:
:func:`cut_tasks`), and a :class:`Step` decodes, maps and collates a task. Cutting by position
means a skipped sample never moves a batch boundary, and the same step gives the same output in
the loader's process or in a worker process (:class:`shardkit.workers.Pool`).

    step = Step(transform=Transform(codecs=DEFAULT, fn=None), collate=collate, batched=True, on_error="raise")
    for task in cut_tasks(blocks, policy.sample, start=0, length=n, batch_size=32):
        result = step(task)       # items with the slice position after each
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardkit.errors import ConfigError
from shardkit.loading.decode import Transform
from shardkit.loading.located import Located, reorder
from shardkit.tar.shard import Shard

Collate = Callable[[list[dict[str, Any]]], Any]

# samples per task when unbatched samples go through decode/map
CHUNK = 64


@dataclass(frozen=True, slots=True)
class ShardBlock:
    """Slice positions ``start .. start + len(index) - 1``: sample ``index[j]`` of the shard
    ``shards[which[j]]`` (of ``shards[0]`` for every ``j`` when ``which`` is None).

    A shard is None where its pile could not be read and ``on_error`` skips it.

    Example:
        block = ShardBlock(start=0, index=[4, 0, 2], shards=[pile])
        for shard, i in block.pairs(): ...
    """

    start: int
    index: list[int]
    shards: list[Shard | None]
    which: list[int] | None = None

    def __len__(self) -> int:
        return len(self.index)

    def pairs(self) -> Iterator[tuple[Shard | None, int]]:
        """``(shard, index in shard)`` of each position, in order."""
        if self.which is None:
            shard = self.shards[0]
            return ((shard, i) for i in self.index)
        shards = self.shards
        return ((shards[w], i) for w, i in zip(self.which, self.index, strict=True))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.number, np.bool_))


def _stack(values: list[Any]) -> Any:
    first = values[0]
    if all(_is_number(v) for v in values):
        return np.asarray(values)
    if isinstance(first, np.ndarray) and all(
        isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype for v in values
    ):
        return np.stack(values)
    return values


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Default batch: ``__key__`` -> list of keys; a field -> numpy array when its values are
    numbers or arrays of one shape and dtype, else a list. A field missing from some samples is
    a list with None in their places. No samples give ``{"__key__": []}``."""
    if not samples:
        return {"__key__": []}
    names: dict[str, None] = {}
    for s in samples:
        if type(s) is not dict and not isinstance(s, Mapping):  # what a map returned: its fields cannot be told
            raise ConfigError(
                f"collate: the default collate batches samples that are dicts, not {type(s).__name__} values (what map returned?): "
                "return a dict from map, or give collate= (collate=list keeps the items as they are)"
            )
        names.update(dict.fromkeys(s))
    out: dict[str, Any] = {}
    for name in names:
        values = [s.get(name) for s in samples]
        out[name] = values if name.startswith("__") else _stack(values)
    return out


@dataclass
class Task:
    """Raw samples to process: ``ends[i]`` is the slice position after sample i (or after the batch)."""

    ends: list[int] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    end: int = 0


def cut_tasks(
    blocks: Iterable[ShardBlock],
    take: Callable[[Shard | None, int], dict[str, Any] | None],
    *,
    start: int,
    length: int,
    batch_size: int | None,
) -> Iterator[Task]:
    """Cut the raw samples of slice positions ``start .. length - 1`` into tasks by position.

    Task boundaries are multiples of ``batch_size`` (else of :data:`CHUNK`), so a skipped
    sample never shifts a batch. Batched, every batch is a task even when all its samples were
    skipped: each rank then yields ``len(loader)`` batches whatever fails. Unbatched, a chunk
    with no sample left is dropped.

    Args:
        blocks: the loader's blocks from slice position ``start`` on.
        take: ``take(pile, i)`` is sample ``i`` of ``pile``, or None when it is skipped.
        start, length: the first slice position read, and the slice length.
        batch_size: the loader's ``batch_size``, or None.
    """
    batched = batch_size is not None
    size = batch_size or CHUNK
    boundary = start - start % size + size
    task = Task()
    for block in blocks:
        for n, (shard, i) in enumerate(block.pairs()):
            pos = block.start + n + 1
            if pos > boundary:
                task.end = boundary
                if batched or task.samples:
                    yield task
                task = Task()
                boundary += size
            sample = take(shard, i)
            if sample is not None and shard is not None:  # a skipped pile gives no sample
                task.ends.append(pos)
                task.urls.append(shard.url)
                task.samples.append(sample)
        # let this block's piles go before the next is read: the loader frees a pile the
        # schedule is done with, and no reference may stay here while the reader refills its slot
        block = shard = None  # type: ignore[assignment]
    if task.samples or (batched and length > start):
        task.end = min(boundary, length)
        yield task


@dataclass
class Result:
    """``items`` as ``(position after it, item)``; ``failures`` are messages of skipped samples."""

    items: list[tuple[int, Any]]
    failures: list[str]


@dataclass(frozen=True)
class Step:
    """What is done to a task: transform each sample, skip failures if allowed, collate."""

    transform: Transform
    collate: Collate | None
    batched: bool
    on_error: str

    def __call__(self, task: Task) -> Result:
        done: list[tuple[int, Any]] = []
        failures: list[str] = []
        for end, url, sample in zip(task.ends, task.urls, task.samples, strict=True):
            try:
                done.append((end, self.transform(sample, url)))
            except Exception as e:
                if self.on_error == "raise":
                    raise
                failures.append(str(e))
        if not self.batched:
            return Result(done, failures)
        # a batch keeps its slot even when every sample failed: then it is collate([])
        batch = [item for _, item in done]
        try:
            return Result([(task.end, (self.collate or collate)(batch))], failures)
        except StopIteration as e:  # as map()'s: it would end the epoch early without a word
            raise RuntimeError(f"collate() raised StopIteration on the batch ending at position {task.end}") from e


def raw_batches(
    blocks: Iterable[ShardBlock],
    take: Callable[[Shard | None, int], dict[str, Any] | None],
    *,
    start: int,
    length: int,
    batch_size: int,
    columns: Callable[[Shard, list[int]], dict[str, Any] | None] | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(position after it, batch)`` of raw samples with the default :func:`collate`: what
    :func:`cut_tasks` and a batched :class:`Step` without decoding or ``map`` give, built a field
    at a time from each pile's columns (:meth:`Shard.columns`, or ``columns(shard, index)``)
    instead of a dict per sample.

    A batch is yielded as soon as its last position is read, not when the next one arrives.
    Positions of a skipped pile or sample keep their slots, as in :func:`cut_tasks`.
    """
    boundary = start - start % batch_size + batch_size
    pieces: list[dict[str, list[Any]] | list[dict[str, Any]]] = []
    pos, opened, yielded = start, False, False
    for block in blocks:
        index, pairs = block.index, None
        at = 0  # next item of index
        while at < len(index):
            n = min(len(index) - at, boundary - pos)
            cols = _block_columns(block, at, at + n, columns)
            if cols is not None:
                pieces.append(cols)
            else:  # one sample at a time: a skipped or irregular pile, or piles mixed position by position
                pairs = pairs if pairs is not None else list(block.pairs())
                taken = [(pile, take(pile, i)) for pile, i in pairs[at : at + n]]
                pieces.append([sample for pile, sample in taken if sample is not None and pile is not None])
            at, pos, opened = at + n, pos + n, True
            if pos == boundary:
                yield boundary, _join(pieces)
                pieces, opened, yielded = [], False, True
                boundary += batch_size
        # let this block's piles go before the next is read (see cut_tasks)
        block = pairs = None  # type: ignore[assignment]
    if opened or (not yielded and length > start):
        yield min(boundary, length), _join(pieces)


def _block_columns(
    block: ShardBlock, lo: int, hi: int, columns: Callable[[Shard, list[int]], dict[str, Any] | None] | None
) -> dict[str, Any] | None:
    """Positions ``lo .. hi - 1`` of ``block`` field by field (``columns(shard, index)``, else
    :meth:`Shard.columns`), or None where they must be taken one sample at a time (a skipped or
    irregular pile). Piles mixed position by position give one column dict a pile, put back in
    the positions' order."""

    def of(shard: Shard | None, index: list[int]) -> dict[str, Any] | None:
        return None if shard is None else shard.columns(index) if columns is None else columns(shard, index)

    index = block.index[lo:hi]
    if block.which is None:
        return of(block.shards[0], index)
    which = np.asarray(block.which[lo:hi])
    at = np.asarray(index)
    parts: list[Any] = []
    places: list[np.ndarray] = []
    for w in np.unique(which).tolist():
        mine = np.flatnonzero(which == w)
        cols = of(block.shards[w], at[mine].tolist())
        if cols is None or (parts and list(cols) != list(parts[0])):
            return None
        parts.append(cols)
        places.append(mine)
    order = np.empty(len(which), dtype=np.int64)
    order[np.concatenate(places)] = np.arange(len(which))  # place k takes value order[k] of the piles' values in turn
    out: dict[str, Any] = {}
    for name in parts[0]:
        values = _concat([part[name] for part in parts])
        out[name] = values.reordered(order) if type(values) is Located else reorder(values, order)
    return out


def _join(pieces: list[dict[str, list[Any]] | list[dict[str, Any]]]) -> dict[str, Any]:
    """One batch from its pieces: column dicts with the same fields are joined field by field;
    anything else is collated from single samples, as :func:`collate` would."""
    columns = [p for p in pieces if isinstance(p, dict)]
    if len(columns) == len(pieces) and columns and all(list(c) == list(columns[0]) for c in columns):
        if len(columns) == 1:
            return columns[0]
        return {name: _concat([c[name] for c in columns]) for name in columns[0]}
    samples: list[dict[str, Any]] = []
    for p in pieces:
        if isinstance(p, dict):
            names = list(p)
            samples += [dict(zip(names, row, strict=True)) for row in zip(*p.values(), strict=True)]
        else:
            samples += p
    return collate(samples)


def _concat(parts: list[Any]) -> Any:
    """One field's values from its pieces' (fields left in their piles stay so)."""
    if all(type(p) is Located for p in parts):
        return Located.concat(parts)
    return [v for p in parts for v in p]
