"""What bounds one process reading raw ~5 KB samples with ``views=True``, against ``cat`` of the same files.

Case f of ``run.py`` sets ``shardkit.loader(decode=False, views=True)`` against ``cat`` (goal: at
least 0.4 of its MB/s). Here, in fresh processes, alternating, medians of ``--repeats``:

- ``cat`` of the pile files to ``/dev/null`` (the process's start included, as in case f);
- the loader: a fresh loader for each of ``--epochs`` epochs, each sample's label copied as case
  f's consumer does; the process's first epoch (case f's figure: it carries the first pile read
  before any sample, and code run for the first time), its second, and its later ones;
- its two halves, each alone in a process: the pile reader's work (map and CRC-32 of each pile,
  then the header scan: what the reader thread does beside the consumer), and the consumer's
  work with every pile fetched before the clock (the index finished, the samples handed out in
  the epoch's order, each label copied).

The halves give the bounds of an epoch that reads each pile for the first time: the slower half
alone is the rate with a perfect overlap of the two threads, their sum the rate with none. The
loader's first epoch against the two says how much the threads overlap; each half's time against
``cat``'s says what a faster other half could not win back. Later epochs reuse each pile's index
kept from its second read (:mod:`shardkit.loading.layouts`): their reader only maps and checks
the file (the first reader row), and their consumer does not index it again. The second epoch
still scans and indexes every pile.

    python benchmarks/read_bound.py                                  # 30,000 samples in 12 piles
    python benchmarks/read_bound.py --samples 100000 --piles 40 --repeats 5
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import harness
from _timing import load_shardkit
from dataloader_epochs import build

GOAL = 0.4


def _files(path: str) -> list[str]:
    return sorted(glob.glob(os.path.join(path, "pile-*.tar")))


def cat(p: dict[str, Any]) -> dict[str, Any]:
    """``cat`` of every pile file to /dev/null, timed from before its start."""
    t0 = time.perf_counter()
    subprocess.run(["cat", *_files(p["dir"])], stdout=subprocess.DEVNULL, check=True)
    return {"seconds": time.perf_counter() - t0}


def loader(p: dict[str, Any]) -> dict[str, Any]:
    """Epochs of ``shardkit.loader(decode=False, views=True)``, a fresh loader each, the labels
    copied (case f's loop): the first epoch of the process (case f's figure) and the median of the
    later ones."""
    import shardkit

    load_shardkit()
    times = []
    for epoch in range(p["epochs"]):
        t0 = time.perf_counter()
        labels = []
        with shardkit.loader(p["dir"], decode=False, views=True, seed=p["seed"] + epoch) as stream:
            for sample in stream:
                labels.append(bytes(sample["cls"]))
        times.append(time.perf_counter() - t0)
    return {"seconds": times[0], "second": times[1], "later": statistics.median(times[2:]), "samples": len(labels)}


def reader(p: dict[str, Any]) -> dict[str, Any]:
    """The reader thread's work on every pile, alone: map and CRC-32 (the pages are mapped as the
    checksum first touches them), then the header scan."""
    from shardkit import storage
    from shardkit.manifest.model import checksum
    from shardkit.tar import scan

    load_shardkit()
    mapped = scanned = 0.0
    for path in _files(p["dir"]):
        t0 = time.perf_counter()
        store, name = storage.locate(path)
        buf = store.read_whole(name)
        checksum(buf)
        t1 = time.perf_counter()
        scan.scan(buf, checksums=False)
        t2 = time.perf_counter()
        mapped, scanned = mapped + t1 - t0, scanned + t2 - t1
        storage.unmap(buf)
    return {"seconds": mapped + scanned, "map_crc": mapped, "scan": scanned}


def consumer(p: dict[str, Any]) -> dict[str, Any]:
    """The loader's epoch with every pile fetched before the clock: what the consumer thread does
    (the reader hands each pile over at once)."""
    import shardkit
    from shardkit.loading import source

    load_shardkit()
    fetched: dict[tuple[str, int], Any] = {}
    original = source.Source.fetch

    def fetch(self: Any, index: int, **options: Any) -> Any:  # the pile read before, when it was
        if (self.name, index) not in fetched:
            fetched[self.name, index] = original(self, index, **options)
        return fetched[self.name, index]

    source.Source.fetch = fetch  # type: ignore[method-assign]
    for _ in shardkit.loader(p["dir"], decode=False, views=True, seed=p["seed"]):  # every pile fetched
        pass
    t0 = time.perf_counter()
    labels = []
    with shardkit.loader(p["dir"], decode=False, views=True, seed=p["seed"]) as stream:
        for sample in stream:
            labels.append(bytes(sample["cls"]))
    return {"seconds": time.perf_counter() - t0, "samples": len(labels)}


def _fresh(contender: str, params: dict[str, Any]) -> dict[str, Any]:
    """``contender(params)`` in a fresh interpreter (see :func:`harness.call_fresh`)."""
    return harness.call_fresh(f"read_bound:{contender}", params)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=30000)
    parser.add_argument("--piles", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=5, help="epochs of the loader row, each with a fresh loader (at least 3)")
    parser.add_argument("--data", default=os.path.join(harness.HERE, "results", "read_bound"))
    args = parser.parse_args(argv)
    if args.epochs < 3:
        parser.error("--epochs: at least 3 (the first, the second, and later ones, which reuse the piles' indexes)")
    path = build(args.data, args.samples, args.piles)
    nbytes = sum(os.path.getsize(f) for f in _files(path))
    contenders = ["cat", "loader", "reader", "consumer"]
    load = os.getloadavg()[0]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    for r in range(args.repeats):
        for name in contenders if r % 2 == 0 else reversed(contenders):
            runs[name].append(_fresh(name, {"dir": path, "seed": r * args.epochs, "epochs": args.epochs}))
    med = {name: {k: statistics.median(run[k] for run in rs) for k in rs[0]} for name, rs in runs.items()}
    cat_s, loader_s, reader_s, consumer_s = (med[n]["seconds"] for n in contenders)
    later_s = med["loader"]["later"]

    def row(what: str, seconds: float) -> str:
        return f"| {what} | {seconds * 1e3:.1f} | {nbytes / seconds / 1e6:,.0f} | {cat_s / seconds:.3f}x |"

    overlap, none = max(reader_s, consumer_s), reader_s + consumer_s
    lines = [
        f"Command: `python benchmarks/read_bound.py {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip(),
        f"{args.samples:,} raw ~5 KB samples in {args.piles} piles ({nbytes / 1e6:.0f} MB), warm page cache; {args.repeats} fresh "
        f"processes each, alternating, medians; load average {load:.2f} before and {os.getloadavg()[0]:.2f} after, "
        f"on {os.cpu_count()} cores.",
        "",
        "| what | ms an epoch | MB/s | over cat |",
        "|---|---:|---:|---:|",
        row("cat", cat_s),
        row("shardkit.loader views=True, a process's first epoch", loader_s),
        row("shardkit.loader views=True, the second epoch", med["loader"]["second"]),
        row("shardkit.loader views=True, later epochs", later_s),
        row("reader alone: map and CRC-32", med["reader"]["map_crc"]),
        row("reader alone: header scan", med["reader"]["scan"]),
        row("reader alone", reader_s),
        row("consumer alone (piles fetched before)", consumer_s),
        row("bound with a perfect overlap (the slower half)", overlap),
        row("bound with no overlap (the sum)", none),
        "",
        f"views=True over cat (goal ≥ {GOAL}x): {cat_s / loader_s:.3f}x a process's first epoch "
        f"({'met' if cat_s / loader_s >= GOAL else 'missed'}), {cat_s / later_s:.3f}x later epochs, which reuse the piles' "
        f"indexes kept from the second ({'met' if cat_s / later_s >= GOAL else 'missed'}). "
        f"The first epoch took {loader_s / overlap:.2f}x the slower half alone and {loader_s / none:.2f}x the two halves' sum; "
        f"the consumer alone needs {consumer_s / cat_s:.2f}x cat's time, the reader alone {reader_s / cat_s:.2f}x.",
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
