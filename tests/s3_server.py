"""Serve S3 on loopback for tests and benchmarks: a moto server, and a proxy that adds faults and limits.

``start_moto()`` runs moto's S3 in a thread of this process. ``S3Proxy`` sits between a client and
that server and works per HTTP/1.1 request, so a keep-alive connection carrying many requests gets
a fault decision for each one: connection resets (before answering or halfway through a body),
well-formed S3 error answers, a delay before each response and a per-connection bandwidth cap.
``S3Bucket`` makes a uniquely named bucket and s3fs clients for it; ``aws_environment()`` gives
the variables that aim clients configured by the environment (``s3://`` URLs) at a server.

Imported by tests and by benchmark scripts alike, so it imports no pytest::

    with start_moto() as moto, S3Proxy(moto.endpoint, error_fraction=0.1) as proxy:
        bucket = S3Bucket.create(moto.endpoint)
        fs = bucket.client(proxy.endpoint)  # through the proxy; bucket.client() goes to moto directly
"""

from __future__ import annotations

import contextlib
import http
import logging
import os
import socket
import struct
import threading
import time
import urllib.request
import uuid
from collections.abc import Collection, Iterator
from typing import Any, BinaryIO

import numpy as np

_PIECE = 64 * 1024  # bytes relayed per send; also the pacing step of the bandwidth cap
_NO_BODY_STATUSES = {204, 304}

# what S3 itself says with these statuses; other statuses get their HTTP phrase as the code
_S3_ERRORS = {
    500: ("InternalError", "We encountered an internal error. Please try again."),
    503: ("SlowDown", "Please reduce your request rate."),
}


class MotoServer:
    """A moto S3 server on 127.0.0.1 in a daemon thread of this process.

    Example::

        with start_moto() as moto:
            fs = s3fs.S3FileSystem(endpoint_url=moto.endpoint, key="testing", secret="testing")
    """

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        # werkzeug logs every request at INFO; keep benchmark output readable unless asked for
        werkzeug_log = logging.getLogger("werkzeug")
        if werkzeug_log.level == logging.NOTSET:
            werkzeug_log.setLevel(logging.WARNING)
        # port 0: the kernel picks a free port, read back once the server is bound
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self._stopped = False

    def reset(self) -> None:
        """Forget every bucket and object (moto's ``/moto-api/reset``)."""
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def stop(self) -> None:
        """Stop serving and release the port; calling it again does nothing."""
        if self._stopped:
            return
        self._stopped = True
        self._server.stop()
        # ThreadedMotoServer.stop() shuts the loop down but leaves the listening socket open
        werkzeug_server = self._server._server
        if werkzeug_server is not None:
            werkzeug_server.server_close()

    def __enter__(self) -> MotoServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_moto() -> MotoServer:
    """Start a moto S3 server on a free loopback port; ``.endpoint``, ``.reset()``, ``.stop()``."""
    return MotoServer()


class S3Bucket:
    """One bucket on a test S3 server, named to be unique, with the credentials to reach it.

    Example::

        bucket = S3Bucket.create(moto.endpoint)
        bucket.client().pipe(bucket.path("a.bin"), b"hello")
        assert fsspec.open(bucket.url("a.bin"), endpoint_url=bucket.endpoint).open().read() == b"hello"
    """

    key = "testing"
    secret = "testing"
    region = "us-east-1"

    def __init__(self, endpoint: str, name: str) -> None:
        self.endpoint = endpoint
        self.bucket = name
        self._client: Any = None

    @classmethod
    def create(cls, endpoint: str) -> S3Bucket:
        """Make a bucket with a fresh name on ``endpoint``."""
        bucket = cls(endpoint, f"shardkit-test-{uuid.uuid4().hex[:16]}")
        bucket.client().mkdir(bucket.bucket)
        return bucket

    def path(self, path: str = "") -> str:
        """``bucket/path``, the form s3fs methods take."""
        return f"{self.bucket}/{path.lstrip('/')}".rstrip("/")

    def url(self, path: str = "") -> str:
        """``s3://bucket/path``."""
        return f"s3://{self.path(path)}"

    def names(self, prefix: str) -> set[str]:
        """The names of the objects under ``prefix`` now, listed without reading them (a job may be
        deleting some while a test polls)."""
        fs = self.client()
        fs.invalidate_cache()  # its listings would not show what the code under test did since
        return {path.rsplit("/", 1)[1] for path in fs.find(self.path(prefix))}

    def client(self, endpoint: str | None = None, **options: Any) -> Any:
        """An ``s3fs.S3FileSystem`` on this server (or on ``endpoint``), whatever the environment says.

        Without arguments it is the same client each call (making one costs a tenth of a second).
        """
        import s3fs

        if endpoint is None and not options and self._client is not None:
            return self._client
        fs = s3fs.S3FileSystem(
            endpoint_url=endpoint or self.endpoint, key=self.key, secret=self.secret, skip_instance_cache=True, **options
        )
        if endpoint is None and not options:
            self._client = fs
        return fs


