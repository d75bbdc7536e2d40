"""Read piles ahead of the consumer in one background thread, never holding more than allowed.

Invariant: the piles held by the thread, the queue and the consumer together never exceed
``slots``. The thread takes a slot before it starts reading a pile and the consumer gives it back
when it drops the pile, so a double buffer is ``slots=2``. Errors are carried across the queue
and re-raised by the consumer; the end is an explicit sentinel; ``close()`` stops and joins.

    reader = PileReader(["a.tar", "b.tar"], read=lambda url: read_pile(url), slots=2)
    index, pile = reader.get()   # pile 0, or raises what reading it raised
    reader.release()             # the consumer let pile 0 go; the thread may read one more
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from shardkit.errors import Failure

T = TypeVar("T")
Item = TypeVar("Item")

_END = object()


class PileReader(Generic[Item, T]):
    """Apply ``read`` to each item in order in a named daemon thread, at most ``slots`` ahead.

    Args:
        items: what to read, in order (pile indices, URLs...).
        read: the reading function; runs in the thread.
        slots: how many results may be alive at once (held by the thread, queued or in use).
        name: the thread's name (shows in tracebacks and ``threading.enumerate()``).
    """

    def __init__(self, items: Sequence[Item], read: Callable[[Item], T], *, slots: int, name: str = "shardkit-reader") -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self._items, self._read, self._slots = list(items), read, slots
        self._held = 0
        self._cond = threading.Condition()
        self._stop = False
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=slots + 1)
        self._done = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for i, item in enumerate(self._items):
                with self._cond:
                    self._cond.wait_for(lambda: self._stop or self._held < self._slots)
                    if self._stop:
                        return
                    self._held += 1
                try:
                    result: Any = self._read(item)
                except BaseException as e:  # carried to the consumer, whatever it is
                    result = Failure.capture(e, index=i)
                self._queue.put(result)
                del result  # else this frame keeps the last pile alive while it waits for a slot
        except BaseException as e:  # pragma: no cover - the loop itself never raises
            self._queue.put(Failure.capture(e))
        finally:
            self._queue.put(_END)

    def get(self) -> T | Failure | None:
        """The next result in order, a :class:`Failure` in its place, or None at the end."""
        if self._done:
            return None
        result = self._queue.get()
        if result is _END:
            self._done = True
            return None
        return result

    def release(self) -> None:
        """The consumer dropped one result (or a Failure): the thread may read one more."""
        with self._cond:
            self._held -= 1
            self._cond.notify()

    def close(self) -> None:
        """Stop the thread and wait for it (it may first finish the read in progress). Idempotent."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        # drop what the thread left queued so the piles are freed now
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
