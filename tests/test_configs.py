"""Every ready job in configs/ runs on tiny data laid out next to a copy of it."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest
import webdataset as wds
from conftest import make_samples
from PIL import Image

import shardkit
from shardkit.cli import main
from shardkit.cli.jobs import DemoJob, load_job, run_job
from shardkit.tar.shard import iter_shard

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def _copy(tmp_path, name: str) -> str:
    path = tmp_path / name
    shutil.copy(os.path.join(CONFIGS, name), path)
    return str(path)


def _shards(tmp_path, n: int = 120) -> None:
    directory = tmp_path / "data" / "shards"
    directory.mkdir(parents=True)
    samples = make_samples(n)
    for k in range(3):
        with wds.TarWriter(str(directory / f"shard-{k:06d}.tar")) as w:
            for s in samples[k * n // 3 : (k + 1) * n // 3]:
                w.write(s)


def test_every_config_is_tested():
    assert sorted(f for f in os.listdir(CONFIGS) if f.endswith(".yaml")) == [
        "demo.yaml",
        "images.yaml",
        "jsonl.yaml",
        "repile.yaml",
        "shuffle.yaml",
    ]


def test_images_yaml(tmp_path):
    for cls, colour in (("cat", 30), ("dog", 220)):
        folder = tmp_path / "data" / "images" / cls
        folder.mkdir(parents=True)
        for i in range(5):
            Image.fromarray(np.full((300, 400, 3), colour + i, dtype=np.uint8)).save(folder / f"{i}.png")
    assert main(["run", "-q", _copy(tmp_path, "images.yaml")]) == 0
    out = str(tmp_path / "out" / "images")
    m = shardkit.manifest.read(out)
    assert (m.samples, len(m.piles), m.fields) == (10, 256, ("cls", "jpg", "json"))
    assert m.extra["classes"] == ["cat", "dog"]
    samples = [s for p in m.piles for s in iter_shard(os.path.join(out, p.name))]
    assert sorted((s["__key__"], int(s["cls"])) for s in samples) == [
        (f"{c}/{i}", k) for k, c in enumerate(("cat", "dog")) for i in range(5)
    ]
    assert {Image.open(__import__("io").BytesIO(s["jpg"])).size for s in samples} == {(341, 256)}
    assert shardkit.verify(out, quiet=True) == []


def test_jsonl_yaml(tmp_path):
    (tmp_path / "data" / "jsonl").mkdir(parents=True)
    for name in ("a", "b"):
        (tmp_path / "data" / "jsonl" / f"{name}.jsonl").write_text("".join(json.dumps({"f": name, "i": i}) + "\n" for i in range(7)))
    m = run_job(load_job(_copy(tmp_path, "jsonl.yaml")), quiet=True)
    assert (m.samples, len(m.piles), m.fields) == (14, 64, ("json",))


def test_repile_yaml(tmp_path):
    _shards(tmp_path)
    m = run_job(load_job(_copy(tmp_path, "repile.yaml")), quiet=True)
    assert (m.samples, len(m.piles), m.fields) == (120, 64, ("bin", "cls"))


def test_shuffle_yaml(tmp_path):
    _shards(tmp_path)
    m = run_job(load_job(_copy(tmp_path, "shuffle.yaml")), quiet=True)
    assert (m.samples, len(m.piles), m.extra["kind"], m.extra["piles"]) == (120, 1, "shuffled", 64)
    keys = [s["__key__"] for s in wds.WebDataset(str(tmp_path / "out" / "shuffled" / "shard-000000.tar"), shardshuffle=False)]
    assert sorted(keys) == [s["__key__"] for s in make_samples(120)] != keys


def test_demo_yaml(tmp_path):
    job = load_job(_copy(tmp_path, "demo.yaml"))
    assert isinstance(job, DemoJob) and job.samples == 50_000 and job.output == str(tmp_path / "out" / "demo")
    result = run_job(dataclasses.replace(job, samples=1500), quiet=True)  # the same job, smaller
    assert result.samples == 1500 and shardkit.manifest.is_dataset(str(tmp_path / "out" / "demo" / "piles"))


def test_run_demo_yaml_prints_the_table(tmp_path, capsys):
    path = _copy(tmp_path, "demo.yaml")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace("samples: 50000", "samples: 1200"))
    assert main(["run", "-q", path]) == 0
    out = capsys.readouterr().out
    assert out.startswith("shardkit demo: 1,200 synthetic 32x32 JPEG images") and "DemoResult(" not in out
    assert "shardkit: 16 piles, loader" in out and f"data kept in {tmp_path / 'out' / 'demo'}" in out


@pytest.mark.parametrize("name", ["images.yaml", "jsonl.yaml", "repile.yaml", "shuffle.yaml", "demo.yaml"])
def test_check_names_what_is_missing(tmp_path, name, capsys):
    code = main(["run", "--check", _copy(tmp_path, name)])
    err = capsys.readouterr().err
    if name == "demo.yaml":
        assert code == 0
    else:  # no data laid out: the check says which input is missing, before any work
        assert code == 1 and err.startswith(f"shardkit run: error: {tmp_path / name}: inputs[0]: {tmp_path}/data/")
        assert not (tmp_path / "out").exists()
