"""The benchmark cases (a)-(e) as lists of entries: who runs, on which data, against what.

An :class:`Entry` is one contender on one data set; entries of a *group* share the data, the
best-peer and raw-I/O references and the goals (see :mod:`report`). A contender whose library
is missing is planned anyway, with the reason it is skipped, so the table always says what was
not measured and why.

    entries = plan(["a", "c"], SIZES["small"], data, work="out/work")
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

from datagen import Dataset, DataSpec
from report import (
    CAT,
    LITDATA_LOADER,
    LOADER,
    LOADER_VIEWS,
    RAW_READ,
    RAW_WRITE,
    SHUF,
    SHUFFLE,
    TAR_WRITER,
    TORCH_DATALOADER,
    WDS_DATALOADER,
    WEBDATASET,
    pile_writer_name,
)

import shardkit
import shardkit.manifest

MiB = 1 << 20
HF = "HF datasets streaming"
MOSAIC = "MosaicML streaming"
SHARD_WRITER = "webdataset.ShardWriter"
RANDOM_ACCESS = "random access (offset index + pread)"
LITDATA = "litdata"
TORCH_VIEWS = "shardkit.torch + DataLoader views=True"
MOSAIC_LOADER = "MosaicML + DataLoader"
DATALOADER_WORKERS = 2
DATALOADER_BATCH = 256
MOSAIC_INSTALL = "pip install 'torch==2.13.0' mosaicml-streaming (see BENCHMARKS.md)"


@dataclass(frozen=True)
class Preset:
    """Data sizes and repeats of one ``--size``."""

    repeats: int
    raw5k: DataSpec
    raw50k: DataSpec  # also the input of (d) and, at each of its pile counts, of (e)
    images: DataSpec
    write_samples: int
    shard_bytes: int  # output shard size of writers and shufflers
    timeout: float


SIZES = {
    "smoke": Preset(
        repeats=1,
        raw5k=DataSpec("raw5k", samples=1500, mean_bytes=5000, piles=(4,)),
        raw50k=DataSpec("raw50k", samples=200, mean_bytes=50000, piles=(4, 16)),
        images=DataSpec("images", samples=400, images=64, piles=(4,)),
        write_samples=2000,
        shard_bytes=2 * MiB,
        timeout=300,
    ),
    "small": Preset(
        repeats=3,
        raw5k=DataSpec("raw5k", samples=30000, mean_bytes=5000, piles=(12,)),
        raw50k=DataSpec("raw50k", samples=4000, mean_bytes=50000, piles=(12, 48, 3)),
        images=DataSpec("images", samples=8000, images=96, piles=(4,)),
        write_samples=20000,
        shard_bytes=16 * MiB,
        timeout=1800,
    ),
    "full": Preset(
        repeats=3,
        raw5k=DataSpec("raw5k", samples=200000, mean_bytes=5000, piles=(20,)),
        raw50k=DataSpec("raw50k", samples=30000, mean_bytes=50000, piles=(24, 96, 6, 2)),
        images=DataSpec("images", samples=40000, images=96, piles=(8,)),
        write_samples=100000,
        shard_bytes=64 * MiB,
        timeout=7200,
    ),
}


@dataclass
class Entry:
    """One contender on one data set: a Python target or an external command."""

    case: str
    group: str
    data: str
    contender: str
    role: str  # "shardkit", "peer" or "raw"
    target: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    command: list[str] | None = None
    figures: dict[str, Any] = field(default_factory=dict)  # samples/bytes of a command's work
    raw_ref: str | None = RAW_READ
    skip: str | None = None
    cold: bool = False
    meta: dict[str, Any] = field(default_factory=dict)


def _missing(module: str, install: str) -> str | None:
    return None if importlib.util.find_spec(module) is not None else f"{module} is not installed ({install})"


def _shardkit_missing(name: str, issue: str) -> str | None:
    return None if hasattr(shardkit, name) else f"shardkit.{name} does not exist in this checkout yet ({issue})"


def _tag(entries: list[Entry], samples: int) -> list[Entry]:
    """Record the data set's sample count on each entry (a loader may drop a last batch)."""
    for entry in entries:
        entry.meta.setdefault("samples", samples)
    return entries


def pile_files(path: str) -> list[str]:
    return [os.path.join(path, p.name) for p in shardkit.manifest.read(path).piles]


def _mb(n: float) -> str:
    return f"{n / 1e6:.0f} MB" if n >= 1e7 else f"{n / 1e6:.1f} MB"


def _describe(data: Dataset, what: str) -> str:
    return f"{what}, {data.samples:,} samples, {_mb(data.shard_bytes)}"


