"""Object storage: shardkit reading and writing S3 against s3fs and webdataset, under S3-like limits.

moto alone on loopback is CPU-bound and answers the first byte at once, which real S3 does not:
there one connection gives tens of MB/s after tens of ms. So every request here goes through
``tests/s3_server.S3Proxy`` in front of moto, which waits LATENCY before each response's first
byte and sends each body at most BANDWIDTH bytes/s (defaults: 20 ms, 40 MB/s, as the table says).
One run measures, side by side, repeated round-robin, medians quoted:

- shardkit.loader, one epoch from S3 (``decode=False``, default prefetch: piles under 16 MiB
  are one request each, several read at once), at the default
  ``remote_concurrency`` and at 1, 2, 4, 8, 16 (how the default is chosen), and its first sample;
- (a) the same piles fetched whole one after another with s3fs (``fs.cat_file``);
- (b) s3fs ``cat_ranges`` splitting each pile into k ranges, k = 1..32 (the ceiling: the best k);
- (c) webdataset 1.0.2 over the same objects (it has no s3:// handler: one is registered in
  ``webdataset.gopen.gopen_schemes`` that opens the URL with fsspec, so it reads through s3fs
  and the same proxy), one pass, no shuffle buffer;
- a second epoch from the loader's ``cache_dir`` against the loader on a local copy;
- pass 1 (``shardkit.preprocess(..., workers=1)``) to S3 against to local disk, with the objects
  written and the requests and bytes the proxy saw.

    python benchmarks/remote.py --size smoke     # seconds; what tests/test_remote_bench.py runs
    python benchmarks/remote.py                  # small: 16 piles of ~24 MB, 3 repeats (a few minutes)
    python benchmarks/remote.py --size full --out /tmp/remote
    python benchmarks/remote.py --server thread  # moto and the proxy in this process instead

moto and the proxy run by default in a separate (spawned) process, so the client's CPU work does
not compete with them for one GIL; ``--server thread`` puts them in threads of this process.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import numpy as np  # noqa: E402

import shardkit  # noqa: E402
from shardkit import manifest  # noqa: E402
from shardkit.loading.prefetch import read_ahead  # noqa: E402
from shardkit.storage import remote as storage_remote  # noqa: E402

MB = 1e6
CONCURRENCIES = (1, 2, 4, 8, 16)
RANGES = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Size:
    piles: int
    samples_per_pile: int
    sample_bytes: int
    repeats: int


SIZES = {
    "smoke": Size(piles=4, samples_per_pile=40, sample_bytes=25_000, repeats=1),  # 4 MB
    "small": Size(piles=16, samples_per_pile=240, sample_bytes=100_000, repeats=3),  # ~390 MB
    "full": Size(piles=32, samples_per_pile=640, sample_bytes=100_000, repeats=3),  # ~2 GB
}

GOALS = [
    # (name, row over row, at least)
    ("loader / (a) s3fs cat_file, sequential", "loader", "cat_file", 3.0),
    ("loader / (b) best s3fs cat_ranges", "loader", "cat_ranges", 0.8),
    ("loader / (c) webdataset via fsspec", "loader", "webdataset", 10.0),
    ("epoch 2 from cache_dir / loader on local disk", "cached", "local", 0.8),
]


# --- the server: moto behind the proxy, in this process or in a spawned one ---------------------------


def _serve(conn: Any, latency: float, bandwidth: float) -> None:
    """Child process: start moto and the proxy, send their endpoints, answer 'counts' until 'stop'."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from s3_server import S3Proxy, start_moto

    with start_moto() as moto, S3Proxy(moto.endpoint, latency=latency, bandwidth=bandwidth) as proxy:
        conn.send((moto.endpoint, proxy.endpoint))
        while True:
            message = conn.recv()
            if message == "counts":
                conn.send(proxy.counts())
            elif isinstance(message, tuple) and message[0] == "limits":
                proxy.latency, proxy.bandwidth = message[1], message[2]
                conn.send("ok")
            elif message == "cpu":
                t = os.times()
                conn.send(t.user + t.system)
            else:
                break
    conn.send("stopped")


