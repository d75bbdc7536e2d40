"""Raw fields left where they lie in local pile files: a DataLoader worker says where, the main process cuts.

A DataLoader worker reading a local, uncompressed pile has in memory exactly the bytes of a file
its main process can map too. So instead of copying a batch's values to the main process
(through the DataLoader's queue, or shared memory: :mod:`shardkit.loading.ring`), it sends each
raw field as :class:`Located` pieces: the pile's URL, the version of the file it read and
checked, and the byte bounds of each value. The main process cuts the values out of its own map
of the same file (:func:`cut`): ``bytes``, or for ``views=True`` read-only ``memoryview``
slices of the map, which copy nothing. No byte of a value crosses processes. A file whose
version is not the one the worker checked (rewritten in place in between) is refused by name.

    field = located_columns(url, version, shard.spans([4, 0, 2]))["bin"]    # in the worker
    cut(field.wire(), views=False)                                        # in the main process: [b"...", ...]
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from shardkit import storage
from shardkit.errors import CorruptShardError, DatasetNotFoundError
from shardkit.loading.source import Pile, Source, gone_file
from shardkit.tar import compression
from shardkit.tar.shard import Spans

# files the main process keeps mapped: at least MAPS (about the piles its workers read at once,
# and the next), more while they total under MAPPED_BYTES, never over MAPS_MOST (a descriptor
# each). A file mapped again costs its page faults in the main process, the DataLoader's bound:
# keeping a small dataset's piles mapped from one epoch to the next made later epochs of 12
# piles of 17 MB 1.08-1.18x faster on 2 cores.
MAPS = 8
MAPPED_BYTES = 1 << 30
MAPS_MOST = 128
# what a field travels as: its pieces, each (URL, version, start offsets, end offsets), offsets as
# int64 bytes, and its order (int64 bytes, or None: the pieces' values as they come)
Wire = tuple[list[tuple[str, str, bytes, bytes]], bytes | None]


class Located:
    """One raw field of a batch as pieces of pile files, each ``(url, version, buf, starts, ends)``:
    value ``j`` of a piece is ``buf[starts[j]:ends[j]]``. The field's values are the pieces'
    values one piece after another, or, with ``order``, value ``order[k]`` of that run in place
    ``k`` (a batch of piles mixed position by position: one piece a pile). It iterates as those
    values (read-only memoryviews, in the process that read the piles) wherever a list of values
    is wanted; :meth:`wire` is what travels instead.

    Example:
        field = Located([("data/pile-000003.tar", "7400-1733", buf, np.array([512]), np.array([900]))])
        list(field)          # [<memory at ...>]
    """

    __slots__ = ("order", "pieces")

    def __init__(self, pieces: list[tuple[str, str, Any, np.ndarray, np.ndarray]], order: np.ndarray | None = None) -> None:
        self.pieces, self.order = pieces, order

    def __len__(self) -> int:
        return sum(len(p[3]) for p in self.pieces)

    def __iter__(self) -> Iterator[memoryview]:
        values = self._values()
        return iter(values if self.order is None else reorder(values, self.order))

    def _values(self) -> list[memoryview]:
        out: list[memoryview] = []
        for _, _, buf, starts, ends in self.pieces:
            view = memoryview(buf).toreadonly()
            out += map(view.__getitem__, map(slice, starts.tolist(), ends.tolist()))
        return out

    def _ordered(self) -> np.ndarray:
        return np.arange(len(self), dtype=np.int64) if self.order is None else self.order

    def reordered(self, order: np.ndarray) -> Located:
        """The field whose value ``k`` is this one's value ``order[k]``."""
        return Located(self.pieces, self._ordered()[order])

    @staticmethod
    def concat(parts: Sequence[Located]) -> Located:
        pieces = [piece for part in parts for piece in part.pieces]
        if all(part.order is None for part in parts):
            return Located(pieces)
        offsets = np.cumsum([0] + [len(part) for part in parts[:-1]])
        return Located(pieces, np.concatenate([part._ordered() + at for part, at in zip(parts, offsets.tolist(), strict=True)]))

    def wire(self) -> Wire:
        """The pieces as they travel: the buffers stay behind."""
        pieces = [(url, version, starts.tobytes(), ends.tobytes()) for url, version, _, starts, ends in self.pieces]
        return pieces, None if self.order is None else self.order.astype(np.int64, copy=False).tobytes()


