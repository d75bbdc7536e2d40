"""The fast paths give what the general ones give: raw batches built by columns, views, the worker handoff."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import shardkit
from shardkit import manifest
from shardkit.loading.batch import collate
from tests.conftest import make_samples

N = 157


@pytest.fixture
def mixed(tmp_path) -> str:
    """Piles whose samples do not all have the same fields: some have an extra ``txt``."""
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=5, seed=2) as w:
        for s in make_samples(N, size=300):
            if int(s["__key__"][1:]) % 3 == 0:
                s["txt"] = s["__key__"]
            w.write(s)
    return out


@pytest.fixture
def uniform(tmp_path) -> str:
    out = str(tmp_path / "uniform")
    with shardkit.PileWriter(out, piles=4, seed=3) as w:
        for s in make_samples(N, size=300):
            w.write(s)
    return out


def general(source: str, **options) -> list:
    """Batches from the general path: a collate given explicitly takes it."""
    with shardkit.loader(source, decode=False, collate=collate, **options) as loader:
        return list(loader)


def fast(source: str, **options) -> list:
    with shardkit.loader(source, decode=False, **options) as loader:
        assert loader._setup.columnar
        return list(loader)


@pytest.mark.parametrize("batch_size", [1, 8, 50, 400])
@pytest.mark.parametrize("mix", [1, 3])
@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("which", ["mixed", "uniform"])
def test_raw_batches_by_columns_equal_the_general_path(request, which, batch_size, mix, drop_last):
    source = request.getfixturevalue(which)
    options = dict(batch_size=batch_size, mix=mix, drop_last=drop_last, seed=5, world_size=2, rank=1)
    assert fast(source, **options) == general(source, **options)


def test_raw_batches_resume_mid_epoch_as_the_general_path(uniform):
    options = dict(batch_size=16, seed=1, drop_last=False)
    whole = fast(uniform, **options)
    with shardkit.loader(uniform, decode=False, **options) as loader:
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        state = loader.state_dict()
    with shardkit.loader(uniform, decode=False, **options) as loader:
        loader.load_state_dict(state)
        assert head + list(loader) == whole


def test_raw_batches_keep_slots_of_a_skipped_pile(uniform):
    piles = manifest.read(uniform).piles
    path = os.path.join(uniform, piles[0].name)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    options = dict(batch_size=10, seed=0, on_error="skip", drop_last=False)
    with shardkit.loader(uniform, decode=False, **options) as loader:
        got = list(loader)
        assert loader.stats.skipped_piles == 1 and loader.stats.skipped_samples == piles[0].samples
    assert got == general(uniform, **options)
    assert len(got) == -(-N // 10) and sum(len(b["__key__"]) for b in got) == N - piles[0].samples


@pytest.mark.parametrize("batch_size", [None, 16])
def test_views_are_read_only_slices_with_the_same_bytes(uniform, batch_size):
    with shardkit.loader(uniform, decode=False, batch_size=batch_size, seed=3) as loader:
        copies = list(loader)
    with shardkit.loader(uniform, decode=False, batch_size=batch_size, seed=3, views=True) as loader:
        views = list(loader)
    first = views[0]["bin"][0] if batch_size else views[0]["bin"]
    assert isinstance(first, memoryview) and first.readonly
    with pytest.raises(TypeError):
        first[0] = 1
    as_bytes = [
        {k: ([bytes(x) for x in v] if k != "__key__" and batch_size else v if k == "__key__" else bytes(v)) for k, v in b.items()}
        for b in views
    ]
    assert as_bytes == copies


def test_views_need_raw_fields(uniform):
    """Views are of raw fields: with decoding on they would change nothing, so they are refused."""
    for decode in (True, "pil"):
        with pytest.raises(
            shardkit.ConfigError,
            match=rf"views: True hands out raw fields as memoryviews, which needs decode=False; with decode={decode!r}",
        ):
            shardkit.loader(uniform, decode=decode, seed=3, views=True)


def test_views_is_a_checked_option():
    with pytest.raises(shardkit.ConfigError, match="views: expected True or False"):
        shardkit.loader("nowhere", views="yes")


torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'shardkit[torch]')")

from multiprocessing.reduction import ForkingPickler  # noqa: E402

from torch.utils.data import default_convert  # noqa: E402

from shardkit.loading.handoff import Handoff  # noqa: E402
from shardkit.torch import ShardkitDataLoader, ShardkitDataset  # noqa: E402


def handed(item, views=False):
    return pickle.loads(ForkingPickler.dumps(Handoff(item, views)))


def test_a_handoff_unpickles_as_the_converted_item():
    batch = {
        "__key__": ["a", "b", "c"],
        "bin": [b"x" * 10, b"", b"yz"],
        "img": np.arange(12, dtype=np.uint8).reshape(3, 4),
        "cls": np.array([1, 2, 3]),
        "meta": [{"n": 1}, None, {"n": 2}],
        "empty": [],
    }
    got = handed(batch)
    want = default_convert(batch)
    assert list(got) == list(want)
    for name in ("__key__", "bin", "meta", "empty"):
        assert got[name] == want[name]
    assert all(type(v) is bytes for v in got["bin"])
    for name in ("img", "cls"):
        assert isinstance(got[name], torch.Tensor) and torch.equal(got[name], want[name])
    assert str(handed(("a", np.array([1])))) == str(default_convert(("a", np.array([1]))))


def test_a_handoff_of_views_gives_read_only_views():
    data = memoryview(b"0123456789").toreadonly()
    got = handed({"__key__": ["a", "b"], "bin": [data[:3], data[3:]]}, views=True)
    assert [bytes(v) for v in got["bin"]] == [b"012", b"3456789"]
    assert all(isinstance(v, memoryview) and v.readonly for v in got["bin"])


@pytest.mark.parametrize("views", [False, True])
def test_dataloader_workers_hand_over_the_same_batches(uniform, views):
    # the same DataLoader without the handoff: a collate_fn that is not default_convert itself
    reference = ShardkitDataLoader(
        ShardkitDataset(uniform, batch_size=16, decode=False, seed=2), num_workers=2, collate_fn=lambda b: default_convert(b)
    )
    want = list(reference)
    dl = ShardkitDataLoader(ShardkitDataset(uniform, batch_size=16, decode=False, seed=2, views=views), num_workers=2)
    got = list(dl)
    assert [b["__key__"] for b in got] == [b["__key__"] for b in want]
    kind = memoryview if views else bytes
    assert all(type(v) is kind for b in got for v in b["bin"])
    assert [[bytes(v) for v in b["bin"]] for b in got] == [b["bin"] for b in want]


def test_a_custom_collate_fn_gets_the_plain_batches(uniform):
    seen = []

    def keep(batch):
        seen.append(type(batch).__name__)
        return batch

    ds = ShardkitDataset(uniform, batch_size=16, decode=False, seed=2)
    got = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1, collate_fn=keep))
    assert got and all(isinstance(b, dict) for b in got)
    assert seen == []  # collate_fn ran in the worker, on the plain dicts (were it given a Handoff, got would hold them)


def test_views_stay_views_without_workers(uniform):
    dl = ShardkitDataLoader(ShardkitDataset(uniform, batch_size=16, decode=False, seed=2, views=True), num_workers=0)
    batch = next(iter(dl))
    assert all(type(v) is memoryview and v.readonly for v in batch["bin"])


def test_convert_is_default_convert_but_for_byte_lists():
    from shardkit.loading.handoff import convert

    batch = {"__key__": ["a"], "bin": [memoryview(b"xy")], "raw": [b"z"], "cls": np.array([1]), "meta": [{"n": np.int64(2)}]}
    got = convert(batch)
    assert got["bin"] == batch["bin"] and got["raw"] == [b"z"] and got["__key__"] == ["a"]
    assert torch.equal(got["cls"], torch.tensor([1])) and got["meta"] == default_convert(batch["meta"])


def test_the_read_bound_benchmark_prints_the_halves_and_the_ratio(tmp_path):
    """``benchmarks/read_bound.py`` at a toy size: every row measured, the ratios printed."""
    if not shutil.which("cat"):
        pytest.skip("cat is not on PATH: the benchmark reads the piles with it")
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "read_bound.py")
    argv = [sys.executable, script, "--samples", "300", "--piles", "2", "--repeats", "1", "--epochs", "3", "--data", str(tmp_path)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for row in (
        "cat",
        "shardkit.loader views=True, the second epoch",
        "shardkit.loader views=True, later epochs",
        "reader alone: header scan",
        "consumer alone (piles fetched before)",
    ):
        assert re.search(rf"\| {re.escape(row)} \| \d+\.\d \| [\d,]+ \| \d+\.\d{{3}}x \|", out.stdout), row
    assert re.search(
        r"views=True over cat \(goal ≥ 0\.4x\): \d+\.\d{3}x a process's first epoch \((met|missed)\), \d+\.\d{3}x later", out.stdout
    )
