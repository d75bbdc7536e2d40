"""Contenders that write the same samples (case c), each run in its own process.

The samples (~5 KB random payload and a class label) come from a generator that cycles over
1024 payloads made before the clock starts, so peak RSS is the writer's, not the input's, and
making a sample costs about a microsecond. The clock stops when the writer is closed, so
publishing piles and manifests counts.

    pile_writer({"samples": 20000, "mean_bytes": 5000, "out": "w/", "piles": 64})
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

from _timing import Clock
from datagen import CLASSES, DataSpec, samples

POOL = 1024


def _samples(p: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``p["samples"]`` class-sorted samples with unique keys over a pool of payloads."""
    n = p["samples"]
    pool = [s["bin"] for s in samples(DataSpec(name="write", samples=min(n, POOL), mean_bytes=p["mean_bytes"]))]
    return ({"__key__": f"{i:09d}", "bin": pool[i % POOL], "cls": i * CLASSES // n} for i in range(n))


def _fresh(path: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)


def _figures(count: int, clock: Clock, out: str) -> dict[str, Any]:
    seconds = clock.elapsed()
    written = _dir_bytes(out)
    shutil.rmtree(out, ignore_errors=True)
    return {"samples": count, "seconds": seconds, "first_sample_s": None, "bytes": written, "classes_per_batch": None}


def _write_all(p: dict[str, Any], open_writer: Callable[[str], Any]) -> dict[str, Any]:
    """Time ``open_writer(out)`` as a context manager writing every sample, closing included."""
    data = _samples(p)
    out = _fresh(p["out"])
    clock = Clock()
    with open_writer(out) as writer:
        for sample in data:
            writer.write(sample)
    return _figures(p["samples"], clock, out)


def pile_writer(p: dict[str, Any]) -> dict[str, Any]:
    """``shardkit.PileWriter(out, piles=M)``: write every sample, then publish."""
    import shardkit

    return _write_all(p, lambda out: shardkit.PileWriter(out, piles=p["piles"], seed=0, overwrite=True))


def tar_writer(p: dict[str, Any]) -> dict[str, Any]:
    """``webdataset.TarWriter`` writing every sample into one tar file."""
    import webdataset as wds

    return _write_all(p, lambda out: wds.TarWriter(os.path.join(out, "data.tar")))


def shard_writer(p: dict[str, Any]) -> dict[str, Any]:
    """``webdataset.ShardWriter`` rolling shards at ``maxsize`` bytes."""
    import webdataset as wds

    return _write_all(p, lambda out: wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxsize=p["maxsize"], verbose=0))


def raw_write(p: dict[str, Any]) -> dict[str, Any]:
    """The same samples as tar bytes, encoded before the clock, written sequentially: the ceiling."""
    from datagen import encode_sample_bytes

    blob = b"".join(encode_sample_bytes(s) for s in _samples(p))
    out = _fresh(p["out"])
    view = memoryview(blob)
    chunk = 8 << 20
    clock = Clock()
    with open(os.path.join(out, "data.tar"), "wb", buffering=0) as f:
        for lo in range(0, len(blob), chunk):
            f.write(view[lo : lo + chunk])
    return _figures(p["samples"], clock, out)
