"""Read piles ahead of the consumer in background threads, in order, never holding more than allowed.

Invariant: the piles held by the threads, the finished results and the consumer together never
exceed ``slots``. A thread takes a slot before it starts reading a pile and the consumer gives it
back when it drops the pile, so a double buffer is ``slots=2``. Items are claimed in order, so the
one the consumer waits for is always being read or next to be claimed; with ``readers`` threads
up to that many piles are read at once (an object store, where one request is a fraction of
what the connection and the server allow), and results are still handed out in order. Errors
are carried to the consumer in their place; the end is explicit; ``close()`` stops and joins.
A consumer waiting for a pile does the parts of its read the reader offers (an lz4 pile's blocks,
see :mod:`shardkit.assist`) instead of sleeping.

    reader = PileReader(["a.tar", "b.tar"], read=lambda url: read_pile(url), slots=2)
    index, pile = reader.get()   # pile 0, or raises what reading it raised
    reader.release()             # the consumer let pile 0 go; the thread may read one more
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from shardkit.assist import BOARD, Board
from shardkit.errors import Failure

T = TypeVar("T")
Item = TypeVar("Item")

# what the piles read ahead of a remote loader may take when it chooses how many (prefetch=None)
READ_AHEAD_BYTES = 256 << 20


def read_ahead(
    pile_bytes: int | None, *, remote: bool, concurrency: int, least_range: int, budget: int = READ_AHEAD_BYTES, decoded: bool = False
) -> int:
    """How many piles a loader reads ahead when not told (``prefetch=None``).

    One for local piles (a map is instant) and for piles of unknown size; two for local piles
    that are ``decoded`` (compressed: decoding is the read's bound, and two threads decode two
    piles at once) when two fit in ``budget``. From an object store, enough piles that their
    requests (``pile_bytes / least_range`` ranges each, at least one) keep ``concurrency`` in
    flight, within ``budget`` bytes of piles read ahead: small piles are read several at once in
    one request each, large ones one at a time in ranges.
    """
    if not remote:
        return 2 if decoded and pile_bytes and 2 * pile_bytes <= budget else 1
    if not pile_bytes:
        return 1
    per_pile = max(1, min(concurrency, pile_bytes // max(1, least_range)))
    return max(1, min(math.ceil(concurrency / per_pile), budget // pile_bytes))


class PileReader(Generic[Item, T]):
    """Apply ``read`` to each item in order in named daemon threads, at most ``slots`` ahead.

    Args:
        items: what to read, in order (pile indices, URLs...).
        read: the reading function; runs in the threads.
        slots: how many results may be alive at once (held by a thread, finished or in use).
        readers: threads reading at once (at most ``slots``); results come out in order all the same.
        name: the threads' name (shows in tracebacks and ``threading.enumerate()``).
        paused: read nothing until :meth:`resume` (or the first :meth:`get`): the consumer has
            something more urgent to do with the CPU first.
    """

    def __init__(
        self,
        items: Sequence[Item],
        read: Callable[[Item], T],
        *,
        slots: int,
        readers: int = 1,
        name: str = "shardkit-reader",
        paused: bool = False,
    ) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        if readers < 1:
            raise ValueError("readers must be at least 1")
        self._items, self._read, self._slots = list(items), read, slots
        self._held = 0
        self._claimed = 0  # items handed to a thread so far
        self._delivered = 0  # items handed to the consumer so far
        self._results: dict[int, Any] = {}
        self._boards: dict[int, Board] = {}  # the reads in progress: where each offers its work to the consumer
        # The consumer's side uses C-level primitives only, so a Ctrl-C in it cannot leave a lock
        # held (a Python-level Condition's enter, exit or wait can): the state's lock in ``with``
        # blocks, and a queue of notices that a result or some work arrived. The threads wait for
        # a slot on a condition of the same lock, and look again every 0.1 s in case a notice of
        # the consumer's was cut short.
        self._lock = threading.Lock()
        self._slot = threading.Condition(self._lock)
        self._arrived: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._stop = False
        self._paused = paused
        count = max(1, min(readers, slots, len(self._items)))
        self._threads = [threading.Thread(target=self._run, name=name if count == 1 else f"{name}-{k}", daemon=True) for k in range(count)]
        try:
            for thread in self._threads:
                thread.start()
        except BaseException:  # a Ctrl-C between two starts: no caller gets this reader to close it
            self.close()
            raise

    def _run(self) -> None:
        while True:
            with self._lock:
                while not (self._stop or (not self._paused and (self._claimed >= len(self._items) or self._held < self._slots))):
                    self._slot.wait(0.1)
                if self._stop or self._claimed >= len(self._items):
                    return
                i = self._claimed
                self._claimed += 1
                self._held += 1
            result: Any = self._read_one(i)
            with self._lock:
                if not self._stop:
                    self._results[i] = result
            self._arrived.put(None)
            del result  # else this frame keeps the last pile alive while it waits for a slot

    def get(self) -> T | Failure | None:
        """The next result in order, a :class:`Failure` in its place, or None at the end."""
        self.resume()
        while True:
            with self._lock:
                i = self._delivered
                if i >= len(self._items) or self._stop:
                    return None
                if i in self._results:
                    self._delivered += 1
                    return self._results.pop(i)
                board = self._boards.get(i)
            if board is not None and board.offered():
                while board.help():  # lend a hand with the read it waits for (an lz4 pile's blocks)
                    pass
                continue
            with contextlib.suppress(queue.Empty):
                self._arrived.get(timeout=0.1)
                while True:  # the notices queued meanwhile: the state is looked at again anyway
                    self._arrived.get_nowait()

    def _read_one(self, i: int) -> Any:
        """Item ``i`` read, or its :class:`Failure` (whatever was raised), its work offered on a
        board the consumer may help with while it waits for it."""
        try:
            board = Board(self._wake)
            with self._lock:
                self._boards[i] = board
            token = BOARD.set(board)
            try:
                return self._read(self._items[i])
            finally:
                BOARD.reset(token)
        except BaseException as e:  # carried to the consumer, whatever it is
            return Failure.capture(e, index=i)
        finally:
            with self._lock:
                self._boards.pop(i, None)

    def _wake(self) -> None:
        self._arrived.put(None)

    def resume(self) -> None:
        """Start reading, when made ``paused`` (a no-op otherwise)."""
        if self._paused:
            with self._lock:
                self._paused = False
                self._slot.notify_all()

    def ready(self) -> bool:
        """Whether :meth:`get` would return at once (the next result is in, or there is none)."""
        with self._lock:
            return self._stop or self._delivered >= len(self._items) or self._delivered in self._results

    def release(self) -> None:
        """The consumer dropped one result (or a Failure): a thread may read one more."""
        with self._lock:
            self._held -= 1
            self._slot.notify_all()

    def close(self) -> None:
        """Stop the threads and wait for them (each may first finish the read in progress). Idempotent."""
        with self._lock:
            self._stop = True
            self._slot.notify_all()
        self._arrived.put(None)
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join()
        with self._lock:
            self._results.clear()  # the piles are freed now
