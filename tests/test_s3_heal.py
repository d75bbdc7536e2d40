"""Faults that heal and faults that do not, on S3 (moto on loopback, the fault proxy of s3_server.py).

A range cut mid-body is asked again for the same bytes; an outage shorter than the retry deadline
rides through an epoch, one longer ends it with the documented error; a cached copy changed on
disk is found out with ``verify`` off. And the table of what fails at once: a refused connection,
a host that does not resolve, an invalid endpoint and a missing bucket, each in at most 5 s with
one line naming the thing.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from conftest import make_samples

import shardkit
from shardkit import storage
from shardkit.storage import remote, retry

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SAMPLES = make_samples(64, size=16_000)  # 8 piles of about 130 KB


def _identity(unit):
    return unit


def _write(url: str, piles: int = 8) -> shardkit.Manifest:
    units = [SAMPLES[i : i + 16] for i in range(0, len(SAMPLES), 16)]  # 4 units
    return shardkit.preprocess(units, _identity, url, piles=piles, quiet=True)


def _epoch(url: str, **kwargs) -> list[tuple[str, bytes]]:
    return [(s["__key__"], bytes(s["bin"])) for s in shardkit.loader(url, decode=False, seed=5, **kwargs)]


@pytest.fixture
def fresh_endpoints(monkeypatch):
    """No endpoint counts as having answered, and every bucket's client is made anew."""
    monkeypatch.setattr(retry, "_answered", set())
    monkeypatch.setattr(retry, "_given_up", set())
    monkeypatch.setattr(remote, "_connected", set())


# --- heal -----------------------------------------------------------------------------------------


def test_a_range_cut_mid_body_is_asked_again_for_the_same_bytes(s3, faulty_s3, fresh_endpoints):
    data = os.urandom(4 << 20)
    s3.client().pipe(s3.path("x.bin"), data)
    faulty_s3.only = {"GET"}
    faulty_s3.plan = ["reset-midbody"] * 6
    assert storage.read_bytes(s3.url("x.bin"), size=len(data), concurrency=4) == data
    assert faulty_s3.resets == 6 and faulty_s3.plan == []


def test_bodies_cut_while_several_piles_are_read_at_once_cost_no_sample(s3, faulty_s3, fresh_endpoints, tmp_path):
    url = s3.url("ds")
    _write(url)
    expected = _epoch(url, prefetch=1)
    faulty_s3.only = {"GET"}
    faulty_s3.plan = ["reset-midbody"] * 5  # the first GETs of the piles read at once (8 small piles: all of them)
    assert _epoch(url, cache_dir=str(tmp_path / "cache")) == expected
    assert faulty_s3.resets == 5 and faulty_s3.plan == []
    assert _epoch(url, cache_dir=str(tmp_path / "cache")) == expected  # and the cache kept only whole piles


def test_an_outage_shorter_than_the_deadline_rides_through_an_epoch(s3, faulty_s3, fresh_endpoints):
    url = s3.url("ds")
    _write(url)
    expected = _epoch(url)
    got = []
    outage = None
    for k, sample in enumerate(shardkit.loader(url, decode=False, seed=5, prefetch=1)):
        got.append((sample["__key__"], bytes(sample["bin"])))
        if k == 12:  # a pile or two in: the next piles are read while the store is down
            outage = faulty_s3.outage(4.0)
    assert outage is not None
    outage.join()
    assert got == expected


def test_an_outage_past_the_deadline_ends_the_epoch_with_one_line(s3, faulty_s3, fresh_endpoints, monkeypatch):
    url = s3.url("ds")
    _write(url)
    monkeypatch.setenv(retry.ENVIRONMENT, "1.5")
    outage = None
    started = None
    with pytest.raises(shardkit.StorageError) as info:
        for k, _ in enumerate(shardkit.loader(url, decode=False, seed=5, prefetch=1)):
            if k == 12:
                outage, started = faulty_s3.outage(8.0), time.monotonic()
    waited = time.monotonic() - started
    faulty_s3.come_up()
    message = str(info.value)
    assert "\n" not in message
    assert "cannot reach the storage endpoint" in message and f"up to the deadline of 2 s, {retry.ENVIRONMENT}" in message
    assert waited < 6.0  # the deadline, not the outage, ended it
    assert outage is not None


