"""Pass 1 over existing shards: ``shardkit.pile`` against re-encoding every sample and GNU ``shuf``.

Makes class-sorted shards of ~5 KB samples in shardkit's own form and, smaller, as webdataset's
TarWriter writes them (a pax header per member), plus a text file of the same bytes in ~5 KB
lines. Then times, in this one run: ``shardkit.pile`` for each ``--workers``; the re-encoding
path it replaces (every sample decoded to a dict and encoded again); ``pile`` on the webdataset
shards; and ``shuf -o`` on the text file. Prints wall and CPU seconds, GB/s and each figure as a
ratio to shuf. Timing is noisy on a shared machine: each figure is the median of ``--repeat``.

    python benchmarks/bench_pile.py --size 1024 --piles 20 --workers 1 2
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

import numpy as np

import shardkit
from shardkit.piles.encode import encode_sample
from shardkit.tar.shard import iter_shard

CLASSES = 10


def _payloads(rng: np.random.Generator, count: int) -> list[bytes]:
    sizes = rng.integers(4000, 6001, size=count)
    blob = rng.bytes(int(sizes.sum()))
    ends = np.cumsum(sizes).tolist()
    return [blob[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def make_shards(directory: str, megabytes: int, shards: int, *, webdataset: bool = False) -> list[str]:
    """Class-sorted shards of ~5 KB samples (a .bin payload and a .cls label), about ``megabytes``."""
    import webdataset as wds

    os.makedirs(directory, exist_ok=True)
    total = megabytes * 1_000_000 // 6_000  # ~6 KB a sample in the tar with headers and padding
    rng = np.random.default_rng(20240917)
    paths = []
    for k in range(shards):
        lo, hi = k * total // shards, (k + 1) * total // shards
        samples = [
            {"__key__": f"{i:09d}", "bin": p, "cls": i * CLASSES // total}
            for i, p in zip(range(lo, hi), _payloads(rng, hi - lo), strict=True)
        ]
        path = os.path.join(directory, f"shard-{k:06d}.tar")
        if webdataset:
            with wds.TarWriter(path) as w:
                for s in samples:
                    w.write({**s, "cls": str(s["cls"]).encode()})
        else:
            with open(path, "wb") as f:
                for s in samples:
                    f.write(encode_sample(s)[0])
                f.write(bytes(1024))
        paths.append(path)
    return paths


def make_text(path: str, nbytes: int) -> None:
    """Printable lines of 4-6 KB, ``nbytes`` in all: what shuf shuffles."""
    rng = np.random.default_rng(1)
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789 ", dtype=np.uint8)
    with open(path, "wb") as f:
        done = 0
        while done < nbytes:
            sizes = rng.integers(4000, 6001, size=2000)
            body = alphabet[rng.integers(0, len(alphabet), size=int(sizes.sum()))]
            body[np.cumsum(sizes) - 1] = ord("\n")
            f.write(body.tobytes())
            done += int(sizes.sum())


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(run: Callable[[], object], cleanup: Callable[[], None], repeat: int) -> tuple[float, float]:
    """Median wall and CPU seconds of ``run`` (``cleanup`` runs after each, untimed)."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), _cpu()
        run()
        walls.append(time.perf_counter() - wall)
        cpus.append(_cpu() - cpu)
        cleanup()
    return statistics.median(walls), statistics.median(cpus)


def _warm(paths: list[str]) -> int:
    total = 0
    for p in paths:
        with open(p, "rb") as f:
            total += len(f.read())
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=1024, help="MB of canonical shards (default 1024)")
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--piles", type=int, default=20)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--work", default=None, help="scratch directory (default: a temporary one, removed)")
    args = parser.parse_args(argv)
    work = args.work or tempfile.mkdtemp(prefix="bench-pile-")
    try:
        own = make_shards(os.path.join(work, "own"), args.size, args.shards)
        foreign = make_shards(os.path.join(work, "wds"), max(args.size // 4, 1), max(args.shards // 4, 1), webdataset=True)
        nbytes, foreign_bytes = _warm(own), _warm(foreign)
        out = os.path.join(work, "out")

        def clean() -> None:
            shutil.rmtree(out, ignore_errors=True)

        rows: list[tuple[str, int, float, float]] = []
        shuf = shutil.which("shuf")
        if shuf:
            text = os.path.join(work, "lines.txt")
            make_text(text, nbytes)
            _warm([text])
            result = os.path.join(work, "shuf.txt")
            wall, cpu = measure(lambda: subprocess.run([shuf, "-o", result, text], check=True), lambda: os.unlink(result), args.repeat)
            rows.append(("GNU shuf -o (text, same bytes)", nbytes, wall, cpu))
        for workers in args.workers:
            wall, cpu = measure(lambda w=workers: shardkit.pile(own, out, piles=args.piles, workers=w, quiet=True), clean, args.repeat)
            rows.append((f"shardkit.pile, workers={workers}", nbytes, wall, cpu))
        wall, cpu = measure(lambda: shardkit.preprocess(own, iter_shard, out, piles=args.piles, quiet=True), clean, args.repeat)
        rows.append(("re-encode every sample (preprocess(iter_shard))", nbytes, wall, cpu))
        wall, cpu = measure(lambda: shardkit.pile(foreign, out, piles=args.piles, quiet=True), clean, args.repeat)
        rows.append(("shardkit.pile of webdataset shards (pax), workers=1", foreign_bytes, wall, cpu))
        _print(rows, args)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def _print(rows: list[tuple[str, int, float, float]], args: argparse.Namespace) -> None:
    reference = rows[0][1] / rows[0][2] if rows and rows[0][0].startswith("GNU") else None
    print(f"pass 1, ~5 KB samples, {args.piles} piles, median of {args.repeat}; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(f"| {'case':52s} | {'GB':>5s} | {'wall s':>6s} | {'CPU s':>6s} | {'GB/s':>5s} | {'x shuf':>6s} |")
    print(f"|{'-' * 54}|{'-' * 7}|{'-' * 8}|{'-' * 8}|{'-' * 7}|{'-' * 8}|")
    for name, nbytes, wall, cpu in rows:
        rate = nbytes / wall
        ratio = f"{rate / reference:6.2f}" if reference else "     -"
        print(f"| {name:52s} | {nbytes / 1e9:5.2f} | {wall:6.2f} | {cpu:6.2f} | {rate / 1e9:5.2f} | {ratio} |")


if __name__ == "__main__":
    raise SystemExit(main())
