"""Turn part files into piles: assemble each pile, split oversized ones, hand them to the transaction to install.

:func:`publish` is the one place piles are made. A pile is the concatenation of its runs (byte
ranges of part files, in input order) plus the end-of-archive trailer. A pile that is one whole
part file with a known checksum takes it as it is (linked, or installed straight from the part
when ``PileWriter`` sealed it with the trailer); any other is copied, with its CRC-32
computed on the bytes as they pass, so no pile is ever read twice. Piles are independent, so
several are assembled at once in threads (the copies and checksums release the GIL).

    runs = [[Run("staging/part-0/000000.part", 0, 4096, crc)], ...]
    with Dataset("out/").transaction() as txn:
        manifest = publish(txn, runs, counts, options=options, fields={"jpg"}, staging="staging/")
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from shardkit import manifest, storage
from shardkit._util import VERSION
from shardkit.dataset import layout
from shardkit.dataset.install import free_names
from shardkit.dataset.layout import pile_name
from shardkit.dataset.transaction import Transaction
from shardkit.errors import CorruptShardError
from shardkit.manifest import Manifest
from shardkit.piles import router
from shardkit.piles.merge_records import Staged, read_record, write_record
from shardkit.piles.options import PileOptions
from shardkit.piles.pack import Pack, Packed, check_stop, run_stoppable
from shardkit.tar import compression, index, write

log = logging.getLogger(__name__)

# bytes copied per read: small enough that the checksum runs on bytes still in the CPU cache
_COPY_CHUNK = 1 << 20
# splitting holds a whole pile in memory: one at a time, however many threads merge
_SPLITTING = threading.Lock()

T = TypeVar("T")
R = TypeVar("R")


def _version() -> str:
    return f"shardkit {VERSION}"


@dataclass(frozen=True)
class Run:
    """A byte range of a part file that belongs to a pile, in output order.

    ``crc`` is the CRC-32 of those bytes when the writer already knows it (a whole part file).
    ``sealed``: the file is the run's bytes and then the end-of-archive trailer, nothing else (a
    :class:`~shardkit.piles.gather.SampleSink` sealed it): a finished pile as it is.
    """

    path: str
    offset: int
    length: int
    crc: int | None = None
    sealed: bool = False

    @property
    def whole(self) -> bool:
        """The run is its whole file, with a known checksum: the pile needs no copy."""
        return (
            self.crc is not None
            and self.offset == 0
            and storage.size(self.path) == self.length + (len(write.TRAILER) if self.sealed else 0)
        )


def _assemble(runs: Sequence[Run], dst: str, pack: Pack | None = None) -> tuple[int, Packed | None]:
    """Make ``dst`` a finished pile from its runs; returns its tar's CRC-32 and, when ``pack``
    compresses it on the way (one pass over the bytes), what was written. The part files stay."""
    runs = [r for r in runs if r.length]
    only = runs[0] if len(runs) == 1 else None
    if pack is None and only is not None and only.whole:
        # a second name for the part file: no copy, and a merge run again still finds its part
        storage.link_in(only.path, dst)
        if not only.sealed:
            out = storage.open_fd(dst, append=True)
            try:  # the part grows too: a merge run again copies its first `length` bytes
                storage.write_fully(out, write.TRAILER)
            finally:
                os.close(out)
        return manifest.checksum(write.TRAILER, only.crc), None  # type: ignore[arg-type]
    crc = 0
    buffer = memoryview(bytearray(_COPY_CHUNK))
    with contextlib.ExitStack() as stack:
        out = storage.open_fd(dst, append=False)
        stack.callback(os.close, out)
        packed = None if pack is None else Packed(out, pack)
        put: Callable[[Any], None] = functools.partial(storage.write_fully, out) if packed is None else packed.write
        sources: dict[str, IO[bytes]] = {}  # one handle per part file, however many runs it has
        for run in runs:
            src = sources.get(run.path)
            if src is None:
                src = sources[run.path] = stack.enter_context(storage.open_read(run.path))
            crc = _copy_range(src, put, run, crc, buffer)
        put(write.TRAILER)
        if packed is not None:
            packed.finish()
    return manifest.checksum(write.TRAILER, crc), packed


def assemble_pile(runs: Sequence[Run], path: str, pack: Pack | None = None) -> tuple[int, Packed | None]:
    """Write ``path``, a finished tar of ``runs``' bytes and the trailer (compressed by ``pack``
    when given); returns the tar's CRC-32 and, compressed, what was written."""
    with storage.guard(path, "write", size=sum(run.length for run in runs) + len(write.TRAILER)):
        return _assemble(runs, path, pack)


