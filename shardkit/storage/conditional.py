"""Conditional writes: create a file only if it is absent, replace one only if it is unchanged, and fresh listings.

Two writers that race to one dataset must not both win. Locally a kernel lock keeps them apart;
an object store has no lock a dead job gives back, so there the store itself decides: a PUT
with ``If-None-Match: *`` creates an object only if none is there, one with ``If-Match: <etag>``
replaces it only if it is still the version read. Of two such requests at once, the store lets
exactly one through. Not every store has them (see :func:`can_put_if_absent`).

    if storage.can_put_if_absent(url):
        won = storage.put_if_unchanged(url, data, version=seen)   # False: another writer was first

A listing here is never left in a client's cache: s3fs answers lookups of single objects from
a cached listing, so an object another process adds after it would look missing.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import inspect
import logging
import os
from typing import Any

from shardkit.errors import ConfigError, DatasetNotFoundError
from shardkit.storage import remote, retry
from shardkit.storage.local_store import LocalStore
from shardkit.storage.paths import guard, local_path
from shardkit.storage.store import Entry

log = logging.getLogger(__name__)

# the S3 error codes of a conditional write another writer beat (412), or raced (409)
_LOST = {"PreconditionFailed", "ConditionalRequestConflict"}


def can_put_if_absent(url: str) -> bool:
    """True when the store of ``url`` makes conditional writes atomic: local files (a hard link
    or ``O_EXCL``), and S3 through s3fs with a botocore that sends ``If-None-Match`` and
    ``If-Match``. Other fsspec stores check and write in two steps, which two writers can
    both pass: there one writer at a time is the user's to keep."""
    if local_path(url) is not None:
        return True
    fs, _ = remote.filesystem(url)
    return _s3_conditional(fs)


def _s3_conditional(fs: Any) -> bool:
    try:
        from s3fs import S3FileSystem
    except ImportError:
        return False
    return isinstance(fs, S3FileSystem) and _s3fs_conditional() and _botocore_conditional()


@functools.lru_cache(maxsize=1)
def _s3fs_conditional() -> bool:
    """s3fs sends ``If-None-Match`` for ``mode="create"`` (since 2024.10)."""
    from s3fs import S3FileSystem

    return all("mode" in inspect.signature(getattr(S3FileSystem, name)).parameters for name in ("_pipe_file", "_put_file"))


@functools.lru_cache(maxsize=1)
def _botocore_conditional() -> bool:
    """botocore knows PutObject's ``IfNoneMatch`` and ``IfMatch`` (it refuses parameters it does not know)."""
    try:
        import botocore.session

        members = botocore.session.get_session().get_service_model("s3").operation_model("PutObject").input_shape.members
    except Exception:  # no botocore, or a model it cannot load: no conditional writes
        return False
    return "IfNoneMatch" in members and "IfMatch" in members


def version(url: str) -> str | None:
    """What the object ``url`` is now, asked of the object itself (its ETag); None when it is
    missing. Locally, the file's size and modification time."""
    if local_path(url) is not None:
        return LocalStore(os.path.dirname(url)).version(os.path.basename(url))
    with guard(url, "look it up"):
        fs, p = remote.filesystem(url)
        try:
            info = retry.DEFAULT.call(lambda: fs.info(p, refresh=True), what=url)
        except FileNotFoundError:
            return None
        etag = info.get("ETag") if info.get("type") == "file" else None
        return str(etag) if etag else None


def put_if_absent(url: str, data: bytes) -> bool:
    """Create ``url`` holding ``data`` unless it exists; True when this call created it.

    Atomic: of writers racing to one name exactly one gets True, and a reader sees the whole
    file or none. Raises :class:`~shardkit.errors.ConfigError` where the store cannot (see
    :func:`can_put_if_absent`)."""
    if local_path(url) is not None:
        return LocalStore(os.path.dirname(url)).put_if_absent(os.path.basename(url), data)
    return _put_remote(url, data, {}, "create")


def put_if_unchanged(url: str, data: bytes, *, seen: str | None) -> bool:
    """Replace ``url`` with ``data`` only if it is still the version ``seen`` (:func:`version`;
    None: only if it is absent); True when this call wrote it.

    A request whose answer was lost and that the store then refuses may be this call's own
    write: the object is read back, and holding ``data`` it counts as written. Only for object
    stores with conditional writes; a local writer holds the directory's lock instead."""
    if seen is None:
        return put_if_absent(url, data)
    if local_path(url) is not None:
        raise ValueError(f"{url}: put_if_unchanged is for object stores; a local writer holds the output's lock")
    return _put_remote(url, data, {"IfMatch": seen}, "overwrite")


def _put_remote(url: str, data: bytes, condition: dict[str, str], mode: str) -> bool:
    fs, p = remote.filesystem(url)
    if not _s3_conditional(fs):
        raise ConfigError(f"{url}: this store has no conditional write (If-None-Match / If-Match); it cannot commit safely")
    with guard(url, "write", size=len(data)):
        try:
            retry.DEFAULT.call(lambda: fs.pipe_file(p, bytes(data), mode=mode, **condition), what=url)
            return True
        except (FileExistsError, FileNotFoundError):  # s3fs's words for 412 on If-None-Match, 404 on If-Match
            pass
        except Exception as e:
            if not _refused(e):
                raise
    return _mine(url, data)


