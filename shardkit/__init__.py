"""shardkit: datasets shuffled for free, by a two-pass shuffle fused into preprocessing.

Pass 1 (:class:`PileWriter`, :func:`preprocess`) writes each sample into one of M pile tar
shards chosen uniformly at random. Pass 2 (:func:`loader`) permutes the piles every epoch,
shuffles each in RAM and prefetches the next.
"""

from __future__ import annotations

from shardkit.cli import add_pile_args, pile_kwargs
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
from shardkit.loader import Loader, loader
from shardkit.manifest import Manifest, PileInfo
from shardkit.options import LoaderOptions
from shardkit.preprocess import pile, preprocess
from shardkit.writer import PileOptions, PileWriter

__version__ = "0.1.0"

__all__ = [
    "Codecs",
    "ConfigError",
    "CorruptShardError",
    "DatasetExistsError",
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
    "SampleError",
    "ShardkitError",
    "__version__",
    "add_pile_args",
    "loader",
    "pile",
    "pile_kwargs",
    "preprocess",
]