def aws_environment(endpoint: str) -> dict[str, str | None]:
    """Variables that aim botocore clients made afterwards at ``endpoint`` with test keys; None means unset.

    The machine's AWS config, profiles and instance metadata are shut out, and the retry policy is
    fixed, since botocore's default changed (1.43 retries 5 times by default, 1.44 3 times).
    """
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": S3Bucket.key,
        "AWS_SECRET_ACCESS_KEY": S3Bucket.secret,
        "AWS_DEFAULT_REGION": S3Bucket.region,
        "AWS_RETRY_MODE": "standard",
        "AWS_MAX_ATTEMPTS": "3",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL_S3": None,  # it would win over AWS_ENDPOINT_URL
        "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": None,
        "AWS_SESSION_TOKEN": None,
        "AWS_PROFILE": None,
        "AWS_DEFAULT_PROFILE": None,
    }


def _s3_error_body(status: int) -> bytes:
    """The XML document S3 answers ``status`` with."""
    phrase = http.HTTPStatus(status)
    code, message = _S3_ERRORS.get(status) or (phrase.phrase.replace(" ", ""), phrase.description)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<RequestId>{_request_id()}</RequestId><HostId>s3proxy</HostId></Error>"
    ).encode()


def _request_id() -> str:
    return uuid.uuid4().hex[:16].upper()


class _Message:
    """The start line and headers of one HTTP/1.1 message, read off a buffered socket file."""

    def __init__(self, start: bytes, lines: list[bytes]) -> None:
        self.start = start
        self.lines = lines
        self.fields: dict[str, str] = {}
        for line in lines:
            name, _, value = line.decode("latin-1").partition(":")
            self.fields[name.strip().lower()] = value.strip()

    @classmethod
    def read(cls, f: BinaryIO) -> _Message | None:
        """The next message head on ``f``, or None when the peer closed between messages."""
        start = f.readline(65537)
        if not start:
            return None
        lines = []
        while (line := f.readline(65537)) not in (b"\r\n", b"\n"):
            if not line:
                raise ConnectionError("connection closed inside a message head")
            lines.append(line)
        return cls(start, lines)

    def field(self, name: str) -> str:
        return self.fields.get(name, "")

    def chunked(self) -> bool:
        return "chunked" in self.field("transfer-encoding").lower()

    def length(self) -> int | None:
        value = self.field("content-length")
        return int(value) if value else None

    def head(self, *, drop: Collection[str] = ()) -> bytes:
        kept = [line for line in self.lines if line.split(b":", 1)[0].strip().lower().decode("latin-1") not in drop]
        return self.start + b"".join(kept) + b"\r\n"


def _body_pieces(f: BinaryIO, message: _Message, *, until_close: bool) -> Iterator[bytes]:
    """The body of ``message`` as raw pieces to pass on unchanged (chunk framing and trailers kept)."""
    if message.chunked():
        while True:
            size_line = f.readline(65537)
            if not size_line:
                raise ConnectionError("connection closed inside a chunked body")
            yield size_line
            size = int(size_line.split(b";", 1)[0], 16)
            if size == 0:
                break
            yield from _exact(f, size + 2)  # the chunk and its CRLF
        while True:  # trailer fields up to the blank line
            line = f.readline(65537)
            if not line:
                raise ConnectionError("connection closed inside chunked trailers")
            yield line
            if line in (b"\r\n", b"\n"):
                return
    length = message.length()
    if length is not None:
        yield from _exact(f, length)
    elif until_close:
        while piece := f.read1(_PIECE):  # type: ignore[attr-defined]
            yield piece


