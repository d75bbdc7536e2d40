"""Work a thread that waits for it can share: a reader thread offers the parts of what it is doing,
and the thread waiting for its result does some of them instead of sleeping.

The loader's consumer waits for a pile whenever decoding is slower than handing samples out (an
lz4 pile on 2 cores). A :class:`Board` is where one result's reader offers its work: the prefetch
thread puts a board in its context for each pile it reads (:data:`BOARD`); the decoder offers
a step (decode one block, say whether there was one) and takes it back when done; the consumer,
waiting for that pile, calls :meth:`Board.help` until there is nothing left to do. Each step
must be safe to run on any thread and must release the GIL for its work, or helping gains nothing.

    board = Board(wake=notify_the_waiter)
    token = BOARD.set(board)           # in the reader thread, around one read
    ...
    board.offer(job.step)              # in the decoder: the waiter may now call board.help()
    while job.step(): pass             # the decoder works through what is left
    board.withdraw()
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar


class Board:
    """Where one read's work is offered to the thread waiting for it.

    Args:
        wake: called once work is offered (without the board's lock): wakes the waiting thread.
    """

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._step: Callable[[], bool] | None = None
        self._lock = threading.Lock()

    def offer(self, step: Callable[[], bool]) -> None:
        """Offer ``step`` (does one part of the work; False when none was left) until :meth:`withdraw`."""
        with self._lock:
            self._step = step
        self._wake()

    def withdraw(self) -> None:
        """Nothing more is offered; a step already begun on another thread runs to its end."""
        with self._lock:
            self._step = None

    def offered(self) -> bool:
        """Whether work is on offer now (it may be gone by the time :meth:`help` runs)."""
        return self._step is not None

    def help(self) -> bool:
        """Do one part of the offered work; False when there was none (nothing offered, or all of it taken)."""
        with self._lock:
            step = self._step
        if step is None:
            return False
        if step():
            return True
        with self._lock:  # all of it taken: the waiter goes back to waiting (unless a next job is on offer already)
            if self._step is step:
                self._step = None
        return False


# the board of the read this thread is doing, set by the prefetch thread around each read
BOARD: ContextVar[Board | None] = ContextVar("shardkit_assist_board", default=None)
