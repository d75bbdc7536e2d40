"""Make the benchmark datasets: class-sorted samples as plain shards, as piles, as a text file.

Every dataset is a pure function of its spec (seeded), built once into ``DATA/<name>/`` and
reused while ``spec.json`` there matches. From one stream of class-sorted samples it writes:

- ``sorted/shard-NNNNNN.tar``: the samples in input (class) order, in as many shards as there
  are piles; what a preprocessing job that writes sequential shards leaves behind, and what the
  peers read;
- ``piles-M/``: the same samples written by :class:`shardkit.PileWriter` into M piles, for each
  M asked for; what shardkit reads.

    spec = DataSpec(name="raw5k", samples=1000, mean_bytes=5000, piles=(8,))
    data = build(spec, "bench-data/")
    data.shards, data.piles[8]
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

import shardkit
import shardkit.manifest
from shardkit.tar import write as tarwrite

CLASSES = 10
SEED = 20240917


@dataclass(frozen=True)
class DataSpec:
    """What to generate: ``samples`` class-sorted samples of about ``mean_bytes`` (or images)."""

    name: str
    samples: int
    mean_bytes: int = 5000
    piles: tuple[int, ...] = (8,)  # the first also sets the number of sorted shards
    images: int = 0  # side in pixels; 0 means random-byte payloads in a .bin field


@dataclass
class Dataset:
    """Where a built dataset lives, and its size."""

    spec: DataSpec
    root: str
    shards: list[str]
    piles: dict[int, str]
    samples: int
    shard_bytes: int
    pile_bytes: dict[int, int] = field(default_factory=dict)
    max_pile_bytes: dict[int, int] = field(default_factory=dict)


def _payloads(spec: DataSpec, rng: np.random.Generator, count: int) -> list[bytes]:
    sizes = rng.integers(int(spec.mean_bytes * 0.8), int(spec.mean_bytes * 1.2) + 1, size=count)
    blob = rng.bytes(int(sizes.sum()))
    ends = np.cumsum(sizes).tolist()
    return [blob[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def _image_pool(side: int, rng: np.random.Generator, per_class: int = 16) -> list[list[bytes]]:
    """A few JPEGs per class that compress like photographs: smooth colour fields plus noise."""
    from PIL import Image

    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side
    pool = []
    for cls in range(CLASSES):
        images = []
        for _ in range(per_class):
            a, b, c = rng.uniform(0.5, 6.0, size=3)
            base = np.stack([np.sin(a * xx + cls), np.cos(b * yy - cls), np.sin(c * (xx + yy))], axis=-1)
            pixels = (base * 90 + 128 + rng.normal(0, 12, size=base.shape)).clip(0, 255).astype(np.uint8)
            out = io.BytesIO()
            Image.fromarray(pixels).save(out, format="JPEG", quality=90)
            images.append(out.getvalue())
        pool.append(images)
    return pool


def samples(spec: DataSpec) -> Iterator[dict]:
    """The dataset's samples in class order: key, a payload (.bin or .jpg) and a .cls label."""
    rng = np.random.default_rng([SEED, spec.samples, spec.mean_bytes, spec.images])
    pool = _image_pool(spec.images, rng) if spec.images else None
    chunk = 4096
    for lo in range(0, spec.samples, chunk):
        count = min(chunk, spec.samples - lo)
        payloads = None if pool else _payloads(spec, rng, count)
        for j in range(count):
            i = lo + j
            cls = i * CLASSES // spec.samples
            if pool is not None:
                yield {"__key__": f"{i:09d}", "jpg": pool[cls][i % len(pool[cls])], "cls": cls}
            else:
                assert payloads is not None
                yield {"__key__": f"{i:09d}", "bin": payloads[j], "cls": cls}


def encode_sample_bytes(sample: dict) -> bytes:
    """One sample as plain ustar members, fields in sorted order (as PileWriter writes them)."""
    return b"".join(
        tarwrite.member(f"{sample['__key__']}.{ext}", value if isinstance(value, bytes) else b"%d" % value)
        for ext, value in sorted(sample.items())
        if ext != "__key__"
    )


def _write(spec: DataSpec, root: str) -> None:
    shard_count = spec.piles[0]
    shard_dir = os.path.join(root, "sorted")
    os.makedirs(shard_dir)
    writers = {m: shardkit.PileWriter(os.path.join(root, f"piles-{m}"), piles=m, seed=SEED) for m in spec.piles}
    shard = -1
    out = None
    try:
        for i, sample in enumerate(samples(spec)):
            if i * shard_count // spec.samples != shard:
                if out is not None:
                    out.write(tarwrite.TRAILER)
                    out.close()
                shard = i * shard_count // spec.samples
                out = open(os.path.join(shard_dir, f"shard-{shard:06d}.tar"), "wb")  # noqa: SIM115
            out.write(encode_sample_bytes(sample))
            for w in writers.values():
                w.write(sample)
        if out is not None:
            out.write(tarwrite.TRAILER)
            out.close()
        for w in writers.values():
            w.close()
    except BaseException:
        for w in writers.values():
            w.abort()
        raise


def _load(spec: DataSpec, root: str) -> Dataset:
    shard_dir = os.path.join(root, "sorted")
    shards = sorted(os.path.join(shard_dir, n) for n in os.listdir(shard_dir))
    data = Dataset(
        spec=spec,
        root=root,
        shards=shards,
        piles={m: os.path.join(root, f"piles-{m}") for m in spec.piles},
        samples=spec.samples,
        shard_bytes=sum(os.path.getsize(s) for s in shards),
    )
    for m, path in data.piles.items():
        manifest = shardkit.manifest.read(path)
        data.pile_bytes[m] = manifest.bytes
        data.max_pile_bytes[m] = max(p.bytes for p in manifest.piles)
    return data


def build(spec: DataSpec, data_dir: str) -> Dataset:
    """Build ``spec`` under ``data_dir`` unless an identical build is already there."""
    root = os.path.join(data_dir, spec.name)
    stamp = os.path.join(root, "spec.json")
    wanted = json.dumps(asdict(spec), sort_keys=True)
    if os.path.exists(stamp):
        with open(stamp) as f:
            if f.read() == wanted:
                return _load(spec, root)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    _write(spec, root)
    with open(stamp, "w") as f:
        f.write(wanted)
    return _load(spec, root)


def text_file(data: Dataset) -> tuple[str, int]:
    """A text file for GNU ``shuf`` with one line per sample and the same bytes as the shards.

    Line i is as long as sample i's tar bytes (headers included) and starts with its class digit
    and a space, so the shuffled output can be checked for classes per batch. Returns (path, lines).
    """
    path = os.path.join(data.root, "lines.txt")
    if os.path.exists(path) and os.path.getsize(path) == data.shard_bytes:
        return path, data.samples
    rng = np.random.default_rng(SEED)
    trailers = len(data.shards) * len(tarwrite.TRAILER)
    with open(path + ".partial", "wb") as f:
        for i, sample in enumerate(samples(data.spec)):
            size = len(encode_sample_bytes(sample)) + (trailers if i == data.samples - 1 else 0)
            body = base64.b64encode(rng.bytes(size))[: size - 3]
            f.write(b"%d %s\n" % (sample["cls"], body))
    os.replace(path + ".partial", path)
    return path, data.samples
