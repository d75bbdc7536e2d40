"""A store held in this process's memory: what tests run a dataset's life in, in milliseconds.

store = MemoryStore()                       # its root is a fresh ``memory-store://<id>`` URL
store.put("shardkit.json", data)
mount(store)                                # URLs under store.root now reach it (see stores)
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import threading
import uuid
import zlib

from shardkit.storage.paths import guard
from shardkit.storage.store import Entry, Store, held

SCHEME = "memory-store"


class MemoryStore(Store):
    """Files as bytes in a dict, safe to share between threads. Every write is atomic (a name
    points to whole bytes or to none), :meth:`put_if_absent` is atomic, :meth:`lock` holds a
    lock among the threads of this process. Directories are not kept: a name with a ``/`` is
    one file, listed by :meth:`list` as the part before the first ``/``.

    Example::

        store = MemoryStore()
        assert store.put_if_absent("a", b"1") and not store.put_if_absent("a", b"2")
        assert store.read("a") == b"1"
    """

    supports_put_if_absent = True
    supports_locks = True
    supports_mapping = True  # a read is the stored bytes themselves: no copy, never torn

    def __init__(self, root: str | None = None) -> None:
        super().__init__(root or f"{SCHEME}://{uuid.uuid4().hex[:12]}")
        self._files: dict[str, tuple[bytes, datetime.datetime]] = {}
        self._mutex = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._prefix = ""

    def sub(self, path: str) -> MemoryStore:
        """The store of the directory ``path`` (``"a/b"``) under this one: the same files, seen
        from there."""
        view = object.__new__(MemoryStore)
        Store.__init__(view, self.url(path.strip("/")))
        view._files, view._mutex, view._locks = self._files, self._mutex, self._locks
        view._prefix = self._prefix + path.strip("/") + "/"
        return view

    def _get(self, name: str) -> bytes:
        with self._mutex:
            found = self._files.get(self._prefix + name)
        if found is None:
            with guard(self.url(name), "read"):
                raise FileNotFoundError(errno.ENOENT, "No such file", self.url(name))
        return found[0]

    def read(self, name: str) -> bytes:
        return self._get(name)

    def read_range(self, name: str, start: int, end: int) -> bytes:
        return self._get(name)[start:end]

    def size(self, name: str) -> int:
        return len(self._get(name))

    def exists(self, name: str) -> bool:
        with self._mutex:
            return self._prefix + name in self._files

    def is_dir(self, name: str) -> bool:
        under = self._prefix + (name.rstrip("/") + "/" if name else "")
        with self._mutex:
            return any(key.startswith(under) for key in self._files)

    def version(self, name: str) -> str | None:
        with self._mutex:
            found = self._files.get(self._prefix + name)
        return None if found is None else _version(*found)

    def _below(self, *, missing_ok: bool) -> dict[str, tuple[bytes, datetime.datetime]]:
        """The files under this store's root, by their names relative to it."""
        n = len(self._prefix)
        with self._mutex:
            found = {key[n:]: value for key, value in self._files.items() if key.startswith(self._prefix)}
        if not found and self._prefix and not missing_ok:
            with guard(self.root, "list the directory"):
                raise FileNotFoundError(errno.ENOENT, "No such directory", self.root)
        return found

    def entries(self, *, missing_ok: bool = False) -> list[Entry]:
        files = self._below(missing_ok=missing_ok)
        return [Entry(name, len(data), when) for name, (data, when) in sorted(files.items()) if "/" not in name]

    def list(self, *, missing_ok: bool = False) -> list[str]:
        return sorted({name.split("/", 1)[0] for name in self._below(missing_ok=missing_ok)})

    def put(self, name: str, data: bytes, *, sync: bool = True) -> None:
        now = datetime.datetime.now(datetime.timezone.utc)
        with self._mutex:
            self._files[self._prefix + name] = (bytes(data), now)

    def put_if_absent(self, name: str, data: bytes) -> bool:
        return self.put_if_unchanged(name, data, seen=None)

    def put_if_unchanged(self, name: str, data: bytes, *, seen: str | None) -> bool:
        now = datetime.datetime.now(datetime.timezone.utc)
        with self._mutex:
            found = self._files.get(self._prefix + name)
            if (None if found is None else _version(*found)) != seen:
                return False
            self._files[self._prefix + name] = (bytes(data), now)
            return True

    def delete(self, name: str) -> None:
        with self._mutex:
            self._files.pop(self._prefix + name, None)

    def lock(self, name: str, *, wait: bool = True, holder: bytes | None = None) -> contextlib.AbstractContextManager[bool]:
        with self._mutex:
            lock = self._locks.setdefault(self._prefix + name, threading.Lock())
        acquired = lock.acquire(blocking=wait)
        if acquired and holder is not None:
            self.put(name, holder)

        def release() -> None:
            if holder is not None:
                self.delete(name)
            lock.release()

        return held(acquired, release)


def _version(data: bytes, when: datetime.datetime) -> str:
    """A file's version: its size and write time (to the microsecond), and a digest of its bytes
    (two writes within one microsecond have different versions unless they wrote the same)."""
    return f"{len(data)}-{when.isoformat()}-{zlib.crc32(data):08x}"
