"""Reading through fsspec URLs: the storage layer, the loader and the audit on ``memory://``.

fsspec's in-memory filesystem stands in for an object store: the same code paths as ``s3://``
(no local path, no memory map, listings and globs through fsspec), without a server.
"""

from __future__ import annotations

import os
import uuid

import pytest

import shardkit
from shardkit import storage
from shardkit.errors import CorruptShardError, DatasetNotFoundError

fsspec = pytest.importorskip("fsspec", reason="remote URLs need the remote extra: pip install 'shardkit[remote]'")


@pytest.fixture
def bucket():
    """A fresh ``memory://`` directory URL, removed afterwards."""
    fs = fsspec.filesystem("memory")
    root = f"/bucket-{uuid.uuid4().hex}"
    fs.makedirs(root, exist_ok=True)
    yield f"memory://{root.lstrip('/')}"
    fs.rm(root, recursive=True)


def _upload(local_dir: str, url: str) -> None:
    for name in sorted(os.listdir(local_dir)):
        with open(os.path.join(local_dir, name), "rb") as f:
            storage.write_bytes(storage.join(url, name), f.read())


def test_storage_round_trip(bucket):
    root = bucket
    url = storage.join(root, "a.bin")
    storage.write_bytes(url, b"hello")
    assert storage.exists(url) and storage.size(url) == 5
    assert storage.read_bytes(url) == b"hello" and storage.map_bytes(url) == b"hello"
    with storage.open_read(url) as f:
        assert f.read() == b"hello"
    assert storage.listdir(root) == ["a.bin"]
    storage.remove(url)
    assert not storage.exists(url)
    with pytest.raises(DatasetNotFoundError, match=r"a\.bin: no such file"):
        storage.read_bytes(url)
    with pytest.raises(DatasetNotFoundError, match=r"a\.bin: no such file"):
        storage.size(url)


def test_remote_globs_and_braces(bucket):
    root = bucket
    for name in ("s-000.tar", "s-001.tar", "s-002.tar", "other.txt"):
        storage.write_bytes(storage.join(root, name), b"x")
    storage.makedirs(storage.join(root, "s-dir.tar"))
    globbed = storage.expand(storage.join(root, "s-*.tar"))
    assert [u.rsplit("/", 1)[1] for u in globbed] == ["s-000.tar", "s-001.tar", "s-002.tar"]  # no directory
    assert all(storage.read_bytes(u) == b"x" for u in globbed)
    braced = storage.expand(storage.join(root, "s-{000..001}.tar"))
    assert [u.rsplit("/", 1)[1] for u in braced] == ["s-000.tar", "s-001.tar"]
    with pytest.raises(DatasetNotFoundError, match=r"nope-\*\.tar: pattern matches no file"):
        storage.expand(storage.join(root, "nope-*.tar"))


def test_loader_reads_a_remote_dataset_in_the_local_order(bucket, dataset):
    root = bucket
    _upload(dataset, root)
    for kwargs in ({"seed": 5}, {"seed": 5, "batch_size": 16}, {"shuffle": False}):
        local = list(shardkit.loader(dataset, decode=False, **kwargs))
        remote = list(shardkit.loader(root, decode=False, **kwargs))
        assert [s["__key__"] for s in remote] == [s["__key__"] for s in local]
        assert remote == local  # the bytes too


def test_loader_reads_remote_webdataset_shards_by_glob(bucket, dataset):
    root = bucket
    _upload(dataset, root)
    keys = sorted(s["__key__"] for s in shardkit.loader(storage.join(root, "pile-*.tar"), decode=False))
    assert keys == sorted(s["__key__"] for s in shardkit.loader(dataset, decode=False))


def test_remote_audit_and_corruption_name_the_url(bucket, dataset):
    root = bucket
    _upload(dataset, root)
    assert shardkit.info(root).samples == 200
    assert shardkit.verify(root) == []
    pile = storage.join(root, "pile-000002.tar")
    data = bytearray(storage.read_bytes(pile))
    data[700] ^= 0xFF  # inside the first member's data: only the checksum can tell
    storage.write_bytes(pile, bytes(data))
    problems = shardkit.verify(root)
    assert len(problems) == 1 and "pile-000002.tar" in str(problems[0])
    with pytest.raises(CorruptShardError, match=r"memory://.*pile-000002\.tar"):
        list(shardkit.loader(root, decode=False))
