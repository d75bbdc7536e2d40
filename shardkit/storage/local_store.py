"""A store of local files: one directory, atomic writes by rename, reads memory-mapped, a kernel lock.

store = LocalStore("data/train")
buf = store.read_whole("pile-000003.tar")        # a memory map of 1 MiB and more
with store.lock(".shardkit-lock", wait=False) as mine: ...
"""

from __future__ import annotations

import builtins
import contextlib
import datetime
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from typing import IO

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: partial files are not told apart
    fcntl = None  # type: ignore[assignment]

from shardkit.errors import DatasetNotFoundError
from shardkit.storage.local import O_BINARY, Buffer, fsync_dir, fsync_file, lock_file, map_open, write_fully
from shardkit.storage.paths import guard, local_path
from shardkit.storage.store import Entry, Store, held

# how old a partial file no writer holds must be for remove_dead_partials to take it for a dead
# writer's (a live writer locks it the moment after it makes it)
PARTIAL_AGE_S = 10
# how long ago a file must have last changed for its version to be sure to show a change made
# now (twice the coarsest file time in common use: FAT's two seconds)
SETTLED_NS = 4 * 10**9


def _hold(fd: int) -> None:
    """Take the exclusive ``flock`` of ``fd`` without waiting (BlockingIOError: another holds it)."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


class LocalStore(Store):
    """The files of one local directory (a path or a ``file://`` URL).

    Example::

        store = LocalStore(str(tmp_path))
        store.put("a.bin", b"abc")
        assert store.list() == ["a.bin"]
    """

    supports_put_if_absent = True
    supports_locks = True
    supports_mapping = True

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self._dir = local_path(root) or ""

    def url(self, name: str) -> str:
        return os.path.join(self.root, name) if name else self.root

    def sub(self, path: str) -> LocalStore:
        return LocalStore(os.path.join(self.root, path))

    def path(self, name: str) -> str:
        """The filesystem path of ``name``."""
        return os.path.join(self._dir, name) if name else self._dir

    def local_file(self, name: str = "") -> str | None:
        return self.path(name)

    def modified(self, name: str) -> datetime.datetime | None:
        with guard(self.url(name), "look it up"):
            try:
                when = os.stat(self.path(name)).st_mtime
            except FileNotFoundError:
                return None
        return datetime.datetime.fromtimestamp(when, datetime.timezone.utc)

    @contextlib.contextmanager
    def open_read(self, name: str) -> Iterator[IO[bytes]]:
        """The file unbuffered: a caller reading into its own buffers pays for no second copy."""
        with guard(self.url(name), "read"), open(self.path(name), "rb", buffering=0) as f:
            yield f

    def read(self, name: str) -> bytes:
        with guard(self.url(name), "read"), open(self.path(name), "rb", buffering=0) as f:
            return f.readall()

    def read_range(self, name: str, start: int, end: int) -> bytes:
        with guard(self.url(name), "read"):
            fd = os.open(self.path(name), os.O_RDONLY | O_BINARY)
            try:
                return os.pread(fd, end - start, start)
            finally:
                os.close(fd)

    def size(self, name: str) -> int:
        with guard(self.url(name), "read its size"):
            return os.path.getsize(self.path(name))

    def exists(self, name: str) -> bool:
        return os.path.exists(self.path(name))

    def is_dir(self, name: str) -> bool:
        return os.path.isdir(self.path(name))

    def version(self, name: str) -> str | None:
        """Its size and modification time (in nanoseconds): what changes when its bytes are
        written (a new link to it, or new permissions, leave it as it is)."""
        st = self._stat(name)
        return None if st is None else f"{st.st_size}-{st.st_mtime_ns}"

    def lasting_version(self, name: str) -> str | None:
        """Its size, modification and change times and inode, once the file last changed
        :data:`SETTLED_NS` or more ago. Writing the file, or putting another in its place (even
        one with its times set back), sets the change time, which nobody can set back, to the
        time of the change; but where that clock is coarse (a kernel tick, or seconds on some
        file systems), a change made just after the file last changed could leave every time as
        it was. A write through a shared memory map of the file into a page not yet saved to disk
        leaves the times too: such a change is not seen here."""
        st = self._stat(name)
        if st is None or time.time_ns() - st.st_ctime_ns < SETTLED_NS:
            return None
        return f"{st.st_size}-{st.st_mtime_ns}-{st.st_ctime_ns}-{st.st_ino}"

    def _stat(self, name: str) -> os.stat_result | None:
        with guard(self.url(name), "look it up"):
            try:
                return os.stat(self.path(name))
            except FileNotFoundError:
                return None

    def read_whole(self, name: str, *, size: int | None = None) -> Buffer:
        """The file memory-mapped (its pages are the page cache's: no copy, no fresh memory); files
        under :data:`~shardkit.storage.local.MAP_MIN` are read. The file must not shrink while the
        map is in use (a read past its new end is SIGBUS): shardkit maps only files it reads once."""
        try:
            with open(self.path(name), "rb", buffering=0) as f:
                return map_open(f)
        except OSError:  # no file, or not one to read: read says why
            return self.read(name)

    def entries(self, *, missing_ok: bool = False) -> list[Entry]:
        found = []
        for name in self.list(missing_ok=missing_ok):
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(self.path(name))
                when = datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc)
                found.append(Entry(name, st.st_size, when))
        return found

    def list(self, *, missing_ok: bool = False) -> list[str]:
        try:
            with guard(self.root, "list the directory"):
                return sorted(os.listdir(self._dir))
        except DatasetNotFoundError:
            if missing_ok:
                return []
            raise DatasetNotFoundError(f"{self.root}: no such directory") from None

    @contextlib.contextmanager
    def put_stream(self, name: str, *, size: int | None = None, sync: bool = True) -> Iterator[IO[bytes]]:
        """Write ``NAME.partial-<uuid>``, flush it to disk (``sync``), rename it into place; unlink it
        on error. The partial file is ``flock``-ed from just after it is made until it has its
        name (where the platform can rename an open file): one whose writer died (a kill leaves it)
        is told apart by :meth:`remove_dead_partials`."""
        path = self.path(name)
        tmp = f"{path}.partial-{uuid.uuid4().hex}"
        try:
            with guard(self.url(name), "write", size=size):
                with open(tmp, "xb") as f:
                    with contextlib.suppress(OSError):  # a file system without locks: the file is only not told apart
                        _hold(f.fileno())
                    yield f
                    if sync:
                        f.flush()
                        os.fsync(f.fileno())  # the bytes are on disk before the name says they are there
                    if fcntl is not None:
                        os.replace(tmp, path)  # still locked: never seen unlocked under its partial name
                if fcntl is None:
                    os.replace(tmp, path)
            if sync:
                fsync_dir(os.path.dirname(path) or ".")
        except BaseException:
            # ENOTDIR too: under a file no partial was made, and the error raised says why
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(tmp)
            raise

    def remove_dead_partials(self, name: str) -> builtins.list[str]:  # (the class's own list() hides the type here)
        """Remove the partial files of :meth:`put_stream` for ``name`` whose writer is gone (no
        process holds their lock: it was killed); returns their names. A partial file still being
        written is left alone, and so is one made under :data:`PARTIAL_AGE_S` ago (its writer may
        not have locked it yet), and any other name."""
        path = self.path(name)
        folder, partial = os.path.dirname(path), re.compile(re.escape(os.path.basename(path)) + r"\.partial-[0-9a-f]{32}")
        try:
            entries = sorted(os.listdir(folder or ".")) if fcntl is not None else []  # no flock: none told apart
        except OSError:  # no folder (yet): nothing left in it
            entries = []
        removed = []
        for entry in entries:
            if not partial.fullmatch(entry):
                continue
            path = os.path.join(folder, entry)
            with contextlib.suppress(OSError):  # gone, a link, or held (BlockingIOError): left as it is
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | O_BINARY)
                try:
                    _hold(fd)  # BlockingIOError: its writer holds it
                    st = os.fstat(fd)
                    if stat.S_ISREG(st.st_mode) and time.time() - st.st_mtime >= PARTIAL_AGE_S:
                        os.unlink(path)
                        removed.append(entry)
                finally:
                    os.close(fd)
        return removed

    def put(self, name: str, data: bytes, *, sync: bool = True) -> None:
        with self.put_stream(name, size=len(data), sync=sync) as f:
            f.write(data)

    def upload(self, name: str, local: str) -> None:
        """A second name for the local file (a copy where there are no links), renamed into place
        and made durable: no byte is copied where the file system has links."""
        path = self.path(name)
        tmp = f"{path}.partial-{uuid.uuid4().hex}"
        try:
            with guard(self.url(name), "write"):
                try:
                    os.link(local, tmp)
                except OSError:  # no hard links here
                    shutil.copyfile(local, tmp)
                fsync_file(tmp)
                os.replace(tmp, path)
            fsync_dir(os.path.dirname(path) or ".")
        except BaseException:
            # ENOTDIR too: under a file no partial was made, and the error raised says why
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(tmp)
            raise

    def truncate(self, name: str, size: int) -> None:
        with guard(self.url(name), "write"):
            os.truncate(self.path(name), size)

    def open_fd(self, name: str, *, append: bool) -> int:
        mode = os.O_APPEND if append else os.O_TRUNC
        with guard(self.url(name), "write"):
            return os.open(self.path(name), os.O_WRONLY | os.O_CREAT | mode | O_BINARY, 0o644)

    def link_in(self, name: str, local: str, *, exclusive: bool = False) -> bool:
        path = self.path(name)
        with guard(self.url(name), "write"):
            if not exclusive:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            try:
                os.link(local, path)
            except FileExistsError:
                if not exclusive:
                    raise
                return False
            except OSError:  # no hard links on this file system
                if exclusive:
                    os.replace(local, path)
                else:
                    shutil.copyfile(local, path)
        return True

    def put_if_absent(self, name: str, data: bytes) -> bool:
        """A temporary file hard-linked to ``name`` (a link never replaces a file); an exclusive
        create where the filesystem has no hard links."""
        path = self.path(name)
        with guard(self.url(name), "write", size=len(data)):
            if os.path.lexists(path):
                return False
            tmp = f"{path}.partial-{uuid.uuid4().hex}"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    return False
                except OSError:  # no hard links here: an exclusive create (a reader may see it grow)
                    return _create_exclusive(path, data)
                fsync_dir(os.path.dirname(path) or ".")
                return True
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def put_if_unchanged(self, name: str, data: bytes, *, seen: str | None) -> bool:
        if seen is None:
            return self.put_if_absent(name, data)
        raise ValueError(f"{self.url(name)}: put_if_unchanged is for object stores; a local writer holds the output's lock")

    def delete(self, name: str) -> None:
        with guard(self.url(name), "remove"), contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(name))

    def lock(self, name: str, *, wait: bool = True, holder: bytes | None = None) -> contextlib.AbstractContextManager[bool]:
        """The ``flock`` of the file ``name`` (created if missing): the kernel drops it when its
        holder dies. ``holder`` is written into the file, which is unlinked while still held
        when it is let go (a job that opened the old file sees it is not the lock any more)."""
        path = self.path(name)
        fd = lock_file(path, wait=wait)
        if fd is not None and holder is not None:
            try:
                with guard(self.url(name), "create"):
                    os.ftruncate(fd, 0)
                    write_fully(fd, holder)
            except BaseException:
                os.close(fd)
                raise

        def release() -> None:
            assert fd is not None
            if holder is not None:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            os.close(fd)

        return held(fd is not None, release)


def _create_exclusive(path: str, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True
