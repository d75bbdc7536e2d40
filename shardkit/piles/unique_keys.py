"""Refuse a sample key repeated anywhere in what pass 1 or a writer is publishing, from the key hashes of its part files.

Every :class:`~shardkit.piles.parts.PileSink` keeps a 64-bit hash of each sample's key in its
key file. :func:`check_unique` sorts every hash of every pile (in bounded memory: bucket files
past :data:`CHECK_MEMORY`), reads back only the samples whose hashes meet, and lets their keys
decide: a hash collision is never an error, a key in two places always is, in one pile or in
two, whatever the seed routed where.

    check_unique([[(segments, part_path, hashes)] for each pile], budget=64 << 20, scratch="staging/")
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from shardkit import storage
from shardkit.errors import CorruptShardError, SampleError, ShardkitError
from shardkit.piles.parts import ADVICE, SEGMENT, Hashes, PileSink, keys_file
from shardkit.piles.parts import HASH as _HASH
from shardkit.tar import write
from shardkit.tar.keys import repeated_key, sample_at
from shardkit.tar.shard import Shard

# bucket files of the hashes past CHECK_MEMORY, in the scratch folder: BUCKET + five digits
BUCKET = "key-check-"

# the parts of one pile, each as (its segments as SEGMENT-number rows, its file, where its key hashes are)
PileParts = Sequence[tuple[np.ndarray, str, Hashes]]


# memory the key check may sort hashes in, at least (16 bytes a sample: 16.7 million samples);
# past it the hashes are split by value into bucket files on the key files' disk
CHECK_MEMORY = 256 << 20
# samples whose hashes meet placed in the piles at once (about 130 bytes each): enough to find a
# repeat (any one refuses the job), few enough that keys restarting in every input do not read
# the whole dataset back first
PLACED = 1 << 20


def check_unique(
    piles: Sequence[PileParts],
    *,
    budget: int,
    scratch: str,
    skipped: np.ndarray | Sequence[int] = (),
    unit_name: Callable[[int], str] | None = None,
    advice: str = ADVICE,
) -> None:
    """Refuse two samples with one key anywhere in what is being written: in one pile or in two.

    ``piles[p]`` lists pile p's part files; the pile is the segments of units not in
    ``skipped``, by unit and then position. The key hashes of every pile are compared in
    ``budget`` bytes of memory, at least :data:`CHECK_MEMORY` (past it, with bucket files in the
    local folder ``scratch``: see :func:`repeated_hashes`).
    Only samples whose hashes meet are read back, about :data:`PLACED` at a time, and their
    keys decide, so a hash collision is never an error.

    Raises:
        SampleError: two samples share a key; the message gives both piles and positions (and,
            with ``unit_name``, the units they came from) and ends with ``advice``: the first
            such repeat in pile order among the hash values placed together.
    """
    suspects, counts = repeated_hashes([hashes for pile in piles for _, _, hashes in pile], budget, scratch)
    _refuse_among(piles, suspects, counts, skipped, unit_name, advice)


def _refuse_among(
    piles: Sequence[PileParts],
    suspects: np.ndarray,
    counts: np.ndarray,
    skipped: np.ndarray | Sequence[int],
    unit_name: Callable[[int], str] | None,
    advice: str = ADVICE,
) -> None:
    """:func:`_refuse_repeats` over the hash values ``suspects`` (``counts[i]`` samples have
    ``suspects[i]``), in batches whose samples add up to about PLACED (a value with more alone)."""
    ends = np.cumsum(counts)
    lo = 0
    while lo < len(suspects):
        hi = max(lo + 1, int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + PLACED, side="right")))
        _refuse_repeats(piles, suspects[lo:hi], skipped, unit_name, advice)
        lo = hi


def _refuse_repeats(
    piles: Sequence[PileParts],
    suspects: np.ndarray,
    skipped: np.ndarray | Sequence[int],
    unit_name: Callable[[int], str] | None,
    advice: str = ADVICE,
) -> None:
    """Raise for the first key in pile order that two samples share, among those hashing to
    ``suspects`` (sorted)."""
    places: dict[str, list[tuple[int, int, int, int]]] = {}
    for p, pile in enumerate(piles):
        found, bounds = _read_hashes([hashes for _, _, hashes in pile])
        placed = _placed([table for table, _, _ in pile], skipped)
        for k, (table, path, _) in enumerate(pile):
            for key, (i, offset, unit) in _keys_at(path, table, placed[k], _among(found[bounds[k] : bounds[k + 1]], suspects)):
                places.setdefault(key, []).append((p, i, offset, unit))
    # the first repeat in the dataset's pile order: the second place of its key, and the first
    repeats = [(sorted(at)[1], min(at), key) for key, at in places.items() if len(at) > 1]
    if not repeats:
        return
    later, earlier, key = min(repeats)

    def where(at: tuple[int, int, int, int]) -> str:
        unit = [unit_name(at[3])] if unit_name is not None and at[3] >= 0 else []
        return sample_at(at[1], f"offset {at[2]}", *unit)

    first = where(earlier) if earlier[0] == later[0] else f"pile {earlier[0]}'s {where(earlier)}"
    raise SampleError(f"pile {later[0]}: {repeated_key(key, where(later), first)}{advice}")


def repeated_hashes(sources: Sequence[Hashes], budget: int, scratch: str) -> tuple[np.ndarray, np.ndarray]:
    """The hash values (sorted, distinct) that two or more samples of ``sources`` have, and how
    many samples have each.

    A sort needs 16 bytes a sample. When every hash fits ``budget`` (at least
    :data:`CHECK_MEMORY`), they are read and sorted at once. Past it, one read splits them by
    their top bits into bucket files in the local folder ``scratch`` that each fit (8 bytes a
    sample of disk, removed after), and each bucket is sorted on its own. Each key file is read
    straight through, over the span its runs cover, whichever piles they are of: a hash in it
    that no run names can only add a candidate, which the keys then clear.
    """
    budget = max(budget, CHECK_MEMORY)
    spans: dict[str, tuple[int, int]] = {}
    for source in sources:
        if len(source.runs):
            lo, hi = int(source.runs[:, 0].min()), int((source.runs[:, 0] + source.runs[:, 1]).max())
            was = spans.get(source.path, (lo, hi))
            spans[source.path] = (min(lo, was[0]), max(hi, was[1]))
    total = sum(hi - lo for lo, hi in spans.values())
    bits = max(0, math.ceil(math.log2(max(1.0, 2 * total * _HASH.itemsize / budget))))
    piece = max(1, budget // (4 * _HASH.itemsize))
    if not bits:
        return _repeated(np.concatenate([_NONE, *(part for path, span in spans.items() for part in _span(path, *span, piece))]))
    found: list[tuple[np.ndarray, np.ndarray]] = []
    buckets = [os.path.join(scratch, f"{BUCKET}{value:05d}") for value in range(1 << bits)]
    edges = np.arange(1, 1 << bits, dtype=np.uint64) << np.uint64(64 - bits)  # where each bucket's values start
    written: set[int] = set()
    try:
        for path, span in spans.items():
            for part in _span(path, *span, piece):
                part.sort()
                cuts = [0, *np.searchsorted(part, edges).tolist(), len(part)]
                for value, (a, b) in enumerate(itertools.pairwise(cuts)):
                    if b > a:
                        written.add(value)
                        _add(buckets[value], part[a:b])
        found += [_repeated(np.frombuffer(storage.read_bytes(buckets[v]), dtype=_HASH).copy()) for v in sorted(written)]
    finally:
        for value in written:
            with contextlib.suppress(ShardkitError):
                storage.remove(buckets[value])
    # each bucket's values are above the last's
    return np.concatenate([_NONE, *(v for v, _ in found)]), np.concatenate([_COUNTS_NONE, *(c for _, c in found)])


def _add(bucket: str, hashes: np.ndarray) -> None:
    """Append ``hashes`` to the bucket file ``bucket``."""
    with storage.guard(bucket, "write key hashes", size=hashes.nbytes):
        fd = storage.open_fd(bucket, append=True)
        try:
            storage.write_chunks(fd, [hashes.data.cast("B")])
        finally:
            os.close(fd)


def _repeated(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The values (sorted, distinct) that ``hashes`` holds twice or more, and how many times each."""
    hashes.sort()
    values, counts = np.unique(hashes[1:][hashes[1:] == hashes[:-1]], return_counts=True)
    return values, counts + 1


