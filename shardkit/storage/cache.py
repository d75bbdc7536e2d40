"""Keep local copies of remote piles in a size-limited, least-recently-used cache that the processes of one machine share.

Reading a dataset from an object store costs a download of every pile every epoch. A
:class:`PileCache` keeps what was downloaded on local disk, so the next epoch reads it there:

    cache = PileCache("/scratch/cache", limit="200GiB")
    buf = cache.get("s3://bucket/ds/pile-000003.tar", size=pile.bytes, fetch=download, check=crc_check)
    # download() returns the remote bytes; crc_check(buf) returns None, or what is wrong with them

On disk everything lives in ``DIRECTORY/shardkit-piles/``, and the cache only ever deletes names of
its own making there, so nothing else in the directory is at risk:

- ``3f2a9c0d1e2b4a5f-pile-000003.tar``: a pile, named by 16 hex digits of its URL's SHA-256 (two
  datasets' ``pile-000003.tar`` never meet) and its base name, for people;
- ``3f2a9c0d1e2b4a5f.lock``: that entry's lock, an empty file held with ``flock`` while one process
  looks at the entry, downloads it or evicts it;
- ``3f2a9c0d1e2b4a5f.partial-<uuid>``: a pile being written (downloaded straight into it where
  the store streams the pile, else written once fetched), renamed into place when whole, so a
  pile's name never shows a torn file, even if its writer is killed;
- ``evict.lock``: held by the one process that evicts at a time.

Locking. A hit takes no lock: a name only ever points to a whole file, never changed in place. A
miss takes the entry's lock, blocking: the first process downloads while the others wait (in the
kernel) and then find the file; the kernel releases a dead holder's lock. Whoever holds an
entry's lock removes its partial files: their writers are dead. Eviction holds ``evict.lock`` and
takes entry locks without waiting, passing over entries another process holds. A lock file is
removed only by its holder, and a process that gets a lock checks the name still points to the
file it locked (else it starts again), so a removed lock file never lets two processes in.

Eviction runs after each pile stored, while the cache's own files add up to more than ``limit``,
least recently used first (a file's modification time, set on every hit), never the pile just
stored. A file another process has open or mapped keeps its data for it (POSIX). A pile larger
than ``limit`` bypasses the cache (fetched every time, never stored) instead of evicting
everything else; a full disk costs the copy, never the read. Both are logged as warnings.

The directory must be on a local file system of the machine whose processes share it: ``flock``
is not reliable across machines on network file systems.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

from shardkit import io_errors
from shardkit._util import check_int, check_path, format_size, parse_size, shown
from shardkit.errors import ConfigError, CorruptShardError, DatasetNotFoundError
from shardkit.storage.local import Buffer, holding_lock, map_open, unmap

log = logging.getLogger(__name__)

Check = Callable[[Buffer], str | None]

SUBDIRECTORY = "shardkit-piles"
EVICT_LOCK = "evict.lock"
# the only names the cache removes: entries, their lock files and their partial files
_ENTRY = re.compile(r"[0-9a-f]{16}-[A-Za-z0-9._-]{1,80}")
_LOCK = re.compile(r"[0-9a-f]{16}\.lock")
_PARTIAL = re.compile(r"[0-9a-f]{16}\.partial-[0-9a-f]{32}")


def entry_name(url: str) -> str:
    """The cache's file name for ``url``: ``3f2a9c0d1e2b4a5f-pile-000003.tar``."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    base = re.split(r"[?#]", url, maxsplit=1)[0].rstrip("/").rsplit("/", 1)[-1]
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", base)[-80:] or "pile"
    return f"{digest}-{readable}"


@dataclass(frozen=True)
class CacheStats:
    """What one :class:`PileCache` object did, in this process.

    Attributes:
        hits: piles read from a cached copy.
        misses: piles fetched to be cached (stored, unless the disk was full).
        bypasses: piles larger than the limit, fetched and not stored.
        evictions: cached piles removed to keep under the limit.
        bytes_fetched: bytes the fetch functions returned (misses and bypasses).
    """

    hits: int = 0
    misses: int = 0
    bypasses: int = 0
    evictions: int = 0
    bytes_fetched: int = 0


