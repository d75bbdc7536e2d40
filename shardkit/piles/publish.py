"""Turn part files into a dataset: assemble each pile, split oversized ones, write the manifest last.

:func:`publish` is the one place piles are made. A pile is the concatenation of its runs (byte
ranges of part files, in input order) plus the end-of-archive trailer. A pile that is one whole
part file with a known checksum is renamed into place; any other is copied, with its CRC-32
computed on the bytes as they pass, so no pile is ever read twice. Piles are independent, so
several are assembled at once in threads (the copies and checksums release the GIL).

    runs = [[Run("staging/part-0/000000.part", 0, 4096, crc)], ...]
    manifest = publish("out/", runs, counts, options=options, fields={"jpg"}, staging="staging/")
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import re
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

from shardkit import manifest, storage
from shardkit._util import VERSION
from shardkit.errors import CorruptShardError, DatasetExistsError, ShardkitError
from shardkit.manifest import Manifest, PileInfo
from shardkit.piles import router
from shardkit.piles.options import PileOptions
from shardkit.piles.output import Output
from shardkit.tar import index, write

log = logging.getLogger(__name__)

# bytes copied per read: small enough that the checksum runs on bytes still in the CPU cache
_COPY_CHUNK = 1 << 20
# piles uploaded at once to an object store: each holds one request's worth of memory
# (storage.remote.UPLOAD_CHUNK) and a connection
UPLOADS = 8
# splitting holds a whole pile in memory: one at a time, however many threads merge
_SPLITTING = threading.Lock()

T = TypeVar("T")
R = TypeVar("R")


def pile_name(index: int) -> str:
    return f"pile-{index:06d}.tar"


def _version() -> str:
    return f"shardkit {VERSION}"


@dataclass(frozen=True)
class Run:
    """A byte range of a part file that belongs to a pile, in output order.

    ``crc`` is the CRC-32 of those bytes when the writer already knows it (a whole part file).
    """

    path: str
    offset: int
    length: int
    crc: int | None = None


@dataclass(frozen=True)
class _Staged:
    """A finished pile file in the staging directory, waiting to be moved into place."""

    path: str
    name: str
    samples: int
    size: int
    crc: int


def _old_files(out: str) -> list[str]:
    """The files of the dataset ``out`` holds now (none when there is none): all a new one deletes."""
    if not manifest.is_dataset(out):
        return []
    try:
        return manifest.read(out).files()
    except ShardkitError as e:
        log.warning("%s: the old manifest is unreadable, its files are left in place: %s", out, e)
        return []


def _assemble(runs: Sequence[Run], dst: str) -> int:
    """Make ``dst`` a finished pile from its runs; returns its CRC-32."""
    runs = [r for r in runs if r.length]
    only = runs[0] if len(runs) == 1 else None
    if only is not None and only.crc is not None and only.offset == 0 and os.path.getsize(only.path) == only.length:
        os.replace(only.path, dst)
        with open(dst, "ab") as f:
            f.write(write.TRAILER)
        return manifest.checksum(write.TRAILER, only.crc)
    crc = 0
    buffer = memoryview(bytearray(_COPY_CHUNK))
    with contextlib.ExitStack() as stack:
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o644)
        stack.callback(os.close, out)
        sources: dict[str, BinaryIO] = {}  # one handle per part file, however many runs it has
        for run in runs:
            src = sources.get(run.path)
            if src is None:
                src = sources[run.path] = stack.enter_context(open(run.path, "rb", buffering=0))
            crc = _copy_range(src, out, run, crc, buffer)
        storage.write_fully(out, write.TRAILER)
    return manifest.checksum(write.TRAILER, crc)


def assemble_pile(runs: Sequence[Run], path: str) -> int:
    """Write ``path``, a finished tar of ``runs``' bytes and the trailer; returns its CRC-32."""
    with storage.guard(path, "write", size=sum(run.length for run in runs) + len(write.TRAILER)):
        return _assemble(runs, path)


def _copy_range(src: BinaryIO, out: int, run: Run, crc: int, buffer: memoryview) -> int:
    """Append ``run``'s bytes of ``src`` to the file ``out``; returns ``crc`` continued over them."""
    src.seek(run.offset)
    done = 0
    while done < run.length:
        n = src.readinto(buffer[: min(run.length - done, len(buffer))])  # type: ignore[attr-defined]
        if not n:
            raise CorruptShardError(f"{run.path}: part file ends early: expected {run.length} bytes at offset {run.offset}, got {done}")
        chunk = buffer[:n]
        crc = manifest.checksum(chunk, crc)
        storage.write_fully(out, chunk)
        done += n
    return crc


def capacity(limit: int | None, samples: int, nbytes: int) -> int | None:
    """Samples a pile may hold before it is split: 90% of ``limit`` at the dataset's mean sample size.

    It depends only on dataset-wide totals (``samples`` and their ``nbytes``), never on which
    samples are in which pile: deciding splits by count alone keeps the first epoch exactly
    uniform. None when there is no limit.
    """
    if limit is None or samples == 0:
        return None
    return max(1, math.floor(0.9 * limit * samples / max(nbytes, 1)))