class Server:
    """moto behind an S3Proxy; ``.moto``, ``.proxy`` (endpoints), ``.counts()``, ``.cpu()``, ``.close()``."""

    def __init__(self, mode: str, latency: float, bandwidth: float) -> None:
        self.mode = mode
        if mode == "thread":
            from s3_server import S3Proxy, start_moto

            self._moto = start_moto()
            self._proxy = S3Proxy(self._moto.endpoint, latency=latency, bandwidth=bandwidth)
            self.moto, self.proxy = self._moto.endpoint, self._proxy.endpoint
            return
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, latency, bandwidth), daemon=True)
        self._process.start()
        self.moto, self.proxy = self._conn.recv()

    def counts(self) -> dict[str, int]:
        if self.mode == "thread":
            return self._proxy.counts()
        self._conn.send("counts")
        return self._conn.recv()

    def limits(self, latency: float, bandwidth: float | None) -> None:
        """Change the proxy's latency and bandwidth (None: no cap) from now on."""
        if self.mode == "thread":
            self._proxy.latency, self._proxy.bandwidth = latency, bandwidth
            return
        self._conn.send(("limits", latency, bandwidth))
        self._conn.recv()

    def cpu(self) -> float | None:
        """CPU seconds the server process has used (None in thread mode: it shares this process)."""
        if self.mode == "thread":
            return None
        self._conn.send("cpu")
        return self._conn.recv()

    def close(self) -> None:
        if self.mode == "thread":
            self._proxy.stop()
            self._moto.stop()
            return
        with contextlib.suppress(OSError, EOFError):
            self._conn.send("stop")
            self._conn.recv()
        self._process.join(10)


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


# --- the data -----------------------------------------------------------------------------------------


def make_unit(unit: tuple[int, int, int]) -> Iterator[dict[str, Any]]:
    """The samples of one input unit: ``(index, samples, bytes)`` -> random ~``bytes`` payloads, seeded by index."""
    index, count, size = unit
    rng = np.random.default_rng(index)
    for i in range(count):
        n = int(size * rng.uniform(0.8, 1.2))
        yield {"__key__": f"u{index:04d}_{i:05d}", "bin": rng.bytes(n), "cls": b"%d" % (i % 10)}


def units_for(size: Size) -> list[tuple[int, int, int]]:
    return [(u, size.samples_per_pile, size.sample_bytes) for u in range(size.piles)]


# --- the contenders: each returns {"samples", "bytes", "seconds", ...} ----------------------------------


@dataclass(frozen=True)
class Data:
    url: str  # s3://bucket/data
    local: str  # the same dataset on local disk
    paths: list[str]  # bucket/data/pile-...tar, the form s3fs takes
    sizes: list[int]
    samples: int
    bytes: int


def run_cat_file(fs: Any, data: Data) -> dict[str, Any]:
    started = time.perf_counter()
    got = sum(len(fs.cat_file(p)) for p in data.paths)
    seconds = time.perf_counter() - started
    assert got == data.bytes, (got, data.bytes)
    return {"samples": data.samples, "bytes": got, "seconds": seconds}


