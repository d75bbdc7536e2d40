"""Class maps across appends: old classes keep their indices, new ones get the next, verify checks cls."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import write_wds_shards
from PIL import Image
from test_scripts import run_script

from shardkit import manifest, transforms
from shardkit.dataset import layout
from shardkit.errors import ConfigError
from shardkit.loading.pile import read_pile
from shardkit.piles import classes as class_maps
from shardkit.piles.transforms import Images
from shardkit.tools.audit import verify


def _images(root: Path, classes: dict[str, int], seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for name, count in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)).save(root / name / f"{name}-{seed}-{i}.png")
    return root


def _samples(out: Path) -> list[dict]:
    m = manifest.read(str(out))
    return [s for p in m.piles for part in p.parts for s in read_pile(os.path.join(out, part.name), expected=part)]


def test_an_append_of_other_classes_keeps_every_label(tmp_path):
    first = _images(tmp_path / "first", {"3": 2, "5": 3, "7": 1})
    later = _images(tmp_path / "later", {"7": 2, "8": 1, "9": 2, "4": 1}, seed=1)
    out = tmp_path / "out"
    done = run_script("preprocess_images.py", str(first), "--out", str(out), "--piles", "2", "--size", "8")
    assert done.returncode == 0, done.stderr
    done = run_script("preprocess_images.py", str(later), "--out", str(out), "--piles", "2", "--size", "8", "--append")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{out}: 12 images of 6 classes in 2 piles"
    m = manifest.read(str(out))
    classes = m.extra["classes"]
    assert classes == ["3", "5", "7", "4", "8", "9"]  # old indices kept, new classes after them in sorted order
    samples = _samples(out)
    assert len(samples) == 12
    for s in samples:
        folder = s["__key__"].split("/")[0]
        assert classes[int(bytes(s["cls"]))] == folder == json.loads(bytes(s["json"]))["class"]
    assert [p for p in verify(str(out), quiet=True) if p.kind == "class"] == []


def test_a_given_map_that_moves_a_class_is_refused_naming_both_maps(tmp_path):
    first = _images(tmp_path / "first", {"cat": 1, "dog": 1})
    out = tmp_path / "out"
    assert run_script("preprocess_images.py", str(first), "--out", str(out), "--piles", "1", "--size", "8").returncode == 0
    done = run_script(
        "preprocess_images.py", str(first), "--out", str(out), "--piles", "1", "--append", "--classes", "dog,cat", "--size", "8"
    )
    assert done.returncode != 0
    assert "['cat', 'dog']" in done.stderr and "['dog', 'cat']" in done.stderr, done.stderr
    assert manifest.read(str(out)).generation == 0  # nothing written


def test_reconcile_rules():
    assert class_maps.reconcile(None, ["b", "a"]) == ["a", "b"]
    assert class_maps.reconcile(["z", "a"], ["a", "c", "b"]) == ["z", "a", "b", "c"]
    assert class_maps.reconcile(["z"], ["a"], given=["z", "a", "q"]) == ["z", "a", "q"]
    with pytest.raises(ConfigError, match=r"\['z'\].*\['a', 'z'\]"):
        class_maps.reconcile(["z"], ["a"], given=["a", "z"])
    with pytest.raises(ConfigError, match=r"lacks.*'b'"):
        class_maps.reconcile(None, ["a", "b"], given=["a"])
    with pytest.raises(ConfigError, match="disagree"):
        class_maps.extended(["a", "b"], ["b", "a", "c"], "append")


def test_append_to_a_dataset_without_a_class_map_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="records no class map"):
        Images().prepare([str(_images(tmp_path / "x", {"a": 1}))], recorded={"units": 3})


def test_the_python_path_refuses_images_appended_to_a_dataset_without_a_class_map(tmp_path):
    import shardkit

    # a dataset shardkit pile made: its extra records no classes, so its samples' cls mean nothing
    (shard,) = write_wds_shards(tmp_path, "src-{}.tar", 1, lambda k, i: {"__key__": f"k{i}", "txt": "x"} if i < 3 else None)
    out = tmp_path / "out"
    shardkit.pile([shard], str(out), piles=2, quiet=True)
    before = sorted(os.listdir(out))
    images = Images(size=8)
    units = images.units([str(_images(tmp_path / "new", {"cat": 1, "dog": 1}))])
    with pytest.raises(ConfigError, match=rf"^{out}: append: the dataset appended to records no class map"):
        shardkit.preprocess(units, images, str(out), piles=2, mode="append", quiet=True)
    assert sorted(os.listdir(out)) == before and manifest.read(str(out)).generation == 0  # refused before any work


def test_an_append_whose_map_another_append_outgrew_leaves_what_a_rerun_can_use(tmp_path, monkeypatch):
    import shardkit
    from shardkit.dataset.transaction import Transaction

    images = Images(size=8)
    out = str(tmp_path / "out")
    units, extra = transforms.prepare(images, [str(_images(tmp_path / "first", {"cat": 1, "dog": 1}))], out, mode="create")
    shardkit.preprocess(units, images, out, piles=2, extra=extra, quiet=True)
    fox = str(_images(tmp_path / "fox", {"fox": 1}, seed=1))
    units, extra = transforms.prepare(images, [fox], out, mode="append")  # fox is 2
    # another append makes bee 2 after this one's map was made, before it takes the output's lock
    real_open = Transaction.open

    def racing_open(txn):
        monkeypatch.setattr(Transaction, "open", real_open)
        bee = transforms.prepare(images, [str(_images(tmp_path / "bee", {"bee": 1}, seed=2))], out, mode="append")
        shardkit.preprocess(bee[0], images, out, piles=2, extra=bee[1], mode="append", quiet=True)
        return real_open(txn)

    monkeypatch.setattr(Transaction, "open", racing_open)
    with pytest.raises(ConfigError, match=rf"^{out}: append: the dataset's class map \['cat', 'dog', 'bee'\] .* run it again"):
        shardkit.preprocess(units, images, out, piles=2, extra=extra, mode="append", quiet=True)
    assert manifest.read(out).generation == 1 and not os.path.exists(os.path.join(out, layout.STAGING))
    # run again, as the message says: the map is read again, and nothing of the failed job is in the way
    units, extra = transforms.prepare(images, [fox], out, mode="append")
    assert shardkit.preprocess(units, images, out, piles=2, extra=extra, mode="append", quiet=True).extra["classes"] == [
        "cat",
        "dog",
        "bee",
        "fox",
    ]
    assert [p for p in verify(out, quiet=True) if p.kind == "class"] == []


def test_verify_names_samples_whose_cls_disagrees_with_the_map(tmp_path):
    import shardkit

    src = _images(tmp_path / "src", {"a": 2, "b": 2})
    images = Images(size=8)
    units, extra = images.prepare([str(src)])
    out = tmp_path / "out"
    shardkit.preprocess(units, images, str(out), piles=1, extra=extra, quiet=True)
    assert verify(str(out), quiet=True) == []
    # the same samples under a map that swaps the two classes: every sample disagrees
    bad = tmp_path / "bad"
    shardkit.preprocess(units, images, str(bad), piles=1, extra={**extra, "classes": ["b", "a"]}, quiet=True)
    problems = [p for p in verify(str(bad), quiet=True) if p.kind == "class"]
    assert len(problems) == 4 and not problems[0].warning
    assert "json.class says" in str(problems[0])
    shutil.rmtree(bad)


def test_the_python_path_without_extra_records_the_map_and_an_append_cannot_relabel(tmp_path):
    import shardkit

    # as the transforms' docstring shows it: units from Images.units, no extra passed
    images = Images(size=8)
    out = tmp_path / "out"
    shardkit.preprocess(
        images.units([str(_images(tmp_path / "first", {"cat": 1, "dog": 1, "fox": 1}))]), images, str(out), piles=1, quiet=True
    )
    assert manifest.read(str(out)).extra["classes"] == ["cat", "dog", "fox"]
    # numbered from 0 again ('bee' 0, 'fox' 1): the dataset says 0 is cat and 1 is dog
    later = images.units([str(_images(tmp_path / "later", {"bee": 1, "fox": 1}, seed=1))])
    with pytest.raises(ConfigError, match=r"number class 'bee' 0, which the dataset's map \['cat', 'dog', 'fox'\] gives to 'cat'"):
        shardkit.preprocess(later, images, str(out), piles=1, mode="append", quiet=True)
    assert manifest.read(str(out)).generation == 0  # nothing published
    # units of one known class, numbered as the dataset numbers it (cat is 0 either way): appended, the map kept
    cats = images.units([str(_images(tmp_path / "cats", {"cat": 2}, seed=2))])
    shardkit.preprocess(cats, images, str(out), piles=1, mode="append", quiet=True)
    assert manifest.read(str(out)).extra["classes"] == ["cat", "dog", "fox"] and manifest.read(str(out)).generation == 1
    assert [p for p in verify(str(out), quiet=True) if p.kind == "class"] == []
    units, extra = transforms.prepare(images, [str(tmp_path / "later")], str(out), mode="append")
    shardkit.preprocess(units, images, str(out), piles=1, mode="append", extra=extra, quiet=True)
    assert [p for p in verify(str(out), quiet=True) if p.kind == "class"] == []


def test_units_that_skip_a_class_index_name_it(tmp_path):
    import shardkit

    images = Images(size=8)
    units = images.units([str(_images(tmp_path / "in", {"a": 1, "b": 1, "c": 1}))])
    units = [[item for item in unit if item[2] != "b"] for unit in units]  # as if the folder b had no image
    with pytest.raises(ConfigError, match=r"no image of the units has class index 1 .*transforms\.prepare"):
        shardkit.preprocess(units, images, str(tmp_path / "out"), piles=1, quiet=True)
    assert not (tmp_path / "out" / "shardkit.json").exists()


def test_units_that_give_a_known_class_a_new_index_are_refused(tmp_path):
    """dog is 1 in the dataset; units numbered with a map of their own give it 2: appended, the map
    would name dog twice and its samples would carry two labels."""
    import shardkit

    out = tmp_path / "out"
    images = Images(size=8)
    shardkit.preprocess(images.units([str(_images(tmp_path / "first", {"cat": 1, "dog": 1}))]), images, str(out), piles=1, quiet=True)
    units = Images(size=8, classes=["cat", "eel", "dog"]).units([str(_images(tmp_path / "more", {"dog": 2}, seed=3))])
    with pytest.raises(ConfigError, match=r"number class 'dog' 2, where the dataset's map gives it 1"):
        shardkit.preprocess(units, images, str(out), piles=1, mode="append", quiet=True)
    assert manifest.read(str(out)).extra["classes"] == ["cat", "dog"] and manifest.read(str(out)).generation == 0
    from shardkit.piles import classes

    with pytest.raises(ConfigError, match=r"names 'dog' twice"):
        classes.extended(["cat", "dog"], ["cat", "dog", "dog"], "append")
