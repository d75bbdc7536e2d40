"""Local file primitives: make writes durable, append many buffers in one call, map a file, hold a lock.

write_chunks(fd, [header, data, padding])   # one writev per 1024 buffers
sync_files(paths)                           # one syncfs on Linux, however many files
with throwaway_writes(): ...                # files read back and removed by the job itself: not synced
Writeback(staging).start()                  # the disk writes back now, in a thread, what sync_files will wait for
FsyncQueue().add("out/shard-000000.tar")    # flushed to disk in a thread while the next file is written
fd = lock_file("out/.shardkit-lock", wait=False)   # None when another process holds it
made = make_dirs("out/train")               # the directory when this call created it, else None
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import queue
import sys
import threading
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any, BinaryIO

from shardkit.storage.paths import guard

# what a mapped read gives: bytes, or a read-only memory map (slicing either gives bytes)
Buffer = bytes | mmap.mmap
# files under this are read, not mapped: a map holds a file descriptor while it lives
MAP_MIN = 1 << 20


def map_open(f: BinaryIO) -> Buffer:
    """The whole of the open, unbuffered file ``f``: memory-mapped when it is ``MAP_MIN`` or more
    (its pages are the page cache's: no copy, no fresh memory), else read.

    The pages are mapped as they are first touched, not all at once (``MAP_POPULATE``): the
    loader's reader thread touches every page anyway (the checksum, the header scan), a reader
    of one sample touches only its own, and populating a whole pile holds the process's
    address-space lock, which stalls every other thread that allocates memory meanwhile
    (measured: a loader's epoch took 1.2x as long).
    """
    if os.fstat(f.fileno()).st_size >= MAP_MIN:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # no mmap here (a pipe, a platform without it)
            return mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    return f.read()


def is_mapped(buf: object) -> bool:
    """Whether ``buf`` is a memory map :func:`map_open` made (it holds a file descriptor while it lives)."""
    return isinstance(buf, mmap.mmap)


def unmap(buf: Buffer) -> None:
    """Let go of a buffer :func:`map_open` made now, not when it is collected (bytes: nothing to do)."""
    if isinstance(buf, mmap.mmap):
        # views still held by a traceback in flight keep the map alive: it goes with them
        with contextlib.suppress(BufferError):
            buf.close()


def lock_file(path: str, *, wait: bool) -> int | None:
    """A descriptor holding the exclusive ``flock`` of ``path`` (created if missing); None when
    another process holds it and ``wait`` is off. The kernel drops the lock when its holder dies.

    A holder may remove the file before it lets go, so whoever gets a lock checks the name still
    points to the file it locked, and starts again if not: a removed lock file never lets two in.
    """
    import fcntl

    while True:
        with guard(path, "create"):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | O_BINARY, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            mine, current = os.fstat(fd), os.stat(path)
            if (mine.st_dev, mine.st_ino) == (current.st_dev, current.st_ino):
                return fd
        except BlockingIOError:
            os.close(fd)
            return None
        except FileNotFoundError:
            pass  # its holder removed it while we waited
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the name now points to another file, or none: the lock we hold guards nothing


@contextlib.contextmanager
def holding_lock(path: str, *, wait: bool = True) -> Iterator[bool]:
    """Hold the lock file ``path`` (:func:`lock_file`) for the block; yields False (and holds
    nothing) when it is taken and ``wait`` is off."""
    fd = lock_file(path, wait=wait)
    try:
        yield fd is not None
    finally:
        if fd is not None:
            os.close(fd)


def make_dirs(path: str) -> str | None:
    """Create the directory ``path`` and its missing parents, like ``os.makedirs(exist_ok=True)``;
    ``path`` (made absolute) when this call created it, else None (it was there, or another
    process made it meanwhile: only the job that made a directory may remove it again).

    Parents made on the way are not returned: another job may be making a folder of its own
    beside this one in them, and removing them would pull its parent away. The path is taken
    as the operating system takes it (``link/../out`` is beside the link's target), never
    rewritten by text.
    """
    path = _trimmed(path)
    if not os.path.isabs(path):  # an os.chdir later must not change which folder it names
        path = os.path.join(os.getcwd(), path)
    for _ in range(3):  # a parent removed between its making and this mkdir: make it again
        try:
            os.mkdir(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise
            return None
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if not parent:
                raise
            os.makedirs(parent, exist_ok=True)
            continue
        return path
    os.mkdir(path)  # the last try: its error names the path
    return path


def _trimmed(path: str) -> str:
    """``path`` without trailing separators and ``.`` parts (``out/``, ``out/.``: ``out``), which
    name the same directory, so its parent is the one above it; nothing else is rewritten."""
    seps = os.sep + (os.altsep or "")
    while len(path) > 1:
        if path[-1] in seps:
            path = path[:-1]
        elif path[-1] == "." and path[-2] in seps:
            path = path[:-2] or path[:1]
        else:
            break
    return path


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


# set while a job writes files that it reads back and removes itself before anything lasting
# names them (the piles of an eager shuffle's first pass): see throwaway_writes
_THROWAWAY: ContextVar[bool] = ContextVar("shardkit_throwaway_writes", default=False)


@contextlib.contextmanager
def throwaway_writes() -> Iterator[None]:
    """Within the block (on this thread), :func:`sync_files` flushes nothing.

    For intermediate files a job reads back and removes before it publishes anything: a crash
    leaves them in a staging directory that no manifest outside it names, so making them durable
    would only cost the disk's time (a tenth of a second for 200 MB of an eager shuffle's piles,
    a sixth of its run).
    """
    token = _THROWAWAY.set(True)
    try:
        yield
    finally:
        _THROWAWAY.reset(token)


def sync_files(paths: Sequence[str]) -> None:
    """Flush the data of the local files ``paths`` to disk before anything points at them.

    On Linux one ``syncfs`` of their file system does it in one call, however many files there
    are (hundreds of piles cost hundreds of ``fsync`` calls); elsewhere each file is fsynced.
    Inside :func:`throwaway_writes` it does nothing.
    """
    if not paths or _THROWAWAY.get():
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


class Writeback:
    """Have the disk write back the dirty pages of the local file system holding ``path`` now,
    in a thread, ahead of the :func:`sync_files` that must wait for them before publishing.

    A writer that makes its files durable calls :meth:`start` after each large write: the disk
    then works while the writer makes its next bytes, and the last sync finds little left (by
    hand, ``PileWriter``'s ``close()`` took about half as long at 20,000 samples of 5 KB). One
    ``syncfs`` runs at a time: :meth:`start` while one runs does nothing. ``syncfs`` reports a
    write error once, to each descriptor opened before it, at its next call: so every call goes
    through one descriptor, opened at the first :meth:`start`, and :meth:`finish` makes a last
    call on it and raises the first error any call met. An error from any moment of the writer's
    life is reported, to it. Where there is no ``syncfs`` (not Linux) it does nothing.

        writeback = Writeback("out/.shardkit-staging-1a2b")
        writeback.start()    # after each flush
        writeback.finish()   # before publishing: the last sync, and what any met raised
        writeback.close()    # always: waits for the one running, lets the descriptor go
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._thread: threading.Thread | None = None
        self._fd: int | None = None
        self._error: OSError | None = None

    def start(self) -> None:
        """Start writing back unless a writeback is running (or there is no ``syncfs``)."""
        if (self._thread is not None and self._thread.is_alive()) or _syncfs() is None:
            return
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except OSError as e:
                self._error = self._error or e
                return
        self._thread = threading.Thread(target=self._sync, args=(self._fd,), name="shardkit-writeback", daemon=True)
        self._thread.start()

    def _sync(self, fd: int) -> None:
        if _syncfs()(fd) != 0:
            error = ctypes.get_errno()
            self._error = self._error or OSError(error, os.strerror(error))

    def finish(self) -> None:
        """Wait for the writeback running, make the last one here, then raise the first error
        any met.

        Raises:
            StorageError: naming ``path``: the disk could not write back what was written.
        """
        self._join()
        if self._fd is not None:
            self._sync(self._fd)
        error, self._error = self._error, None
        if error is not None:
            with guard(self.path, "flush to disk"):
                raise error

    def close(self) -> None:
        """Wait for the writeback running, if any, and let the descriptor go (idempotent),
        raising nothing: for a writer that publishes nothing, and after :meth:`finish`."""
        self._join()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None


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


class FsyncQueue:
    """Flush finished local files to disk one after another in a thread, while the writer makes
    the next: :func:`fsync_file` for each, without the writer waiting for the disk.

    Unlike :class:`Writeback`, which writes back the whole file system (``syncfs``), only the
    files added are flushed: not the other files of the same disk that are about to be removed.

        flushed = FsyncQueue()
        flushed.add("staging/shard-000000.tar")   # after the file's last write
        flushed.finish()                           # before a manifest names them: waits, raises the first error
        flushed.close()                            # always (idempotent): waits, raises nothing
    """

    def __init__(self) -> None:
        self._paths: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def add(self, path: str) -> None:
        """Flush ``path`` once the files added before it are.

        Raises:
            StorageError: naming a file added before that could not be flushed (then, as from
                :meth:`finish`, once): the writer stops now rather than at its end.
        """
        if self._error is not None:
            self.finish()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="shardkit-fsync", daemon=True)
            self._thread.start()
        self._paths.put(path)

    def _run(self) -> None:
        while (path := self._paths.get()) is not None:
            if self._error is None:  # after a failure the rest is not flushed: finish() raises anyway
                try:
                    fsync_file(path)
                except Exception as e:  # a StorageError naming the file, raised by finish()
                    self._error = e

    def finish(self) -> None:
        """Wait until every file added is flushed.

        Raises:
            StorageError: naming the first file that could not be flushed.
        """
        self.close()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Wait for the thread, raising nothing (idempotent): for a writer that publishes nothing."""
        if self._thread is not None:
            self._paths.put(None)
            self._thread.join()
            self._thread = None


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