def reorder(values: list[Any], order: np.ndarray | Sequence[int]) -> list[Any]:
    """``[values[i] for i in order]``, in C."""
    at = order.tolist() if isinstance(order, np.ndarray) else list(order)
    if len(at) == 1:
        return [values[at[0]]]
    return list(operator.itemgetter(*at)(values)) if at else []


def version(pile: Pile | None) -> str | None:
    """The version of ``pile``'s file when a reader of it holds exactly the file's bytes (a
    plain pile of one file, in a store that maps files, as every process of this machine sees
    it), else None: its fields must travel as values."""
    if pile is None or pile.segments is not None:
        return None
    compressed = compression.from_name(pile.url) is not None if pile.info is None else pile.info.compression is not None
    store, name = storage.locate(pile.url)
    if compressed or not store.supports_mapping:
        return None
    return store.version(name)


def located_columns(url: str, version: str, spans: Spans) -> dict[str, Any]:
    """Columns as :meth:`~shardkit.tar.shard.Shard.columns` gives them, each field :class:`Located`
    in the file ``url`` at ``version``."""
    out: dict[str, Any] = {"__key__": spans.keys}
    for name, starts, ends in spans.fields:
        out[name] = Located([(url, version, spans.buf, starts, ends)])
    return out


class Vanished(DatasetNotFoundError):
    """A pile file the main process went to cut a batch's fields from is gone: removed after the
    DataLoader worker read it. ``url`` is the file; the DataLoader adds why, where its dataset's
    manifest says."""

    def __init__(self, message: str, url: str) -> None:
        super().__init__(message)
        self.url = url

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return type(self), (str(self), self.url)

    def explained(self, source: Source) -> Vanished:
        """This error with why the file is gone, where the manifest of its dataset in ``source`` says."""
        why = gone_file(source, self.url)
        return Vanished(str(self) if why is None else f"{self}: {why}", self.url)


class _Maps:
    """The files the main process has mapped, most recently used last (as many as :data:`MAPS`,
    :data:`MAPPED_BYTES` and :data:`MAPS_MOST` allow)."""

    def __init__(self) -> None:
        self._held: OrderedDict[str, tuple[str, storage.Buffer]] = OrderedDict()
        self._lock = threading.Lock()  # batches may be unpickled in more than one thread

    def get(self, url: str, version: str) -> storage.Buffer:
        with self._lock:
            held = self._held.get(url)
            if held is not None and held[0] == version:
                self._held.move_to_end(url)
                return held[1]
        store, name = storage.locate(url)
        try:
            buf = store.read_whole(name)
        except DatasetNotFoundError as e:
            raise Vanished(f"{e}, removed after a DataLoader worker read it", url) from e
        now = store.version(name)  # looked at after the map: a file replaced before it is caught
        if now != version:
            raise CorruptShardError(
                f"{url}: the file changed while the DataLoader read it: version {version} in the worker that checked it, "
                f"{now} here (replaced or rewritten: an overwrite of the dataset, or an edit by hand); a running loader's "
                "files must stay as they are: write a new dataset elsewhere, or append"
            )
        with self._lock:
            self._held[url] = (version, buf)
            self._held.move_to_end(url)
            while len(self._held) > MAPS_MOST or (len(self._held) > MAPS and self._bytes() > MAPPED_BYTES):
                self._held.popitem(last=False)  # a view still held keeps its map alive
        return buf

    def _bytes(self) -> int:
        return sum(len(buf) for _, buf in self._held.values())


_MAPS = _Maps()


def cut(wire: Wire, views: bool) -> list[bytes] | list[memoryview]:
    """The values of a :class:`Located` field from its :meth:`~Located.wire`, cut from this
    process's maps of the same files: ``bytes``, or read-only memoryviews of the maps (``views``).

    Raises:
        CorruptShardError: a file is not the version the worker read (named).
    """
    pieces, order = wire
    out: list[Any] = []
    for url, version, starts, ends in pieces:
        buf = _MAPS.get(url, version)
        source = memoryview(buf).toreadonly() if views else buf
        out += map(
            source.__getitem__, map(slice, np.frombuffer(starts, dtype=np.int64).tolist(), np.frombuffer(ends, dtype=np.int64).tolist())
        )
    return out if order is None else reorder(out, np.frombuffer(order, dtype=np.int64))
