"""The loopback S3 used by remote tests: moto through s3fs, and the proxy's faults and limits."""

from __future__ import annotations

import http.client
import http.server
import os
import socket
import threading
import time

import pytest

fsspec = pytest.importorskip("fsspec", reason="needs moto[server] and s3fs: pip install 'shardkit[remote]'")
s3fs = pytest.importorskip("s3fs", reason="needs moto[server] and s3fs: pip install 'shardkit[remote]'")

from aiohttp import ClientPayloadError  # noqa: E402  (s3fs's dependencies, present once it is)
from botocore.exceptions import EndpointConnectionError  # noqa: E402
from s3_server import S3Proxy, start_moto  # noqa: E402


def quick_client(bucket, endpoint: str):
    """An s3fs client on ``endpoint`` that gives up fast: two botocore attempts, one s3fs round."""
    fs = bucket.client(endpoint, config_kwargs={"retries": {"total_max_attempts": 2, "mode": "standard"}})
    fs.retries = 1  # s3fs's own loop around botocore's; it has no constructor argument
    return fs


def connect(proxy: S3Proxy) -> http.client.HTTPConnection:
    host, port = proxy.endpoint.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=10)


# --- moto through s3fs --------------------------------------------------------------------------


def test_moto_put_get_list_through_the_environment(s3):
    fs = fsspec.filesystem("s3")  # no options: endpoint, keys and region come from the environment
    fs.pipe(s3.path("a/one.bin"), b"one")
    with fsspec.open(s3.url("a/two.bin"), "wb") as f:
        f.write(b"two" * 1000)
    assert fs.cat(s3.path("a/one.bin")) == b"one"
    with fsspec.open(s3.url("a/two.bin"), "rb") as f:
        assert f.read() == b"two" * 1000
    assert sorted(fs.ls(s3.path("a"), detail=False)) == [s3.path("a/one.bin"), s3.path("a/two.bin")]
    assert s3.client().cat(s3.path("a/one.bin")) == b"one"  # the environment reached moto itself


def test_moto_reset_forgets_buckets(s3, moto_server):
    assert s3.client().exists(s3.bucket)
    moto_server.reset()
    assert not s3.client().exists(s3.bucket)


# --- the proxy without faults -------------------------------------------------------------------


def test_proxy_passes_bytes_unchanged(s3, faulty_s3):
    data = os.urandom(3 * 2**20 + 17)
    fs = fsspec.filesystem("s3")  # through the proxy, by the environment
    fs.pipe(s3.path("big.bin"), data)
    with fs.open(s3.path("multi.bin"), "wb", block_size=5 * 2**20) as f:  # a multipart upload
        f.write(data * 2)
    assert fs.cat(s3.path("big.bin")) == data
    with fs.open(s3.path("multi.bin"), "rb", block_size=2**20) as f:
        f.seek(len(data) - 5)
        assert f.read(2**20) == (data * 2)[len(data) - 5 : len(data) - 5 + 2**20]
    assert s3.client().cat(s3.path("multi.bin")) == data * 2  # what moto holds
    assert fs.ls(s3.path(""), detail=False) == [s3.path("big.bin"), s3.path("multi.bin")]
    counts = faulty_s3.counts()
    assert counts["connections"] < counts["requests"]  # connections are kept alive across requests
    assert counts["bytes_up"] > 3 * len(data) and counts["bytes_down"] > len(data) + 2**20
    assert counts["resets"] == counts["errors"] == 0


def test_proxy_forwards_a_chunked_request_body(s3, faulty_s3):
    conn = connect(faulty_s3)
    pieces = [b"abc" * 1000, b"", b"defg" * 7]
    conn.request("PUT", f"/{s3.path('chunked.bin')}", body=iter(pieces), encode_chunked=True)
    response = conn.getresponse()
    response.read()
    assert response.status == 200
    conn.close()
    assert s3.client().cat(s3.path("chunked.bin")) == b"".join(pieces)


class _Handler(http.server.BaseHTTPRequestHandler):
    """``GET /chunked``: a short chunked body with a trailer; ``GET /big``: 1 MB with a length."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        self.send_response(200)
        if self.path == "/big":
            self.send_header("Content-Length", str(2**20))
            self.end_headers()
            self.wfile.write(bytes(2**20))
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in (b"hello ", b"chunked ", b"world"):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\nX-Trailer: yes\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def plain_upstream():
    """A stdlib HTTP/1.1 server on loopback for what moto never sends; yields its endpoint."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    serving = threading.Thread(target=server.serve_forever, args=(0.01,), name="plain-upstream", daemon=True)
    serving.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    serving.join()


def test_proxy_relays_a_chunked_response_and_keeps_the_connection(plain_upstream):
    with S3Proxy(plain_upstream) as proxy:
        conn = connect(proxy)
        for _ in range(3):
            conn.request("GET", "/chunked")
            assert conn.getresponse().read() == b"hello chunked world"
        conn.close()
        assert proxy.connections == 1 and proxy.requests == 3


