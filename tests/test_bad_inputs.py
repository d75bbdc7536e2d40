"""Every wrong input fails with one clear error: a table of bad calls across the API, the CLI and YAML jobs.

Each row is a call, the shardkit error it must raise and a fragment of the message that names
what was wrong (the argument, the YAML field, the file or URL). Python rows check the exact class
and a one-line message; CLI rows check the exit code (1, or 2 for argparse's usage errors),
exactly one ``error:`` line on stderr and no traceback; YAML rows go through ``load_job`` (or
``run_job``) and ``shardkit run``. Failures of the machine (a full disk, a read-only output, an
object store that cannot be reached) are made by replacing the call that would fail, so the
table needs neither root nor a network; the rows against a real S3 client talk to a closed port
on 127.0.0.1 and are skipped without s3fs.
"""

from __future__ import annotations

import builtins
import errno
import gzip
import importlib
import io
import logging
import os
import pathlib
import pickle
import socket
import string
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

import shardkit
from shardkit.cli import main
from shardkit.errors import (
    ConfigError,
    CorruptShardError,
    DatasetExistsError,
    DatasetNotFoundError,
    InputError,
    ManifestError,
    PileTooLargeError,
    SampleError,
    ShardkitError,
    StorageError,
)

Setup = Callable[[pytest.MonkeyPatch, SimpleNamespace], None]


# --- the places rows point at ------------------------------------------------------------------


def _tar(samples: int, prefix: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(samples):
            data = str(i).encode()
            info = tarfile.TarInfo(f"{prefix}{i:04d}.txt")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """A plain shard, a gzipped one, a corrupt gzipped one, a dataset (seed 5), a plain file."""
    root = tmp_path_factory.mktemp("bad-inputs")
    shard, gz, bad_gz, file = root / "src-000.tar", root / "src-001.tar.gz", root / "broken.tar.gz", root / "notes.txt"
    shard.write_bytes(_tar(6, "a"))
    gz.write_bytes(gzip.compress(_tar(6, "b")))
    good = gzip.compress(_tar(6, "c"))
    bad_gz.write_bytes(good[:10] + b"\xff" * 32 + good[42:])
    file.write_text("not a dataset\n")
    data = root / "data"
    with shardkit.PileWriter(data, piles=2, seed=5) as w:
        for i in range(8):
            w.write({"__key__": f"d{i:03d}", "txt": str(i)})
    return SimpleNamespace(
        root=str(root),
        shard=str(shard),
        gz=str(gz),
        bad_gz=str(bad_gz),
        file=str(file),
        data=str(data),
        missing=str(root / "missing"),
    )


@pytest.fixture
def c(place: SimpleNamespace, tmp_path) -> SimpleNamespace:
    """The places, plus ``out``: a fresh output directory (not created) for this row."""
    return SimpleNamespace(**vars(place), out=str(tmp_path / "out"), tmp=str(tmp_path))


def _fill(template: str, c: SimpleNamespace) -> str:
    return string.Template(template).substitute(vars(c))


# --- what a row may do to the machine first ----------------------------------------------------


def _enospc(*args: Any, **kwargs: Any) -> Any:
    raise OSError(errno.ENOSPC, "No space left on device")


def disk_full(mp: pytest.MonkeyPatch, c: SimpleNamespace) -> None:
    """Every writev fails: part files and output shards cannot be appended to."""
    mp.setattr(os, "writev", _enospc)


def disk_full_everywhere(mp: pytest.MonkeyPatch, c: SimpleNamespace) -> None:
    """Every write fails, the output's lock file included."""
    mp.setattr(os, "writev", _enospc)
    mp.setattr(os, "write", _enospc)


def read_only(mp: pytest.MonkeyPatch, c: SimpleNamespace) -> None:
    """Files cannot be created under ``out``, as on a read-only file system."""
    real = os.open

    def refuse(path: Any, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path).startswith(c.out) and len(args) > 0 and args[0] & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
        return real(path, *args, **kwargs)

    mp.setattr(os, "open", refuse)


def piles_unreadable(mp: pytest.MonkeyPatch, c: SimpleNamespace) -> None:
    """The dataset's pile files cannot be opened (permission denied)."""
    real = builtins.open

    def refuse(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, (str, os.PathLike)) and os.path.basename(os.fspath(file)).startswith("pile-"):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(file))
        return real(file, *args, **kwargs)

    mp.setattr(builtins, "open", refuse)


def rank_env(mp: pytest.MonkeyPatch, c: SimpleNamespace) -> None:
    mp.setenv("RANK", "first")


def needs_fsspec(mp: pytest.MonkeyPatch, c: SimpleNamespace) -> None:
    pytest.importorskip("fsspec", reason="remote URLs need the remote extra: pip install 'shardkit[remote]'")


def no_fsspec(mp: pytest.MonkeyPatch, c: SimpleNamespace) -> None:
    mp.setitem(sys.modules, "fsspec", None)


def _hide_backend(mp: pytest.MonkeyPatch, scheme: str, module: str) -> None:
    pytest.importorskip("fsspec", reason="remote URLs need the remote extra: pip install 'shardkit[remote]'")
    registry = importlib.import_module("fsspec.registry")
    mp.delitem(registry._registry, scheme, raising=False)
    mp.setitem(sys.modules, module, None)


def no_s3fs(mp: pytest.MonkeyPatch, c: SimpleNamespace) -> None:
    _hide_backend(mp, "s3", "s3fs")


def no_gcsfs(mp: pytest.MonkeyPatch, c: SimpleNamespace) -> None:
    _hide_backend(mp, "gs", "gcsfs")


class NoCredentialsError(Exception):
    """Named as botocore's: what an S3 client raises when it finds no credentials."""


class EndpointConnectionError(Exception):
    """Named as botocore's: what an S3 client raises when nothing answers at the endpoint."""


def failing_store(make_error: Callable[[], BaseException]) -> Setup:
    """``s3://`` and ``gs://`` served by a filesystem whose every call raises ``make_error()``."""

    def setup(mp: pytest.MonkeyPatch, c: SimpleNamespace) -> None:
        pytest.importorskip("fsspec", reason="remote URLs need the remote extra: pip install 'shardkit[remote]'")
        from fsspec.spec import AbstractFileSystem

        class FailingStore(AbstractFileSystem):
            protocol = ("s3", "gs")
            cachable = False

            def fail(self, *args: Any, **kwargs: Any) -> Any:
                raise make_error()

            exists = info = size = cat_file = ls = glob = _open = fail

        registry = importlib.import_module("fsspec.registry")
        mp.setitem(registry._registry, "s3", FailingStore)
        mp.setitem(registry._registry, "gs", FailingStore)

    return setup


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def real_s3(*, credentials: bool) -> Setup:
    """s3fs against 127.0.0.1 on a port nobody listens on, with or without (fake) credentials."""

    def setup(mp: pytest.MonkeyPatch, c: SimpleNamespace) -> None:
        s3fs = pytest.importorskip("s3fs", reason="the real S3 client rows need s3fs")
        s3fs.S3FileSystem.clear_instance_cache()
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
            mp.delenv(name, raising=False)
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no look for instance credentials off this machine
        mp.setenv("AWS_CONFIG_FILE", c.missing)
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", c.missing)
        mp.setenv("AWS_MAX_ATTEMPTS", "1")
        mp.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
        if credentials:
            mp.setenv("AWS_ACCESS_KEY_ID", "test-key-id")
            mp.setenv("AWS_SECRET_ACCESS_KEY", "test-secret")

    return setup


# --- helpers the rows call ----------------------------------------------------------------------


