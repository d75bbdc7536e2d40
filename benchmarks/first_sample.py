"""Time to the first sample, and what it is made of, for piles of a given size and sample size.

For each (pile MB, sample bytes) a one-pile dataset is written once; then a fresh process
builds ``shardkit.loader`` and takes its first sample (imports done before the clock starts),
and times the parts of reading a pile alone: mapping it, its checksum against the manifest and
the header scan. Each dataset is read without its random-access index (the pile is read whole
before the first sample) and with it (the first samples are ranges checked against the index's
CRC-32s while the pile is read whole behind them), the two alternating process by process; the
index is built once in between by reading the dataset, and its build time is shown beside pass
1's (the ``PileWriter`` that writes the dataset, timed in fresh processes without the index and
with it written as the dataset is published, alternating). Warm page cache; medians of
``--repeats``.

    python benchmarks/first_sample.py                       # 8, 32, 100 MB piles of ~5 KB and ~100 KB samples
    python benchmarks/first_sample.py --piles 8 --samples 5000 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import harness

GOAL_S = 0.05


def write(p: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: pass 1 of a one-pile dataset of about ``p["mb"]`` MB of samples of
    ``p["size"]`` bytes into ``p["dir"]``, with the index written as it is published or not
    (``p["index"]``); the seconds its ``PileWriter`` took (payloads drawn before the clock)."""
    import numpy as np

    import shardkit

    rng = np.random.default_rng(0)
    count = p["mb"] * 10**6 // (p["size"] + 1536)
    payloads = [rng.bytes(p["size"]) for _ in range(count)]
    start = time.perf_counter()
    with shardkit.PileWriter(p["dir"], piles=1, seed=0, overwrite=True, index=p["index"]) as w:
        for i in range(count):
            w.write({"__key__": f"{i:09d}", "bin": payloads[i], "cls": i % 10})
    return {"pass1_s": time.perf_counter() - start}


def build(root: str, pile_mb: int, sample_bytes: int, repeats: int) -> tuple[str, float, float]:
    """A dataset of one pile of about ``pile_mb`` MB of samples of ``sample_bytes`` written
    without its index, and the median seconds of pass 1 without and with the index (fresh
    processes, alternating; the last run leaves the dataset without it)."""
    out = os.path.join(root, f"pile-{pile_mb}MB-{sample_bytes}B")
    os.makedirs(root, exist_ok=True)
    times: dict[bool, list[float]] = {True: [], False: []}
    for k in range(repeats):
        for index in (True, False) if k % 2 == 0 else (False, True):
            params = {"dir": out, "mb": pile_mb, "size": sample_bytes, "index": index}
            times[index].append(harness.measure_python("first_sample:write", params, timeout=600)["pass1_s"])
    if os.path.exists(index_path(out)):  # the last run wrote it
        params = {"dir": out, "mb": pile_mb, "size": sample_bytes, "index": False}
        harness.measure_python("first_sample:write", params, timeout=600)
    return out, statistics.median(times[False]), statistics.median(times[True])


def index_path(root: str) -> str:
    """Where the dataset ``root`` keeps its random-access index."""
    from shardkit import manifest
    from shardkit.dataset import layout

    return os.path.join(root, layout.index_name(manifest.read(root).generation))


def build_index(root: str) -> float:
    """Seconds to build and store the random-access index of ``root`` (in this process)."""
    from shardkit import manifest
    from shardkit.loading import index

    start = time.perf_counter()
    index.load_or_build(root, manifest.read(root))
    return time.perf_counter() - start


def first(p: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: seconds to the first sample, then the parts of reading the pile."""
    import shardkit
    import shardkit.loading  # what shardkit.loader imports on first use: imports stay off the clock
    from shardkit import manifest, storage
    from shardkit.tar import scan

    indexed = os.path.exists(index_path(p["dir"]))
    if indexed != p["indexed"]:
        raise RuntimeError(f"{p['dir']}: the index is {'there' if indexed else 'missing'}, the run wants the opposite")
    start = time.perf_counter()
    with shardkit.loader(p["dir"], decode=False) as loader:
        samples = iter(loader)  # kept: dropping it stops the epoch, which waits for the pile being read
        next(samples)
        first_s = time.perf_counter() - start
        del samples
    info = manifest.read(p["dir"]).piles[0]
    t0 = time.perf_counter()
    buf = storage.map_bytes(os.path.join(p["dir"], info.name))
    t1 = time.perf_counter()
    manifest.checksum(buf)
    t2 = time.perf_counter()
    scan.scan(buf, checksums=False)
    t3 = time.perf_counter()
    return {"first_s": first_s, "map_s": t1 - t0, "checksum_s": t2 - t1, "scan_s": t3 - t2}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--piles", default="8,32,100", help="pile sizes in MB (default 8,32,100)")
    parser.add_argument("--samples", default="5000,100000", help="sample sizes in bytes (default 5000,100000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", default=os.path.join(harness.HERE, "results", "first_sample"))
    args = parser.parse_args(argv)
    lines = [
        f"Command: `python benchmarks/first_sample.py {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip(),
        f"{args.repeats} fresh process(es) each, medians; warm page cache; load average {os.getloadavg()[0]:.2f} before.",
        "",
        "| pile | sample | first sample s, no index | first sample s, index | ratio | pass 1 s, no index | pass 1 s, index written | "
        "ratio | index built afterwards s | map s | checksum s | header scan s | ≤ 0.05 s with the index? |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mb in [int(x) for x in args.piles.split(",")]:
        for size in [int(x) for x in args.samples.split(",")]:
            path, written, with_index = build(args.data, mb, size, args.repeats)
            if os.path.exists(index_path(path)):
                os.remove(index_path(path))
            plain = [harness.measure_python("first_sample:first", {"dir": path, "indexed": False}, timeout=600)]
            built = build_index(path)
            indexed = []
            for k in range(args.repeats):  # alternating: the index is moved aside for a run without it
                indexed.append(harness.measure_python("first_sample:first", {"dir": path, "indexed": True}, timeout=600))
                if k + 1 < args.repeats:
                    os.rename(index_path(path), index_path(path) + ".aside")
                    plain.append(harness.measure_python("first_sample:first", {"dir": path, "indexed": False}, timeout=600))
                    os.rename(index_path(path) + ".aside", index_path(path))
            m = {k: statistics.median(r[k] for r in plain) for k in ("first_s", "map_s", "checksum_s", "scan_s")}
            fast = statistics.median(r["first_s"] for r in indexed)
            met = "yes" if fast <= GOAL_S else "**NO**"
            lines.append(
                f"| {mb} MB | {size:,} B | {m['first_s']:.3f} | {fast:.3f} | {m['first_s'] / fast:.1f}x | {written:.2f} | {with_index:.2f} | "
                f"{with_index / written:.2f}x | {built:.2f} | "
                f"{m['map_s']:.4f} | {m['checksum_s']:.3f} | {m['scan_s']:.3f} | {met} |"
            )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
