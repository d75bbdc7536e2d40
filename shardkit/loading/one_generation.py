"""The ranks of one torch.distributed job read one generation of a dataset, even while it grows.

Each rank opens a dataset when it makes its loader, and reads the generation that is latest at
that moment. An append that publishes between two ranks' loaders would give them different
samples and different batch counts: the ranks would stop at different steps, and a DDP job
would hang in the collective of the rank that runs out first. So a loader whose ranks are the
process group's (its rank and world size are torch.distributed's, as they are by default) asks
the group's store: the first rank to open a dataset writes which generation it read (and a
fingerprint of its files), and every other rank opens that generation, kept beside the newer one
until ``shardkit gc``'s grace period ends.

Loaders are matched by order: the k-th such loader a rank makes of a dataset reads what the
first rank to make its k-th loader of it read. A job that makes a new loader to take in appends
(each day, each epoch) makes it on every rank and gets the new generation on every rank. A rank
that makes one more such loader than the others (a look at the data on rank 0 alone) shifts the
pairing of every later one: make such a loader with ``world_size=1``, which asks nobody. A rank
sent to an older generation than its own latest says so in a warning. Loaders with other ranks
(a sub-world, several loader ranks in one process), and loaders made inside DataLoader workers,
ask nobody. The store's ``compare_set`` does not wait, so a rank that never makes a loader holds
nobody up. Plain tar shards have no generations: a rank whose shards differ from the first
rank's (a shard added to the pattern's directory in between) is refused, naming both.

    source = one_generation(resolve("data/"), "data/", options)   # on rank 1: the generation rank 0 opened
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import sys
import threading
from typing import Any

from shardkit.errors import ConfigError, ShardkitError, prefixed
from shardkit.loading.blend.source import BlendedSource, blend_of
from shardkit.loading.options import LoaderOptions, distributed
from shardkit.loading.source import Source, at_generation

log = logging.getLogger(__name__)

# the store's keys: PREFIX + the path a loader was given (a hash of a list of shard URLs) + "#" + the loader's place among this process's loaders of it
PREFIX = "shardkit/one-generation/"

_made: collections.Counter[str] = collections.Counter()  # loaders made of each dataset in this process, under a store
_lock = threading.Lock()


def one_generation(source: Source, asked: Any, options: LoaderOptions) -> Source:
    """``source``, resolved from ``asked`` (a dataset's path, shards' URLs or patterns), or the
    generation of it that the first rank of this torch.distributed job to open it read (see the
    module's docstring); ``source`` itself where the loader asks nobody.

    Raises:
        ConfigError: the dataset holds other files than the first rank's at that generation
            (overwritten and grown again), or, for plain shards, the shards differ.
        DatasetNotFoundError: the first rank's generation is gone (collected by ``shardkit gc``).
    """
    store = job_store(options)
    if store is None:
        return source
    return _as_first(store, asked, source, options.rank)


def blend_of_first(blended: BlendedSource, options: LoaderOptions) -> BlendedSource:
    """:func:`one_generation` for each source of a blend: ``blended``, or the blend of every
    source as the first rank read it.

    Raises:
        ConfigError: as :func:`one_generation`, the source named.
    """
    store = job_store(options)
    if store is None or blended.spec is None:
        return blended
    parts = []
    for name, asked, part in zip(blended.names, blended.spec.sources, blended.parts, strict=True):
        try:
            parts.append(_as_first(store, asked.path, part, options.rank))
        except ShardkitError as e:
            prefixed(e, f"blend source {name!r}: ")
            raise
    same = all(a is b for a, b in zip(parts, blended.parts, strict=True))
    return blended if same else blend_of(blended.spec, parts, options)


def job_store(options: LoaderOptions) -> Any | None:
    """The store of torch.distributed's default process group, when it is initialized with more
    than one rank and the loader's ranks are the group's; None otherwise, in a DataLoader worker,
    or where this torch has no such store to give."""
    dist = distributed()
    if dist is None or dist.get_world_size() < 2 or _in_dataloader_worker():
        return None
    if (options.rank, options.world_size) != (dist.get_rank(), dist.get_world_size()):
        return None  # a sub-world, or one of several loader ranks in this process: whose generation to follow is not known
    default_store = getattr(getattr(dist, "distributed_c10d", None), "_get_default_store", None)
    try:
        return default_store() if default_store is not None else None
    except (RuntimeError, ValueError):  # pragma: no cover - a process group without a store
        return None


def _in_dataloader_worker() -> bool:
    """Whether this is a DataLoader worker: forked from a rank, it shares the rank's connection to
    the store, which one process at a time may use. A loader made there reads the latest generation."""
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


def _as_first(store: Any, asked: Any, source: Source, rank: int | None) -> Source:
    """``source`` (resolved here from ``asked``) as the first rank to make its loader of the same
    place read it: ``source`` itself, or the generation it read, checked to be the same files."""
    if isinstance(asked, (str, os.PathLike)):
        name = os.fspath(asked)
    else:
        name = hashlib.sha256(json.dumps([os.fspath(a) for a in asked]).encode()).hexdigest()
    with _lock:
        place = _made[name]
        _made[name] += 1
    mine = {"rank": rank, "generation": source.generation, "fingerprint": source.fingerprint(), "files": len(source.piles)}
    first = json.loads(store.compare_set(f"{PREFIX}{name}#{place}", "", json.dumps(mine, sort_keys=True)))
    if first["fingerprint"] == mine["fingerprint"]:
        return source
    if first["generation"] is None or source.generation is None:
        raise ConfigError(
            f"{source.name}: rank {rank} finds other shards than rank {first['rank']} found when it made its loader "
            f"({len(source.piles)} shards here, {first['files']} there, or the same shards with other sizes or sample counts): "
            "plain shards have no generations to agree on, so every rank must see the same files. Add shards only between "
            "jobs, or make them a dataset (shardkit pile)"
        )
    found = at_generation(source.name, first["generation"])
    if found.fingerprint() != first["fingerprint"]:
        raise ConfigError(
            f"{source.name}: rank {first['rank']} opened generation {first['generation']}, and generation "
            f"{first['generation']} here lists other files (the dataset was overwritten since, and grew again, or the "
            "ranks see different copies of it at this path): the ranks cannot read one dataset"
        )
    if first["generation"] < source.generation:
        log.warning(
            "%s: rank %s reads generation %s, which rank %s read when it made its loader number %d of this dataset "
            "(generation %s is the latest now). If a rank made a loader of it that the others did not, every later "
            "loader follows another rank's older one: make such a loader with world_size=1",
            source.name,
            rank,
            first["generation"],
            first["rank"],
            place + 1,
            source.generation,
        )
    return found
