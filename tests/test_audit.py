"""shardkit info / verify: the summary, and each kind of damage verify must find."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import numpy as np
import pytest

import shardkit
from shardkit import manifest, storage
from shardkit.cli import main
from shardkit.errors import StorageError
from shardkit.tools.audit import info, verify


def _pile(dataset: str, i: int = 2) -> str:
    return os.path.join(dataset, manifest.read(dataset).piles[i].name)


def _flip(path: str, offset: int, mask: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


def _kinds(dataset: str) -> list[tuple[str, str]]:
    return [(p.name, p.kind) for p in verify(dataset, quiet=True)]


def test_info_summarises_the_manifest(dataset):
    m = manifest.read(dataset)
    summary = info(dataset)
    assert (summary.samples, summary.piles, summary.fields, summary.seed) == (200, 8, ("bin", "cls"), 3)
    assert summary.bytes == sum(p.bytes for p in m.piles)
    counts = [p.samples for p in m.piles]
    assert (summary.pile_samples.min, summary.pile_samples.max) == (min(counts), max(counts))
    assert summary.pile_samples.mean == 25.0 == summary.expected_mean
    assert summary.expected_sd == pytest.approx(math.sqrt(25 * (1 - 1 / 8)))
    largest = sorted((p.bytes for p in m.piles), reverse=True)
    assert summary.loader_ram() == largest[0] + largest[1]
    assert summary.loader_ram(mix=4) == sum(largest[:6])  # mix + 1 read from, 1 read ahead


def test_verify_clean_dataset(dataset):
    assert verify(dataset, quiet=True) == []


def test_flipped_data_byte_is_a_checksum_problem(dataset):
    path = _pile(dataset)
    _flip(path, 512 + 10, 0xFF)  # inside the first member's payload: the tar is still well formed
    assert _kinds(dataset) == [(os.path.basename(path), "checksum")]


def test_flipped_header_byte_is_found_by_the_tar_walk(dataset):
    path = _pile(dataset)
    _flip(path, 3, 0x01)  # a letter of the first member's name: the header checksum no longer holds
    problems = verify(dataset, quiet=True)
    assert [p.kind for p in problems] == ["checksum", "structure"]
    assert "header checksum" in problems[1].message and "offset 0" in problems[1].message


def test_truncated_pile(dataset):
    path = _pile(dataset)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 1000)
    problems = verify(dataset, quiet=True)
    assert [p.kind for p in problems][:2] == ["size", "checksum"]
    assert f"the manifest says {size} (truncated)" in problems[0].message


def test_truncated_inside_a_member_is_a_structure_problem(dataset):
    path = _pile(dataset)
    with open(path, "r+b") as f:
        f.truncate(512 + 20)  # the first member's header promises 64 bytes, 20 are left
    kinds = [p.kind for p in verify(dataset, quiet=True)]
    assert kinds == ["size", "checksum", "structure"]


def test_missing_extra_and_leftover_files(dataset):
    os.unlink(_pile(dataset, 5))
    open(os.path.join(dataset, "pile-000099.tar"), "wb").close()
    os.makedirs(os.path.join(dataset, ".shardkit-staging-abc"))
    open(os.path.join(dataset, "notes.txt"), "w").close()  # not a shard: ignored
    assert sorted(_kinds(dataset)) == [
        (".shardkit-staging-abc", "leftover"),
        ("pile-000005.tar", "missing"),
        ("pile-000099.tar", "extra"),
    ]


def test_sample_count_disagreeing_with_the_manifest(dataset):
    m = manifest.read(dataset)
    first = m.piles[0]
    wrong = shardkit.PileInfo(name=first.name, samples=first.samples + 1, bytes=first.bytes, checksum=first.checksum)
    manifest.write(dataset, shardkit.Manifest(piles=(wrong, *m.piles[1:]), seed=m.seed, fields=m.fields, created_by=m.created_by))
    problems = verify(dataset, quiet=True)
    assert [(p.name, p.kind) for p in problems] == [(first.name, "count")]
    assert f"holds {first.samples} samples, the manifest says {first.samples + 1}" in problems[0].message


def test_a_damaged_or_stale_random_access_index(dataset):
    assert len(shardkit.open(dataset).index) == 200  # built and stored beside the manifest
    path = os.path.join(dataset, "shardkit.g000000.idx")
    assert verify(dataset, quiet=True) == []
    _flip(path, os.path.getsize(path) // 2, 0x01)
    problems = verify(dataset, quiet=True)
    assert [(p.name, p.kind) for p in problems] == [("shardkit.g000000.idx", "index")]
    assert "checksum does not match its bytes" in problems[0].message and not problems[0].warning
    assert len(shardkit.open(dataset).index) == 200  # rebuilt whole; then the manifest of generation 0 is another one
    m = manifest.read(dataset)
    manifest.write(dataset, dataclasses.replace(m, created_by="another writer"))
    problems = verify(dataset, quiet=True)
    assert [(p.name, p.kind) for p in problems] == [("shardkit.g000000.idx", "index")]
    assert "header manifest=" in problems[0].message


def test_a_random_access_index_the_store_does_not_answer_for_is_unreadable_not_damaged(dataset, monkeypatch):
    """A failed read (unreachable, throttled) says so, and does not advise deleting an index that may be whole."""
    assert len(shardkit.open(dataset).index) == 200
    real = storage.read_bytes

    def failing(url, *args, **kwargs):
        if url.endswith(".idx"):
            raise StorageError(f"{url}: cannot read: EndpointConnectionError: could not connect", url=url)
        return real(url, *args, **kwargs)

    monkeypatch.setattr(storage, "read_bytes", failing)
    problems = verify(dataset, quiet=True)
    assert [(p.name, p.kind) for p in problems] == [("shardkit.g000000.idx", "unreadable")]
    assert problems[0].message == "cannot read: EndpointConnectionError: could not connect"


def test_cli_verify_exit_codes(dataset, capsys):
    assert main(["verify", "-q", dataset]) == 0
    os.unlink(_pile(dataset, 1))
    assert main(["verify", "-q", dataset]) == 1
    out, err = capsys.readouterr()
    assert "pile-000001.tar: listed in the manifest but the file does not exist" in out
    assert err.strip() == f"shardkit verify: error: 1 problem(s) found in {dataset}"


def test_cli_info_table_and_json(dataset, capsys):
    assert main(["info", dataset]) == 0
    table = capsys.readouterr().out
    assert "samples       200" in table and "binomial    mean 25.0" in table and "loader RAM" in table
    assert main(["info", "--json", dataset]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["samples"] == 200 and doc["pile_samples"]["expected_mean"] == 25.0
    assert doc["loader_ram"]["mix=1"] == info(dataset).loader_ram()


def test_cli_on_a_directory_without_a_dataset(tmp_path, capsys):
    assert main(["verify", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("shardkit verify: error: ") and "not a shardkit dataset" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["-v", "verify"], ["verify", "-v"], ["-v", "info"], ["info", "-vv"]])
def test_verbose_before_or_after_the_command_shows_the_traceback(tmp_path, argv, capsys):
    assert main([*argv, str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "DatasetNotFoundError" in err
    assert err.splitlines()[-1].startswith(f"shardkit {argv[0] if argv[0] != '-v' else argv[1]}: error: ")


def test_no_progress_bar_when_stderr_is_not_a_terminal(dataset, capsys):
    assert main(["verify", dataset]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{dataset}: ok\n" and captured.err == ""


def test_a_pile_that_cannot_be_read(dataset):
    path = _pile(dataset, 3)
    os.unlink(path)
    os.mkdir(path)  # a directory where the pile should be
    assert _kinds(dataset) == [(os.path.basename(path), "unreadable")]


def write_pile_by_hand(out: str, keys: list[str]) -> None:
    """A one-pile dataset holding ``keys`` in order (one member of 1024 bytes each), as no
    writer of shardkit's makes it: they all refuse a key repeated in a pile."""
    from shardkit.tar import write as tarwrite

    data = b"".join(tarwrite.member(f"{key}.cls", str(i).encode()) for i, key in enumerate(keys)) + tarwrite.TRAILER
    os.makedirs(out)
    with open(os.path.join(out, "pile-000000.tar"), "wb") as f:
        f.write(data)
    info = manifest.PileInfo(
        name="pile-000000.tar", samples=len(keys), bytes=len(data), checksum=manifest.format_checksum(manifest.checksum(data))
    )
    manifest.write(out, manifest.Manifest(piles=(info,), seed=0, fields=("cls",), created_by="test"))


