"""shardkit: datasets shuffled for free, by a two-pass shuffle fused into preprocessing.

Pass 1 (:class:`PileWriter`, :func:`preprocess`) writes each sample into one of M pile tar
shards chosen uniformly at random. Pass 2 (:func:`loader`) permutes the piles every epoch,
shuffles each in RAM and prefetches the next.

This module is the public surface: everything in ``__all__`` keeps working across versions;
the folders below it (``tar``, ``piles``, ``loading``, ``tools``, ``cli``) may change.
"""

from __future__ import annotations

from shardkit._util import VERSION as __version__
from shardkit.cli import add_pile_args, load_job, pile_kwargs, run_job
from shardkit.codecs import Codecs
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
    WorkerError,
)
from shardkit.loading import Loader, LoaderOptions, loader
from shardkit.manifest import Manifest, PileInfo
from shardkit.piles import PileOptions, PileWriter, pile, preprocess, repile
from shardkit.shuffle import ShuffleOptions, shuffle
from shardkit.tools import DatasetInfo, Problem, QualityReport, compare_shuffles, info, verify

__all__ = [
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
    "PileInfo",
    "PileOptions",
    "PileTooLargeError",
    "PileWriter",
    "Problem",
    "QualityReport",
    "SampleError",
    "ShardkitError",
    "ShuffleOptions",
    "WorkerError",
    "__version__",
    "add_pile_args",
    "compare_shuffles",
    "info",
    "load_job",
    "loader",
    "pile",
    "pile_kwargs",
    "preprocess",
    "repile",
    "run_job",
    "shuffle",
    "verify",
]
