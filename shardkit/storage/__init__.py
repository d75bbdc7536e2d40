"""Every file access shardkit makes, behind one small URL-taking layer.

Every byte goes through a :class:`~shardkit.storage.store.Store` (``store_for(url)``, or
``locate(url)`` for one file): local paths and ``file://`` URLs are a :class:`LocalStore`, any
other scheme (``s3://``, ``gs://``, ``memory://``...) an :class:`FsspecStore`, every call
retried on failures of the moment (:mod:`shardkit.storage.retry`), and a store mounted in this
process (a :class:`MemoryStore`) answers the URLs under its root. The functions here take URLs
and hand them to the store. Writes are atomic: locally data goes to ``NAME.partial-<uuid>`` and
is renamed into place only when complete; an object is written in one request. A crash never
leaves a file that looks whole. Nothing above this package asks which backend a URL lives on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any, TypeVar

from shardkit.errors import ConfigError
from shardkit.storage import remote, retry
from shardkit.storage.caching_store import CachingStore
from shardkit.storage.faulty_store import FaultyStore
from shardkit.storage.fsspec_store import FsspecStore
from shardkit.storage.local import (
    IOV_MAX,
    O_BINARY,
    Buffer,
    Chunk,
    FsyncQueue,
    Writeback,
    fsync_dir,
    fsync_file,
    is_mapped,
    lock_file,
    make_dirs,
    sync_files,
    throwaway_writes,
    unmap,
    write_chunks,
    write_fully,
)
from shardkit.storage.local_store import LocalStore
from shardkit.storage.memory_store import MemoryStore
from shardkit.storage.options import check_storage_options
from shardkit.storage.paths import guard, is_remote, join, local_path, storage_error
from shardkit.storage.patterns import NamedOnce, brace_expand, expand
from shardkit.storage.scratch import Scratch
from shardkit.storage.store import Entry, Store
from shardkit.storage.stores import RemoteReads, locate, mount, store_for, unmount

__all__ = [
    "IOV_MAX",
    "O_BINARY",
    "Buffer",
    "CachingStore",
    "Chunk",
    "Entry",
    "FaultyStore",
    "FsspecStore",
    "FsyncQueue",
    "LocalStore",
    "MemoryStore",
    "NamedOnce",
    "RemoteReads",
    "Scratch",
    "Store",
    "Writeback",
    "atomic_write",
    "brace_expand",
    "can_put_if_absent",
    "check_storage_options",
    "entries",
    "exists",
    "expand",
    "fsync_dir",
    "fsync_file",
    "guard",
    "is_mapped",
    "is_remote",
    "join",
    "link_in",
    "listdir",
    "local_path",
    "locate",
    "lock_file",
    "makedirs",
    "map_bytes",
    "mount",
    "open_fd",
    "open_read",
    "put_if_absent",
    "put_if_unchanged",
    "read_bytes",
    "read_checked",
    "read_range",
    "remote",
    "remove",
    "retry",
    "size",
    "storage_error",
    "store_for",
    "sync_files",
    "throwaway_writes",
    "truncate",
    "unmap",
    "unmount",
    "upload",
    "upload_if_absent",
    "use",
    "version",
    "write_bytes",
    "write_chunks",
    "write_fully",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


def use(sources: Any, options: Mapping[str, Any] | None) -> None:
    """Read and write the object-store URLs among ``sources`` (a URL, a path or a list of them)
    with ``options`` (see :func:`shardkit.storage.remote.use`)."""
    if options is None:
        return
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    remote.use([os.fspath(item) for item in items if isinstance(item, (str, os.PathLike))], options)


def exists(url: str) -> bool:
    store, name = locate(url)
    return store.exists(name)


def size(url: str) -> int:
    """Size of the file in bytes; raises DatasetNotFoundError if it is missing."""
    store, name = locate(url)
    return store.size(name)


def read_bytes(url: str, *, size: int | None = None, concurrency: int = 1) -> bytes:
    """The whole file: locally in one sequential read; an object in up to ``concurrency``
    ranged requests at once when its ``size`` is known (a manifest says it), else in one."""
    store, name = locate(url, reads=RemoteReads(concurrency=concurrency))
    if size is None or store.supports_mapping:
        return store.read(name)
    return bytes(store.read_whole(name, size=size))


def map_bytes(url: str) -> Buffer:
    """The whole file as a read-only buffer, without copying it where that is possible.

    A local file is memory-mapped: its pages are the page cache's, so reading a shard costs no
    copy and no fresh memory. The file must not shrink while the map is in use (reading past
    its new end kills the process with SIGBUS); shardkit only maps inputs it reads once. Remote
    files, and files under 1 MiB (a map holds a file descriptor while it lives), come back as
    ``bytes`` (see :func:`shardkit.storage.local.map_open`).
    """
    store, name = locate(url)
    return store.read_whole(name)


def read_range(url: str, start: int, end: int) -> bytes:
    """Bytes ``start`` to ``end`` (exclusive) of the file: one positioned read locally, one
    ranged request for an object. Fewer bytes come back only when the file is shorter."""
    store, name = locate(url)
    return store.read_range(name, start, end)


def read_checked(
    url: str,
    *,
    size: int,
    check: Callable[[Buffer], str | None],
    reads: RemoteReads | None = None,
    first_check: Callable[[Buffer], str | None] | None = None,
) -> Buffer:
    """The file ``url`` of ``size`` bytes, with ``check(buffer)`` (a problem in words, or None) passed.

    An object is read in concurrent ranges (``reads``), through the cache when there is one;
    bytes that fail the check are read again (a transfer can be torn without an error) before
    the problem is raised (see :meth:`Store.read_checked`). A cached copy passes ``first_check``
    (when given: a full checksum where ``check`` skips it) the first time the cache uses it, and
    a fresh copy replacing a wrong one does too.

    Raises:
        CorruptShardError: the bytes fail the check every time.
    """
    store, name = locate(url, reads=reads or RemoteReads())
    return store.read_checked(name, size=size, check=check, first_check=first_check)


def open_read(url: str) -> contextlib.AbstractContextManager[IO[bytes]]:
    """A binary file object for streaming reads (see :meth:`Store.open_read`)."""
    store, name = locate(url)
    return store.open_read(name)


def open_fd(url: str, *, append: bool = True) -> int:
    """A descriptor writing the local file ``url``, appended to or emptied first (see :meth:`Store.open_fd`)."""
    store, name = locate(url)
    return store.open_fd(name, append=append)


def truncate(url: str, size: int) -> None:
    """Cut the file ``url`` back to its first ``size`` bytes (see :meth:`Store.truncate`)."""
    store, name = locate(url)
    store.truncate(name, size)


def link_in(local: str, url: str, *, exclusive: bool = False) -> bool:
    """Give the local file ``local`` the second name ``url`` (see :meth:`Store.link_in`)."""
    store, name = locate(url)
    return store.link_in(name, local, exclusive=exclusive)


@contextlib.contextmanager
def atomic_write(url: str, *, size: int | None = None) -> Iterator[IO[bytes]]:
    """Write ``url`` all or nothing: the name appears only once the block exits cleanly.

    ``size``, the bytes about to be written when known, is named if the disk fills up.
    """
    store, name = locate(url)
    with store.put_stream(name, size=size) as f:
        yield f


def whole_file_target(url: str) -> str:
    """Where a file written whole to ``url`` (:func:`atomic_write`, which renames it into place)
    should go: ``url``, or for a local link the file it points to, so that the write goes
    through the link as any program's would instead of replacing it.

    Raises:
        ConfigError: ``url`` is a local directory, or something there is not a regular file (a
            FIFO, a socket, a device: what a rename would replace cannot be written into).
    """
    path = local_path(url)
    if path is None:
        return url
    if os.path.islink(path):
        url = path = os.path.realpath(path)
    if url.endswith(("/", os.sep)) or os.path.isdir(path):
        raise ConfigError(f"{url}: is a directory: name the file to write in it, e.g. {url.rstrip('/' + os.sep)}/NAME")
    try:
        mode = os.stat(path).st_mode
    except OSError:  # nothing there yet (or nothing to look at): the write says what is wrong
        return url
    if not stat.S_ISREG(mode):
        raise ConfigError(
            f"{url}: is not a regular file (a FIFO, socket or device); a file written whole replaces what is there: name a file"
        )
    return url


def remove_dead_partials(url: str) -> list[str]:
    """Remove the temporaries that :func:`atomic_write` calls to ``url`` killed before they
    finished left beside it (a local file's ``NAME.partial-<uuid>`` no live writer holds); returns
    their names."""
    store, name = locate(url)
    return store.remove_dead_partials(name)


def write_bytes(url: str, data: bytes, *, sync: bool = True) -> None:
    """Atomically replace ``url`` with ``data`` (on disk when it returns, unless ``sync`` is off: see :meth:`Store.put`)."""
    store, name = locate(url)
    store.put(name, data, sync=sync)


def upload(local: str, url: str) -> None:
    """Copy the local file ``local`` to ``url``, streamed where the store can (see :meth:`Store.upload`)."""
    store, name = locate(url)
    store.upload(name, local)


def remove(url: str) -> None:
    """Delete a file if it exists."""
    store, name = locate(url)
    store.delete(name)


def put_if_absent(url: str, data: bytes) -> bool:
    """Create ``url`` holding ``data`` unless it exists; True when this call created it.

    Atomic: of writers racing to one name exactly one gets True, and a reader sees the whole
    file or none. Raises :class:`~shardkit.errors.ConfigError` where the store cannot (see
    :func:`can_put_if_absent`)."""
    store, name = locate(url)
    return store.put_if_absent(name, data)


def version(url: str) -> str | None:
    """What the file ``url`` is now, as a string that changes when it is rewritten (an object's
    ETag, a local file's size and modification time); None when it is missing."""
    store, name = locate(url)
    return store.version(name)


def put_if_unchanged(url: str, data: bytes, *, seen: str | None) -> bool:
    """Replace ``url`` with ``data`` only if it is still the version ``seen`` (:func:`version`;
    None: only if it is absent); True when this call wrote it. A request whose answer was lost
    and that the store then refuses may be this call's own write: holding ``data``, it counts
    as written. Only where the store compares and replaces in one step (an object store with
    conditional writes); a local writer holds the directory's lock instead."""
    store, name = locate(url)
    return store.put_if_unchanged(name, data, seen=seen)


def upload_if_absent(local: str, url: str, *, name_is_mine: bool = False) -> bool:
    """Copy the local file ``local`` to ``url`` unless something is there; True when this call
    created it (see :meth:`Store.upload_if_absent`)."""
    store, name = locate(url)
    return store.upload_if_absent(name, local, name_is_mine=name_is_mine)


def can_put_if_absent(url: str) -> bool:
    """True when the store of ``url`` makes conditional writes atomic (its ``supports_put_if_absent``)."""
    return locate(url)[0].supports_put_if_absent


def entries(url: str, *, missing_ok: bool = False) -> list[Entry]:
    """The files directly inside the directory ``url``, sorted by name, each with its size and
    last write time, from a fresh listing."""
    return store_for(url).entries(missing_ok=missing_ok)


def makedirs(url: str | os.PathLike[str]) -> str | None:
    """Create the directory ``url`` and its parents, unless it is there (nothing to do in a
    store without directories). Returns the local directory when this call made it (see
    :func:`~shardkit.storage.local.make_dirs`), else None; None for an object store, whose
    "directories" are only prefixes."""
    url = os.fspath(url)
    path = local_path(url)
    with guard(url, "create the directory"):
        if path is not None:
            return make_dirs(path)
        if isinstance(store_for(url), FsspecStore):
            fs, p = remote.filesystem(url)
            remote.call(url, fs, lambda: fs.makedirs(p, exist_ok=True))
    return None


def listdir(url: str, *, missing_ok: bool = False) -> list[str]:
    """Sorted names of the entries directly inside the directory ``url``; with ``missing_ok``,
    none when it does not exist (an object-store prefix nothing was written under yet)."""
    return store_for(url).list(missing_ok=missing_ok)
