"""The ranks of one torch.distributed job read one generation of a dataset, even while it grows.

Each rank opens a dataset when it makes its loader, and reads the generation that is latest at
that moment. An append that publishes between two ranks' loaders would give them different
samples and different batch counts: the ranks would stop at different steps, and a DDP job
would hang in the collective of the rank that runs out first. So under an initialized
torch.distributed with several ranks, the first rank to open a dataset writes which generation
it read (and a fingerprint of its files) into the process group's store, and every other rank
opens that generation, kept beside the newer one until ``shardkit gc``'s grace period ends.

Loaders are matched by order: the k-th loader a rank makes of a dataset reads what the first
rank to make its k-th loader of it read. A job that makes a new loader to pick up appends
(each day, each epoch) makes it on every rank and gets the new generation on every rank. The
store's ``compare_set`` does not wait, so a rank that never makes a loader holds nobody up.
Plain tar shards have no generations: a rank whose shards differ from the first rank's (a
shard added to the pattern's directory in between) is refused, naming both.

    source = one_generation(resolve("data/"), options)     # on rank 1: the generation rank 0 opened
"""

from __future__ import annotations

import collections
import json
import logging
import os
import sys
import threading
from typing import Any

from shardkit.errors import ConfigError, ShardkitError, prefixed
from shardkit.loading.blend.source import BlendedSource, resolve_blend
from shardkit.loading.options import LoaderOptions, distributed
from shardkit.loading.source import Source, at_generation

log = logging.getLogger(__name__)

# the store's keys: PREFIX + the path (or list of shard URLs) a loader was given + "#" + the loader's place among this process's loaders of it
PREFIX = "shardkit/one-generation/"

_made: collections.Counter[str] = collections.Counter()  # loaders made of each dataset in this process, under a store
_lock = threading.Lock()


def one_generation(source: Source, asked: Any, options: LoaderOptions) -> Source:
    """``source``, resolved from ``asked`` (a dataset's path, shards' URLs or patterns), or the
    generation of it that the first rank of this torch.distributed job to open it read (see the
    module's docstring); ``source`` itself outside such a job, or for a loader whose
    ``world_size`` is 1 (each rank reads the whole dataset).

    Raises:
        ConfigError: the dataset holds other files than the first rank's at that generation
            (overwritten and grown again), or, for plain shards, the shards differ.
        DatasetNotFoundError: the first rank's generation is gone (collected by ``shardkit gc``).
    """
    store = job_store(options)
    if store is None:
        return source
    first = _first(store, asked, source, options.rank)
    return source if first is None else _as_first(source, first, options.rank)


def blend_of_first(blended: BlendedSource, options: LoaderOptions) -> BlendedSource:
    """:func:`one_generation` for each source of a blend: ``blended``, or the blend resolved
    again with every source at the generation the first rank read.

    Raises:
        ConfigError: as :func:`one_generation`, the source named.
    """
    store = job_store(options)
    if store is None or blended.spec is None:
        return blended
    generations, moved = {}, False
    for name, asked, part in zip(blended.names, blended.spec.sources, blended.parts, strict=True):
        first = _first(store, asked.path, part, options.rank)
        try:
            found = part if first is None else _as_first(part, first, options.rank)
        except ShardkitError as e:
            prefixed(e, f"blend source {name!r}: ")
            raise
        moved = moved or found is not part
        if found.generation is not None:
            generations[name] = found.generation
    return resolve_blend(blended.spec, options, generations=generations) if moved else blended


def job_store(options: LoaderOptions) -> Any | None:
    """The store of torch.distributed's default process group, when it is initialized with more
    than one rank and the loader's ranks split the data (None otherwise, or where this torch has
    no such store to give)."""
    dist = distributed()
    if dist is None or dist.get_world_size() < 2 or (options.world_size or 1) < 2 or _in_dataloader_worker():
        return None
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


def _first(store: Any, asked: Any, source: Source, rank: int | None) -> dict[str, Any] | None:
    """What the first rank to open this process's next loader of ``asked`` (resolved here as
    ``source``) read; None when that was this rank, or it read the same files."""
    name = os.fspath(asked) if isinstance(asked, (str, os.PathLike)) else json.dumps([os.fspath(a) for a in asked])
    with _lock:
        place = _made[name]
        _made[name] += 1
    mine = {"rank": rank, "generation": source.generation, "fingerprint": source.fingerprint(), "files": len(source.piles)}
    said = json.loads(store.compare_set(f"{PREFIX}{name}#{place}", "", json.dumps(mine, sort_keys=True)))
    return None if said["fingerprint"] == mine["fingerprint"] else said


def _as_first(source: Source, first: dict[str, Any], rank: int | None) -> Source:
    """The generation of ``source`` the first rank read (``first``), checked to be the same files."""
    if first["generation"] is None or source.generation is None:
        raise ConfigError(
            f"{source.name}: rank {rank} finds other shards than rank {first['rank']} found when it made its loader "
            f"({len(source.piles)} shards here, {first['files']} there; fingerprint {source.fingerprint()} here, "
            f"{first['fingerprint']} there): plain shards have no generations to agree on, so every rank must see the same "
            "files. Add shards only between jobs, or make them a dataset (shardkit pile)"
        )
    found = at_generation(source.name, first["generation"])
    if found.fingerprint() != first["fingerprint"]:
        raise ConfigError(
            f"{source.name}: rank {first['rank']} opened generation {first['generation']}, and generation "
            f"{first['generation']} here lists other files (the dataset was overwritten since, and grew again): the ranks "
            "cannot read one dataset. Start the job again"
        )
    log.info(
        "%s: rank %s reads generation %s, which rank %s opened first (generation %s is the latest now)",
        source.name,
        rank,
        first["generation"],
        first["rank"],
        source.generation,
    )
    return found
