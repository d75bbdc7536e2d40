"""Readers: Parquet, Arrow, Hugging Face datasets and CSV files piled as they are, from files the tests write."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit.cli import main
from shardkit.cli.jobs import load_job, run_job
from shardkit.piles.readers import detect, make
from shardkit.tar.shard import iter_shard

pa = pytest.importorskip("pyarrow", reason="the parquet extra (pyarrow) is not installed")
pq = pytest.importorskip("pyarrow.parquet", reason="the parquet extra (pyarrow) is not installed")


def samples(out: Path) -> dict[str, dict[str, bytes]]:
    found = {}
    for pile in sorted(out.glob("pile-*.tar")):
        for sample in iter_shard(str(pile)):
            found[sample.pop("__key__")] = sample
    return found


def digests(out: Path) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("pile-*.tar"))]


def table(n: int, start: int = 0):
    return pa.table(
        {
            "id": list(range(start, start + n)),
            "jpg": [b"\xff\xd8\xff" + bytes([i % 256]) * 3 for i in range(n)],
            "caption": [f"caption {i}" for i in range(start, start + n)],
            "meta": [{"tags": ["a", "b"][: i % 3], "size": [i, i + 1]} for i in range(n)],
            "score": [i / 4 for i in range(n)],
            "emb": [[float(i), 0.5] for i in range(n)],
            "maybe": [None if i % 2 else f"m{i}" for i in range(n)],
        }
    )


@pytest.fixture
def parquet_dir(tmp_path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(table(50), src / "part-0.parquet", row_group_size=20)
    pq.write_table(table(30, start=50), src / "part-1.parquet", row_group_size=7)
    return src


def test_parquet_columns_become_fields_encoded_by_type(tmp_path, parquet_dir):
    m = shardkit.pile(str(parquet_dir / "*.parquet"), tmp_path / "out", piles=3, seed=1, quiet=True)
    assert m.samples == 80
    got = samples(tmp_path / "out")
    assert len(got) == 80
    s = got["part-0/000000004"]
    assert s["id"] == b"4" and s["caption"] == b"caption 4" and s["score"] == b"1.0" and s["jpg"] == b"\xff\xd8\xff" + b"\x04" * 3
    assert json.loads(s["meta"]) == {"tags": ["a"], "size": [4, 5]} and json.loads(s["emb"]) == [4.0, 0.5]
    assert s["maybe"] == b"m4" and "maybe" not in got["part-0/000000005"]  # a null leaves the field out
    assert got["part-1/000000029"]["id"] == b"79"
    assert detect(str(parquet_dir / "part-0.parquet")) == "parquet"


def test_parquet_is_byte_identical_for_any_workers_and_slicing(tmp_path, parquet_dir):
    one = shardkit.pile(str(parquet_dir / "*.parquet"), tmp_path / "w1", piles=4, seed=7, quiet=True)
    two = shardkit.pile(str(parquet_dir / "*.parquet"), tmp_path / "w2", piles=4, seed=7, workers=2, quiet=True)
    assert one.samples == two.samples == 80
    assert digests(tmp_path / "w1") == digests(tmp_path / "w2")
    # slices of row groups are other units (routed otherwise) but hold the same samples
    reader = make("parquet", rows_per_unit=5)
    assert len(reader.units([str(parquet_dir / "part-0.parquet")])) == 10
    shardkit.pile(str(parquet_dir / "*.parquet"), tmp_path / "sliced", piles=4, seed=7, quiet=True, format=reader)
    assert samples(tmp_path / "sliced") == samples(tmp_path / "w1")


def test_parquet_overrides_key_column_and_nested_binary(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"name": ["a", "b"], "img": [b"x", b"y"], "emb": [[1.0, 2.0], [3.0, 4.0]], "parts": [[b"p", b"q"], [b"r"]]}), path
    )
    reader = make("parquet", key="name", fields={"img": "png"}, encode={"emb": "npy", "parts": "pickle"})
    shardkit.pile(str(path), tmp_path / "out", piles=1, quiet=True, format=reader)
    got = samples(tmp_path / "out")
    assert set(got) == {"a", "b"} and got["b"]["png"] == b"y" and got["b"]["name"] == b"b"
    assert np.load(io.BytesIO(got["a"]["emb"])).tolist() == [1.0, 2.0]
    import pickle

    assert pickle.loads(got["a"]["parts"]) == [b"p", b"q"]
    # without an encoding, binary inside a nested value has no JSON form: one error naming file, group, column, row
    with pytest.raises(shardkit.SampleError, match=r"t\.parquet: row group 0: column 'parts': row 0: binary data inside"):
        shardkit.pile(str(path), tmp_path / "bad", piles=1, quiet=True)


def test_parquet_bad_files_are_one_clear_error_or_a_skipped_unit(tmp_path, parquet_dir):
    data = (parquet_dir / "part-1.parquet").read_bytes()
    (parquet_dir / "part-1.parquet").write_bytes(data[: len(data) - 9])  # the footer cut
    pattern = str(parquet_dir / "*.parquet")
    with pytest.raises(shardkit.CorruptShardError, match=r"part-1\.parquet: not a readable Parquet file"):
        shardkit.pile(pattern, tmp_path / "out", piles=2, quiet=True)
    assert not (tmp_path / "out" / "shardkit.json").exists()
    m = shardkit.pile(pattern, tmp_path / "out", piles=2, quiet=True, on_error="skip")
    assert m.samples == 50 and m.skipped_units == 1
    with pytest.raises(shardkit.SampleError, match=r"part-0\.parquet: row group 0: columns names column 'nope'"):
        shardkit.pile(
            str(parquet_dir / "part-0.parquet"), tmp_path / "o2", piles=2, quiet=True, format=make("parquet", columns=["id", "nope"])
        )
    with pytest.raises(
        shardkit.SampleError, match=r"row group 0: column 'caption': row 0: expected binary data for encoding 'bytes', got str"
    ):
        shardkit.pile(
            str(parquet_dir / "part-0.parquet"), tmp_path / "o3", piles=2, quiet=True, format=make("parquet", encode={"caption": "bytes"})
        )
    with pytest.raises(shardkit.SampleError, match=r"key column 'score': row 0: expected a non-empty string or an integer, got 0\.0"):
        shardkit.pile(str(parquet_dir / "part-0.parquet"), tmp_path / "o4", piles=2, quiet=True, format=make("parquet", key="score"))
    with pytest.raises(shardkit.ConfigError, match="encode: column 'x': expected one of auto"):
        make("parquet", encode={"x": "yaml"})


def test_inputs_with_no_rows_are_named(tmp_path):
    pq.write_table(pa.table({"id": pa.array([], pa.int64())}), tmp_path / "empty.parquet")
    with pytest.raises(shardkit.ConfigError, match=r"inputs: \S*empty\.parquet: no rows to pile \(Parquet found no unit to read\)"):
        shardkit.pile(str(tmp_path / "empty.parquet"), tmp_path / "out", piles=2, quiet=True)
    assert not (tmp_path / "out" / "shardkit.json").exists()
    datasets = pytest.importorskip("datasets", reason="the hf extra (datasets) is not installed")
    with pytest.raises(shardkit.ConfigError, match=r"inputs: the dataset: no rows to pile"):
        shardkit.pile(datasets.Dataset.from_dict({"text": []}), tmp_path / "out", piles=2, quiet=True)


def test_arrow_file_and_stream_formats(tmp_path):
    import pyarrow.feather as feather

    t = pa.table({"x": list(range(40)), "s": [f"v{i}" for i in range(40)]})
    feather.write_feather(t, tmp_path / "t.feather", chunksize=16)
    with pa.OSFile(str(tmp_path / "u.arrow"), "wb") as f, pa.ipc.new_stream(f, t.schema) as w:
        for batch in t.to_batches(max_chunksize=15):
            w.write_batch(batch)
    assert len(make("arrow").units([str(tmp_path / "u.arrow")])) == 3
    m = shardkit.pile([str(tmp_path / "t.feather"), str(tmp_path / "u.arrow")], tmp_path / "out", piles=2, quiet=True)
    got = samples(tmp_path / "out")
    assert m.samples == 80 and got["u/000000031"] == {"s": b"v31", "x": b"31"} and got["t/000000000"]["s"] == b"v0"
    (tmp_path / "bad.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(shardkit.CorruptShardError, match=r"bad\.arrow: not an Arrow IPC file or stream"):
        shardkit.pile(str(tmp_path / "bad.arrow"), tmp_path / "o2", piles=2, quiet=True)
    # a stream cut inside a batch opens, and fails counting its batches: that is the error, not "it changed since"
    data = (tmp_path / "u.arrow").read_bytes()
    (tmp_path / "cut.arrow").write_bytes(data[: len(data) - 40])
    with pytest.raises(shardkit.CorruptShardError, match=r"cut\.arrow: record batch 2 \(after 30 rows\): \w+: Expected to"):
        shardkit.pile(str(tmp_path / "cut.arrow"), tmp_path / "o3", piles=2, quiet=True)


def test_hugging_face_object_saved_directory_and_split(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the hf extra (datasets) is not installed")
    ds = datasets.Dataset.from_dict({"text": [f"t{i}" for i in range(25)], "label": list(range(25))})
    m = shardkit.pile(ds.shuffle(seed=3), tmp_path / "obj", piles=2, quiet=True, format=make("hf", rows_per_unit=10))
    got = samples(tmp_path / "obj")
    order = ds.shuffle(seed=3)["label"]
    assert m.samples == 25 and got["000000000"]["label"] == str(order[0]).encode()  # keys follow the dataset's order
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(5))}).save_to_disk(str(tmp_path / "dict"))
    assert detect(str(tmp_path / "saved")) == detect(str(tmp_path / "dict")) == "hf"
    assert shardkit.pile(str(tmp_path / "saved"), tmp_path / "o1", piles=2, quiet=True).samples == 25
    with pytest.raises(shardkit.ConfigError, match="holds the splits train, test: name one with split="):
        shardkit.pile(str(tmp_path / "dict"), tmp_path / "o2", piles=2, quiet=True)
    assert shardkit.pile(str(tmp_path / "dict"), tmp_path / "o2", piles=2, quiet=True, format=make("hf", split="test")).samples == 5
    assert set(samples(tmp_path / "o2")) == {f"test/{i:09d}" for i in range(5)}
    splits = datasets.DatasetDict({"train": ds, "test": ds.select(range(2))})
    assert shardkit.pile(splits, tmp_path / "o3", piles=1, quiet=True, format=make("hf", split="test")).samples == 2
    with pytest.raises(shardkit.ConfigError, match="dataset: holds the splits train, test"):
        shardkit.pile(splits, tmp_path / "o4", piles=1, quiet=True)


def test_a_damaged_saved_dataset_folder_is_one_error_naming_it(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the hf extra (datasets) is not installed")
    ds = datasets.Dataset.from_dict({"text": [f"t{i}" for i in range(20)]})
    damage = {
        "state": lambda d: (d / "state.json").write_text("{not json"),
        "data": lambda d: next(d.glob("*.arrow")).write_bytes(b"junk"),
        "gone": lambda d: next(d.glob("*.arrow")).unlink(),
    }
    for name, spoil in damage.items():
        saved = tmp_path / name
        ds.save_to_disk(str(saved))
        spoil(saved)
        with pytest.raises(shardkit.CorruptShardError, match=rf"{name}: not a readable folder Dataset\.save_to_disk wrote: \w+"):
            shardkit.pile(str(saved), tmp_path / f"out-{name}", piles=2, quiet=True)
        assert not (tmp_path / f"out-{name}" / "shardkit.json").exists()


def test_a_saved_dataset_without_the_hf_extra_asks_for_it_and_does_not_call_the_folder_damaged(tmp_path, monkeypatch):
    import sys

    datasets = pytest.importorskip("datasets", reason="the hf extra (datasets) is not installed")
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": ["a", "b"]}).save_to_disk(str(saved))
    monkeypatch.setitem(sys.modules, "datasets", None)  # as on a machine without it
    with pytest.raises(shardkit.ConfigError, match=r"saved: reading a saved Hugging Face dataset needs the hf extra"):
        shardkit.pile(str(saved), tmp_path / "out", piles=2, quiet=True)


def _png(value: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 6), (value, 0, 0)).save(out, format="PNG")
    return out.getvalue()


def test_csv_with_image_paths(tmp_path):
    (tmp_path / "img").mkdir()
    for i in range(3):
        (tmp_path / "img" / f"{i}.png").write_bytes(_png(i))
    rows = ["path,label", "img/0.png,0", f"{(tmp_path / 'img' / '1.png').as_uri()},1", f"{tmp_path / 'img' / '2.png'},2"]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    reader = make("csv", image="path", fields={"label": "cls"})
    m = shardkit.pile(str(tmp_path / "train.csv"), tmp_path / "out", piles=2, quiet=True, format=reader)
    got = samples(tmp_path / "out")
    assert m.samples == 3 and got["train/000000001"]["png"] == _png(1) and got["train/000000002"]["cls"] == b"2"
    resized = make("csv", image="path", image_size=4)
    shardkit.pile(str(tmp_path / "train.csv"), tmp_path / "small", piles=1, quiet=True, format=resized)
    assert samples(tmp_path / "small")["train/000000000"]["jpg"][:3] == b"\xff\xd8\xff"
    (tmp_path / "tab.tsv").write_text("a\tb\nx\ty\n")
    assert samples_of(tmp_path, "tab.tsv") == {"tab/000000000": {"a": b"x", "b": b"y"}}
    (tmp_path / "missing.csv").write_text("path\nimg/9.png\n")
    with pytest.raises(shardkit.SampleError, match=r"missing\.csv: row 0: image 'img/9\.png' not found"):
        shardkit.pile(str(tmp_path / "missing.csv"), tmp_path / "o3", piles=1, quiet=True, format=make("csv", image="path"))
    (tmp_path / "ragged.csv").write_text("a,b\n1,2\n3\n")
    with pytest.raises(shardkit.CorruptShardError, match=r"ragged\.csv: line 3: 1 values, expected 2"):
        shardkit.pile(str(tmp_path / "ragged.csv"), tmp_path / "o4", piles=1, quiet=True)


def samples_of(tmp_path: Path, name: str) -> dict[str, dict[str, bytes]]:
    out = tmp_path / f"out-{name}"
    shardkit.pile(str(tmp_path / name), out, piles=1, quiet=True)
    return samples(out)


def test_cli_and_yaml_jobs_take_readers(tmp_path, parquet_dir, capsys):
    code = main(
        [
            "pile",
            str(parquet_dir / "part-0.parquet"),
            "-o",
            str(tmp_path / "cli"),
            "--piles",
            "2",
            "-q",
            "--reader-arg",
            "fields={jpg: png}",
        ]
    )
    assert code == 0 and "50 samples" in capsys.readouterr().out
    assert "png" in samples(tmp_path / "cli")["part-0/000000000"]
    assert (
        main(["pile", str(parquet_dir / "part-0.parquet"), "-o", str(tmp_path / "c2"), "--piles", "2", "-q", "--reader-arg", "nope=1"]) == 1
    )
    assert "nope: unknown argument for format 'parquet'" in capsys.readouterr().err
    job = tmp_path / "job.yaml"
    job.write_text(
        f"job: pile\ninputs: {parquet_dir}/*.parquet\nformat: parquet\nargs: {{key: id}}\noutput: {{path: yaml-out, piles: 2}}\n"
    )
    run_job(load_job(job), quiet=True)
    assert set(samples(tmp_path / "yaml-out")) == {str(i) for i in range(80)}
    job.write_text(
        f"job: preprocess\ninputs: {parquet_dir}/part-1.parquet\ntransform: parquet\nargs: {{columns: [id]}}\noutput: {{path: pre, piles: 2}}\n"
    )
    run_job(load_job(job), quiet=True)
    assert samples(tmp_path / "pre")["part-1/000000000"] == {"id": b"50"}


def test_parquet_csv_and_arrow_on_s3_give_the_local_samples(tmp_path, parquet_dir, s3):
    client = s3.client()
    client.put(str(parquet_dir / "part-0.parquet"), s3.path("in/part-0.parquet"))
    client.put(str(parquet_dir / "part-1.parquet"), s3.path("in/part-1.parquet"))
    (tmp_path / "t.csv").write_text("a,b\n1,2\n3,4\n")
    client.put(str(tmp_path / "t.csv"), s3.path("in/t.csv"))
    import pyarrow.feather as feather

    feather.write_feather(pa.table({"x": [1, 2, 3]}), tmp_path / "t.feather")
    client.put(str(tmp_path / "t.feather"), s3.path("in/t.feather"))
    shardkit.pile(s3.url("in/*.parquet"), tmp_path / "remote", piles=3, seed=4, workers=2, quiet=True)
    shardkit.pile(str(parquet_dir / "*.parquet"), tmp_path / "local", piles=3, seed=4, quiet=True)
    assert digests(tmp_path / "remote") == digests(tmp_path / "local")
    shardkit.pile(s3.url("in/t.csv"), tmp_path / "csv", piles=1, quiet=True)
    assert samples(tmp_path / "csv") == {"t/000000001": {"a": b"3", "b": b"4"}, "t/000000000": {"a": b"1", "b": b"2"}}
    shardkit.pile(s3.url("in/t.feather"), tmp_path / "arrow", piles=1, quiet=True)
    assert samples(tmp_path / "arrow")["t/000000002"] == {"x": b"3"}
    shardkit.export(tmp_path / "local", s3.url("out/all.parquet"), quiet=True)
    assert client.exists(s3.path("out/all.parquet"))


def test_key_prefixes_follow_the_paths_and_refuse_a_clash():
    from shardkit.piles.readers.base import key_prefixes, row_key

    assert key_prefixes(["d/en/a.parquet", "d/fr/a.parquet"], (".parquet",)) == ["en/a", "fr/a"]
    assert key_prefixes(["s3://b/x/train.part.1.parquet"], (".parquet",)) == ["train_part_1"]
    assert key_prefixes(["d/t.csv.gz", "d/u.tsv"], (".csv", ".tsv")) == ["t", "u"]
    assert row_key("en/a", 17) == "en/a/000000017" and row_key("", 3) == "000000003"
    with pytest.raises(shardkit.ConfigError, match="same key prefix 'a_b'"):
        key_prefixes(["d/a.b.parquet", "d/a_b.parquet"], (".parquet",))


def test_format_by_name_and_mixed_inputs(tmp_path, parquet_dir):
    odd = tmp_path / "table.bin"
    odd.write_bytes((parquet_dir / "part-1.parquet").read_bytes())
    assert shardkit.pile(str(odd), tmp_path / "o1", piles=1, quiet=True, format="parquet").samples == 30
    assert set(samples(tmp_path / "o1")) == {f"table_bin/{i:09d}" for i in range(30)}
    (tmp_path / "a.csv").write_text("x\n1\n")
    with pytest.raises(shardkit.ConfigError, match=r"inputs: mix formats \(csv, parquet\)"):
        shardkit.pile([str(tmp_path / "a.csv"), str(parquet_dir / "part-0.parquet")], tmp_path / "o2", piles=1, quiet=True)
    with pytest.raises(shardkit.ConfigError, match="key_prefix: a reader's keys already name the file"):
        shardkit.pile(str(tmp_path / "a.csv"), tmp_path / "o3", piles=1, quiet=True, key_prefix="unit")
    with pytest.raises(shardkit.ConfigError, match="format: expected one of parquet, arrow, hf, mds, litdata, csv"):
        shardkit.pile(str(tmp_path / "a.csv"), tmp_path / "o4", piles=1, quiet=True, format="orc")


def test_preprocess_takes_a_reader_and_paths(tmp_path, parquet_dir):
    reader = make("parquet", columns=["id"])
    m = shardkit.preprocess([str(parquet_dir / "part-0.parquet")], reader, tmp_path / "out", piles=2, quiet=True, extra={"source": "demo"})
    assert m.samples == 50 and m.extra["source"] == "demo" and m.extra["units"] == 3  # three row groups
    assert samples(tmp_path / "out")["part-0/000000049"] == {"id": b"49"}


def test_yaml_pile_job_reads_a_saved_dataset_folder(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the hf extra (datasets) is not installed")
    datasets.Dataset.from_dict({"text": ["a", "b", "c"]}).save_to_disk(str(tmp_path / "saved"))
    job = tmp_path / "job.yaml"
    job.write_text("job: pile\ninputs: saved\noutput: {path: out, piles: 1}\n")
    run_job(load_job(job), quiet=True)
    assert samples(tmp_path / "out") == {f"{i:09d}": {"text": t} for i, t in enumerate([b"a", b"b", b"c"])}
    job.write_text("job: pile\ninputs: saved\nformat: hf\nargs: {split: train, nope: 1}\noutput: {path: out2, piles: 1}\n")
    with pytest.raises(shardkit.ConfigError, match=r"job\.yaml: line \d+: args\.nope: unknown argument for format 'hf'"):
        load_job(job)


def test_mutated_parquet_files_give_samples_or_one_shardkit_error(tmp_path):
    """Truncations and flipped bytes anywhere in a file: pass 1 writes it or raises a ShardkitError, never another error."""
    path = tmp_path / "src.parquet"
    pq.write_table(table(40), path, row_group_size=10)
    data = path.read_bytes()
    rng = np.random.default_rng(11)
    outcomes = set()
    for case in range(16):
        mutated = bytearray(data)
        if case % 2:
            mutated = mutated[: int(rng.integers(0, len(data)))]
        else:
            for at in rng.integers(0, len(data), size=4):
                mutated[at] ^= int(rng.integers(1, 256))
        bad = tmp_path / f"bad-{case}.parquet"
        bad.write_bytes(bytes(mutated))
        try:
            shardkit.pile(str(bad), tmp_path / f"out-{case}", piles=2, quiet=True)
            outcomes.add("written")
        except shardkit.ShardkitError as e:
            assert f"bad-{case}.parquet" in str(e)
            outcomes.add(type(e).__name__)
    assert "CorruptShardError" in outcomes


def test_a_file_pile_cannot_read_is_named_before_any_work(tmp_path, capsys):
    import shutil

    (tmp_path / "rows.jsonl").write_text('{"id": 1}\n{"id": 2, "text": "a longer line of json"}\n')
    with pytest.raises(shardkit.ConfigError, match=r"inputs: .*rows\.jsonl is not a tar shard .*\(\.arrow, \.csv.*transform: jsonl"):
        shardkit.pile(str(tmp_path / "rows.jsonl"), str(tmp_path / "out"), piles=2, quiet=True)
    assert not (tmp_path / "out").exists()
    assert main(["pile", str(tmp_path / "rows.jsonl"), "-o", str(tmp_path / "out"), "--piles", "2", "-q"]) == 1
    assert "rows.jsonl is not a tar shard" in capsys.readouterr().err
    # a tar is read whatever its name; and named as shards, a file is read as a tar (the walk names its fault)
    with shardkit.PileWriter(str(tmp_path / "src"), piles=1) as w:
        w.write({"__key__": "a", "txt": "x"})
    shutil.copy(tmp_path / "src" / "pile-000000.tar", tmp_path / "no-suffix")
    assert shardkit.pile(str(tmp_path / "no-suffix"), str(tmp_path / "ok"), piles=1, quiet=True).samples == 1
    with pytest.raises(shardkit.CorruptShardError, match=r"rows\.jsonl: member 0 at offset 0"):
        shardkit.pile(str(tmp_path / "rows.jsonl"), str(tmp_path / "out"), piles=2, quiet=True, format="shards")
    # with on_error="skip" it is an input unit that fails, and is skipped
    both = [str(tmp_path / "rows.jsonl"), str(tmp_path / "no-suffix")]
    m = shardkit.pile(both, str(tmp_path / "skip"), piles=1, quiet=True, on_error="skip")
    assert (m.samples, m.skipped_units) == (1, 1)
    # a tar of the old form (no ustar magic) is known by its header checksum
    data = bytearray((tmp_path / "no-suffix").read_bytes())
    data[257:265] = bytes(8)
    data[148:156] = b" " * 8
    data[148:156] = b"%06o\0 " % sum(data[:512])
    (tmp_path / "old-tar").write_bytes(bytes(data))
    assert shardkit.pile(str(tmp_path / "old-tar"), str(tmp_path / "old"), piles=1, quiet=True).samples == 1


@pytest.mark.parametrize(("column", "why"), [("", "it is empty"), ("a/b", "it holds '/'")])
def test_a_column_that_is_no_field_extension_says_why(tmp_path, column, why):
    pq.write_table(pa.table({"id": [1, 2], column: ["x", "y"]}), tmp_path / "t.parquet")
    message = rf"t\.parquet: row group 0: column {column!r} is no valid field extension \({why}\): rename it with fields="
    with pytest.raises(shardkit.SampleError, match=message):
        shardkit.pile(str(tmp_path / "t.parquet"), tmp_path / "out", piles=2, quiet=True)


def test_hugging_face_images_named_by_path_are_written_as_their_bytes(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the hf extra (datasets) is not installed")
    for i in range(3):
        (tmp_path / f"{i}.png").write_bytes(_png(i))
    # what load_dataset("imagefolder") gives: {"bytes": None, "path": ...} until the dataset is saved
    ds = datasets.Dataset.from_dict({"image": [str(tmp_path / f"{i}.png") for i in range(3)]}).cast_column("image", datasets.Image())
    shardkit.pile(ds, tmp_path / "out", piles=1, quiet=True)
    assert {k: s["image"] for k, s in samples(tmp_path / "out").items()} == {f"{i:09d}": _png(i) for i in range(3)}
    (tmp_path / "1.png").unlink()
    with pytest.raises(shardkit.SampleError, match=r"dataset: rows 0\.\.3: cannot read a file an image or audio value names .*1\.png"):
        shardkit.pile(ds, tmp_path / "gone", piles=1, quiet=True)


def test_a_saved_dataset_folder_written_again_is_read_again(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the hf extra (datasets) is not installed")
    saved = str(tmp_path / "saved")
    datasets.Dataset.from_dict({"text": ["old"] * 3}).save_to_disk(saved)
    assert shardkit.pile(saved, tmp_path / "o1", piles=1, quiet=True).samples == 3
    datasets.Dataset.from_dict({"text": ["new"] * 5}).save_to_disk(saved)  # the same process, the same path
    assert shardkit.pile(saved, tmp_path / "o2", piles=1, quiet=True).samples == 5
    assert {s["text"] for s in samples(tmp_path / "o2").values()} == {b"new"}


def test_a_csv_quote_never_closed_is_an_error_not_a_value_holding_the_rest_of_the_file(tmp_path):
    (tmp_path / "open.csv").write_text('id,text\n1,a\n2,"never closed\n3,x\n4,y\n')
    with pytest.raises(shardkit.CorruptShardError, match=r"open\.csv: line 3: unexpected end of data"):
        shardkit.pile(str(tmp_path / "open.csv"), tmp_path / "out", piles=1, quiet=True)
    (tmp_path / "closed.csv").write_text('id,text\n1,"two\nlines"\n2,"a ""quote"""\n')
    assert samples_of(tmp_path, "closed.csv") == {
        "closed/000000000": {"id": b"1", "text": b"two\nlines"},
        "closed/000000001": {"id": b"2", "text": b'a "quote"'},
    }


