"""Every ready job in configs/ runs as shipped, from a copy of the repository's configs/ with its sample data."""

from __future__ import annotations

import glob
import importlib
import io
import json
import os
import re
import shutil

import pytest
import webdataset as wds
from PIL import Image

import shardkit
from shardkit.cli import main
from shardkit.cli.jobs import load_job, run_job
from shardkit.tar.shard import iter_shard

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def _copy(tmp_path, name: str) -> str:
    path = tmp_path / name
    shutil.copy(os.path.join(CONFIGS, name), path)
    return str(path)


def _repo(tmp_path) -> str:
    """A copy of configs/ as a fresh clone has it (the jobs and their sample data, no output)."""
    dst = tmp_path / "configs"
    shutil.copytree(CONFIGS, dst, ignore=shutil.ignore_patterns("out", "__pycache__"))
    return str(dst)


def test_every_config_is_tested():
    assert sorted(f for f in os.listdir(CONFIGS) if f.endswith(".yaml")) == [
        "demo.yaml",
        "images.yaml",
        "jsonl.yaml",
        "repile.yaml",
        "shuffle.yaml",
    ]


def test_the_sample_data_is_tiny():
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(os.path.join(CONFIGS, "data")) for f in files)
    assert 0 < size < 300_000


def _samples(out: str) -> list[dict]:
    m = shardkit.manifest.read(out)
    return [s for p in m.piles for s in iter_shard(os.path.join(out, p.name))]


def test_images_yaml_runs_as_shipped(tmp_path):
    configs = _repo(tmp_path)
    assert main(["run", "-q", os.path.join(configs, "images.yaml")]) == 0
    out = os.path.join(configs, "out", "images")
    m = shardkit.manifest.read(out)
    assert (m.samples, len(m.piles), m.fields) == (18, 4, ("cls", "jpg", "json"))
    classes = m.extra["classes"]
    assert classes == ["circle", "square", "triangle"]
    for s in _samples(out):
        assert classes[int(s["cls"])] == s["__key__"].split("/")[0] == json.loads(s["json"])["class"]
        assert min(Image.open(io.BytesIO(s["jpg"])).size) == 64
    assert shardkit.verify(out, quiet=True) == []


def test_jsonl_yaml_runs_as_shipped(tmp_path):
    configs = _repo(tmp_path)
    m = run_job(load_job(os.path.join(configs, "jsonl.yaml")), quiet=True)
    assert (m.samples, len(m.piles), m.fields) == (80, 4, ("json",))
    keys = sorted(s["__key__"] for s in _samples(os.path.join(configs, "out", "jsonl")))
    assert keys == [f"doc-{i:05d}" for i in range(80)]


def test_repile_yaml_runs_as_shipped_on_shards_whose_keys_restart(tmp_path):
    configs = _repo(tmp_path)
    assert main(["run", "-q", os.path.join(configs, "repile.yaml")]) == 0
    out = os.path.join(configs, "out", "repiled")
    m = shardkit.manifest.read(out)
    assert (m.samples, len(m.piles), m.fields, m.extra["key_prefix"]) == (48, 4, ("cls", "txt"), "unit")
    keys = sorted(s["__key__"] for s in _samples(out))
    assert keys == sorted(f"shard-{s:06d}/{k:06d}" for s in range(3) for k in range(16))


def test_shuffle_yaml_runs_as_shipped(tmp_path):
    configs = _repo(tmp_path)
    m = run_job(load_job(os.path.join(configs, "shuffle.yaml")), quiet=True)
    assert (m.samples, len(m.piles), m.extra["kind"], m.extra["piles"]) == (48, 3, "shuffled", 2)
    shards = sorted(glob.glob(os.path.join(configs, "out", "shuffled", "shard-*.tar")))
    keys = [s["__key__"] for s in wds.WebDataset(shards, shardshuffle=False)]
    assert sorted(keys) == sorted(f"shard-{s:06d}/{k:06d}" for s in range(3) for k in range(16)) != keys


def test_demo_yaml_runs_as_shipped(tmp_path, capsys):
    configs = _repo(tmp_path)
    assert main(["run", "-q", os.path.join(configs, "demo.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("shardkit demo: 4,000 synthetic 32x32 JPEG images") and "DemoResult(" not in out
    assert "shardkit: 16 piles, loader" in out and f"data kept in {os.path.join(configs, 'out', 'demo')}" in out
    assert shardkit.manifest.is_dataset(os.path.join(configs, "out", "demo", "piles"))


@pytest.mark.parametrize("name", ["images.yaml", "jsonl.yaml", "repile.yaml", "shuffle.yaml", "demo.yaml"])
def test_check_names_what_is_missing(tmp_path, name, capsys):
    code = main(["run", "--check", _copy(tmp_path, name)])
    err = capsys.readouterr().err
    if name == "demo.yaml":
        assert code == 0
    else:  # no data laid out: the check says which input is missing, before any work
        assert code == 1 and re.match(
            rf"shardkit run: error: {re.escape(str(tmp_path / name))}: line \d+: inputs\[0\]: {re.escape(str(tmp_path))}/data/", err
        )
        assert not (tmp_path / "out").exists()


def test_the_schema_table_names_functions_that_exist():
    # configs/README.md tells a reader which Python function each job runs: each must import
    with open(os.path.join(CONFIGS, "README.md"), encoding="utf-8") as f:
        names = re.findall(r"^\| `\w+` +\| `(shardkit[\w.]*)` ", f.read(), flags=re.M)
    assert len(names) == 4, names
    for name in names:
        module, _, attr = name.rpartition(".")
        assert callable(getattr(importlib.import_module(module), attr)), name


def test_the_schema_table_names_every_key_each_job_takes():
    # a key the table leaves out is one a reader of configs/README.md cannot know the job takes
    from shardkit.cli.jobs import job_fields
    from shardkit.option_fields import yaml_names

    with open(os.path.join(CONFIGS, "README.md"), encoding="utf-8") as f:
        rows = re.findall(r"^\| `(\w+)` +\| `shardkit[\w.]*` +\| ([^|]+)\| ([^|]+)\|$", f.read(), flags=re.M)
    assert len(rows) == 4, rows
    for kind, output, top in rows:
        own, options = job_fields(kind)
        said_output = set(re.findall(r"\b[a-z_]+\b", output.split("(")[0]))
        said_top = set(re.findall(r"\b[a-z_]+\b", top)) - {"or"}
        want_output = {"path", *(yaml_names(options, "output") if options else ())}
        want_top = {*own, *(yaml_names(options, "job") if options else ())} - {"job", "output"}
        assert (said_output, said_top) == (want_output, want_top), kind
