"""shardkit.json: round trip, and every malformed field is named in its error."""

from __future__ import annotations

import json

import pytest

from shardkit import manifest
from shardkit.errors import DatasetNotFoundError, ManifestError
from shardkit.manifest import Manifest, PileInfo


def example() -> Manifest:
    piles = tuple(PileInfo(name=f"pile-{i:06d}.tar", samples=10 + i, bytes=10240 * (i + 1), checksum=f"crc32:{i:08x}") for i in range(3))
    return Manifest(
        piles=piles, seed=7, fields=("cls", "jpg"), created_by="shardkit test", skipped_units=1, split_piles=0, extra={"classes": ["a"]}
    )


def test_round_trip_through_json_and_disk(tmp_path):
    m = example()
    assert manifest.parse(m.to_json(), "x") == m
    assert not manifest.is_dataset(str(tmp_path))
    manifest.write(str(tmp_path), m)
    assert manifest.is_dataset(str(tmp_path))
    assert manifest.read(str(tmp_path)) == m
    assert m.samples == 33 and m.bytes == 61440
    doc = json.loads(m.to_json())
    assert doc["format"] == "shardkit" and doc["format_version"] == manifest.FORMAT_VERSION and doc["samples"] == 33


def test_checksum_runs_on():
    assert manifest.checksum(b"abcdef") == manifest.checksum(b"def", manifest.checksum(b"abc"))
    assert manifest.format_checksum(0xABC) == "crc32:00000abc"


def mutated(change) -> str:
    doc = json.loads(example().to_json())
    change(doc)
    return json.dumps(doc)


def _delete(*path):
    def change(doc):
        for key in path[:-1]:
            doc = doc[key]
        del doc[path[-1]]

    return change


def _set(value, *path):
    def change(doc):
        for key in path[:-1]:
            doc = doc[key]
        doc[path[-1]] = value

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_delete("seed"), r"m.json: missing field 'seed'"),
        (_set("7", "seed"), r"m.json: field 'seed': expected int, got '7'"),
        (_set(True, "seed"), r"m.json: field 'seed': expected int, got True"),
        (_delete("piles"), r"m.json: missing field 'piles'"),
        (_set({}, "piles"), r"m.json: field 'piles': expected list, got \{\}"),
        (_set("x", "piles", 1), r"m.json: piles\[1\]: expected an object, got 'x'"),
        (_delete("piles", 0, "name"), r"m.json: piles\[0\]: missing field 'name'"),
        (_set("../x.tar", "piles", 2, "name"), r"m.json: piles\[2\]: pile name '../x.tar' must be a plain file name"),
        (_set(-1.5, "piles", 0, "samples"), r"m.json: piles\[0\]: field 'samples': expected int, got -1.5"),
        (_set("10", "piles", 1, "bytes"), r"m.json: piles\[1\]: field 'bytes': expected int, got '10'"),
        (_set(5, "piles", 0, "checksum"), r"m.json: piles\[0\]: field 'checksum': expected str, got 5"),
        (_delete("fields"), r"m.json: missing field 'fields'"),
        (_set("other", "format"), r'm.json: not a shardkit manifest \(expected "format": "shardkit"\)'),
        (_set("1", "format_version"), r"m.json: field 'format_version': expected int"),
        (_set(99, "format_version"), r"m.json: format_version 99 is newer than this shardkit reads \(2\); upgrade shardkit"),
        (_set(34, "samples"), r"m.json: 'samples' is 34 but the piles add up to 33"),
        (_set("abc", "skipped_units"), r"m.json: field 'skipped_units': expected int, got 'abc'"),
        (_set(-1, "split_piles"), r"m.json: field 'split_piles': expected a non-negative int, got -1"),
        (_set([1, 2], "extra"), r"m.json: field 'extra': expected dict, got \[1, 2\]"),
        (_set(-5, "seed"), r"m.json: field 'seed': expected a non-negative int, got -5"),
        (_set(3, "created_by"), r"m.json: field 'created_by': expected str, got 3"),
        (_set([1, None], "fields"), r"m.json: fields\[0\]: expected str, got 1"),
        (_set(-1, "piles", 0, "samples"), r"m.json: piles\[0\]: field 'samples': expected a non-negative int, got -1"),
        (_set(-10, "piles", 2, "bytes"), r"m.json: piles\[2\]: field 'bytes': expected a non-negative int, got -10"),
        (_set("pile-000000.tar", "piles", 2, "name"), r"m.json: piles\[2\]: pile name 'pile-000000.tar' is already used by piles\[0\]"),
        (_set("", "piles", 1, "name"), r"m.json: piles\[1\]: pile name '' must be a plain file name"),
        (_set("pile-000001.tar\0", "piles", 1, "name"), r"m.json: piles\[1\]: pile name 'pile-000001.tar\\x00' must be a plain file name"),
        (_set("train.py", "piles", 1, "name"), r"m.json: piles\[1\]: pile name 'train.py' is not of the form of a dataset's files"),
        (_set("shardkit.json", "piles", 1, "name"), r"m.json: piles\[1\]: pile name 'shardkit.json' is a name the dataset keeps"),
        (
            _set(2**61, "piles", 0, "samples"),
            r"m.json: piles\[0\]: field 'samples': expected at most 1152921504606846976, got 2305843009213693952",
        ),
        (_set({"max_pile_bytes": "1GiB"}, "extra"), r"m.json: field 'extra.max_pile_bytes': expected an int from 1 to 2\*\*62, got '1GiB'"),
        (_set("md5:00000000", "piles", 0, "checksum"), r"m.json: piles\[0\]: field 'checksum': expected 'crc32:' and 8 lowercase hex"),
        (_set("crc32:0000000g", "piles", 1, "checksum"), r"m.json: piles\[1\]: field 'checksum': expected 'crc32:'"),
        (_set("9", "bytes"), r"m.json: field 'bytes': expected int, got '9'"),
        (_set(1, "bytes"), r"m.json: 'bytes' is 1 but the piles add up to 61440"),
        (
            _set(10**12, "piles", 0, "samples"),  # a reader would set aside room for that many before reading a byte
            r"m.json: piles\[0\]: 'pile-000000.tar' says 1000000000000 samples in a tar of 10240 bytes, which holds at most 20 ",
        ),
    ],
)
def test_malformed_fields_are_named(change, message):
    with pytest.raises(ManifestError, match=message):
        manifest.parse(mutated(change), "m.json")


