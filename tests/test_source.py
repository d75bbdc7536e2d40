"""What a loader reads: piles by their manifest, the plain shards people have, and clear words when neither."""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import subprocess
import tarfile

import pytest
import webdataset as wds

import shardkit
from shardkit.loading import source as sources


def read_keys(src, **options) -> list[str]:
    with shardkit.loader(src, decode=False, shuffle=False, **options) as loader:
        return [s["__key__"] for s in loader]


def wds_keys(url: str) -> list[tuple[str, list[str]]]:
    return [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in wds.WebDataset(url, shardshuffle=False)]


def shardkit_samples(url: str) -> list[tuple[str, list[str]]]:
    with shardkit.loader(url, decode=False, shuffle=False) as loader:
        return [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in loader]


def tar_of(path, members: list[tuple[str, bytes | None]], fmt: int = tarfile.GNU_FORMAT) -> str:
    """A tar made by Python's tarfile; a member whose data is None is a directory."""
    with tarfile.open(path, "w", format=fmt, encoding="utf-8", errors="surrogateescape") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
            else:
                info.size = len(data)
            tf.addfile(info, None if data is None else io.BytesIO(data))
    return str(path)


# ---- the shards people have -----------------------------------------------------------------


def test_a_tar_made_with_tar_cf_of_a_directory_reads_as_webdataset_reads_it(tmp_path):
    if shutil.which("tar") is None:
        pytest.skip("no tar binary on this machine")
    src = tmp_path / "src"
    for name, data in {"0001.jpg": b"j1", "0001.cls": b"1", "0002.jpg": b"j2", "0002.cls": b"2", "more/0003.jpg": b"j3"}.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    url = str(tmp_path / "x.tar")
    subprocess.run(["tar", "cf", url, "--sort=name", "-C", str(src), "."], check=True)  # './', './more/' get entries
    assert shardkit_samples(url) == wds_keys(url) == [("./0001", ["cls", "jpg"]), ("./0002", ["cls", "jpg"]), ("./more/0003", ["jpg"])]
    m = shardkit.pile(url, tmp_path / "piles", piles=2, quiet=True)
    assert m.samples == 3 and shardkit.verify(str(tmp_path / "piles"), quiet=True) == []


def test_a_gnu_tar_that_starts_with_its_directory_reads_as_webdataset_reads_it(tmp_path):
    # the shape of one of webdataset's own test shards: a GNU tar whose first entry is the directory
    url = tar_of(tmp_path / "compressed.tar", [("compressed/", None)] + [(f"compressed/000{i}.txt.gz", b"gz") for i in (1, 2, 3)])
    assert shardkit_samples(url) == wds_keys(url) == [(f"compressed/000{i}", ["txt.gz"]) for i in (1, 2, 3)]


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE])
def test_links_and_fifos_stay_refused(tmp_path, kind):
    url = str(tmp_path / "odd.tar")
    with tarfile.open(url, "w", format=tarfile.GNU_FORMAT) as tf:
        info = tarfile.TarInfo("a.txt")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
        odd = tarfile.TarInfo("b.txt")
        odd.type, odd.linkname = kind, "a.txt"
        tf.addfile(odd)
    with pytest.raises(shardkit.CorruptShardError, match=r"odd\.tar: member 1 \('b\.txt'\) at offset 1024: expected a regular file"):
        read_keys(url)


def test_a_name_that_is_not_utf8_reads_as_webdataset_reads_it(tmp_path):
    url = tar_of(tmp_path / "latin1.tar", [("caf\udce9.txt", b"x"), ("caf\udce9.cls", b"1"), ("na\u00efve.txt", b"y")])
    assert shardkit_samples(url) == wds_keys(url) == [("caf\udce9", ["cls", "txt"]), ("na\u00efve", ["txt"])]


# ---- a key whose members are not adjacent ---------------------------------------------------


def test_a_plain_shard_whose_members_of_one_key_are_not_adjacent_is_refused(tmp_path):
    # a reader would hand out two half samples of "a"; webdataset does, silently
    url = tar_of(tmp_path / "split.tar", [("a.bin", b"1"), ("b.bin", b"2"), ("a.txt", b"3")])
    assert [k for k, _ in wds_keys(url)] == ["a", "b", "a"]
    message = r"split\.tar: sample 2 \(offset 2048\) has the key 'a' of sample 0 \(offset 0\): keys must be unique, and the members of one sample adjacent"
    with pytest.raises(shardkit.CorruptShardError, match=message):
        shardkit.loader(url)  # found when the shard is first indexed, to count its samples
    with pytest.raises(shardkit.CorruptShardError, match=message):
        shardkit.pile(url, tmp_path / "piles", piles=1, quiet=True)


