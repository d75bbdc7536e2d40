"""Worker processes: one pool for pass 1's input units and for the loader's decoding.

Each worker builds its handler once, in the worker (``make(k)``), then answers every task sent to
it with exactly one reply, in the order the tasks came. The parent chooses which worker gets a
task and whose reply it reads, so each user keeps its own dispatch: pass 1 feeds whichever worker
is free (:meth:`Pool.ready`), the loader keeps one task per worker and takes results in submission
order (:meth:`Pool.ordered`).

Invariants, whoever uses it:

- a worker holds only the tasks sent to it and not yet answered;
- an exception in a handler comes back as a :class:`~shardkit.errors.Failure` and is raised by
  :meth:`Pool.receive` in the parent; a worker that dies (killed, out of memory, a crash in native
  code) is a :class:`~shardkit.errors.WorkerError` naming it and how it ended;
- workers ignore SIGINT (the parent handles Ctrl-C and stops them) and end with their parent:
  on Linux the kernel kills them when it dies, elsewhere they stop at the end of their pipe;
- :meth:`Pool.close` asks every worker to stop, waits a little, then terminates what is left.

Tasks and replies cross the pipes with the C pickler (dill, which the pipes default to, is several
times slower); what the C pickler refuses (a lambda in a sample, say) goes through dill.

    with Pool(2, lambda k: str.upper, name="shardkit-demo") as pool:
        pool.send(0, "a")
        assert pool.receive(0) == "A"
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from shardkit.errors import Failure, WorkerError

Handler = Callable[[Any], Any]
_STOP = None  # the task that tells a worker to return
_JOIN_SECONDS = 5.0
_ORPHAN_POLL = 0.5  # seconds between a watchdog's looks at its parent


class Pool:
    """``count`` worker processes, each answering its own tasks with its own handler.

    Args:
        count: how many processes.
        make: ``make(k) -> handler``, called once in worker ``k``; ``handler(task)`` returns the
            reply. It is sent to the workers (pickled with dill unless they are forked).
        name: the processes are named ``NAME-k``.
        context: the start method (``"fork"``, ``"spawn"``, ``"forkserver"``); None: the platform's.

    Attributes:
        broken: a worker died; the pool should be closed and a new one made.
    """

    def __init__(self, count: int, make: Callable[[int], Handler], *, name: str, context: str | None = None) -> None:
        import multiprocess

        ctx = multiprocess.get_context(context)
        # a fork server, not this process, is the parent of its workers; and the kernel's "die with
        # your parent" follows the thread that forked, so it is used only from the main thread
        parent = None if ctx.get_start_method() == "forkserver" else os.getpid()
        main_thread = threading.current_thread() is threading.main_thread()
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        self.broken = False
        self._closed = False
        try:
            for k in range(count):
                ours, theirs = ctx.Pipe()
                proc = ctx.Process(target=_serve, args=(theirs, make, k, parent, main_thread), name=f"{name}-{k}", daemon=True)
                self._conns.append(ours)
                self._procs.append(proc)
                try:
                    proc.start()
                finally:
                    theirs.close()
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self._procs)

    def send(self, k: int, task: Any) -> None:
        """Give worker ``k`` a task (pickled here: a task that cannot be pickled raises here).

        Raises:
            WorkerError: the worker died (its pipe is closed).
        """
        try:
            _send(self._conns[k], task)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            raise self._died(k) from None
        except BaseException:
            self.broken = True  # cut off mid-message (Ctrl-C): the pipe no longer frames messages
            raise

    def receive(self, k: int) -> Any:
        """Worker ``k``'s next reply (waiting for it).

        Raises:
            WorkerError: the worker died before replying.
            BaseException: what the handler raised, re-raised here.
        """
        return _raise(self._read(k))

    def _read(self, k: int) -> Any:
        """Worker ``k``'s next reply as it came (a Failure included); WorkerError if it died."""
        try:
            return _recv(self._conns[k])
        except (EOFError, OSError):
            raise self._died(k) from None
        except BaseException:
            self.broken = True  # cut off mid-message (Ctrl-C): the pipe no longer frames messages
            raise

    def ready(self, timeout: float | None = None) -> list[int]:
        """Workers whose reply can be read now (waiting up to ``timeout`` seconds for one).

        Raises:
            WorkerError: a worker died with nothing left to read.
        """
        from multiprocess.connection import wait

        conns = {id(c): k for k, c in enumerate(self._conns)}
        sentinels = {p.sentinel: k for k, p in enumerate(self._procs)}
        found = wait([*self._conns, *sentinels], timeout)
        ready = sorted({conns[id(c)] for c in found if id(c) in conns})
        for k in sorted({sentinels[s] for s in found if s in sentinels} - set(ready)):
            if not self._conns[k].poll():  # its last words may still be in the pipe
                raise self._died(k)
        return ready

    def ordered(self, tasks: Iterable[Any]) -> Iterator[Any]:
        """The replies to ``tasks`` in their order, one task in flight per worker.

        Nothing is read ahead beyond one task per worker. Abandoning the iterator collects the
        replies still in flight, so the workers are idle for the next call.
        """
        it = iter(tasks)
        pending: deque[int] = deque()
        try:
            for k in range(len(self._conns)):
                task = next(it, _STOP)
                if task is _STOP:
                    break
                self.send(k, task)
                pending.append(k)
            while pending:
                k = pending[0]
                reply = self._read(k)
                pending.popleft()  # only now: an interrupted read leaves its reply to collect below
                task = next(it, _STOP) if not isinstance(reply, Failure) else _STOP
                if task is not _STOP:
                    self.send(k, task)
                    pending.append(k)
                yield _raise(reply)
        finally:
            if self.broken:  # a pipe cut mid-message cannot be drained: the pool is done
                self.terminate()
            else:
                for k in pending:
                    with contextlib.suppress(Exception):
                        self.receive(k)

    def _died(self, k: int) -> WorkerError:
        self.broken = True
        proc = self._procs[k]
        proc.join(timeout=1)
        code = proc.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return WorkerError(
            f"shardkit worker process {k} ({proc.name}, pid {proc.pid}) died with a task in hand ({how}); out of memory?", worker=k, how=how
        )

    def close(self) -> None:
        """Ask every worker to stop, wait for them, terminate the ones that do not. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                _send(conn, _STOP)
        for proc in self._procs:
            if proc.pid is not None:
                proc.join(timeout=_JOIN_SECONDS)
                if proc.is_alive():
                    proc.terminate()
                    proc.join()
                proc.close()  # its sentinel and pipe file descriptors go now, not when collected
        for conn in self._conns:
            conn.close()

    def terminate(self) -> None:
        """Stop every worker now, whatever it is doing (an error or Ctrl-C in the parent)."""
        if not self._closed:
            for proc in self._procs:
                if proc.pid is not None and proc.is_alive():
                    proc.terminate()
        self.close()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.terminate()


def _raise(reply: Any) -> Any:
    """``reply``, or the exception it carries."""
    if isinstance(reply, Failure):
        raise reply.exception()
    return reply


def _serve(conn: Any, make: Callable[[int], Handler], k: int, parent: int | None, main_thread: bool) -> None:
    """A worker's life: build the handler, answer each task until told to stop or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    _die_with_parent(parent, main_thread)
    try:
        handler: Handler | Failure = make(k)
    except BaseException as e:  # every task is answered with why the worker cannot work
        handler = Failure.capture(e).portable()
    while True:
        try:
            task = _recv(conn)
        except (EOFError, OSError):
            return  # the parent is gone
        if task is _STOP:
            return
        if isinstance(handler, Failure):
            reply: Any = handler
        else:
            try:
                reply = handler(task)
            except BaseException as e:
                reply = Failure.capture(e)
        try:
            _send(conn, reply.portable() if isinstance(reply, Failure) else reply)
        except Exception as e:  # a reply that cannot be pickled: say so instead
            _send(conn, Failure.capture(e).portable())


def _die_with_parent(parent: int | None, main_thread: bool) -> None:
    """End this process when its parent dies, so no worker goes on alone: the kernel kills it
    (Linux, a pool made by the main thread), else a watchdog thread notices within a second."""
    if parent is None:
        return
    if main_thread and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    else:
        threading.Thread(target=_watch_parent, args=(parent,), name="shardkit-orphan-watch", daemon=True).start()
    if os.getppid() != parent:  # the parent died before the lines above took effect
        os._exit(1)


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(_ORPHAN_POLL)
        if os.getppid() != parent:
            os._exit(1)


def _send(conn: Any, obj: Any) -> None:
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
