"""What this process knows of each pile it read before, kept so that reading it again skips its
header scan, and its checksum while its file is unchanged.

A loader reads every pile again each epoch. Its bytes are checked against the manifest's CRC-32
the first time, and again each time its file may have changed since: a local file whose
:meth:`~shardkit.storage.store.Store.lasting_version` (size, times, inode) is the one whose bytes
passed is not checksummed again (nor, when compressed, the tar inside). Once the bytes match, the
pile's :class:`~shardkit.tar.shard.Layout` (keys, members, byte bounds: everything the header
scan and the index give) is the one made the last time: the pile reader then only maps the
file, and the consumer does not index it again. Layouts
are kept per process, under the pile's URL and manifest entry, for piles read with ``verify=True``
only (without the checksum, the bytes could be others), the least recently used dropped first
past :data:`BUDGET` (about 150 bytes a sample of two fields: 64 MiB holds the index of about
400,000 samples). A DataLoader worker keeps its own.

A layout is kept from a pile's second read on: a pile read once (one epoch, ``verify``, a
re-pile) is likely never read again, and keeping its index would only cost that read memory it
cannot reuse (fresh pages, faulted in: about 5% of a first epoch of ~5 KB samples).

    layout = LAYOUTS.get(url, info)        # in the pile reader, before the header scan
    LAYOUTS.put(url, info, shard.layout)   # once a pile is indexed and its count checked: kept from its second read
    if LAYOUTS.checked(url, info) != version: ...   # checksum the bytes, then LAYOUTS.passed(url, info, version)
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

from shardkit.manifest import PileInfo
from shardkit.tar.shard import Layout

BUDGET = 64 << 20
SEEN = 1 << 16  # piles remembered as read once (a few MB); forgotten all at once past it


class Layouts:
    """Layouts of checked piles by ``(url, manifest entry)``, at most about ``budget`` bytes of them."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._kept: OrderedDict[tuple[str, PileInfo], Layout] = OrderedDict()
        self._bytes = 0
        self._seen: set[tuple[str, PileInfo]] = set()  # read once: kept when read again
        self._passed: dict[tuple[str, PileInfo], str] = {}  # the file's lasting version whose bytes passed the checksum
        self._lock = threading.Lock()

    def checked(self, url: str, info: PileInfo) -> str | None:
        """The lasting version of ``url``'s file whose bytes passed the checksum under ``info``, if any."""
        with self._lock:
            return self._passed.get((url, info))

    def passed(self, url: str, info: PileInfo, version: str) -> None:
        """Remember that ``url``'s bytes at lasting version ``version`` match ``info``'s checksum."""
        with self._lock:
            if len(self._passed) >= SEEN:
                self._passed.clear()
            self._passed[url, info] = version

    def get(self, url: str, info: PileInfo) -> Layout | None:
        with self._lock:
            layout = self._kept.get((url, info))
            if layout is not None:
                self._kept.move_to_end((url, info))
            return layout

    def put(self, url: str, info: PileInfo, layout: Layout) -> None:
        """Keep ``layout``, made from a checked read of ``url`` under ``info``, if that pile was read before."""
        size = layout.nbytes
        if size > self.budget:
            return
        with self._lock:
            if (url, info) not in self._seen:
                if len(self._seen) >= SEEN:
                    self._seen.clear()
                self._seen.add((url, info))
                return
            old = self._kept.pop((url, info), None)
            self._bytes -= 0 if old is None else old.nbytes
            self._kept[url, info] = layout
            self._bytes += size
            while self._bytes > self.budget:
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= dropped.nbytes

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._seen.clear()
            self._passed.clear()
            self._bytes = 0

    def _after_fork(self) -> None:
        # a thread of the parent may have held the lock when it forked: the child starts afresh
        self._lock = threading.Lock()


LAYOUTS = Layouts(BUDGET)
os.register_at_fork(after_in_child=LAYOUTS._after_fork)
