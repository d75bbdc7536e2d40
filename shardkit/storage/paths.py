"""What a URL is (a local path or an object in a store), how to join one, and what its failures become.

local_path("file:///data/x.tar")       # "/data/x.tar"; None for "s3://bucket/x.tar"
with guard(url, "read"):              # an OSError or a client's error -> a ShardkitError naming url
    ...
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from shardkit import io_errors
from shardkit.errors import DatasetNotFoundError, ShardkitError, StorageError
from shardkit.storage.remote import root as _root
from shardkit.storage.remote import scheme as _remote

# what s3fs (and S3-compatible stores) say for a bucket that is not there
_NO_BUCKET = "bucket does not exist"


def local_path(url: str | os.PathLike[str]) -> str | None:
    """Return the filesystem path of a local URL, or None for a remote one."""
    url = os.fspath(url)
    if _remote(url):
        return None
    return url[len("file://") :] if url.startswith("file://") else url


def is_remote(url: str | os.PathLike[str]) -> bool:
    """True for a URL of an object store (``s3://``...), False for a local path or ``file://``."""
    return _remote(os.fspath(url)) is not None


def storage_error(error: BaseException, url: str, doing: str, *, size: int | None = None) -> ShardkitError:
    """The shardkit error for ``error``, raised while ``doing`` (``"read"``, ``"write"``...) ``url``.

    A missing file is a :class:`DatasetNotFoundError`; anything else that failed below shardkit
    is a :class:`StorageError` naming ``url``, saying why and what to do (see
    :func:`shardkit.io_errors.translate`). ``size`` is the bytes being written, named when the
    disk is full.
    """
    kind = _remote(url)
    if kind is not None and isinstance(error, FileNotFoundError) and _NO_BUCKET in f"{error} {error.__cause__}":
        bucket = _root(url)
        # an object of shardkit's own making (a job journal) means nothing to the user: name its directory
        shown = url.rsplit("/", 1)[0] if url.rsplit("/", 1)[-1].startswith(".") else url
        missing = DatasetNotFoundError(f"{shown}: the bucket {bucket} does not exist (a typo? create it first)")
        missing.bucket = bucket  # type: ignore[attr-defined]  # what callers that reword "not found" keep
        return missing
    found = io_errors.translate(error, url, doing, scheme=kind, path=local_path(url), size=size)
    retried = getattr(error, "shardkit_retried", None)
    if isinstance(retried, str) and type(found) is StorageError:
        return StorageError(f"{found} ({retried})", url=found.url, errno=found.errno)
    return found


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
