"""The ranks of one torch.distributed job read one generation of a dataset, even while it grows.

Each rank opens a dataset when it makes its loader, and reads the generation that is latest at
that moment. An append that publishes between two ranks' loaders would give them different
samples and different batch counts: the ranks would stop at different steps, and a DDP job
would hang in the collective of the rank that runs out first. So under a torch.distributed
process group of several processes, a loader split over several ranks asks the group's store:
the first to open a dataset writes which generation it read (and a fingerprint of its files),
and every other opens that generation, kept beside the newer one until ``shardkit gc``'s grace
period ends.

Loaders are matched by their dataset, their world size and order: the k-th loader a process
makes of a dataset for a given loader rank reads what the first of all k-th loaders of that
dataset and world size read. So the processes that share a loader rank (tensor-parallel peers
reading one data-parallel share) and several loader ranks made in one process all agree, and a
job that makes new loaders to take in appends (each day, each epoch) gets the new generation
everywhere. A process that makes one more such loader than the others (a look at the data on
rank 0 alone) shifts the pairing of its later ones: make such a loader with ``world_size=1``,
which asks nobody. A loader sent to an older generation than its own latest says so in a
warning. Loaders made inside DataLoader workers ask nobody. Nodes that each hold their own
different data at one path, split over their local ranks, are refused (their fingerprints
differ); identical copies agree. The store's ``compare_set`` does not wait, so a rank that never makes a loader holds
nobody up. Plain tar shards have no generations: a rank whose shards differ from the first
rank's (a shard added to the pattern's directory in between) is refused, naming both. The notes
live as long as the store: torchrun makes a new one for each attempt, but a job started again on
a store that outlived it (a ``FileStore`` file left behind) would follow the older job's loaders.

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
from collections.abc import Callable
from typing import Any

from shardkit import manifest
from shardkit.dataset.transaction import Dataset
from shardkit.errors import ConfigError, ShardkitError, prefixed
from shardkit.loading.blend.source import BlendedSource, blend_of
from shardkit.loading.options import LoaderOptions, distributed
from shardkit.loading.source import Source, at_generation, of_manifest

log = logging.getLogger(__name__)

# the store's keys: PREFIX + the path a reader was given (a hash of a list of shard URLs) + "|" + its kind (a loader's
# world size, or "open") + "#" + its place among the readers of that kind this process made of it for the same rank
PREFIX = "shardkit/one-generation/"

# readers made in this process under a store, by dataset, kind (a loader's world size, or "open") and loader rank
_made: collections.Counter[tuple[str, str, int | None]] = collections.Counter()
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
    return _as_first(store, asked, source, options.rank, str(options.world_size))


def blend_of_first(blended: BlendedSource, options: LoaderOptions) -> BlendedSource:
    """:func:`one_generation` for each source of a blend: ``blended``, or the blend of every
    source as the first rank read it.

    Raises:
        ConfigError: as :func:`one_generation`, the source named.
    """
    store = job_store(options)
    if store is None or blended.spec is None:
        return blended
    parts, kind = [], str(options.world_size)
    counted = {key: _made[key] for key in ((_name(a.path), kind, options.rank) for a in blended.spec.sources)}
    for name, asked, part in zip(blended.names, blended.spec.sources, blended.parts, strict=True):
        try:
            parts.append(_as_first(store, asked.path, part, options.rank, kind))
        except BaseException as e:
            with _lock:  # none of the blend's readers counts: trying again takes the same places
                for key, count in counted.items():
                    _made[key] = count
            if isinstance(e, ShardkitError):
                prefixed(e, f"blend source {name!r}: ")
            raise
    same = all(a is b for a, b in zip(parts, blended.parts, strict=True))
    return blended if same else blend_of(blended.spec, parts, options)


def manifest_of_first(root: str, found: manifest.Manifest) -> manifest.Manifest:
    """For :func:`shardkit.open`: ``found`` (the manifest of the dataset ``root``, read here), or
    that of the generation the first process of this torch.distributed job to open the dataset
    read (a ``DistributedSampler`` splits the dataset's length among the ranks: each must see the
    same). Opened datasets pair up by order, apart from loaders. Outside such a job, ``found``.

    Raises:
        ConfigError, DatasetNotFoundError: as :func:`one_generation`.
    """
    dist = distributed()
    store = _group_store(dist)
    if store is None:
        return found
    pinned: list[manifest.Manifest] = []

    def at(generation: int) -> Source:  # the manifest read and checked once, and kept
        pinned.append(Dataset(root).pinned(generation))
        return of_manifest(root, pinned[-1])

    source = of_manifest(root, found)
    return found if _as_first(store, root, source, dist.get_rank(), "open", at=at) is source else pinned[-1]


def job_store(options: LoaderOptions) -> Any | None:
    """The store of torch.distributed's default process group, when it is initialized with more
    than one process and the loader is split over several ranks; None otherwise, in a DataLoader
    worker, or where this torch has no such store to give."""
    return _group_store(distributed()) if (options.world_size or 1) > 1 else None


def _group_store(dist: Any) -> Any | None:
    """:func:`job_store`'s store, whatever the loader."""
    if dist is None or dist.get_world_size() < 2 or _in_dataloader_worker():
        return None
    default_store = getattr(getattr(dist, "distributed_c10d", None), "_get_default_store", None)
    try:
        return default_store() if default_store is not None else None
    except (RuntimeError, ValueError):  # pragma: no cover - a process group without a store
        return None


