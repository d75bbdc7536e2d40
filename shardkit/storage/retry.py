"""Retry what an object store failed for a moment, up to one deadline per call; fail at once what will not heal.

A call to an object store can fail because of the store's state at that instant (a dropped
connection, a timeout, HTTP 500 or 503 ``SlowDown``, a store that is restarting) or because of the
request itself (403, 404, a bad bucket name). The first kind is retried with capped exponential
backoff and full jitter until the call's deadline (:data:`DEFAULT_DEADLINE` seconds, or
``SHARDKIT_RETRY_DEADLINE``); the second is raised at once.

An endpoint that never answered in this process is another matter: a refused connection or a
host name that does not resolve there is far more likely a wrong ``endpoint_url`` than an outage,
so it is given up after :data:`FIRST_CONTACT` seconds, and the message names the endpoint. Once an
endpoint has answered, the same failures are an outage and ride through up to the deadline.

This is the one retry layer: :mod:`shardkit.storage.remote` turns off the clients' own
(botocore's retry mode, s3fs's retries) unless the storage options set them.

    policy = Retry()                      # deadline from SHARDKIT_RETRY_DEADLINE, else 60 s
    data = policy.call(lambda: fs.cat_file(path), what=url, endpoint="http://127.0.0.1:9000")
"""

from __future__ import annotations

import errno
import logging
import math
import os
import random
import threading
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


# class names, across clients, of "no connection could be made at all" (as opposed to one that broke)
_NO_CONNECTION_NAMES = {
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ClientConnectorError",
    "ClientConnectorDNSError",
    "ConnectionRefusedError",
    "gaierror",
    "ConnectTimeout",
}
_NO_CONNECTION_WORDS = ("Could not connect to the endpoint", "Name or service not known", "nodename nor servname", "Connection refused")


def no_connection(error: BaseException) -> bool:
    """True when ``error`` says no connection could be made: refused, a host that does not
    resolve, a connect that timed out (a wrong endpoint, or a store that is down)."""
    seen: BaseException | None = error
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError) or (isinstance(seen, OSError) and seen.errno == errno.ECONNREFUSED):
            return True
        if type(seen).__name__ in _NO_CONNECTION_NAMES or any(word in str(seen) for word in _NO_CONNECTION_WORDS):
            return True
        nxt = seen.__cause__ or seen.__context__
        seen = None if nxt is seen else nxt
    return False


# the deadline of a call unless SHARDKIT_RETRY_DEADLINE says otherwise: an outage of up to about a minute rides through
DEFAULT_DEADLINE = 60.0
# how long an endpoint that never answered may refuse connections before it is called unreachable
FIRST_CONTACT = 2.0
ENVIRONMENT = "SHARDKIT_RETRY_DEADLINE"
# how long a call to an endpoint that never answered runs before a warning says it still waits
SILENT_AFTER = 10.0
# the start of the note a given-up error carries in its ``shardkit_retried`` attribute (shown by
# shardkit.storage.paths.storage_error; exceptions have no notes before Python 3.11)
NOTE = "retried for"

# endpoints that answered (any HTTP answer, an error too) in this process
_answered: set[str] = set()
# endpoints that never answered and were given up on: later calls try once, not for FIRST_CONTACT again
_given_up: set[str] = set()
# endpoints a warning said were silent for SILENT_AFTER seconds
_waited_for: set[str] = set()


def deadline_from_environment() -> float:
    """``SHARDKIT_RETRY_DEADLINE`` in seconds (> 0), else :data:`DEFAULT_DEADLINE`.

    Raises:
        ConfigError: the variable is set to something else than a positive number.
    """
    text = os.environ.get(ENVIRONMENT, "").strip()
    if not text:
        return DEFAULT_DEADLINE
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        from shardkit.errors import ConfigError

        raise ConfigError(f"{ENVIRONMENT}={text!r}: expected the seconds a remote call may spend retrying, a number > 0")
    return value


