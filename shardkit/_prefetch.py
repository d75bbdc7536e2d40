"""Read piles ahead of the consumer in background threads, never holding more than allowed.

Invariant: the piles held by the threads, waiting for the consumer, and in the consumer's hands
together never exceed ``slots``. A thread takes a slot before it starts reading a pile and the
consumer gives it back when it drops the pile, so a double buffer is ``slots=2``. With several
threads, piles are read in parallel (claimed in order, so the one the consumer needs next is
always among those being read) and handed out in order. Errors are carried to the consumer and
re-raised there; ``close()`` stops and joins.

    reader = PileReader(["a.tar", "b.tar"], read=lambda url: read_pile(url), slots=2)
    index, pile = reader.get()   # pile 0, or raises what reading it raised
    reader.release()             # the consumer let pile 0 go; a thread may read one more
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")
Item = TypeVar("Item")


class Failure:
    """An exception raised while reading item ``index``, carried to the consumer."""

    __slots__ = ("error", "index")

    def __init__(self, index: int, error: BaseException) -> None:
        self.index, self.error = index, error


class PileReader(Generic[Item, T]):
    """Apply ``read`` to each item in named daemon threads, at most ``slots`` results alive.

    Args:
        items: what to read, in order (pile indices, URLs...).
        read: the reading function; runs in the threads (several at once when ``threads > 1``).
        slots: how many results may be alive at once (being read, waiting or in use).
        threads: how many items may be read at the same time (at most ``slots``).
        name: the threads' name (shows in tracebacks and ``threading.enumerate()``).
    """

    def __init__(
        self, items: Sequence[Item], read: Callable[[Item], T], *, slots: int, threads: int = 1, name: str = "shardkit-reader"
    ) -> None:
        if slots < 1 or threads < 1:
            raise ValueError("slots and threads must be at least 1")
        self._items, self._read, self._slots = list(items), read, slots
        self._held = 0  # slots taken: being read, waiting in _ready, or with the consumer
        self._claimed = 0  # items handed to a thread so far
        self._wanted = 0  # the item the consumer gets next
        self._ready: dict[int, Any] = {}
        self._fatal: Failure | None = None
        self._stop = False
        self._cond = threading.Condition()
        count = min(threads, slots, max(1, len(self._items)))
        self._threads = [threading.Thread(target=self._run, name=name if count == 1 else f"{name}-{k}", daemon=True) for k in range(count)]
        for thread in self._threads:
            thread.start()

    def _claim(self) -> int | None:
        """The next item for this thread once a slot is free, or None when there is none left."""
        with self._cond:
            self._cond.wait_for(lambda: self._stop or self._claimed >= len(self._items) or self._held < self._slots)
            if self._stop or self._claimed >= len(self._items):
                return None
            self._held += 1
            self._claimed += 1
            return self._claimed - 1

    def _run(self) -> None:
        try:
            while (i := self._claim()) is not None:
                try:
                    result: Any = self._read(self._items[i])
                except BaseException as e:  # carried to the consumer, whatever it is
                    result = Failure(i, e)
                with self._cond:
                    self._ready[i] = result
                    self._cond.notify_all()
                del result  # else this frame keeps the last pile alive while it waits for a slot
        except BaseException as e:  # pragma: no cover - the loop itself never raises
            with self._cond:
                self._fatal = Failure(-1, e)
                self._cond.notify_all()

    def get(self) -> T | Failure | None:
        """The next result in order, a :class:`Failure` in its place, or None at the end."""
        with self._cond:
            if self._wanted >= len(self._items):
                return None
            self._cond.wait_for(lambda: self._wanted in self._ready or self._fatal is not None)
            result = self._ready.pop(self._wanted, self._fatal)
            self._wanted += 1
            return result

    def release(self) -> None:
        """The consumer dropped one result (or a Failure): a thread may read one more."""
        with self._cond:
            self._held -= 1
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the threads and wait for them (each may first finish its read). Idempotent."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join()
        with self._cond:
            self._ready.clear()  # the piles read ahead are freed now
