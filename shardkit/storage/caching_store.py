"""A store that keeps local copies of another store's whole files: the loader's pile cache as a store wrapping a store.

A miss is downloaded straight into its cache file where the inner store streams it (one request
for the file), and read from there mapped; else it is read whole, then written.

store = CachingStore(FsspecStore("s3://bucket/data", concurrency=8), PileCache("/tmp/piles", "20GB"))
buf = store.read_checked("pile-000003.tar", size=info.bytes, check=check)   # S3 once, then the disk
"""

from __future__ import annotations

from shardkit.storage.cache import PileCache
from shardkit.storage.local import Buffer
from shardkit.storage.paths import guard
from shardkit.storage.store import Check, Store, WrappingStore


class CachingStore(WrappingStore):
    """``inner`` with its checked whole reads kept in ``cache`` (shared by the processes that
    use its directory, evicted least recently used first). Everything else goes to ``inner``.

    ``caches_reads`` is True: a caller that wants a few bytes of a file it may want again reads
    the whole file through :meth:`read_checked` rather than a range past the cache.

    Example::

        store = CachingStore(MemoryStore(), PileCache(str(tmp_path / "cache")))
        store.inner.put("p.tar", data)
        assert store.read_checked("p.tar", size=len(data), check=lambda b: None) == data
    """

    caches_reads = True

    def __init__(self, inner: Store, cache: PileCache) -> None:
        super().__init__(inner)
        self.cache = cache

    def read_checked(self, name: str, *, size: int, check: Check, first_check: Check | None = None) -> Buffer:
        """From the cached copy (checked with ``first_check`` the first time this process uses
        it), else from ``inner`` and then cached."""
        url = self.url(name)
        with guard(url, "read"):
            return self.cache.get(
                url,
                size=size,
                fetch=lambda: self.inner.read_checked(name, size=size, check=check),
                check=check,
                first_check=first_check,
                fetch_checks=check,
                fetch_into=lambda local: self.inner.read_checked_into(name, local, size=size, check=check),
            )