# --- faults -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("midbody", "error"),
    [
        (0.0, EndpointConnectionError),  # reset before answering: botocore says it could not connect
        (1.0, ClientPayloadError),  # reset halfway through the body: aiohttp finds the body short
    ],
)
def test_reset_fails_a_read_until_turned_off(s3, faulty_s3, midbody, error):
    data = os.urandom(2**20)
    s3.client().pipe(s3.path("x.bin"), data)
    faulty_s3.reset_fraction, faulty_s3.reset_midbody, faulty_s3.only = 1.0, midbody, {"GET"}
    fs = quick_client(s3, faulty_s3.endpoint)
    assert fs.info(s3.path("x.bin"))["size"] == len(data)  # a HEAD: not faulted
    with pytest.raises(error):
        fs.cat(s3.path("x.bin"))
    assert faulty_s3.resets >= 1 and faulty_s3.errors == 0
    faulty_s3.reset_fraction = 0.0  # a live proxy takes new settings
    assert fs.cat(s3.path("x.bin")) == data


@pytest.mark.parametrize(
    ("status", "code", "message"), [(503, "SlowDown", "reduce your request rate"), (500, "InternalError", "internal error")]
)
def test_error_answers_are_s3_errors_that_botocore_retries(s3, faulty_s3, status, code, message):
    s3.client().pipe(s3.path("x.bin"), b"payload")
    faulty_s3.error_fraction, faulty_s3.error_status, faulty_s3.only = 1.0, status, {"GET"}
    fs = quick_client(s3, faulty_s3.endpoint)
    with pytest.raises(OSError, match=message) as caught:
        fs.cat(s3.path("x.bin"))
    response = caught.value.__cause__.response  # botocore's ClientError, as s3fs keeps it
    assert response["Error"]["Code"] == code and response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert faulty_s3.errors == 2  # botocore's two attempts, neither forwarded
    assert faulty_s3.requests in (2, 3)  # and, in s3fs before 2026.2, the HEAD it sent first to learn the size
    assert s3.client().cat(s3.path("x.bin")) == b"payload"


def test_faults_follow_the_seed(plain_upstream):
    """The n-th request meets the same fault for the same seed, whatever the timing."""

    def statuses(seed: int) -> list[int]:
        with S3Proxy(plain_upstream, error_fraction=0.5, seed=seed) as proxy:
            conn = connect(proxy)
            out = []
            for _ in range(24):
                conn.request("GET", "/chunked")
                response = conn.getresponse()
                response.read()
                out.append(response.status)
            conn.close()
            return out

    first = statuses(7)
    assert 503 in first and 200 in first
    assert statuses(7) == first
    assert statuses(8) != first


# --- limits -------------------------------------------------------------------------------------


def test_latency_delays_each_response(s3, faulty_s3):
    s3.client().pipe(s3.path("x.bin"), b"x")
    fs = fsspec.filesystem("s3")
    fs.info(s3.path("x.bin"))  # connect first, so only the latency is timed
    faulty_s3.latency = 0.05
    started = time.monotonic()
    fs.info(s3.path("x.bin"))
    assert 0.05 <= time.monotonic() - started < 3.0  # the upper bound: delayed once, not per retry or chunk


def test_bandwidth_paces_a_read(s3, faulty_s3):
    data = os.urandom(2 * 10**6)
    s3.client().pipe(s3.path("x.bin"), data)
    fs = fsspec.filesystem("s3")
    fs.info(s3.path("x.bin"))
    faulty_s3.bandwidth = 5e6  # 2 MB at 5 MB/s: 0.4 s
    started = time.monotonic()
    assert fs.cat_file(s3.path("x.bin"), start=0, end=len(data)) == data
    assert 0.4 <= time.monotonic() - started < 3.0  # the upper bound: paced, not stalled


# --- lifecycle ----------------------------------------------------------------------------------


def test_stop_closes_connections_and_joins_threads(plain_upstream):
    proxy = S3Proxy(plain_upstream, bandwidth=2e5)  # 1 MB at 200 kB/s: stop() meets a body in flight
    idle, busy = connect(proxy), connect(proxy)
    idle.request("GET", "/chunked")
    idle.getresponse().read()  # idle stays open, kept alive
    busy.request("GET", "/big")
    response = busy.getresponse()
    response.read(1000)
    started = time.monotonic()
    proxy.stop()
    proxy.stop()  # a second stop does nothing
    assert time.monotonic() - started < 2.5  # the body in flight would take 5 s to finish
    with pytest.raises(http.client.IncompleteRead):
        response.read()
    # the upstream's own handler threads end in their own time once their sockets close; not the proxy's
    assert [t.name for t in threading.enumerate() if t.name.startswith("s3proxy")] == []
    idle.close()
    busy.close()


def test_moto_stop_joins_its_thread_and_frees_the_port():
    pytest.importorskip("moto.server", reason="needs moto[server] and s3fs: pip install 'shardkit[remote]'", exc_type=ImportError)
    before = set(threading.enumerate())
    moto = start_moto()
    port = int(moto.endpoint.rsplit(":", 1)[1])
    moto.stop()
    moto.stop()
    assert set(threading.enumerate()) - before == set()
    with socket.create_server(("127.0.0.1", port)):
        pass  # the port is free again
