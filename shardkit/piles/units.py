"""Turn input units into pile bytes inside one process: run ``fn``, encode, route, record.

This is the part of :func:`shardkit.preprocess` that runs wherever the units are processed: in
the calling process (:class:`UnitWriter`) or in a worker process (:class:`UnitWorker`, the
handler :class:`shardkit.workers.Pool` runs). A failing unit becomes a
:class:`~shardkit.errors.Failure`, which crosses process boundaries; :func:`unit_error` turns it
into the error the caller sees, naming the unit.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardkit import errors, storage
from shardkit.codecs import Codecs
from shardkit.errors import Failure, InputError, RemoteTraceback, SampleError, ShardkitError
from shardkit.piles import canonical, router
from shardkit.piles.encode import encode_sample
from shardkit.piles.parts import ADVICE, PileSink
from shardkit.tar.keys import repeated_key, sample_at
from shardkit.tar.shard import read_shard


@dataclass(frozen=True)
class UnitWork:
    """Everything a process needs to turn units into pile bytes; sent to each worker once.

    With ``shards``, units are tar shard URLs and their samples are copied without decoding
    (``fn`` is not called); the bytes are the same as ``fn=iter_shard`` gives.
    ``key_prefix="unit"`` (shards only) puts each shard's stem in front of its keys.
    """

    fn: Callable[[Any], Iterable[Mapping[str, Any]]]
    piles: int
    seed: int
    max_pile_bytes: int | None
    codecs: Codecs
    on_error: str
    shards: bool = False
    key_prefix: str = "none"
    # 0 for a new dataset; an append's generation (its samples are routed by it)
    generation: int = 0
    # the parent's storage options by bucket: a spawned worker reads remote units with them too
    storage: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, repr=False)


class UnitFailed(Exception):
    """``fn`` (or encoding what it yielded) raised on one unit; the cause is chained."""


def describe(unit: Any) -> str:
    """``repr(unit)``, cut to a length that fits in an error message."""
    shown = repr(unit)
    return shown if len(shown) <= 200 else shown[:197] + "..."


def unit_error(failure: Failure, unit: Any) -> ShardkitError:
    """The exception to raise for a unit that failed, chained to the original (or its traceback).

    Errors shardkit raises itself (a bad sample, a corrupt input shard) keep their class and get
    the unit named in front; anything else ``fn`` raised becomes an :class:`InputError`.
    """
    where = f"input unit {failure.index} ({describe(unit)})"
    kind = getattr(errors, failure.kind, None) if failure.own else None
    if isinstance(kind, type) and issubclass(kind, ShardkitError):
        err: ShardkitError = kind(f"{where}: {failure.message}")
    else:
        err = InputError(f"{where}: fn raised {failure.kind}: {failure.message}")
    cause = failure.error
    err.__cause__ = cause if cause is not None and cause.__traceback__ is not None else RemoteTraceback(failure.traceback)
    return err


def skip_record(failure: Failure, unit: Any) -> dict[str, Any]:
    """The manifest's entry for a skipped unit."""
    return {"unit": failure.index, "input": describe(unit), "error": f"{failure.kind}: {failure.message}"}


@dataclass
class Part:
    """What one process wrote: per-pile part files, their segments and CRC-32s, the field extensions."""

    paths: list[str]
    segments: list[Any]
    fields: set[str]
    crcs: list[int]


def part_directory(staging: str, worker: int) -> str:
    """Where process ``worker`` keeps its part files inside the staging directory."""
    return os.path.join(staging, f"part-{worker}")


def chunk_directory(staging: str, first: int, last: int) -> str:
    """Where the task running input units ``first..last`` keeps its part files (one task a chunk)."""
    return os.path.join(staging, f"part-u{first:09d}-{last:09d}")


def _encoded(job: UnitWork, unit: Any) -> Iterator[tuple[str, bytes, list[str]]]:
    """(key, bytes, extensions) of each sample of one unit; anything raised by ``fn`` or the encoder is a UnitFailed."""
    try:
        samples = job.fn(unit)
        if samples is None or isinstance(samples, (Mapping, str, bytes)) or not isinstance(samples, Iterable):
            raise TypeError(f"fn must return or yield an iterable of sample dicts, it returned {type(samples).__name__}")
        for sample in samples:
            if not isinstance(sample, Mapping):
                raise TypeError(f"fn yielded a {type(sample).__name__}, expected a sample dict with '__key__'")
            data, exts = encode_sample(sample, job.codecs, max_pile_bytes=job.max_pile_bytes)
            yield sample["__key__"], data, exts
    except Exception as e:
        raise UnitFailed(str(e)) from e


