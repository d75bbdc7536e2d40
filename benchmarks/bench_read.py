"""Contenders that read a dataset once (cases a, b, e), each run in its own process.

Every function takes a params dict and returns the figures of :func:`_timing.consume` plus
``bytes`` (what it read from disk). Peer libraries are imported inside the functions, before the
clock starts, so a contender pays only for its own imports and they are not timed.

    raw_read({"files": ["a.tar"], "samples": 1000})
    shardkit_loader({"source": "piles-8/", "seed": 0})
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Any

from _timing import Clock, consume

CHUNK = 8 << 20
SHUFFLE_BUFFER = 1000


def _file_bytes(paths: list[str]) -> int:
    total = 0
    for path in paths:
        if os.path.isdir(path):
            total += sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
        else:
            total += os.path.getsize(path)
    return total


def raw_read(p: dict[str, Any]) -> dict[str, Any]:
    """Sequential read of the files into a reused buffer: the bandwidth ceiling."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    clock = Clock()
    total = 0
    first = None
    for path in p["files"]:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
                if first is None:
                    first = clock.elapsed()
    return {"samples": p["samples"], "seconds": clock.elapsed(), "first_sample_s": first, "bytes": total, "classes_per_batch": None}


def shardkit_loader(p: dict[str, Any]) -> dict[str, Any]:
    """``shardkit.loader`` over a pile dataset, samples or batches, with or without decoding."""
    import shardkit

    clock = Clock()
    loader = shardkit.loader(
        p["source"], batch_size=p.get("batch_size"), shuffle=True, seed=p.get("seed", 0), decode=p.get("decode", False),
        num_workers=p.get("num_workers", 0),
    )  # fmt: skip
    with loader:
        if p.get("batch_size"):
            figures = consume(loader, clock, batch_len=lambda b: len(b["__key__"]), batch_labels=lambda b: b["cls"])
        else:
            figures = consume(loader, clock, label=lambda s: s["cls"])
    figures["bytes"] = _file_bytes([p["source"]])
    return figures


def wds_read(p: dict[str, Any]) -> dict[str, Any]:
    """``webdataset.WebDataset(urls, shardshuffle=True).shuffle(1000)``, raw bytes, one process."""
    import webdataset as wds

    clock = Clock()
    dataset = wds.WebDataset(p["files"], shardshuffle=True, seed=p.get("seed", 0)).shuffle(SHUFFLE_BUFFER)
    figures = consume(dataset, clock, label=lambda s: s["cls"])
    figures["bytes"] = _file_bytes(p["files"])
    return figures


def hf_read(p: dict[str, Any]) -> dict[str, Any]:
    """Hugging Face ``load_dataset("webdataset", streaming=True).shuffle(buffer_size=1000)``."""
    import datasets

    datasets.disable_progress_bars()
    clock = Clock()
    dataset = datasets.load_dataset("webdataset", data_files={"train": p["files"]}, split="train", streaming=True)
    dataset = dataset.shuffle(seed=p.get("seed", 0), buffer_size=SHUFFLE_BUFFER)
    figures = consume(dataset, clock, label=lambda s: s["cls"])
    figures["bytes"] = _file_bytes(p["files"])
    return figures


# what the first _import_streaming of this process replaced
_STREAMING_NOTES: list[str] = []


