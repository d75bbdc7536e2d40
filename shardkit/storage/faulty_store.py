"""A store that fails on purpose: the n-th put, create, delete or read of another store raises, for tests of what a failure leaves.

store = FaultyStore(MemoryStore()).fail("put", nth=3)          # the third put raises a StorageError
store = FaultyStore(inner).fail("delete", nth=1, error=KeyboardInterrupt)
"""

from __future__ import annotations

import contextlib
import errno
import threading
from collections.abc import Iterator
from typing import IO

from shardkit.storage.local import Buffer
from shardkit.storage.paths import guard
from shardkit.storage.store import Check, Store, WrappingStore

# what a fault can be planted on: put (also put_stream, upload and link_in), put_if_absent (every
# conditional write: put_if_absent, put_if_unchanged, upload_if_absent), delete, read (every read)
OPERATIONS = ("put", "put_if_absent", "delete", "read")
# what the error says was being done, in the backends' words
_DOING = {"put": "write", "put_if_absent": "write", "delete": "remove", "read": "read"}


class FaultyStore(WrappingStore):
    """``inner`` with failures planted: :meth:`fail` names an operation and which call of it
    fails. The default failure is an I/O error (``EIO``) raised where the backend's own would
    be, so it reaches the caller as the :class:`~shardkit.errors.StorageError` naming the URL; a
    failing put leaves nothing behind, as an atomic put must. ``calls`` counts every operation.

    Example::

        store = FaultyStore(MemoryStore()).fail("put", nth=2)
        store.put("a", b"1")
        with pytest.raises(StorageError): store.put("b", b"2")
    """

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.calls = dict.fromkeys(OPERATIONS, 0)
        self._faults: dict[tuple[str, int], type[BaseException] | BaseException | None] = {}
        self._mutex = threading.Lock()

    def fail(self, operation: str, *, nth: int = 1, error: type[BaseException] | BaseException | None = None) -> FaultyStore:
        """Make call ``nth`` (counted from 1, from now on) of ``operation`` raise ``error``
        (None: ``OSError(EIO)``, seen as a StorageError); returns the store, for chaining."""
        if operation not in OPERATIONS:
            raise ValueError(f"operation: expected one of {', '.join(OPERATIONS)}, got {operation!r}")
        if nth < 1:
            raise ValueError(f"nth: expected 1 or more, got {nth}")
        with self._mutex:
            self._faults[(operation, self.calls[operation] + nth)] = error
        return self

    def _count(self, operation: str, name: str) -> None:
        with self._mutex:
            self.calls[operation] += 1
            key = (operation, self.calls[operation])
            if key not in self._faults:
                return
            error = self._faults.pop(key)
        if error is not None:
            raise error
        with guard(self.url(name), _DOING[operation]):
            raise OSError(errno.EIO, f"injected failure of {operation} call {key[1]}", self.url(name))

    def read(self, name: str) -> bytes:
        self._count("read", name)
        return self.inner.read(name)

    def read_range(self, name: str, start: int, end: int) -> bytes:
        self._count("read", name)
        return self.inner.read_range(name, start, end)

    def open_read(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        self._count("read", name)
        return self.inner.open_read(name)

    def read_whole(self, name: str, *, size: int | None = None) -> Buffer:
        self._count("read", name)
        return self.inner.read_whole(name, size=size)

    def read_checked(self, name: str, *, size: int, check: Check, first_check: Check | None = None) -> Buffer:
        self._count("read", name)
        return self.inner.read_checked(name, size=size, check=check, first_check=first_check)

    def download(self, name: str, local: str, *, size: int) -> bool:
        if not self.inner.download(name, local, size=size):
            return False
        self._count("read", name)  # a read that streamed into ``local`` and then failed
        return True

    def put(self, name: str, data: bytes, *, sync: bool = True) -> None:
        self._count("put", name)
        self.inner.put(name, data, sync=sync)

    @contextlib.contextmanager
    def put_stream(self, name: str, *, size: int | None = None, sync: bool = True) -> Iterator[IO[bytes]]:
        self._count("put", name)
        with self.inner.put_stream(name, size=size, sync=sync) as f:
            yield f

    def link_in(self, name: str, local: str, *, exclusive: bool = False) -> bool:
        self._count("put", name)
        return self.inner.link_in(name, local, exclusive=exclusive)

    def put_if_absent(self, name: str, data: bytes) -> bool:
        self._count("put_if_absent", name)
        return self.inner.put_if_absent(name, data)

    def upload(self, name: str, local: str) -> None:
        self._count("put", name)
        self.inner.upload(name, local)

    def put_if_unchanged(self, name: str, data: bytes, *, seen: str | None) -> bool:
        self._count("put_if_absent", name)
        return self.inner.put_if_unchanged(name, data, seen=seen)

    def upload_if_absent(self, name: str, local: str, *, name_is_mine: bool = False) -> bool:
        self._count("put_if_absent", name)
        return self.inner.upload_if_absent(name, local, name_is_mine=name_is_mine)

    def delete(self, name: str) -> None:
        self._count("delete", name)
        self.inner.delete(name)
