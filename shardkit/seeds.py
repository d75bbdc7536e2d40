"""Every random stream shardkit draws from, derived from a tagged entropy tuple.

Streams are ``SeedSequence((TAG, *values))``. The tag comes first and each tag always takes the
same number of values, because SeedSequence treats ``(a, b)`` and ``(a, b, 0)`` alike: without
both rules, the router's stream for one (seed, unit) could equal the plan's stream for some
(seed, epoch). All tags live here so that a new stream cannot reuse one by accident.
"""

from __future__ import annotations

import enum

import numpy as np

# numpy loads its random module on first use (~35 ms): here, with the imports, not before an
# epoch's first sample
import numpy.random


class Stream(enum.IntEnum):
    """The tag of each stream, and the values it is keyed by."""

    ROUTE = 0x52_4F_55_54  # (seed, unit): the pile of each sample in pass 1
    APPEND = 0x41_50_4E_44  # (seed, generation, unit): the pile of each sample an append adds
    SPLIT = 0x53_50_4C_54  # (seed, depth, *path): sub-piles of an oversized pile
    PILE_ORDER = 0x50_4F_52_44  # (seed, epoch): the order piles are read in
    IN_PILE = 0x49_4E_50_4C  # (seed, epoch, pile): the order within one pile
    MIX = 0x4D_49_58_30  # (seed, epoch, run): jitters of one run of positions in a mix=k order
    WDS_SHARDS = 0x57_44_53_30  # (seed, epoch): reference WebDataset-style shard order
    WDS_BUFFER = 0x57_44_53_31  # (seed, epoch): reference WebDataset-style buffer picks
    DEMO = 0x44_45_4D_4F  # (seed,): the demo's synthetic images
    SUBSAMPLE = 0x53_55_42_53  # (seed,): positions sampled by quality metrics on huge orders
    BLEND = 0x42_4C_4E_44  # (seed, epoch, part): a blend's schedule (part 0: its phase, then in-batch orders)


_ARITY = {
    Stream.ROUTE: 2,
    Stream.APPEND: 3,
    Stream.PILE_ORDER: 2,
    Stream.IN_PILE: 3,
    Stream.MIX: 3,
    Stream.WDS_SHARDS: 2,
    Stream.WDS_BUFFER: 2,
    Stream.DEMO: 1,
    Stream.SUBSAMPLE: 1,
    Stream.BLEND: 3,
}


def stream(tag: Stream, *values: int) -> np.random.Generator:
    """A PCG64 generator for ``tag`` keyed by ``values`` (non-negative ints).

    Raises:
        ValueError: the wrong number of values for ``tag`` (a programming error).
    """
    if tag is Stream.SPLIT:
        if len(values) < 2 or values[1] != len(values) - 2:
            raise ValueError("SPLIT streams take (seed, depth, *path) with depth == len(path)")
    elif len(values) != _ARITY[tag]:
        raise ValueError(f"{tag.name} streams take {_ARITY[tag]} values, got {len(values)}")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(tag), *map(int, values)])))
