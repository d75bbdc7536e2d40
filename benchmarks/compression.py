"""Compressed piles against plain ones: write and read samples/s, and bytes saved.

Two kinds of samples: ~5 KB JSON records (compressible text) and JPEG images (already
compressed). For each, the same samples are written with ``PileWriter`` plain, with zstd,
gzip and lz4 at several levels, then read back whole with ``shardkit.loader(decode=False)`` (the
prefetch thread decompresses; the figure is what a training loop would see). zstd piles are
read two ways: as written (frames and a seek table, decompressed by libzstd on its threads in
one call), and re-encoded as one frame without a table (the format before frames, one thread). Every
configuration runs once per round and the rounds are repeated, so all of them share the
machine's ups and downs; the table shows medians. The piles are in the page cache when read
(they were just written), so reads measure CPU, not the disk: compression gains more where
the disk or network is the bottleneck.

The last lines split one zstd pile's read into its parts (read the file, decompress, check,
index), for the default level, to show what bounds the read, and compare frame sizes. Then one
loader reads the JSON piles for several epochs (``--epochs``), each row in a fresh process: its
later epochs decode into memory an earlier pile was decoded into, and rows that decode every pile
into new memory show what that saves (more with piles over 32 MB, which glibc gives back to the
system when freed: ``--piles 2`` makes ~50 MB piles of the default samples); a row with
``prefetch=1`` shows what decoding two piles at once (the default for local compressed piles) gains,
and one where the consumer sleeps while it waits what its decoding of lz4 blocks then gains.

    python benchmarks/compression.py                     # ~100 MB of JSON, ~60 MB of JPEG, 3 rounds
    python benchmarks/compression.py --json-samples 2000 --jpeg-samples 200 --repeats 1
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import shardkit
from shardkit import assist, manifest, storage
from shardkit.loading.pile import fetch
from shardkit.tar import compression, zstd_frames

LEVELS = {"zstd": [1, 3, 6, 9], "gzip": [1, 6], "lz4": [0, 3]}
# the switch interval (seconds) of the rows of epochs() that shorten it from Python's 5 ms
SWITCH = 0.0005
# what lz4 at its default level should reach on the JSON samples: a share of plain's read rate, and bytes saved
LZ4_GOALS = {"read": 0.7, "saved": 0.4}
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "an",
    "were",
    "which",
    "are",
    "this",
    "be",
    "has",
    "had",
    "not",
    "but",
    "one",
    "also",
    "their",
    "they",
    "its",
    "first",
    "new",
    "more",
    "who",
    "after",
    "two",
    "been",
    "other",
    "time",
    "city",
    "year",
    "years",
    "people",
    "world",
    "school",
    "during",
    "university",
    "state",
    "national",
    "team",
    "music",
    "including",
    "known",
    "season",
    "american",
    "series",
    "british",
    "film",
    "government",
    "war",
    "history",
]


def json_samples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` JSON records of about 5 KB: an id, a title, a body of common words, some numbers."""
    rng = np.random.default_rng(seed)
    words = np.array(_WORDS)
    out = []
    for i in range(n):
        body = " ".join(words[rng.integers(0, len(words), size=720)].tolist())
        doc = {"id": i, "title": " ".join(words[rng.integers(0, len(words), size=6)].tolist()), "text": body}
        doc |= {"score": float(rng.random()), "tokens": rng.integers(0, 50_000, size=40).tolist(), "lang": "en"}
        out.append({"__key__": f"{i:09d}", "json": json.dumps(doc).encode()})
    return out


