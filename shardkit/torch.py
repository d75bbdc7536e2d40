"""PyTorch adapter, the public face: ``shardkit.torch.ShardkitDataset`` and ``ShardkitDataLoader``.

The code lives in :mod:`shardkit.loading.torch`; this module keeps the documented import path, and
gives the dataset the loader options' signature and descriptions (it takes them as ``**options``).

    from shardkit.torch import ShardkitDataLoader, ShardkitDataset
"""

from __future__ import annotations

from shardkit.loading.options import DATASET
from shardkit.loading.torch import ShardkitDataLoader, ShardkitDataset, round_robin

DATASET(ShardkitDataset)

__all__ = ["ShardkitDataLoader", "ShardkitDataset", "round_robin"]
