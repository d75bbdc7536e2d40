"""shardkit: datasets shuffled for free, by a two-pass shuffle fused into preprocessing.

Pass 1 (:class:`PileWriter`, :func:`preprocess`) writes each sample into one of M pile tar
shards chosen uniformly at random. Pass 2 (:func:`loader`) permutes the piles every epoch,
shuffles each in RAM and prefetches the next.

This module is the public surface: everything in ``__all__`` keeps working across versions;
the folders below it (``tar``, ``piles``, ``loading``, ``tools``, ``cli``) may change. Names are
imported on first use, so ``import shardkit`` (and the ``shardkit`` command) starts at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardkit._util import VERSION as __version__

if TYPE_CHECKING:
    from shardkit.cli import add_pile_args, load_job, pile_kwargs, run_job
    from shardkit.codecs import Codecs
    from shardkit.eager_shuffle import ShuffleOptions, shuffle
    from shardkit.errors import (
        ConfigError,
        CorruptShardError,
        DatasetExistsError,
        DatasetNotFoundError,
        DecodeError,
        InputError,
        ManifestError,
        PileTooLargeError,
        SampleError,
        ShardkitError,
        StorageError,
        WorkerError,
    )
    from shardkit.loading.blend.loader import loader
    from shardkit.loading.blend.spec import Blend, BlendSource
    from shardkit.loading.loader import Loader
    from shardkit.loading.options import LoaderOptions
    from shardkit.loading.random_access import MapDataset, open
    from shardkit.manifest import Manifest, PileInfo
    from shardkit.piles.options import PileOptions
    from shardkit.piles.preprocess import pile, preprocess
    from shardkit.piles.repile import repile
    from shardkit.piles.writer import PileWriter
    from shardkit.tools import DatasetInfo, Problem, QualityReport, compare_shuffles, gc, info, verify
    from shardkit.tools.export import export


_WHERE = {
    "Blend": "shardkit.loading.blend.spec",
    "BlendSource": "shardkit.loading.blend.spec",
    "Codecs": "shardkit.codecs",
    "ConfigError": "shardkit.errors",
    "CorruptShardError": "shardkit.errors",
    "DatasetExistsError": "shardkit.errors",
    "DatasetInfo": "shardkit.tools",
    "DatasetNotFoundError": "shardkit.errors",
    "DecodeError": "shardkit.errors",
    "InputError": "shardkit.errors",
    "Loader": "shardkit.loading.loader",
    "LoaderOptions": "shardkit.loading.options",
    "Manifest": "shardkit.manifest",
    "ManifestError": "shardkit.errors",
    "MapDataset": "shardkit.loading.random_access",
    "PileInfo": "shardkit.manifest",
    "PileOptions": "shardkit.piles.options",
    "PileTooLargeError": "shardkit.errors",
    "PileWriter": "shardkit.piles.writer",
    "Problem": "shardkit.tools",
    "QualityReport": "shardkit.tools",
    "SampleError": "shardkit.errors",
    "ShardkitError": "shardkit.errors",
    "ShuffleOptions": "shardkit.eager_shuffle",
    "StorageError": "shardkit.errors",
    "WorkerError": "shardkit.errors",
    "add_pile_args": "shardkit.cli",
    "compare_shuffles": "shardkit.tools",
    "export": "shardkit.tools.export",
    "gc": "shardkit.tools",
    "info": "shardkit.tools",
    "load_job": "shardkit.cli",
    "loader": "shardkit.loading.blend.loader",
    "open": "shardkit.loading.random_access",
    "pile": "shardkit.piles.preprocess",
    "pile_kwargs": "shardkit.cli",
    "preprocess": "shardkit.piles.preprocess",
    "repile": "shardkit.piles.repile",
    "run_job": "shardkit.cli",
    "shuffle": "shardkit.eager_shuffle",
    "verify": "shardkit.tools",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'shardkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


__all__ = [
    "Blend",
    "BlendSource",
    "Codecs",
    "ConfigError",
    "CorruptShardError",
    "DatasetExistsError",
    "DatasetInfo",
    "DatasetNotFoundError",
    "DecodeError",
    "InputError",
    "Loader",
    "LoaderOptions",
    "Manifest",
    "ManifestError",
    "MapDataset",
    "PileInfo",
    "PileOptions",
    "PileTooLargeError",
    "PileWriter",
    "Problem",
    "QualityReport",
    "SampleError",
    "ShardkitError",
    "ShuffleOptions",
    "StorageError",
    "WorkerError",
    "__version__",
    "add_pile_args",
    "compare_shuffles",
    "export",
    "gc",
    "info",
    "load_job",
    "loader",
    "open",
    "pile",
    "pile_kwargs",
    "preprocess",
    "repile",
    "run_job",
    "shuffle",
    "verify",
]
