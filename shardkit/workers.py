"""Run :class:`~shardkit._units.UnitWriter` in worker processes and collect what they wrote.

The parent hands each worker small chunks of ``(index, unit)`` pairs on the worker's own
queue, keeping two chunks in flight per worker, so fast workers take more units and the
parent always knows which units a worker holds. Workers answer on one shared queue:

- ``("chunk", k, units, samples, bytes, failures)`` after each chunk (skipped units included),
- ``("done", k, part)`` once told to stop (``None`` on its queue) and flushed,
- ``("failed", k, failure)`` when a unit failed and the policy is to raise,
- ``("error", k, exception, traceback)`` for anything else, ``KeyboardInterrupt`` included.

Any error in the parent or a worker (or a worker that dies) ends the run: every worker is
terminated and joined before the error propagates; the caller removes the staging files.
Workers ignore SIGINT: Ctrl-C reaches the parent, which stops them.
"""

from __future__ import annotations

import queue
import signal
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import dill
import multiprocess

from shardkit.errors import ConfigError, InputError
from shardkit.piles.units import Failure, Job, Part, RemoteTraceback, UnitWriter, describe, part_directory

Chunk = list[tuple[int, Any]]
# called in the parent after each chunk: (units, samples, bytes, skipped failures)
Progress = Callable[[int, int, int, Sequence[Failure]], None]

_IN_FLIGHT = 2
_POLL = 1.0  # seconds between checks that no worker died while the parent waits