@dataclass(frozen=True)
class Retry:
    """How long and how patiently a remote call is tried.

    Waits grow as ``base * 2**k`` up to ``cap`` seconds, each drawn uniformly below that bound
    ("full jitter"): clients that failed together do not come back together. The jitter is the
    one place shardkit draws ambient randomness, on purpose: it must differ between processes,
    and it never touches the data. No wait runs past the deadline.

    Attributes:
        deadline: seconds a call may take in all, its tries and waits, before its last error is
            raised; None: ``SHARDKIT_RETRY_DEADLINE``, else :data:`DEFAULT_DEADLINE`.
        first_contact: seconds an endpoint that never answered may fail to connect.
        base: the first wait's bound, in seconds.
        cap: the largest wait's bound.
        attempts: the most tries, the first included (None: as many as the deadline allows).
    """

    deadline: float | None = None
    first_contact: float = FIRST_CONTACT
    base: float = 0.2
    cap: float = 5.0
    attempts: int | None = None

    def delay(self, tried: int, draw: Callable[[], float] = random.random) -> float:
        """Seconds to wait after the ``tried``-th failed try (1 for the first)."""
        return draw() * min(self.cap, self.base * 2 ** (tried - 1))

    def ends_at(self, now: float) -> float:
        """The time (on the clock ``now`` was read from) a call starting at ``now`` must end by."""
        return now + (self.deadline if self.deadline is not None else deadline_from_environment())

    def call(
        self,
        fn: Callable[[], T],
        *,
        what: str,
        endpoint: str | None = None,
        since: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> T:
        """``fn()``, tried again after a failure of the moment until the deadline; its last error otherwise.

        Args:
            fn: the call.
            what: the URL, for the log.
            endpoint: where ``fn`` connects (first contact is judged per endpoint); None: ``what``.
            since: the ``clock()`` time the operation this call is part of began (the read of
                one object, however many of its ranges need another try): its deadline counts
                from there; None: now.
        """
        started = clock() if since is None else since
        end = self.ends_at(started)
        key = endpoint or what
        tried = 0
        while True:
            try:
                result = fn() if key in _answered else _watched(fn, what, key)
            except Exception as e:
                tried += 1
                if _status(e) is not None:
                    _answered.add(key)
                    _given_up.discard(key)
                if not transient(e) and not no_connection(e):
                    raise
                now = clock()
                first = key not in _answered and no_connection(e)
                # a wrong endpoint, most likely: say so soon, and once given up, at the first try
                limit = min(end, started + (0.0 if key in _given_up else self.first_contact)) if first else end
                wait = self.delay(tried)
                if now + wait >= limit or (self.attempts is not None and tried >= self.attempts):
                    if first:
                        _given_up.add(key)
                    why = "it never answered in this process" if first else f"up to the deadline of {end - started:.0f} s, {ENVIRONMENT}"
                    e.shardkit_retried = f"{NOTE} {now - started:.1f} s: {why}"  # type: ignore[attr-defined]
                    raise
                log.info("%s: %s (try %d), trying again in %.2fs", what, type(e).__name__, tried, wait)
                sleep(wait)
            else:
                _answered.add(key)
                _given_up.discard(key)
                return result


def _watched(fn: Callable[[], T], what: str, endpoint: str) -> T:
    """``fn()``, a call to an endpoint that has not answered yet in this process; when it takes
    :data:`SILENT_AFTER` seconds, a warning says so, instead of a silence as long as the client's
    read timeout (botocore's is 60 s) over an endpoint that takes connections and never answers."""
    timer = threading.Timer(SILENT_AFTER, _still_waiting, (what, endpoint))
    timer.daemon = True
    timer.start()
    try:
        return fn()
    finally:
        timer.cancel()


def _still_waiting(what: str, endpoint: str) -> None:
    if endpoint in _waited_for:
        return  # said once: every try of every call would say it again
    _waited_for.add(endpoint)
    log.warning(
        "%s: no answer from %s after %g s, and it has not answered in this process yet: is the endpoint right? "
        "(the client waits for its read timeout)",
        what,
        endpoint,
        SILENT_AFTER,
    )


def answered(endpoint: str) -> bool:
    """Whether ``endpoint`` answered a call in this process (see :meth:`Retry.call`)."""
    return endpoint in _answered


# the policy every remote call uses (looked up at each call: replace it to change every call's)
DEFAULT = Retry()
