"""MDS and litdata directories, written by their own libraries in the test, piled in one call."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit.piles.readers import detect, make
from shardkit.tar.shard import iter_shard


def samples(out: Path) -> dict[str, dict[str, bytes]]:
    return {s.pop("__key__"): s for pile in sorted(out.glob("pile-*.tar")) for s in iter_shard(str(pile))}


def _png(i: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4, 4), (i, 0, 0)).save(out, format="PNG")
    return out.getvalue()


def _mds_writer():
    try:
        from shardkit.piles.readers.mds import streaming_format

        streaming_format()
        from streaming.base.format.mds.writer import MDSWriter
    except (ImportError, shardkit.ConfigError) as e:
        pytest.skip(f"the mds extra (mosaicml-streaming) is not installed: {e}")
    return MDSWriter


def write_mds(path: Path, n: int, compression: str | None = None) -> None:
    columns = {"id": "int", "text": "str", "img": "png", "arr": "ndarray:float32:2", "raw": "bytes"}
    with _mds_writer()(out=str(path), columns=columns, size_limit=1500, compression=compression) as w:
        for i in range(n):
            w.write({"id": i, "text": f"t{i}", "img": _png(i), "arr": np.array([i, 0.5], np.float32), "raw": bytes([i])})


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_mds_directory_moves_over_in_one_call(tmp_path, compression):
    write_mds(tmp_path / "mds", 30, compression)
    assert detect(str(tmp_path / "mds")) == "mds"
    assert len(make("mds").units([str(tmp_path / "mds")])) > 2  # one unit a shard
    m = shardkit.pile(str(tmp_path / "mds"), tmp_path / "out", piles=3, quiet=True)
    got = samples(tmp_path / "out")
    assert m.samples == 30 and set(got) == {f"{i:09d}" for i in range(30)}
    s = got["000000017"]
    assert s["id"] == b"17" and s["text"] == b"t17" and s["raw"] == bytes([17]) and s["img"] == _png(17)  # stored bytes, not re-encoded
    assert np.load(io.BytesIO(s["arr"])).tolist() == [17.0, 0.5]


def test_mds_is_byte_identical_for_any_workers_and_a_bad_shard_is_named(tmp_path):
    write_mds(tmp_path / "mds", 30)
    shardkit.pile(str(tmp_path / "mds"), tmp_path / "w1", piles=3, seed=2, quiet=True)
    shardkit.pile(str(tmp_path / "mds"), tmp_path / "w2", piles=3, seed=2, workers=2, quiet=True)
    digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((tmp_path / "w1").glob("pile-*"))]
    assert digest == [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((tmp_path / "w2").glob("pile-*"))]
    index = json.loads((tmp_path / "mds" / "index.json").read_text())
    shard = tmp_path / "mds" / index["shards"][1]["raw_data"]["basename"]
    shard.write_bytes(shard.read_bytes()[:-40])
    with pytest.raises(shardkit.CorruptShardError, match=r"mds shard 1 \(shard\.00001\.mds\).*truncated"):
        shardkit.pile(str(tmp_path / "mds"), tmp_path / "bad", piles=3, quiet=True)
    m = shardkit.pile(str(tmp_path / "mds"), tmp_path / "bad", piles=3, quiet=True, on_error="skip")
    assert m.skipped_units == 1 and m.samples == 30 - index["shards"][1]["samples"]


def _item(i: int) -> dict:
    return {"index": i, "text": f"t{i}", "arr": np.arange(3) + i, "raw": bytes([i])}


def test_litdata_directory_moves_over_in_one_call(tmp_path):
    writer = pytest.importorskip("litdata.streaming.writer", reason="the litdata extra is not installed")
    # what litdata.optimize writes, made in this process (optimize starts worker processes)
    lit = writer.BinaryWriter(str(tmp_path / "lit"), chunk_size=10)
    for i in range(25):
        lit[i] = _item(i)
    lit.done()
    lit.merge()
    assert detect(str(tmp_path / "lit")) == "litdata"
    assert [(u.start, u.stop) for u in make("litdata").units([str(tmp_path / "lit")])] == [(0, 10), (10, 20), (20, 25)]
    m = shardkit.pile(str(tmp_path / "lit"), tmp_path / "out", piles=2, quiet=True, format=make("litdata", key="text"))
    got = samples(tmp_path / "out")
    assert m.samples == 25 and got["t7"]["index"] == b"7" and got["t7"]["raw"] == bytes([7])
    assert np.load(io.BytesIO(got["t7"]["arr"])).tolist() == [7, 8, 9]


def test_a_litdata_directory_written_again_is_read_again(tmp_path):
    import shutil

    writer = pytest.importorskip("litdata.streaming.writer", reason="the litdata extra is not installed")
    for n, text in ((6, "old"), (6, "new")):
        shutil.rmtree(tmp_path / "lit", ignore_errors=True)
        lit = writer.BinaryWriter(str(tmp_path / "lit"), chunk_size=4)
        for i in range(n):
            lit[i] = {"text": text}
        lit.done()
        lit.merge()
        shardkit.pile(str(tmp_path / "lit"), tmp_path / text, piles=1, quiet=True)  # one process: what it read before is not reused
        assert {s["text"] for s in samples(tmp_path / text).values()} == {text.encode()}


def test_an_mds_index_entry_without_its_sample_count_is_named(tmp_path):
    write_mds(tmp_path / "mds", 30)
    index = json.loads((tmp_path / "mds" / "index.json").read_text())
    del index["shards"][1]["samples"]
    (tmp_path / "mds" / "index.json").write_text(json.dumps(index))
    with pytest.raises(shardkit.CorruptShardError, match=r"mds/index\.json: not an MDS index: ValueError: shard 1: expected 'samples'"):
        shardkit.pile(str(tmp_path / "mds"), tmp_path / "out", piles=2, quiet=True)


def test_a_damaged_mds_shard_file_is_a_corrupt_shard_saying_what_is_wrong(tmp_path):
    write_mds(tmp_path / "mds", 30)
    shards = json.loads((tmp_path / "mds" / "index.json").read_text())["shards"]
    (tmp_path / "mds" / shards[1]["raw_data"]["basename"]).write_bytes(b"\x01\x00")
    with pytest.raises(shardkit.CorruptShardError, match=r"shard\.00001\.mds\): the shard is 2 bytes, too short for the header"):
        shardkit.pile(str(tmp_path / "mds"), tmp_path / "o1", piles=2, quiet=True)
    write_mds(tmp_path / "zstd", 30, "zstd")
    shards = json.loads((tmp_path / "zstd" / "index.json").read_text())["shards"]
    packed = tmp_path / "zstd" / shards[1]["zip_data"]["basename"]
    packed.write_bytes(packed.read_bytes()[:-20])
    with pytest.raises(shardkit.CorruptShardError, match=r"shard\.00001\.mds\.zstd: cannot decompress it \(zstd\)"):
        shardkit.pile(str(tmp_path / "zstd"), tmp_path / "o2", piles=2, quiet=True)


def test_a_damaged_index_json_is_named_not_taken_for_a_folder_of_files(tmp_path):
    """A folder whose index.json does not parse (a copy cut short) is an MDS or litdata folder
    damaged: said so by name, where it read as 'a directory, not a file: name the files in it'."""
    folder = tmp_path / "mds"
    folder.mkdir()
    (folder / "index.json").write_text('{"shards": [{"column_names": ["x"]')
    with pytest.raises(shardkit.CorruptShardError) as e:
        shardkit.pile(str(folder), str(tmp_path / "out"), piles=2)
    assert str(e.value).startswith(f"{folder}/index.json: not valid JSON (Expecting ")
    assert "read as the output of MDSWriter or litdata.optimize" in str(e.value)
    assert not (tmp_path / "out").exists()
    # an index.json of some other kind is a file like any: the folder is refused as before
    other = tmp_path / "notes"
    other.mkdir()
    (other / "index.json").write_text('{"a": 1}\n{"b": 2}\n')
    with pytest.raises(shardkit.DatasetNotFoundError, match=r"notes: a directory, not a file"):
        shardkit.pile(str(other), str(tmp_path / "out"), piles=2)
