"""Built-in preprocessing transforms, the public face: ``shardkit.transforms.Images``, ``JsonLines``, ``Shards``, ``prepare``.

The code lives in :mod:`shardkit.piles.transforms`; this module keeps the documented import path.

    from shardkit.transforms import Images
"""

from __future__ import annotations

from shardkit.piles.transforms import TRANSFORMS, Images, JsonLines, Shards, get, prepare, sample_key

__all__ = ["TRANSFORMS", "Images", "JsonLines", "Shards", "get", "prepare", "sample_key"]