def chunk_size(units: int, workers: int) -> int:
    """Units per chunk: small enough to balance the load, large enough to keep messages rare."""
    return max(1, min(16, units // (workers * 32)))


def _pack(chunk: Chunk) -> bytes:
    """Pickle a chunk here, where a unit that cannot be pickled can still be named.

    ``Queue.put`` pickles in a background thread that only prints its errors: the worker
    would wait for that chunk forever.
    """
    try:
        return dill.dumps(chunk)
    except Exception:
        for index, unit in chunk:
            try:
                dill.dumps(unit)
            except Exception as e:
                raise InputError(f"input unit {index} ({describe(unit)}) cannot be sent to a worker process: {e}") from e
        raise


def _put(tasks: Any, payload: bytes | None) -> None:
    """``tasks.put`` with Ctrl-C held back until it returns.

    A KeyboardInterrupt inside the first ``put`` can land after the queue started its feeder
    thread but before it registered the hook that stops it; ``close()`` then leaves that thread
    waiting forever. The feeder also inherits the mask, so signals stay with the main thread.
    """
    if not hasattr(signal, "pthread_sigmask"):
        tasks.put(payload)
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        tasks.put(payload)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _next_task(tasks: Any) -> Chunk | None:
    while True:
        try:
            payload = tasks.get(timeout=10.0)
            return None if payload is None else dill.loads(payload)
        except queue.Empty:
            parent = multiprocess.parent_process()
            if parent is not None and not parent.is_alive():
                return None  # orphaned: the parent died without stopping us


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (dill), else a RuntimeError with its text."""
    try:
        dill.loads(dill.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def worker_main(k: int, job: Job, directory: str, buffer_size: int, tasks: Any, results: Any) -> None:
    """Body of worker ``k``: process chunks until told to stop, then report the part."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        writer = UnitWriter(job, directory, buffer_size)
        while (chunk := _next_task(tasks)) is not None:
            samples = nbytes = 0
            skipped = []
            for index, unit in chunk:
                result = writer.attempt(index, unit)
                if isinstance(result, Failure):
                    if job.on_error == "raise":
                        results.put(("failed", k, result.portable()))
                        return
                    skipped.append(result.portable())
                else:
                    samples += result[0]
                    nbytes += result[1]
            results.put(("chunk", k, len(chunk), samples, nbytes, skipped))
        results.put(("done", k, writer.finish()))
    except BaseException as e:
        results.put(("error", k, _portable(e), traceback.format_exc()))


class _Dispatcher:
    """The parent's side: hands out chunks, tracks who holds what, notices dead workers."""

    def __init__(self, units: Sequence[Any], workers: int) -> None:
        size = chunk_size(len(units), workers)
        indexed = list(enumerate(units))
        self.chunks = deque(indexed[i : i + size] for i in range(0, len(indexed), size))
        self.held: list[deque[Chunk]] = [deque() for _ in range(workers)]
        self.parts: dict[int, Part] = {}
        self.exited_quietly: set[int] = set()

    def feed(self, k: int, tasks: Any) -> None:
        """Top up worker k to ``_IN_FLIGHT`` chunks, or tell it to stop when none are left."""
        while len(self.held[k]) < _IN_FLIGHT and self.chunks:
            chunk = self.chunks.popleft()
            payload = _pack(chunk)
            self.held[k].append(chunk)
            _put(tasks, payload)
        if not self.chunks and not self.held[k]:
            _put(tasks, None)

    def check_alive(self, procs: Sequence[Any]) -> None:
        for k, proc in enumerate(procs):
            if k in self.parts or proc.exitcode is None:
                continue
            # a worker that exits 0 has sent its last message; give it one more poll to arrive
            if proc.exitcode == 0 and k not in self.exited_quietly:
                self.exited_quietly.add(k)
                continue
            units = [i for chunk in self.held[k] for i, _ in chunk]
            span = f"input units {units[0]}..{units[-1]}" if units else "no unit"
            how = f"signal {-proc.exitcode}" if proc.exitcode < 0 else f"exit code {proc.exitcode}"
            raise InputError(
                f"worker process {k} died ({how}) while holding {span}; fn may have crashed it (out of memory? a native library?)"
            )


def run(
    job: Job, units: Sequence[Any], staging: str, buffer_size: int, workers: int, progress: Progress, mp_context: str | None
) -> list[Part]:
    """Process ``units`` in ``workers`` processes; returns each worker's :class:`Part`."""
    ctx = multiprocess.get_context(mp_context)
    results = ctx.Queue()
    task_queues = [ctx.Queue() for _ in range(workers)]
    procs = [
        ctx.Process(
            target=worker_main,
            args=(k, job, part_directory(staging, k), buffer_size, task_queues[k], results),
            name=f"shardkit-worker-{k}",
            daemon=True,
        )
        for k in range(workers)
    ]
    dispatch = _Dispatcher(units, workers)
    finished = False
    try:
        for k, proc in enumerate(procs):
            _start(proc)
            dispatch.feed(k, task_queues[k])
        while len(dispatch.parts) < workers:
            try:
                message = results.get(timeout=_POLL)
            except queue.Empty:
                dispatch.check_alive(procs)
                continue
            _handle(message, dispatch, task_queues, progress)
        finished = True
        return [dispatch.parts[k] for k in range(workers)]
    finally:
        _stop(procs, task_queues, results, graceful=finished)


def _start(proc: Any) -> None:
    try:
        proc.start()
    except Exception as e:  # spawn/forkserver pickle the job: fn must survive dill
        raise ConfigError(f"fn cannot be sent to worker processes ({type(e).__name__}: {e}); use workers=1 or mp_context='fork'") from e


def _handle(message: tuple[Any, ...], dispatch: _Dispatcher, task_queues: Sequence[Any], progress: Progress) -> None:
    kind, k = message[0], message[1]
    if kind == "chunk":
        _, _, units, samples, nbytes, skipped = message
        dispatch.held[k].popleft()
        progress(units, samples, nbytes, skipped)
        dispatch.feed(k, task_queues[k])
    elif kind == "done":
        dispatch.parts[k] = message[2]
    elif kind == "failed":
        raise message[2].error()
    else:
        _, _, exc, text = message
        if isinstance(exc, KeyboardInterrupt):
            raise KeyboardInterrupt(f"interrupted in worker process {k}") from RemoteTraceback(text)
        raise exc from RemoteTraceback(text)


def _stop(procs: Sequence[Any], task_queues: Sequence[Any], results: Any, *, graceful: bool) -> None:
    """Join every worker (terminating it unless the run finished); never block on a queue."""
    if graceful:  # every worker has reported and is on its way out
        for proc in procs:
            proc.join(timeout=10.0)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        if proc.pid is not None:
            proc.join()
    for q in [*task_queues, results]:
        q.cancel_join_thread()
        q.close()