def _split(data: bytes, name: str, *, capacity: int, seed: int, trail: tuple[int, ...], staging: str) -> list[_Staged]:
    """Write the pile ``data`` as the random sub-piles :func:`shardkit.router.sub_piles` draws."""
    layout = index.index(data, name, checked=True)  # assembled here, its checksum just computed
    bounds = layout.sample_bounds(layout.samples()).tolist()
    stem = name[: -len(".tar")]
    pieces = []
    # a pile's keys were checked unique before publishing, so no split can bring two together
    for leaf, chosen in router.sub_piles(len(bounds) - 1, capacity=capacity, seed=seed, trail=trail):
        samples = chosen.tolist()
        sub_name = stem + "".join(f"-{part:03d}" for part in leaf[len(trail) :]) + ".tar"
        sub = b"".join([*(data[bounds[i] : bounds[i + 1]] for i in samples), write.TRAILER])
        path = os.path.join(staging, sub_name)
        with open(path, "wb") as f:
            f.write(sub)
        pieces.append(_Staged(path, sub_name, len(samples), len(sub), manifest.checksum(sub)))
    return pieces


def _finish_pile(p: int, runs: Sequence[Run], count: int, seed: int, most: int | None, staging: str) -> tuple[list[_Staged], bool]:
    """Assemble pile ``p`` in the staging directory; split it if it holds over ``most`` samples."""
    name = pile_name(p)
    path = os.path.join(staging, name)
    with storage.guard(path, "write", size=sum(run.length for run in runs) + len(write.TRAILER)):
        crc = _assemble(runs, path)
    for run in runs:  # each part file holds one pile's bytes: gone once the pile is made, so disk peaks near 1x the data
        with contextlib.suppress(FileNotFoundError):
            os.unlink(run.path)
    size = os.path.getsize(path)
    if most is None or count <= most:  # an empty pile is never split
        return [_Staged(path, name, count, size, crc)], False
    with _SPLITTING, storage.guard(staging, "write the split piles", size=size):
        data = storage.read_bytes(path)
        os.unlink(path)
        pieces = _split(data, name, capacity=most, seed=seed, trail=(p,), staging=staging)
    log.info(
        "%s holds %d samples, over the %d that fit max_pile_bytes on average: split into %d random sub-piles",
        name,
        count,
        most,
        len(pieces),
    )
    return pieces, True


def _over_limit(pieces: Sequence[_Staged], limit: int | None) -> list[dict[str, Any]]:
    """The piles still larger than ``limit`` (samples of very uneven size), each logged."""
    over = []
    for piece in pieces:
        if limit is not None and piece.size > limit:
            log.warning(
                "%s is %d bytes, over max_pile_bytes=%d: splits go by sample count to keep the shuffle uniform, "
                "and its samples are larger than average",
                piece.name,
                piece.size,
                limit,
            )
            over.append({"name": piece.name, "bytes": piece.size})
    return over


def _map(fn: Callable[[T], R], items: Sequence[T], threads: int, progress: Callable[[int], Any] | None) -> list[R]:
    """``[fn(x) for x in items]`` on up to ``threads`` threads; the first error cancels the rest."""
    if threads <= 1 or len(items) <= 1:
        results = []
        for item in items:
            results.append(fn(item))
            if progress is not None:
                progress(1)
        return results
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="shardkit-merge") as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            for future in as_completed(futures):
                future.result()
                if progress is not None:
                    progress(1)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        return [f.result() for f in futures]


def publish(
    output: Output,
    runs: Sequence[Sequence[Run]],
    counts: Sequence[int],
    *,
    options: PileOptions,
    fields: set[str],
    staging: str,
    skipped_units: int = 0,
    extra: dict[str, Any] | None = None,
    threads: int = 1,
    progress: Callable[[int], Any] | None = None,
) -> Manifest:
    """Assemble each pile from its runs, split oversized piles, move them in, write the manifest.

    A pile is split when it holds more samples than fit ``options.max_pile_bytes`` at the
    dataset's mean sample size (see :func:`capacity`), into random sub-piles. The decision looks
    at counts only, which keeps the first epoch exactly uniform; a pile that is still larger
    than the limit (very uneven sample sizes) is logged and listed in
    ``extra["over_max_pile_bytes"]`` as ``{"name", "bytes"}`` entries.

    Args:
        runs: pile by pile, its byte ranges in output order.
        counts: ``counts[p]`` is pile p's sample count.
        threads: piles assembled at once; the result is the same for any number.
        progress: called with 1 as each pile is finished.
    """
    total = sum(run.length for pile_runs in runs for run in pile_runs)
    most = capacity(options.max_bytes, sum(counts), total)
    finished = _map(lambda p: _finish_pile(p, runs[p], counts[p], options.seed, most, staging), range(len(runs)), threads, progress)
    split = sum(was_split for _, was_split in finished)
    pieces = [piece for staged, _ in finished for piece in staged]
    if not output.remote:
        storage.sync_files([piece.path for piece in pieces])  # durable before the manifest lists them
    names = free_names(output.path, [piece.name for piece in pieces])
    pieces = [dataclasses.replace(piece, name=name) for piece, name in zip(pieces, names, strict=True)]
    over = _over_limit(pieces, options.max_bytes)
    extra = {**(extra or {}), "over_max_pile_bytes": over} if over else extra
    infos = [
        PileInfo(name=piece.name, samples=piece.samples, bytes=piece.size, checksum=manifest.format_checksum(piece.crc)) for piece in pieces
    ]
    result = Manifest(
        piles=tuple(infos),
        seed=options.seed,
        fields=tuple(sorted(fields)),
        created_by=_version(),
        skipped_units=skipped_units,
        split_piles=split,
        extra=extra or {},
    )
    install(output, [piece.path for piece in pieces], result)
    with contextlib.suppress(OSError):
        shutil.rmtree(staging)
    return result