def write_one(c: SimpleNamespace, sample: Any, **options: Any) -> None:
    with shardkit.PileWriter(c.out, **{"piles": 2, **options}) as w:
        w.write(sample)


def samples(unit: Any) -> list[dict[str, Any]]:
    return [{"__key__": f"u{unit}-{i}", "txt": f"{unit}:{i}"} for i in range(3)]


def boom(unit: Any) -> Any:
    raise ValueError(f"boom on {unit}")


def run(c: SimpleNamespace, **options: Any) -> shardkit.Manifest:
    return shardkit.preprocess([1, 2, 3], samples, c.out, **{"piles": 2, "quiet": True, **options})


def bad_manifest(c: SimpleNamespace) -> Any:
    os.makedirs(c.out)
    with open(os.path.join(c.out, "shardkit.json"), "w") as f:
        f.write("{not json")
    return shardkit.info(c.out)


def load_state(c: SimpleNamespace, state: Any) -> None:
    shardkit.loader(c.data).load_state_dict(state)


def set_epoch(c: SimpleNamespace, epoch: Any) -> None:
    shardkit.loader(c.data).set_epoch(epoch)


# --- the table: Python API ---------------------------------------------------------------------


@dataclass(frozen=True)
class Api:
    call: Callable[[SimpleNamespace], Any]
    error: type[ShardkitError]
    fragment: str
    setup: Setup | None = None


L, P, S = shardkit.loader, shardkit.PileWriter, shardkit.shuffle