def upload_if_absent(local: str, url: str, *, name_is_mine: bool = False) -> bool:
    """Copy the local file ``local`` to ``url`` unless an object is there; True when this call
    created it (a multipart upload is refused when it completes). With ``name_is_mine`` (no
    other job ever writes ``url``), an object found there that holds the file's bytes is a retry
    of this upload whose answer was lost, and counts as created. Only for object stores with
    conditional writes (:func:`can_put_if_absent`)."""
    fs, p = remote.filesystem(url)
    if not _s3_conditional(fs):
        raise ConfigError(f"{url}: this store has no conditional write (If-None-Match); it cannot upload safely beside another job")
    with guard(url, "upload"):
        try:
            retry.DEFAULT.call(lambda: fs.put_file(local, p, chunksize=remote.UPLOAD_CHUNK, mode="create"), what=url)
            return True
        except FileExistsError:
            pass
        except Exception as e:
            if not _refused(e):
                raise
        return name_is_mine and _holds_file(fs, p, local, url)


def _holds_file(fs: Any, path: str, local: str, url: str) -> bool:
    """The object ``path`` holds the bytes of ``local``: the same size, and an ETag that is the
    file's MD5 (a single PUT's; a multipart upload's cannot be checked here, so it is not)."""
    try:
        info = retry.DEFAULT.call(lambda: fs.info(path, refresh=True), what=url)
    except FileNotFoundError:
        return False
    etag = str(info.get("ETag") or "").strip('"')
    if info.get("size") != os.path.getsize(local) or not etag or "-" in etag:
        return False
    digest = hashlib.md5(usedforsecurity=False)
    with open(local, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != etag:
        return False
    log.info("%s: the store refused an upload it had already taken (its answer was lost): it is this job's", url)
    return True


def _refused(error: BaseException) -> bool:
    """``error`` (or what it was raised from) is the store refusing a conditional write: 412 or 409."""
    seen: BaseException | None = error
    for _ in range(10):
        if seen is None:
            return False
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return code in _LOST or status in (409, 412)
        seen = seen.__cause__ or seen.__context__
    return False


def _mine(url: str, data: bytes) -> bool:
    """After a refused write: does ``url`` hold ``data`` (a retry of a write that got in)?"""
    fs, p = remote.filesystem(url)
    try:
        with guard(url, "read"):
            now = retry.DEFAULT.call(lambda: fs.cat_file(p), what=url)
    except DatasetNotFoundError:
        return False
    if bytes(now) == bytes(data):
        log.info("%s: the store refused a write it had already taken (its answer was lost): it is this job's", url)
        return True
    return False


def entries(url: str, *, missing_ok: bool = False) -> list[Entry]:
    """The files directly inside the directory ``url``, sorted by name, each with its size and
    last write time, from a fresh listing (never a cached one, and none is left cached)."""
    if local_path(url) is not None:
        return LocalStore(url).entries(missing_ok=missing_ok)
    try:
        with guard(url, "list the directory"):
            fs, p = remote.filesystem(url)
            listed = retry.DEFAULT.call(lambda: fs.ls(p, detail=True, refresh=True), what=url)
            forget_listings(fs, p)
            return sorted((_entry(item) for item in listed if item.get("type") == "file"), key=lambda e: e.name)
    except DatasetNotFoundError:
        if missing_ok:
            return []
        raise DatasetNotFoundError(f"{url}: no such directory") from None


def names(url: str, *, missing_ok: bool = False) -> list[str]:
    """Sorted names of what is directly under the remote directory ``url`` (files and prefixes),
    from a fresh listing; with ``missing_ok`` none when nothing was written under it yet."""
    try:
        with guard(url, "list the directory"):
            fs, p = remote.filesystem(url)
            listed = remote.call(url, fs, lambda: fs.ls(p, detail=False, refresh=True))
            forget_listings(fs, p)
            return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in listed)
    except DatasetNotFoundError as e:
        if missing_ok:
            return []
        if getattr(e, "bucket", None):
            raise  # it says the bucket is missing, which the user can fix
        raise DatasetNotFoundError(f"{url}: no such directory") from None


def _entry(item: dict[str, Any]) -> Entry:
    when = item.get("LastModified")
    if isinstance(when, str):
        when = datetime.datetime.fromisoformat(when)
    if not isinstance(when, datetime.datetime):  # a store that gives no time: as if written now, so kept
        when = datetime.datetime.now(datetime.timezone.utc)
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return Entry(str(item["name"]).rstrip("/").rsplit("/", 1)[-1], int(item.get("size") or 0), when)


def forget_listings(fs: Any, path: str | None) -> None:
    """Drop the client's cached listing of ``path`` (None: every listing): lookups of its
    objects then ask the store."""
    invalidate = getattr(fs, "invalidate_cache", None)
    if callable(invalidate):
        invalidate(path)