class PileCache:
    """A directory of local copies of remote piles, at most ``limit`` bytes, shared by processes
    (see the module docstring; :meth:`stats` counts what this object did).

    Args:
        directory: a local directory; the cache keeps its files in its ``shardkit-piles``
            subdirectory, created if missing.
        limit: the most bytes the cached piles may take (``"200GiB"``, an int), or None for no
            limit. Other files in the directory do not count, and are never removed.

    Raises:
        ConfigError: ``directory`` is not a local path, or ``limit`` is not a size (the message
            names ``cache_dir`` or ``cache_limit``).
        StorageError: the directory cannot be created or written to.

    A copy sent to another process (a DataLoader worker) works on the same directory, its
    counters starting from zero.
    """

    def __init__(self, directory: str | os.PathLike[str], limit: int | str | None = None) -> None:
        path = check_path("cache_dir", directory)
        path = path[len("file://") :] if path.startswith("file://") else path
        if "://" in path:
            raise ConfigError(f"cache_dir: expected a local directory (the cache keeps copies on this machine's disk), got {shown(path)}")
        self._limit = None if limit is None else parse_size(limit, what="cache_limit")
        self._root = os.path.join(os.path.abspath(path), SUBDIRECTORY)
        self._setup()
        try:
            os.makedirs(self._root, exist_ok=True)
            # taking the eviction lock once shows the directory is writable, now rather than at the first miss
            with holding_lock(os.path.join(self._root, EVICT_LOCK)):
                self._tidy()
        except OSError as e:
            raise io_errors.translate(e, self._root, "use it as the pile cache", scheme=None, path=self._root, size=None) from e

    def _setup(self) -> None:
        self._mutex = threading.Lock()
        self._counts = dict.fromkeys((f.name for f in fields(CacheStats)), 0)
        self._warned: set[object] = set()
        # cached copies (path, inode, size) that passed first_check through this object
        self._trusted: set[tuple[str, int, int]] = set()

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self._root, "limit": self._limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._root, self._limit = state["root"], state["limit"]
        self._setup()

    @property
    def directory(self) -> str:
        """The subdirectory holding the cache's files (``DIRECTORY/shardkit-piles``)."""
        return self._root

    @property
    def limit(self) -> int | None:
        """The most bytes the cached piles may take, or None."""
        return self._limit

    def stats(self) -> CacheStats:
        """The counts so far (this object, this process)."""
        with self._mutex:
            return CacheStats(**self._counts)

    def get(
        self,
        url: str,
        *,
        size: int,
        fetch: Callable[[], Buffer],
        check: Check | None = None,
        first_check: Check | None = None,
        fetch_checks: Check | None = None,
        fetch_into: Callable[[str], Buffer | None] | None = None,
    ) -> Buffer:
        """The bytes of the pile at ``url``: from its cached copy, else from ``fetch()`` (then cached).

        Args:
            url: where the pile lives; the cache entry is named after it.
            size: its size in bytes. A cached copy of another size is dropped and fetched again.
            fetch: returns the pile's bytes from ``url`` (ranged reads and retries are its business).
            check: returns None when a pile's bytes are right, else what is wrong with them. A
                cached copy that fails is dropped and fetched again, once.
            first_check: the check a cached copy passes the first time this cache object uses
                it (a full checksum, say, where ``check`` is cheaper), and the fetch that replaces
                a copy found wrong; None: ``check``. A copy on disk may have changed since it was
                written, by another process, a disk or a person.
            fetch_checks: the check ``fetch()`` and ``fetch_into`` apply to what they return
                themselves (a store's checked read): fetched bytes are not checked with it a second time.
            fetch_into: writes the pile into the local file it is given as it downloads, returning it mapped
                from there (no second copy in memory), or None: a miss is then ``fetch()`` and a write.

        Raises:
            CorruptShardError: the fetched bytes are not ``size`` long or fail ``check`` (then
                nothing is stored): ``URL: PROBLEM``.
            Whatever ``fetch`` raises.
        """
        size = check_int("size", size, low=0)
        if self._limit is not None and size > self._limit:
            return self._bypass(url, size, fetch, None if check is fetch_checks else check)
        name = entry_name(url)
        path = os.path.join(self._root, name)
        found, _ = _look(path, size, check, first_check, self._trusted)
        if found is not None:
            return self._hit(path, found)
        with contextlib.suppress(OSError):  # removed since (a cleaner of temporary files, a person); else the lock says why not
            os.makedirs(self._root, exist_ok=True)
        with holding_lock(self._lock_path(name)):  # waits while another process downloads this very pile
            self._remove_partials(name[:16])
            found, problem = _look(path, size, check, first_check, self._trusted)
            if found is not None:
                return self._hit(path, found)
            if problem is not None:
                log.warning("%s: the cached copy of %s %s; fetching it again", path, url, problem)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                check = first_check or check  # the copy was wrong: the fresh bytes pass the full check or are called corrupt
            streamed = self._streamed(url, path, size, fetch_into, None if check is fetch_checks else check) if fetch_into else None
            if streamed is not None:
                data, stored = streamed
            else:
                data = self._fetch("misses", url, size, fetch, None if check is fetch_checks else check)
                stored = self._store(url, path, data)
        if stored and self._limit is not None:
            self._evict(keep=name, limit=self._limit)
        return data

    def _count(self, what: str, n: int = 1) -> None:
        with self._mutex:
            self._counts[what] += n

    def _warn_once(self, key: object, message: str, *args: object) -> None:
        """Log ``message`` as a warning the first time ``key`` comes up, later only for debugging."""
        with self._mutex:
            first = key not in self._warned
            self._warned.add(key)
        log.log(logging.WARNING if first else logging.DEBUG, message, *args)

    def _lock_path(self, digest_or_name: str) -> str:
        return os.path.join(self._root, f"{digest_or_name[:16]}.lock")

    def _hit(self, path: str, data: Buffer) -> Buffer:
        with contextlib.suppress(OSError):  # evicted meanwhile, or another user's file: the copy in hand is whole either way
            now = time.time_ns()
            os.utime(path, ns=(now, now))
        self._count("hits")
        return data

    def _fetch(self, counter: str, url: str, size: int, fetch: Callable[[], Buffer], check: Check | None) -> Buffer:
        self._count(counter)
        data = fetch()
        self._count("bytes_fetched", len(data))
        if len(data) != size:
            raise CorruptShardError(f"{url}: fetched {len(data)} bytes, expected {size}")
        problem = check(data) if check is not None else None
        if problem is not None:
            raise CorruptShardError(f"{url}: {problem}")
        return data

    def _bypass(self, url: str, size: int, fetch: Callable[[], Buffer], check: Check | None) -> Buffer:
        self._warn_once(
            "larger than the limit",
            "%s: %s is larger than the whole cache (cache_limit=%s), so it is read from the source every time and never "
            "cached; raise cache_limit to cache it (said once per cache, for the first such pile)",
            url,
            format_size(size),
            format_size(self._limit or 0),
        )
        return self._fetch("bypasses", url, size, fetch, check)

    def _streamed(
        self, url: str, path: str, size: int, fetch_into: Callable[[str], Buffer | None], check: Check | None
    ) -> tuple[Buffer, bool] | None:
        """The pile downloaded into a partial file by ``fetch_into``, mapped, checked with ``check``
        and moved under ``path``, with whether it is cached there; None when the store would not
        stream it or the stream failed short of a corrupt or missing file (nothing is left
        behind: the caller reads it whole, and that read or the cache's write names any fault)."""
        partial = _partial(path)
        try:
            data = fetch_into(partial)
            problem = check(data) if check is not None and data is not None else None
        except BaseException as e:
            _discard(partial)
            if not isinstance(e, Exception) or isinstance(e, (CorruptShardError, DatasetNotFoundError)):
                raise
            log.debug("%s: the download of %s into the cache failed (%s); reading it whole", path, url, e)
            return None
        if data is None:
            _discard(partial)
            return None
        self._count("misses")
        self._count("bytes_fetched", len(data))
        if problem is None and len(data) != size:
            problem = f"fetched {len(data)} bytes, expected {size}"
        if problem is not None:
            _discard(partial)
            unmap(data)
            raise CorruptShardError(f"{url}: {problem}")
        return data, self._install(url, partial, path, len(data))  # uncached, the map still holds the bytes

    def _store(self, url: str, path: str, data: Buffer) -> bool:
        """Put ``data`` under ``path``, all or nothing; False (and a warning) when it could not be written."""
        partial = _partial(path)
        try:
            with open(partial, "xb") as f:
                f.write(data)
        except BaseException as e:
            _discard(partial)
            if not isinstance(e, OSError):
                raise
            return self._not_cached(url, path, e, len(data))
        return self._install(url, partial, path, len(data))

    def _install(self, url: str, partial: str, path: str, size: int) -> bool:
        """Move the whole file ``partial`` under ``path``, marked used now; False (and a warning) when it could not be."""
        try:
            now = time.time_ns()  # finer than the file system's clock: stores in one tick keep their order
            os.utime(partial, ns=(now, now))
            os.replace(partial, path)
        except OSError as e:
            _discard(partial)
            return self._not_cached(url, path, e, size)
        return True

    def _not_cached(self, url: str, path: str, error: OSError, size: int) -> bool:
        reason = io_errors.translate(error, path, "store it", scheme=None, path=path, size=size)
        self._warn_once(error.errno, "%s: not cached, read from the source instead (%s)", url, reason)
        return False

    def _remove_partials(self, digest: str, names: Iterable[str] | None = None) -> None:
        """Remove the partial files of the entry ``digest`` (among ``names``, else all), whose lock the
        caller holds: a partial file is written only under its entry's lock, so their writers are dead."""
        for name in os.listdir(self._root) if names is None else names:
            if name[:16] == digest and _PARTIAL.fullmatch(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self._root, name))

    def _evict(self, *, keep: str, limit: int) -> None:
        """Remove least recently used entries (never ``keep``, nor one another process holds) until under ``limit``."""
        with holding_lock(os.path.join(self._root, EVICT_LOCK)):
            entries = self._tidy()
            total = sum(size for _, size, _ in entries)
            for mtime, size, name in sorted(entries):
                if total <= limit:
                    break
                if name != keep and self._drop(name, mtime):
                    total -= size
                    self._count("evictions")
        if total > limit:
            log.debug("%s: %s cached, over cache_limit=%s: the rest is in use", self._root, format_size(total), format_size(limit))

    def _tidy(self) -> list[tuple[int, int, str]]:
        """Remove what dead processes left (see :meth:`_remove_strays`); returns the entries, as :meth:`_scan`."""
        entries, partials, locks = self._scan()
        present = {name[:16] for _, _, name in entries}
        self._remove_strays(partials, (locks | {name[:16] for name in partials}) - present)
        return entries

    def _scan(self) -> tuple[list[tuple[int, int, str]], list[str], set[str]]:
        """The entries as ``(mtime_ns, size, name)``, the partial files' names and the digests of the lock files."""
        entries, partials, locks = [], [], set()
        with os.scandir(self._root) as found:
            for item in found:
                with contextlib.suppress(OSError):  # removed meanwhile
                    if not item.is_file(follow_symlinks=False):
                        continue
                    if _ENTRY.fullmatch(item.name):
                        stat = item.stat(follow_symlinks=False)
                        entries.append((stat.st_mtime_ns, stat.st_size, item.name))
                    elif _PARTIAL.fullmatch(item.name):
                        partials.append(item.name)
                    elif _LOCK.fullmatch(item.name):
                        locks.add(item.name[:16])
        return entries, partials, locks

    def _remove_strays(self, partials: list[str], orphans: set[str]) -> None:
        """Remove the partial files of dead writers, and the lock files ``orphans`` of entries that are gone,
        each under its lock taken without waiting: a live process holding it is left alone."""
        for digest in {name[:16] for name in partials} | orphans:
            with holding_lock(self._lock_path(digest), wait=False) as held:
                if not held:
                    continue
                self._remove_partials(digest, partials)
                if digest in orphans:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self._lock_path(digest))

    def _drop(self, name: str, mtime: int) -> bool:
        """Evict the entry ``name`` seen with ``mtime``; False when another process holds it or used it since."""
        path = os.path.join(self._root, name)
        with holding_lock(self._lock_path(name), wait=False) as held:
            if not held:
                return False
            try:
                if os.stat(path).st_mtime_ns != mtime:
                    return False
                os.unlink(path)
            except FileNotFoundError:
                return False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._lock_path(name))  # while held: a process waiting on it sees the name went and starts again
        return True


def _partial(path: str) -> str:
    """A new name for a file being written for the entry ``path``, beside it (see the module docstring)."""
    return os.path.join(os.path.dirname(path), f"{os.path.basename(path)[:16]}.partial-{uuid.uuid4().hex}")


def _discard(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _look(
    path: str, size: int, check: Check | None, first_check: Check | None, trusted: set[tuple[str, int, int]]
) -> tuple[Buffer | None, str | None]:
    """The cached copy at ``path`` when it is right; else None and what is wrong (None when there is none).

    A copy not in ``trusted`` passes ``first_check`` (when given) and joins it; one in it, ``check``.
    """
    try:
        with open(path, "rb", buffering=0) as f:
            stat = os.fstat(f.fileno())
            if stat.st_size != size:
                return None, f"holds {stat.st_size} bytes, expected {size}"
            data = map_open(f)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    key = (path, stat.st_ino, stat.st_size)
    first = first_check is not None and key not in trusted
    use = first_check if first else check
    problem = use(data) if use is not None else None
    if problem is not None:
        if isinstance(data, mmap.mmap):
            data.close()
        return None, f"is wrong: {problem}"
    if first:
        trusted.add(key)  # set.add is atomic: threads of one loader may race here harmlessly
    return data, None