def test_tsv_quotes_in_the_text_are_an_error_naming_the_way_to_read_them_as_text(tmp_path):
    """A quote that opens a value and is followed by more text: refused (strict), with
    quotes=False named, which keeps every quote as text."""
    (tmp_path / "said.tsv").write_text('id\ttext\n1\t"Hello" she said\n2\t5" screen\n3\t"open\n')
    with pytest.raises(shardkit.CorruptShardError, match=r"said\.tsv: line 2: .*read with quotes=False \(--reader-arg quotes=false\)"):
        shardkit.pile(str(tmp_path / "said.tsv"), tmp_path / "out", piles=1, quiet=True)
    shardkit.pile(str(tmp_path / "said.tsv"), tmp_path / "out2", piles=1, quiet=True, format=make("csv", quotes=False))
    assert samples(tmp_path / "out2") == {
        "said/000000000": {"id": b"1", "text": b'"Hello" she said'},
        "said/000000001": {"id": b"2", "text": b'5" screen'},
        "said/000000002": {"id": b"3", "text": b'"open'},
    }
    with pytest.raises(shardkit.ConfigError, match="quotes: expected True or False, got 'no'"):
        make("csv", quotes="no")


def test_parquet_columns_not_chosen_may_still_be_named_in_fields_and_encode(tmp_path):
    t = pa.table({"id": [1, 2], "caption": ["a", "b"], "img": [b"x", b"y"]})
    pq.write_table(t, tmp_path / "t.parquet")
    # one fields/encode mapping for several jobs, some of which leave a column out: as the Arrow reader takes it
    reader = make("parquet", columns=["id", "caption"], fields={"img": "jpg"}, encode={"img": "bytes"})
    shardkit.pile(str(tmp_path / "t.parquet"), tmp_path / "out", piles=1, quiet=True, format=reader)
    assert samples(tmp_path / "out")["t/000000001"] == {"caption": b"b", "id": b"2"}


