"""What a ``ShardkitDataLoader`` refuses of torch's DataLoader arguments, each naming the call to make instead.

The dataset batches and counts what it yields (its state, its ledger), so the DataLoader's own
batching arguments and an out-of-order yield would break the count: each is a ``ConfigError``
up front, not torch's error about an argument the user never gave.

    check_arguments(dataset.options.batch_size, kwargs)   # before DataLoader.__init__
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from shardkit.errors import ConfigError

RIGHT_CALL = "ShardkitDataLoader(ds, num_workers=k) or DataLoader(ds, batch_size=None, num_workers=k)"


def rebatching(batch_size: int, loader_batch: int | None = None) -> ConfigError:
    """The error for a DataLoader that would batch a batching dataset's items again (``loader_batch``
    is the DataLoader's batch size when known)."""
    again = (
        f"its batch_size={loader_batch} would give every array an extra leading dimension of {loader_batch}"
        if loader_batch is not None
        else "its batch_size is not None (PyTorch's default, 1, gives every array an extra leading dimension of 1)"
    )
    return ConfigError(
        f"ShardkitDataset(batch_size={batch_size}) already yields batches, and this DataLoader batches them again: {again}. "
        f"Use {RIGHT_CALL}"
    )


def check_arguments(dataset_batch: int | None, kwargs: MutableMapping[str, Any]) -> None:
    """Refuse what would batch again or yield out of turn; ``batch_size`` set to None where not given.

    Args:
        dataset_batch: the dataset's ``batch_size`` (None: it yields single samples).
        kwargs: the keyword arguments for torch's DataLoader.
    """
    batch = kwargs.setdefault("batch_size", None)
    if batch is not None:
        if dataset_batch is not None:
            raise rebatching(dataset_batch, batch)
        # the dataset's state counts its own items: batches made here would be counted as samples
        raise ConfigError(
            f"ShardkitDataLoader: batch_size: expected None, got {batch!r}: batch in the dataset instead, "
            f"ShardkitDataset(..., batch_size={batch!r}), so that state_dict() counts what this DataLoader yields"
        )
    if kwargs.get("drop_last", False) is not False:
        # torch refuses it beside batch_size=None, naming an argument the user never gave
        raise ConfigError(
            f"ShardkitDataLoader: drop_last: expected False (the DataLoader's default), got {kwargs['drop_last']!r}: "
            f"the dataset makes the batches, so give ShardkitDataset(..., drop_last={kwargs['drop_last']!r})"
        )
    if kwargs.get("num_workers", 0) > 0 and kwargs.get("in_order", True) is not True:
        # the order, state_dict() and keys() all count the workers' turns (round_robin): a
        # DataLoader yielding whichever batch is ready first resumes with samples lost and repeated
        raise ConfigError(
            f"ShardkitDataLoader: in_order: expected True, got {kwargs['in_order']!r}: "
            "its workers must take turns for the order, state_dict() and keys() to hold"
        )