def test_a_plain_shard_changed_to_repeat_a_key_is_refused_when_read(tmp_path):
    url = tar_of(tmp_path / "s.tar", [("a.bin", b"1"), ("b.bin", b"2"), ("c.bin", b"3")])
    src = sources.resolve(url)
    tar_of(tmp_path / "s.tar", [("a.bin", b"1"), ("b.bin", b"2"), ("a.txt", b"3")])
    with pytest.raises(shardkit.CorruptShardError, match=r"s\.tar: sample 2 \(offset 2048\) has the key 'a' of sample 0"):
        src.open(0, src.fetch(0))


def test_piles_are_not_checked_again_when_read(dataset, monkeypatch):
    from shardkit.tar import keys

    monkeypatch.setattr(keys, "first_repeat", lambda k: pytest.fail("a pile was checked for repeated keys"))
    assert len(read_keys(dataset)) == 200


# ---- saying what is read ----------------------------------------------------------------------


def test_plain_shards_log_one_warning_with_the_command_that_makes_piles(tmp_path, caplog):
    for k in range(3):
        tar_of(tmp_path / f"s-{k}.tar", [(f"{k}-{i}.bin", b"x") for i in range(4)])
    pattern = str(tmp_path / "s-*.tar")
    with caplog.at_level(logging.WARNING, logger="shardkit.loading"), shardkit.loader(pattern, decode=False) as loader:
        assert len(list(loader)) == 12
        assert len(list(loader)) == 12  # a second epoch says nothing more
    (record,) = caplog.records
    assert record.name == "shardkit.loading.source"
    assert "shuffled only within the shards' bounds" in record.getMessage()
    assert f"shardkit pile '{pattern}' -o DIR --piles M" in record.getMessage()


def test_piles_log_no_warning(dataset, caplog):
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        read_keys(dataset)
    assert caplog.records == []


def test_a_directory_without_a_manifest_says_what_it_holds(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        shardkit.DatasetNotFoundError, match=r"empty: no shardkit\.json here, so it is not a shardkit dataset, and the directory is empty"
    ):
        shardkit.loader(str(empty))
    shards = tmp_path / "shards"
    shards.mkdir()
    for k in range(5):
        tar_of(shards / f"train-{k}.tar", [(f"{k}.bin", b"x")])
    (shards / "README").write_text("hi")
    pattern = os.path.join(shards, "*.tar")
    with pytest.raises(shardkit.DatasetNotFoundError) as e:
        shardkit.loader(str(shards))
    assert str(e.value) == (
        f"{shards}: no shardkit.json here, so it is not a shardkit dataset; it holds 5 tar shards (train-0.tar, train-1.tar, "
        f"train-2.tar, ...) and 1 other entry (README): pass them as a glob like '{pattern}' to read them as plain shards, or "
        f"make piles with shardkit pile '{pattern}' -o DIR --piles M"
    )
    assert len(read_keys(pattern)) == 5  # as it says


def test_a_directory_of_piles_without_a_manifest_is_an_unfinished_job(tmp_path, dataset):
    os.unlink(os.path.join(dataset, "shardkit.json"))
    with pytest.raises(shardkit.DatasetNotFoundError, match=r"holds 8 tar shards \(pile-000000\.tar, .*a pile job that did not finish"):
        shardkit.loader(dataset)


def test_a_missing_directory_is_still_no_such_file(tmp_path):
    with pytest.raises(shardkit.DatasetNotFoundError, match=r"missing: no such file"):
        shardkit.loader(str(tmp_path / "missing"))


def test_a_manifest_given_as_the_source_names_the_directory_to_pass(dataset):
    with pytest.raises(shardkit.ConfigError) as e:
        shardkit.loader(os.path.join(dataset, "shardkit.json"))
    assert str(e.value) == f"{dataset}/shardkit.json: a dataset's manifest, not a shard: pass the dataset's directory, {dataset}"


def test_a_file_that_is_no_tar_at_all_is_named_as_such(tmp_path):
    """A text file or random bytes under a .tar name: the error names the file and the first
    header, and says a tar header was expected there."""
    notes, blob = tmp_path / "notes.tar", tmp_path / "blob.tar"
    notes.write_text("hello world\n")
    blob.write_bytes(bytes(range(256)) * 80)
    for path, what in ((notes, "archive is truncated inside a header"), (blob, r"size field .* is not an unsigned octal number")):
        with pytest.raises(shardkit.CorruptShardError) as e:
            shardkit.loader(str(path))
        assert re.fullmatch(
            rf"{re.escape(str(path))}: member 0 at offset 0: {what}; expected a tar header at the start of the file: "
            r"is it a tar archive\? \(a WebDataset shard is one\)",
            str(e.value),
        ), str(e.value)


def test_a_missing_path_says_what_was_expected(tmp_path):
    with pytest.raises(shardkit.DatasetNotFoundError, match=r"missing: no such file or directory \(expected a shardkit dataset"):
        shardkit.loader(str(tmp_path / "missing"))
    with pytest.raises(shardkit.DatasetNotFoundError, match=r"missing\.tar: no such file$"):  # a shard's name: a shard was meant
        shardkit.loader(str(tmp_path / "missing.tar"))