def write_piles_by_hand(out: str, piles: list[list[str]]) -> None:
    """A dataset of several piles holding these keys in order, one member each (as no writer of
    shardkit's makes it when a key is in two piles)."""
    from shardkit.tar import write as tarwrite

    os.makedirs(out)
    infos = []
    for p, keys in enumerate(piles):
        data = b"".join(tarwrite.member(f"{key}.cls", str(i).encode()) for i, key in enumerate(keys)) + tarwrite.TRAILER
        name = f"pile-{p:06d}.tar"
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        checksum = manifest.format_checksum(manifest.checksum(data))
        infos.append(manifest.PileInfo(name=name, samples=len(keys), bytes=len(data), checksum=checksum))
    manifest.write(out, manifest.Manifest(piles=tuple(infos), seed=0, fields=("cls",), created_by="test"))


@pytest.mark.parametrize("memory", [256 << 20, 16])
def test_a_key_in_two_piles_is_listed_with_both_piles(tmp_path, monkeypatch, memory):
    from shardkit.piles import unique_keys

    monkeypatch.setattr(unique_keys, "CHECK_MEMORY", memory)  # 16 bytes: the hashes go to a bucket file for each value of the top bits
    out = str(tmp_path / "two")
    write_piles_by_hand(out, [["a", "b", "c"], ["d", "b", "e"], ["f", "g", "a", "b"]])
    problems = verify(out, quiet=True)
    assert [(p.name, p.kind, p.message) for p in problems] == [
        (
            "pile-000001.tar",
            "duplicate",
            "sample 1 (offset 1024) has the key 'b' of pile-000000.tar's sample 1 (offset 1024): keys must be unique",
        ),
        (
            "pile-000002.tar",
            "duplicate",
            "sample 2 (offset 2048) has the key 'a' of pile-000000.tar's sample 0 (offset 0): keys must be unique",
        ),
    ]
    assert main(["verify", out, "--quiet"]) == 1
    clean = str(tmp_path / "clean")
    write_piles_by_hand(clean, [["a", "b"], ["c", "d"], []])
    assert verify(clean, quiet=True) == []