def free_names(out: str, names: Sequence[str]) -> list[str]:
    """Names for new files in ``out`` that no file there has: each of ``names`` as it is, else
    ``STEM.vN.tar`` with the smallest free N. An overwrite's files then never replace the old
    dataset's before its manifest is replaced."""
    taken = set(storage.listdir(out, missing_ok=True))
    chosen = []
    for name in names:
        if name in taken:
            stem, suffix = name.rsplit(".", 1)
            version = 1
            while f"{stem}.v{version}.{suffix}" in taken:
                version += 1
            name = f"{stem}.v{version}.{suffix}"
        taken.add(name)
        chosen.append(name)
    return chosen


def _move_new(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``, which must not exist: a link refuses to replace a file."""
    try:
        os.link(src, dst)
    except FileExistsError:
        raise DatasetExistsError(f"{dst}: appeared while this job was publishing; nothing was replaced") from None
    except OSError:  # no hard links on this file system: names were chosen free under the lock
        os.replace(src, dst)
        return
    os.unlink(src)


def remove_strays(out: str, stray: re.Pattern[str]) -> None:
    """Remove the files ``stray`` matches that the dataset in ``out`` (if any) does not list:
    files of this kind no manifest lists, which nobody can be reading."""
    listed = set(_old_files(out))
    for name in sorted(n for n in storage.listdir(out, missing_ok=True) if stray.fullmatch(n) and n not in listed):
        storage.remove(storage.join(out, name))


def install(output: Output, files: Sequence[str], result: Manifest, *, names: Sequence[str] | None = None, keep: bool = False) -> None:
    """Swap a finished dataset in: ``files[i]`` (staged elsewhere) becomes ``result.piles[i]``,
    then the manifest goes in, last. The one place a dataset is published, for pass 1, the eager
    shuffle and repile.

    An overwrite is atomic: the new files' names (see :func:`free_names`) are none the directory
    has, so the old dataset stays whole and readable until the manifest, renamed over the old one,
    says otherwise; then the old dataset's own files are removed. Data and directory are made durable before the manifest is
    renamed, and the names about to move in are noted first (:meth:`Output.journal`) so that the
    next job removes them if this one dies before its manifest is in. A kill at any moment leaves
    the old dataset or the new one whole. Into an object store the files are uploaded, several at
    once, and the manifest is one request, made after every upload succeeded.

    ``names`` (default: the piles' names) are the names ``files`` take; ``keep`` leaves the old
    dataset's files in place (an append's new manifest still lists them).

    Raises:
        DatasetExistsError: the output's manifest changed while the job ran.
    """
    out = output.path
    old = set() if keep else set(_old_files(out))
    names = [pile.name for pile in result.piles] if names is None else list(names)
    output.journal(names, sorted(old))
    moved: list[str] = []
    try:
        if output.remote:
            _upload_all(files, names, out, moved)
        else:
            for path, name in zip(files, names, strict=True):
                _move_new(path, os.path.join(out, name))
                moved.append(name)
            storage.fsync_dir(out)
        output.check_unchanged()
        manifest.write(out, result)
    except BaseException:
        for name in moved:  # the old dataset (or none) stays as it was
            with contextlib.suppress(ShardkitError, OSError):
                storage.remove(storage.join(out, name))
        raise
    for name in sorted(old - set(moved)):
        storage.remove(storage.join(out, name))
    output.journal(None)


def _upload_all(files: Sequence[str], names: Sequence[str], out: str, moved: list[str]) -> None:
    """Upload ``files[i]`` to ``out/names[i]``, :data:`UPLOADS` at a time, each local copy removed
    once its upload is done; ``moved`` gets each name as its object is in."""
    lock = threading.Lock()

    def send(i: int) -> None:
        storage.upload(files[i], storage.join(out, names[i]))
        with lock:
            moved.append(names[i])
        os.unlink(files[i])

    _map(send, range(len(files)), UPLOADS, None)
