"""Turn input units into pile bytes inside one process: run ``fn``, encode, route, record.

This is the part of :func:`shardkit.preprocess` that runs wherever the units are processed: in
the calling process (:class:`UnitWriter`) or in a worker process (:class:`UnitWorker`, the
handler :class:`shardkit.workers.Pool` runs). A failing unit becomes a
:class:`~shardkit.errors.Failure`, which crosses process boundaries; :func:`unit_error` turns it
into the error the caller sees, naming the unit.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardkit import errors, storage
from shardkit.codecs import Codecs
from shardkit.dataset import file_checks
from shardkit.errors import Failure, InputError, RemoteTraceback, SampleError, ShardkitError
from shardkit.manifest import PileInfo
from shardkit.piles import canonical, commits, resume, router
from shardkit.piles import repeat as repeat_rules
from shardkit.piles.encode import encode_parts
from shardkit.piles.parts import ADVICE, Hashes, PileSink, part_file
from shardkit.piles.readers.columns import ColumnSpec
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
    # copies of each sample (see shardkit.piles.repeat); None writes each once
    repeat: repeat_rules.Rule | None = None
    # 0 for a new dataset; an append's generation (its samples are routed by it)
    generation: int = 0
    # the parent's storage options by bucket: a spawned worker reads remote units with them too
    storage: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, repr=False)
    # shards: the manifest entries of units that are a dataset's own files (repile), by URL: each
    # is checked against its entry as it is read, so damage is refused rather than written anew
    listed: Mapping[str, PileInfo] = field(default_factory=dict, repr=False)
    # a preprocess job: its keys come from its function, whose key_prefix is refused
    keyed_by_fn: bool = False

    @property
    def repeat_advice(self) -> str:
        """What the message for a key two samples share advises: for a reader that takes keys from
        a column, to key another one (its ``key_prefix`` is refused); else :data:`ADVICE`."""
        if isinstance(self.fn, ColumnSpec) and self.fn.key is not None:
            return (
                f" across all inputs, and this reader takes them from the column {self.fn.key!r}: name a column of unique "
                "values as key, or leave key unset (each row is then keyed by its file and row number)"
            )
        if self.keyed_by_fn:  # preprocess: key_prefix is refused there
            return (
                " across all inputs, and preprocess takes them from its function: give each sample a unique '__key__' "
                "(e.g. prefix the input's name); JSON lines are keyed FILESTEM-LINE unless a record field names them "
                "(key= of JsonLines, args: {key: FIELD} in a job file, --key of scripts/preprocess_jsonl.py), so two files of one name meet"
            )
        return ADVICE


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
    """What one process wrote: per-pile part files, their segments and CRC-32s, the field
    extensions, where each pile's key hashes are, and input samples by their number of copies
    (with a repeat rule)."""

    paths: list[str]
    segments: list[Any]
    fields: set[str]
    crcs: list[int]
    key_runs: list[Any]
    factors: dict[int, int] = field(default_factory=dict)

    def hashes(self, pile: int) -> Hashes:
        """Where the key hashes of pile ``pile``'s part file are."""
        return Hashes.of(os.path.dirname(self.paths[pile]), self.key_runs[pile])


def part_directory(staging: str, attempt: str, worker: int) -> str:
    """Where process ``worker`` of the run ``attempt`` keeps its part files inside the staging directory."""
    return os.path.join(staging, f"{attempt}-w{worker}")


def chunk_directory(staging: str, attempt: str, first: int, last: int) -> str:
    """Where the task of the run ``attempt`` running input units ``first..last`` keeps its part
    files (one task a chunk): a retry of the task replaces its own files, and a task an earlier,
    killed run left running on the cluster never writes where this run does."""
    return os.path.join(staging, f"{attempt}-u{first:09d}-{last:09d}")


def _encoded(job: UnitWork, unit: Any, factors: Counter[int]) -> Iterator[tuple[str, list[storage.Chunk], int, tuple[str, ...]]]:
    """(key, byte pieces, size, extensions) of each sample of one unit, each copy ``job.repeat`` asks for
    (counted in ``factors``); anything raised by ``fn``, the rule or the encoder is a UnitFailed."""
    try:
        samples = job.fn(unit)
        if samples is None or isinstance(samples, (Mapping, str, bytes)) or not isinstance(samples, Iterable):
            raise TypeError(f"fn must return or yield an iterable of sample dicts, it returned {type(samples).__name__}")
        for sample in samples:
            if not isinstance(sample, Mapping):
                raise TypeError(f"fn yielded a {type(sample).__name__}, expected a sample dict with '__key__'")
            count = 1
            if job.repeat is not None:
                count = repeat_rules.copies(job.repeat, sample)
                factors[count] += 1
            for copy in range(count):
                # copy 0 is the sample as it is; once it encoded, its key is a valid str to extend
                written = sample if copy == 0 else {**sample, "__key__": repeat_rules.copy_key(sample["__key__"], copy)}
                parts, size, exts = encode_parts(written, job.codecs, max_pile_bytes=job.max_pile_bytes)
                yield written["__key__"], parts, size, exts
    except Exception as e:
        raise UnitFailed(str(e)) from e


