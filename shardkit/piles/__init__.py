"""Pass 1 of the shuffle: every sample to a pile drawn at random, the piles published whole.

The data flow, one module a step: the :mod:`~shardkit.piles.router` draws each sample's pile
from ``(seed, unit, ordinal)``; :mod:`~shardkit.piles.encode` makes a sample's tar members (or
:mod:`~shardkit.piles.canonical` copies them out of an existing shard); :mod:`~shardkit.piles.parts`
appends them to per-pile part files; :mod:`~shardkit.piles.units` runs the user's function over
input units and :mod:`~shardkit.piles.preprocess` runs units in worker processes; and
:mod:`~shardkit.piles.publish` assembles the piles and writes the manifest last. The front doors
are :class:`PileWriter`, :func:`preprocess`, :func:`pile` and :func:`repile`, configured by
:class:`PileOptions`; :mod:`~shardkit.piles.transforms` holds the built-in preprocessing functions
and :mod:`~shardkit.piles.readers` the readers of other formats (Parquet, Arrow, Hugging Face,
MDS, litdata, CSV).
"""

from __future__ import annotations

from shardkit.piles.options import PileOptions
from shardkit.piles.preprocess import pile, preprocess
from shardkit.piles.repile import repile
from shardkit.piles.writer import PileWriter

__all__ = ["PileOptions", "PileWriter", "pile", "preprocess", "repile"]