def run_cat_ranges(fs: Any, data: Data, k: int) -> dict[str, Any]:
    started = time.perf_counter()
    got = 0
    for path, size in zip(data.paths, data.sizes, strict=True):
        bounds = [size * j // k for j in range(k + 1)]
        got += sum(len(b) for b in fs.cat_ranges([path] * k, bounds[:-1], bounds[1:]))
    seconds = time.perf_counter() - started
    assert got == data.bytes, (got, data.bytes)
    return {"samples": data.samples, "bytes": got, "seconds": seconds}


def unlimited(server: Server, args: argparse.Namespace, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn()`` with the proxy's limits lifted: what moto, the proxy and the client manage on this machine."""
    server.limits(0.0, None)
    try:
        return fn()
    finally:
        server.limits(args.latency, args.bandwidth)


def run_loader(data: Data, **options: Any) -> dict[str, Any]:
    """One epoch of a fresh loader from S3; first sample timed from ``iter()``."""
    started = time.perf_counter()
    loader = shardkit.loader(data.url, decode=False, seed=0, **options)
    iterator = iter(loader)
    at_iter = time.perf_counter()
    first = None
    n = 0
    for _ in iterator:
        if first is None:
            first = time.perf_counter() - at_iter
        n += 1
    seconds = time.perf_counter() - started
    loader.close()
    assert n == data.samples, (n, data.samples)
    return {"samples": n, "bytes": data.bytes, "seconds": seconds, "first_sample_s": first}


def _epoch(loader: Any, epoch: int) -> tuple[int, float]:
    loader.set_epoch(epoch)
    started = time.perf_counter()
    n = sum(1 for _ in loader)
    return n, time.perf_counter() - started


def run_cached(data: Data, server: Server, cache_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Epoch 1 from S3 filling an empty ``cache_dir``, then epoch 2 from it (the same loader)."""
    shutil.rmtree(cache_dir, ignore_errors=True)
    with shardkit.loader(data.url, decode=False, seed=0, cache_dir=cache_dir) as loader:
        start = server.counts()
        n1, s1 = _epoch(loader, 0)
        before = server.counts()
        n2, s2 = _epoch(loader, 1)
        seen = delta(before, server.counts())
        filling = delta(start, before)
        stats = loader._setup.reads.cache.stats()
    assert n1 == n2 == data.samples, (n1, n2)
    fill = {"samples": n1, "bytes": data.bytes, "seconds": s1, "requests": filling["requests"], "connections": filling["connections"]}
    cached = {
        "samples": n2,
        "bytes": data.bytes,
        "seconds": s2,
        "requests": seen["requests"],
        "cache": vars(stats) if hasattr(stats, "__dict__") else str(stats),
    }
    return fill, cached


def run_local(data: Data) -> dict[str, Any]:
    """Epoch 2 of a loader on the local copy, timed as the cached epoch is: the loader built and
    its first epoch read, as the cache's first epoch wrote its files (the first read of files
    written a minute before was up to 3x slower here, see ``first_epoch_s``)."""
    with shardkit.loader(data.local, decode=False, seed=0) as loader:
        n1, first = _epoch(loader, 0)
        n, seconds = _epoch(loader, 1)
    assert n == n1 == data.samples
    return {"samples": n, "bytes": data.bytes, "seconds": seconds, "first_epoch_s": first}


def _gopen_fsspec(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
    import fsspec

    return fsspec.open(url, mode).open()


def run_webdataset(data: Data) -> dict[str, Any]:
    import importlib

    import webdataset as wds

    gopen = importlib.import_module("webdataset.gopen")  # the module: webdataset.gopen is also the function's name
    gopen.gopen_schemes["s3"] = _gopen_fsspec
    urls = [f"s3://{p}" for p in data.paths]
    started = time.perf_counter()
    n = sum(1 for _ in wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    seconds = time.perf_counter() - started
    assert n == data.samples, (n, data.samples)
    return {"samples": n, "bytes": data.bytes, "seconds": seconds}


def run_pass1(units: list[Any], out: str, piles: int, server: Server | None) -> dict[str, Any]:
    before = server.counts() if server else None
    started = time.perf_counter()
    m = shardkit.preprocess(units, make_unit, out, piles=piles, workers=1, seed=0, quiet=True)
    seconds = time.perf_counter() - started
    row = {"samples": m.samples, "bytes": sum(p.bytes for p in m.piles), "seconds": seconds}
    if server is not None:
        seen = delta(before, server.counts())
        row.update(requests=seen["requests"], bytes_up=seen["bytes_up"])
    return row


# --- the run ----------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo") as f:
        cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    versions = {"shardkit": shardkit.__version__}
    for name in ("s3fs", "fsspec", "aiobotocore", "moto", "webdataset"):
        with contextlib.suppress(Exception):
            versions[name] = __import__(name).__version__
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "load_before": f"{os.getloadavg()[0]:.2f}",
        "versions": versions,
    }


def setup(server: Server, size: Size, work: str) -> tuple[Data, Any]:
    from s3_server import S3Bucket, aws_environment

    bucket = S3Bucket.create(server.moto)
    for name, value in aws_environment(server.proxy).items():  # every s3:// URL goes through the proxy
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    units = units_for(size)
    local = os.path.join(work, "local-data")
    shardkit.preprocess(units, make_unit, local, piles=size.piles, seed=0, quiet=True)
    url = bucket.url("data")
    shardkit.preprocess(units, make_unit, url, piles=size.piles, seed=0, quiet=True)
    m = manifest.read(url)
    data = Data(
        url=url,
        local=local,
        paths=[bucket.path(f"data/{p.name}") for p in m.piles],
        sizes=[p.bytes for p in m.piles],
        samples=m.samples,
        bytes=sum(p.bytes for p in m.piles),
    )
    return data, bucket


def measure(args: argparse.Namespace, size: Size, server: Server, work: str, log: Callable[[str], None]) -> dict[str, list[dict[str, Any]]]:
    data, bucket = setup(server, size, work)
    log(f"data: {data.samples} samples in {len(data.paths)} piles, {data.bytes / MB:.0f} MB")
    fs = bucket.client(server.proxy)  # s3fs with its defaults, as the loader's
    fs.cat_file(data.paths[0], 0, 1)  # the client's session and first connection, outside every timing
    direct = bucket.client()
    units = units_for(size)
    runs: dict[str, list[dict[str, Any]]] = {}
    plan: list[tuple[str, Callable[[int], Any]]] = [
        ("loader default", lambda r: run_loader(data)),
        *[(f"loader rc={c}", lambda r, c=c: run_loader(data, remote_concurrency=c)) for c in CONCURRENCIES],
        ("cat_file", lambda r: run_cat_file(fs, data)),
        *[(f"cat_ranges k={k}", lambda r, k=k: run_cat_ranges(fs, data, k)) for k in RANGES],
        ("webdataset", lambda r: run_webdataset(data)),
        ("no limits: cat_file", lambda r: unlimited(server, args, lambda: run_cat_file(fs, data))),
        ("no limits: cat_ranges k=8", lambda r: unlimited(server, args, lambda: run_cat_ranges(fs, data, 8))),
        ("no limits: loader default", lambda r: unlimited(server, args, lambda: run_loader(data))),
        ("cached", lambda r: run_cached(data, server, os.path.join(work, "cache"))),
        ("local", lambda r: run_local(data)),
        ("pass1 local", lambda r: run_pass1(units, os.path.join(work, f"pass1-{r}"), size.piles, None)),
        ("pass1 s3", lambda r: run_pass1(units, bucket.url(f"pass1-{r}"), size.piles, server)),
    ]
    for r in range(args.repeats):
        for name, fn in plan:
            before, cpu_before = server.counts(), server.cpu()
            cpu0 = time.process_time()
            result = fn(r)
            cpu_client = time.process_time() - cpu0
            cpu_after = server.cpu()
            seen = delta(before, server.counts())
            if name == "cached":
                fill, result = result
                runs.setdefault("cache fill (epoch 1)", []).append(fill)
            result.setdefault("requests", seen["requests"])
            result["connections"] = seen["connections"]
            result["client_cpu_s"] = cpu_client
            result["server_cpu_s"] = None if cpu_before is None else cpu_after - cpu_before
            if name == "pass1 s3":
                result["objects"] = len(direct.find(bucket.path(f"pass1-{r}")))
                direct.rm(bucket.path(f"pass1-{r}"), recursive=True)
            if name == "pass1 local":
                shutil.rmtree(os.path.join(work, f"pass1-{r}"))
            runs.setdefault(name, []).append(result)
            log(f"run {r + 1}/{args.repeats} {name}: {result['samples'] / result['seconds']:,.0f} samples/s, {result['seconds']:.2f} s")
    runs["_data"] = [{"samples": data.samples, "bytes": data.bytes, "piles": len(data.paths), "pile_bytes": max(data.sizes)}]
    return runs


def median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, rows in runs.items():
        if name.startswith("_"):
            continue
        seconds = median(rows, "seconds")
        out[name] = {
            "seconds": seconds,
            "samples_s": median([{"v": r["samples"] / r["seconds"]} for r in rows], "v"),
            "mb_s": median([{"v": r["bytes"] / r["seconds"] / MB} for r in rows], "v"),
            "first_sample_s": median(rows, "first_sample_s"),
            "first_epoch_s": median(rows, "first_epoch_s"),
            "requests": median(rows, "requests"),
            "connections": median(rows, "connections"),
            "client_cpu_s": median(rows, "client_cpu_s"),
            "server_cpu_s": median(rows, "server_cpu_s"),
            "objects": median(rows, "objects"),
            "bytes_up": median(rows, "bytes_up"),
            "runs": len(rows),
        }
    return out


def _ranges(size: int, concurrency: int) -> str:
    """How the loader reads piles of ``size`` bytes at ``concurrency`` (default prefetch): piles at
    once, sharing the requests, each in ranges never under MIN_RANGE."""
    at_once = read_ahead(size, remote=True, concurrency=concurrency, least_range=storage_remote.MIN_RANGE)
    ranges = len(storage_remote.ranges(size, -(-concurrency // at_once)))
    return f"{at_once} pile{'s' * (at_once > 1)} at once, {ranges} range{'s' * (ranges > 1)} a pile"


def _num(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "—"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def report(s: dict[str, dict[str, Any]], runs: dict[str, Any], context: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    best_k = max(RANGES, key=lambda k: s[f"cat_ranges k={k}"]["samples_s"])
    best_c = max(CONCURRENCIES, key=lambda c: s[f"loader rc={c}"]["samples_s"])
    default = storage_remote.DEFAULT_CONCURRENCY
    base = {
        "loader": s["loader default"],
        "cat_file": s["cat_file"],
        "cat_ranges": s[f"cat_ranges k={best_k}"],
        "webdataset": s["webdataset"],
        "cached": s["cached"],
        "local": s["local"],
    }
    verdicts = []
    for goal, top, bottom, least in GOALS:
        ratio = base[top]["samples_s"] / base[bottom]["samples_s"]
        # what a reader as fast as the best cat_ranges would score (a goal above it is out of reach here)
        ceiling = base["cat_ranges"]["samples_s"] / base[bottom]["samples_s"] if top == "loader" else None
        verdicts.append({"goal": goal, "at_least": least, "measured": ratio, "ceiling": ceiling, "met": ratio >= least})
    d = runs["_data"][0]
    rows = [
        ("shardkit.loader, default remote_concurrency", f"{default} (the default): {_ranges(d['pile_bytes'], default)}", "loader default"),
        *[("shardkit.loader", f"remote_concurrency={c} ({_ranges(d['pile_bytes'], c)})", f"loader rc={c}") for c in CONCURRENCIES],
        ("(a) s3fs cat_file, one pile after another", "whole objects, one stream", "cat_file"),
        *[("(b) s3fs cat_ranges", f"k={k} ranges a pile" + (" (best)" if k == best_k else ""), f"cat_ranges k={k}") for k in RANGES],
        ("(c) webdataset via fsspec", "WebDataset(urls, shardshuffle=False), no shuffle buffer", "webdataset"),
        ("testbed without S3 limits: s3fs cat_file", "proxy latency 0, no bandwidth cap", "no limits: cat_file"),
        ("testbed without S3 limits: s3fs cat_ranges", "k=8, proxy latency 0, no bandwidth cap", "no limits: cat_ranges k=8"),
        ("testbed without S3 limits: shardkit.loader", "default options, proxy latency 0, no bandwidth cap", "no limits: loader default"),
        ("shardkit.loader, epoch 1 filling cache_dir", "from S3, default options", "cache fill (epoch 1)"),
        ("shardkit.loader, epoch 2 from cache_dir", "local copies in cache_dir", "cached"),
        ("shardkit.loader on local disk", f"same piles, same options, epoch 2 (epoch 1: {_num(s['local']['first_epoch_s'])} s)", "local"),
        ("pass 1 to local disk", f"preprocess(piles={d['piles']}, workers=1)", "pass1 local"),
        ("pass 1 to S3", f"preprocess(piles={d['piles']}, workers=1)", "pass1 s3"),
    ]
    a = s["cat_file"]["samples_s"]
    lines = [
        "| contender | setting | samples/s | MB/s | × (a) | first sample s | requests | connections | client CPU s | server CPU s | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for who, setting, key in rows:
        v = s[key]
        extra = ""
        if key == "pass1 s3":
            extra = f"; {_num(v['objects'])} objects written, {v['bytes_up'] / MB:,.0f} MB up"
        lines.append(
            f"| {who} | {setting}{extra} | {_num(v['samples_s'])} | {_num(v['mb_s'])} | {v['samples_s'] / a:.2f}× | {_num(v['first_sample_s'])} | "
            f"{_num(v['requests'])} | {_num(v['connections'])} | {_num(v['client_cpu_s'])} | {_num(v['server_cpu_s'])} | {_num(v['seconds'])} |"
        )
    goal_lines = ["| goal | at least | measured | best cat_ranges would score | met? |", "|---|---|---|---|---|"]
    for v in verdicts:
        ceiling = "" if v["ceiling"] is None else f"{v['ceiling']:.2f}×"
        goal_lines.append(
            f"| {v['goal']} (samples/s) | {v['at_least']:g}× | {v['measured']:.2f}× | {ceiling} | {'yes' if v['met'] else '**NO**'} |"
        )
    pass1 = s["pass1 s3"]["seconds"] / s["pass1 local"]["seconds"]
    default_gap = s[f"loader rc={default}"]["samples_s"] / s[f"loader rc={best_c}"]["samples_s"]
    sweep = ", ".join(f"{c}: {_num(s[f'loader rc={c}']['samples_s'])}" for c in CONCURRENCIES)
    machine_ = context["machine"]
    text = "\n".join(
        [
            f"Command: `{context['command']}`  ",
            f"Size: {context['size']}: {d['samples']:,} samples of ~{context['sample_bytes'] // 1000} KB in {d['piles']} piles "
            f"(largest {d['pile_bytes'] / MB:.1f} MB), {d['bytes'] / MB:,.0f} MB; {context['repeats']} run(s) of each, round-robin, "
            f"medians shown; {context['when']}.  ",
            f"S3 limits (tests/s3_server.S3Proxy in front of moto): {context['latency'] * 1000:g} ms to the first byte of every response, "
            f"{context['bandwidth'] / MB:g} MB/s per connection; server: moto + proxy {context['server_note']}.  ",
            f"Machine: {machine_['cpu']}, {machine_['cores']} cores, Python {machine_['python']}, load average {machine_['load_before']} "
            f"before and {machine_['load_after']} after the run.  ",
            "Versions: " + ", ".join(f"{k} {v}" for k, v in machine_["versions"].items()) + ".",
            "",
            "\n".join(lines),
            "",
            "\n".join(goal_lines),
            "",
            f"- remote_concurrency sweep (samples/s): {sweep}. Best: {best_c}; the default ({default}) gives {default_gap:.2f}× the best.",
            f"- Best cat_ranges: k={best_k}. Pass 1 to S3 took {pass1:.2f}× the time of pass 1 to local disk.",
            "- samples/s and MB/s: one pass over every pile; loader rows from building the loader (manifest read included) to the "
            "last sample; epoch 2 and local disk from the start of the epoch (loader built). first sample: from `iter()` on a fresh "
            "loader. requests, connections: what the proxy saw during the run. client CPU: this process's CPU time; server CPU: "
            "the moto + proxy process's.",
        ]
    )
    return text, verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each contender (default: 1 smoke, 3 otherwise)")
    parser.add_argument("--latency", type=float, default=0.020, help="seconds to the first byte of every response (default 0.020)")
    parser.add_argument("--bandwidth", type=float, default=40e6, help="bytes/s per connection (default 40e6)")
    parser.add_argument(
        "--server", choices=("process", "thread"), default="process", help="moto + proxy in a spawned process (default) or in threads here"
    )
    parser.add_argument("--out", default=None, help="directory for remote.json and remote.md")
    parser.add_argument("--work", default=None, help="scratch directory (default: a temporary one, removed)")
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    args.repeats = args.repeats or size.repeats
    started = datetime.datetime.now(datetime.UTC)
    info = machine()
    work = args.work or tempfile.mkdtemp(prefix="shardkit-remote-")
    os.makedirs(work, exist_ok=True)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    server = Server(args.server, args.latency, args.bandwidth)
    try:
        runs = measure(args, size, server, work, log)
    finally:
        server.close()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    info["load_after"] = f"{os.getloadavg()[0]:.2f}"
    context = {
        "command": "python benchmarks/remote.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "size": args.size,
        "sample_bytes": size.sample_bytes,
        "repeats": args.repeats,
        "when": started.strftime("%Y-%m-%d %H:%M UTC"),
        "latency": args.latency,
        "bandwidth": args.bandwidth,
        "server_note": "in a separate spawned process" if args.server == "process" else "in threads of the benchmark process",
        "machine": info,
    }
    summary = summarize(runs)
    text, verdicts = report(summary, runs, context)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "remote.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(args.out, "remote.json"), "w") as f:
            json.dump({"context": context, "summary": summary, "verdicts": verdicts, "runs": runs}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