def _mds(data: Dataset, preset: Preset, run: Any) -> tuple[str | None, str | None]:
    """Convert the class-sorted shards to MDS once; returns (directory, reason it failed)."""
    out = os.path.join(data.root, "mds")
    if os.path.exists(os.path.join(out, "index.json")):
        return out, None
    shutil.rmtree(out, ignore_errors=True)
    try:
        run("bench_read:mds_convert", {"files": data.shards, "out": out, "shard_bytes": preset.shard_bytes})
    except RuntimeError as e:
        return None, f"MDS conversion failed: {e}"
    return out, None


def case_a(preset: Preset, data: Dataset, label: str, run: Any) -> list[Entry]:
    group = f"a-{label}"
    desc = _describe(data, f"~{label} raw, no decoding")
    main = data.spec.piles[0]
    piles = data.piles[main]
    hf = _missing("datasets", "pip install datasets, or the bench extra")
    mosaic = _missing("streaming", MOSAIC_INSTALL)
    mds, failed = (None, mosaic) if mosaic else _mds(data, preset, run)
    return _tag([
        Entry("a", group, desc, RAW_READ, "raw", "bench_read:raw_read", {"files": pile_files(piles), "samples": data.samples}, raw_ref=None),
        Entry("a", group, desc, LOADER, "shardkit", "bench_read:shardkit_loader", {"source": piles}, skip=_shardkit_missing("loader", "issue 3"),
              meta={"max_pile_bytes": data.max_pile_bytes[main]}),
        Entry("a", group, desc, WEBDATASET, "peer", "bench_read:wds_read", {"files": data.shards}),
        Entry("a", group, desc, HF, "peer", "bench_read:hf_read", {"files": data.shards}, skip=hf),
        Entry("a", group, desc, MOSAIC, "peer", "bench_read:mosaic_read", {"mds": mds}, skip=failed),
    ], data.samples)  # fmt: skip


def case_b(preset: Preset, data: Dataset) -> list[Entry]:
    desc = _describe(data, f"JPEG {data.spec.images}px, decode to HWC uint8, 2 workers, batch 64")
    piles = data.piles[data.spec.piles[0]]
    torch = _missing("torch", "pip install torch==2.13.0")
    return _tag([
        Entry("b", "b", desc, RAW_READ, "raw", "bench_read:raw_read", {"files": pile_files(piles), "samples": data.samples}, raw_ref=None),
        Entry("b", "b", desc, LOADER, "shardkit", "bench_read:shardkit_loader",
              {"source": piles, "decode": True, "num_workers": 2, "batch_size": 64}, skip=_shardkit_missing("loader", "issue 3")),
        Entry("b", "b", desc, TORCH_DATALOADER, "shardkit", "bench_read:shardkit_torch",
              {"source": piles, "num_workers": 2, "batch_size": 64}, skip=torch or _shardkit_missing("loader", "issue 3")),
        Entry("b", "b", desc, WDS_DATALOADER, "peer", "bench_read:wds_dataloader",
              {"files": data.shards, "num_workers": 2, "batch_size": 64}, skip=torch),
    ], data.samples)  # fmt: skip


def case_c(preset: Preset, work: str) -> list[Entry]:
    n = preset.write_samples
    desc = f"~5 KB samples, {n:,} samples"
    common = {"samples": n, "mean_bytes": 5000, "out": os.path.join(work, "write")}
    entries = [
        Entry("c", "c", desc, RAW_WRITE, "raw", "bench_write:raw_write", dict(common), raw_ref=None),
        Entry("c", "c", desc, TAR_WRITER, "peer", "bench_write:tar_writer", dict(common), raw_ref=RAW_WRITE),
        Entry(
            "c", "c", desc, SHARD_WRITER, "peer", "bench_write:shard_writer", {**common, "maxsize": preset.shard_bytes}, raw_ref=RAW_WRITE
        ),
    ]
    for m in (1, 64, 256):
        entries.append(
            Entry("c", "c", desc, pile_writer_name(m), "shardkit", "bench_write:pile_writer", {**common, "piles": m}, raw_ref=RAW_WRITE)
        )
    return _tag(entries, n)


