"""Memory that decoded piles are written into, given out again once nothing refers to the pile before.

A compressed pile is decoded into memory of its own. Memory the process has not touched yet costs
more than the decoding: the kernel faults in and zeroes every page on first touch (100 MB of lz4
here: 36 ms into memory already touched, 95 ms into new memory), and glibc hands any block over
32 MB back to the system when it is freed, so the next pile pays it all again. A :class:`Scratch`
keeps the few anonymous maps a loader's piles were decoded into and gives one out again, resized,
once nothing else refers to it: not the pile, not a field's ``memoryview``, not a traceback. Where
that cannot be told (a Python other than CPython), it gives none and decoders allocate as before.

    scratch = Scratch()
    scratch.room(4)                   # keep up to four maps (the piles alive at once)
    buf = scratch.take(size)          # a writable map of exactly ``size`` bytes, or None
    fill(buf)                         # all of it, before anyone else sees it
"""

from __future__ import annotations

import mmap
import sys
import sysconfig
import threading
from typing import Any

# a map's references when only the list of maps holds it, counted the way :meth:`Scratch.take`
# counts them (the list's, and the call's argument); None where a count cannot be trusted
_ALONE: int | None = None


def _refs(maps: list[Any], i: int) -> int:
    return sys.getrefcount(maps[i])


if sys.implementation.name == "cpython" and not sysconfig.get_config_var("Py_GIL_DISABLED"):
    _ALONE = _refs([object()], 0)


class Scratch:
    """Anonymous maps for decoded piles, each given out again once nothing refers to it.

    The maps are private and anonymous, of small pages (advised to use huge pages, a first epoch
    took twice as long here while the kernel gathered them). ``keep`` bounds how many are kept;
    past it, a map is made and let go as usual. A kept map stays allocated while the scratch
    keeps it: a loader keeps at most as many as it holds piles at once, until it is closed.
    Thread-safe; a copy (or a pickled one) starts empty.

    Example:
        scratch = Scratch(keep=3)
        buf = scratch.take(1 << 20)   # fill every byte, then hand it on
    """

    def __init__(self, keep: int = 2) -> None:
        self._keep = keep
        self._maps: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def room(self, keep: int) -> None:
        """Keep up to ``keep`` maps from now on; the ones over it are let go now (those still
        referred to live on with whatever refers to them)."""
        with self._lock:
            self._keep = max(0, keep)
            del self._maps[self._keep :]

    def take(self, size: int) -> mmap.mmap | None:
        """A writable map of exactly ``size`` bytes, whose contents are left from its last use: the
        caller writes every byte before anyone else sees it. None for no bytes, where no map
        could ever be given again (it would only be held, never reused) or no anonymous map can
        be made: the caller then allocates as it would without one."""
        if size <= 0 or _ALONE is None:
            return None
        with self._lock:
            found = self._free(size)
            if found is not None:
                return found
            made = _new(size)
            if made is not None and len(self._maps) < self._keep:
                self._maps.append(made)
            return made

    def __len__(self) -> int:
        """How many maps are kept."""
        return len(self._maps)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Scratch, (self._keep,))

    def __copy__(self) -> Scratch:
        return Scratch(self._keep)

    def _free(self, size: int) -> mmap.mmap | None:
        """A kept map no one else refers to, resized to ``size``."""
        i = 0
        while i < len(self._maps):
            if _refs(self._maps, i) != _ALONE:
                i += 1
                continue
            m = self._maps[i]
            try:
                if len(m) != size:
                    m.resize(size)  # mremap: pages kept up to the smaller size, no copy
            except (BufferError, OSError, ValueError, SystemError):  # cannot be resized here: made anew
                del self._maps[i], m
                continue
            return m
        return None


def _new(size: int) -> mmap.mmap | None:
    try:
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    except (OSError, ValueError, AttributeError):  # pragma: no cover - no anonymous maps here
        return None
