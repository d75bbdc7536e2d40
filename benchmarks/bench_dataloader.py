"""Contenders of case f (raw ~5 KB samples, one process and a torch DataLoader), each in its own process.

shardkit's loader and its ``shardkit.torch`` DataLoader (with and without ``views``), litdata's
``StreamingDataset`` and ``StreamingDataLoader`` on the same samples written by its
``optimize``, webdataset and MosaicML streaming in a DataLoader. Every DataLoader contender
yields batches of the same size from the same number of workers. Figures are those of
:func:`_timing.consume` plus ``bytes``.

    shardkit_dataloader({"source": "piles-12/", "num_workers": 2, "batch_size": 256})
    litdata_dataloader({"dir": "data/litdata", "num_workers": 2, "batch_size": 256})
"""

from __future__ import annotations

from typing import Any

from _timing import Clock, consume
from bench_read import SHUFFLE_BUFFER, _file_bytes, _import_streaming


def shardkit_views(p: dict[str, Any]) -> dict[str, Any]:
    """``shardkit.loader(decode=False, views=True)``: raw fields as memoryviews, one process."""
    import shardkit

    clock = Clock()
    with shardkit.loader(p["source"], decode=False, views=True, seed=p.get("seed", 0)) as loader:
        # the label is copied: a view kept would keep its whole pile in memory
        figures = consume(loader, clock, label=lambda s: bytes(s["cls"]))
    figures["bytes"] = _file_bytes([p["source"]])
    return figures


def shardkit_dataloader(p: dict[str, Any]) -> dict[str, Any]:
    """``ShardkitDataLoader(ShardkitDataset(decode=False, batch_size=B), num_workers=k)``."""
    from shardkit.torch import ShardkitDataLoader, ShardkitDataset

    clock = Clock()
    dataset = ShardkitDataset(p["source"], batch_size=p["batch_size"], decode=False, views=p.get("views", False), seed=p.get("seed", 0))
    loader = ShardkitDataLoader(dataset, num_workers=p["num_workers"])
    figures = consume(loader, clock, batch_len=lambda b: len(b["__key__"]), batch_labels=lambda b: [bytes(c) for c in b["cls"]])
    figures["bytes"] = _file_bytes([p["source"]])
    return figures


def _litdata_samples(path: str) -> Any:
    """The samples of one class-sorted shard, as litdata's ``optimize`` takes them."""
    from shardkit.tar.shard import iter_shard

    for sample in iter_shard(path):
        yield {"key": sample["__key__"], "bin": bytes(sample["bin"]), "cls": int(sample["cls"])}


def litdata_convert(p: dict[str, Any]) -> dict[str, Any]:
    """Write the class-sorted shards' samples, in order, with litdata's ``optimize`` (not timed as a case)."""
    import litdata

    clock = Clock()
    litdata.optimize(
        fn=_litdata_samples, inputs=p["files"], output_dir=p["out"], chunk_bytes=p["chunk_bytes"], num_workers=1, mode="overwrite"
    )
    return {"samples": 0, "seconds": clock.elapsed(), "bytes": _file_bytes([p["out"]])}


def litdata_read(p: dict[str, Any]) -> dict[str, Any]:
    """litdata ``StreamingDataset(dir, shuffle=True)``, one process."""
    import litdata

    clock = Clock()
    dataset = litdata.StreamingDataset(p["dir"], shuffle=True, seed=p.get("seed", 0))
    figures = consume(dataset, clock, label=lambda s: s["cls"])
    figures["bytes"] = _file_bytes([p["dir"]])
    return figures


def litdata_dataloader(p: dict[str, Any]) -> dict[str, Any]:
    """litdata ``StreamingDataLoader(StreamingDataset(dir, shuffle=True), batch_size=B, num_workers=k)``."""
    import litdata

    clock = Clock()
    dataset = litdata.StreamingDataset(p["dir"], shuffle=True, seed=p.get("seed", 0))
    loader = litdata.StreamingDataLoader(dataset, batch_size=p["batch_size"], num_workers=p["num_workers"])
    figures = consume(loader, clock, batch_len=lambda b: len(b["key"]), batch_labels=lambda b: b["cls"].tolist())
    figures["bytes"] = _file_bytes([p["dir"]])
    return figures


def wds_raw_dataloader(p: dict[str, Any]) -> dict[str, Any]:
    """webdataset raw samples, ``.shuffle(1000).batched(B)``, in ``DataLoader(num_workers=k)``."""
    import torch
    import webdataset as wds

    clock = Clock()
    dataset = wds.WebDataset(p["files"], shardshuffle=True, seed=p.get("seed", 0)).shuffle(SHUFFLE_BUFFER).batched(p["batch_size"])
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=p["num_workers"])
    figures = consume(loader, clock, batch_len=lambda b: len(b["__key__"]), batch_labels=lambda b: b["cls"])
    figures["bytes"] = _file_bytes(p["files"])
    return figures


def mosaic_dataloader(p: dict[str, Any]) -> dict[str, Any]:
    """MosaicML ``StreamingDataset(local=MDS, shuffle=True)`` in ``DataLoader(batch_size=B, num_workers=k)``."""
    import torch

    streaming, note = _import_streaming()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    clock = Clock()
    dataset = streaming.StreamingDataset(
        local=p["mds"], shuffle=True, shuffle_algo="py1e", shuffle_seed=p.get("seed", 0) + 9176, batch_size=p["batch_size"]
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=p["batch_size"], num_workers=p["num_workers"])
    figures = consume(loader, clock, batch_len=lambda b: len(b["key"]), batch_labels=lambda b: b["cls"].tolist())
    figures["bytes"] = _file_bytes([p["mds"]])
    figures["note"] = note
    return figures
