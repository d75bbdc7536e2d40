"""Every file access shardkit makes, behind one small URL-taking layer.

Local paths and ``file://`` URLs use the OS directly. Any other scheme (``s3://``, ``gs://``,
``memory://``...) goes through fsspec when it is installed. Writes are atomic: data goes to
``NAME.partial-<uuid>`` and is renamed into place only when complete, so a crash never leaves a
file that looks whole.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob as _glob
import mmap
import os
import re
import sys
import uuid
from collections.abc import Iterator, Sequence
from typing import IO, Any

from shardkit import io_errors
from shardkit.errors import ConfigError, DatasetNotFoundError, ShardkitError

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_GROUP = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(\d+)\.\.(\d+)")


def _remote(url: str) -> str | None:
    """Return the scheme of a non-local URL, else None."""
    match = _SCHEME.match(url)
    if match is None or match.group(1) == "file":
        return None
    return match.group(1)


def local_path(url: str | os.PathLike[str]) -> str | None:
    """Return the filesystem path of a local URL, or None for a remote one."""
    url = os.fspath(url)
    if _remote(url):
        return None
    return url[len("file://") :] if url.startswith("file://") else url


def _fs(url: str) -> tuple[Any, str]:
    scheme = _remote(url)
    try:
        import fsspec
    except ImportError:
        raise ConfigError(f"{url}: {scheme}:// URLs need fsspec: pip install 'shardkit[remote]'") from None
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except ImportError as e:  # fsspec knows the scheme, its package is missing
        package = _backend_package(scheme)
        fix = f"pip install {package}" if package else f"install the fsspec package for {scheme}:// ({e})"
        raise ConfigError(f"{url}: {scheme}:// URLs need {package or 'a package that is missing'}: {fix}") from None
    except ValueError as e:
        if scheme is not None and scheme not in fsspec.available_protocols():
            raise ConfigError(
                f"{url}: no filesystem is known for {scheme}:// URLs (a typo? s3://, gs://, az://... each need their fsspec package)"
            ) from None
        raise ConfigError(f"{url}: {io_errors.sanitized(str(e))}") from None
    return fs, path


def _backend_package(scheme: str | None) -> str | None:
    """The pip package fsspec needs for ``scheme`` (``s3fs`` for ``s3``), when it says."""
    from fsspec.registry import known_implementations

    module = str(known_implementations.get(scheme or "", {}).get("class", "")).split(".")[0]
    return module or None


def storage_error(error: BaseException, url: str, doing: str, *, size: int | None = None) -> ShardkitError:
    """The shardkit error for ``error``, raised while ``doing`` (``"read"``, ``"write"``...) ``url``.

    A missing file is a :class:`DatasetNotFoundError`; anything else that failed below shardkit
    is a :class:`StorageError` naming ``url``, saying why and what to do (see
    :func:`shardkit.io_errors.translate`). ``size`` is the bytes being written, named when the
    disk is full.
    """
    return io_errors.translate(error, url, doing, scheme=_remote(url), path=local_path(url), size=size)


@contextlib.contextmanager
def guard(url: str | os.PathLike[str], doing: str, *, size: int | None = None) -> Iterator[None]:
    """Turn what fails inside into the shardkit error naming ``url`` (see :func:`storage_error`).

    Locally that is any OSError; for a remote URL, also what its object-store client raises
    (credentials, endpoints and HTTP errors are not OSErrors there). Shardkit's own errors pass,
    and so do Python's own (a TypeError is a bug to see, not a storage failure).

        with storage.guard(path, "write", size=len(data)):
            os.write(fd, data)
    """
    url = os.fspath(url)
    try:
        yield
    except ShardkitError:
        raise
    except OSError as e:
        raise storage_error(e, url, doing, size=size) from e
    except Exception as e:
        if _remote(url) is None or type(e).__module__ == "builtins":
            raise
        raise storage_error(e, url, doing, size=size) from e


def join(base: str | os.PathLike[str], name: str) -> str:
    """Join a directory URL and a relative name."""
    base = os.fspath(base)
    if _remote(base):
        return base.rstrip("/") + "/" + name
    return os.path.join(base, name)


def exists(url: str) -> bool:
    path = local_path(url)
    if path is not None:
        return os.path.exists(path)
    fs, p = _fs(url)
    with guard(url, "look it up"):
        return bool(fs.exists(p))


def size(url: str) -> int:
    """Size of the file in bytes; raises DatasetNotFoundError if it is missing."""
    path = local_path(url)
    with guard(url, "read its size"):
        if path is not None:
            return os.path.getsize(path)
        fs, p = _fs(url)
        return int(fs.size(p))


def read_bytes(url: str) -> bytes:
    """The whole file, in one sequential read."""
    path = local_path(url)
    with guard(url, "read"):
        if path is not None:
            with open(path, "rb", buffering=0) as f:
                return f.readall()
        fs, p = _fs(url)
        return bytes(fs.cat_file(p))


_MAP_MIN = 1 << 20
# what map_bytes gives: bytes, or a read-only memory map (slicing either gives bytes)
Buffer = bytes | mmap.mmap


def map_bytes(url: str) -> Buffer:
    """The whole file as a read-only buffer, without copying it where that is possible.

    A local file is memory-mapped: its pages are the page cache's, so reading a shard costs no
    copy and no fresh memory. The file must not shrink while the map is in use (reading past
    its new end kills the process with SIGBUS); shardkit only maps inputs it reads once. Remote
    files, and files under 1 MiB (a map holds a file descriptor while it lives), come back as
    ``bytes``.
    """
    path = local_path(url)
    if path is None:
        return read_bytes(url)
    try:
        with open(path, "rb", buffering=0) as f:
            if os.fstat(f.fileno()).st_size < _MAP_MIN:
                return f.readall()
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            return mmap.mmap(f.fileno(), 0, flags=flags, prot=mmap.PROT_READ)
    except (OSError, ValueError, AttributeError):  # no mmap here (a pipe, a platform without it), or no file: read_bytes says why
        return read_bytes(url)


@contextlib.contextmanager
def open_read(url: str) -> Iterator[IO[bytes]]:
    """A binary file object for streaming reads."""
    path = local_path(url)
    with guard(url, "read"):
        if path is not None:
            with open(path, "rb") as f:
                yield f
        else:
            fs, p = _fs(url)
            with fs.open(p, "rb") as f:
                yield f


@contextlib.contextmanager
def atomic_write(url: str, *, size: int | None = None) -> Iterator[IO[bytes]]:
    """Write ``url`` all or nothing: the name appears only once the block exits cleanly.

    ``size``, the bytes about to be written when known, is named if the disk fills up.
    """
    path = local_path(url)
    if path is None:
        # object stores publish a PUT whole or not at all; fsspec writes on close
        fs, p = _fs(url)
        with guard(url, "write"), fs.open(p, "wb") as f:
            yield f
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


def fsync_dir(path: str) -> None:
    """Make the entries of the local directory ``path`` (new names, renames) durable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # a platform that cannot open directories (Windows): nothing to do
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def sync_files(paths: Sequence[str]) -> None:
    """Flush the data of the local files ``paths`` to disk before anything points at them.

    On Linux one ``syncfs`` of their file system does it in one call, however many files there
    are (hundreds of piles cost hundreds of ``fsync`` calls); elsewhere each file is fsynced.
    """
    if not paths:
        return
    syncfs = _syncfs()
    if syncfs is not None:
        with guard(paths[0], "flush to disk"):
            fd = os.open(paths[0], os.O_RDONLY)
            try:
                if syncfs(fd) != 0:
                    error = ctypes.get_errno()
                    raise OSError(error, os.strerror(error))
            finally:
                os.close(fd)
        return
    for path in paths:
        fsync_file(path)


