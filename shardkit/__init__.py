"""shardkit: datasets shuffled for free, by a two-pass shuffle fused into preprocessing.

Pass 1 (:class:`PileWriter`, :func:`preprocess`) writes each sample into one of M pile tar
shards chosen uniformly at random. Pass 2 (:func:`loader`) permutes the piles every epoch,
shuffles each in RAM and prefetches the next.
"""

from __future__ import annotations

from shardkit.audit import DatasetInfo, Problem, info, verify
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
)
from shardkit.jobs import load_job, run_job
from shardkit.manifest import Manifest, PileInfo
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
    "Manifest",
    "ManifestError",
    "PileInfo",
    "PileOptions",
    "PileTooLargeError",
    "PileWriter",
    "Problem",
    "SampleError",
    "ShardkitError",
    "ShuffleOptions",
    "__version__",
    "info",
    "load_job",
    "run_job",
    "shuffle",
    "verify",
]
