"""Every file access shardkit makes, behind one small URL-taking layer.

Local paths and ``file://`` URLs use the OS directly. Any other scheme (``s3://``, ``gs://``,
``memory://``...) goes through fsspec (:mod:`shardkit.storage.remote`), every call retried on
failures of the moment (:mod:`shardkit.storage.retry`). Writes are atomic: locally data goes to
``NAME.partial-<uuid>`` and is renamed into place only when complete; an object is written in
one request. A crash never leaves a file that looks whole. Nothing above this package knows
which backend a URL lives on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob as _glob
import io
import logging
import os
import re
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any, TypeVar

from shardkit.errors import CorruptShardError, DatasetNotFoundError
from shardkit.storage import remote, retry
from shardkit.storage.conditional import (
    Entry,
    can_put_if_absent,
    entries,
    forget_listings,
    put_if_absent,
    put_if_unchanged,
    upload_if_absent,
    version,
)
from shardkit.storage.local import (
    IOV_MAX,
    O_BINARY,
    Buffer,
    Chunk,
    fsync_dir,
    fsync_file,
    lock_file,
    map_open,
    sync_files,
    unmap,
    write_chunks,
    write_fully,
)
from shardkit.storage.options import check_storage_options
from shardkit.storage.paths import guard, is_remote, join, local_path, storage_error

__all__ = [
    "IOV_MAX",
    "O_BINARY",
    "Buffer",
    "Chunk",
    "Entry",
    "RemoteReads",
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
    "is_remote",
    "join",
    "listdir",
    "local_path",
    "lock_file",
    "makedirs",
    "map_bytes",
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
    "sync_files",
    "unmap",
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
_GROUP = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(\d+)\.\.(\d+)")


def use(sources: Any, options: Mapping[str, Any] | None) -> None:
    """Read and write the object-store URLs among ``sources`` (a URL, a path or a list of them)
    with ``options`` (see :func:`shardkit.storage.remote.use`)."""
    if options is None:
        return
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    remote.use([os.fspath(item) for item in items if isinstance(item, (str, os.PathLike))], options)


def _call(url: str, fn: Callable[[Any, str], T]) -> T:
    """``fn(fs, path)`` on the remote ``url``'s filesystem, retried on failures of the moment."""
    fs, path = remote.filesystem(url)
    return remote.call(url, fs, lambda: fn(fs, path))


def exists(url: str) -> bool:
    path = local_path(url)
    if path is not None:
        return os.path.exists(path)
    with guard(url, "look it up"):
        return _call(url, lambda fs, p: bool(fs.exists(p)))


def size(url: str) -> int:
    """Size of the file in bytes; raises DatasetNotFoundError if it is missing."""
    path = local_path(url)
    with guard(url, "read its size"):
        if path is not None:
            return os.path.getsize(path)
        return _call(url, lambda fs, p: int(fs.size(p)))


def read_bytes(url: str, *, size: int | None = None, concurrency: int = 1) -> bytes:
    """The whole file: locally in one sequential read; an object in up to ``concurrency``
    ranged requests at once when its ``size`` is known (a manifest says it), else in one."""
    path = local_path(url)
    with guard(url, "read"):
        if path is not None:
            with open(path, "rb", buffering=0) as f:
                return f.readall()
        if size is not None:
            return remote.read_ranges(url, size=size, concurrency=concurrency)
        return _call(url, lambda fs, p: bytes(fs.cat_file(p)))


def map_bytes(url: str) -> Buffer:
    """The whole file as a read-only buffer, without copying it where that is possible.

    A local file is memory-mapped: its pages are the page cache's, so reading a shard costs no
    copy and no fresh memory. The file must not shrink while the map is in use (reading past
    its new end kills the process with SIGBUS); shardkit only maps inputs it reads once. Remote
    files, and files under 1 MiB (a map holds a file descriptor while it lives), come back as
    ``bytes`` (see :func:`shardkit.storage.local.map_open`).
    """
    path = local_path(url)
    if path is None:
        return read_bytes(url)
    try:
        with open(path, "rb", buffering=0) as f:
            return map_open(f)
    except OSError:  # no file, or not one to read: read_bytes says why
        return read_bytes(url)