@functools.lru_cache(maxsize=1)
def _syncfs() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None


def fsync_file(path: str) -> None:
    """Flush the local file ``path``'s data to disk."""
    with guard(path, "flush to disk"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_bytes(url: str, data: bytes) -> None:
    """Atomically replace ``url`` with ``data``."""
    with atomic_write(url, size=len(data)) as f:
        f.write(data)


# what a writer hands over to be written: any buffer of bytes, views into a larger one included
Chunk = bytes | bytearray | memoryview
O_BINARY = getattr(os, "O_BINARY", 0)
# writev takes at most IOV_MAX buffers a call (1024 on Linux)
IOV_MAX = 1024


def write_chunks(fd: int, chunks: Sequence[Chunk]) -> None:
    """Append ``chunks`` in order to the open file ``fd``, up to IOV_MAX of them a ``writev``."""
    for lo in range(0, len(chunks), IOV_MAX):
        batch = chunks[lo : lo + IOV_MAX]
        _write_batch(fd, batch, sum(map(len, batch)))


def _write_batch(fd: int, batch: Sequence[Chunk], size: int) -> None:
    if not hasattr(os, "writev"):
        write_fully(fd, b"".join(batch))
        return
    done = os.writev(fd, batch)
    if done < size:  # a short write (signal, nearly full disk): finish one buffer at a time
        for chunk in batch:
            if done >= len(chunk):
                done -= len(chunk)
                continue
            write_fully(fd, memoryview(chunk)[done:])
            done = 0


def write_fully(fd: int, data: Chunk) -> None:
    """Write all of ``data`` to the open file ``fd`` (``os.write`` may write less)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def remove(url: str) -> None:
    """Delete a file if it exists."""
    path = local_path(url)
    if path is not None:
        with guard(url, "remove"), contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    fs, p = _fs(url)
    with guard(url, "remove"):
        if fs.exists(p):
            fs.rm(p)


def makedirs(url: str | os.PathLike[str]) -> None:
    """Create the directory ``url`` and its parents, unless it is there."""
    url = os.fspath(url)
    path = local_path(url)
    with guard(url, "create the directory"):
        if path is not None:
            os.makedirs(path, exist_ok=True)
        else:
            fs, p = _fs(url)
            fs.makedirs(p, exist_ok=True)


def listdir(url: str) -> list[str]:
    """Sorted names of the entries directly inside the directory ``url``."""
    path = local_path(url)
    try:
        with guard(url, "list the directory"):
            if path is not None:
                return sorted(os.listdir(path))
            fs, p = _fs(url)
            return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(p, detail=False))
    except DatasetNotFoundError:
        raise DatasetNotFoundError(f"{url}: no such directory") from None


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
    fs, p = _fs(pattern)
    with guard(pattern, "list the files matching"):
        found = fs.glob(p, detail=True)  # types come with the listing: no request per file
    return sorted(fs.unstrip_protocol(m) for m, info in found.items() if info.get("type") == "file")
