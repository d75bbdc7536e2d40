"""Retry what an object store failed for a moment: which errors pass, and how long to wait between tries.

A call to an object store can fail because of the store's state at that instant (a dropped
connection, a timeout, HTTP 500 or 503 ``SlowDown``) or because of the request itself (403, 404,
a bad bucket name). The first kind is retried with capped exponential backoff and full jitter;
the second is raised at once. The object-store clients underneath retry some failures
themselves (botocore: 5xx and throttling; s3fs: dropped reads); this layer catches what they let
through, so a job survives a store that stays unwell for seconds.

    policy = Retry(attempts=6, base=0.2, cap=5.0)   # the default
    data = policy.call(lambda: fs.cat_file(path), what=url)
"""

from __future__ import annotations

import errno
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# errno values an object-store client reports for a failure of the moment (s3fs maps SlowDown
# and 503 to EBUSY, InternalError to EREMOTEIO)
_TRANSIENT_ERRNOS = {
    errno.EBUSY,
    getattr(errno, "EREMOTEIO", errno.EIO),
    errno.EIO,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ECONNREFUSED,
    errno.ETIMEDOUT,
    errno.EPIPE,
    errno.EAGAIN,
}
# class names, across clients (botocore, aiohttp, urllib3, requests), of failures of the moment
_TRANSIENT_NAMES = {
    "ConnectionClosedError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ResponseStreamingError",
    "IncompleteReadError",
    "IncompleteRead",
    "ClientPayloadError",
    "ServerDisconnectedError",
    "ClientOSError",
    "ServerTimeoutError",
    "ProtocolError",
    "ChunkedEncodingError",
    "ConnectionError",
    "FSTimeoutError",
    "EndpointConnectionError",
}
# what a store says in a failure of the moment
_TRANSIENT_WORDS = ("SlowDown", "reduce your request rate", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttl")


def transient(error: BaseException) -> bool:
    """True when ``error`` is worth another try: the store or the network failed for a moment.

    A missing object, a denied access or a bad request is not: the same request fails again.
    """
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    seen = error
    for _ in range(10):  # the error and what it was raised from
        if isinstance(seen, (ConnectionError, TimeoutError)):
            return True
        if isinstance(seen, OSError) and seen.errno in _TRANSIENT_ERRNOS:
            return True
        if type(seen).__name__ in _TRANSIENT_NAMES:
            return True
        status = _status(seen)
        if status is not None:
            return status >= 500 or status == 429
        if any(word in str(seen) for word in _TRANSIENT_WORDS):
            return True
        nxt = seen.__cause__ or seen.__context__
        if nxt is None or nxt is seen:
            return False
        seen = nxt
    return False


def _status(error: BaseException) -> int | None:
    """The HTTP status a botocore ``ClientError`` carries, if it is one."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None


@dataclass(frozen=True)
class Retry:
    """How often and how patiently a remote call is tried.

    Waits grow as ``base * 2**k`` up to ``cap`` seconds, each drawn uniformly below that bound
    ("full jitter"): clients that failed together do not come back together. The jitter is the
    one place shardkit draws ambient randomness, on purpose: it must differ between processes,
    and it never touches the data.

    Attributes:
        attempts: tries in all, the first included.
        base: the first wait's bound, in seconds.
        cap: the largest wait's bound.
    """

    attempts: int = 6
    base: float = 0.2
    cap: float = 5.0

    def delay(self, tried: int, draw: Callable[[], float] = random.random) -> float:
        """Seconds to wait after the ``tried``-th failed try (1 for the first)."""
        return draw() * min(self.cap, self.base * 2 ** (tried - 1))

    def call(self, fn: Callable[[], T], *, what: str, sleep: Callable[[float], None] = time.sleep) -> T:
        """``fn()``, tried again after a failure of the moment; its last error otherwise."""
        tried = 0
        while True:
            try:
                return fn()
            except Exception as e:
                tried += 1
                if tried >= self.attempts or not transient(e):
                    raise
                wait = self.delay(tried)
                log.info("%s: %s (try %d of %d), trying again in %.2fs", what, type(e).__name__, tried, self.attempts, wait)
                sleep(wait)


# the policy every remote call uses (looked up at each call: replace it to change every call's)
DEFAULT = Retry()