def _copy_range(src: IO[bytes], put: Callable[[Any], None], run: Run, crc: int, buffer: memoryview) -> int:
    """Pass ``run``'s bytes of ``src`` to ``put``; returns ``crc`` continued over them."""
    src.seek(run.offset)
    done = 0
    while done < run.length:
        check_stop()
        n = src.readinto(buffer[: min(run.length - done, len(buffer))])  # type: ignore[attr-defined]
        if not n:
            raise CorruptShardError(f"{run.path}: part file ends early: expected {run.length} bytes at offset {run.offset}, got {done}")
        chunk = buffer[:n]
        crc = manifest.checksum(chunk, crc)
        check_stop()
        put(chunk)
        done += n
    return crc


# where a dataset keeps the max_pile_bytes it was written with, for the appends that follow
LIMIT = "max_pile_bytes"


def limit_record(extra: dict[str, Any] | None, options: PileOptions) -> dict[str, Any]:
    """``extra`` with the ``max_pile_bytes`` of ``options`` recorded, when they have one."""
    extra = dict(extra or {})
    if options.max_bytes is not None:
        extra[LIMIT] = options.max_bytes
    return extra


def capacity(limit: int | None, samples: int, nbytes: int) -> int | None:
    """Samples a pile may hold before it is split: 90% of ``limit`` at the dataset's mean sample size.

    It depends only on dataset-wide totals (``samples`` and their ``nbytes``), never on which
    samples are in which pile: deciding splits by count alone keeps the first epoch exactly
    uniform. None when there is no limit.
    """
    if limit is None or samples == 0:
        return None
    return max(1, math.floor(0.9 * limit * samples / max(nbytes, 1)))


def _split(
    data: bytes, name: str, *, capacity: int, seed: int, trail: tuple[int, ...], staging: str, pack: Pack | None = None
) -> list[Staged]:
    """Write the pile ``data`` as the random sub-piles :func:`shardkit.router.sub_piles` draws,
    each compressed by ``pack`` when given."""
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
        staged = Staged(path, sub_name, len(samples), len(sub), manifest.checksum(sub))
        if pack is not None:
            tar = (len(sub), staged.crc)
            sub = compression.compress(sub, pack.codec, level=pack.level, between=check_stop)
            staged = Staged(
                path, sub_name + compression.suffix(pack.codec), len(samples), len(sub), manifest.checksum(sub), pack.codec, tar
            )
        storage.write_bytes(path, sub, sync=False)
        pieces.append(staged)
    return pieces


@dataclass(frozen=True)
class PileWork:
    """What it takes to finish pile ``pile``: its runs and sample count, the split settings, the
    compression (``pack``), and whether a record of the finished pile is kept for a job that
    resumes (``record``)."""

    pile: int
    runs: Sequence[Run]
    count: int
    seed: int
    most: int | None
    staging: str
    pack: Pack | None = None
    record: bool = True


def finish_pile(work: PileWork) -> tuple[list[Staged], bool]:
    """Assemble a pile in the staging directory, compressed by ``work.pack`` when given; split it
    (then compress each sub-pile) if it holds over ``work.most`` samples.

    Safe to run again after it was interrupted (a Ray task retried): the part files are removed
    only once a record of the finished pile is written, and a record found is the answer. With
    ``work.record`` off (a job that nothing resumes) no record is written.
    """
    name = pile_name(work.pile)
    path = os.path.join(work.staging, name)
    record = path + layout.DONE_SUFFIX
    if work.record and storage.exists(record):
        return read_record(record)
    splits = work.most is not None and work.count > work.most  # an empty pile is never split
    tar_size = sum(run.length for run in work.runs) + len(write.TRAILER)
    only = work.runs[0] if len(work.runs) == 1 else None
    if only is not None and only.sealed and only.crc is not None and not (splits or work.pack or work.record) and only.whole:
        # the sealed part is the pile: installed under its name as it is, with no file made,
        # written or removed here (a job that nothing resumes keeps no part to merge again)
        return [Staged(only.path, name, work.count, tar_size, manifest.checksum(write.TRAILER, only.crc))], False
    with storage.guard(path, "write", size=tar_size):
        crc, packed = _assemble(work.runs, path, None if splits else work.pack)
    size = storage.size(path)
    if not splits:
        if packed is None:
            result = [Staged(path, name, work.count, size, crc)], False
        else:
            codec = packed.packer.codec
            result = [Staged(path, name + compression.suffix(codec), work.count, packed.size, packed.crc, codec, (tar_size, crc))], False
    else:
        assert work.most is not None
        with _SPLITTING, storage.guard(work.staging, "write the split piles", size=size):
            data = storage.read_bytes(path)
            storage.remove(path)
            pieces = _split(data, name, capacity=work.most, seed=work.seed, trail=(work.pile,), staging=work.staging, pack=work.pack)
        log.info(
            "%s holds %d samples, over the %d that fit max_pile_bytes on average: split into %d random sub-piles",
            name,
            work.count,
            work.most,
            len(pieces),
        )
        result = pieces, True
    check_stop()  # a merge stopped meanwhile records nothing and keeps its part files
    if work.record:
        write_record(record, *result)
    for run in work.runs:  # each part file holds one pile's bytes: gone once the pile is made, so disk peaks near 1x the data
        storage.remove(run.path)
    return result


