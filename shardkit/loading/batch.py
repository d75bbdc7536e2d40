"""Turn raw samples into what a loader yields: decode, map, collate, optionally in worker processes.

The loader's raw samples are cut into :class:`Task` chunks by slice position (one batch, or a
run of samples: :func:`cut_tasks`) so that the same function produces the same output in the
main process and in a worker. :class:`Workers` keeps one task in flight per worker process and
returns results in submission order; it never reads ahead of the consumer by more than one task
per worker.

    step = Step(transform=Transform(codecs=DEFAULT, fn=None), collate=collate, batched=True, on_error="raise")
    with Workers(2, step) as workers:
        for result in workers.run(cut_tasks(blocks, policy.sample, start=0, length=n, batch_size=32)): ...
"""

from __future__ import annotations

import contextlib
import pickle
import signal
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardkit.codecs import Codecs
from shardkit.errors import DecodeError, WorkerError

Collate = Callable[[list[dict[str, Any]]], Any]
# what the loader reads, block by block: (slice position of the first sample, the pile or one
# pile per position (None where a pile was skipped), the samples' indices in their piles)
SampleBlock = tuple[int, Any, list[int]]

# samples per task when unbatched samples go through decode/map
CHUNK = 64


@dataclass(frozen=True)
class Transform:
    """Decode a raw sample's fields (naming pile and key on failure), then apply ``fn``."""

    codecs: Codecs | None
    fn: Callable[[dict[str, Any]], Any] | None

    def __call__(self, sample: dict[str, Any], url: str) -> Any:
        if self.codecs is not None:
            decoder = self.codecs.decoder
            for ext, value in sample.items():
                if ext[:2] == "__":
                    continue
                fn = decoder(ext)
                if fn is None:
                    continue
                try:
                    sample[ext] = fn(value)
                except Exception as e:
                    key = sample.get("__key__")
                    raise DecodeError(f"{url}: sample {key!r}: field {ext!r} cannot be decoded ({type(e).__name__}: {e})") from e
        if self.fn is not None:
            try:
                return self.fn(sample)
            except Exception as e:
                if hasattr(e, "add_note"):  # Python 3.11+
                    e.add_note(f"shardkit: in map() on sample {sample.get('__key__')!r} of {url}")
                raise
        return sample


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.number, np.bool_))