class UnitWriter:
    """Runs ``fn`` on units and routes their samples into one :class:`PileSink` (one per process).

    writer = UnitWriter(job, "out/.shardkit-staging-x/part-0", buffer_size=64 << 20)
    samples, nbytes = writer.run(0, "shard-000.tar")
    part = writer.finish()
    """

    def __init__(self, job: UnitWork, directory: str, buffer_size: int) -> None:
        self.job = job
        self.sink = PileSink(directory, job.piles, buffer_size)
        self.fields: set[str] = set()

    def run(self, index: int, unit: Any) -> tuple[int, int]:
        """Write every sample of ``unit``; returns (samples, bytes). Raises UnitFailed."""
        if self.job.shards:
            return self._copy_shard(index, unit)
        route = router.PileRouter(piles=self.job.piles, seed=self.job.seed, unit=index, generation=self.job.generation).next
        add = self.sink.add
        seen: set[str] = set()
        # a key the unit repeats is the unit's fault (skipped with it); one another unit has too
        # is found when the piles are merged. Memory: the unit's keys, while it runs.
        ordinals: dict[str, int] = {}
        samples = nbytes = 0
        # errors from the sink (a full disk) are not the unit's fault: they escape UnitFailed
        for key, data, exts in _encoded(self.job, unit):
            if ordinals.setdefault(key, samples) != samples:
                error = SampleError(repeated_key(key, sample_at(samples), sample_at(ordinals[key])) + ADVICE)
                raise UnitFailed(str(error)) from error
            add(route(), data, index, key)
            seen.update(exts)
            samples += 1
            nbytes += len(data)
        # a unit's fields count once it succeeded: a skipped unit leaves no trace
        self.fields |= seen
        return samples, nbytes

    def _copy_shard(self, index: int, url: str) -> tuple[int, int]:
        """Route the samples of the shard ``url`` as whole byte ranges (see :mod:`shardkit._raw`)."""
        try:
            buf = read_shard(url, mapped=True)
            prefix = canonical.unit_prefix(url) if self.job.key_prefix == "unit" else ""
            found = canonical.canonical_samples(buf, url, max_pile_bytes=self.job.max_pile_bytes, codecs=self.job.codecs, prefix=prefix)
        except Exception as e:
            raise UnitFailed(str(e)) from e
        count = len(found.chunks)
        if count:  # canonical_samples refused a key the shard repeats; one another unit has is found at the merge
            piles = router.route(piles=self.job.piles, seed=self.job.seed, unit=index, count=count, generation=self.job.generation)
            self.sink.extend(index, piles, found.chunks, found.sizes, found.keys, mapped=isinstance(buf, mmap.mmap))
        self.fields |= found.fields
        return count, int(found.sizes.sum())

    def attempt(self, index: int, unit: Any) -> tuple[int, int] | Failure:
        """Like :meth:`run`, but a failing unit comes back as a :class:`Failure`."""
        try:
            return self.run(index, unit)
        except UnitFailed as e:
            cause = e.__cause__ if e.__cause__ is not None else e
            return Failure.capture(cause, index=index)

    def finish(self) -> Part:
        """Flush the buffers; returns what this process wrote."""
        self.sink.flush()
        return Part([self.sink.part(p) for p in range(self.job.piles)], self.sink.segments, self.fields, self.sink.crcs)


# the task that asks a worker for its part: everything it wrote
FINISH = "finish"


@dataclass(frozen=True)
class ChunkDone:
    """A worker's reply to a chunk of units: what it wrote, and the units that failed."""

    units: int
    samples: int
    nbytes: int
    failures: list[Failure]


class UnitWorker:
    """Pass 1 in a worker process: chunks of ``(index, unit)`` in, :class:`ChunkDone` out, and its
    :class:`Part` when sent :data:`FINISH`. With ``on_error="raise"`` a chunk stops at its first
    failing unit (the parent raises it).

        pool = Pool(2, functools.partial(UnitWorker, job, staging, buffer_size), name="shardkit-pile")
    """

    def __init__(self, job: UnitWork, staging: str, buffer_size: int, k: int) -> None:
        storage.remote.restore(job.storage)
        self.job = job
        self.writer = UnitWriter(job, part_directory(staging, k), buffer_size)

    def __call__(self, task: Any) -> ChunkDone | Part:
        if task == FINISH:
            return self.writer.finish()
        return run_chunk(self.writer, task)


def run_chunk(writer: UnitWriter, chunk: Sequence[tuple[int, Any]]) -> ChunkDone:
    """Write the units of ``chunk`` (``(index, unit)`` pairs); with ``on_error="raise"`` stop at the first failing one."""
    samples = nbytes = 0
    failures: list[Failure] = []
    for index, unit in chunk:
        result = writer.attempt(index, unit)
        if isinstance(result, Failure):
            failures.append(result.portable())
            if writer.job.on_error == "raise":
                break
        else:
            samples += result[0]
            nbytes += result[1]
    return ChunkDone(len(chunk), samples, nbytes, failures)