def _span(path: str, lo: int, hi: int, most: int) -> Iterator[np.ndarray]:
    """Hashes ``lo`` to ``hi`` of the key file ``path``, read in order at most ``most`` at a time."""
    size = _HASH.itemsize
    with storage.guard(path, "read key hashes"), storage.open_read(path) as f:
        f.seek(lo * size)
        for at in range(lo, hi, most):
            part = np.empty(min(most, hi - at), dtype=_HASH)
            if f.readinto(part.data.cast("B")) != part.nbytes:
                raise CorruptShardError(f"{path}: ends before the key hashes recorded up to offset {hi * size}")
            yield part


def check_sink(sink: PileSink) -> None:
    """:func:`check_unique` over every pile of ``sink``, the one part of each (after its last
    flush), in the memory its buffer held (free once flushed)."""
    if sink.hashed < 2:
        return
    # the key file holds every pile's hashes: sorted at once, then placed pile by pile only if two meet
    everything = Hashes(keys_file(sink.directory), np.array([[0, sink.hashed]], dtype=np.int64))
    suspects, counts = repeated_hashes([everything], sink.limit, sink.directory)
    if not len(suspects):
        return
    piles = [
        [(np.frombuffer(sink.segments[p], dtype=np.int64).reshape(-1, SEGMENT), sink.part(p), Hashes.of(sink.directory, sink.key_runs[p]))]
        for p in range(len(sink.sizes))
    ]
    _refuse_among(piles, suspects, counts, (), None)


