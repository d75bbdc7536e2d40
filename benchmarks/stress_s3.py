"""Rows of the reliability campaign on S3 (moto on loopback, behind the fault proxy): outages mid-epoch, changed cache copies.

- outage: the store vanishes (connections cut, new ones refused) for 1 to 20 s in the middle of
  an epoch. Under the retry deadline the epoch must go on and read exactly the samples of an
  undisturbed epoch; one trial in four (the second of each four) sets a deadline shorter than the outage and must end with
  one line naming the URL and the deadline (a ``StorageError``), never a raw traceback.
- cache: a pile's cached copy is changed on disk (a byte flipped in a payload or anywhere, a
  block zeroed, the copy cut short or made longer, another pile's copy put in its place), then
  a fresh loader reads with ``verify=False``: the epoch must be exact.

Run through ``benchmarks/stress.py --rows outage,cache``.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from collections.abc import Iterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import numpy as np  # noqa: E402

import shardkit  # noqa: E402
from shardkit.storage import retry  # noqa: E402

# the outages a full run cycles through, in seconds
OUTAGES = (1.0, 3.0, 5.0, 8.0, 12.0, 20.0)
CHANGES = ("flip a payload byte", "flip any byte", "zero a block", "cut short", "make longer", "another pile's copy")


@contextlib.contextmanager
def _aimed(endpoint: str) -> Iterator[None]:
    """``s3://`` URLs reach ``endpoint`` for the block (see tests/s3_server.aws_environment)."""
    import s3fs
    from s3_server import aws_environment

    saved = {name: os.environ.get(name) for name in aws_environment(endpoint)}
    try:
        for name, value in aws_environment(endpoint).items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
        s3fs.S3FileSystem.clear_instance_cache()
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
        s3fs.S3FileSystem.clear_instance_cache()


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    saved = os.environ.get(retry.ENVIRONMENT)
    if seconds is not None:
        os.environ[retry.ENVIRONMENT] = str(seconds)
    try:
        yield
    finally:
        os.environ.pop(retry.ENVIRONMENT, None) if saved is None else os.environ.__setitem__(retry.ENVIRONMENT, saved)


def _dataset(url: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    samples = [{"__key__": f"s{i:05d}", "bin": rng.bytes(6000)} for i in range(96)]
    shardkit.preprocess([samples[i : i + 48] for i in range(0, 96, 48)], lambda u: u, url, piles=8, seed=seed, quiet=True)


def _epoch(url: str, **kwargs: Any) -> list[tuple[str, bytes]]:
    return [(s["__key__"], bytes(s["bin"])) for s in shardkit.loader(url, decode=False, seed=1, prefetch=1, **kwargs)]


def row_outage(row: Any, trials: int, rng: random.Random) -> Any:
    """Fill ``row`` (stress.Row) with ``trials`` outages mid-epoch."""
    from s3_server import S3Bucket, S3Proxy, start_moto

    with start_moto() as moto, S3Proxy(moto.endpoint) as proxy, _aimed(proxy.endpoint):
        url = S3Bucket.create(moto.endpoint).url("ds")
        _dataset(url, seed=7)
        expected = _epoch(url)
        for trial in range(trials):
            seconds = OUTAGES[trial % len(OUTAGES)] * rng.uniform(0.8, 1.0)
            past = trial % 4 == 1  # a deadline shorter than the outage
            at = rng.randrange(6, 24)  # within the first piles: the rest are read while the store is down
            row.tried += 1
            outage = None
            got: list[tuple[str, bytes]] = []
            try:
                with _deadline(min(1.0, seconds / 2) if past else None):
                    for k, sample in enumerate(shardkit.loader(url, decode=False, seed=1, prefetch=1)):
                        got.append((sample["__key__"], bytes(sample["bin"])))
                        if k == at:
                            outage = proxy.outage(seconds)
            except shardkit.StorageError as e:
                if not past:
                    row.fail(f"{seconds:.1f} s outage: {e}")
                elif "\n" in str(e) or "retried for" not in str(e):
                    row.fail(f"{seconds:.1f} s outage past the deadline: not the documented one line: {e}")
            except Exception as e:  # a raw traceback is a failure of its own
                row.fail(f"{seconds:.1f} s outage: {type(e).__name__}: {e}")
            else:
                if past:
                    row.fail(f"{seconds:.1f} s outage past the deadline read through")
                elif got != expected:
                    row.fail(
                        f"{seconds:.1f} s outage: {sum(a != b for a, b in zip(got, expected, strict=False))} samples differ, {len(got)} of {len(expected)} read"
                    )
            finally:
                if outage is not None:
                    outage.join()
                proxy.come_up()
    return row


def _change(blob: bytes, how: str, payload_at: int, other: bytes, rng: random.Random) -> bytes:
    data = bytearray(blob)
    if how == "flip a payload byte":
        data[payload_at] ^= 0xFF
    elif how == "flip any byte":
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how == "zero a block":
        at = rng.randrange(0, len(data) - 512) // 512 * 512
        data[at : at + 512] = bytes(512) if data[at : at + 512] != bytes(512) else b"\x01" * 512
    elif how == "cut short":
        del data[rng.randrange(1, len(data)) :]
    elif how == "make longer":
        data += bytes(rng.randrange(1, 4096))
    else:
        return other
    return bytes(data)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def row_cache(row: Any, trials: int, rng: random.Random, work: str) -> Any:
    """Fill ``row`` (stress.Row) with ``trials`` changed cache copies read with ``verify=False``."""
    from s3_server import S3Bucket, start_moto

    with start_moto() as moto, _aimed(moto.endpoint):
        url = S3Bucket.create(moto.endpoint).url("ds")
        _dataset(url, seed=8)
        expected = _epoch(url)
        payload = expected[len(expected) // 2][1]
        for trial in range(trials):
            how = CHANGES[trial % len(CHANGES)]
            cache = os.path.join(work, f"cache-{trial}")
            row.tried += 1
            try:
                _epoch(url, cache_dir=cache, verify=False)
                folder = os.path.join(cache, "shardkit-piles")
                entries = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".tar"))
                blobs = {p: _read(p) for p in entries}
                victim = next((p for p in entries if payload in blobs[p]), entries[0])
                other = next(blobs[p] for p in entries if p != victim)
                changed = _change(blobs[victim], how, blobs[victim].find(payload) + 100, other, rng)
                with open(victim, "wb") as f:
                    f.write(changed)
                got = _epoch(url, cache_dir=cache, verify=False)
                if got != expected:
                    row.fail(f"{how}: {sum(a != b for a, b in zip(got, expected, strict=False))} samples differ")
            except Exception as e:
                row.fail(f"{how}: {type(e).__name__}: {e}")
    return row