def test_a_metadata_column_chosen_by_name_is_refused_not_dropped(tmp_path):
    pq.write_table(pa.table({"id": [1, 2], "__url__": ["u1", "u2"]}), tmp_path / "t.parquet")
    message = r"t\.parquet: row group 0: column '__url__' is no valid field extension \('__' marks metadata, which is not written\)"
    with pytest.raises(shardkit.SampleError, match=message):
        shardkit.pile(str(tmp_path / "t.parquet"), tmp_path / "out", piles=2, quiet=True, format=make("parquet", columns=["id", "__url__"]))
    reader = make("parquet", columns=["id", "__url__"], fields={"__url__": "url"})
    shardkit.pile(str(tmp_path / "t.parquet"), tmp_path / "out", piles=1, quiet=True, format=reader)
    assert samples(tmp_path / "out")["t/000000001"] == {"id": b"2", "url": b"u2"}


@pytest.mark.parametrize("where", ["one file", "two files"])
def test_a_key_column_that_repeats_a_value_is_named_in_the_advice(tmp_path, where):
    """The key_prefix advice of shard inputs is refused for readers: a repeat under key= names the column instead."""
    ids = [["a", "a"]] if where == "one file" else [["a", "b"], ["b", "c"]]
    for k, values in enumerate(ids):
        pq.write_table(pa.table({"id": values, "x": list(range(len(values)))}), tmp_path / f"{k}.parquet")
    with pytest.raises(shardkit.SampleError, match="keys must be unique") as e:
        shardkit.pile(str(tmp_path / "*.parquet"), str(tmp_path / "out"), piles=2, format=make("parquet", key="id"), quiet=True)
    assert "this reader takes them from the column 'id'" in str(e.value) and "key_prefix" not in str(e.value)


