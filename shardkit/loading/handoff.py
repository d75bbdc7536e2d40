"""Hand a DataLoader worker's batches to the main process as a few large pieces.

A batch of raw fields is a dict of lists of ``bytes``. Handed over as it is, the DataLoader's
``default_convert`` walks every value in the worker, the pickler writes each as an object of
its own (through many small frames), and the main process rebuilds them one by one: about
7 us a sample in the worker at ~5 KB samples, several times what reading them cost. Here a
worker joins each list of byte strings into one (two large copies in C), and the main process
slices it back into the same values: ``bytes``, or for a loader with ``views=True``, read-only
``memoryview`` slices of the one received buffer (no copy at all). The rest of the item is what
``default_convert`` makes of it (numpy arrays become tensors, which torch passes in shared
memory), so the main process receives exactly what it would have without the packing. The
fields of a local plain pile's raw batches are not sent at all, only where they lie
(:mod:`shardkit.loading.located`): the main process cuts them from its own map of the file. There, :func:`taken` takes the
DataLoader's items without the label PyTorch puts around each for its profiler, unless one runs.

    item = Handoff(batch, views=False)           # what a worker yields
    assert pickle.loads(ForkingPickler.dumps(item)) == default_convert(batch)   # in the main process
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.autograd import _profiler_enabled
from torch.utils.data import default_convert, get_worker_info

from shardkit.errors import ConfigError
from shardkit.loading.located import Located, cut
from shardkit.loading.ring import Writer, find

# how a field travels: as it is, its byte strings joined into one, left in shared memory, left
# in its pile files (only where it lies is sent: shardkit.loading.located), or with its
# memoryviews as bytes (a memoryview cannot be pickled), made views again in the main process
_AS_IS, _JOINED, _SHARED, _LOCATED, _VIEWS = 0, 1, 2, 3, 4
# values default_convert leaves as they are: a list of these needs no walk
_PLAIN = (str, bytes, int, float, bool, type(None))


class Handoff:
    """An item a DataLoader worker yields; it pickles packed and unpickles as the plain item.

    Args:
        item: the dataset's item (a batch dict; anything else is sent as ``default_convert`` makes it).
        views: the main process gets joined fields as read-only memoryviews instead of bytes.

    Example:
        yield Handoff(batch, views=False)        # inside IterableDataset.__iter__, in a worker
    """

    __slots__ = ("borrowed", "item", "views", "writer")

    def __init__(self, item: Any, views: bool, writer: Writer | None = None, borrowed: bool = False) -> None:
        self.item, self.views, self.writer, self.borrowed = item, views, writer, borrowed

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        item = self.item
        if type(item) is not dict:
            return _as_is, (default_convert(item),)
        names, values = list(item), list(item.values())
        flags = [_byte_strings(v, trusted=self.borrowed) for v in values]
        if self.borrowed:  # the loader's views stand for copies: those of a list sent as it is become bytes
            values = [v if flag else _copied(v) for v, flag in zip(values, flags, strict=True)]
        if self.writer is not None and any(flags):
            shared = _shared(names, values, flags, self.writer, self.views)
            if shared is not None:
                return shared
        return _unpack, (names, [_pack(v, flag) for v, flag in zip(values, flags, strict=True)], self.views)


def _copied(value: Any) -> Any:
    """``value`` with the memoryviews of a list copied into bytes."""
    if type(value) is list and memoryview in set(map(type, value)):
        return [bytes(v) if type(v) is memoryview else v for v in value]
    return value


def _ends(value: list[Any]) -> np.ndarray:
    return np.cumsum(np.fromiter(map(len, value), dtype=np.int64, count=len(value)))


def _shared(names: list[str], values: list[Any], flags: list[bool], writer: Writer, views: bool) -> tuple[Any, tuple[Any, ...]] | None:
    """How an item travels with its byte strings (the values ``flags`` marks) in the worker's
    shared region, or None when they find no room there now."""
    strings = [v for v, flag in zip(values, flags, strict=True) if flag]
    ends = [_ends(v) for v in strings]
    spot = writer.put(strings, sum(int(e[-1]) for e in ends))
    if spot is None:
        return None
    seq, at = spot
    fields: list[tuple[int, Any]] = []
    each = iter(ends)
    for value, flag in zip(values, flags, strict=True):
        if flag:
            e = next(each)
            fields.append((_SHARED, (at, e.tobytes())))
            at += int(e[-1])
        else:
            fields.append(_pack(value, False))
    return _unpack_shared, (writer.ring.token, writer.worker, seq, names, fields, views)


def _byte_strings(value: Any, trusted: bool = False) -> bool:
    """A non-empty list of bytes, or of one-dimensional byte memoryviews (``trusted``: any
    memoryviews are the loader's, which are)."""
    if type(value) is not list or not value:
        return False
    kinds = set(map(type, value))
    if kinds != {memoryview}:
        return kinds == {bytes}
    return trusted or {(v.format, v.ndim) for v in value} == {("B", 1)}


def _plain(value: Any) -> bool:
    """A list default_convert would copy as it is (so it need not walk it)."""
    return type(value) is list and set(map(type, value)).issubset(_PLAIN)


def _has_views(value: Any) -> bool:
    """A memoryview, or a list of memoryviews and plain values (None where a sample lacks the
    field): default_convert would make each memoryview a list of ints."""
    if type(value) is memoryview:
        return True
    return type(value) is list and memoryview in (kinds := set(map(type, value))) and kinds.issubset({*_PLAIN, memoryview})


def _pack(value: Any, strings: bool) -> tuple[int, Any]:
    """How one field travels through the queue: byte strings (``strings``) joined, with their
    end offsets; the rest as converted."""
    if strings:
        ends = _ends(value)
        return _JOINED, (b"".join(value), ends.tobytes())
    if type(value) is Located:
        return _LOCATED, value.wire()
    if _has_views(value):
        return _VIEWS, bytes(value) if type(value) is memoryview else _copied(value)
    return _AS_IS, value if _plain(value) else default_convert(value)


def convert(item: Any) -> Any:
    """The DataLoader's ``collate_fn`` for shardkit's items: ``default_convert``, except that
    memoryviews, alone or in lists (with None where a sample lacks the field), and lists of byte
    strings stay as they are (``default_convert`` would make each memoryview a list of ints), and
    a worker's :class:`Handoff` passes through to be pickled."""
    if type(item) is Handoff or type(item) is not dict:
        return item if type(item) is Handoff else default_convert(item)
    return {
        name: value if _byte_strings(value) or _plain(value) or _has_views(value) else default_convert(value)
        for name, value in item.items()
    }


def _as_is(item: Any) -> Any:
    return item


def _field(kind: int, payload: Any, views: bool) -> Any:
    """A field that travelled as it is, located or with its memoryviews as bytes, as the main process yields it."""
    if kind == _LOCATED:
        return cut(payload, views)
    if kind == _VIEWS and views:
        return memoryview(payload) if type(payload) is bytes else [memoryview(v) if type(v) is bytes else v for v in payload]
    return payload


def _unpack(names: list[str], fields: list[tuple[int, Any]], views: bool) -> dict[str, Any]:
    """The batch again, in the main process: each joined field cut back into its values."""
    out: dict[str, Any] = {}
    for name, (kind, payload) in zip(names, fields, strict=True):
        if kind not in (_JOINED, _SHARED):
            out[name] = _field(kind, payload, views)
            continue
        joined, ends_bytes = payload
        ends = np.frombuffer(ends_bytes, dtype=np.int64).tolist()
        whole = memoryview(joined) if views else joined
        out[name] = [whole[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    return out


def _unpack_shared(token: str, worker: int, seq: int, names: list[str], fields: list[tuple[int, Any]], views: bool) -> dict[str, Any]:
    """The batch again, in the main process, its byte strings copied out of worker ``worker``'s
    shared region (which is then free for the worker's next batches)."""
    ring = find(token)
    out: dict[str, Any] = {}
    try:
        for name, (kind, payload) in zip(names, fields, strict=True):
            if kind not in (_JOINED, _SHARED):
                out[name] = _field(kind, payload, views)
                continue
            at, ends_bytes = payload
            ends = np.frombuffer(ends_bytes, dtype=np.int64)
            if views:
                whole = memoryview(ring.read(worker, at, int(ends[-1])))
                stops = ends.tolist()
                out[name] = [whole[a:b] for a, b in zip([0, *stops[:-1]], stops, strict=True)]
            else:
                out[name] = ring.cut(worker, at, ends)
    finally:
        ring.done(worker, seq)
    return out


def taken(batches: Any) -> Iterator[Any]:
    """The items of a DataLoader's iterator ``batches``, each taken as its ``__next__`` takes it,
    less the profiler label it puts around each one while no profiler runs: that label costs the
    main process 15-70 µs an item, a tenth of what it spends on a batch of raw fields. Whenever a
    profiler runs, the iterator restarts, or the DataLoader's length would be passed (torch then
    warns), the item comes from ``__next__`` itself; so does every item of an iterator without
    those internals."""
    if not all(hasattr(batches, name) for name in ("_next_data", "_num_yielded", "_sampler_iter", "_IterableDataset_len_called")):
        yield from batches
        return
    step = batches._next_data
    while True:
        told = batches._IterableDataset_len_called
        try:
            if _profiler_enabled() or batches._sampler_iter is None or (told is not None and batches._num_yielded >= told):
                item = next(batches)
            else:
                item = step()
                batches._num_yielded += 1
        except StopIteration:
            return
        yield item


class SendableViews:
    """A custom ``collate_fn`` of a DataLoader over a dataset of ``views=True``: in a worker, a
    memoryview left in what it returns is a ``ConfigError`` naming where. The worker's queue
    pickles items in a thread of its own and drops one it cannot pickle, so the DataLoader would
    wait for that item forever (or until its ``timeout``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, item: Any) -> Any:
        out = self.inner(item)
        if get_worker_info() is not None and (where := _view_in(out)) is not None:
            raise ConfigError(
                f"collate_fn returned a memoryview at {where or 'the top'}, which a DataLoader worker cannot send to the main process: "
                "copy it there (bytes(view), a tensor), or read with views=False"
            )
        return out


def _view_in(value: Any, where: str = "") -> str | None:
    """Where a memoryview lies in ``value`` (``"['bin'][0]"``), through dicts, lists and tuples; None if nowhere."""
    if type(value) is memoryview:
        return where
    parts = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, part in parts:
        if (found := _view_in(part, f"{where}[{key!r}]")) is not None:
            return found
    return None