def test_a_changed_cached_copy_is_found_with_verify_off(s3, tmp_path, caplog):
    url = s3.url("ds")
    _write(url)
    cache = tmp_path / "cache"
    expected = _epoch(url, cache_dir=str(cache), verify=False)  # fills the cache
    entries = [p for p in (cache / "shardkit-piles").iterdir() if p.name.endswith(".tar")]
    assert len(entries) == 8
    victim = SAMPLES[30]["bin"]
    for entry in entries:  # flip a byte of one sample's payload, where only the checksum can see it
        blob = entry.read_bytes()
        at = blob.find(victim)
        if at >= 0:
            with open(entry, "r+b") as f:
                f.seek(at + 100)
                f.write(bytes([blob[at + 100] ^ 0xFF]))
            break
    else:
        raise AssertionError("the payload is in no cached pile")
    with caplog.at_level("WARNING", logger="shardkit.storage.cache"):
        assert _epoch(url, cache_dir=str(cache), verify=False) == expected
    assert any("the cached copy" in r.message and "checksum" in r.message for r in caplog.records)


# --- fail fast: (fault -> time to error -> message) --------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# what each fault is, the error it must be, and the words of its one line ({endpoint}: the endpoint set)
FAST = {
    "refused": (lambda: f"http://127.0.0.1:{_closed_port()}", shardkit.StorageError, "cannot reach the storage endpoint (Could not connect to the endpoint URL: \"{endpoint}/"),
    "unknown host": (lambda: "http://no-such-host.invalid:9000", shardkit.StorageError, "cannot reach the storage endpoint (Could not connect to the endpoint URL: \"{endpoint}/"),
    "invalid endpoint": (lambda: "not an endpoint", shardkit.ConfigError, "Invalid endpoint: {endpoint}; expected an http:// or https:// URL"),
}  # fmt: skip


@pytest.mark.parametrize(
    ("fault", "command"), [(f, "info") for f in FAST] + [("refused", "loader"), ("unknown host", "pile")], ids=lambda v: str(v)
)
def test_a_wrong_endpoint_fails_in_seconds_naming_it(s3, fresh_endpoints, monkeypatch, fault, command):
    make, error, words = FAST[fault]
    endpoint = make()
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    started = time.monotonic()
    with pytest.raises(error) as info:
        if command == "info":
            shardkit.info(s3.url("ds"))
        elif command == "loader":
            next(iter(shardkit.loader(s3.url("ds"))))
        else:
            shardkit.preprocess([SAMPLES[:4]], _identity, s3.url("ds"), piles=2, quiet=True)
    took = time.monotonic() - started
    message = str(info.value)
    assert took <= 10.0, f"{fault}: {took:.1f} s"  # 1-2 s alone; the bound leaves room for a busy machine, far from a minute
    assert words.format(endpoint=endpoint) in message and "\n" not in message


@pytest.mark.parametrize("where", ["storage_options", "AWS_ENDPOINT_URL"])
def test_an_endpoint_with_a_password_in_it_is_refused_without_showing_it(s3, fresh_endpoints, monkeypatch, where):
    """S3 clients refuse to send such a URL, at the first request, in words that name no setting."""
    with_password = s3.endpoint.replace("://", "://someone:pw/Secret-123@")  # an AWS secret may hold "/"
    options = None
    if where == "AWS_ENDPOINT_URL":
        monkeypatch.setenv("AWS_ENDPOINT_URL", with_password)
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
    else:
        options = {"endpoint_url": with_password}
    for run in (
        lambda: shardkit.preprocess([SAMPLES[:4]], _identity, s3.url("pw"), piles=2, quiet=True, storage_options=options),
        lambda: next(iter(shardkit.loader(s3.url("ds"), storage_options=options))),
    ):
        with pytest.raises(shardkit.ConfigError) as info:
            run()
        message = str(info.value)
        assert f"the endpoint {s3.endpoint} is given with a user name and password in it" in message, message
        assert "Secret-123" not in message and "someone" not in message
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    assert not s3.client().exists(s3.path("pw")), "refused before anything is written"


