"""Orders to compare shuffles by: sequential reading and a WebDataset-style buffer shuffle.

Each function returns an *order*: the source indices in the order a reader yields them, for
:func:`shardkit.quality.measure`. The WebDataset-style order reproduces, step for step, what
``webdataset.WebDataset(urls, shardshuffle=100).shuffle(1000)`` (webdataset 1.0.2) does to
source shards holding consecutive source indices: its shard list goes through the buffer shuffle
with ``bufsize=shardshuffle`` and a fixed seed (the same shard order every epoch unless
``detshuffle``), then the samples go through the buffer shuffle with ``bufsize=1000`` and an
initial fill of 100, freshly seeded each epoch.

    order = webdataset_order([1000] * 50, seed=0, epoch=0)   # 50 shards of 1000 samples
    report = quality.measure(order, labels=labels, name="webdataset")
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardkit import seeds
from shardkit.seeds import Stream

__all__ = ["buffer_shuffle", "sequential_order", "webdataset_order"]


def sequential_order(n: int) -> np.ndarray:
    """Source order itself: what reading unshuffled shards one after another gives."""
    return np.arange(n, dtype=np.int64)


def buffer_shuffle(items: Sequence[int] | np.ndarray, *, bufsize: int, initial: int, uniforms: Sequence[float] | np.ndarray) -> np.ndarray:
    """WebDataset's ``_shuffle`` (1.0.2) on ``items``, with its random picks taken from ``uniforms``.

    The semantics are webdataset's: while the buffer is below ``bufsize`` each incoming item
    pulls one more with it; once the buffer holds ``min(initial, bufsize)`` items, every
    incoming item is followed by one output, picked uniformly from the buffer and replaced by the
    buffer's last item; at the end the buffer is drained the same way. Pick ``j`` takes index
    ``int(uniforms[j] * len(buffer))``; ``len(items)`` uniforms are needed.
    """
    initial = min(initial, bufsize)
    values = np.asarray(items).tolist()
    if len(uniforms) < len(values):
        raise ValueError(f"buffer_shuffle: {len(values)} items need as many uniforms, got {len(uniforms)}")
    us = np.asarray(uniforms, dtype=np.float64)
    buf: list[int] = []
    out: list[int] = []
    j = i = 0
    n = len(values)
    # fill: each step takes up to two items and, from ``initial`` on, outputs one; this ends
    # with the buffer holding exactly bufsize - 1 items (or with the input used up)
    while i < n and len(buf) < bufsize - 1:
        buf.append(values[i])
        i += 1
        if len(buf) < bufsize and i < n:
            buf.append(values[i])
            i += 1
        if len(buf) >= initial:
            j = _pick(buf, out, us[j], j)
    # steady state: append one item to the bufsize - 1, output one of the bufsize; picking the
    # new item outputs it, picking another puts the new item in its slot (webdataset's swap)
    if i < n:
        _steady(values[i:], (us[j : j + n - i] * bufsize).astype(np.int64).tolist(), buf, out)
        j += n - i
    while buf:
        j = _pick(buf, out, us[j], j)
    return np.asarray(out, dtype=np.int64)


def _steady(incoming: list[int], picks: list[int], buf: list[int], out: list[int]) -> None:
    last = len(buf)  # the index the incoming item would take when appended
    for x, k in zip(incoming, picks, strict=True):
        if k == last:
            out.append(x)
        else:
            out.append(buf[k])
            buf[k] = x


def _pick(buf: list[int], out: list[int], u: float, j: int) -> int:
    k = int(u * len(buf))
    out.append(buf[k])
    buf[k] = buf[-1]
    buf.pop()
    return j + 1


def webdataset_order(
    shard_counts: Sequence[int] | np.ndarray,
    *,
    seed: int = 0,
    epoch: int = 0,
    bufsize: int = 1000,
    initial: int = 100,
    shardshuffle: int = 100,
    detshuffle: bool = False,
) -> np.ndarray:
    """What ``WebDataset(urls, shardshuffle=shardshuffle).shuffle(bufsize)`` yields in ``epoch``.

    Shard ``s`` holds the consecutive source indices after those of shards ``0..s-1``. The shard
    order is drawn from ``seed`` alone (webdataset's default: it repeats every epoch), or from
    ``(seed, epoch)`` with ``detshuffle``; the sample buffer from ``(seed, epoch)``. A
    ``shardshuffle`` of 0 keeps the shards in order.
    """
    counts = np.asarray(shard_counts, dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(counts)))
    shards = np.arange(len(counts))
    if shardshuffle:
        rng = seeds.stream(Stream.WDS_SHARDS, seed, epoch if detshuffle else 0)
        shards = buffer_shuffle(shards, bufsize=shardshuffle, initial=min(100, shardshuffle), uniforms=rng.random(len(counts)))
    stream = np.concatenate([np.arange(offsets[s], offsets[s + 1]) for s in shards]) if len(shards) else np.zeros(0, np.int64)
    rng = seeds.stream(Stream.WDS_BUFFER, seed, epoch)
    return buffer_shuffle(stream, bufsize=bufsize, initial=initial, uniforms=rng.random(len(stream)))