def _import_streaming() -> tuple[Any, str | None]:
    """Import MosaicML ``streaming``; returns (module, note).

    ``streaming/__init__`` imports its torchvision-based vision datasets, and torchvision's
    PyPI wheel is a CUDA build that cannot load against a CPU-only torch. The vision classes
    are not used here, so when torchvision is unusable an empty stand-in takes their place.
    Likewise its text datasets and its DataLoader import ``transformers``, which cannot be
    installed beside ``datasets`` 4 (see ``pyproject.toml``). Without it, the text datasets (not
    used here) become an empty module, and the two batch classes the DataLoader only tests
    batches against become empty dict classes, which no batch here is an instance of. The
    stand-in ``transformers`` is gone again once ``streaming`` is imported: other libraries
    (``datasets``) look for a real one in ``sys.modules``.
    """
    if "streaming" not in sys.modules:
        _STREAMING_NOTES[:] = []
        try:
            import torchvision  # noqa: F401
        except Exception:
            for name in [m for m in sys.modules if m == "torchvision" or m.startswith(("torchvision.", "streaming"))]:
                del sys.modules[name]
            sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
            _STREAMING_NOTES.append("streaming.vision replaced by an empty module (torchvision unusable with CPU torch)")
        stand_ins = {}
        if "transformers" not in sys.modules and importlib.util.find_spec("transformers") is None:
            sys.modules["streaming.text"] = types.ModuleType("streaming.text")
            stand_ins["transformers"] = types.ModuleType("transformers")
            for module, cls in (("feature_extraction_utils", "BatchFeature"), ("tokenization_utils_base", "BatchEncoding")):
                stand_ins[f"transformers.{module}"] = types.ModuleType(f"transformers.{module}")
                setattr(stand_ins[f"transformers.{module}"], cls, type(cls, (dict,), {}))
            sys.modules.update(stand_ins)
            _STREAMING_NOTES.append("streaming.text and transformers' batch classes replaced by stand-ins (transformers not installed)")
        try:
            import streaming
        finally:
            for name, stand_in in stand_ins.items():
                if sys.modules.get(name) is stand_in:
                    del sys.modules[name]
    import streaming

    return streaming, "; ".join(_STREAMING_NOTES) or None


def mds_convert(p: dict[str, Any]) -> dict[str, Any]:
    """Write the class-sorted shards' samples, in order, as MosaicML MDS (not timed as a case)."""
    from shardkit.tar.shard import iter_shard

    streaming, note = _import_streaming()
    clock = Clock()
    columns = {"key": "str", "bin": "bytes", "cls": "int"}
    count = 0
    with streaming.MDSWriter(out=p["out"], columns=columns, size_limit=p["shard_bytes"], compression=None) as writer:
        for shard in p["files"]:
            for sample in iter_shard(shard):
                writer.write({"key": sample["__key__"], "bin": bytes(sample["bin"]), "cls": int(sample["cls"])})
                count += 1
    return {"samples": count, "seconds": clock.elapsed(), "bytes": _file_bytes([p["out"]]), "note": note}


def mosaic_read(p: dict[str, Any]) -> dict[str, Any]:
    """MosaicML ``StreamingDataset(local=MDS, shuffle=True, shuffle_algo="py1e")``, one process."""
    streaming, note = _import_streaming()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    clock = Clock()
    dataset = streaming.StreamingDataset(
        local=p["mds"], shuffle=True, shuffle_algo="py1e", shuffle_seed=p.get("seed", 0) + 9176, batch_size=256
    )
    figures = consume(dataset, clock, label=lambda s: s["cls"])
    figures["bytes"] = _file_bytes([p["mds"]])
    figures["note"] = note
    return figures


def wds_dataloader(p: dict[str, Any]) -> dict[str, Any]:
    """webdataset decoding JPEGs to HWC uint8 in ``torch.utils.data.DataLoader(num_workers=k)``."""
    import torch
    import webdataset as wds

    clock = Clock()
    dataset = (
        wds.WebDataset(p["files"], shardshuffle=True, seed=p.get("seed", 0))
        .shuffle(SHUFFLE_BUFFER)
        .decode("rgb8")
        .to_tuple("jpg", "cls")
        .batched(p["batch_size"], partial=True)
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=p["num_workers"])
    figures = consume(loader, clock, batch_len=lambda b: len(b[1]), batch_labels=lambda b: list(b[1]))
    figures["bytes"] = _file_bytes(p["files"])
    return figures


def shardkit_torch(p: dict[str, Any]) -> dict[str, Any]:
    """``shardkit.torch.ShardkitDataset`` (batched, decoded) in ``DataLoader(num_workers=k)``."""
    import torch

    from shardkit.torch import ShardkitDataset

    clock = Clock()
    dataset = ShardkitDataset(p["source"], batch_size=p["batch_size"], decode=True, seed=p.get("seed", 0))
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=p["num_workers"])
    figures = consume(loader, clock, batch_len=lambda b: len(b["__key__"]), batch_labels=lambda b: list(b["cls"]))
    figures["bytes"] = _file_bytes([p["source"]])
    return figures
