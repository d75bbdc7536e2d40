"""PyTorch adapter, the public face: ``shardkit.torch.ShardkitDataset`` and ``ShardkitDataLoader``.

The code lives in :mod:`shardkit.loading.torch`; this module keeps the documented import path.

    from shardkit.torch import ShardkitDataLoader, ShardkitDataset
"""

from __future__ import annotations

from shardkit.loading.torch import ShardkitDataLoader, ShardkitDataset, round_robin

__all__ = ["ShardkitDataLoader", "ShardkitDataset", "round_robin"]