def test_not_json_at_all():
    with pytest.raises(ManifestError, match=r"m.json: not valid JSON"):
        manifest.parse("{not json", "m.json")
    with pytest.raises(ManifestError, match=r"not a shardkit manifest"):
        manifest.parse("[1, 2]", "m.json")


def test_reading_a_directory_without_a_manifest(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=r"not a shardkit dataset \(no shardkit.json; a job that did not finish leaves none\)"):
        manifest.read(str(tmp_path))
    (tmp_path / "shardkit.json").write_bytes(b"\xff\xfe")
    with pytest.raises(ManifestError, match=r"shardkit.json: not UTF-8 text"):
        manifest.read(str(tmp_path))


def test_a_bad_manifest_is_an_error_from_the_cli_naming_the_file(tmp_path, capsys):
    from shardkit.cli import main

    (tmp_path / "shardkit.json").write_text(mutated(_set("abc", "skipped_units")))
    assert main(["info", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("shardkit info: error: ") and "shardkit.json: field 'skipped_units'" in err and "Traceback" not in err


def _leaf_example() -> Manifest:
    segments = (
        manifest.Segment(
            name="pile-000001.g000000.r4-2.tar", samples=3, bytes=4096, checksum="crc32:00000001", generation=0, resolution=4, leaf=2
        ),
        manifest.Segment(
            name="pile-000001.g000001.r4-2.tar", samples=2, bytes=3072, checksum="crc32:00000002", generation=1, resolution=4, leaf=2
        ),
    )
    return Manifest(piles=(manifest.joined(segments, "pile-000001.r4-2.tar"),), seed=3, fields=(), created_by="t", generation=1)


def test_a_segment_records_its_leaf_and_old_manifests_mean_the_whole_pile():
    m = _leaf_example()
    assert manifest.parse(m.to_json(), "m.json") == m
    doc = json.loads(m.to_json())
    assert doc["piles"][0]["segments"][0]["resolution"] == 4 and doc["piles"][0]["segments"][0]["leaf"] == 2
    for segment in doc["piles"][0]["segments"]:  # written before segments had leaves
        del segment["resolution"], segment["leaf"]
    old = manifest.parse(json.dumps(doc), "m.json")
    assert [(s.resolution, s.leaf) for s in old.piles[0].segments] == [(1, 0), (1, 0)]
    assert "resolution" not in json.dumps(json.loads(old.to_json())["piles"][0]["segments"][0])
    assert manifest.original_piles(m) == 2 and manifest.pile_number("pile-000001.r4-2.tar") == 1
    assert manifest.whole_pile("pile-000001.r4-2.tar") is None and manifest.leaf_name(1, 4, 2) == "pile-000001.r4-2.tar"


@pytest.mark.parametrize(
    ("resolution", "leaf", "message"),
    [
        (3, 0, r"segments\[0\]: field 'resolution': expected a power of two \(1, 2, 4, ...\), got 3"),
        (0, 0, r"segments\[0\]: field 'resolution': expected a power of two \(1, 2, 4, ...\), got 0"),
        ("4", 0, r"segments\[0\]: field 'resolution': expected int, got '4'"),
        (4, 4, r"segments\[0\]: field 'leaf': expected 0 to 3 \(below its resolution 4\), got 4"),
        (4, -1, r"segments\[0\]: field 'leaf': expected a non-negative int, got -1"),
    ],
)
def test_a_bad_leaf_is_named(resolution, leaf, message):
    doc = json.loads(_leaf_example().to_json())
    doc["piles"][0]["segments"][0].update(resolution=resolution, leaf=leaf)
    with pytest.raises(ManifestError, match=r"m.json: piles\[0\]: " + message):
        manifest.parse(json.dumps(doc), "m.json")