def test_keys_whose_hashes_meet_in_two_piles_are_compared_themselves(tmp_path, monkeypatch):
    from shardkit.tools import audit

    monkeypatch.setattr(audit, "hashes", lambda keys: np.zeros(len(keys), dtype=np.uint64))  # every key hashes alike
    out = str(tmp_path / "ds")
    write_piles_by_hand(out, [["a", "b"], ["c", "d"]])
    assert verify(out, quiet=True) == []


def test_duplicate_keys_are_listed_with_both_positions(tmp_path):
    out = str(tmp_path / "dup")
    write_pile_by_hand(out, [f"k{i % 5}" for i in range(30)])
    problems = verify(out, quiet=True)
    assert [p.kind for p in problems] == ["duplicate"] * 11
    assert problems[0].name == "pile-000000.tar"
    assert problems[0].message == "sample 5 (offset 5120) has the key 'k0' of sample 0 (offset 0): keys must be unique"
    assert problems[9].message.startswith("sample 14 (offset 14336) has the key 'k4' of sample 4 (offset 4096)")
    assert problems[10].message == "15 more samples repeat a key of an earlier sample"
    assert main(["verify", out, "--quiet"]) == 1


def test_writers_refuse_a_repeated_key_with_the_message_verify_gives(tmp_path):
    keys = ["a", "b", "c", "a"]
    write_pile_by_hand(str(tmp_path / "by-hand"), keys)
    (said,) = [p.message for p in verify(str(tmp_path / "by-hand"), quiet=True)]
    assert said == "sample 3 (offset 3072) has the key 'a' of sample 0 (offset 0): keys must be unique"
    with pytest.raises(shardkit.SampleError) as refused, shardkit.PileWriter(tmp_path / "writer", piles=1) as w:
        for i, key in enumerate(keys):
            w.write({"__key__": key, "cls": i})
    assert str(refused.value).startswith(f"pile 0: {said} across all inputs")
    with pytest.raises(shardkit.SampleError) as refused:
        shardkit.preprocess([keys], lambda unit: ({"__key__": k, "cls": i} for i, k in enumerate(unit)), tmp_path / "fn", piles=1)
    assert str(refused.value).startswith("input unit 0 (['a', 'b', 'c', 'a']): sample 3 has the key 'a' of sample 0: keys must be unique")
    assert not manifest.is_dataset(tmp_path / "writer") and not manifest.is_dataset(tmp_path / "fn")


def test_a_kept_manifest_that_does_not_read_is_a_problem(tmp_path, capsys):
    """A state pinned to an older generation resumes from its kept manifest: verify says when
    one cannot be read, instead of 'ok'. One collected away (no file) is no problem."""
    out = tmp_path / "ds"
    for n in range(3):  # generations 0, 1, 2
        with shardkit.PileWriter(out, piles=2, seed=0, mode="append" if n else "create") as w:
            for i in range(10):
                w.write({"__key__": f"g{n}-{i}", "txt": "x"})
    assert verify(str(out), quiet=True) == []
    (out / "shardkit.g000001.json").write_text("garbage")
    (out / "shardkit.g000000.json").unlink()
    found = [(p.name, p.kind) for p in verify(str(out), quiet=True)]
    assert found == [("shardkit.g000001.json", "generation")]
    assert main(["verify", str(out)]) == 1
    assert "shardkit.g000001.json: not valid JSON" in capsys.readouterr().out


def test_a_kept_manifest_gc_removes_while_verify_reads_is_no_problem(tmp_path, monkeypatch):
    out = tmp_path / "ds"
    for n in range(2):
        with shardkit.PileWriter(out, piles=2, seed=0, mode="append" if n else "create") as w:
            for i in range(10):
                w.write({"__key__": f"g{n}-{i}", "txt": "x"})
    from shardkit.dataset.transaction import Dataset
    from shardkit.errors import DatasetNotFoundError

    def gone(self, generation):  # listed, then removed by gc before it is read
        raise DatasetNotFoundError(f"{self.path}: generation {generation} is gone")

    monkeypatch.setattr(Dataset, "pinned", gone)
    assert [p for p in verify(str(out), quiet=True) if p.kind == "generation"] == []
