"""Which store a URL lives in: local paths, fsspec URLs, and stores mounted in this process (a MemoryStore).

store = store_for("s3://bucket/data", reads=RemoteReads(concurrency=8, cache=cache))
store, name = locate("data/pile-000003.tar")      # LocalStore("data/"), "pile-000003.tar"
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

from shardkit.storage import remote
from shardkit.storage.caching_store import CachingStore
from shardkit.storage.fsspec_store import FsspecStore
from shardkit.storage.local_store import LocalStore
from shardkit.storage.store import Store

_mounted: dict[str, Store] = {}
_mutex = threading.Lock()


@dataclasses.dataclass(frozen=True)
class RemoteReads:
    """How whole files are read from a store whose bytes travel (an object store).

    Attributes:
        concurrency: ranged requests in flight at once for one object.
        cache: a :class:`~shardkit.storage.cache.PileCache` keeping local copies, or None.
    """

    concurrency: int = remote.DEFAULT_CONCURRENCY
    cache: Any = None


def mount(store: Store) -> Store:
    """Make the URLs under ``store.root`` reach ``store`` in this process (every storage call,
    every reader and writer); returns it. For stores no URL names otherwise (a MemoryStore)."""
    with _mutex:
        _mounted[store.root.rstrip("/")] = store
    return store


def unmount(store: Store) -> None:
    """Undo :func:`mount`; nothing happens when ``store`` is not mounted."""
    with _mutex:
        if _mounted.get(store.root.rstrip("/")) is store:
            del _mounted[store.root.rstrip("/")]


def _mounted_at(url: str) -> tuple[Store, str] | None:
    if not _mounted:
        return None
    with _mutex:
        for root, store in _mounted.items():
            if url == root or url.startswith(root + "/"):
                return store, url[len(root) + 1 :]
    return None


def store_for(url: str | os.PathLike[str], *, reads: RemoteReads | None = None) -> Store:
    """The store whose root is the directory ``url``. Where its bytes travel (no
    ``supports_mapping``), it reads whole files as ``reads`` says: in concurrent ranges, and
    through the cache when there is one."""
    url = os.fspath(url)
    found = _mounted_at(url)
    if found is not None:
        store, name = found
        return store.sub(name) if name else store
    if remote.scheme(url) is None:
        return LocalStore(url)
    return _reading(FsspecStore(url, concurrency=(reads or RemoteReads()).concurrency), reads)


def locate(url: str | os.PathLike[str], *, reads: RemoteReads | None = None) -> tuple[Store, str]:
    """The store of the directory holding the file ``url``, and the file's name in it."""
    url = os.fspath(url)
    found = _mounted_at(url)
    if found is not None:
        store, name = found
        if "/" in name.rstrip("/"):
            path, name = name.rsplit("/", 1)
            return store.sub(path), name
        return store, name
    cut = max(url.rfind("/"), url.rfind(os.sep)) + 1
    if remote.scheme(url) is None:
        return LocalStore(url[:cut]), url[cut:]
    return _reading(FsspecStore(url[:cut], concurrency=(reads or RemoteReads()).concurrency), reads), url[cut:]


def _reading(store: Store, reads: RemoteReads | None) -> Store:
    if reads is not None and reads.cache is not None and not store.supports_mapping:
        return CachingStore(store, reads.cache)
    return store