def jpeg_samples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` JPEG images of 160x160 (about 15-20 KB each): smooth gradients plus noise, quality 90."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:160, 0:160]
    out = []
    for i in range(n):
        base = (x * rng.uniform(0.5, 1.5) + y * rng.uniform(0.5, 1.5))[..., None] + rng.uniform(0, 255, size=3)
        pixels = np.clip(base + rng.normal(0, 40, size=(160, 160, 3)), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
        out.append({"__key__": f"{i:09d}", "jpg": buf.getvalue(), "cls": str(i % 10).encode()})
    return out


def write(samples: list[dict[str, Any]], out: str, piles: int, codec: str | None, level: int | None) -> float:
    """Seconds to write ``samples`` into ``out`` (removed first)."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    with shardkit.PileWriter(out, piles=piles, seed=0, compression=codec, compression_level=level) as w:
        for sample in samples:
            w.write(sample)
    return time.perf_counter() - start


def read(out: str) -> tuple[float, int]:
    """Seconds to read every sample of ``out`` through the loader (decode=False), and the count."""
    start = time.perf_counter()
    count = 0
    with shardkit.loader(out, seed=0, decode=False) as loader:
        for _ in loader:
            count += 1
    return time.perf_counter() - start, count


def single_frame(src: str, out: str, level: int) -> None:
    """``src``'s zstd piles re-encoded as one frame each, without a seek table: the format
    before frames (libzstd with two worker threads), manifest rewritten to match."""
    import zstandard

    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    m = manifest.read(src)
    piles = []
    for info in m.piles:
        tar = compression.decompress(storage.read_bytes(os.path.join(src, info.name)), "zstd", info.name)
        data = zstandard.ZstdCompressor(level=level, threads=2, write_checksum=True).compress(tar)
        storage.write_bytes(os.path.join(out, info.name), data)
        piles.append(dataclasses.replace(info, bytes=len(data), checksum=manifest.format_checksum(manifest.checksum(data))))
    manifest.write(out, dataclasses.replace(m, piles=tuple(piles)))


# how each zstd dataset is read: (name suffix, re-encoded as one frame)
ZSTD_READS = [("1 frame", True), ("frames", False)]


def configs() -> list[tuple[str, str | None, int | None]]:
    return [("plain", None, None), *((f"{c} {level}", c, level) for c in ("zstd", "gzip", "lz4") for level in LEVELS[c])]


def measure(samples: list[dict[str, Any]], root: str, piles: int, repeats: int) -> dict[str, dict[str, Any]]:
    """Medians of ``repeats`` rounds; each round writes and reads every configuration once
    (a zstd one is read each way of :data:`ZSTD_READS`)."""
    runs: dict[str, dict[str, list[float]]] = {}
    sizes: dict[str, int] = {}
    for _ in range(repeats):
        for name, codec, level in configs():
            out = os.path.join(root, name.replace(" ", "-"))
            seconds = write(samples, out, piles, codec, level)
            reads = [(name, out)]
            if codec == "zstd":
                single_frame(out, out + "-single", level or compression.DEFAULT_LEVEL["zstd"])
                reads = [(f"{name}, {how}", out + "-single" if single else out) for how, single in ZSTD_READS]
            for label, where in reads:
                took, count = read(where)
                if count != len(samples):
                    raise SystemExit(f"{where}: read {count} samples, wrote {len(samples)}")
                run = runs.setdefault(label, {"write": [], "read": []})
                run["read"].append(took)
                if where == out:  # the single-frame copy was not written by shardkit: no write time
                    run["write"].append(seconds)
                sizes[label] = manifest.read(where).bytes
    n = len(samples)
    return {
        name: {
            "write_per_s": n / statistics.median(r["write"]) if r["write"] else None,
            "read_per_s": n / statistics.median(r["read"]),
            "bytes": sizes[name],
        }
        for name, r in runs.items()
    }


def table(title: str, figures: dict[str, dict[str, Any]]) -> str:
    plain = figures["plain"]
    lines = [
        f"### {title}",
        "",
        "| piles | write samples/s | vs plain | read samples/s | vs plain | bytes | saved |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, f in figures.items():
        written = "" if f["write_per_s"] is None else f"{f['write_per_s']:,.0f}"
        ratio = "" if f["write_per_s"] is None else f"{f['write_per_s'] / plain['write_per_s']:.2f}x"
        lines.append(
            f"| {name} | {written} | {ratio} | {f['read_per_s']:,.0f} | "
            f"{f['read_per_s'] / plain['read_per_s']:.2f}x | {f['bytes'] / 1e6:,.1f} MB | {1 - f['bytes'] / plain['bytes']:.0%} |"
        )
    return "\n".join(lines)


def goals(figures: dict[str, dict[str, Any]]) -> str:
    """lz4 at its default level against :data:`LZ4_GOALS` on the JSON samples."""
    plain, lz4 = figures["plain"], figures[f"lz4 {compression.DEFAULT_LEVEL['lz4']}"]
    read, saved = lz4["read_per_s"] / plain["read_per_s"], 1 - lz4["bytes"] / plain["bytes"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    return (
        f"lz4 {compression.DEFAULT_LEVEL['lz4']}: reads at {read:.2f}x plain (goal >= {LZ4_GOALS['read']}x: {verdict(read >= LZ4_GOALS['read'])}), "
        f"{saved:.0%} smaller (goal >= {LZ4_GOALS['saved']:.0%}: {verdict(saved >= LZ4_GOALS['saved'])})"
    )


def _best(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _busy(fn: Any, repeats: int) -> float:
    """:func:`_best` of ``fn`` while another thread runs Python code, holding the GIL as the
    loader's consumer does: a decompressor that must take the GIL back often waits on it."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(100))

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        return _best(fn, repeats)
    finally:
        stop.set()
        thread.join()


def profile(root: str, repeats: int) -> str:
    """One zstd pile (default level) read in parts: where a compressed read's time goes; then
    the same tar cut into frames of several sizes."""
    level = compression.DEFAULT_LEVEL["zstd"]
    out = os.path.join(root, f"zstd-{level}")
    info = manifest.read(out).piles[0]
    url = os.path.join(out, info.name)
    plain = manifest.read(os.path.join(root, "plain")).piles[0]
    stored = storage.read_bytes(url)
    single = storage.read_bytes(os.path.join(out + "-single", info.name))
    tar = compression.decompress(stored, "zstd", url)
    lz4 = compression.compress(tar, "lz4", level=0)
    parts = {
        "read the .tar.zst": _best(lambda: storage.read_bytes(url), repeats),
        "decompress, 1 frame": _best(lambda: compression.decompress(single, "zstd", url, size=info.tar_bytes), repeats),
        "decompress, frames": _best(lambda: compression.decompress(stored, "zstd", url, size=info.tar_bytes), repeats),
        "1 frame, beside a busy thread": _busy(lambda: compression.decompress(single, "zstd", url, size=info.tar_bytes), repeats),
        "frames, beside a busy thread": _busy(lambda: compression.decompress(stored, "zstd", url, size=info.tar_bytes), repeats),
        "checksum the tar": _best(lambda: manifest.checksum(tar), repeats),
        "lz4, checked (the loader's way)": _best(lambda: compression.decompress(lz4, "lz4", url, size=len(tar), checked=True), repeats),
        "lz4 (level 0) beside a busy thread": _busy(lambda: compression.decompress(lz4, "lz4", url, size=len(tar)), repeats),
        "lz4, checked (the loader's way), busy": _busy(
            lambda: compression.decompress(lz4, "lz4", url, size=len(tar), checked=True), repeats
        ),
        "whole fetch (checked, scanned)": _best(lambda: fetch(url, expected=info), repeats),
        "plain pile fetch": _best(lambda: fetch(os.path.join(root, "plain", plain.name), expected=plain), repeats),
    }
    mb = (info.tar_bytes or 0) / 1e6
    lines = [f"one zstd-{level} pile: {info.samples} samples, {mb:.1f} MB of tar, {info.bytes / 1e6:.1f} MB stored"]
    for what, seconds in parts.items():
        lines.append(f"  {what:<32} {seconds * 1e3:8.1f} ms  ({mb / max(seconds, 1e-9):,.0f} MB/s of tar)")
    # what a loader's consumer spends handing out a plain pile of the same samples: a decoder slower
    # than this on the other core bounds a compressed read, however well the two overlap
    handed = _handed_out(os.path.join(os.path.dirname(out), "plain"), repeats)
    decode = parts["lz4, checked (the loader's way)"]
    lines.append(
        f"  {'hand out a plain pile (loader)':<32} {handed * 1e3:8.1f} ms  ({mb / max(handed, 1e-9):,.0f} MB/s of tar): "
        f"lz4 decodes at {handed / decode:.2f}x the rate the loader hands a pile out"
    )
    lines.append(f"the same tar in frames of (default {zstd_frames.FRAME_SIZE >> 20} MiB):")
    for mib in (1, 2, 4, 8):
        writer = zstd_frames.FrameWriter(level=level, frame_size=mib << 20)
        data = writer.compress(tar) + writer.finish()
        took = _best(lambda d=data: compression.decompress(d, "zstd", url), repeats)  # type: ignore[misc]
        lines.append(f"  {mib} MiB: {len(data) / 1e6:.2f} MB stored; decompress {took * 1e3:.1f} ms")
    return "\n".join(lines)


def _handed_out(plain: str, repeats: int) -> float:
    """Seconds a warm loader takes per pile to hand out every sample of the plain dataset ``plain``
    (the later epochs of one loader; its piles are read ahead on the other core)."""
    piles = len(manifest.read(plain).piles)
    with shardkit.loader(plain, seed=0, decode=False) as loader:
        sum(1 for _ in loader)
        return _best(lambda: sum(1 for _ in loader), repeats) / piles


@contextlib.contextmanager
def _new_memory(on: bool) -> Iterator[None]:
    """With ``on``, every pile is decoded into memory of its own, as before the loader kept a
    :class:`~shardkit.storage.Scratch` (the counterfactual row of :func:`epochs`)."""
    if not on:
        yield
        return
    real = storage.Scratch.take
    storage.Scratch.take = lambda self, size: None  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        storage.Scratch.take = real  # type: ignore[method-assign]


@contextlib.contextmanager
def _no_help(on: bool) -> Iterator[None]:
    """With ``on``, the consumer never decodes a block of the lz4 pile it waits for: it sleeps until
    the reader thread is done, as before the loader shared blocks (a counterfactual row of :func:`epochs`)."""
    if not on:
        yield
        return
    real = assist.Board.offered
    assist.Board.offered = lambda self: False  # type: ignore[method-assign]
    try:
        yield
    finally:
        assist.Board.offered = real  # type: ignore[method-assign]


def one_loader(p: dict[str, Any]) -> dict[str, float]:
    """``p["epochs"]`` epochs of one loader over ``p["dir"]`` (``prefetch=p["prefetch"]``; with
    ``p["fresh"]`` every pile decoded into new memory, with ``p["alone"]`` no block decoded by the
    consumer, with ``p["switch"]`` Python's switch interval set to that many seconds): samples/s of
    the first and the median of the later ones. Run by :func:`epochs`, each in a fresh process."""
    n = manifest.read(p["dir"]).samples
    if p.get("switch"):
        sys.setswitchinterval(p["switch"])
    with (
        _new_memory(p["fresh"]),
        _no_help(p["alone"]),
        shardkit.loader(p["dir"], seed=0, decode=False, prefetch=p["prefetch"]) as loader,
    ):
        took = []
        for _ in range(p["epochs"]):
            start = time.perf_counter()
            got = sum(1 for _ in loader)
            took.append(time.perf_counter() - start)
            if got != n:
                raise SystemExit(f"{p['dir']}: read {got} samples, wrote {n}")
    return {"first": n / took[0], "later": n / statistics.median(took[1:])}


def epochs(root: str, count: int, repeats: int) -> str:
    """Epochs of one loader over the JSON piles, each row in a fresh process (alternating order,
    ``repeats`` rounds, medians): the first, and the median of the later ones, in samples/s. Later
    epochs decode into memory an earlier pile was decoded into; the "new memory" rows decode every
    pile into memory of its own, the "one pile at a time" row reads with ``prefetch=1`` (one
    thread decodes) instead of the default (two ahead, two threads decoding at once), and in the
    "never decodes" row the consumer sleeps while it waits for an lz4 pile instead of decoding
    some of its blocks. In the "switch interval" rows the process sets ``sys.setswitchinterval`` to
    :data:`SWITCH` (Python's default is 5 ms): a decoding thread whose C call returned waits for the
    consumer, which holds the GIL handing samples out, to let it go; the interval bounds that wait."""
    import harness

    lz4, zstd = compression.DEFAULT_LEVEL["lz4"], compression.DEFAULT_LEVEL["zstd"]
    rows = [
        ("plain", "plain", None, None),
        (f"lz4 {lz4}", f"lz4-{lz4}", None, None),
        (f"lz4 {lz4}, one pile at a time (prefetch=1)", f"lz4-{lz4}", None, 1),
        (f"lz4 {lz4}, new memory each pile", f"lz4-{lz4}", "fresh", None),
        (f"lz4 {lz4}, the consumer never decodes a block", f"lz4-{lz4}", "alone", None),
        (f"plain, switch interval {SWITCH * 1e3:g} ms", "plain", "switch", None),
        (f"lz4 {lz4}, switch interval {SWITCH * 1e3:g} ms", f"lz4-{lz4}", "switch", None),
        (f"lz4 {lz4}, one pile at a time, the consumer never decodes a block", f"lz4-{lz4}", "alone", 1),
        (f"zstd {zstd}, frames", f"zstd-{zstd}", None, None),
        (f"zstd {zstd}, frames, new memory each pile", f"zstd-{zstd}", "fresh", None),
    ]
    firsts: dict[str, list[float]] = {label: [] for label, *_ in rows}
    laters: dict[str, list[float]] = {label: [] for label, *_ in rows}
    n = manifest.read(os.path.join(root, "plain")).samples
    for r in range(repeats):
        for label, name, variant, prefetch in rows if r % 2 == 0 else rows[::-1]:
            params = {
                "dir": os.path.join(root, name),
                "epochs": count,
                "fresh": variant == "fresh",
                "alone": variant == "alone",
                "switch": SWITCH if variant == "switch" else None,
                "prefetch": prefetch,
            }
            got = harness.call_fresh("compression:one_loader", params)
            firsts[label].append(got["first"])
            laters[label].append(got["later"])
    plain, plain_first = statistics.median(laters["plain"]), statistics.median(firsts["plain"])
    lines = [
        f"{count} epochs of one loader ({n:,} samples; each row in a fresh process, alternating, medians of {repeats} rounds)",
        "",
        "| piles | first epoch samples/s | first vs plain | later epochs samples/s | later vs plain |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, *_ in rows:
        first, later = statistics.median(firsts[label]), statistics.median(laters[label])
        lines.append(f"| {label} | {first:,.0f} | {first / plain_first:.2f}x | {later:,.0f} | {later / plain:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--json-samples", type=int, default=20_000, help="~5 KB JSON records")
    parser.add_argument("--jpeg-samples", type=int, default=3_000, help="JPEG images (~20 KB)")
    parser.add_argument("--piles", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="rounds; the table shows medians")
    parser.add_argument("--epochs", type=int, default=4, help="epochs of one loader over the JSON piles (0: none)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory, removed after)")
    args = parser.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="shardkit-compression-")
    try:
        threads = zstd_frames.threads_for(1 << 20)
        print(f"cpus {os.cpu_count()}, zstd decompress threads per pile {threads} by default, repeats {args.repeats} (medians)\n")
        for title, make, n in (("~5 KB JSON samples", json_samples, args.json_samples), ("JPEG samples", jpeg_samples, args.jpeg_samples)):
            samples = make(n)
            size = sum(len(v) for s in samples for k, v in s.items() if k != "__key__") / n
            figures = measure(samples, os.path.join(root, title.split()[-2]), args.piles, args.repeats)
            print(table(f"{title} ({n:,} samples, mean {size / 1e3:.1f} KB, {args.piles} piles)", figures), "\n")
            if make is json_samples:
                print(goals(figures), "\n")
                print(profile(os.path.join(root, title.split()[-2]), args.repeats), "\n")
                if args.epochs > 1:
                    print(epochs(os.path.join(root, title.split()[-2]), args.epochs, args.repeats), "\n")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
