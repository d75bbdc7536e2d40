"""Contenders that shuffle a class-sorted dataset into new shards (case d), each in its own process.

GNU ``shuf`` is run by the harness as a command; here are shardkit's eager shuffle and the
random-access approach (an offset index, then every sample read in a random permutation with
``os.pread``). After the clock stops, each reads its output in order and counts classes per 256
samples, so a contender that does not really shuffle shows it.

    shardkit_shuffle({"files": shards, "out": "w/", "memory": 2**28, "maxsize": 2**26})
"""

from __future__ import annotations

import glob
import os
import shutil
from typing import Any

import numpy as np
import numpy.random  # numpy loads it on first use, which would be inside the clock
from _timing import Clock, classes_per_window

BLOCK = 512
TRAILER = bytes(2 * BLOCK)


def _output_classes(out: str) -> float | None:
    from shardkit.tar.shard import iter_shard

    labels = [int(s["cls"]) for shard in sorted(glob.glob(os.path.join(out, "shard-*.tar"))) for s in iter_shard(shard)]
    return classes_per_window(labels)


def _finish(p: dict[str, Any], clock: Clock, out: str, samples: int, **extra: Any) -> dict[str, Any]:
    seconds = clock.elapsed()
    in_bytes = sum(os.path.getsize(f) for f in p["files"])
    figures = {"samples": samples, "seconds": seconds, "first_sample_s": None, "bytes": in_bytes, **extra}
    figures["classes_per_batch"] = _output_classes(out)
    shutil.rmtree(out, ignore_errors=True)
    return figures


def shardkit_shuffle(p: dict[str, Any]) -> dict[str, Any]:
    """``shardkit.shuffle(files, out, memory=..., maxsize=...)``: the eager two-pass shuffle."""
    # modules shuffle() imports on first use: load them untimed, as with every contender's
    # imports (after a dropped page cache they would be read from disk inside the clock)
    import multiprocessing.synchronize  # noqa: F401
    import subprocess  # noqa: F401

    import shardkit

    out = p["out"]
    shutil.rmtree(out, ignore_errors=True)
    clock = Clock()
    manifest = shardkit.shuffle(p["files"], out, memory=p["memory"], maxsize=p["maxsize"], seed=0, overwrite=True, quiet=True)
    return _finish(p, clock, out, manifest.samples)


def _index(paths: list[str], fds: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(file, offset, length) of every sample, walking the ustar headers with ``pread``."""
    files: list[int] = []
    offsets: list[int] = []
    lengths: list[int] = []
    for i, fd in enumerate(fds):
        end = os.fstat(fd).st_size
        pos = 0
        key = None
        while pos + BLOCK <= end:
            header = os.pread(fd, BLOCK, pos)
            if header[156:157] not in (b"0", b"\x00") or header == bytes(BLOCK):
                break
            size = int(header[124:136].rstrip(b"\x00 ") or b"0", 8)
            name = header[:100].split(b"\x00", 1)[0]
            this_key = name.split(b".", 1)[0]
            nxt = pos + BLOCK + size + (-size % BLOCK)
            if this_key != key:
                files.append(i)
                offsets.append(pos)
                lengths.append(nxt - pos)
                key = this_key
            else:
                lengths[-1] += nxt - pos
            pos = nxt
        if not offsets:
            raise ValueError(f"{paths[i]}: no samples found")
    return np.asarray(files), np.asarray(offsets), np.asarray(lengths)


def random_access(p: dict[str, Any]) -> dict[str, Any]:
    """Index every sample's (file, offset, length), then read them in a random permutation."""
    out = p["out"]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    clock = Clock()
    fds = [os.open(path, os.O_RDONLY) for path in p["files"]]
    try:
        files, offsets, lengths = _index(p["files"], fds)
        index_s = clock.elapsed()
        order = np.random.default_rng(p.get("seed", 0)).permutation(len(files))
        shard, written, f = 0, 0, open(os.path.join(out, f"shard-{0:06d}.tar"), "wb")  # noqa: SIM115
        for i in order.tolist():
            data = os.pread(fds[files[i]], int(lengths[i]), int(offsets[i]))
            if written and written + len(data) + len(TRAILER) > p["maxsize"]:
                f.write(TRAILER)
                f.close()
                shard, written = shard + 1, 0
                f = open(os.path.join(out, f"shard-{shard:06d}.tar"), "wb")  # noqa: SIM115
            f.write(data)
            written += len(data)
        f.write(TRAILER)
        f.close()
    finally:
        for fd in fds:
            os.close(fd)
    return _finish(p, clock, out, len(order), index_s=index_s)
