"""A dataset as one object: its transaction (lock, staging, commit, release), pinned generations, leftovers."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

import shardkit
from shardkit import manifest
from shardkit.dataset import layout
from shardkit.dataset.transaction import Dataset
from shardkit.errors import ConfigError, DatasetExistsError, DatasetNotFoundError
from shardkit.manifest import Manifest, PileInfo
from tests.conftest import make_samples


def _pile(path: str, keys: list[str]) -> PileInfo:
    """A pile file of one ``txt`` member a sample at ``path``, and its manifest entry."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key in keys:
            data = key.encode()
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    with open(path, "wb") as f:
        f.write(data)
    crc = manifest.format_checksum(manifest.checksum(data))
    return PileInfo(name=os.path.basename(path), samples=len(keys), bytes=len(data), checksum=crc)


def _written(out: str, seed: int = 0, count: int = 40) -> Manifest:
    with shardkit.PileWriter(out, piles=2, seed=seed) as w:
        for sample in make_samples(count, seed=seed):
            w.write(sample)
    return w.manifest


def test_a_transaction_installs_its_files_manifest_last_and_lets_everything_go(tmp_path):
    out = str(tmp_path / "ds")
    with Dataset(out).transaction() as txn:
        staging = txn.staging()
        assert os.path.isdir(staging) and os.path.dirname(staging) == out
        info = _pile(os.path.join(staging, "pile-000000.tar"), ["a", "b"])
        with pytest.raises(DatasetExistsError, match="another job is writing here"):
            Dataset(out).transaction().open()  # the lock is held
        result = txn.commit([os.path.join(staging, info.name)], Manifest(piles=(info,), seed=0, fields=("txt",), created_by="test"))
    assert txn.result == result and manifest.read(out) == result
    assert sorted(os.listdir(out)) == ["pile-000000.tar", layout.MANIFEST]  # staging and lock gone
    assert [s["__key__"] for s in shardkit.loader(out, shuffle=False)] == ["a", "b"]
    with Dataset(out).transaction(overwrite=True):
        pass  # the lock was let go


def test_a_transaction_left_on_an_error_publishes_nothing_and_removes_its_staging(tmp_path):
    out = str(tmp_path / "ds")
    with pytest.raises(KeyError), Dataset(out).transaction() as txn:
        _pile(os.path.join(txn.staging(), "pile-000000.tar"), ["a"])
        raise KeyError("stop")
    assert not os.path.exists(out)  # the folder it made goes again
    with pytest.raises(RuntimeError, match="not open"):
        txn.staging()


def test_an_append_transaction_reads_its_base_and_keeps_the_generation_it_replaces(tmp_path):
    out = str(tmp_path / "ds")
    first = _written(out)
    before = Path(out, layout.MANIFEST).read_bytes()
    with Dataset(out).transaction(mode="append") as txn:
        assert txn.base == first and txn.generation == 1
        times, kept = txn.advance(None)
        assert sorted(times) == [0, 1] and kept == {0, 1}  # a pass 1's dataset is generation 0, dated by its manifest
        assert txn.advance(1)[1] == {1} and txn.advance("1h")[1] == {0, 1}
        path = os.path.join(txn.staging(), "pile-000002.tar")
        staged = _pile(path, ["new"])
        result = Manifest(piles=(*first.piles, staged), seed=0, fields=first.fields, created_by="test", generation=1)
        txn.commit([path], result, names=[staged.name], keep=True)
    assert manifest.read(out) == result and all(os.path.exists(os.path.join(out, n)) for n in result.files())
    # the replaced generation's manifest is kept byte for byte, and a pin reads it
    assert Path(out, layout.generation_name(0)).read_bytes() == before
    ds = Dataset(out)
    assert ds.pinned(0) == first and ds.pinned(1).generation == 1
    with pytest.raises(DatasetNotFoundError, match=r"generation 7 .* is not kept"):
        ds.pinned(7)


def test_an_append_with_no_dataset_is_refused_and_the_lock_let_go(tmp_path):
    out = str(tmp_path / "ds")
    os.mkdir(out)
    with pytest.raises(DatasetNotFoundError, match="no shardkit dataset to append to"):
        Dataset(out).transaction(mode="append").open()
    assert os.listdir(out) == []
    with Dataset(out).transaction():
        pass


def test_an_append_to_no_directory_makes_none(tmp_path):
    # the user saw `shardkit pile x.tar -o nope --append` fail and leave an empty nope/ behind
    out = tmp_path / "nope" / "ds"
    with pytest.raises(DatasetNotFoundError, match=f"{out}: no shardkit dataset to append to"):
        Dataset(str(out)).transaction(mode="append").open()
    assert os.listdir(tmp_path) == []


def test_a_create_transaction_refuses_a_dataset_and_collect_publishes_nothing(tmp_path):
    out = str(tmp_path / "ds")
    _written(out)
    with pytest.raises(DatasetExistsError, match="already holds a shardkit dataset"):
        Dataset(out).transaction().open()
    with pytest.raises(ConfigError, match="mode: expected one of 'create', 'append', 'collect', got 'replace'"):
        Dataset(out).transaction(mode="replace")
    with pytest.raises(ConfigError, match="dry_run: only a 'collect' transaction"):
        Dataset(out).transaction(dry_run=True)
    with Dataset(out).transaction(mode="collect") as txn:
        with pytest.raises(ConfigError, match="publishes nothing"):
            txn.commit([], manifest.read(out))
        with pytest.raises(ConfigError, match="only an append transaction advances"):
            txn.advance(None)


def test_leftovers_are_found_by_name_and_the_next_transaction_clears_them(tmp_path):
    out = str(tmp_path / "ds")
    _written(out)
    ds = Dataset(out)
    assert ds.leftovers() == []
    # what a job killed in its install leaves: its staging, and a journal naming a file it moved in
    staging = os.path.join(out, layout.STAGING_PREFIX + "0" * 32)
    os.mkdir(staging)
    with open(os.path.join(staging, layout.OWNER), "w") as f:
        json.dump({"dataset": out}, f)
    _pile(os.path.join(out, "pile-000005.tar"), ["z"])
    journal = layout.journal_name("1" * 32)
    with open(os.path.join(out, journal), "w") as f:
        json.dump({"files": ["pile-000005.tar"], "delete": []}, f)
    found = {item.name: item.kind for item in ds.leftovers()}
    assert found == {os.path.basename(staging): "temporary", "pile-000005.tar": "journal", journal: "journal"}
    assert {p.name for p in shardkit.verify(out) if p.kind == "leftover"} == set(found)
    with ds.transaction(mode="collect"):
        pass
    assert ds.leftovers() == []
    assert sorted(os.listdir(out)) == sorted([layout.MANIFEST, *manifest.read(out).files()])
