"""Which object-store failures are retried, how long between tries, and the ranges a pile is read in."""

from __future__ import annotations

import errno

import pytest

from shardkit.storage import remote, retry


class ClientError(Exception):
    """Stands in for botocore's: a message and the HTTP status in ``response``."""

    def __init__(self, status: int, code: str) -> None:
        super().__init__(f"An error occurred ({code}) when calling the GetObject operation")
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


class ClientPayloadError(Exception):
    """aiohttp's name for a body cut short."""


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ConnectionResetError(errno.ECONNRESET, "reset by peer"), True),
        (TimeoutError("read timed out"), True),
        (OSError(errno.EBUSY, "Please reduce your request rate."), True),  # s3fs: SlowDown
        (OSError(getattr(errno, "EREMOTEIO", errno.EIO), "InternalError"), True),
        (ClientError(503, "SlowDown"), True),
        (ClientError(500, "InternalError"), True),
        (ClientError(429, "TooManyRequests"), True),
        (ClientPayloadError("Response payload is not completed"), True),
        (FileNotFoundError("s3://b/x"), False),
        (PermissionError("Access Denied"), False),
        (ClientError(403, "AccessDenied"), False),
        (ClientError(404, "NoSuchKey"), False),
        (OSError(errno.EINVAL, "The specified bucket is not valid."), False),
        (ValueError("bad"), False),
    ],
)
def test_which_failures_are_of_the_moment(error, expected):
    assert retry.transient(error) is expected


def test_a_cause_of_the_moment_counts():
    outer = RuntimeError("read failed")
    outer.__cause__ = ConnectionResetError("reset")
    assert retry.transient(outer)


def test_waits_grow_to_the_cap_with_full_jitter():
    policy = retry.Retry(attempts=6, base=0.2, cap=1.0)
    assert [policy.delay(k, draw=lambda: 1.0) for k in range(1, 6)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert policy.delay(3, draw=lambda: 0.0) == 0.0


def test_call_retries_failures_of_the_moment_only():
    slept: list[float] = []
    policy = retry.Retry(attempts=4, base=0.01, cap=0.01)
    tries = iter([ConnectionResetError("x"), OSError(errno.EBUSY, "SlowDown"), "done"])

    def flaky():
        outcome = next(tries)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    assert policy.call(flaky, what="s3://b/k", sleep=slept.append) == "done"
    assert len(slept) == 2
    with pytest.raises(FileNotFoundError):
        policy.call(lambda: (_ for _ in ()).throw(FileNotFoundError("k")), what="s3://b/k", sleep=slept.append)
    assert len(slept) == 2  # a missing object is not tried again

    def always():
        raise ConnectionResetError("x")

    with pytest.raises(ConnectionResetError):
        policy.call(always, what="s3://b/k", sleep=slept.append)
    assert len(slept) == 2 + 3  # four tries, three waits


@pytest.mark.parametrize(
    ("size", "concurrency", "expected"),
    [
        (0, 8, [(0, 0)]),
        (100, 8, [(0, 100)]),  # small: one range
        (12 << 20, 8, [(0, 12 << 20)]),  # under two ranges of 8 MiB: one request
        (24 << 20, 8, [(0, 8 << 20), (8 << 20, 16 << 20), (16 << 20, 24 << 20)]),  # ranges of at least 8 MiB
        (64 << 20, 4, [(k * (16 << 20), (k + 1) * (16 << 20)) for k in range(4)]),
        (64 << 20, 1, [(0, 64 << 20)]),
    ],
)
def test_ranges_cover_the_object(size, concurrency, expected):
    assert remote.ranges(size, concurrency) == expected


def test_storage_options_belong_to_a_bucket():
    assert remote.root("s3://bucket/a/b.tar") == "s3://bucket"
    before = remote.registered()
    try:
        remote.use(["s3://one/x", "data/local"], {"anon": True})
        assert remote.registered()["s3://one"] == {"anon": True}
        assert "data/local" not in remote.registered()
    finally:
        remote.restore(before)
    assert remote.registered() == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"remote_concurrency": 0}, "remote_concurrency: expected an integer >= 1"),
        ({"cache_limit": "10GiB"}, "cache_limit: set cache_dir too"),
        ({"cache_dir": 3}, "cache_dir: expected a local directory path or None"),
        ({"cache_dir": "/tmp/c", "cache_limit": "lots"}, "cache_limit"),
        ({"storage_options": ["anon"]}, "storage_options: expected a mapping of option names to values"),
        ({"storage_options": {1: "x"}}, "storage_options: expected a mapping"),
    ],
)
def test_remote_options_are_checked(kwargs, message):
    import shardkit

    with pytest.raises(shardkit.ConfigError, match=message):
        shardkit.LoaderOptions(**kwargs)


def test_storage_option_flags_parse_and_never_show_values():
    import shardkit
    from shardkit.cli.flags import storage_options

    assert storage_options(["anon=true", "client_kwargs.region_name=eu-west-1", "max_concurrency=4"]) == {
        "anon": True,
        "client_kwargs": {"region_name": "eu-west-1"},
        "max_concurrency": 4,
    }
    with pytest.raises(shardkit.ConfigError, match="expected KEY=VALUE") as info:
        storage_options(["secret-without-a-key"])
    assert "secret-without-a-key" not in str(info.value) and "got text without '='" in str(info.value)
    with pytest.raises(shardkit.ConfigError, match=r"got the key 'client_kwargs\.'"):
        storage_options(["client_kwargs.=x"])
    with pytest.raises(shardkit.ConfigError, match="given both as a value and as a group"):
        storage_options(["a=1", "a.b=2"])