def read_range(url: str, start: int, end: int) -> bytes:
    """Bytes ``start`` to ``end`` (exclusive) of the file: one positioned read locally, one
    ranged request for an object. Fewer bytes come back only when the file is shorter."""
    path = local_path(url)
    with guard(url, "read"):
        if path is not None:
            fd = os.open(path, os.O_RDONLY | O_BINARY)
            try:
                return os.pread(fd, end - start, start)
            finally:
                os.close(fd)
        return _call(url, lambda fs, p: bytes(fs.cat_file(p, start=start, end=end)))


# tries at an object whose bytes came back wrong (a transfer torn without an error) before they are called corrupt
_CHECKED_READS = 3


@dataclasses.dataclass(frozen=True)
class RemoteReads:
    """How whole objects (piles) are read from an object store.

    Attributes:
        concurrency: ranged requests in flight at once for one object.
        cache: a :class:`~shardkit.storage.cache.PileCache` keeping local copies, or None.
    """

    concurrency: int = remote.DEFAULT_CONCURRENCY
    cache: Any = None


def read_checked(
    url: str,
    *,
    size: int,
    check: Callable[[Buffer], str | None],
    reads: RemoteReads | None = None,
    first_check: Callable[[Buffer], str | None] | None = None,
) -> Buffer:
    """The object ``url`` of ``size`` bytes, with ``check(buffer)`` (a problem in words, or None) passed.

    It is read in concurrent ranges (``reads``), through the cache when there is one; bytes that
    fail the check are read again (a transfer can be torn without an error) before the problem is
    raised. A cached copy passes ``first_check`` (when given: a full checksum where ``check`` skips
    it) the first time the cache uses it, and a fresh copy replacing a wrong one does too. A local
    file needs none of this: map it (:func:`map_bytes`) and check it once.

    Raises:
        CorruptShardError: the bytes fail the check every time.
    """
    reads = reads or RemoteReads()
    if reads.cache is not None:
        with guard(url, "read"):
            return reads.cache.get(
                url, size=size, fetch=lambda: _fetch_checked(url, size, check, reads.concurrency), check=check, first_check=first_check
            )
    return _fetch_checked(url, size, check, reads.concurrency)


def _fetch_checked(url: str, size: int, check: Callable[[Buffer], str | None], concurrency: int) -> bytes:
    """The object ``url``, read again while ``check`` finds its bytes wrong, up to :data:`_CHECKED_READS` times."""
    for tried in range(1, _CHECKED_READS + 1):
        data = read_bytes(url, size=size, concurrency=concurrency)
        problem = check(data)
        if problem is None:
            return data
        if tried < _CHECKED_READS:
            log.info("%s: %s (read %d of %d), reading it again", url, problem, tried, _CHECKED_READS)
    raise CorruptShardError(f"{url}: {problem} (read {_CHECKED_READS} times)")


@contextlib.contextmanager
def open_read(url: str) -> Iterator[IO[bytes]]:
    """A binary file object for streaming reads."""
    path = local_path(url)
    with guard(url, "read"):
        if path is not None:
            with open(path, "rb") as f:
                yield f
        else:
            fs, p = remote.filesystem(url)
            with fs.open(p, "rb") as f:
                yield f


@contextlib.contextmanager
def atomic_write(url: str, *, size: int | None = None) -> Iterator[IO[bytes]]:
    """Write ``url`` all or nothing: the name appears only once the block exits cleanly.

    ``size``, the bytes about to be written when known, is named if the disk fills up.
    """
    path = local_path(url)
    if path is None:
        # an object is published whole or not at all by one PUT: gather the bytes, send them on success
        buffer = io.BytesIO()
        yield buffer
        with guard(url, "write", size=buffer.tell()):
            remote.write_bytes(url, buffer.getvalue())
        return
    tmp = f"{path}.partial-{uuid.uuid4().hex}"
    try:
        with guard(url, "write", size=size):
            with open(tmp, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())  # the bytes are on disk before the name says they are there
            os.replace(tmp, path)
        fsync_dir(os.path.dirname(path) or ".")
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bytes(url: str, data: bytes) -> None:
    """Atomically replace ``url`` with ``data``."""
    with atomic_write(url, size=len(data)) as f:
        f.write(data)


