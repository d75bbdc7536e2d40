"""Built-in transforms: image folders, JSON lines and shards, each unit to samples."""

from __future__ import annotations

import gzip
import io
import re

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

import shardkit
from shardkit.piles.transforms import Images, JsonLines, Shards, get, prepare, sample_key


def _image(path, size=(40, 20), color=(200, 30, 30), fmt="PNG") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size[1], size[0], 3), color, dtype=np.uint8)).save(path, format=fmt)


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "imgs"
    _image(root / "dog" / "b.png")
    _image(root / "cat" / "a.1.png", size=(10, 30))
    _image(root / "cat" / "sub" / "c.jpg", fmt="JPEG")
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / ".hidden").mkdir()
    return root


def test_images_scan_resize_and_fields(folder):
    images = Images(size=8, images_per_unit=2)
    units, extra = images.prepare([str(folder)])
    assert extra == {"classes": ["cat", "dog"], "class_check": {"index": "cls", "name": "json.class"}}
    assert [[(rel, name, idx) for _, rel, name, idx in unit] for unit in units] == [
        [("cat/a.1.png", "cat", 0), ("cat/sub/c.jpg", "cat", 0)],
        [("dog/b.png", "dog", 1)],
    ]
    samples = [s for unit in units for s in images(unit)]
    assert [s["__key__"] for s in samples] == ["cat/a_1", "cat/sub/c", "dog/b"]
    assert [s["cls"] for s in samples] == [0, 0, 1]
    assert samples[0]["json"] == {"path": "cat/a.1.png", "class": "cat"}
    decoded = [Image.open(io.BytesIO(s["jpg"])) for s in samples]
    assert [d.format for d in decoded] == ["JPEG"] * 3
    assert [d.size for d in decoded] == [(8, 24), (16, 8), (16, 8)]  # short side 8, aspect kept


def test_images_size_zero_keeps_the_size(folder):
    images = Images(size=0)
    sample = next(images(images.units([str(folder)])[0]))
    assert Image.open(io.BytesIO(sample["jpg"])).size == (10, 30)


def test_images_errors(folder, tmp_path):
    _image(folder / "cat" / "a.1.jpg")  # same key as a.1.png
    with pytest.raises(shardkit.ConfigError, match="would both get the sample key 'cat/a_1'"):
        Images().units([str(folder)])
    with pytest.raises(shardkit.DatasetNotFoundError, match="no such folder"):
        Images().units([str(tmp_path / "missing")])
    (tmp_path / "a.jsonl").write_text("{}\n")
    with pytest.raises(
        shardkit.DatasetNotFoundError, match=r"a\.jsonl: a file, not a folder: expected a folder of one subfolder per class"
    ):
        Images().units([str(tmp_path / "a.jsonl")])
    (tmp_path / "flat").mkdir()
    with pytest.raises(shardkit.DatasetNotFoundError, match="expected one subfolder per class"):
        Images().units([str(tmp_path / "flat")])
    broken = tmp_path / "b" / "x" / "bad.jpg"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"\xff\xd8 not really a jpeg")
    images = Images()
    with pytest.raises(shardkit.SampleError, match=r"bad\.jpg: cannot read image"):
        list(images(images.units([str(tmp_path / "b")])[0]))
    with pytest.raises(shardkit.ConfigError, match="quality: expected an integer between 1 and 100, got 0"):
        Images(quality=0)


