"""PyTorch adapter: a shardkit loader as an ``IterableDataset`` for DataLoader workers and DDP.

Each DataLoader worker reads its own contiguous share of its rank's slice of the epoch (split on
batch boundaries), so no sample is read twice and every rank yields the same count. Rank and
world size come from the options, ``RANK``/``WORLD_SIZE`` or an initialized torch.distributed.

    ds = ShardkitDataset("data/", batch_size=64, seed=0)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=4)
    for epoch in range(10):
        ds.set_epoch(epoch)
        for batch in dl: ...
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("shardkit.torch needs PyTorch: pip install 'shardkit[torch]'") from e

from shardkit.loader import Loader
from shardkit.options import LoaderOptions, resolve_world
from shardkit.sources import SourceLike, resolve

__all__ = ["ShardkitDataset"]


class ShardkitDataset(IterableDataset):
    """A shardkit dataset for ``torch.utils.data.DataLoader`` (use ``batch_size=None`` there and
    batch here, so batches are formed from the shuffled order).

    Args:
        source: what :func:`shardkit.loader` takes.
        **options: :func:`shardkit.loader` options; ``num_workers`` here means decode processes
            per DataLoader worker and is usually left at 0.

    Call :meth:`set_epoch` before each epoch (as with ``DistributedSampler``); the epoch is
    shared with persistent DataLoader workers.

    Example:
        ds = ShardkitDataset("data/", batch_size=32)
        for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
            ...
    """

    def __init__(self, source: SourceLike, **options: Any) -> None:
        opts = LoaderOptions.from_dict(options)
        rank, world = resolve_world(opts.rank, opts.world_size)
        self.options = replace(opts, rank=rank, world_size=world)
        self.source = resolve(source)  # counted once here, not once per worker
        self._epoch = torch.multiprocessing.Value("q", 0)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` on the next iteration (in every worker)."""
        self._epoch.value = epoch

    @property
    def epoch(self) -> int:
        return int(self._epoch.value)

    def _loader(self, worker: tuple[int, int]) -> Loader:
        loader = Loader(self.source, replace(self.options, worker=worker))
        loader.set_epoch(self.epoch)
        return loader

    def __len__(self) -> int:
        """Batches (or samples) this rank yields per epoch, all workers together."""
        return len(self._loader((0, 1)))

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        loader = self._loader((info.id, info.num_workers) if info is not None else (0, 1))
        try:
            yield from loader
        finally:
            loader.close()
