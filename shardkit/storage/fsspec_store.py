"""A store of objects through fsspec (``s3://``, ``gs://``, ``memory://``...): every call retried, whole reads in concurrent ranges.

store = FsspecStore("s3://bucket/data", concurrency=8)
buf = store.read_whole("pile-000003.tar", size=info.bytes)     # 8 ranged GETs at once
won = store.put_if_absent("shardkit.json", data)               # If-None-Match: *, where S3 has it
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator
from typing import IO, Any, TypeVar

from shardkit.storage import conditional, remote
from shardkit.storage.local import Buffer
from shardkit.storage.paths import guard
from shardkit.storage.store import Entry, Store

T = TypeVar("T")


class FsspecStore(Store):
    """The objects under one URL of an fsspec filesystem, with the storage options given for its
    bucket (:func:`shardkit.storage.use`).

    ``concurrency``: ranged requests in flight at once when a whole object of known size is read.
    ``supports_put_if_absent`` is True where the store makes conditional writes atomic (S3
    through an s3fs and botocore that send ``If-None-Match``); it is asked of the store once.

    Example::

        store = FsspecStore("s3://bucket/data")
        store.put("a.bin", b"abc")
        assert store.read("a.bin") == b"abc"
    """

    def __init__(self, root: str, *, concurrency: int = 1) -> None:
        super().__init__(root)
        self.concurrency = concurrency
        self._conditional: bool | None = None

    @property
    def supports_put_if_absent(self) -> bool:  # type: ignore[override]  # asks the filesystem, which may connect: only when wanted
        if self._conditional is None:
            self._conditional = conditional.can_put_if_absent(self.url("x"))
        return self._conditional

    def url(self, name: str) -> str:
        if not name:
            return self.root
        return self.root + name if self.root.endswith("/") else self.root + "/" + name

    def _call(self, name: str, fn: Callable[[Any, str], T]) -> T:
        """``fn(fs, path)`` on the filesystem of ``name``, retried on failures of the moment."""
        url = self.url(name)
        fs, path = remote.filesystem(url)
        return remote.call(url, fs, lambda: fn(fs, path))

    def read(self, name: str) -> bytes:
        with guard(self.url(name), "read"):
            return self._call(name, lambda fs, p: bytes(fs.cat_file(p)))

    def read_range(self, name: str, start: int, end: int) -> bytes:
        with guard(self.url(name), "read"):
            return self._call(name, lambda fs, p: bytes(fs.cat_file(p, start=start, end=end)))

    def size(self, name: str) -> int:
        with guard(self.url(name), "read its size"):
            return self._call(name, lambda fs, p: int(fs.size(p)))

    def exists(self, name: str) -> bool:
        with guard(self.url(name), "look it up"):
            return self._call(name, lambda fs, p: bool(fs.exists(p)))

    def version(self, name: str) -> str | None:
        """Its ETag, asked of the object itself (never a cached listing)."""
        return conditional.version(self.url(name))

    def read_whole(self, name: str, *, size: int | None = None) -> Buffer:
        """Up to ``concurrency`` ranged requests at once when ``size`` is known (the last asks one
        byte past it, so an object of another size shows in what comes back), else one request."""
        if size is None:
            return self.read(name)
        with guard(self.url(name), "read"):
            return remote.read_ranges(self.url(name), size=size, concurrency=self.concurrency)

    def download(self, name: str, local: str, *, size: int) -> bool:
        """Streamed into ``local`` by the filesystem's own download where ``size`` is one request
        for :meth:`read_whole`; else False. One try: a caller falls back to the whole read, which is
        retried (a local disk error is not the store's). Interrupted, the download stops and
        removes ``local`` itself, so nothing writes into it once this returns."""
        if len(remote.ranges(size, self.concurrency)) > 1:
            return False
        fs, path = remote.filesystem(self.url(name))
        with guard(self.url(name), "read"):
            if not getattr(fs, "async_impl", False):
                fs.get_file(path, local)  # one try: a failure is read whole, retried there (a local disk error is not the store's)
                return True
            done = asyncio.run_coroutine_threadsafe(_get_file(fs, path, local), fs.loop)
            try:
                done.result()
            except BaseException:
                done.cancel()  # Ctrl-C: the download stops and removes its file, not after the cache's clean-up
                raise
        return True

    def entries(self, *, missing_ok: bool = False) -> list[Entry]:
        return conditional.entries(self.root, missing_ok=missing_ok)

    def list(self, *, missing_ok: bool = False) -> list[str]:
        """Names directly under the root (prefixes too), from a fresh listing: fsspec's cached
        listings would hide what another process just wrote."""
        return conditional.names(self.root, missing_ok=missing_ok)

    def put(self, name: str, data: bytes, *, sync: bool = True) -> None:
        """One request: the object appears whole or not at all."""
        with guard(self.url(name), "write", size=len(data)):
            remote.write_bytes(self.url(name), data)

    @contextlib.contextmanager
    def open_read(self, name: str) -> Iterator[IO[bytes]]:
        """A streaming reader (fsspec's, which fetches in blocks as it is read)."""
        url = self.url(name)
        with guard(url, "read"):
            fs, path = remote.filesystem(url)
            with fs.open(path, "rb") as f:
                yield f

    def upload(self, name: str, local: str) -> None:
        """Streamed in :data:`~shardkit.storage.remote.UPLOAD_CHUNK` pieces (multipart when large)."""
        with guard(self.url(name), "upload"):
            remote.upload(local, self.url(name))

    def put_if_absent(self, name: str, data: bytes) -> bool:
        return conditional.put_if_absent(self.url(name), data)

    def put_if_unchanged(self, name: str, data: bytes, *, seen: str | None) -> bool:
        """``If-Match: <seen>`` (``If-None-Match: *`` when ``seen`` is None)."""
        return conditional.put_if_unchanged(self.url(name), data, seen=seen)

    def upload_if_absent(self, name: str, local: str, *, name_is_mine: bool = False) -> bool:
        """Streamed, the multipart upload refused when it completes if an object is there."""
        return conditional.upload_if_absent(local, self.url(name), name_is_mine=name_is_mine)

    def delete(self, name: str) -> None:
        with guard(self.url(name), "remove"), contextlib.suppress(FileNotFoundError):
            self._call(name, lambda fs, p: fs.rm_file(p))


async def _get_file(fs: Any, path: str, local: str) -> None:
    """``fs``'s download of ``path`` into ``local``, which goes again when it fails or is cancelled."""
    try:
        await fs._get_file(path, local)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(local)
        raise
