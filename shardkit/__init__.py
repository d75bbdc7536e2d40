"""shardkit: datasets shuffled for free, by a two-pass shuffle fused into preprocessing.

Pass 1 (:class:`PileWriter`, :func:`preprocess`) writes each sample into one of M pile tar
shards chosen uniformly at random. Pass 2 (:func:`loader`) permutes the piles every epoch,
shuffles each in RAM and prefetches the next.
"""

from __future__ import annotations

from shardkit.audit import DatasetInfo, Problem, info, verify
from shardkit.cli import add_pile_args, pile_kwargs
from shardkit.codecs import Codecs
from shardkit.compare import compare_shuffles
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
from shardkit.jobs import load_job, run_job
from shardkit.loader import Loader, loader
from shardkit.manifest import Manifest, PileInfo
from shardkit.options import LoaderOptions
from shardkit.preprocess import pile, preprocess
from shardkit.quality import QualityReport
from shardkit.repile import repile
from shardkit.shuffle import ShuffleOptions, shuffle
from shardkit.writer import PileOptions, PileWriter

__version__ = "0.1.0"

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