def _over_limit(pieces: Sequence[Staged], limit: int | None) -> list[dict[str, Any]]:
    """The piles still larger than ``limit`` (samples of very uneven size), each logged."""
    over = []
    for piece in pieces:
        if limit is not None and piece.tar_size > limit:
            log.warning(
                "%s is %d bytes, over max_pile_bytes=%d: splits go by sample count to keep the shuffle uniform, "
                "and its samples are larger than average",
                piece.name,
                piece.tar_size,
                limit,
            )
            over.append({"name": piece.name, "bytes": piece.tar_size})
    return over


def map_threads(fn: Callable[[T], R], items: Sequence[T], threads: int, progress: Callable[[int], Any] | None) -> list[R]:
    """``[fn(x) for x in items]`` on up to ``threads`` threads; the first error (or a Ctrl-C
    here) cancels the rest and stops the running ones at their next chunk (see
    :func:`~shardkit.piles.pack.check_stop`). The caller only waits, even with one thread, so a
    Ctrl-C reaches it at once and the merge stops within a chunk's work."""
    stop = threading.Event()
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(len(items)):
        todo.put(i)
    done: queue.SimpleQueue[tuple[int, bool, Any]] = queue.SimpleQueue()

    def work() -> None:
        # invariant: each item is taken once; after a stop no item is started and nothing more is written
        while not stop.is_set():
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done.put((i, True, run_stoppable(stop, fn, items[i])))
            except BaseException as e:  # carried to the caller, which raises it
                done.put((i, False, e))
                return

    # daemon threads: after a Ctrl-C the caller does not wait for a thread inside one chunk's work
    # (a zstd frame at level 19 takes seconds); it stops there without writing (see check_stop)
    workers = [threading.Thread(target=work, name=f"shardkit-merge-{k}", daemon=True) for k in range(max(1, min(threads, len(items))))]
    for thread in workers:
        thread.start()
    results: list[Any] = [None] * len(items)
    try:
        for _ in range(len(items)):
            i, ok, value = done.get()
            if not ok:
                raise value
            results[i] = value
            if progress is not None:
                progress(1)
    except BaseException:
        stop.set()
        raise
    for thread in workers:
        thread.join()
    return results


# runs ``fn`` over ``items`` (the piles to finish) somewhere, in parallel; results in order, with
# ``progress(1)`` as each is done: threads here by default, Ray tasks with executor="ray"
Mapper = Callable[[Callable[[Any], Any], Sequence[Any], Callable[[int], Any] | None], list[Any]]


def publish(
    txn: Transaction,
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
    mapper: Mapper | None = None,
    resumable: bool = True,
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
        mapper: where the piles are assembled (:data:`Mapper`; default: ``threads`` threads
            here). The staging directory must be a path wherever it runs them.
        resumable: keep a record of each finished pile in the staging directory, for the job
            run again to take up (see :func:`~shardkit.piles.merge_records.finished_piles`). A job that nothing resumes saves
            the files: on a busy disk, each costs more to make and remove than a small pile.
    """
    total = sum(run.length for pile_runs in runs for run in pile_runs)
    most = capacity(options.max_bytes, sum(counts), total)
    pack = Pack.of(options)
    work = [PileWork(p, runs[p], counts[p], options.seed, most, staging, pack, resumable) for p in range(len(runs))]
    finished = map_threads(finish_pile, work, threads, progress) if mapper is None else mapper(finish_pile, work, progress)
    split = sum(was_split for _, was_split in finished)
    pieces = [piece for staged, _ in finished for piece in staged]
    if not txn.remote:
        storage.sync_files([piece.path for piece in pieces])  # durable before the manifest lists them
    names = free_names(txn.path, [piece.name for piece in pieces])
    pieces = [dataclasses.replace(piece, name=name) for piece, name in zip(pieces, names, strict=True)]
    over = _over_limit(pieces, options.max_bytes)
    extra = limit_record(extra, options)
    extra = {**extra, "over_max_pile_bytes": over} if over else extra
    infos = [piece.info() for piece in pieces]
    result = Manifest(
        piles=tuple(infos),
        seed=options.seed,
        fields=tuple(sorted(fields)),
        created_by=_version(),
        skipped_units=skipped_units,
        split_piles=split,
        extra=extra or {},
    )
    # the staging, the merge's records included, stays for the caller to remove: a job stopped
    # after its manifest went in finds in them that it was published (see resume.published)
    return txn.commit([piece.path for piece in pieces], result, index=options.index)