def _stack(values: list[Any]) -> Any:
    first = values[0]
    if all(_is_number(v) for v in values):
        return np.asarray(values)
    if isinstance(first, np.ndarray) and all(
        isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype for v in values
    ):
        return np.stack(values)
    return values


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Default batch: ``__key__`` -> list of keys; a field -> numpy array when its values are
    numbers or arrays of one shape and dtype, else a list. A field missing from some samples is
    a list with None in their places. No samples give ``{"__key__": []}``."""
    if not samples:
        return {"__key__": []}
    names: dict[str, None] = {}
    for s in samples:
        names.update(dict.fromkeys(s))
    out: dict[str, Any] = {}
    for name in names:
        values = [s.get(name) for s in samples]
        out[name] = values if name.startswith("__") else _stack(values)
    return out


@dataclass
class Task:
    """Raw samples to process: ``ends[i]`` is the slice position after sample i (or after the batch)."""

    ends: list[int] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    end: int = 0


def cut_tasks(
    blocks: Iterable[SampleBlock],
    take: Callable[[Any, int], dict[str, Any] | None],
    *,
    start: int,
    length: int,
    batch_size: int | None,
) -> Iterator[Task]:
    """Cut the raw samples of slice positions ``start .. length - 1`` into tasks by position.

    Task boundaries are multiples of ``batch_size`` (else of :data:`CHUNK`), so a skipped
    sample never shifts a batch. Batched, every batch is a task even when all its samples were
    skipped: each rank then yields ``len(loader)`` batches whatever fails. Unbatched, a chunk
    with no sample left is dropped.

    Args:
        blocks: the loader's blocks from slice position ``start`` on.
        take: ``take(pile, i)`` is sample ``i`` of ``pile``, or None when it is skipped.
        start, length: the first slice position read, and the slice length.
        batch_size: the loader's ``batch_size``, or None.
    """
    batched = batch_size is not None
    size = batch_size or CHUNK
    boundary = start - start % size + size
    task = Task()
    for bstart, data, index in blocks:
        piles = [data] * len(index) if not isinstance(data, list) else data
        for n, (pile, i) in enumerate(zip(piles, index, strict=True)):
            pos = bstart + n + 1
            if pos > boundary:
                task.end = boundary
                if batched or task.samples:
                    yield task
                task = Task()
                boundary += size
            sample = take(pile, i)
            if sample is not None:
                task.ends.append(pos)
                task.urls.append(pile.url)
                task.samples.append(sample)
        # let this block's piles go before the next is read: the loader frees a pile the
        # schedule is done with, and no reference may stay here while the reader refills its slot
        data = pile = None
        piles = []
    if task.samples or (batched and length > start):
        task.end = min(boundary, length)
        yield task


@dataclass
class Result:
    """``items`` as ``(position after it, item)``; ``failures`` are messages of skipped samples."""

    items: list[tuple[int, Any]]
    failures: list[str]


@dataclass(frozen=True)
class Step:
    """What is done to a task: transform each sample, skip failures if allowed, collate."""

    transform: Transform
    collate: Collate | None
    batched: bool
    on_error: str

    def __call__(self, task: Task) -> Result:
        done: list[tuple[int, Any]] = []
        failures: list[str] = []
        for end, url, sample in zip(task.ends, task.urls, task.samples, strict=True):
            try:
                done.append((end, self.transform(sample, url)))
            except Exception as e:
                if self.on_error == "raise":
                    raise
                failures.append(str(e))
        if not self.batched:
            return Result(done, failures)
        # a batch keeps its slot even when every sample failed: then it is collate([])
        batch = [item for _, item in done]
        return Result([(task.end, (self.collate or collate)(batch))], failures)


class _Raised:
    """An exception from a worker, with a text fallback when it cannot be pickled."""

    def __init__(self, error: BaseException) -> None:
        self.error: BaseException | None = error
        self.text = "".join(traceback.format_exception(error))


def _send(conn: Any, obj: Any) -> None:
    """Send with the C pickler (dill, which the pipes use by default, is several times slower).

    Objects the C pickler refuses (a lambda in a mapped sample, say) go through dill instead.
    """
    try:
        data = b"p" + pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        import dill

        data = b"d" + dill.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    conn.send_bytes(data)


def _recv(conn: Any) -> Any:
    data = conn.recv_bytes()
    if data[:1] == b"d":
        import dill

        return dill.loads(data[1:])
    return pickle.loads(data[1:])


def _worker_main(conn: Any, step: Step) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C and stops us
    while True:
        try:
            task = _recv(conn)
        except EOFError:
            return
        if task is None:
            return
        try:
            reply: Any = step(task)
        except BaseException as e:
            reply = _Raised(e)
        try:
            _send(conn, reply)
        except Exception:  # the exception itself would not pickle: send its text
            if not isinstance(reply, _Raised):
                raise
            reply.error = None
            _send(conn, reply)


class Workers:
    """``count`` worker processes applying ``step`` to tasks, results in order.

    Each worker holds at most one task, and gets its next one only after its result was taken,
    so nothing reads ahead without bound and no pipe can deadlock.

    Example:
        with Workers(2, step) as w:
            results = list(w.run(tasks))
    """

    def __init__(self, count: int, step: Step) -> None:
        import multiprocess

        self._conns: list[Any] = []
        self._procs: list[Any] = []
        self.broken = False  # a worker died: the loader starts a fresh set for the next epoch
        for i in range(count):
            ours, theirs = multiprocess.Pipe()
            proc = multiprocess.Process(target=_worker_main, args=(theirs, step), name=f"shardkit-worker-{i}", daemon=True)
            proc.start()
            theirs.close()
            self._conns.append(ours)
            self._procs.append(proc)

    def run(self, tasks: Iterable[Task]) -> Iterator[Result]:
        """Results of ``tasks``, in order. Abandoning the iterator collects what is in flight."""
        it = iter(tasks)
        pending: deque[int] = deque()
        try:
            for w in range(len(self._conns)):
                task = next(it, None)
                if task is None:
                    break
                _send(self._conns[w], task)
                pending.append(w)
            while pending:
                w = pending[0]
                reply = self._receive(w)
                pending.popleft()  # only now: an interrupted receive leaves its reply to drain below
                if isinstance(reply, _Raised):
                    if reply.error is not None:
                        raise reply.error
                    raise RuntimeError(f"a shardkit worker process failed:\n{reply.text}")
                task = next(it, None)
                if task is not None:
                    _send(self._conns[w], task)
                    pending.append(w)
                yield reply
        finally:
            for w in pending:  # leave the workers idle for the next epoch
                with contextlib.suppress(EOFError, OSError, WorkerError):
                    self._receive(w)

    def _receive(self, w: int) -> Any:
        try:
            return _recv(self._conns[w])
        except (EOFError, OSError):
            self.broken = True
            proc = self._procs[w]
            proc.join(timeout=1)
            code = proc.exitcode
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            raise WorkerError(
                f"shardkit worker process {w} ({proc.name}, pid {proc.pid}) died with a task in hand ({how}); out of memory?"
            ) from None

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                _send(conn, None)
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
