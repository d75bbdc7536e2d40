"""shardkit against litdata reading the same samples from the same local S3 server (moto), side by side.

The same ~5 KB samples are written once as a shardkit dataset (``preprocess``) and once as a
litdata dataset (``litdata.optimize`` into a local folder, its files then uploaded), both to one
moto server on 127.0.0.1 with no proxy and no limits: here the server and the client share the
machine, so what each client asks of the server (how many requests, how large) decides. Each
read is one cold epoch in a fresh process, systems in alternating order, medians printed with
ratios:

- shardkit: ``shardkit.loader(url, decode=False)`` with a fresh ``cache_dir`` (what litdata is
  measured with), and without a cache; then the knobs one at a time, with the cache: one pile
  read ahead (``prefetch=1``: each pile still one GET), and the earlier defaults (piles split
  into ranges of 1 MiB, ``remote_concurrency=8``, one pile read ahead);
- litdata: ``StreamingDataset(Dir(path=fresh cache dir, url=url))`` iterated once (its cache
  downloads whole chunks).

    python benchmarks/remote_litdata.py                  # 40,000 samples of ~5 KB, 3 runs each
    python benchmarks/remote_litdata.py --samples 4000 --repeats 1   # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import numpy as np  # noqa: E402

SYSTEMS = ("shardkit", "shardkit-nocache", "shardkit-prefetch1", "shardkit-1MiB-ranges", "litdata")
# the loader options of each shardkit contender (cache_dir is added for all but -nocache)
OPTIONS = {
    "shardkit": {},
    "shardkit-nocache": {},
    "shardkit-prefetch1": {"prefetch": 1},  # one pile read ahead (each still one GET)
    "shardkit-1MiB-ranges": {"prefetch": 1},  # with MIN_RANGE at 1 MiB: 8 ranges a pile, the earlier defaults
}
# the smallest ranged request of each contender where it is not the library's own
MIN_RANGE = {"shardkit-1MiB-ranges": 1 << 20}
PILES = 16
CHUNK_BYTES = "8MB"  # litdata chunks about as large as the shardkit piles


def _lit_item(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {"key": f"s{i:07d}", "bin": rng.bytes(int(5000 * rng.uniform(0.8, 1.2)))}


def _shard_unit(unit: tuple[int, int]) -> list[dict[str, Any]]:
    lo, hi = unit
    out = []
    for i in range(lo, hi):
        item = _lit_item(i)
        out.append({"__key__": item["key"], "bin": item["bin"]})
    return out


def write(endpoint: str, bucket: str, samples: int, work: str) -> None:
    """Both datasets on the server: ``s3://bucket/shardkit`` and ``s3://bucket/litdata``."""
    import litdata
    import s3fs

    import shardkit

    step = max(1, samples // 64)
    units = [(lo, min(samples, lo + step)) for lo in range(0, samples, step)]
    shardkit.preprocess(units, _shard_unit, f"s3://{bucket}/shardkit", piles=PILES, quiet=True)
    local = os.path.join(work, "litdata")
    litdata.optimize(fn=_lit_item, inputs=list(range(samples)), output_dir=local, chunk_bytes=CHUNK_BYTES, num_workers=1, verbose=False)
    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    for name in sorted(os.listdir(local)):
        fs.put_file(os.path.join(local, name), f"{bucket}/litdata/{name}")


def child(system: str, bucket: str, samples: int) -> dict[str, Any]:
    """One cold epoch of ``system``; runs in a fresh process."""
    cache = tempfile.mkdtemp(prefix=f"bench-{system}-")
    if system.startswith("shardkit"):
        import s3fs  # noqa: F401  # imported before the clock starts, as litdata's modules are

        import shardkit
        from shardkit.storage import remote

        make = shardkit.loader  # the loading modules, imported on first use
        options = dict(OPTIONS[system]) | ({} if system == "shardkit-nocache" else {"cache_dir": cache})
        remote.MIN_RANGE = MIN_RANGE.get(system, remote.MIN_RANGE)

        def epoch() -> Any:
            return make(f"s3://{bucket}/shardkit", decode=False, **options)

    else:
        import litdata.streaming.downloader as downloader
        from litdata import StreamingDataset
        from litdata.streaming.resolver import Dir

        # its native downloader (obstore) refuses http:// endpoints unless told; the loopback server is http
        downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}

        def epoch() -> Any:
            return StreamingDataset(Dir(path=cache, url=f"s3://{bucket}/litdata"))

    try:
        started = time.perf_counter()  # imports done: from building the reader to its last sample
        n = sum(1 for _ in epoch())
        seconds = time.perf_counter() - started
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if n != samples:
        raise SystemExit(f"{system}: read {n} samples, expected {samples}")
    return {"system": system, "samples": n, "seconds": seconds, "rate": n / seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=40_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--bucket", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.bucket, args.samples)))
        return 0
    from remote import Server
    from s3_server import S3Bucket, aws_environment

    server = Server("process", 0.0, 0.0)  # moto in a spawned process; the proxy is not used
    env = dict(os.environ)
    for name, value in aws_environment(server.moto).items():
        env.pop(name, None) if value is None else env.__setitem__(name, value)
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    work = tempfile.mkdtemp(prefix="bench-litdata-")
    try:
        bucket = S3Bucket.create(server.moto).bucket
        started = time.perf_counter()
        write(server.moto, bucket, args.samples, work)
        print(f"wrote both datasets ({args.samples:,} samples of ~5 KB) in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        systems = args.systems.split(",")
        runs: dict[str, list[float]] = {s: [] for s in systems}
        for r in range(args.repeats):
            order = systems if r % 2 == 0 else systems[::-1]
            for system in order:
                cmd = [sys.executable, __file__, "--child", system, "--bucket", bucket, "--samples", str(args.samples)]
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
                if done.returncode != 0:
                    raise SystemExit(f"{system}: {done.stderr[-2000:]}")
                rate = json.loads(done.stdout.strip().splitlines()[-1])["rate"]
                runs[system].append(rate)
                print(f"run {r + 1}: {system}: {rate:,.0f} samples/s", file=sys.stderr, flush=True)
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    medians = {s: statistics.median(v) for s, v in runs.items()}
    base = medians.get("litdata")
    print(f"| system | samples/s (median of {args.repeats}) | runs | × litdata |")
    print("|---|---|---|---|")
    for s in systems:
        ratio = f"{medians[s] / base:.2f}×" if base else "—"
        print(f"| {s} | {medians[s]:,.0f} | {', '.join(f'{v:,.0f}' for v in runs[s])} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