class UnitWriter:
    """Runs ``fn`` on units and routes their samples into one :class:`PileSink` (one per process).

    writer = UnitWriter(job, "out/.shardkit-pass1/part-1a2b3c4d-w0", buffer_size=64 << 20)
    samples, nbytes = writer.run(0, "shard-000.tar")
    part = writer.finish()
    """

    def __init__(self, job: UnitWork, directory: str, buffer_size: int) -> None:
        self.job = job
        self.sink = PileSink(directory, job.piles, buffer_size)
        self.fields: set[str] = set()
        # input samples by the number of copies written of each (with a repeat rule)
        self.factors: Counter[int] = Counter()
        # what the next commit records: the units done and skipped, and their totals
        self.done: list[int] = []
        self.failures: list[Failure] = []
        self.samples = self.nbytes = 0
        self.committed = time.monotonic()
        # a unit failed and the job stops: its bytes so far are in the parts, so never commit again
        self.broken = False

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
        factors: Counter[int] = Counter()
        # errors from the sink (a full disk) are not the unit's fault: they escape UnitFailed
        for key, parts, size, exts in _encoded(self.job, unit, factors):
            if ordinals.setdefault(key, samples) != samples:
                error = SampleError(repeated_key(key, sample_at(samples), sample_at(ordinals[key])) + self.job.repeat_advice)
                raise UnitFailed(str(error)) from error
            add(route(), parts, size, index, key)
            seen.update(exts)
            samples += 1
            nbytes += size
        # a unit's fields count once it succeeded: a skipped unit leaves no trace
        self.fields |= seen
        self.factors.update(factors)
        return samples, nbytes

    def _copy_shard(self, index: int, url: str) -> tuple[int, int]:
        """Route the samples of the shard ``url`` as whole byte ranges (see :mod:`shardkit._raw`)."""
        try:
            info = self.job.listed.get(url)
            buf = read_shard(url, mapped=True) if info is None else file_checks.read_listed(url, info)
            prefix = canonical.unit_prefix(url) if self.job.key_prefix == "unit" else ""
            found = canonical.canonical_samples(buf, url, max_pile_bytes=self.job.max_pile_bytes, codecs=self.job.codecs, prefix=prefix)
        except Exception as e:
            raise UnitFailed(str(e)) from e
        count = len(found.chunks)
        if count:  # canonical_samples refused a key the shard repeats; one another unit has is found at the merge
            piles = router.route(piles=self.job.piles, seed=self.job.seed, unit=index, count=count, generation=self.job.generation)
            self.sink.extend(index, piles, found.chunks, found.sizes, found.keys, mapped=storage.is_mapped(buf))
        self.fields |= found.fields
        return count, int(found.sizes.sum())

    def attempt(self, index: int, unit: Any) -> tuple[int, int] | Failure:
        """Like :meth:`run`, but a failing unit comes back as a :class:`Failure`; either way the
        unit counts as done (written, or skipped) at the next commit, unless the job is to
        stop at a failing unit."""
        try:
            samples, nbytes = self.run(index, unit)
        except UnitFailed as e:
            cause = e.__cause__ if e.__cause__ is not None else e
            failure = Failure.capture(cause, index=index)
            if self.job.on_error == "raise":
                self.broken = True
            else:
                self.failures.append(failure)
            return failure
        self.done.append(index)
        self.samples += samples
        self.nbytes += nbytes
        return samples, nbytes

    def commit(self) -> None:
        """Write the buffers out and record, durably, which units this directory holds whole."""
        self.sink.flush()
        if self.broken:
            return
        sink = self.sink
        record = commits.Commit(
            sizes=list(sink.sizes),
            crcs=list(sink.crcs),
            counts=list(sink.counts),
            segments=list(sink.segments),
            key_runs=list(sink.key_runs),
            hashed=sink.hashed,
            fields=set(self.fields),
            factors=dict(self.factors),
            units=list(self.done),
            failures=list(self.failures),
            samples=self.samples,
            nbytes=self.nbytes,
        )
        commits.write_commit(sink.directory, record)
        self.committed = time.monotonic()

    def commit_due(self) -> None:
        """Commit when :data:`resume.COMMIT_SECONDS` have passed since the last commit."""
        if time.monotonic() - self.committed >= resume.COMMIT_SECONDS:
            self.commit()

    def finish(self) -> Part:
        """Flush the buffers and commit; returns what this process wrote."""
        self.commit()
        sink = self.sink
        return part_of(sink.directory, self.job.piles, sink.segments, self.fields, sink.crcs, sink.key_runs, dict(self.factors))


def part_of(
    directory: str, piles: int, segments: list[Any], fields: set[str], crcs: list[int], key_runs: list[Any], factors: dict[int, int]
) -> Part:
    """The :class:`Part` of the part directory ``directory``."""
    return Part([part_file(directory, p) for p in range(piles)], segments, fields, crcs, key_runs, factors)


def reused_part(directory: str, commit: commits.Commit) -> Part:
    """The :class:`Part` an earlier run committed in ``directory``."""
    return part_of(directory, len(commit.sizes), commit.segments, commit.fields, commit.crcs, commit.key_runs, commit.factors)


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

        pool = Pool(2, functools.partial(UnitWorker, job, staging, "part-1a2b3c4d", buffer_size), name="shardkit-pile")
    """

    def __init__(self, job: UnitWork, staging: str, attempt: str, buffer_size: int, k: int) -> None:
        storage.remote.restore(job.storage)
        self.job = job
        self.writer = UnitWriter(job, part_directory(staging, attempt, k), buffer_size)

    def __call__(self, task: Any) -> ChunkDone | Part:
        if task == FINISH:
            return self.writer.finish()
        reply = run_chunk(self.writer, task)
        self.writer.commit_due()
        return reply


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