def _who(process: int, rank: int | None) -> str:
    """A loader as its messages name it: ``"rank 3"``, or ``"rank 3 (loader rank 1)"`` where the
    loader's rank is not the process's."""
    return f"rank {process}" if rank == process else f"rank {process} (loader rank {rank})"


def _in_dataloader_worker() -> bool:
    """Whether this is a DataLoader worker: forked from a rank, it shares the rank's connection to
    the store, which one process at a time may use. A loader made there reads the latest generation."""
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


def _as_first(store: Any, asked: Any, source: Source, rank: int | None, kind: str, *, at: Callable[[int], Source] | None = None) -> Source:
    """``source`` (resolved here from ``asked``) as the first reader in the same place read it:
    ``source`` itself, or the generation it read (``at(generation)``, by default
    :func:`~shardkit.loading.source.at_generation`), checked to be the same files. The place: the
    reader's ``kind`` (a loader's world size, or ``"open"``) and how many readers of this kind
    this process made before of ``asked`` for the same (loader) ``rank``; a reader that raises
    does not count, so trying again takes the same place."""
    name = _name(asked)
    with _lock:
        place = _made[name, kind, rank]
    found = _placed(store, f"{PREFIX}{name}|{kind}#{place}", source, rank, kind, place, at)
    with _lock:
        _made[name, kind, rank] = max(_made[name, kind, rank], place + 1)
    return found


def _name(asked: Any) -> str:
    """How the store's keys name what a reader was given: the path, or a hash of a list of shard URLs."""
    if isinstance(asked, (str, os.PathLike)):
        return os.fspath(asked)
    return hashlib.sha256(json.dumps([os.fspath(a) for a in asked]).encode()).hexdigest()


def _placed(store: Any, key: str, source: Source, rank: int | None, kind: str, place: int, at: Callable[[int], Source] | None) -> Source:
    """:func:`_as_first` once its place, ``key``, is known."""
    me = _who(distributed().get_rank(), rank)
    mine = {"who": me, "generation": source.generation, "fingerprint": source.fingerprint(), "files": len(source.piles)}
    first = json.loads(store.compare_set(key, "", json.dumps(mine, sort_keys=True)))
    if first["fingerprint"] == mine["fingerprint"]:
        return source
    if first["generation"] is None or source.generation is None:
        raise ConfigError(
            f"{source.name}: {me} finds other shards than {first['who']} found when it made its loader "
            f"({len(source.piles)} shards here, {first['files']} there, or the same shards with other sizes or sample counts): "
            "plain shards have no generations to agree on, so every rank must see the same files. Add shards only between "
            "jobs, or make them a dataset (shardkit pile)"
        )
    found = (at or (lambda generation: at_generation(source.name, generation)))(first["generation"])
    if found.fingerprint() != first["fingerprint"]:
        raise ConfigError(
            f"{source.name}: {first['who']} opened generation {first['generation']}, and generation "
            f"{first['generation']} here lists other files (the dataset was overwritten since, and grew again, or the "
            "ranks see different copies of it at this path): the ranks cannot read one dataset"
        )
    if first["generation"] < source.generation:
        what, alone = ("opened dataset", "open it with one_generation=False") if kind == "open" else ("loader", "make it with world_size=1")
        log.warning(
            "%s: %s reads generation %s, which %s read for its %s number %d of this dataset (generation %s is the latest "
            "now). If a rank made one the others did not, every later one follows another rank's older one: %s",
            source.name,
            me,
            first["generation"],
            first["who"],
            what,
            place + 1,
            source.generation,
            alone,
        )
    return found