API: dict[str, Api] = {
    # loader: the source
    "loader-empty-list": Api(lambda c: L([]), ConfigError, "source: expected at least one path, URL or pattern, got an empty list"),
    "loader-int": Api(lambda c: L(5), ConfigError, "source: expected a path, URL or pattern, or a list of them, got 5"),
    "loader-none": Api(lambda c: L(None), ConfigError, "source: expected a path, URL or pattern, or a list of them, got None"),
    "loader-bytes": Api(lambda c: L(b"data/"), ConfigError, "source: expected a path, URL or pattern, or a list of them, got b'data/'"),
    "loader-mapping": Api(lambda c: L({"a": 1}), ConfigError, "blend: source 'a': expected a path or a mapping with 'path', got 1"),
    "loader-int-in-list": Api(lambda c: L([c.shard, 5]), ConfigError, "source[1]: expected a path or URL, got 5"),
    "loader-empty-string": Api(lambda c: L(""), ConfigError, "source: expected a path or URL, got ''"),
    "loader-missing-shard": Api(lambda c: L(c.missing + ".tar"), DatasetNotFoundError, "$missing.tar: no such file"),
    "loader-glob-matches-nothing": Api(lambda c: L(c.root + "/nothing-*.tar"), DatasetNotFoundError, "nothing-*.tar: pattern matches no file"),
    "loader-corrupt-gz": Api(lambda c: L([c.gz, c.bad_gz]), CorruptShardError, "$bad_gz: not valid gzip"),
    "loader-text-file": Api(lambda c: L(c.file), CorruptShardError, "$file"),
    # loader: options
    "loader-batch-size-0": Api(lambda c: L(c.data, batch_size=0), ConfigError, "batch_size: expected an integer >= 1 or None, got 0"),
    "loader-batch-size-str": Api(lambda c: L(c.data, batch_size="8"), ConfigError, "batch_size: expected an integer >= 1 or None, got '8'"),
    "loader-batch-size-float": Api(lambda c: L(c.data, batch_size=2.5), ConfigError, "batch_size: expected an integer >= 1 or None, got 2.5"),
    "loader-seed-negative": Api(lambda c: L(c.data, seed=-1), ConfigError, "seed: expected an integer >= 0, got -1"),
    "loader-seed-str": Api(lambda c: L(c.data, seed="0"), ConfigError, "seed: expected an integer >= 0, got '0'"),
    "loader-seed-float": Api(lambda c: L(c.data, seed=1.0), ConfigError, "seed: expected an integer >= 0, got 1.0"),
    "loader-seed-none": Api(lambda c: L(c.data, seed=None), ConfigError, "seed: expected an integer >= 0, got None"),
    "loader-mix-bool": Api(lambda c: L(c.data, mix=True), ConfigError, "mix: expected an integer >= 1, got True"),
    "loader-mix-0": Api(lambda c: L(c.data, mix=0), ConfigError, "mix: expected an integer >= 1, got 0"),
    "loader-mix-huge": Api(lambda c: L(c.data, mix=2**70), ConfigError, "mix: expected at most 1024"),
    "loader-mix-unshuffled": Api(lambda c: L(c.data, mix=2, shuffle=False), ConfigError, "mix: mixing 2 piles draws at random; it needs shuffle=True"),
    "loader-prefetch-str": Api(lambda c: L(c.data, prefetch="2"), ConfigError, "prefetch: expected an integer >= 0, got '2'"),
    "loader-prefetch-negative": Api(lambda c: L(c.data, prefetch=-1), ConfigError, "prefetch: expected an integer >= 0, got -1"),
    "loader-on-error-ignore": Api(lambda c: L(c.data, on_error="ignore"), ConfigError, "on_error: expected one of 'raise', 'skip', 'warn', got 'ignore'"),
    "loader-on-error-none": Api(lambda c: L(c.data, on_error=None), ConfigError, "on_error: expected one of 'raise', 'skip', 'warn', got None"),
    "loader-shuffle-str": Api(lambda c: L(c.data, shuffle="yes"), ConfigError, "shuffle: expected True or False, got 'yes'"),
    "loader-drop-last-int": Api(lambda c: L(c.data, drop_last=1), ConfigError, "drop_last: expected True or False, got 1"),
    "loader-verify-str": Api(lambda c: L(c.data, verify="false"), ConfigError, "verify: expected True or False, got 'false'"),
    "loader-allow-pickle-none": Api(lambda c: L(c.data, allow_pickle=None), ConfigError, "allow_pickle: expected True or False, got None"),
    "loader-decode-unknown": Api(lambda c: L(c.data, decode="jpeg"), ConfigError, "decode: expected True, False, 'numpy', 'pil' or a Codecs object, got 'jpeg'"),
    "loader-decode-int": Api(lambda c: L(c.data, decode=5), ConfigError, "decode: expected True, False, 'numpy', 'pil' or a Codecs object, got 5"),
    "loader-map-int": Api(lambda c: L(c.data, map=5), ConfigError, "map: expected a function or None, got 5"),
    "loader-collate-str": Api(lambda c: L(c.data, collate="stack"), ConfigError, "collate: expected a function or None, got 'stack'"),
    "loader-num-workers-negative": Api(lambda c: L(c.data, num_workers=-1), ConfigError, "num_workers: expected an integer >= 0, got -1"),
    "loader-num-workers-bool": Api(lambda c: L(c.data, num_workers=True), ConfigError, "num_workers: expected an integer >= 0, got True"),
    "loader-rank-negative": Api(lambda c: L(c.data, rank=-1), ConfigError, "rank: expected an integer >= 0 or None, got -1"),
    "loader-world-size-0": Api(lambda c: L(c.data, world_size=0), ConfigError, "world_size: expected an integer >= 1 or None, got 0"),
    "loader-rank-outside-world": Api(lambda c: L(c.data, rank=2, world_size=2), ConfigError, "rank: 2 is not below world_size=2"),
    "loader-rank-env": Api(lambda c: L(c.data), ConfigError, "RANK: the environment variable is 'first', expected an integer", rank_env),
    "loader-max-pile-bytes-words": Api(lambda c: L(c.data, max_pile_bytes="lots"), ConfigError, "max_pile_bytes: expected a size like 2GiB or 500MB, got 'lots'"),
    "loader-max-pile-bytes-0": Api(lambda c: L(c.data, max_pile_bytes=0), ConfigError, "max_pile_bytes: expected a positive size, got 0"),
    "loader-max-pile-bytes-bool": Api(lambda c: L(c.data, max_pile_bytes=True), ConfigError, "max_pile_bytes: expected a size like 2GiB, got True"),
    "loader-max-pile-bytes-inf": Api(lambda c: L(c.data, max_pile_bytes=float("inf")), ConfigError, "max_pile_bytes: expected at most 2**62 bytes (4 EiB), got inf"),
    "loader-max-pile-bytes-list": Api(lambda c: L(c.data, max_pile_bytes=[1]), ConfigError, "max_pile_bytes: expected a size like 2GiB, got list"),
    "loader-options-int": Api(lambda c: L(c.data, options=5), ConfigError, "options: expected a LoaderOptions, got int"),
    "loader-options-and-keywords": Api(
        lambda c: L(c.data, options=shardkit.LoaderOptions(), batch_size=4), ConfigError, "options: pass options= or keyword options, not both"
    ),
    "loader-options-worker": Api(lambda c: shardkit.LoaderOptions(worker=5), ConfigError, "worker: expected (index, count), two integers, got 5"),
    "loader-options-unknown-key": Api(lambda c: shardkit.LoaderOptions.from_dict({"batchsize": 4}), ConfigError, "batchsize: not a loader option"),
    "loader-options-not-mapping": Api(lambda c: shardkit.LoaderOptions.from_dict(5), ConfigError, "options: expected a mapping of loader options, got 5"),
    "loader-set-epoch-negative": Api(lambda c: set_epoch(c, -1), ConfigError, "epoch: expected an integer between 0 and 1099511627775, got -1"),
    "loader-set-epoch-str": Api(lambda c: set_epoch(c, "1"), ConfigError, "epoch: expected an integer between 0 and 1099511627775, got '1'"),
    "loader-state-int": Api(lambda c: load_state(c, 5), ConfigError, "load_state_dict: not a shardkit loader state"),
    # loader: what it reads
    "loader-pile-over-limit": Api(lambda c: list(L(c.data, max_pile_bytes=1000)), PileTooLargeError, "over the memory limit max_pile_bytes=1000"),
    "loader-pile-unreadable": Api(lambda c: list(L(c.data)), StorageError, ".tar: cannot read: permission denied", piles_unreadable),
    "loader-dataset-under-a-file": Api(lambda c: list(L(c.file + "/x.tar")), DatasetNotFoundError, "$file/x.tar: no such file"),
    # PileWriter and PileOptions
    "writer-out-empty": Api(lambda c: P("", piles=2), ConfigError, "out: expected a path or URL, got ''"),
    "writer-out-int": Api(lambda c: P(5, piles=2), ConfigError, "out: expected a path or URL, got 5"),
    "writer-out-none": Api(lambda c: P(None, piles=2), ConfigError, "out: expected a path or URL, got None"),
    "writer-piles-missing": Api(lambda c: P(c.out), ConfigError, "piles: missing (required)"),
    "writer-piles-0": Api(lambda c: P(c.out, piles=0), ConfigError, "piles: expected an integer >= 1, got 0"),
    "writer-piles-str": Api(lambda c: P(c.out, piles="4"), ConfigError, "piles: expected an integer >= 1, got '4'"),
    "writer-piles-float": Api(lambda c: P(c.out, piles=2.0), ConfigError, "piles: expected an integer >= 1, got 2.0"),
    "writer-piles-huge": Api(lambda c: P(c.out, piles=10**7), ConfigError, "piles: expected at most 1000000 (each is a file), got 10000000"),
    "writer-seed-negative": Api(lambda c: P(c.out, piles=2, seed=-1), ConfigError, "seed: expected an integer >= 0, got -1"),
    "writer-max-pile-bytes-words": Api(lambda c: P(c.out, piles=2, max_pile_bytes="lots"), ConfigError, "max_pile_bytes: expected a size like 2GiB"),
    "writer-max-pile-bytes-tiny": Api(lambda c: P(c.out, piles=2, max_pile_bytes=100), ConfigError, "max_pile_bytes: expected at least 1536 bytes"),
    "writer-buffer-size-words": Api(lambda c: P(c.out, piles=2, buffer_size="x"), ConfigError, "buffer_size: expected a size like 2GiB or 500MB, got 'x'"),
    "writer-buffer-size-0": Api(lambda c: P(c.out, piles=2, buffer_size=0), ConfigError, "buffer_size: expected a positive size, got 0"),
    "writer-overwrite-str": Api(lambda c: P(c.out, piles=2, overwrite="false"), ConfigError, "overwrite: expected True or False, got 'false'"),
    "writer-overwrite-int": Api(lambda c: P(c.out, piles=2, overwrite=1), ConfigError, "overwrite: expected True or False, got 1"),
    "writer-codecs-int": Api(lambda c: P(c.out, piles=2, codecs=5), ConfigError, "codecs: expected a shardkit.Codecs registry or None, got 5"),
    "writer-options-int": Api(lambda c: P(c.out, options=5), ConfigError, "options: expected a PileOptions, got int"),
    "writer-options-workers": Api(
        lambda c: P(c.out, options=shardkit.PileOptions(piles=2, workers=2)), ConfigError, "workers: PileWriter writes samples in the calling process"
    ),
    "options-on-error-ignore": Api(lambda c: shardkit.PileOptions(piles=2, on_error="ignore"), ConfigError, "on_error: expected one of 'raise', 'skip', got 'ignore'"),
    "options-key-prefix-unknown": Api(lambda c: shardkit.PileOptions(piles=2, key_prefix="shard"), ConfigError, "key_prefix: expected one of 'auto', 'none', 'unit'"),
    "options-workers-0": Api(lambda c: shardkit.PileOptions(piles=2, workers=0), ConfigError, "workers: expected an integer >= 1, got 0"),
    "writer-write-int": Api(lambda c: write_one(c, 5), SampleError, "PileWriter.write: expected a sample dict with '__key__', got 5"),
    "writer-write-no-key": Api(lambda c: write_one(c, {"txt": "x"}), SampleError, "sample has no '__key__'"),
    "writer-write-int-key": Api(lambda c: write_one(c, {"__key__": 5, "txt": "x"}), SampleError, "sample key must be a non-empty str, got 5"),
    "writer-write-no-encoder": Api(lambda c: write_one(c, {"__key__": "a", "txt": object()}), SampleError, "sample 'a': field 'txt': no encoder"),
    "writer-out-is-a-file": Api(lambda c: P(c.file, piles=2), ConfigError, "$file: output exists and is not a directory"),
    "writer-out-under-a-file": Api(lambda c: P(c.file + "/sub", piles=2), StorageError, "$file/sub: cannot create the directory: $file is a file, not a directory"),
    "writer-out-holds-a-dataset": Api(lambda c: P(c.data, piles=2), DatasetExistsError, "$data: already holds a shardkit dataset"),
    "writer-disk-full": Api(
        lambda c: write_one(c, {"__key__": "a", "txt": "x"}), StorageError, ".part: cannot write: no space left on the device (needed 1.0 KiB, ", disk_full
    ),
    "writer-read-only": Api(lambda c: P(c.out, piles=2), StorageError, "cannot create: the file system is read-only; write elsewhere", read_only),
    # preprocess
    "preprocess-inputs-none": Api(lambda c: shardkit.preprocess(None, samples, c.out, piles=2), ConfigError, "inputs: expected a sequence of input units, got None"),
    "preprocess-inputs-int": Api(lambda c: shardkit.preprocess(5, samples, c.out, piles=2), ConfigError, "inputs: expected a sequence of input units, got 5"),
    "preprocess-inputs-str": Api(lambda c: shardkit.preprocess("a.jsonl", samples, c.out, piles=2), ConfigError, "got a single str (wrap it in a list)"),
    "preprocess-inputs-empty": Api(lambda c: shardkit.preprocess([], samples, c.out, piles=2), ConfigError, "inputs: no input units given"),
    "preprocess-fn-int": Api(lambda c: shardkit.preprocess([1], 5, c.out, piles=2), ConfigError, "fn: expected a function fn(unit) that yields sample dicts, got 5"),
    "preprocess-fn-none": Api(lambda c: shardkit.preprocess([1], None, c.out, piles=2), ConfigError, "fn: expected a function fn(unit) that yields sample dicts, got None"),
    "preprocess-extra-int": Api(lambda c: run(c, extra=5), ConfigError, "extra: expected a mapping of JSON-serializable metadata or None, got 5"),
    "preprocess-extra-reserved": Api(lambda c: run(c, extra={"units": 1}), ConfigError, "extra: keys ['units'] are written by preprocess itself"),
    "preprocess-extra-not-json": Api(lambda c: run(c, extra={"x": object()}), ConfigError, "extra: must be JSON-serializable"),
    "preprocess-mp-context": Api(lambda c: run(c, mp_context="threads"), ConfigError, "mp_context: expected one of 'fork', 'spawn', 'forkserver' or None, got 'threads'"),
    "preprocess-quiet-str": Api(lambda c: run(c, quiet="no"), ConfigError, "quiet: expected True or False, got 'no'"),
    "preprocess-codecs-str": Api(lambda c: run(c, codecs="default"), ConfigError, "codecs: expected a shardkit.Codecs registry or None, got 'default'"),
    "preprocess-key-prefix": Api(lambda c: run(c, piles=None, options=shardkit.PileOptions(piles=2, key_prefix="unit")), ConfigError, "key_prefix: preprocess takes sample keys from its function"),
    "preprocess-workers-str": Api(lambda c: run(c, workers="2"), ConfigError, "workers: expected an integer >= 1, got '2'"),
    "preprocess-out-none": Api(lambda c: shardkit.preprocess([1], samples, None, piles=2), ConfigError, "out: expected a path or URL, got None"),
    "preprocess-fn-returns-int": Api(
        lambda c: shardkit.preprocess([1], lambda u: 5, c.out, piles=2, quiet=True),
        InputError,
        "input unit 0 (1): fn raised TypeError: fn must return or yield an iterable of sample dicts, it returned int",
    ),
    "preprocess-fn-raises": Api(lambda c: shardkit.preprocess([7], boom, c.out, piles=2, quiet=True), InputError, "input unit 0 (7): fn raised ValueError: boom on 7"),
    "preprocess-disk-full": Api(lambda c: run(c), StorageError, ".part: cannot write: no space left on the device (needed ", disk_full),
    "preprocess-disk-full-lock": Api(lambda c: run(c), StorageError, "$out/.shardkit-lock: cannot create: no space left on the device", disk_full_everywhere),
    "preprocess-read-only": Api(lambda c: run(c), StorageError, "$out/.shardkit-lock: cannot create: the file system is read-only", read_only),
    # pile
    "pile-inputs-empty": Api(lambda c: shardkit.pile([], c.out, piles=2), ConfigError, "inputs: expected at least one path, URL or pattern, got an empty list"),
    "pile-inputs-int": Api(lambda c: shardkit.pile(5, c.out, piles=2), ConfigError, "inputs: expected a path, URL or pattern, or a list of them, got 5"),
    "pile-inputs-none": Api(lambda c: shardkit.pile(None, c.out, piles=2), ConfigError, "inputs: expected a path, URL or pattern, or a list of them, got None"),
    "pile-inputs-none-in-list": Api(lambda c: shardkit.pile([c.shard, None], c.out, piles=2), ConfigError, "inputs[1]: expected a path or URL, got None"),
    "pile-missing-input": Api(lambda c: shardkit.pile([c.missing + ".tar"], c.out, piles=2), DatasetNotFoundError, "$missing.tar: no such file"),
    "pile-glob-matches-nothing": Api(lambda c: shardkit.pile(c.root + "/none-*.tar", c.out, piles=2), DatasetNotFoundError, "none-*.tar: pattern matches no file"),
    "pile-input-named-twice": Api(
        lambda c: shardkit.pile([c.shard, c.root + "/*.tar"], c.out, piles=2), ConfigError, "$shard is named twice (by '$shard' and by '$root/*.tar')"
    ),
    "shuffle-input-named-twice": Api(lambda c: S([c.shard, c.shard], c.out), ConfigError, "$shard is named twice (by '$shard' and by '$shard')"),
    "loader-shard-named-twice": Api(
        lambda c: shardkit.loader([c.root + "/*.tar", c.shard], seed=0), ConfigError, "$shard is named twice (by '$root/*.tar' and by '$shard')"
    ),
    "pile-corrupt-gz": Api(
        lambda c: shardkit.pile([c.shard, c.bad_gz], c.out, piles=2, quiet=True), CorruptShardError, "input unit 1 ('$bad_gz'): $bad_gz: not valid gzip"
    ),
    "pile-key-prefix-unknown": Api(lambda c: shardkit.pile([c.shard], c.out, piles=2, key_prefix="shard"), ConfigError, "key_prefix: expected one of"),
    "pile-quiet-int": Api(lambda c: shardkit.pile([c.shard], c.out, piles=2, quiet=1), ConfigError, "quiet: expected True or False, got 1"),
    "pile-out-holds-a-dataset": Api(lambda c: shardkit.pile([c.shard], c.data, piles=2), DatasetExistsError, "$data: already holds a shardkit dataset"),
    "pile-disk-full": Api(lambda c: shardkit.pile([c.shard], c.out, piles=2, quiet=True), StorageError, "no space left on the device (needed ", disk_full),
    # shuffle
    "shuffle-inputs-empty": Api(lambda c: S([], c.out), ConfigError, "inputs: expected at least one path, URL or pattern, got an empty list"),
    "shuffle-inputs-int": Api(lambda c: S(5, c.out), ConfigError, "inputs: expected a path, URL or pattern, or a list of them, got 5"),
    "shuffle-missing-input": Api(lambda c: S(c.missing + ".tar", c.out), DatasetNotFoundError, "$missing.tar: no such file"),
    "shuffle-piles-0": Api(lambda c: S(c.shard, c.out, piles=0), ConfigError, "piles: expected an integer >= 1 or None, got 0"),
    "shuffle-piles-huge": Api(lambda c: S(c.shard, c.out, piles=2**40), ConfigError, "piles: expected at most 1000000 (each is a file)"),
    "shuffle-memory-words": Api(lambda c: S(c.shard, c.out, memory="lots"), ConfigError, "memory: expected a size like 2GiB or 500MB, got 'lots'"),
    "shuffle-maxcount-0": Api(lambda c: S(c.shard, c.out, maxcount=0), ConfigError, "maxcount: expected an integer >= 1 or None, got 0"),
    "shuffle-maxsize-tiny": Api(lambda c: S(c.shard, c.out, maxsize=10), ConfigError, "maxsize: expected at least 1536 bytes"),
    "shuffle-maxsize-huge": Api(lambda c: S(c.shard, c.out, maxsize=2**70), ConfigError, "maxsize: expected at most 2**62 bytes (4 EiB)"),
    "shuffle-seed-str": Api(lambda c: S(c.shard, c.out, seed="1"), ConfigError, "seed: expected an integer >= 0, got '1'"),
    "shuffle-workers-0": Api(lambda c: S(c.shard, c.out, workers=0), ConfigError, "workers: expected an integer >= 1, got 0"),
    "shuffle-overwrite-str": Api(lambda c: S(c.shard, c.out, overwrite="false"), ConfigError, "overwrite: expected True or False, got 'false'"),
    "shuffle-key-prefix-unknown": Api(lambda c: S(c.shard, c.out, key_prefix="bad"), ConfigError, "key_prefix: expected one of 'auto', 'none', 'unit', got 'bad'"),
    "shuffle-quiet-str": Api(lambda c: S(c.shard, c.out, quiet="no"), ConfigError, "quiet: expected True or False, got 'no'"),
    "shuffle-options-int": Api(lambda c: S(c.shard, c.out, options=5), ConfigError, "options: expected a ShuffleOptions, got int"),
    "shuffle-corrupt-gz": Api(lambda c: S([c.shard, c.bad_gz], c.out, quiet=True), CorruptShardError, "$bad_gz: not valid gzip"),
    "shuffle-disk-full": Api(lambda c: S(c.shard, c.out, quiet=True), StorageError, "cannot write: no space left on the device (needed ", disk_full),
    # repile
    "repile-missing-source": Api(lambda c: shardkit.repile(c.missing, c.out), DatasetNotFoundError, "$missing: no such directory (expected a shardkit dataset)"),
    "repile-source-int": Api(lambda c: shardkit.repile(5, c.out), ConfigError, "src: expected a path or URL, got 5"),
    "repile-destination-none": Api(lambda c: shardkit.repile(c.data, None), ConfigError, "dst: expected a path or URL, got None"),
    "repile-onto-itself": Api(lambda c: shardkit.repile(c.data, c.data), ConfigError, "repile writes a new dataset and cannot replace its source in place"),
    "repile-same-seed": Api(lambda c: shardkit.repile(c.data, c.out, seed=5), ConfigError, "seed: $data was written with seed 5"),
    "repile-piles-0": Api(lambda c: shardkit.repile(c.data, c.out, piles=0), ConfigError, "piles: expected an integer >= 1, got 0"),
    "repile-quiet-str": Api(lambda c: shardkit.repile(c.data, c.out, quiet="x"), ConfigError, "quiet: expected True or False, got 'x'"),
    # info, verify
    "info-int": Api(lambda c: shardkit.info(5), ConfigError, "directory: expected a path or URL, got 5"),
    "info-none": Api(lambda c: shardkit.info(None), ConfigError, "directory: expected a path or URL, got None"),
    "info-empty": Api(lambda c: shardkit.info(""), ConfigError, "directory: expected a path or URL, got ''"),
    "info-missing": Api(lambda c: shardkit.info(c.missing), DatasetNotFoundError, "$missing: no such directory (expected a shardkit dataset)"),
    "info-a-file": Api(lambda c: shardkit.info(c.file), StorageError, "$file: is a file, expected a shardkit dataset directory"),
    "info-under-a-file": Api(lambda c: shardkit.info(c.file + "/sub"), StorageError, "$file/sub/shardkit.json: cannot read: $file is a file, not a directory"),
    "info-bad-manifest": Api(bad_manifest, ManifestError, "$out/shardkit.json: not valid JSON"),
    "verify-a-file": Api(lambda c: shardkit.verify(c.file), StorageError, "$file: is a file, expected a shardkit dataset directory"),
    "verify-missing": Api(lambda c: shardkit.verify(c.missing), DatasetNotFoundError, "$missing: no such directory (expected a shardkit dataset)"),
    "verify-quiet-str": Api(lambda c: shardkit.verify(c.data, quiet="x"), ConfigError, "quiet: expected True or False, got 'x'"),
    # jobs from Python
    "load-job-int": Api(lambda c: shardkit.load_job(5), ConfigError, "path: expected a path or URL, got 5"),
    "load-job-missing": Api(lambda c: shardkit.load_job(c.missing + ".yaml"), DatasetNotFoundError, "$missing.yaml: no such job file"),
    "load-job-a-directory": Api(lambda c: shardkit.load_job(c.root), ConfigError, "$root: cannot read the job file"),
    "run-job-int": Api(lambda c: shardkit.run_job(5), ConfigError, "job: expected a job from load_job() or parse_job(), got 5"),
    "pile-kwargs-int": Api(lambda c: shardkit.pile_kwargs(5), ConfigError, "args: expected the argparse.Namespace parse_args() returned, got 5"),
    # remote storage
    "remote-no-fsspec": Api(lambda c: L("s3://bucket/data"), ConfigError, "s3:// URLs need fsspec: pip install 'shardkit[remote]'", no_fsspec),
    "remote-no-s3fs": Api(lambda c: L("s3://bucket/data"), ConfigError, "s3://bucket/data/shardkit.json: s3:// URLs need s3fs: pip install s3fs", no_s3fs),
    "remote-no-gcsfs": Api(lambda c: shardkit.info("gs://bucket/data"), ConfigError, "gs:// URLs need gcsfs: pip install gcsfs", no_gcsfs),
    "remote-unknown-scheme": Api(lambda c: L("nosuchfs://bucket/x.tar"), ConfigError, "no filesystem is known for nosuchfs:// URLs", needs_fsspec),
    "remote-no-credentials": Api(
        lambda c: shardkit.info("s3://bucket/data"),
        StorageError,
        "s3://bucket/data/shardkit.json: cannot read: no credentials found for s3:// (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        failing_store(lambda: NoCredentialsError("Unable to locate credentials")),
    ),
    "remote-unreachable": Api(
        lambda c: shardkit.info("s3://bucket/data"),
        StorageError,
        'cannot reach the storage endpoint (Could not connect to the endpoint URL: "http://127.0.0.1:9/bucket/data/shardkit.json"); '
        "check the network and AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (or the endpoint_url storage option)",
        failing_store(lambda: EndpointConnectionError('Could not connect to the endpoint URL: "http://127.0.0.1:9/bucket/data/shardkit.json"')),
    ),
    "remote-access-denied": Api(
        lambda c: shardkit.verify("s3://bucket/data"),
        StorageError,
        "s3://bucket/data/shardkit.json: cannot read: access denied (Access Denied); check the credentials",
        failing_store(lambda: PermissionError("Access Denied")),
    ),
    "remote-bad-token": Api(
        lambda c: shardkit.info("s3://bucket/data"),
        StorageError,
        "s3://bucket/data/shardkit.json: cannot read: access denied ([Errno 22] The provided token is malformed or otherwise "
        "invalid.); check the credentials",
        failing_store(lambda: OSError(errno.EINVAL, "The provided token is malformed or otherwise invalid.")),
    ),
    "remote-not-found": Api(
        lambda c: shardkit.info("s3://bucket/data"),
        DatasetNotFoundError,
        "s3://bucket/data: not a shardkit dataset",
        failing_store(lambda: FileNotFoundError("bucket/data/shardkit.json")),
    ),
    "remote-loader-unreachable": Api(
        lambda c: L("s3://bucket/shards-{000..003}.tar"),
        StorageError,
        "s3://bucket/shards-000.tar: cannot read its size: cannot reach the storage endpoint",
        failing_store(lambda: EndpointConnectionError("Could not connect to the endpoint URL")),
    ),
    "remote-gs-no-credentials": Api(
        lambda c: shardkit.info("gs://bucket/data"),
        StorageError,
        "no credentials found for gs:// (set GOOGLE_APPLICATION_CREDENTIALS",
        failing_store(lambda: type("DefaultCredentialsError", (Exception,), {})("no default credentials")),
    ),
    "s3fs-no-credentials": Api(
        lambda c: shardkit.info("s3://bucket/data"), StorageError, "no credentials found for s3://", real_s3(credentials=False)
    ),
    "s3fs-endpoint-closed": Api(
        lambda c: shardkit.info("s3://bucket/data"),
        StorageError,
        "cannot reach the storage endpoint (Could not connect to the endpoint URL: ",
        real_s3(credentials=True),
    ),
}  # fmt: skip