def test_a_streaming_hugging_face_dataset_is_refused_by_name(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the hf extra (datasets) is not installed")
    stream = datasets.Dataset.from_dict({"x": [1, 2, 3]}).to_iterable_dataset()
    for given, name in ((stream, "IterableDataset"), (datasets.IterableDatasetDict({"train": stream}), "IterableDatasetDict")):
        with pytest.raises(shardkit.ConfigError, match=rf"inputs: datasets\.{name} \(streaming=True\) cannot be piled"):
            shardkit.pile(given, str(tmp_path / "out"), piles=2, quiet=True)
    assert not (tmp_path / "out").exists()


def test_a_tar_read_as_csv_is_an_error_of_one_short_line(tmp_path):
    # a tar named with format: csv has its first header block as the CSV's header row: the error
    # named that 'column' whole, NUL bytes and all (345 KB for three small shards)
    import tarfile

    shard = tmp_path / "in-000000.tar"
    with tarfile.open(shard, "w") as tar:
        for name, data in (("in-000000/000000.cls", b"1"), ("in-000000/000000.txt", b"x" * 10_000)):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    with pytest.raises(shardkit.SampleError) as info:
        shardkit.pile(str(shard), tmp_path / "out", piles=1, quiet=True, format="csv")
    message = str(info.value)
    assert len(message) < 400 and "\n" not in message, message
    assert "is no valid field extension" in message and "in-000000.tar: column 'in-000000/000000.cls\\x00" in message
