"""Re-piling a dataset with a new seed: same samples, fresh membership, recurrence back to chance."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import make_samples

import shardkit
from shardkit.cli import main
from shardkit.errors import ConfigError, DatasetNotFoundError
from shardkit.loading.pile import read_pile
from shardkit.manifest import Manifest, PileInfo, original_piles
from shardkit.piles.repile import repile
from shardkit.tools import quality
from shardkit.tools.compare import order_from_plan, scan_dataset


def _contents(directory: str) -> dict[str, dict]:
    m = shardkit.manifest.read(directory)
    out = {}
    for p in m.piles:
        for s in read_pile(os.path.join(directory, p.name)):
            out[s["__key__"]] = {k: bytes(v) for k, v in s.items() if k != "__key__"}
    return out


def _membership(directory: str) -> dict[str, int]:
    m = shardkit.manifest.read(directory)
    return {k: i for i, p in enumerate(m.piles) for k in read_pile(os.path.join(directory, p.name)).keys}


def test_repile_keeps_every_sample_and_draws_new_membership(dataset, tmp_path):
    dst = str(tmp_path / "new")
    result = repile(dataset, dst, seed=11)
    old = shardkit.manifest.read(dataset)
    assert len(result.piles) == len(old.piles) == 8 and result.seed == 11
    assert _contents(dst) == _contents(dataset)
    before, after = _membership(dataset), _membership(dst)
    # pairs of pile-mates that stay together: about 1/M of them under fresh membership, not all
    keys = sorted(before)
    mates = [(a, b) for i, a in enumerate(keys) for b in keys[i + 1 :] if before[a] == before[b]]
    kept = sum(after[a] == after[b] for a, b in mates) / len(mates)
    assert kept < 0.3


def test_repile_takes_m_and_fields_from_the_source(tmp_path):
    src = str(tmp_path / "src")
    with shardkit.PileWriter(src, piles=3, seed=0, max_pile_bytes=8 * 1024) as w:
        for s in make_samples(60, size=100):
            w.write(s)
    m = shardkit.manifest.read(src)
    assert m.split_piles > 0 and len(m.piles) > 3
    assert original_piles(m) == 3
    result = repile(src, tmp_path / "dst", seed=1, piles=5)
    assert len(result.piles) == 5 and result.samples == 60
    assert repile(src, tmp_path / "dst3", seed=2).samples == 60
    assert len(shardkit.manifest.read(str(tmp_path / "dst3")).piles) == 3


def test_original_piles_of_plain_and_foreign_names():
    def manifest(*names: str) -> Manifest:
        piles = tuple(PileInfo(name=n, samples=1, bytes=1024, checksum="crc32:00000000") for n in names)
        return Manifest(piles=piles, seed=0, fields=("bin",), created_by="test")

    assert original_piles(manifest("pile-000000.tar", "pile-000001-000.tar", "pile-000001-001-000.tar", "pile-000002.tar")) == 3
    assert original_piles(manifest("a.tar", "b.tar")) == 2


def test_repile_refuses_same_seed_same_place_and_missing_source(dataset, tmp_path):
    with pytest.raises(ConfigError, match="was written with seed 3; repile needs a different seed"):
        repile(dataset, tmp_path / "x", seed=3)
    with pytest.raises(ConfigError, match="cannot replace its source in place"):
        repile(dataset, dataset + "/", seed=4)
    with pytest.raises(DatasetNotFoundError):
        repile(tmp_path / "none", tmp_path / "y", seed=1)
    assert shardkit.manifest.is_dataset(dataset) and not os.path.exists(tmp_path / "x" / "shardkit.json")


def _twice(sample):
    return 2


@pytest.mark.parametrize("repeat", [None, _twice], ids=["copied", "repeated"])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_repile_refuses_a_source_file_that_is_not_what_its_manifest_says(tmp_path, compression, repeat):
    """Copied as byte ranges or decoded to be repeated (a repeat given in options), a damaged file fails the job."""
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    with shardkit.PileWriter(src, piles=2, seed=0, compression=compression) as w:
        for i in range(20):
            w.write({"__key__": f"s{i:03d}", "txt": f"sample {i}"})
    if compression is not None:  # an append's plain segment beside the compressed piles
        with shardkit.PileWriter(src, piles=2, seed=0, mode="append") as w:
            for i in range(20, 40):
                w.write({"__key__": f"s{i:03d}", "txt": f"sample {i}"})
    name = next(f for p in shardkit.manifest.read(src).piles for f in p.files if f.endswith(".tar"))
    path = os.path.join(src, name)
    with open(path, "r+b") as f:  # a letter of the first sample's text: the tar stays well formed
        f.seek(3 * 512 + 2)
        byte = f.read(1)
        f.seek(3 * 512 + 2)
        f.write(bytes([byte[0] ^ 0x01]))
    given = {"seed": 1} if repeat is None else {"options": shardkit.PileOptions(piles=2, seed=1, repeat=repeat)}
    with pytest.raises(shardkit.CorruptShardError, match=f"{name}: checksum is crc32:.*the manifest says"):
        repile(src, dst, quiet=True, **given)
    assert not os.path.exists(os.path.join(dst, "shardkit.json"))


def test_repile_cuts_cross_epoch_recurrence_to_chance(tmp_path):
    n, piles, batch = 8000, 8, 32
    src, dst = str(tmp_path / "old"), str(tmp_path / "new")
    with shardkit.PileWriter(src, piles=piles, seed=5) as w:
        for i in range(n):
            w.write({"__key__": f"s{i:06d}", "cls": i * 10 // n})
    repile(src, dst, seed=6, quiet=True)
    old, new = scan_dataset(src), scan_dataset(dst)
    e0, e1 = order_from_plan(old, seed=0, epoch=0), order_from_plan(old, seed=0, epoch=1)
    moved = order_from_plan(new, seed=0, epoch=1)
    same = quality.recurrence(e0, e1, batch).value
    fresh = quality.recurrence(e0, moved, batch).value
    assert same > 0.8 * piles
    assert fresh < 1.5
    assert abs(quality.measure(moved, batch_size=batch)["kendall_tau"].z) < 4


def test_cli_repile(dataset, tmp_path, capsys):
    dst = str(tmp_path / "new")
    assert main(["repile", dataset, "-o", dst, "-q"]) == 0
    assert "200 samples in 8 piles" in capsys.readouterr().out
    assert shardkit.manifest.read(dst).seed == 4  # the source's seed + 1
    assert main(["repile", dataset, "-o", dst, "--seed", "9", "--piles", "4", "-q"]) == 1
    assert "already holds a shardkit dataset" in capsys.readouterr().err
    assert main(["repile", dataset, "-o", dst, "--seed", "9", "--piles", "4", "--overwrite", "-q"]) == 0
    assert len(shardkit.manifest.read(dst).piles) == 4
    counts = np.array([p.samples for p in shardkit.manifest.read(dst).piles])
    assert counts.sum() == 200


def test_repile_keeps_what_the_labels_and_keys_mean(tmp_path):
    """A class map (and how samples say their class) and the key prefix's record go with the
    samples: without them verify no longer checked labels and an append of images was refused."""
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    samples = [{"__key__": f"{i:04d}", "cls": i % 3, "json": {"class": ["cat", "dog", "eel"][i % 3]}} for i in range(30)]
    extra = {"classes": ["cat", "dog", "eel"], "class_check": {"index": "cls", "name": "json.class"}, "note": "mine"}
    shardkit.preprocess([0], lambda u: samples, src, piles=3, extra=extra, quiet=True)
    m = shardkit.repile(src, dst, quiet=True)
    assert m.extra["classes"] == ["cat", "dog", "eel"] and m.extra["class_check"] == extra["class_check"]
    assert "note" not in m.extra  # a user's own records describe the job that wrote them, not the samples
    assert shardkit.verify(dst, quiet=True) == []