@pytest.mark.parametrize("row", list(API.values()), ids=list(API))
def test_api(row: Api, c: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    if row.setup is not None:
        row.setup(monkeypatch, c)
    with pytest.raises(ShardkitError) as info:
        row.call(c)
    error = info.value
    assert type(error) is row.error, f"{type(error).__name__}: {error}"
    assert _fill(row.fragment, c) in str(error)
    assert "\n" not in str(error)


# --- the table: the command line ---------------------------------------------------------------


@dataclass(frozen=True)
class Cli:
    argv: tuple[str, ...]
    code: int
    fragment: str
    setup: Setup | None = None


def cli(*argv: str, code: int = 1, fragment: str, setup: Setup | None = None) -> Cli:
    return Cli(argv, code, fragment, setup)


PILE = ("pile", "$shard", "-o", "$out", "-q")
CLI: dict[str, Cli] = {
    "verify-a-file": cli("verify", "$file", fragment="error: $file: is a file, expected a shardkit dataset directory"),
    "verify-missing": cli("verify", "$missing", fragment="error: $missing: no such directory (expected a shardkit dataset)"),
    "verify-unreadable-piles": cli("verify", "$data", "-q", fragment="error: 2 problem(s) found in $data", setup=piles_unreadable),
    "info-a-file": cli("info", "$file", fragment="error: $file: is a file, expected a shardkit dataset directory"),
    "info-missing": cli("info", "$missing", fragment="error: $missing: no such directory (expected a shardkit dataset)"),
    "info-under-a-file": cli("info", "$file/x", fragment="$file is a file, not a directory"),
    "info-no-directory": cli("info", code=2, fragment="the following arguments are required: DIR"),
    "pile-missing-input": cli("pile", "$missing.tar", "-o", "$out", "--piles", "2", fragment="error: $missing.tar: no such file"),
    "pile-piles-0": cli(*PILE, "--piles", "0", fragment="error: piles: expected an integer >= 1, got 0"),
    "pile-piles-words": cli(*PILE, "--piles", "x", code=2, fragment="argument --piles: invalid int value: 'x'"),
    "pile-piles-missing": cli(*PILE, code=2, fragment="the following arguments are required: --piles"),
    "pile-piles-huge": cli(*PILE, "--piles", "10000000", fragment="error: piles: expected at most 1000000"),
    "pile-max-pile-bytes": cli(*PILE, "--piles", "2", "--max-pile-bytes", "lots", fragment="error: max_pile_bytes: expected a size like 2GiB"),
    "pile-buffer-size": cli(*PILE, "--piles", "2", "--buffer-size", "0", fragment="error: buffer_size: expected a positive size, got '0'"),
    "pile-on-error": cli(*PILE, "--piles", "2", "--on-error", "ignore", code=2, fragment="argument --on-error: invalid choice: 'ignore'"),
    "pile-out-is-a-file": cli("pile", "$shard", "-o", "$file", "--piles", "2", fragment="error: $file: output exists and is not a directory"),
    "pile-out-holds-a-dataset": cli("pile", "$shard", "-o", "$data", "--piles", "2", fragment="error: $data: already holds a shardkit dataset"),
    "pile-corrupt-gz": cli("pile", "$bad_gz", "-o", "$out", "--piles", "2", "-q", fragment="$bad_gz: not valid gzip"),
    "pile-disk-full": cli(*PILE, "--piles", "2", fragment="cannot write: no space left on the device (needed ", setup=disk_full),
    "pile-read-only": cli(*PILE, "--piles", "2", fragment="cannot create: the file system is read-only", setup=read_only),
    "shuffle-maxsize": cli("shuffle", "$shard", "-o", "$out", "--maxsize", "10", fragment="error: maxsize: expected at least 1536 bytes"),
    "shuffle-memory": cli("shuffle", "$shard", "-o", "$out", "--memory", "lots", fragment="error: memory: expected a size like 2GiB"),
    "shuffle-maxcount": cli("shuffle", "$shard", "-o", "$out", "--maxcount", "0", fragment="error: maxcount: expected an integer >= 1 or None, got 0"),
    "shuffle-missing-input": cli("shuffle", "$missing.tar", "-o", "$out", fragment="error: $missing.tar: no such file"),
    "repile-missing": cli("repile", "$missing", "-o", "$out", fragment="error: $missing: no such directory (expected a shardkit dataset)"),
    "repile-onto-itself": cli("repile", "$data", "-o", "$data", fragment="cannot replace its source in place"),
    "quality-missing": cli("quality", "$missing", fragment="error: $missing: no such directory (expected a shardkit dataset)"),
    "quality-batch-size": cli("quality", "$data", "--batch-size", "0", fragment="error: batch_size: expected an integer >= 1, got 0"),
    "run-missing": cli("run", "$missing.yaml", fragment="error: $missing.yaml: no such job file"),
    "run-a-directory": cli("run", "$root", fragment="error: $root: cannot read the job file"),
    "remote-no-s3fs": cli("info", "s3://bucket/data", fragment="s3:// URLs need s3fs: pip install s3fs", setup=no_s3fs),
    "remote-unknown-scheme": cli("verify", "nosuchfs://bucket/data", fragment="no filesystem is known for nosuchfs:// URLs", setup=needs_fsspec),
    "remote-no-credentials": cli(
        "info", "s3://bucket/data", fragment="no credentials found for s3://", setup=failing_store(lambda: NoCredentialsError("Unable to locate credentials"))
    ),
    "unknown-command": cli("shuffel", code=2, fragment="invalid choice: 'shuffel'"),
}  # fmt: skip


def _run_cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's usage errors
        return int(e.code or 0)


def _one_error_line(err: str, fragment: str) -> None:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    assert fragment in lines[0], err


@pytest.mark.parametrize("row", list(CLI.values()), ids=list(CLI))
def test_cli(row: Cli, c: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    if row.setup is not None:
        row.setup(monkeypatch, c)
    code = _run_cli([_fill(arg, c) for arg in row.argv])
    assert code == row.code
    _one_error_line(capsys.readouterr().err, _fill(row.fragment, c))


# --- the table: YAML jobs ----------------------------------------------------------------------


@dataclass(frozen=True)
class Yaml:
    text: str
    fragment: str
    error: type[ShardkitError] = ConfigError
    runs: bool = False  # the file is valid; running it fails


PILE_JOB = "job: pile\ninputs: $shard\n"
PRE_JOB = "job: preprocess\ninputs: [$shard]\n"
OUT = "output: {path: out, piles: 2}\n"
YAML: dict[str, Yaml] = {
    "input-named-twice": Yaml("job: pile\ninputs: [$shard, $shard]\n" + OUT, "line 2: inputs[1]: $shard is named twice"),
    "not-yaml": Yaml("job: [unclosed\n", "line 2, column 1: not valid YAML"),
    "python-tag": Yaml("job: !!python/object/apply:os.system ['true']\n", "YAML tags that build Python objects are not allowed"),
    "a-list": Yaml("- job: pile\n", "expected a mapping of options, got a list"),
    "empty": Yaml("", "expected a mapping of options, got nothing"),
    "job-unknown": Yaml("job: sort\n", "job: expected one of preprocess, pile, shuffle, demo, got 'sort'"),
    "job-missing": Yaml("inputs: $shard\n" + OUT, "job: missing (required)"),
    "field-unknown": Yaml(PILE_JOB + OUT + "threads: 4\n", "threads: unknown field"),
    "inputs-missing": Yaml("job: pile\n" + OUT, "inputs: missing (required)"),
    "inputs-int": Yaml("job: pile\ninputs: 5\n" + OUT, "inputs: expected a path or a non-empty list of paths, got 5"),
    "inputs-empty": Yaml("job: pile\ninputs: []\n" + OUT, "inputs: expected a path or a non-empty list of paths, got a list"),
    "inputs-int-in-list": Yaml("job: pile\ninputs: [5]\n" + OUT, "inputs[0]: expected a path, got 5"),
    "inputs-missing-file": Yaml("job: pile\ninputs: $missing.tar\n" + OUT, "inputs[0]: $missing.tar: no such file"),
    "output-missing": Yaml(PILE_JOB, "output: missing (required)"),
    "output-int": Yaml(PILE_JOB + "output: 5\n", "output: expected a mapping of options, got 5"),
    "output-path-missing": Yaml(PILE_JOB + "output: {piles: 2}\n", "output.path: missing (required)"),
    "output-piles-0": Yaml(PILE_JOB + "output: {path: out, piles: 0}\n", "output.piles: expected an integer >= 1, got 0"),
    "output-piles-words": Yaml(PILE_JOB + "output: {path: out, piles: sixty}\n", "output.piles: expected an integer >= 1, got 'sixty'"),
    "output-piles-huge": Yaml(PILE_JOB + "output: {path: out, piles: 10000000}\n", "output.piles: expected at most 1000000"),
    "output-overwrite-str": Yaml(PILE_JOB + "output: {path: out, piles: 2, overwrite: 'false'}\n", "output.overwrite: expected true or false, got 'false'"),
    "output-max-pile-bytes": Yaml(PILE_JOB + "output: {path: out, piles: 2, max_pile_bytes: lots}\n", "output.max_pile_bytes: expected a size like 2GiB"),
    "output-seed-negative": Yaml(PILE_JOB + "output: {path: out, piles: 2, seed: -1}\n", "output.seed: expected an integer >= 0, got -1"),
    "output-field-unknown": Yaml(PILE_JOB + "output: {path: out, piles: 2, shards: 3}\n", "output.shards: unknown field"),
    "workers-0": Yaml(PILE_JOB + OUT + "workers: 0\n", "workers: expected an integer >= 1, got 0"),
    "on-error-ignore": Yaml(PILE_JOB + OUT + "on_error: ignore\n", "on_error: expected one of raise, skip, got 'ignore'"),
    "transform-unknown": Yaml(PRE_JOB + OUT + "transform: resize\n", "transform: expected one of images, jsonl, shards, got 'resize'"),
    "fn-not-importable": Yaml(PRE_JOB + OUT + "fn: no_such_module_xyz:make\n", "fn: cannot import module 'no_such_module_xyz'"),
    "fn-not-a-spec": Yaml(PRE_JOB + OUT + "fn: make samples\n", "fn: expected 'module:function'"),
    "fn-and-transform": Yaml(PRE_JOB + OUT + "fn: os:getcwd\ntransform: shards\n", "fn: give either fn (your own function) or transform (a built-in), not both"),
    "args-int": Yaml(PRE_JOB + OUT + "transform: shards\nargs: 5\n", "args: expected a mapping of names to values, got 5"),
    "args-unknown": Yaml(PRE_JOB + OUT + "transform: shards\nargs: {size: 3}\n", "args.size: unknown argument for transform 'shards'"),
    "shuffle-maxsize": Yaml("job: shuffle\ninputs: $shard\noutput: {path: out, maxsize: 10}\n", "output.maxsize: expected at least 1536 bytes"),
    "shuffle-memory": Yaml("job: shuffle\ninputs: $shard\noutput: {path: out, memory: lots}\n", "output.memory: expected a size like 2GiB"),
    "demo-samples-0": Yaml("job: demo\nsamples: 0\n", "samples: expected an integer >= 1, got 0"),
    "run-output-under-a-file": Yaml(
        PILE_JOB + "output: {path: $file/out, piles: 2}\n", "$file/out: cannot create the directory: $file is a file, not a directory", StorageError, True
    ),
    "run-output-holds-a-dataset": Yaml(PILE_JOB + "output: {path: $data, piles: 2}\n", "$data: already holds a shardkit dataset", DatasetExistsError, True),
    "run-corrupt-input": Yaml("job: pile\ninputs: $bad_gz\n" + OUT, "$bad_gz: not valid gzip", CorruptShardError, True),
}  # fmt: skip


@pytest.mark.parametrize("row", list(YAML.values()), ids=list(YAML))
def test_yaml(row: Yaml, c: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    path = os.path.join(c.tmp, "job.yaml")
    with open(path, "w") as f:
        f.write(_fill(row.text, c))
    fragment = _fill(row.fragment, c)
    with pytest.raises(ShardkitError) as info:
        shardkit.run_job(shardkit.load_job(path), quiet=True) if row.runs else shardkit.load_job(path)
    assert type(info.value) is row.error, f"{type(info.value).__name__}: {info.value}"
    assert fragment in str(info.value) and "\n" not in str(info.value)
    if not row.runs:
        assert str(info.value).startswith(f"{path}: "), "a job file's error names the file first"
    capsys.readouterr()
    assert _run_cli(["run", "-q", path]) == 1
    _one_error_line(capsys.readouterr().err, fragment)


def test_the_table_is_large_and_covers_the_three_front_doors():
    assert len(API) >= 100
    assert len(API) + len(CLI) + len(YAML) >= 150
    assert min(len(CLI), len(YAML)) >= 25


# --- the behaviour around the table ------------------------------------------------------------


@pytest.mark.parametrize("on_error", ["skip", "warn"])
def test_a_corrupt_gzip_shard_is_skipped_and_counted_by_the_loader(place, on_error):
    loader = shardkit.loader([place.gz, place.bad_gz, place.shard], on_error=on_error, decode=False)
    keys = sorted(s["__key__"] for s in loader)
    assert len(keys) == 12  # both good shards, whole
    assert loader.stats.skipped_piles == 1
    assert loader.stats.errors == [
        f"{place.bad_gz}: not valid gzip: corrupt or truncated (Error -3 while decompressing data: invalid block type)"
    ]


def test_a_corrupt_gzip_shard_is_skipped_and_counted_by_pile(place, tmp_path):
    m = shardkit.pile([place.shard, place.bad_gz, place.gz], tmp_path / "out", piles=2, on_error="skip", quiet=True)
    assert m.samples == 12 and m.skipped_units == 1
    (skipped,) = m.extra["skipped"]
    assert skipped["unit"] == 1 and skipped["error"].startswith(f"CorruptShardError: {place.bad_gz}: not valid gzip")


def test_an_unreadable_pile_is_skipped_and_counted(place, monkeypatch):
    piles_unreadable(monkeypatch, SimpleNamespace())
    loader = shardkit.loader(place.data, on_error="skip", decode=False)
    assert list(loader) == []
    assert loader.stats.skipped_piles == 2 and loader.stats.skipped_samples == 8
    assert all("cannot read: permission denied" in message for message in loader.stats.errors)


def test_disk_full_says_how_much_was_needed_and_how_much_is_free(place, tmp_path, monkeypatch):
    disk_full(monkeypatch, SimpleNamespace())
    with pytest.raises(StorageError) as info:
        shardkit.preprocess([1, 2], samples, tmp_path / "out", piles=1, quiet=True)
    error = info.value
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC
    assert error.url.endswith("000000.part")
    assert "needed 6.0 KiB, " in str(error) and " free on the device of " in str(error)
    assert not (tmp_path / "out").exists()  # the staging directory went with the failed job, and the folder it made


def test_storage_errors_keep_their_url_and_errno_across_processes():
    error = StorageError("out/pile-000001.tar: cannot write: no space left on the device", url="out/pile-000001.tar", errno=errno.ENOSPC)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.url, copy.errno) == (StorageError, str(error), error.url, error.errno)
    assert isinstance(copy, OSError) and isinstance(copy, ShardkitError)


def test_a_failing_store_never_puts_a_secret_in_the_message(place, monkeypatch):
    leak = 'Could not connect to "https://AKIDEXAMPLE:wJalrXUtnFEMI@host:9000/b/k?X-Amz-Credential=AKID&X-Amz-Signature=abc123"'
    failing_store(lambda: EndpointConnectionError(leak))(monkeypatch, SimpleNamespace())
    with pytest.raises(StorageError) as info:
        shardkit.info("s3://b/k")
    message = str(info.value)
    assert "https://host:9000/b/k" in message
    for secret in ("wJalrXUtnFEMI", "AKIDEXAMPLE", "abc123"):
        assert secret not in message


def test_verify_lists_an_unreadable_pile_with_why(place, monkeypatch, capsys):
    piles_unreadable(monkeypatch, SimpleNamespace())
    assert main(["verify", "-q", place.data]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{place.data}: pile-00000{i}.tar: cannot read: permission denied" for i in range(2)]


def test_verbose_shows_the_traceback_too(place, capsys):
    assert main(["-v", "verify", place.file]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "StorageError" in err and err.splitlines()[-1].startswith("shardkit verify: error: ")


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only directories; the table fakes EROFS instead"
)
def test_a_read_only_directory_for_real(place, tmp_path):
    out = tmp_path / "locked"
    out.mkdir(mode=0o555)
    with pytest.raises(StorageError, match="permission denied"):
        shardkit.PileWriter(out, piles=2)


def test_an_output_folder_s_own_piles_are_refused_as_inputs(tmp_path, monkeypatch):
    """Shards piled into their own folder, then piled again with --overwrite: '*.tar' there also
    matches the first run's piles, whose samples would be read a second time under keys of their
    own (the dataset doubled). Refused by name before anything is written; so is shuffle's."""
    from tests.conftest import write_wds_shards

    monkeypatch.chdir(tmp_path)
    write_wds_shards(tmp_path, "train-{}.tar", 3, lambda k, i: {"__key__": f"{i:06d}", "json": b"{}", "cls": b"1"} if i < 20 else None)
    assert main(["pile", "*.tar", "-o", ".", "--piles", "2"]) == 0
    before = shardkit.info(".").samples
    for argv in (["pile", "*.tar", "-o", ".", "--piles", "2", "--overwrite"], ["shuffle", "*.tar", "-o", ".", "--overwrite"]):
        with pytest.raises(
            ConfigError,
            match=r"pile-000000\.tar: an input in the output folder \. with the name of (a file pile writes|a data file of the dataset) there",
        ):
            shardkit.pile("*.tar", ".", piles=2, overwrite=True) if argv[0] == "pile" else shardkit.shuffle("*.tar", ".", overwrite=True)
        assert main(argv) == 1
    assert shardkit.info(".").samples == before
    assert main(["pile", "train-*.tar", "-o", ".", "--piles", "2", "--overwrite"]) == 0  # its own files named: as before
    assert shardkit.info(".").samples == before
    # a user's own files there are inputs like any, whatever their names (shard-*.tar is what
    # webdataset's ShardWriter writes): only the names the command itself writes are refused
    for k in range(2):
        os.replace(f"train-{k}.tar", f"shard-{k:06d}.tar")
    assert main(["pile", "shard-*.tar", "-o", ".", "--piles", "2", "--overwrite"]) == 0
    assert shardkit.info(".").samples == 40
    with pytest.raises(ConfigError, match=r"shard-000000\.tar: an input in the output folder \. with the name of a file shuffle writes"):
        shardkit.shuffle("shard-*.tar", ".", overwrite=True)


def test_an_empty_shard_is_an_error_and_one_cut_at_a_member_s_end_is_named(tmp_path, caplog):
    """A 0-byte .tar is no tar (every tar holds at least its end marker): refused by name, where
    it was read as a shard of no samples. One cut short where a member ends reads up to there,
    as GNU tar does, with one warning that names it (it loses the rest of the shard otherwise
    without a word); a whole shard gives none."""
    from shardkit.tar import shard as shard_module
    from tests.conftest import write_wds_shards

    (good,) = write_wds_shards(
        tmp_path, "good-{}.tar", 1, lambda k, i: {"__key__": f"{i:06d}", "json": b"{}", "cls": b"1"} if i < 20 else None
    )
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    for read in (lambda: shardkit.pile([good, str(empty)], str(tmp_path / "out"), piles=2), lambda: list(shardkit.loader(str(empty)))):
        with pytest.raises(CorruptShardError, match=r"empty\.tar: an empty file \(0 bytes\); expected a tar archive"):
            read()
    packed = tmp_path / "empty.tar.gz"
    packed.write_bytes(gzip.compress(b""))
    with pytest.raises(CorruptShardError, match=r"empty\.tar\.gz: its gzip data holds no byte of tar; expected a tar archive"):
        list(shardkit.loader(str(packed)))
    cut = tmp_path / "cut.tar"
    cut.write_bytes(pathlib.Path(good).read_bytes()[: 3 * 2048])  # three members whole (webdataset writes a pax header before each)
    shard_module._UNENDED.clear()
    caplog.set_level(logging.WARNING, logger="shardkit.tar.shard")
    with shardkit.loader(str(cut), decode=False) as loader:
        read = [sorted(s) for _ in range(2) for s in loader]
    assert sorted(read) == [["__key__", "cls"], ["__key__", "cls"], ["__key__", "cls", "json"], ["__key__", "cls", "json"]]
    said = [r.getMessage() for r in caplog.records if r.name == "shardkit.tar.shard"]
    assert said == [
        f"{cut}: no end-of-archive marker (two zero blocks) after its last member, at offset 6144: the file may have been cut "
        "short (an interrupted download or copy); its whole members are read, anything after them is not there"
    ]
    caplog.clear()
    assert shardkit.pile(good, str(tmp_path / "whole"), piles=1).samples == 20
    assert [r for r in caplog.records if r.name == "shardkit.tar.shard"] == []


def test_shuffle_of_a_file_that_is_no_tar_says_what_shuffle_reads(tmp_path):
    """shuffle has no format option: its refusal points at pile, which has one, where it told the
    user to pass --format to shuffle. Files pile reads by their suffix still go through."""
    odd = tmp_path / "s.arrows"
    odd.write_bytes(b"ARROW1" + bytes(600))
    with pytest.raises(ConfigError) as e:
        shardkit.shuffle(str(odd), str(tmp_path / "out"))
    assert str(e.value).startswith(
        f"inputs: {odd} is not a tar shard (no '.tar' in its name, no tar header at its start) nor a file of a format read"
    )
    assert "and shuffle takes no format: make piles of it with shardkit pile --format FORMAT" in str(e.value)
    assert "format=" not in str(e.value)
    assert main(["shuffle", str(odd), "-o", str(tmp_path / "out")]) == 1
    assert not (tmp_path / "out").exists()
