"""The one interface to the bytes a dataset holds: a ``Store`` of named files under one root URL.

A store is addressed by names relative to its root (``"pile-000003.tar"``, ``"shardkit.json"``)
and says what it can do by capability flags, never by where it lives: callers ask
``store.supports_put_if_absent``, not whether a URL is local. Every failure comes out as the
shardkit error naming the file's full URL (:func:`~shardkit.storage.paths.guard`).

    store = storage.store_for("s3://bucket/data")
    text = store.read("shardkit.json")
    won = store.put_if_absent("shardkit.g000002.json", data)   # where supports_put_if_absent
"""

from __future__ import annotations

import abc
import contextlib
import datetime
import io
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, ClassVar

from shardkit.errors import ConfigError, CorruptShardError, DatasetNotFoundError
from shardkit.storage.local import Buffer, map_open, unmap

log = logging.getLogger(__name__)

Check = Callable[[Buffer], "str | None"]

# tries at a file whose bytes came back wrong (a transfer torn without an error) before they are called corrupt
CHECKED_READS = 3


@dataclass(frozen=True)
class Entry:
    """A file in a listing: its name, size and when it was last written (an aware time)."""

    name: str
    size: int
    modified: datetime.datetime


class Store(abc.ABC):
    """Files under one root URL: read whole or in ranges, list, write atomically, delete, lock.

    Capability flags (class attributes; an instance may narrow them) say what a backend can do:

    - ``supports_writes`` / ``supports_deletes`` / ``supports_listing``: what the names say.
    - ``supports_put_if_absent``: :meth:`put_if_absent` is atomic (of racing writers exactly
      one wins); where it is False the method raises :class:`~shardkit.errors.ConfigError`.
    - ``supports_locks``: :meth:`lock` gives a lock the holder's death releases.
    - ``supports_mapping``: reading a file whole costs no copy, its size is one cheap look and a
      read is never torn, so a check that fails is not worth reading again. Where it is False
      the bytes travel (an object store): they are worth caching and re-reading when torn.
    - ``caches_reads``: whole files read through :meth:`read_checked` are kept (a cache): a
      caller wanting part of a file it will come back to reads it whole, not a range.
    - :meth:`local_file` (a path, or None): the store's files are files of this machine, so a
      writer may hold a descriptor on one (:meth:`open_fd`), link a staged file in
      (:meth:`link_in`) and stage its work beside them; where it is None files travel by
      :meth:`put` and :meth:`upload`.

    Example::

        store = MemoryStore()
        store.put("a.bin", b"abc")
        assert store.read_range("a.bin", 1, 3) == b"bc"
    """

    supports_writes: ClassVar[bool] = True
    supports_deletes: ClassVar[bool] = True
    supports_listing: ClassVar[bool] = True
    supports_put_if_absent: bool = False
    supports_locks: ClassVar[bool] = False
    supports_mapping: ClassVar[bool] = False
    caches_reads: ClassVar[bool] = False

    def __init__(self, root: str) -> None:
        self.root = root

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r})"

    def url(self, name: str) -> str:
        """The full URL of the file ``name`` (the URL errors name)."""
        return self.root.rstrip("/") + "/" + name if name else self.root

    def sub(self, path: str) -> Store:
        """The store of the directory ``path`` under this one (what a mounted store answers for
        the URLs below its root). Stores that URLs reach directly are made by ``store_for``."""
        raise ValueError(f"{self.url(path)}: a {type(self).__name__} is reached by its URL (storage.store_for), not as a sub-store")

    # -- reading -------------------------------------------------------------------------------
    @abc.abstractmethod
    def read(self, name: str) -> bytes:
        """The whole file. Raises DatasetNotFoundError when it is missing."""

    @abc.abstractmethod
    def read_range(self, name: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive); fewer only when the file is shorter."""

    @abc.abstractmethod
    def size(self, name: str) -> int:
        """The file's size in bytes. Raises DatasetNotFoundError when it is missing."""

    def exists(self, name: str) -> bool:
        try:
            self.size(name)
        except DatasetNotFoundError:
            return False
        return True

    def local_file(self, name: str = "") -> str | None:
        """The path of ``name`` (``""``: the root) on this machine's file system where the store's
        files are local files; None where they are not (an object store, memory)."""
        return None

    def modified(self, name: str) -> datetime.datetime | None:
        """When the file ``name`` was last written (an aware time); None when it is missing."""
        return next((e.modified for e in self.entries(missing_ok=True) if e.name == name), None)

    def is_dir(self, name: str) -> bool:
        """Whether ``name`` (``""``: the root) names a directory. An object store has none: there a
        name ending in ``/`` (or the root given so) is taken for one."""
        return self.url(name).endswith("/")

    def version(self, name: str) -> str | None:
        """What the file ``name`` is now, as a string that changes when it is rewritten (None:
        missing, or a store that cannot say): what a cache of facts about a file is keyed by."""
        try:
            return str(self.size(name))
        except DatasetNotFoundError:
            return None

    def remove_dead_partials(self, name: str) -> list[str]:
        """Remove what writes of ``name`` killed before they finished left beside it; returns the
        names removed. Here nothing: a store whose writes appear whole leaves nothing."""
        return []

    def lasting_version(self, name: str) -> str | None:
        """:meth:`version`, when any later change to the file is sure to change it (None here:
        a store that cannot promise that). A fact about the file's bytes, such as that they
        passed their checksum, may be remembered under it, and trusted while it stays the same."""
        return None

    def open_read(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        """A binary file object reading ``name`` from its start (seek where the store can)."""
        return contextlib.nullcontext(io.BytesIO(self.read(name)))

    def read_whole(self, name: str, *, size: int | None = None) -> Buffer:
        """The whole file as a read-only buffer: mapped without a copy where the store can, read
        in concurrent ranges where ``size`` (the size a manifest says) lets it."""
        return self.read(name)

    def download(self, name: str, local: str, *, size: int) -> bool:
        """Write the file ``name`` (``size`` bytes, as a manifest says) into the local file
        ``local`` (made or replaced) as it arrives, where this store reads such a file in one
        request; False, with nothing written, where it does not (the caller reads it whole
        instead). Here: False."""
        return False

    def read_checked_into(self, name: str, local: str, *, size: int, check: Check) -> Buffer | None:
        """:meth:`read_checked`, the bytes written into the local file ``local`` on their way in
        (:meth:`download`) and returned mapped from it, so they are never held twice; None where
        the store does not download ``name`` that way.

        Raises:
            CorruptShardError: the bytes fail the check every time.
        """

        def downloaded() -> Buffer | None:
            if not self.download(name, local, size=size):
                return None
            with open(local, "rb", buffering=0) as f:
                return map_open(f)

        return self._until_right(name, downloaded, check, CHECKED_READS)

    def read_checked(self, name: str, *, size: int, check: Check, first_check: Check | None = None) -> Buffer:
        """The file ``name`` of ``size`` bytes with ``check(buffer)`` (a problem in words, or None)
        passed, read again while a transfer comes back wrong (``first_check`` is for a cache).

        Raises:
            CorruptShardError: the bytes fail the check every time (or once, where a read is never torn).
        """
        tries = 1 if self.supports_mapping else CHECKED_READS
        data = self._until_right(name, lambda: self.read_whole(name, size=size), check, tries)
        assert data is not None  # read_whole always reads
        return data

    def _until_right(self, name: str, read: Callable[[], Buffer | None], check: Check, tries: int) -> Buffer | None:
        """``read()`` again until ``check`` passes what it gives, at most ``tries`` times; None
        when ``read`` gives None (it read nothing).

        Raises:
            CorruptShardError: naming the file and the last problem (and the tries, if more than one).
        """
        problem = None
        for tried in range(1, tries + 1):
            data = read()
            if data is None:
                return None
            problem = check(data)
            if problem is None:
                return data
            unmap(data)  # a map that failed is nobody's
            if tried < tries:
                log.info("%s: %s (read %d of %d), reading it again", self.url(name), problem, tried, tries)
        said = f" (read {tries} times)" if tries > 1 else ""
        raise CorruptShardError(f"{self.url(name)}: {problem}{said}")

    # -- listing -------------------------------------------------------------------------------
    @abc.abstractmethod
    def entries(self, *, missing_ok: bool = False) -> list[Entry]:
        """The files directly under the root, sorted by name, from a fresh listing.

        Raises:
            DatasetNotFoundError: the root is not there (unless ``missing_ok``: then none).
        """

    def list(self, *, missing_ok: bool = False) -> list[str]:
        """Sorted names of the entries directly under the root (directories too, where there are any)."""
        return [e.name for e in self.entries(missing_ok=missing_ok)]

    # -- writing -------------------------------------------------------------------------------
    @abc.abstractmethod
    def put(self, name: str, data: bytes, *, sync: bool = True) -> None:
        """Make ``data`` the file ``name``, atomically: a reader sees the old file or the new, whole.
        ``sync`` off: the bytes need not be on disk when it returns (a job's own record that a
        later check covers, or files synced together before anything names them)."""

    def put_stream(self, name: str, *, size: int | None = None, sync: bool = True) -> contextlib.AbstractContextManager[IO[bytes]]:
        """A file object whose bytes become ``name`` when the block exits cleanly (and nothing
        when it raises). ``size``, the bytes about to be written when known, is named if the
        disk fills up; ``sync`` as for :meth:`put`. Here: gathered in memory and :meth:`put` whole."""
        return _gathered(self, name)

    def truncate(self, name: str, size: int) -> None:
        """Cut the file ``name`` back to its first ``size`` bytes (not synced). Here: rewritten whole."""
        self.put(name, self.read_range(name, 0, size), sync=False)

    def open_fd(self, name: str, *, append: bool) -> int:
        """A descriptor writing the local file ``name`` (created if missing; appended to, or emptied
        first): for the writers whose hot path keeps one open or writes it in many calls (pass 1's
        part files, a pile assembled from them). The caller closes it. A reader may see the file
        grow: it is for a job's own staging, never for a file a manifest names.

        Raises:
            ConfigError: the store's files are not local files (:meth:`local_file` is None).
        """
        raise ConfigError(f"{self.url(name)}: this store holds no local files to write through a descriptor; stage them locally")

    def link_in(self, name: str, local: str, *, exclusive: bool = False) -> bool:
        """Give the local file ``local`` the second name ``name`` here, replacing what ``name``
        held (a copy where the file system has no links); the file is not synced. ``exclusive``:
        only where ``name`` is free (False when it is taken, True when linked), and where there
        are no links the file is moved in, not copied (a name the caller chose free). Returns True
        when linked.

        Raises:
            ConfigError: the store's files are not local files (:meth:`local_file` is None).
        """
        raise ConfigError(f"{self.url(name)}: this store holds no local files to link {local} in; upload it")

    def upload(self, name: str, local: str) -> None:
        """Copy the local file ``local`` to ``name`` (atomically, as :meth:`put`)."""
        with open(local, "rb") as f:
            self.put(name, f.read())

    def put_if_absent(self, name: str, data: bytes) -> bool:
        """Create ``name`` holding ``data`` unless it exists; True when this call created it.

        Raises:
            ConfigError: the store has no atomic create (``supports_put_if_absent`` is False).
        """
        raise ConfigError(f"{self.url(name)}: this store has no conditional write (If-None-Match); it cannot commit safely")

    def put_if_unchanged(self, name: str, data: bytes, *, seen: str | None) -> bool:
        """Replace ``name`` with ``data`` only if it is still the version ``seen`` (:meth:`version`;
        None: only if it is absent); True when this call wrote it.

        Raises:
            ConfigError: the store cannot compare and replace in one step.
        """
        if seen is None:
            return self.put_if_absent(name, data)
        raise ConfigError(f"{self.url(name)}: this store has no conditional write (If-Match); it cannot commit safely")

    def upload_if_absent(self, name: str, local: str, *, name_is_mine: bool = False) -> bool:
        """Copy the local file ``local`` to ``name`` unless something is there; True when this
        call created it. With ``name_is_mine`` (no other job writes ``name``), a file there that
        holds the same bytes is a retry of this upload and counts as created."""
        with open(local, "rb") as f:
            data = f.read()
        if self.put_if_absent(name, data):
            return True
        return name_is_mine and self.read(name) == data

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Remove the file ``name``; nothing happens when it is missing."""

    def lock(self, name: str, *, wait: bool = True, holder: bytes | None = None) -> contextlib.AbstractContextManager[bool]:
        """A context holding the exclusive lock named ``name`` (True), or not (False: another
        holder, and ``wait`` is off). With ``holder``, the lock says who holds it (read back by
        :meth:`read` of ``name``, for the message another job gets) and is removed when let go.

        Raises:
            ConfigError: the store has no lock (``supports_locks`` is False).
        """
        raise ConfigError(f"{self.url(name)}: this store has no lock a dead holder gives back; one writer at a time is yours to keep")


class WrappingStore(Store):
    """A store that hands every call to ``inner``: the base of stores that add to another
    (a cache, injected faults). Its flags are the inner store's."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner.root)
        self.inner = inner
        self.supports_mapping = inner.supports_mapping  # type: ignore[misc]
        self.supports_locks = inner.supports_locks  # type: ignore[misc]

    @property
    def supports_put_if_absent(self) -> bool:  # type: ignore[override]  # asked of the inner store when wanted: it may connect
        return self.inner.supports_put_if_absent

    def url(self, name: str) -> str:
        return self.inner.url(name)

    def sub(self, path: str) -> Store:
        """The inner store's sub-store (what is added here stays with the root)."""
        return self.inner.sub(path)

    def read(self, name: str) -> bytes:
        return self.inner.read(name)

    def read_range(self, name: str, start: int, end: int) -> bytes:
        return self.inner.read_range(name, start, end)

    def size(self, name: str) -> int:
        return self.inner.size(name)

    def exists(self, name: str) -> bool:
        return self.inner.exists(name)

    def is_dir(self, name: str) -> bool:
        return self.inner.is_dir(name)

    def local_file(self, name: str = "") -> str | None:
        return self.inner.local_file(name)

    def modified(self, name: str) -> datetime.datetime | None:
        return self.inner.modified(name)

    def open_read(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        return self.inner.open_read(name)

    def version(self, name: str) -> str | None:
        return self.inner.version(name)

    def lasting_version(self, name: str) -> str | None:
        return self.inner.lasting_version(name)

    def remove_dead_partials(self, name: str) -> list[str]:
        return self.inner.remove_dead_partials(name)

    def read_whole(self, name: str, *, size: int | None = None) -> Buffer:
        return self.inner.read_whole(name, size=size)

    def read_checked(self, name: str, *, size: int, check: Check, first_check: Check | None = None) -> Buffer:
        return self.inner.read_checked(name, size=size, check=check, first_check=first_check)

    def download(self, name: str, local: str, *, size: int) -> bool:
        return self.inner.download(name, local, size=size)

    def entries(self, *, missing_ok: bool = False) -> list[Entry]:
        return self.inner.entries(missing_ok=missing_ok)

    def list(self, *, missing_ok: bool = False) -> list[str]:
        return self.inner.list(missing_ok=missing_ok)

    def put(self, name: str, data: bytes, *, sync: bool = True) -> None:
        self.inner.put(name, data, sync=sync)

    def put_stream(self, name: str, *, size: int | None = None, sync: bool = True) -> contextlib.AbstractContextManager[IO[bytes]]:
        return self.inner.put_stream(name, size=size, sync=sync)

    def truncate(self, name: str, size: int) -> None:
        self.inner.truncate(name, size)

    def open_fd(self, name: str, *, append: bool) -> int:
        return self.inner.open_fd(name, append=append)

    def link_in(self, name: str, local: str, *, exclusive: bool = False) -> bool:
        return self.inner.link_in(name, local, exclusive=exclusive)

    def upload(self, name: str, local: str) -> None:
        self.inner.upload(name, local)

    def put_if_absent(self, name: str, data: bytes) -> bool:
        return self.inner.put_if_absent(name, data)

    def put_if_unchanged(self, name: str, data: bytes, *, seen: str | None) -> bool:
        return self.inner.put_if_unchanged(name, data, seen=seen)

    def upload_if_absent(self, name: str, local: str, *, name_is_mine: bool = False) -> bool:
        return self.inner.upload_if_absent(name, local, name_is_mine=name_is_mine)

    def delete(self, name: str) -> None:
        self.inner.delete(name)

    def lock(self, name: str, *, wait: bool = True, holder: bytes | None = None) -> contextlib.AbstractContextManager[bool]:
        return self.inner.lock(name, wait=wait, holder=holder)


@contextlib.contextmanager
def _gathered(store: Store, name: str) -> Iterator[IO[bytes]]:
    buffer = io.BytesIO()
    yield buffer
    store.put(name, buffer.getvalue())


@contextlib.contextmanager
def held(acquired: bool, release: Callable[[], None]) -> Iterator[bool]:
    """``acquired`` for the block, then ``release()`` when it was: what :meth:`Store.lock` yields."""
    try:
        yield acquired
    finally:
        if acquired:
            release()
