"""Shared fixtures: tiny datasets built in tmp_path."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import threading

import numpy as np
import pytest

import shardkit
from shardkit.loading import source as source_module


def make_samples(n: int, *, size: int = 64, classes: int = 10, seed: int = 0) -> list[dict]:
    """Class-sorted samples with random payloads: key, a .bin payload and a .cls label."""
    rng = np.random.default_rng(seed)
    return [{"__key__": f"s{i:07d}", "bin": rng.bytes(size), "cls": i * classes // max(n, 1)} for i in range(n)]


def write_wds_shards(directory, name: str, count: int, sample) -> list[str]:
    """``count`` shards written by webdataset's TarWriter; ``sample(k, i)`` is sample i of shard k or None."""
    import webdataset as wds

    paths = []
    for k in range(count):
        path = os.path.join(directory, name.format(k))
        with wds.TarWriter(path) as w:
            i = 0
            while (s := sample(k, i)) is not None:
                w.write(s)
                i += 1
        paths.append(path)
    return paths


def hold_whole_reads(monkeypatch) -> threading.Event:
    """Piles read whole wait until the event is set; a read still held after 20 s fails the test."""
    gate = threading.Event()
    real = source_module.fetch

    def held(url, **kw):
        if not gate.wait(20):
            raise AssertionError(f"{url}: the test never let this pile be read whole")
        return real(url, **kw)

    monkeypatch.setattr(source_module, "fetch", held)
    return gate


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_in_this_run(tmp_path_factory):
    """Send what goes to the system's temporary directory during the run into this run's pytest
    directory, which pytest prunes (it keeps the last three runs): the doc blocks' ``mkdtemp()``
    and ``mktemp -d``, the benchmarks', litdata's lock files and cache. Left in ``/tmp`` they
    would pile up with every run. Child processes get it through ``TMPDIR``. Ray's session
    folders go to a short folder of their own (``RAY_TMPDIR``), removed at the end.
    """
    root = str(tmp_path_factory.mktemp("tmp", numbered=False))
    # Ray's sockets live in its folder, and a socket path may not pass 107 bytes: a short folder of its own
    ray = tempfile.mkdtemp(prefix="ray-")
    before = {name: os.environ.get(name) for name in ("TMPDIR", "RAY_TMPDIR")}
    cached = tempfile.tempdir
    os.environ.update(TMPDIR=root, RAY_TMPDIR=ray)
    tempfile.tempdir = root
    yield root
    tempfile.tempdir = cached
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    shutil.rmtree(ray, ignore_errors=True)


@pytest.fixture(autouse=True)
def _start_method_kept():
    """Put the process-wide multiprocessing start method back after each test.

    Some libraries set it for the whole process (``litdata.optimize`` sets ``spawn`` with
    force=True): every later DataLoader would then start workers that import torch afresh, and
    a worker still starting when its loader is torn down dies on the loader's freed semaphores.
    """
    before = multiprocessing.get_start_method(allow_none=True)
    yield
    if multiprocessing.get_start_method(allow_none=True) != before:
        multiprocessing.set_start_method(before, force=True)


@pytest.fixture
def samples() -> list[dict]:
    return make_samples(200)


@pytest.fixture
def dataset(tmp_path, samples) -> str:
    """A 200-sample dataset in 8 piles."""
    out = os.path.join(tmp_path, "ds")
    with shardkit.PileWriter(out, piles=8, seed=3) as w:
        for s in samples:
            w.write(s)
    return out


# --- S3 on loopback: moto, and a proxy that injects faults (see s3_server.py) ----------------------


@pytest.fixture(scope="session")
def moto_server():
    """A moto S3 server on a free 127.0.0.1 port, shared by the session; skipped without moto or s3fs."""
    try:
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError:
        pytest.skip("needs moto[server] and s3fs: pip install 'shardkit[remote]'")
    from s3_server import start_moto

    server = start_moto()
    yield server
    server.stop()


def _aim_aws_at(mp: pytest.MonkeyPatch, endpoint: str) -> None:
    """Point every S3 client built from now on at ``endpoint``, with test credentials and no user config."""
    import fsspec.config
    import s3fs
    from s3_server import aws_environment

    for name, value in aws_environment(endpoint).items():
        if value is None:
            mp.delenv(name, raising=False)
        else:
            mp.setenv(name, value)
    mp.delitem(fsspec.config.conf, "s3", raising=False)
    # fsspec hands back a cached filesystem for equal arguments; one made under another endpoint must go
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def s3(moto_server, monkeypatch):
    """A fresh bucket on the moto server, and an environment in which ``s3://`` URLs reach it.

    s3fs is given no options; the variables of ``s3_server.aws_environment`` do it: botocore takes
    the endpoint from ``AWS_ENDPOINT_URL`` (it has since 1.31), the keys from ``AWS_ACCESS_KEY_ID``/
    ``AWS_SECRET_ACCESS_KEY`` and the region from ``AWS_DEFAULT_REGION``. ``AWS_CONFIG_FILE`` and
    ``AWS_SHARED_CREDENTIALS_FILE`` point at ``os.devnull`` so no profile of the machine's user gets
    in. ``AWS_RETRY_MODE=standard`` and ``AWS_MAX_ATTEMPTS=3`` make botocore's retries the same
    whichever botocore is installed. ``fsspec.config.conf["s3"]`` is emptied, and cached s3fs
    filesystems are dropped before and after, so each test meets its own environment.

    Returns an ``S3Bucket``: ``.endpoint`` (moto's), ``.bucket``, ``.url(path)`` (``s3://bucket/path``),
    ``.path(path)`` (``bucket/path``) and ``.client()``, an ``s3fs.S3FileSystem`` on moto directly,
    which bypasses a ``faulty_s3`` proxy (handy to set up and check data).
    """
    from s3_server import S3Bucket

    _aim_aws_at(monkeypatch, moto_server.endpoint)
    yield S3Bucket.create(moto_server.endpoint)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    moto_server.reset()  # every bucket and object goes; the next test makes its own


@pytest.fixture
def faulty_s3(s3, monkeypatch):
    """An ``S3Proxy`` in front of moto, with ``AWS_ENDPOINT_URL`` aimed at it; faults start off.

    Use with ``s3`` for the bucket: ``s3.url(...)`` through the environment goes via the proxy,
    ``s3.client()`` goes to moto directly. Set ``reset_fraction``, ``error_fraction``, ``only``,
    ``latency``, ``bandwidth`` on the returned proxy, and read its counters.
    """
    from s3_server import S3Proxy

    with S3Proxy(s3.endpoint) as proxy:
        _aim_aws_at(monkeypatch, proxy.endpoint)
        yield proxy
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


# the unit unit_samples stops at (Ctrl-C), when set: a pass 1's fn stays one function, by name and
# code, so a resumed job finds its staging again
STOP_AT: dict[str, int | None] = {"at": None}


def unit_samples(unit):
    """Six text samples of ``unit``, keyed by it; a KeyboardInterrupt at ``STOP_AT["at"]``."""
    if unit == STOP_AT["at"]:
        raise KeyboardInterrupt
    for k in range(6):
        yield {"__key__": f"u{unit:02d}-{k}", "txt": f"unit {unit} sample {k}"}