def _exact(f: BinaryIO, n: int) -> Iterator[bytes]:
    while n > 0:
        piece = f.read(min(n, _PIECE))
        if not piece:
            raise ConnectionError(f"connection closed with {n} body bytes still to come")
        n -= len(piece)
        yield piece


class _Link:
    """One socket and the buffered reader that parses what arrives on it."""

    def __init__(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            # a head and then body pieces go out as separate sends; Nagle would hold each for an ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.file: BinaryIO = sock.makefile("rb")

    def abort(self) -> None:
        """Close with a TCP reset rather than an orderly FIN."""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close()

    def close(self) -> None:
        # the socket is only released once its reader is closed too
        self.file.close()
        self.sock.close()


class _Dropped(Exception):
    """Ends a connection's thread: the proxy reset the connection on purpose, or is stopping."""


class S3Proxy:
    """A loopback HTTP proxy in front of an S3 endpoint that injects faults and S3-like limits.

    Each request is looked at on its own: with probability ``reset_fraction`` the client's
    connection is reset (before answering, or for a share ``reset_midbody`` of those, halfway
    through a response body); with probability ``error_fraction`` it is answered with an S3 XML
    error of status ``error_status`` (503 is ``SlowDown``, 500 ``InternalError``) and not
    forwarded. ``only`` limits faults to some HTTP methods, such as ``{"GET"}``. Every response waits
    ``latency`` seconds before its first byte, and bodies go out at most ``bandwidth`` bytes/s
    per connection. The fault for the n-th request is drawn from ``(seed, n)``, so a run that
    sends the same requests in the same order meets the same faults; ``plan``, a list of
    ``"reset"``, ``"reset-midbody"`` or ``"error"``, gives the faults of the next requests first.
    All of these are plain attributes and can be changed while the proxy runs. ``go_down()``,
    ``come_up()`` and ``outage(seconds)`` make the store vanish as a crashed server does.

    Example::

        with S3Proxy(moto.endpoint, reset_fraction=0.2, only={"GET"}) as proxy:
            fs = s3fs.S3FileSystem(endpoint_url=proxy.endpoint, key="testing", secret="testing")
    """

    def __init__(
        self,
        upstream_endpoint: str,
        *,
        reset_fraction: float = 0.0,
        reset_midbody: float = 0.5,
        error_fraction: float = 0.0,
        error_status: int = 503,
        latency: float = 0.0,
        bandwidth: float | None = None,
        seed: int = 0,
        only: Collection[str] | None = None,
    ) -> None:
        scheme, _, hostport = upstream_endpoint.rstrip("/").partition("://")
        if scheme != "http":
            raise ValueError(f"{upstream_endpoint}: the proxy forwards plain http:// only")
        host, _, port = hostport.rpartition(":")
        self.upstream = (host, int(port))
        self.reset_fraction = reset_fraction
        self.reset_midbody = reset_midbody
        self.error_fraction = error_fraction
        self.error_status = error_status
        self.latency = latency
        self.bandwidth = bandwidth
        self.seed = seed
        self.only = only
        # faults for the next requests (of the ``only`` methods), taken in order before any drawn one
        self.plan: list[str] = []
        self.connections = self.requests = self.resets = self.errors = 0
        self.bytes_up = self.bytes_down = 0

        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._listener: socket.socket | None = socket.create_server(("127.0.0.1", 0))
        port = self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{port}"
        self._name = f"s3proxy-{port}"
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"{self._name}-accept", daemon=True)
        self._acceptor.start()

    # --- lifecycle ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Close every connection and join every thread; calling it again does nothing."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        with self._lock:
            listener = self._listener
        if listener is not None:  # None while down
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
            listener.close()
        self._acceptor.join()
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked reading it
        for thread in threads:
            thread.join()

    def go_down(self) -> None:
        """Fail like a store that crashed: every open connection is reset (a response in flight is
        cut) and new ones are refused, until :meth:`come_up`."""
        with self._lock:
            listener, self._listener = self._listener, None
            sockets = list(self._sockets)
        if listener is None:
            return
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        self._acceptor.join()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RDWR)

    def come_up(self) -> None:
        """Accept connections again on the same port after :meth:`go_down`."""
        with self._lock:
            if self._listener is not None or self._stopping.is_set():
                return
            self._listener = socket.create_server(("127.0.0.1", self.port))
            self._acceptor = threading.Thread(target=self._accept_loop, name=f"{self._name}-accept", daemon=True)
        self._acceptor.start()

    def outage(self, seconds: float) -> threading.Thread:
        """:meth:`go_down` now and :meth:`come_up` ``seconds`` later, from a thread (returned, to join)."""
        self.go_down()

        def later() -> None:
            if not self._stopping.wait(seconds):
                self.come_up()

        thread = threading.Thread(target=later, name=f"{self._name}-outage", daemon=True)
        thread.start()
        return thread

    def __enter__(self) -> S3Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def counts(self) -> dict[str, int]:
        """The counters at this moment: connections, requests, resets, errors, bytes up and down."""
        with self._lock:
            return {
                "connections": self.connections,
                "requests": self.requests,
                "resets": self.resets,
                "errors": self.errors,
                "bytes_up": self.bytes_up,
                "bytes_down": self.bytes_down,
            }

    # --- threads --------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        listener = self._listener
        while not self._stopping.is_set() and listener is not None:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed by stop()
            with self._lock:
                if self._stopping.is_set():
                    client.close()
                    return
                self.connections += 1
                number = self.connections
                thread = threading.Thread(target=self._serve, args=(client,), name=f"{self._name}-conn-{number}", daemon=True)
                self._sockets.add(client)
                self._threads.add(thread)
            thread.start()

    def _serve(self, client_sock: socket.socket) -> None:
        """Carry the requests of one client connection until either side closes it."""
        client = _Link(client_sock)
        upstream: _Link | None = None
        try:
            keep_alive = True
            while keep_alive and not self._stopping.is_set():
                request = _Message.read(client.file)
                if request is None:
                    break
                upstream, keep_alive = self._one_request(client, request, upstream)
        except (_Dropped, OSError, ValueError):
            pass  # a reset on purpose, a peer gone or a malformed message: this connection ends
        finally:
            for link in (client, upstream):
                if link is not None:
                    self._forget(link)
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._sockets.discard(link.sock)
        link.close()

    # --- one request ----------------------------------------------------------------------------

    def _draw_fault(self, method: str) -> str | None:
        """'reset', 'reset-midbody', 'error' or None for the next request, from ``(seed, n)``."""
        with self._lock:
            self.requests += 1
            number = self.requests
        if self.only is not None and method not in self.only:
            return None
        with self._lock:
            planned = self.plan.pop(0) if self.plan else None
            if planned in ("reset", "reset-midbody"):
                self.resets += 1
            elif planned == "error":
                self.errors += 1
        if planned is not None:
            return planned
        draw, where = np.random.default_rng((self.seed, number)).random(2)
        if draw < self.reset_fraction:
            with self._lock:
                self.resets += 1
            return "reset-midbody" if where < self.reset_midbody else "reset"
        if draw < self.reset_fraction + self.error_fraction:
            with self._lock:
                self.errors += 1
            return "error"
        return None

    def _one_request(self, client: _Link, request: _Message, upstream: _Link | None) -> tuple[_Link | None, bool]:
        """Answer one request; returns the upstream link to reuse and whether the client stays."""
        method = request.start.split(b" ", 1)[0].decode("latin-1")
        self._count_up(len(request.head()))
        fault = self._draw_fault(method)
        if fault == "reset":
            client.abort()
            raise _Dropped
        if "100-continue" in request.field("expect").lower():
            # answer the interim response here so the forwarded request needs none
            self._send(client, b"HTTP/1.1 100 Continue\r\n\r\n")
        body = _body_pieces(client.file, request, until_close=False)
        client_stays = "close" not in request.field("connection").lower()
        if fault == "error":
            for piece in body:  # read to its end so the next request on this connection starts clean
                self._count_up(len(piece))
            self._send_error(client, method)
            return upstream, client_stays

        if upstream is None:
            upstream = _Link(socket.create_connection(self.upstream))
            with self._lock:
                self._sockets.add(upstream.sock)
            if self._stopping.is_set():  # stop() may have shut the sockets it knew before this one
                raise _Dropped
        upstream.sock.sendall(request.head(drop={"expect"}))
        for piece in body:
            self._count_up(len(piece))
            upstream.sock.sendall(piece)
        upstream_stays, client_can_stay = self._relay_response(client, upstream, method, midbody_reset=fault == "reset-midbody")
        if not upstream_stays:
            self._forget(upstream)
            upstream = None
        return upstream, client_stays and client_can_stay

    def _relay_response(self, client: _Link, upstream: _Link, method: str, *, midbody_reset: bool) -> tuple[bool, bool]:
        """Pass one response from upstream to the client; returns whether each connection stays open.

        The upstream's wish to close is not passed on: moto's server closes after every response,
        where S3 keeps connections alive, and the client should see S3's behaviour.
        """
        response = _Message.read(upstream.file)
        while response is not None and response.start.split(b" ", 2)[1].startswith(b"1"):
            response = _Message.read(upstream.file)  # interim responses were answered already
        if response is None:
            raise ConnectionError("upstream closed without answering")
        status = int(response.start.split(b" ", 2)[1])
        has_body = method != "HEAD" and status not in _NO_BODY_STATUSES
        length = response.length() if has_body else 0
        ends_at_close = has_body and length is None and not response.chunked()
        if midbody_reset and not length:
            client.abort()  # no body of known length to cut in half: reset before answering instead
            raise _Dropped
        self._pause(self.latency)
        head = response.head(drop={"connection", "keep-alive"})
        if ends_at_close:
            head = head[:-2] + b"Connection: close\r\n\r\n"
        self._send(client, head)
        if has_body:
            pieces = _body_pieces(upstream.file, response, until_close=True)
            self._relay_body(client, pieces, cut_at=length // 2 if midbody_reset and length else None)
        upstream_closes = "close" in response.field("connection").lower() or response.start.startswith(b"HTTP/1.0")
        return not (upstream_closes or ends_at_close), not ends_at_close

    def _relay_body(self, client: _Link, pieces: Iterator[bytes], *, cut_at: int | None) -> None:
        """Send body pieces paced to ``bandwidth``; reset the client once ``cut_at`` bytes went."""
        started = time.monotonic()
        sent = 0
        for piece in pieces:
            if cut_at is not None and sent + len(piece) >= cut_at:
                self._send(client, piece[: cut_at - sent])
                client.abort()
                raise _Dropped
            if self.bandwidth:
                # wait before sending, so the last byte of n leaves no sooner than n / bandwidth
                self._pause(started + (sent + len(piece)) / self.bandwidth - time.monotonic())
            self._send(client, piece)
            sent += len(piece)

    def _send_error(self, client: _Link, method: str) -> None:
        body = _s3_error_body(self.error_status)
        status = http.HTTPStatus(self.error_status)
        head = (
            f"HTTP/1.1 {status.value} {status.phrase}\r\n"
            "Content-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"x-amz-request-id: {_request_id()}\r\n\r\n"
        ).encode()
        self._pause(self.latency)
        self._send(client, head if method == "HEAD" else head + body)

    def _pause(self, seconds: float) -> None:
        """Sleep, unless stop() comes first: then end the connection rather than finish the response."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:  # a timed wait may return a little early
            if self._stopping.wait(left):
                raise _Dropped

    def _send(self, client: _Link, data: bytes) -> None:
        client.sock.sendall(data)
        with self._lock:
            self.bytes_down += len(data)

    def _count_up(self, n: int) -> None:
        with self._lock:
            self.bytes_up += n