def test_an_aws_endpoint_variable_with_a_password_refuses_only_s3_urls(monkeypatch):
    pytest.importorskip("s3fs", reason="remote URLs need the remote extra: pip install 'shardkit[remote]'")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://someone:pw@127.0.0.1:1")
    storage.write_bytes("memory://pw-elsewhere/x.bin", b"x")  # not S3: the variable is not its endpoint
    assert storage.read_bytes("memory://pw-elsewhere/x.bin") == b"x"
    with pytest.raises(shardkit.ConfigError, match=r"USER:PASSWORD@ in AWS_ENDPOINT_URL\)"):
        storage.read_bytes("s3://pw-bucket/x.bin")


def test_an_aws_endpoint_variable_is_checked_only_where_botocore_would_use_it(s3, fresh_endpoints, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://proxyuser:pw@127.0.0.1:9")  # another service's
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)  # S3's own comes first
    storage.write_bytes(s3.url("pw-vars/a.bin"), b"a")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    remote._connected.clear()
    remote.use([s3.url("pw-vars")], {"endpoint_url": s3.endpoint})  # given outright: the variable is not used
    assert storage.read_bytes(s3.url("pw-vars/a.bin")) == b"a"


def test_an_endpoint_with_a_password_is_refused_after_a_good_one_for_the_same_bucket(s3, fresh_endpoints):
    def write(options):
        shardkit.preprocess([SAMPLES[:2]], _identity, s3.url("pw"), piles=1, quiet=True, storage_options=options, overwrite=True)

    write({"endpoint_url": s3.endpoint})
    with pytest.raises(shardkit.ConfigError, match="is given with a user name and password in it"):
        write({"endpoint_url": s3.endpoint.replace("://", "://someone:pw/Secret@")})


@pytest.mark.parametrize("command", [["info"], ["verify"], ["gc"], ["pile", "SHARDS", "--piles", "2", "-o"]], ids=lambda c: c[0])
def test_every_command_names_a_missing_bucket(s3, tmp_path, capsys, command):
    from shardkit.cli import main

    shard = tmp_path / "a.tar"
    with shardkit.PileWriter(str(tmp_path / "local"), piles=1) as w:
        w.write({"__key__": "a", "txt": b"x"})
    shard.write_bytes(next((tmp_path / "local").glob("pile-*.tar")).read_bytes())
    url = "s3://no-such-bucket-shardkit/ds"
    args = [str(shard) if a == "SHARDS" else a for a in command] + [url]
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    last = err.splitlines()[-1]
    assert "the bucket s3://no-such-bucket-shardkit does not exist" in last, err
    assert ".shardkit-" not in last