def test_jsonl_records_keys_blank_lines_and_gzip(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"id": "x1", "v": 1.50}\n\n  {"v": 2}\n')
    (tmp_path / "part.1.jsonl.gz").write_bytes(gzip.compress(b'{"__key__": "k", "id": "no"}\n{}\n'))
    jsonl = JsonLines()
    units = jsonl.units([str(tmp_path / "*.jsonl*")])
    samples = [s for unit in units for s in jsonl(unit)]
    assert [(s["__key__"], s["json"]) for s in samples] == [
        ("x1", b'{"id": "x1", "v": 1.50}'),  # the line as written: 1.50 stays 1.50
        ("a-000000003", b'{"v": 2}'),
        ("k", b'{"__key__": "k", "id": "no"}'),
        ("part_1-000000002", b"{}"),
    ]
    (tmp_path / "b.jsonl").write_text('{"n": 7}\n{"n": "x"}\n')
    keyed = JsonLines(key="n")
    assert [s["__key__"] for s in keyed(str(tmp_path / "b.jsonl"))] == ["7", "x"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"v": 1}\n{"v": \n', r"a\.jsonl: line 2: not valid JSON"),
        ("[1, 2]\n", r"a\.jsonl: line 1: expected a JSON object, got list"),
        ('{"id": 1}\n\n{"id": 1}\n', r"a\.jsonl: line 3: key '1' was already used on line 1"),
        ('{"id": "a"}\n{"id": "b.c"}\n', r"a\.jsonl: line 2: key field 'id': sample key 'b\.c' has a dot"),
        ('{"__key__": "x/../y"}\n', r"a\.jsonl: line 1: key field '__key__': sample key 'x/\.\./y': no leading '/', empty or '\.\.'"),
        # json.loads refuses these with ValueError and RecursionError, not JSONDecodeError
        ('{"v": 1}\n{"v": ' + "9" * 5000 + "}\n", r"a\.jsonl: line 2: not valid JSON \(Exceeds the limit"),
        ('{"v": ' + "[" * 100_000 + "]" * 100_000 + "}\n", r"a\.jsonl: line 1: not valid JSON \(maximum recursion depth"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path, text, message):
    (tmp_path / "a.jsonl").write_text(text)
    with pytest.raises(shardkit.SampleError, match=message):
        list(JsonLines()(str(tmp_path / "a.jsonl")))


@pytest.mark.parametrize(
    ("data", "line"),
    [(gzip.compress(b'{"v": 1}\n' * 2000)[:-20], r"line \d+"), (b'{"v": 1}\n', "line 1")],
    ids=["truncated", "not-gzip"],
)
def test_a_damaged_jsonl_gz_is_corrupt_naming_file_and_line(tmp_path, data, line):
    (tmp_path / "a.jsonl.gz").write_bytes(data)
    with pytest.raises(shardkit.CorruptShardError, match=rf"a\.jsonl\.gz: {line}: not valid gzip: corrupt or truncated \(.+\)"):
        list(JsonLines()(str(tmp_path / "a.jsonl.gz")))


@pytest.mark.parametrize(
    ("text", "key", "field", "got"),
    [
        ('{"id": [1, 2]}\n', None, "id", "a list"),
        ('{"id": {"x": 1}}\n', None, "id", "a mapping"),
        ('{"id": true}\n', None, "id", "True"),
        ('{"__key__": [1], "id": "x"}\n', None, "__key__", "a list"),  # a bad __key__ is refused, not passed over
        ('{"v": 1.5}\n', "v", "v", "1.5"),  # a dot would end the key early
    ],
)
def test_jsonl_keys_are_strings_or_integers_like_a_key_column(tmp_path, text, key, field, got):
    (tmp_path / "a.jsonl").write_text(text)
    message = rf"a\.jsonl: line 1: key field '{field}': expected a non-empty string or an integer, got {re.escape(got)}$"
    with pytest.raises(shardkit.SampleError, match=message):
        list(JsonLines(key=key)(str(tmp_path / "a.jsonl")))


def test_jsonl_key_field_must_be_present(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"v": 1}\n')
    with pytest.raises(shardkit.SampleError, match="line 1: record has no 'id' field"):
        list(JsonLines(key="id")(str(tmp_path / "a.jsonl")))


def test_shards_pass_samples_on_raw(tmp_path, samples):
    with wds.TarWriter(str(tmp_path / "s.tar")) as w:
        for s in samples[:5]:
            w.write(s)
    shards = Shards()
    (unit,) = shards.units([str(tmp_path / "s.tar")])
    got = list(shards(unit))
    assert [(g["__key__"], g["bin"]) for g in got] == [(s["__key__"], s["bin"]) for s in samples[:5]]


def test_get_names_unknown_transforms_and_arguments():
    assert get("images", size=3) == Images(size=3)
    with pytest.raises(shardkit.ConfigError, match="expected one of images, jsonl, shards, got 'video'"):
        get("video")
    with pytest.raises(shardkit.ConfigError, match="colour: unknown argument for transform 'shards' \\(it takes none\\)"):
        get("shards", colour=1)


@pytest.mark.parametrize(("path", "key"), [("a/b.c/d.e.jpg", "a/b_c/d_e"), ("x.png", "x"), ("noext", "noext")])
def test_sample_key(path, key):
    assert sample_key(path) == key


def test_the_documented_prepare_is_importable_from_shardkit_transforms():
    # docs/labels-and-keys.md names shardkit.transforms.prepare for an append that keeps the class map
    import shardkit.transforms

    assert shardkit.transforms.prepare is prepare