_NONE = np.zeros(0, dtype=_HASH)
_COUNTS_NONE = np.zeros(0, dtype=np.int64)


def _read_hashes(parts: Sequence[Hashes]) -> tuple[np.ndarray, list[int]]:
    """The key hashes of every part, in one array; part k's are ``[bounds[k]:bounds[k + 1]]``."""
    sizes = [int(p.runs[:, 1].sum()) for p in parts]
    bounds = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).tolist()
    found = np.empty(bounds[-1], dtype=_HASH)
    view = found.data.cast("B")
    size = _HASH.itemsize
    for part, lo in zip(parts, bounds[:-1], strict=True):
        if not len(part.runs):
            continue
        with storage.guard(part.path, "read key hashes"), storage.open_read(part.path) as f:
            for first, count in part.runs.tolist():
                f.seek(first * size)
                if f.readinto(view[lo * size : (lo + count) * size]) != count * size:
                    raise CorruptShardError(f"{part.path}: ends before the {count} key hashes recorded at offset {first * size}")
                lo += count
    return found, bounds


def _among(hashes: np.ndarray, suspects: np.ndarray, chunk: int = 1 << 20) -> np.ndarray:
    """Indices of ``hashes`` found in the sorted ``suspects``, a chunk at a time (a bounded
    temporary, where ``np.isin`` would sort a copy of all of them)."""
    found = []
    for lo in range(0, len(hashes), chunk):
        part = hashes[lo : lo + chunk]
        at = np.minimum(np.searchsorted(suspects, part), len(suspects) - 1)
        found.append(lo + np.flatnonzero(suspects[at] == part))
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _placed(tables: Sequence[np.ndarray], skipped: np.ndarray | Sequence[int]) -> list[np.ndarray]:
    """Per part, per segment: its first sample's position and byte offset in the assembled pile
    (-1 for a skipped unit's). The pile is every kept segment, by unit and then position."""
    rows = np.concatenate(
        [np.column_stack([t[:, :4], np.full(len(t), k), np.arange(len(t))]) for k, t in enumerate(tables)]
        + [np.zeros((0, 6), dtype=np.int64)]
    )
    rows = rows[~np.isin(rows[:, 0], np.asarray(skipped, dtype=np.int64))]
    rows = rows[np.lexsort((rows[:, 1], rows[:, 0]))]
    nbytes = rows[:, 2] - rows[:, 1]
    firsts = np.column_stack([np.cumsum(rows[:, 3]) - rows[:, 3], np.cumsum(nbytes) - nbytes])
    placed = [np.full((len(t), 2), -1, dtype=np.int64) for t in tables]
    for k, out in enumerate(placed):
        mine = rows[:, 4] == k
        out[rows[mine, 5]] = firsts[mine]
    return placed


def _keys_at(path: str, table: np.ndarray, placed: np.ndarray, samples: np.ndarray) -> list[tuple[str, tuple[int, int, int]]]:
    """(key, (position, offset, unit)) in the assembled pile of samples ``samples`` of one part
    file (by their order in it); those of skipped units are left out. Reads only their segments."""
    ends = np.cumsum(table[:, 3])
    found = []
    rows = np.searchsorted(ends, samples, side="right")
    for row in np.unique(rows).tolist():
        if placed[row, 0] < 0:
            continue
        unit, start, end, count = table[row, :4].tolist()
        segment = Shard(path, storage.read_range(path, start, end) + write.TRAILER)
        if len(segment) != count:  # add() keeps two samples of one key from meeting in a segment
            raise CorruptShardError(f"{path}: bytes {start} to {end} hold {len(segment)} samples, {count} were written there")
        offsets = segment.sample_offsets()
        for i in (samples[rows == row] - (ends[row] - count)).tolist():
            found.append((segment.keys[i], (int(placed[row, 0]) + i, int(placed[row, 1]) + offsets[i], unit)))
    return found