def test_input_shards_in_a_missing_bucket_are_named_so(s3, tmp_path, capsys):
    from shardkit.cli import main

    pattern = "s3://no-such-bucket-shardkit/shards/*.tar"
    capsys.readouterr()
    assert main(["pile", pattern, "--piles", "2", "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"error: {pattern}: the bucket s3://no-such-bucket-shardkit does not exist (a typo? create it first)"), err
    with pytest.raises(shardkit.DatasetNotFoundError, match="the bucket s3://no-such-bucket-shardkit does not exist"):
        shardkit.loader(pattern)
    with pytest.raises(shardkit.DatasetNotFoundError, match="pattern matches no file"):  # the bucket is there
        shardkit.loader(s3.url("shards/*.tar"))


def test_throttling_and_5xx_are_retried_with_backoff(s3, faulty_s3, fresh_endpoints):
    s3.client().pipe(s3.path("x.bin"), b"payload")
    faulty_s3.only = {"GET"}
    faulty_s3.plan = ["error"] * 4  # 503 SlowDown, four times
    assert storage.read_bytes(s3.url("x.bin")) == b"payload"
    faulty_s3.error_status = 500
    faulty_s3.plan = ["error"] * 3
    assert storage.read_bytes(s3.url("x.bin")) == b"payload"
    assert faulty_s3.errors == 7


def test_a_store_failing_past_the_deadline_says_how_long_it_tried(s3, faulty_s3, fresh_endpoints, monkeypatch):
    s3.client().pipe(s3.path("x.bin"), b"payload")
    monkeypatch.setenv(retry.ENVIRONMENT, "1")
    faulty_s3.only, faulty_s3.error_fraction = {"GET"}, 1.0
    started = time.monotonic()
    with pytest.raises(
        shardkit.StorageError, match=r"x\.bin: cannot read: .*reduce your request rate.* \(retried for .* up to the deadline of 1 s"
    ) as info:
        storage.read_bytes(s3.url("x.bin"))
    assert time.monotonic() - started < 10  # the deadline is 1 s, the default one 60 s; a busy machine adds seconds
    assert "\n" not in str(info.value)


def test_the_deadline_comes_from_the_environment_and_is_checked(monkeypatch):
    monkeypatch.delenv(retry.ENVIRONMENT, raising=False)
    assert retry.deadline_from_environment() == retry.DEFAULT_DEADLINE
    monkeypatch.setenv(retry.ENVIRONMENT, "12.5")
    assert retry.deadline_from_environment() == 12.5
    for bad in ("soon", "0", "-3", "nan", "inf"):
        monkeypatch.setenv(retry.ENVIRONMENT, bad)
        with pytest.raises(shardkit.ConfigError, match=f"{retry.ENVIRONMENT}="):
            retry.deadline_from_environment()


@pytest.mark.parametrize("name", ["shard-000002.tar", "shard-000002.tar.gz", "shard-000002.tar.zst", "shard-000002.tar.lz4"])
def test_a_remote_input_shard_that_is_no_tar_is_skipped_under_on_error_skip(s3, tmp_path, name):
    """Choosing key_prefix reads each shard's first key through the store: a shard that does not
    parse must leave the decision to pass 1, which skips it, not stop the job as a storage failure."""
    from conftest import write_wds_shards

    local = write_wds_shards(tmp_path, "shard-{:06d}.tar", 2, lambda k, i: {"__key__": f"{i:06d}", "txt": f"{k}-{i}"} if i < 5 else None)
    client = s3.client()
    for path in local:
        client.put(path, s3.path(f"in/{os.path.basename(path)}"))
    bad = b"this is no tar archive at all " * 40
    if name.endswith((".zst", ".lz4")):  # a frame that starts right and is cut in its first member
        import lz4.frame
        import zstandard

        whole = Path(local[0]).read_bytes()
        packed = zstandard.ZstdCompressor().compress(whole) if name.endswith(".zst") else lz4.frame.compress(whole)
        bad = packed[:24]
    client.pipe(s3.path(f"in/{name}"), bad)
    m = shardkit.pile(s3.url("in/shard-*"), str(tmp_path / "out"), piles=2, on_error="skip", quiet=True)
    assert m.samples == 10 and [s["unit"] for s in m.extra["skipped"]] == [2], m.extra


def test_an_endpoint_that_takes_connections_and_never_answers_is_warned_about(s3, fresh_endpoints, monkeypatch, caplog):
    """A listener that accepts and says nothing: the client waits for its read timeout (botocore's
    is 60 s); meanwhile a warning names the endpoint, instead of a silence that long."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
        monkeypatch.setattr(retry, "SILENT_AFTER", 0.3)
        monkeypatch.setattr(retry, "_waited_for", set())
        monkeypatch.setattr(retry, "DEFAULT", retry.Retry(deadline=3.0))
        options = {"endpoint_url": endpoint, "config_kwargs": {"read_timeout": 1.5}}
        with caplog.at_level("WARNING", logger="shardkit.storage.retry"), pytest.raises(shardkit.StorageError, match=endpoint):
            shardkit.info(s3.url("ds"), storage_options=options)
    said = [r.getMessage() for r in caplog.records if "no answer from" in r.getMessage()]
    assert len(said) == 1 and f"no answer from {endpoint} after 0.3 s" in said[0] and "is the endpoint right?" in said[0]