def upload(local: str, url: str) -> None:
    """Copy the local file ``local`` to the object ``url``, streamed (see :func:`remote.upload`)."""
    with guard(url, "upload"):
        remote.upload(local, url)


def remove(url: str) -> None:
    """Delete a file if it exists."""
    path = local_path(url)
    if path is not None:
        with guard(url, "remove"), contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    with guard(url, "remove"), contextlib.suppress(FileNotFoundError):
        _call(url, lambda fs, p: fs.rm_file(p))


def makedirs(url: str | os.PathLike[str]) -> None:
    """Create the directory ``url`` and its parents, unless it is there."""
    url = os.fspath(url)
    path = local_path(url)
    with guard(url, "create the directory"):
        if path is not None:
            os.makedirs(path, exist_ok=True)
        else:
            _call(url, lambda fs, p: fs.makedirs(p, exist_ok=True))


def listdir(url: str, *, missing_ok: bool = False) -> list[str]:
    """Sorted names of the entries directly inside the directory ``url``; with ``missing_ok``,
    none when it does not exist (an object-store prefix nothing was written under yet)."""
    path = local_path(url)
    try:
        with guard(url, "list the directory"):
            if path is not None:
                return sorted(os.listdir(path))
            # a fresh listing: fsspec's cache of listings would hide what another process just wrote
            entries = _call(url, lambda fs, p: _listed(fs, p, fs.ls(p, detail=False, refresh=True)))
            return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries)
    except DatasetNotFoundError:
        if missing_ok:
            return []
        raise DatasetNotFoundError(f"{url}: no such directory") from None


def _listed(fs: Any, path: str, listing: T) -> T:
    """``listing``, with the client's cached copy dropped: a later lookup of one object asks the
    store, so an object another process adds afterwards is not taken for missing."""
    forget_listings(fs, path)
    return listing


def brace_expand(pattern: str) -> list[str]:
    """Expand ``{000..012}`` ranges (zero padding kept) and ``{a,b}`` alternatives.

    Groups expand left to right, as in the shell: ``{a,b}-{0..1}`` gives a-0, a-1, b-0, b-1.
    A group that is neither (``{x}``) stays as it is.
    """
    for match in _GROUP.finditer(pattern):
        body = match.group(1)
        numbers = _RANGE.fullmatch(body)
        if numbers:
            lo, hi = numbers.group(1), numbers.group(2)
            width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
            step = 1 if int(hi) >= int(lo) else -1
            alternatives = [f"{i:0{width}d}" for i in range(int(lo), int(hi) + step, step)]
        elif "," in body:
            alternatives = body.split(",")
        else:
            continue
        head, tail = pattern[: match.start()], pattern[match.end() :]
        return [e for alt in alternatives for e in brace_expand(head + alt + tail)]
    return [pattern]


def expand(sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """Turn a URL, a brace pattern, a glob or a list of them into a list of file URLs.

    Raises:
        DatasetNotFoundError: a pattern matches nothing or a named file does not exist.
    """
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    urls: list[str] = []
    for item in items:
        for url in brace_expand(os.fspath(item)):
            path = local_path(url)
            if _glob.has_magic(url):
                found = _glob_files(url)
                if not found:
                    raise DatasetNotFoundError(f"{url}: pattern matches no file")
                urls.extend(found)
            elif path is not None and not os.path.isfile(path):
                raise DatasetNotFoundError(f"{url}: no such file")
            else:
                urls.append(url)
    return urls


def _glob_files(pattern: str) -> list[str]:
    """Sorted URLs of the files matching a glob, local or remote (remote ones keep their scheme)."""
    path = local_path(pattern)
    if path is not None:
        return sorted(p for p in _glob.glob(path) if os.path.isfile(p))
    fs, p = remote.filesystem(pattern)
    with guard(pattern, "list the files matching"):
        found = remote.call(pattern, fs, lambda: fs.glob(p, detail=True))  # types come with the listing: no request per file
    forget_listings(fs, None)  # a glob lists every directory it walks
    return sorted(fs.unstrip_protocol(m) for m, info in found.items() if info.get("type") == "file")
