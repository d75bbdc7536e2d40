"""Say why a read or a write failed: OS and object-store errors as shardkit errors naming the path or URL.

translate(OSError(errno.ENOSPC, "No space left on device"), "out/pile-000003.tar", "write", scheme=None,
          path="out/pile-000003.tar", size=1 << 30)
# StorageError: out/pile-000003.tar: cannot write: no space left on the device (needed 1.0 GiB,
#   12.0 MiB free on the device of /data); free some space or write elsewhere

:mod:`shardkit.storage` is the one caller: every byte shardkit reads or writes passes there.
"""

from __future__ import annotations

import errno
import os
import re
import shutil

from shardkit._util import format_size
from shardkit.errors import DatasetNotFoundError, ShardkitError, StorageError

# what an object store needs to find credentials, by scheme
_CREDENTIALS = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE",
    "s3a": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS, or run gcloud auth application-default login",
    "gcs": "set GOOGLE_APPLICATION_CREDENTIALS, or run gcloud auth application-default login",
    "az": "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME and a key",
    "abfs": "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME and a key",
}
# where an endpoint comes from: the environment, or the storage options given with the URL
_ENDPOINT = dict.fromkeys(("s3", "s3a"), "AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (or the endpoint_url storage option)")
# exception class names, across object-store clients, that mean "nobody answers there"
_UNREACHABLE = {
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ClientConnectorError",
    "ServerTimeoutError",
    "ServerDisconnectedError",
    "ConnectionRefusedError",
    "ConnectionResetError",
    "ConnectTimeout",
    "gaierror",
    "TimeoutError",
}
_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError", "CredentialRetrievalError", "RefreshError"}
# (S3 answers a malformed session token with InvalidToken, whose text s3fs passes on as an EINVAL OSError)
_DENIED = re.compile(
    r"AccessDenied|Forbidden|\b403\b|InvalidAccessKeyId|SignatureDoesNotMatch|ExpiredToken|InvalidToken|token is malformed"
)


def sanitized(text: str) -> str:
    """``text`` without user:password@ in URLs or request signatures: messages never carry secrets."""
    text = re.sub(r"(://)[^/@\s]+@", r"\1", text)
    return re.sub(r"((?:Signature|Credential|Security-Token|sig)=)[^&\s\"']+", r"\1...", text, flags=re.IGNORECASE)


def _chain(error: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    while error is not None and error not in found and len(found) < 20:
        found.append(error)
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return found


def _free_bytes(path: str) -> tuple[str, int] | None:
    """Where the device holding ``path`` is mounted, and the bytes free on it."""
    here = os.path.abspath(path)
    while not os.path.isdir(here) and os.path.dirname(here) != here:
        here = os.path.dirname(here)
    try:
        device = os.stat(here).st_dev
        # climb to the mount point: a short name the user knows, not a staging directory
        while os.path.dirname(here) != here and os.stat(os.path.dirname(here)).st_dev == device:
            here = os.path.dirname(here)
        return here, shutil.disk_usage(here).free
    except OSError:
        return None


def _file_above(path: str) -> str | None:
    """The first existing ancestor of ``path`` that is not a directory (why ENOTDIR was raised)."""
    here = os.path.abspath(path)
    while os.path.dirname(here) != here:
        if os.path.exists(here) and not os.path.isdir(here):
            return here
        here = os.path.dirname(here)
    return None


def _os_reason(error: OSError, url: str, size: int | None) -> str:
    """Why an OS call on the local ``url`` failed, in words, with the way out where there is one."""
    code = error.errno
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        what = "no space left on the device" if code == errno.ENOSPC else "the disk quota is exceeded"
        free = _free_bytes(url)
        amounts = [f"needed {format_size(size)}"] if size is not None else []
        amounts += [f"{format_size(free[1])} free on the device of {free[0]}"] if free is not None else []
        shown = f" ({', '.join(amounts)})" if amounts else ""
        return f"{what}{shown}; free some space or write elsewhere"
    if code == errno.EROFS:
        return "the file system is read-only; write elsewhere"
    if code in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if code == errno.ENOTDIR:
        above = _file_above(url)
        return f"{above} is a file, not a directory" if above else "a part of the path is not a directory"
    if code == errno.EISDIR:
        return "it is a directory, expected a file"
    if code == errno.EEXIST:
        return "a file of that name is in the way"
    return error.strerror or str(error)


def _remote_reason(error: BaseException, scheme: str) -> str:
    """Why a call to the object store of ``scheme`` failed, in words, with the fix."""
    chain = _chain(error)
    if any(type(e).__name__ in _NO_CREDENTIALS for e in chain):
        return f"no credentials found for {scheme}:// ({_CREDENTIALS.get(scheme, 'configure its credentials')})"
    unreachable = [e for e in chain if type(e).__name__ in _UNREACHABLE]
    if unreachable:  # the outermost names the endpoint, the innermost only the socket
        setting = f" and {_ENDPOINT[scheme]}" if scheme in _ENDPOINT else ""
        return f"cannot reach the storage endpoint ({sanitized(str(unreachable[0]))}); check the network{setting}"
    if isinstance(error, PermissionError) or any(_DENIED.search(str(e)) for e in chain):
        return f"access denied ({sanitized(str(error))}); check the credentials and their permissions on it"
    return f"{type(error).__name__}: {sanitized(str(error))}"


def translate(error: BaseException, url: str, doing: str, *, scheme: str | None, path: str | None, size: int | None) -> ShardkitError:
    """The shardkit error for ``error``, raised while ``doing`` ``url``.

    Args:
        error: what the OS or the object-store client raised (a shardkit error is returned as is).
        url: the path or URL, as the caller named it.
        doing: the verb for the message: ``"read"``, ``"write"``, ``"create the directory"``...
        scheme: the URL's scheme for a remote one (``"s3"``), None for a local path.
        path: the local path of ``url`` (None for a remote one).
        size: the bytes being written, named when the disk is full.
    """
    if isinstance(error, ShardkitError):
        return error
    if isinstance(error, FileNotFoundError):
        if doing == "write" and path is not None and not os.path.isdir(os.path.dirname(path) or "."):
            # a file being written is missing only in that its folder is
            return DatasetNotFoundError(f"{url}: cannot write: no such folder {os.path.dirname(path)}")
        return DatasetNotFoundError(f"{url}: no such file")
    if scheme is not None:
        return StorageError(f"{url}: cannot {doing}: {_remote_reason(error, scheme)}", url=url)
    if isinstance(error, OSError):
        return StorageError(f"{url}: cannot {doing}: {_os_reason(error, path or url, size)}", url=url, errno=error.errno)
    return StorageError(f"{url}: cannot {doing}: {type(error).__name__}: {error}", url=url)