def case_d(preset: Preset, data: Dataset, work: str, cold: bool, text: tuple[str, int] | None) -> list[Entry]:
    desc = _describe(data, "~50 KB class-sorted shards")
    common = {"files": data.shards, "maxsize": preset.shard_bytes}
    shuf = shutil.which("shuf")
    entries = [
        Entry("d", "d", desc, RAW_READ, "raw", "bench_read:raw_read", {"files": data.shards, "samples": data.samples}, raw_ref=None, cold=cold),
        Entry("d", "d", desc, SHUFFLE, "shardkit", "bench_shuffle:shardkit_shuffle",
              {**common, "out": os.path.join(work, "shuffle"), "memory": data.shard_bytes // 10},
              skip=_shardkit_missing("shuffle", "issue 4"), cold=cold, meta={"data_bytes": data.shard_bytes}),
        Entry("d", "d", desc, RANDOM_ACCESS, "peer", "bench_shuffle:random_access", {**common, "out": os.path.join(work, "random")}, cold=cold),
    ]  # fmt: skip
    if shuf is None or text is None:
        entries.append(Entry("d", "d", desc, SHUF, "peer", skip="GNU shuf is not on PATH"))
    else:
        out = os.path.join(work, "shuf.txt")
        entries.append(
            Entry(
                "d",
                "d",
                desc,
                SHUF,
                "peer",
                command=[shuf, "-o", out, text[0]],
                figures={"samples": text[1], "bytes": data.shard_bytes, "out": out},
                cold=cold,
            )
        )
    return _tag(entries, data.samples)


def case_e(preset: Preset, data: Dataset) -> list[Entry]:
    skip = _shardkit_missing("loader", "issue 3")
    entries = []
    for m in sorted(data.spec.piles, reverse=True):
        desc = f"~50 KB raw, {_mb(data.shard_bytes)} in {m} piles (largest {_mb(data.max_pile_bytes[m])})"
        entries.append(
            Entry("e", "e", desc, f"{LOADER} M={m}", "shardkit", "bench_read:shardkit_loader", {"source": data.piles[m]}, raw_ref=None,
                  skip=skip, meta={"max_pile_bytes": data.max_pile_bytes[m]})
        )  # fmt: skip
    return _tag(entries, data.samples)


def _litdata(data: Dataset, preset: Preset, run: Any) -> tuple[str | None, str | None]:
    """Write the class-sorted shards with litdata's ``optimize`` once; returns (directory, reason it failed)."""
    out = os.path.join(data.root, "litdata")
    if os.path.exists(os.path.join(out, "index.json")):
        return out, None
    shutil.rmtree(out, ignore_errors=True)
    try:
        run("bench_dataloader:litdata_convert", {"files": data.shards, "out": out, "chunk_bytes": preset.shard_bytes})
    except RuntimeError as e:
        return None, f"litdata optimize failed: {e}"
    return out, None


def case_f(preset: Preset, data: Dataset, run: Any) -> list[Entry]:
    """Raw ~5 KB samples: one process against cat, and a DataLoader of the same workers and batch size."""
    k, b = DATALOADER_WORKERS, DATALOADER_BATCH
    desc = _describe(data, f"~5KB raw; DataLoader rows: {k} workers, batch {b}")
    piles = data.piles[data.spec.piles[0]]
    files = pile_files(piles)
    torch = _missing("torch", "pip install torch==2.13.0")
    litdata = _missing("litdata", "pip install litdata")
    lit, lit_failed = (None, litdata) if litdata else _litdata(data, preset, run)
    mosaic = _missing("streaming", MOSAIC_INSTALL) or torch
    mds, mds_failed = (None, mosaic) if mosaic else _mds(data, preset, run)
    loader = {"source": piles, "num_workers": k, "batch_size": b}
    return _tag([
        Entry("f", "f", desc, RAW_READ, "raw", "bench_read:raw_read", {"files": files, "samples": data.samples}, raw_ref=None),
        Entry("f", "f", desc, CAT, "raw", command=["cat", *files], figures={"samples": data.samples, "bytes": data.pile_bytes[data.spec.piles[0]]},
              skip=None if shutil.which("cat") else "cat is not on PATH"),
        Entry("f", "f", desc, LOADER, "shardkit", "bench_read:shardkit_loader", {"source": piles}),
        Entry("f", "f", desc, LOADER_VIEWS, "shardkit", "bench_dataloader:shardkit_views", {"source": piles}, raw_ref=CAT),
        Entry("f", "f", desc, TORCH_DATALOADER, "shardkit", "bench_dataloader:shardkit_dataloader", loader, skip=torch),
        Entry("f", "f", desc, TORCH_VIEWS, "shardkit", "bench_dataloader:shardkit_dataloader", {**loader, "views": True}, skip=torch),
        Entry("f", "f", desc, LITDATA, "peer", "bench_dataloader:litdata_read", {"dir": lit}, skip=lit_failed),
        Entry("f", "f", desc, LITDATA_LOADER, "peer", "bench_dataloader:litdata_dataloader",
              {"dir": lit, "num_workers": k, "batch_size": b}, skip=lit_failed),
        Entry("f", "f", desc, WDS_DATALOADER, "peer", "bench_dataloader:wds_raw_dataloader",
              {"files": data.shards, "num_workers": k, "batch_size": b}, skip=torch),
        Entry("f", "f", desc, MOSAIC_LOADER, "peer", "bench_dataloader:mosaic_dataloader",
              {"mds": mds, "num_workers": k, "batch_size": b}, skip=mds_failed),
    ], data.samples)  # fmt: skip
