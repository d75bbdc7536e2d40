"""shardkit demo: the figures it prints are measured on a real run, and it cleans up."""

from __future__ import annotations

import os
import tempfile

import shardkit
from shardkit.cli import main
from shardkit.tools.demo import demo, make_images


def test_demo_measures_all_three_orders(tmp_path):
    result = demo(tmp_path / "out", samples=3000, piles=4, quiet=True)
    sequential, webdataset, piles = result.rows
    assert sequential.classes_per_batch < 2.2  # 300 per class: a batch straddles at most two classes
    assert piles.classes_per_batch > result.uniform_classes - 0.5 > 9
    assert sequential.classes_per_batch < webdataset.classes_per_batch < piles.classes_per_batch
    # fixed piles: pile-mates meet again next epoch about M times more often than fresh shuffles
    assert 2 < piles.recurrence < 6 < sequential.recurrence
    assert all(r.read_per_s and r.read_per_s > 0 for r in (webdataset, piles))
    assert sequential.write_per_s and piles.write_per_s and webdataset.write_per_s is None
    assert shardkit.verify(str(tmp_path / "out" / "piles"), quiet=True) == []
    assert len(os.listdir(tmp_path / "out" / "sequential")) == 10
    table = result.table()
    assert "shardkit: 4 piles, loader" in table and "webdataset: shard shuffle + buffer 1000" in table
    # every column says which way is better, and the uniform shuffle's figures stand beside the rows
    header, better = (line.split() for line in table.splitlines()[2:4])
    assert header == ["write/s", "read/s", "classes/batch", "recurrence", "read", "memory"]
    assert better == ["better", "when", "higher", "higher", "higher", "lower", "lower"]
    assert f"a uniform shuffle, for reference                 -         -  {result.uniform_classes:>13.1f}         1.0" in table
    legend = {line.split(":")[0]: line for line in table.replace("\n  ", " ").splitlines() if ": " in line}
    for column in ("write/s, read/s", "classes/batch", "recurrence", "read memory"):
        assert "is better" in legend[column], column
    # run again into the same directory: the old data is replaced, not refused
    assert demo(tmp_path / "out", samples=1000, piles=2, quiet=True).samples == 1000


def test_cli_demo_without_out_leaves_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["demo", "--samples", "1200", "--piles", "3", "-q"]) == 0
    out = capsys.readouterr().out
    assert "1,200 synthetic" in out and "classes/batch" in out and "recurrence" in out
    assert os.listdir(tmp_path) == []


def test_cli_demo_bad_value(capsys):
    assert main(["demo", "--samples", "0", "-q"]) == 1
    assert capsys.readouterr().err == "shardkit demo: error: samples: expected an integer >= 1, got 0\n"


def test_cli_demo_fewer_samples_than_a_batch_fails_before_writing(tmp_path, capsys):
    assert main(["demo", "--samples", "100", "-o", str(tmp_path / "out"), "-q"]) == 1
    message = "samples: expected at least 256 (one batch of the classes-per-batch figure), got 100"
    assert capsys.readouterr().err == f"shardkit demo: error: {message}\n"
    assert not (tmp_path / "out").exists()


def test_images_are_class_sorted_jpegs():
    images, labels = make_images(100, 4, seed=1)
    assert len(images) == 100 and labels.tolist() == sorted(labels.tolist()) and set(labels.tolist()) == {0, 1, 2, 3}
    assert all(image[:2] == b"\xff\xd8" for image in images)


def test_the_demo_never_replaces_what_it_did_not_write(tmp_path, capsys):
    """-o DIR: sequential/ and piles/ there are replaced only when an earlier demo wrote them."""
    (tmp_path / "d" / "sequential").mkdir(parents=True)
    (tmp_path / "d" / "sequential" / "shard-000000.tar").write_bytes(b"precious")
    assert main(["demo", "-q", "-o", str(tmp_path / "d"), "--samples", "256"]) == 1
    assert "hold files an earlier shardkit demo did not write" in capsys.readouterr().err
    assert (tmp_path / "d" / "sequential" / "shard-000000.tar").read_bytes() == b"precious"
    assert main(["demo", "-q", "-o", str(tmp_path / "e"), "--samples", "256"]) == 0
    assert main(["demo", "-q", "-o", str(tmp_path / "e"), "--samples", "256"]) == 0  # its own output: replaced
