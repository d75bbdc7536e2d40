"""Object stores through fsspec: find the filesystem of a URL, read a file in concurrent ranges, upload one.

Everything shardkit does with ``s3://``, ``gs://``, ``memory://``... URLs goes through here, and
every call is retried on failures of the moment (:mod:`shardkit.storage.retry`). Credentials and
endpoints come the way the ecosystem's tools find them (for S3: ``AWS_ENDPOINT_URL``,
``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``...), or from ``storage_options`` given for a bucket, which
go to fsspec as they are and are never written, logged or shown.

    use(["s3://bucket/data"], {"endpoint_url": "http://127.0.0.1:9000"})   # optional
    data = read_ranges("s3://bucket/data/pile-000000.tar", size=1 << 28, concurrency=8)
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from shardkit import io_errors, redact
from shardkit.errors import ConfigError
from shardkit.storage import retry

T = TypeVar("T")

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
# a URL's ``user:password@`` (or ``user@``) part, up to the last "@" (an S3 secret may hold "/")
_USERINFO = re.compile(r"(://)[^\s]*@")
# where an S3 endpoint may be set besides storage_options' endpoint_url (botocore reads these)
_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
# the smallest range worth a request of its own. At S3's tens of ms to the first byte and tens of
# MB/s a connection a range of 8 MiB spends under a tenth of its time waiting (the size AWS and GCS
# suggest for ranged reads), and a server that reads the whole object for every ranged request
# (moto, some gateways) reads it fewer times: a pile under 16 MiB is one GET
MIN_RANGE = 8 << 20
# requests in flight at once for a loader's piles unless told otherwise (see BENCHMARKS.md, Object storage (S3))
DEFAULT_CONCURRENCY = 8
# what put_file sends a request at once: the memory an upload holds
UPLOAD_CHUNK = 16 << 20

# storage options by bucket (see root), and for any other bucket
_options: dict[str, dict[str, Any]] = {}
_EVERYWHERE = "*"
_lock = threading.Lock()


def scheme(url: str) -> str | None:
    """The scheme of a non-local URL (``"s3"``), else None (a path or ``file://``)."""
    match = _SCHEME.match(url)
    if match is None or match.group(1) == "file":
        return None
    return match.group(1)


def root(url: str) -> str:
    """The part of ``url`` storage options belong to: scheme and bucket (``s3://bucket``)."""
    match = _SCHEME.match(url)
    if match is None:
        return url
    rest = url[match.end() :]
    return f"{match.group(0)}{rest.split('/', 1)[0]}"


def use(urls: Iterable[str], options: Mapping[str, Any]) -> None:
    """Read the remote ones of ``urls`` (and everything in their buckets) with ``options``, given
    to fsspec as they are (``endpoint_url``, ``key``, ``secret``, ``anon``, ``client_kwargs``...)."""
    redact.remember(options)
    with _lock:
        for url in urls:
            if scheme(url) is not None:
                _options[root(url)] = dict(options)


def use_everywhere(options: Mapping[str, Any]) -> None:
    """Read every remote URL that has no options of its own with ``options`` (the CLI's
    ``--storage-option``)."""
    redact.remember(options)
    with _lock:
        _options[_EVERYWHERE] = dict(options)


def registered() -> dict[str, dict[str, Any]]:
    """Every bucket's storage options, to hand to a worker process (see :func:`restore`)."""
    with _lock:
        return {k: dict(v) for k, v in _options.items()}


def restore(options: Mapping[str, Mapping[str, Any]]) -> None:
    """Make the storage options those :func:`registered` gave (in this process, or another)."""
    for given in options.values():
        redact.remember(given)
    with _lock:
        _options.clear()
        _options.update({k: dict(v) for k, v in options.items()})


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem for ``url`` and the path within it.

    Raises:
        ConfigError: fsspec or the scheme's package is missing, or the scheme is unknown.
    """
    kind = scheme(url)
    try:
        import fsspec
    except ImportError:
        raise ConfigError(f"{url}: {kind}:// URLs need fsspec: pip install 'shardkit[remote]'") from None
    with _lock:
        options = _options.get(root(url), _options.get(_EVERYWHERE, {}))
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as e:  # fsspec knows the scheme, its package is missing
        package = _backend_package(kind)
        fix = f"pip install {package}" if package else f"install the fsspec package for {kind}:// ({e})"
        raise ConfigError(f"{url}: {kind}:// URLs need {package or 'a package that is missing'}: {fix}") from None
    except (ValueError, TypeError) as e:
        if kind is not None and kind not in fsspec.available_protocols():
            raise ConfigError(
                f"{url}: no filesystem is known for {kind}:// URLs (a typo? s3://, gs://, az://... each need their fsspec package)"
            ) from None
        raise _refused(url, options, e) from None
    _no_password_given(url, options)
    fs = _shared(fs, options)
    _one_retry_layer(fs, options)
    if root(url) not in _connected:
        _connect(fs, url, options)
    return fs, path


def _no_password_given(url: str, options: Mapping[str, Any]) -> None:
    """Refuse, at every use, an endpoint set with a user name and password in it (see
    :func:`_no_password`): in ``storage_options`` (``endpoint_url``, ``client_kwargs``'s) or, for
    an ``s3://`` URL given neither, in the variable botocore reads (``AWS_ENDPOINT_URL_S3``, else
    ``AWS_ENDPOINT_URL``)."""
    client = options.get("client_kwargs")
    given = [
        ("endpoint_url", options.get("endpoint_url")),
        ("client_kwargs.endpoint_url", client.get("endpoint_url") if isinstance(client, Mapping) else None),
    ]
    if not any(endpoint for _, endpoint in given) and scheme(url) in ("s3", "s3a"):
        # only the variable botocore takes, and only when no endpoint is given outright
        given = [next(((name, os.environ[name]) for name in _ENDPOINT_VARIABLES if os.environ.get(name)), ("", None))]
    for where, endpoint in given:
        if isinstance(endpoint, str) and _USERINFO.search(endpoint):
            raise _password_error(url, endpoint, where)


# one filesystem per class and options, whatever thread asks (see _shared)
_filesystems: dict[tuple[type, str], Any] = {}


def _shared(fs: Any, options: Mapping[str, Any]) -> Any:
    """The filesystem every thread uses for ``fs``'s class and ``options``: the first one made.

    fsspec keeps one instance per thread, and each new one builds its own client (for S3 about a
    quarter of a second of CPU, and new connections), which the loader's reader threads would
    each pay. An async filesystem's calls all run on fsspec's one event loop, so sharing is safe.
    The shared one is dropped when fsspec drops it (``clear_instance_cache``, a fork). A
    synchronous filesystem (SFTP, say) may not be safe across threads: each thread keeps its own.
    """
    from fsspec.asyn import AsyncFileSystem

    if not isinstance(fs, AsyncFileSystem):
        return fs
    key = (type(fs), repr(sorted(options.items())))
    with _lock:
        known = _filesystems.get(key)
        cache = getattr(type(fs), "_cache", None)
        if known is not None and isinstance(cache, dict) and any(v is known for v in cache.values()):
            return known
        _filesystems[key] = fs
    return fs


# botocore's settings unless the storage options give their own: no retries of its own (shardkit's
# layer retries, up to one deadline), and a connect that gives up soon enough to name a wrong endpoint
_BOTOCORE_DEFAULTS: dict[str, Any] = {"retries": {"total_max_attempts": 1, "mode": "standard"}, "connect_timeout": 3}
# ...and no CRC of every whole-object GET's body by botocore, on the one event loop thread all
# downloads share (a seventh of a loader's time on a fast server): every pile is checked against
# its manifest's CRC-32 anyway, end to end. The environment's AWS_RESPONSE_CHECKSUM_VALIDATION wins.
_RESPONSE_CHECKS = {"response_checksum_validation": "when_required"}


def _one_retry_layer(fs: Any, options: Mapping[str, Any]) -> None:
    """Turn off the retries an S3 filesystem adds of its own (s3fs's and botocore's), so that
    :mod:`shardkit.storage.retry` is the one layer and its deadline holds; settings the storage
    options give (``retries``, ``config_kwargs``) are kept."""
    if type(fs).__name__ != "S3FileSystem" or getattr(fs, "_s3", None) is not None:
        return  # not s3fs, or its client exists already (set up, or made by someone else with their settings)
    if "retries" not in options:
        fs.retries = 1
    config = getattr(fs, "config_kwargs", None)
    if isinstance(config, dict):
        checks = {} if os.environ.get("AWS_RESPONSE_CHECKSUM_VALIDATION") else _RESPONSE_CHECKS
        fs.config_kwargs = {**_BOTOCORE_DEFAULTS, **checks, **config}


def endpoint(fs: Any, url: str) -> str:
    """Where ``fs`` sends its requests, for messages and for :mod:`retry`'s first contact: the
    endpoint URL without any ``user:password@``, else the URL's scheme and bucket."""
    client = getattr(fs, "_s3", None)
    if client is None and type(fs).__name__ == "S3FileSystem":
        # s3fs makes its client at the first request; make it now, so that every call, the first of
        # a new thread's filesystem too, is judged under the same endpoint (first contact or outage)
        with contextlib.suppress(Exception):  # the request itself will say what is wrong
            client = fs.connect()
    found = _client_endpoint(fs, client)
    return root(url) if found is None else _USERINFO.sub(r"\1", found)


def _client_endpoint(fs: Any, client: Any) -> str | None:
    """The endpoint URL ``client`` (``fs``'s, once made) sends to, as configured; None when neither says."""
    found = getattr(getattr(client, "meta", None), "endpoint_url", None) or getattr(fs, "endpoint_url", None)
    return found if isinstance(found, str) and found else None


def call(url: str, fs: Any, fn: Callable[[], T], *, since: float | None = None) -> T:
    """``fn()`` (a request to ``fs`` about ``url``) through the retry layer, up to the deadline
    counted from ``since`` (a ``time.monotonic()``; None: now)."""
    return retry.DEFAULT.call(fn, what=url, endpoint=endpoint(fs, url), since=since)


# buckets whose client was built with their options: a misspelled option fails there, once
_connected: set[str] = set()


def _refused(url: str, options: Mapping[str, Any], error: Exception) -> ConfigError:
    # the message of a bad option may quote its value: name the options, never their values
    return ConfigError(f"{url}: the filesystem refused its options {sorted(options)}: {type(error).__name__}")


def _connect(fs: Any, url: str, options: Mapping[str, Any]) -> None:
    """Build the client now (s3fs builds it on the first request), so an option it does not
    take is a ConfigError naming the options, not a TypeError from deep inside a read."""
    connect = getattr(fs, "connect", None)
    if callable(connect):
        try:
            connect()
        except ValueError as e:
            if "endpoint" in str(e).lower():  # botocore: "Invalid endpoint: ..."
                raise ConfigError(
                    f"{url}: {io_errors.sanitized(str(e))}; expected an http:// or https:// URL in endpoint_url or AWS_ENDPOINT_URL"
                ) from None
            raise _refused(url, options, e) from None
        except TypeError as e:
            raise _refused(url, options, e) from None
    _no_password(fs, url)
    with _lock:
        _connected.add(root(url))


def _no_password(fs: Any, url: str) -> None:
    """Refuse an endpoint URL that carries a user name and password: S3 clients sign requests
    with a key and secret, and refuse to send such a URL at the first request, in words that do
    not say which setting is wrong. The message shows the endpoint without them."""
    found = _client_endpoint(fs, getattr(fs, "_s3", None))
    if found is not None and _USERINFO.search(found):
        raise _password_error(url, found, "the client's configuration")


def _password_error(url: str, endpoint: str, where: str) -> ConfigError:
    shown = _USERINFO.sub(r"\1", endpoint)
    return ConfigError(
        f"{url}: the endpoint {shown} is given with a user name and password in it (USER:PASSWORD@ in {where}); give the "
        "endpoint without them, and the credentials as key= and secret= in storage_options or as AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY"
    )


def _backend_package(kind: str | None) -> str | None:
    """The pip package fsspec needs for ``kind`` (``s3fs`` for ``s3``), when it says."""
    from fsspec.registry import known_implementations

    module = str(known_implementations.get(kind or "", {}).get("class", "")).split(".")[0]
    return module or None


def ranges(size: int, concurrency: int, least: int | None = None) -> list[tuple[int, int]]:
    """``[start, end)`` pieces covering ``size`` bytes: up to ``concurrency`` of them, none under
    ``least`` bytes (default :data:`MIN_RANGE`) unless there is one piece only."""
    least = MIN_RANGE if least is None else least
    count = max(1, min(concurrency, size // max(least, 1)))
    bounds = [size * k // count for k in range(count + 1)]
    return list(itertools.pairwise(bounds))


def read_ranges(url: str, *, size: int, concurrency: int) -> bytes:
    """The object ``url``, which should hold ``size`` bytes, fetched in up to ``concurrency``
    ranges at once; each range is retried on its own.

    The last range asks for one byte more than ``size``: an object longer than expected comes
    back longer, one shorter comes back shorter, so the caller's size check sees either without
    another request.
    """
    fs, path = filesystem(url)
    since = time.monotonic()  # one deadline for the object, however many of its ranges fail
    if size == 0:
        return bytes(call(url, fs, lambda: fs.cat_file(path), since=since))
    pieces = ranges(size, concurrency)
    starts = [lo for lo, _ in pieces]
    ends = [hi for _, hi in pieces]
    ends[-1] = size + 1
    got_all: list[bytes] = []
    results = call(url, fs, lambda: fs.cat_ranges([path] * len(starts), starts, ends, on_error="return"), since=since)
    for k, (start, end, got) in enumerate(zip(starts, ends, results, strict=True)):
        if isinstance(got, BaseException):
            if not retry.transient(got) and not retry.no_connection(got):
                raise got
            # by keyword: s3fs's cat_file takes a version id before start and end
            got = call(url, fs, functools.partial(fs.cat_file, path, start=start, end=end), since=since)
        got_all.append(got)
        if len(got) < end - start and k < len(starts) - 1:  # the object ends before this range does
            break
    return b"".join(got_all)


def upload(local: str, url: str) -> None:
    """Copy the local file ``local`` to ``url``, streamed in :data:`UPLOAD_CHUNK` pieces (a
    multipart upload for large files, one PUT for small ones)."""
    fs, path = filesystem(url)
    try:
        call(url, fs, lambda: fs.put_file(local, path, chunksize=UPLOAD_CHUNK))
    except TypeError:  # a filesystem whose put_file takes no chunk size
        call(url, fs, lambda: fs.put_file(local, path))


def write_bytes(url: str, data: bytes) -> None:
    """Make ``data`` the object ``url`` in one request: it appears whole or not at all."""
    fs, path = filesystem(url)
    call(url, fs, lambda: fs.pipe_file(path, bytes(data)))
