"""Hand a DataLoader worker's batches to the main process as a few large pieces.

A batch of raw fields is a dict of lists of ``bytes``. Handed over as it is, the DataLoader's
``default_convert`` walks every value in the worker, the pickler writes each as an object of
its own (through many small frames), and the main process rebuilds them one by one: about
7 us a sample in the worker at ~5 KB samples, several times what reading them cost. Here a
worker joins each list of byte strings into one (two large copies in C), and the main process
slices it back into the same values: ``bytes``, or for a loader with ``views=True``, read-only
``memoryview`` slices of the one received buffer (no copy at all). The rest of the item is what
``default_convert`` makes of it (numpy arrays become tensors, which torch passes in shared
memory), so the main process receives exactly what it would have without the packing.

    item = Handoff(batch, views=False)           # what a worker yields
    assert pickle.loads(ForkingPickler.dumps(item)) == default_convert(batch)   # in the main process
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.utils.data import default_convert

# how a field travels: as it is, or its byte strings joined into one
_AS_IS, _JOINED = 0, 1
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

    __slots__ = ("item", "views")

    def __init__(self, item: Any, views: bool) -> None:
        self.item, self.views = item, views

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        item = self.item
        if type(item) is not dict:
            return _as_is, (default_convert(item),)
        return _unpack, (list(item), [_pack(value) for value in item.values()], self.views)


def _byte_strings(value: Any) -> bool:
    """A non-empty list of bytes, or of one-dimensional byte memoryviews."""
    if type(value) is not list or not value:
        return False
    kinds = set(map(type, value))
    return kinds == {bytes} or (kinds == {memoryview} and all(v.format == "B" and v.ndim == 1 for v in value))


def _plain(value: Any) -> bool:
    """A list default_convert would copy as it is (so it need not walk it)."""
    return type(value) is list and set(map(type, value)).issubset(_PLAIN)


def _pack(value: Any) -> tuple[int, Any]:
    """How one field travels: byte strings joined, with their end offsets; the rest as converted."""
    if _byte_strings(value):
        ends = np.cumsum(np.fromiter(map(len, value), dtype=np.int64, count=len(value)))
        return _JOINED, (b"".join(value), ends.tobytes())
    return _AS_IS, value if _plain(value) else default_convert(value)


def convert(item: Any) -> Any:
    """The DataLoader's ``collate_fn`` for shardkit's items: ``default_convert``, except that lists
    of byte strings and of memoryviews stay as they are (``default_convert`` would make each
    memoryview a list of ints), and a worker's :class:`Handoff` passes through to be pickled."""
    if type(item) is Handoff or type(item) is not dict:
        return item if type(item) is Handoff else default_convert(item)
    return {name: value if _byte_strings(value) or _plain(value) else default_convert(value) for name, value in item.items()}


def _as_is(item: Any) -> Any:
    return item


def _unpack(names: list[str], fields: list[tuple[int, Any]], views: bool) -> dict[str, Any]:
    """The batch again, in the main process: each joined field cut back into its values."""
    out: dict[str, Any] = {}
    for name, (kind, payload) in zip(names, fields, strict=True):
        if kind == _AS_IS:
            out[name] = payload
            continue
        joined, ends_bytes = payload
        ends = np.frombuffer(ends_bytes, dtype=np.int64).tolist()
        whole = memoryview(joined) if views else joined
        out[name] = [whole[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    return out
