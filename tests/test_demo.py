"""shardkit demo: the figures it prints are measured on a real run, and it cleans up."""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np

import shardkit
from shardkit.cli import main
from shardkit.demo import classes_per_batch, demo, expected_classes, make_images


def test_demo_measures_all_three_orders(tmp_path):
    result = demo(tmp_path / "out", samples=3000, piles=4, quiet=True)
    sequential, webdataset, piles = result.rows
    assert sequential.classes_per_batch < 2.2  # 300 per class: a batch straddles at most two classes
    assert piles.classes_per_batch > result.uniform_classes - 0.5 > 9
    assert sequential.classes_per_batch < webdataset.classes_per_batch < piles.classes_per_batch
    assert all(r.read_per_s and r.read_per_s > 0 for r in (webdataset, piles))
    assert sequential.write_per_s and piles.write_per_s and webdataset.write_per_s is None
    assert shardkit.verify(str(tmp_path / "out" / "piles"), quiet=True) == []
    assert len(os.listdir(tmp_path / "out" / "sequential")) == 10
    table = result.table()
    assert "shardkit: 4 piles, loader" in table and "webdataset: shard shuffle + buffer 1000" in table
    # run again into the same directory: the old data is replaced, not refused
    assert demo(tmp_path / "out", samples=1000, piles=2, quiet=True).samples == 1000


def test_cli_demo_without_out_leaves_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["demo", "--samples", "1200", "--piles", "3", "-q"]) == 0
    out = capsys.readouterr().out
    assert "1,200 synthetic" in out and "classes/batch" in out
    assert os.listdir(tmp_path) == []


def test_cli_demo_bad_value(capsys):
    assert main(["demo", "--samples", "0", "-q"]) == 1
    assert capsys.readouterr().err == "error: samples: expected a positive integer, got 0\n"


def test_images_are_class_sorted_jpegs():
    images, labels = make_images(100, 4, seed=1)
    assert len(images) == 100 and labels.tolist() == sorted(labels.tolist()) and set(labels.tolist()) == {0, 1, 2, 3}
    assert all(image[:2] == b"\xff\xd8" for image in images)


def test_classes_per_batch_and_its_uniform_expectation():
    labels = np.repeat(np.arange(4), 25)
    assert classes_per_batch(labels, 10) == 1.2  # 10 batches; [20, 30) and [70, 80) straddle two classes
    assert math.isnan(classes_per_batch(labels, 1000))
    rng = np.random.default_rng(0)
    simulated = np.mean([classes_per_batch(rng.permutation(labels), 10) for _ in range(400)])
    assert abs(simulated - expected_classes(labels, 10)) < 0.05
