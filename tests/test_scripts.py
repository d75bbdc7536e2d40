"""The preprocessing scripts run as `python scripts/x.py` on tiny generated data."""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardkit import manifest
from shardkit.loading.pile import read_pile

ROOT = Path(__file__).resolve().parents[1]


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True, env=env, timeout=120)


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), ROOT / "scripts" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_all(out) -> list[dict]:
    m = manifest.read(str(out))
    return [s for p in m.piles for s in read_pile(os.path.join(out, p.name), expected=p)]


# ---- images ----------------------------------------------------------------------------------


@pytest.fixture
def image_dir(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    root = tmp_path / "images"
    for cls, sizes in {"dog": [(40, 30), (24, 64)], "cat": [(50, 50), (20, 31), (33, 18)]}.items():
        (root / cls).mkdir(parents=True)
        for i, (h, w) in enumerate(sizes):
            image = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
            image.save(root / cls / f"img.{i}.{'png' if i % 2 else 'jpg'}")
    (root / "cat" / "notes.txt").write_text("not an image")  # ignored
    return root


def test_images_script_writes_resized_labelled_samples(tmp_path, image_dir):
    out = tmp_path / "out"
    done = run_script("preprocess_images.py", str(image_dir), "--out", str(out), "--piles", "2", "--workers", "2", "--size", "16")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{out}: 5 images of 2 classes in 2 piles"
    m = manifest.read(str(out))
    assert m.extra["classes"] == ["cat", "dog"] and set(m.fields) == {"cls", "jpg", "json"}
    samples = {s["__key__"]: s for s in read_all(out)}
    assert sorted(samples) == ["cat/img_0", "cat/img_1", "cat/img_2", "dog/img_0", "dog/img_1"]
    for key, s in samples.items():
        meta = json.loads(bytes(s["json"]))
        assert meta["class"] == key.split("/")[0]
        assert meta["path"].startswith(meta["class"] + "/img.") and (image_dir / meta["path"]).is_file()
        assert int(bytes(s["cls"])) == ["cat", "dog"].index(meta["class"])
        image = Image.open(io.BytesIO(bytes(s["jpg"])))
        assert image.format == "JPEG" and min(image.size) == 16


def test_images_script_refuses_a_broken_image_and_can_skip_it(tmp_path, image_dir):
    script = load_script("preprocess_images.py")
    (image_dir / "dog" / "broken.jpg").write_bytes(b"not a jpeg")
    out = tmp_path / "out"
    assert script.main([str(image_dir), "--out", str(out), "--piles", "2", "-q"]) == 1
    assert not (out / "shardkit.json").exists()
    code = script.main([str(image_dir), "--out", str(out), "--piles", "2", "--on-error", "skip", "--images-per-unit", "1"])
    assert code == 0
    m = manifest.read(str(out))
    assert m.samples == 5 and m.skipped_units == 1 and "broken.jpg: cannot read image" in m.extra["skipped"][0]["error"]


def test_images_script_errors(tmp_path, image_dir, capsys):
    script = load_script("preprocess_images.py")
    Image.new("RGB", (8, 8)).save(image_dir / "cat" / "img.0.png")  # same key as img.0.jpg
    assert script.main([str(image_dir), "--out", str(tmp_path / "o"), "--piles", "2"]) == 1
    err = capsys.readouterr().err
    cat = image_dir / "cat"
    assert (
        err
        == f"preprocess_images.py: error: images: '{cat / 'img.0.jpg'}' and '{cat / 'img.0.png'}' would both get the sample key 'cat/img_0'; rename one\n"
    )
    assert script.main([str(tmp_path / "missing"), "--out", str(tmp_path / "o"), "--piles", "2"]) == 1
    assert "missing: no such folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        script.main([str(image_dir), "--out", str(tmp_path / "o"), "--piles", "2", "--quality", "0"])
    assert exit_info.value.code == 2


def test_images_script_broken_image_message_from_the_command_line(tmp_path, image_dir):
    (image_dir / "dog" / "broken.png").write_bytes(b"\x89PNG nothing")
    done = run_script("preprocess_images.py", str(image_dir), "--out", str(tmp_path / "o"), "--piles", "2")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("preprocess_images.py: error: input unit 0 (")
    assert f"{image_dir / 'dog' / 'broken.png'}: cannot read image" in done.stderr


# ---- JSON lines ------------------------------------------------------------------------------


def test_jsonl_script_writes_one_sample_per_record(tmp_path):
    (tmp_path / "a.part1.jsonl").write_text('{"id": 17, "text": "x"}\n\n{"text": "y", "n": 1.50}\n{"__key__": "custom", "id": 3}\n')
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write('{"text": "z"}\n')
    out = tmp_path / "out"
    done = run_script(
        "preprocess_jsonl.py",
        str(tmp_path / "a.part1.jsonl"),
        str(tmp_path / "b.jsonl.gz"),
        "--out",
        str(out),
        "--piles",
        "3",
        "--workers",
        "2",
    )
    assert done.returncode == 0, done.stderr
    assert "4 records from 2 files in 3 piles" in done.stdout
    samples = {s["__key__"]: bytes(s["json"]) for s in read_all(out)}
    assert samples == {
        "17": b'{"id": 17, "text": "x"}',
        "a_part1-000000003": b'{"text": "y", "n": 1.50}',  # the line byte for byte
        "custom": b'{"__key__": "custom", "id": 3}',
        "b-000000001": b'{"text": "z"}',
    }


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ('{"a": 1}\n{"a": 2}\n{"a": \n', "bad.jsonl: line 3: not valid JSON"),
        ('{"a": 1}\n[1, 2]\n', "bad.jsonl: line 2: expected a JSON object, got list"),
        ('{"id": "k"}\n{"id": "k"}\n', "bad.jsonl: line 2: key 'k' was already used on line 1"),
    ],
)
def test_jsonl_script_names_file_and_line_of_a_bad_record(tmp_path, capsys, lines, message):
    script = load_script("preprocess_jsonl.py")
    (tmp_path / "good.jsonl").write_text('{"a": 0}\n')
    (tmp_path / "bad.jsonl").write_text(lines)
    out = tmp_path / "out"
    assert script.main([str(tmp_path / "good.jsonl"), str(tmp_path / "bad.jsonl"), "--out", str(out), "--piles", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("preprocess_jsonl.py: error: input unit 1 (") and message in err
    assert not (out / "shardkit.json").exists()
    assert (
        script.main([str(tmp_path / "good.jsonl"), str(tmp_path / "bad.jsonl"), "--out", str(out), "--piles", "2", "--on-error", "skip"])
        == 0
    )
    assert manifest.read(str(out)).skipped_units == 1


def test_jsonl_script_malformed_line_from_the_command_line(tmp_path):
    (tmp_path / "data.jsonl").write_text('{"a": 1}\n{"a": 2}\nnot json\n')
    done = run_script("preprocess_jsonl.py", str(tmp_path / "data.jsonl"), "--out", str(tmp_path / "o"), "--piles", "2")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{tmp_path / 'data.jsonl'}: line 3: not valid JSON" in done.stderr
    missing = run_script("preprocess_jsonl.py", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o"), "--piles", "2")
    assert missing.returncode == 1 and missing.stderr == f"preprocess_jsonl.py: error: {tmp_path / 'nope.jsonl'}: no such file\n"
