"""Blending datasets in the loader: shares per batch, each source's own order, ranks, resume, bad input."""

from __future__ import annotations

import json
import logging
import os

import pytest

import shardkit
from shardkit.loading.blend.loader import BlendLoader


def make(root, name: str, n: int, *, piles: int, seed: int, field: str = "txt") -> str:
    out = os.path.join(root, name)
    with shardkit.PileWriter(out, piles=piles, seed=seed) as w:
        for i in range(n):
            w.write({"__key__": f"{name}{i:05d}", field: f"{name} {i}", "cls": i})
    return out


@pytest.fixture
def pair(tmp_path):
    return {"web": make(tmp_path, "web", 300, piles=4, seed=1), "code": make(tmp_path, "code", 100, piles=3, seed=2)}


def keys(loader) -> list[list[str]]:
    return [list(b["__key__"]) for b in loader]


def of(source: str, batches) -> list[str]:
    return [k for b in batches for k in b if k.startswith(source)]


def test_every_batch_holds_each_share_and_each_source_continues_its_stream(pair):
    loader = shardkit.loader(pair, weights={"web": 0.7, "code": 0.3}, batch_size=16, decode=False, seed=4)
    assert isinstance(loader, BlendLoader) and loader.source.shares == (280, 120)
    epochs = [keys(loader) for _ in range(3)]
    for batches in epochs:
        assert all(abs(len(of("web", [b])) - 16 * 0.7) < 1 for b in batches)
        assert len(of("code", batches)) == 120
    # each source is an endless stream of its own permutations: no sample twice before all were read
    code = [k for batches in epochs for k in of("code", batches)]
    web = [k for batches in epochs for k in of("web", batches)]
    for stream, n in ((code, 100), (web, 300)):
        for a in range(0, len(stream) - n + 1, n):
            assert len(set(stream[a : a + n])) == n
    # and each source's order is the one it has alone, epoch by epoch of its own
    alone = [k["__key__"] for k in shardkit.loader(pair["code"], decode=False, seed=4)]
    assert code[:100] == alone


def test_counts_and_repeats_and_list_form(pair):
    blend = shardkit.Blend([{"name": "web", "path": pair["web"], "count": 50}, {"name": "code", "path": pair["code"], "repeat": 1.5}])
    loader = shardkit.loader(blend, batch_size=10, decode=False)
    batches = keys(loader)
    assert len(of("web", batches)) == 50 and len(of("code", batches)) == 150
    assert all(len(of("web", [b])) in (2, 3) for b in batches)
    same = shardkit.loader(
        {"web": {"path": pair["web"], "count": 50}, "code": {"path": pair["code"], "repeat": 1.5}}, batch_size=10, decode=False
    )
    assert keys(same) == batches


@pytest.mark.parametrize("made", ["Blend", "from_dict"])
def test_a_blends_epoch_size_is_kept_by_the_loader_and_the_torch_dataset(pair, made):
    """``Blend(..., epoch_size=100)`` given to ``loader`` or ``ShardkitDataset`` read all 400 samples."""
    spec = {"sources": pair, "weights": {"web": 0.7, "code": 0.3}, "epoch_size": 100}
    blend = shardkit.Blend.from_dict(spec) if made == "from_dict" else shardkit.Blend(pair, weights=spec["weights"], epoch_size=100)
    batches = keys(shardkit.loader(blend, batch_size=10, decode=False))
    assert len(of("web", batches)) == 70 and len(of("code", batches)) == 30
    pytest.importorskip("torch")
    from shardkit.torch import ShardkitDataLoader, ShardkitDataset

    assert sum(map(len, keys(ShardkitDataLoader(ShardkitDataset(blend, batch_size=10, decode=False), num_workers=0)))) == 100


def test_ranks_get_equal_counts_and_read_disjoint_stretches(pair):
    per_rank = [
        keys(shardkit.loader(pair, weights={"web": 2, "code": 1}, epoch_size=333, batch_size=8, world_size=3, rank=r, decode=False))
        for r in range(3)
    ]
    assert {len(b) for b in per_rank} == {13}  # 333 -> 312 positions: 13 batches of 8 on each of 3 ranks
    every = [k for batches in per_rank for b in batches for k in b]
    assert len(every) == 312
    assert len(set(of("web", [every]))) == len(of("web", [every])) == 208
    padded = shardkit.loader(pair, weights={"web": 2, "code": 1}, epoch_size=333, batch_size=8, world_size=3, rank=0, drop_last=False)
    assert len(padded) == 14  # drop_last=False reads on into the sources instead of wrapping round


@pytest.mark.parametrize("extra", [{}, {"mix": 2, "num_workers": 1}], ids=["plain", "mix-workers"])
def test_resume_mid_epoch_is_exact(pair, extra):
    def make_loader():
        return shardkit.loader(pair, weights={"web": 0.6, "code": 0.4}, batch_size=12, decode=False, seed=9, **extra)

    with make_loader() as first:
        keys(first)  # into epoch 1, where the sources are mid-stream
        it = iter(first)
        for _ in range(7):
            next(it)
        state = json.loads(json.dumps(first.state_dict()))
        rest = [list(b["__key__"]) for b in it]
    assert state["format"] == "shardkit.blend" and state["epoch"] == 1
    assert set(state["sources"]) == {"web", "code"} and state["sources"]["code"]["epoch"] >= 1
    with make_loader() as second:
        second.load_state_dict(state)
        assert keys(second) == rest
        assert second.epoch == 2


def test_a_state_resumes_on_the_generations_it_was_taken_on(pair):
    """A source that grew by an append after the state was taken is read as it was then; the next loader reads the latest."""

    def make_loader():
        return shardkit.loader(pair, weights={"web": 0.6, "code": 0.4}, batch_size=12, decode=False, seed=9)

    with make_loader() as first:
        it = iter(first)
        for _ in range(7):
            next(it)
        state = json.loads(json.dumps(first.state_dict()))
        rest = [list(b["__key__"]) for b in it]
        following = keys(first)
    assert state["sources"]["web"]["generation"] == 0
    with shardkit.PileWriter(pair["web"], piles=4, seed=1, mode="append") as w:
        for i in range(50):
            w.write({"__key__": f"new{i:05d}", "txt": "new", "cls": i})
    with make_loader() as second:
        second.load_state_dict(state)
        assert keys(second) == rest and keys(second) == following
    assert any(k.startswith("new") for b in keys(make_loader()) for k in b)


def test_a_torch_state_resumes_on_the_generations_it_was_taken_on(pair):
    """As a loader's: a DataLoader's state names each source's generation, and a new dataset resumes on them."""
    pytest.importorskip("torch", reason="needs torch: pip install 'shardkit[torch]'")
    import shardkit.torch as data

    def make_loader():
        ds = data.ShardkitDataset(pair, weights={"web": 0.6, "code": 0.4}, batch_size=12, decode=False, seed=9)
        return data.ShardkitDataLoader(ds, num_workers=2)

    first = make_loader()
    it = iter(first)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    rest = [list(b["__key__"]) for b in it]
    assert state["sources"]["web"]["generation"] == 0
    with shardkit.PileWriter(pair["web"], piles=4, seed=1, mode="append") as w:
        for i in range(50):
            w.write({"__key__": f"new{i:05d}", "txt": "new", "cls": i})
    second = make_loader()
    second.load_state_dict(state)
    assert [list(b["__key__"]) for b in second] == rest


def test_a_state_of_other_shares_is_refused_naming_the_source(pair):
    state = shardkit.loader(pair, weights={"web": 0.6, "code": 0.4}, batch_size=10).state_dict()
    other = shardkit.loader(pair, weights={"web": 0.5, "code": 0.5}, batch_size=10)
    with pytest.raises(shardkit.ConfigError, match="source 'web': the state has wanted=240, this blend has wanted=200"):
        other.load_state_dict(state)


def test_different_fields_collate_with_none_and_say_so(tmp_path, pair, caplog):
    img = make(tmp_path, "img", 60, piles=2, seed=5, field="bin")
    with caplog.at_level(logging.INFO, logger="shardkit.loading.blend.source"):
        loader = shardkit.loader({"web": pair["web"], "img": img}, weights={"web": 1, "img": 1}, batch_size=6, decode=False, epoch_size=60)
    assert "different fields" in caplog.text
    batch = next(iter(loader))
    assert len(batch["txt"]) == 6 and batch["txt"].count(None) == 3 and batch["bin"].count(None) == 3


def test_keys_ledger_matches_what_is_read(pair):
    loader = shardkit.loader(pair, weights={"web": 0.7, "code": 0.3}, batch_size=10, world_size=2, rank=1, decode=False)
    assert loader.keys(3)[1] == keys(loader)[3]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p: shardkit.loader(p, weights={"web": -1, "code": 1}), "weight of 'web' is -1; expected a number >= 0"),
        (lambda p: shardkit.loader(p, weights={"web": 0, "code": 0}), "are all zero"),
        (lambda p: shardkit.loader(p, weights={}), "naming every source"),
        (lambda p: shardkit.loader(p, weights={"web": 1, "cod": 1}), "weights name 'cod', which is not a source"),
        (lambda p: shardkit.loader(p, weights={"web": 1}), "no weight for source 'code'"),
        (lambda p: shardkit.loader([{"name": "web", "path": p["web"]}, {"name": "web", "path": p["code"]}]), "'web' is listed twice"),
        (lambda p: shardkit.loader({"a": p["web"], "b": p["web"]}), "sources 'a' and 'b' are the same dataset"),
        (lambda p: shardkit.loader({"web": {"path": p["web"], "weight": 1, "count": 3}}), "has weight and count"),
        (lambda p: shardkit.loader({"web": {"path": p["web"], "weight": 1}, "code": p["code"]}), "'code' has no weight while others do"),
        (lambda p: shardkit.loader(p, epoch_size=100), "epoch_size=100 needs a weight on every source"),
        (lambda p: shardkit.loader(p, weights={"web": 1, "code": 1}, epoch_size=-3), "epoch_size is -3; expected an integer >= 1"),
        (lambda p: shardkit.loader(p, weights={"web": 1, "code": 1}, epoch_size=0), "epoch_size is 0; expected an integer >= 1"),
        (lambda p: shardkit.loader({"web": {"path": p["web"], "count": 1.5}}), "count of 'web' is 1.5; expected an integer >= 0"),
        (lambda p: shardkit.loader({}), "no sources"),
        (lambda p: shardkit.loader(p, weights={"web": 1, "code": 1}, epoch_size=10, batch_size=8, world_size=2, rank=0), "no whole batch"),
        (lambda p: shardkit.Blend.from_dict({"sources": p, "weight": {}}), "unknown key 'weight'"),
    ],
)
def test_bad_blends_are_config_errors_naming_what_is_wrong(pair, call, message):
    with pytest.raises(shardkit.ConfigError, match=message.replace("(", r"\(")):
        call(pair)


@pytest.mark.parametrize("share", [{"weight": 0}, {"count": 0}, {"repeat": 0}])
def test_an_empty_source_with_a_zero_share_is_read_as_the_error_advises(tmp_path, pair, share):
    with shardkit.PileWriter(str(tmp_path / "empty"), piles=2, seed=0):
        pass
    other = {"weight": 1} if "weight" in share else {}
    blend = {"web": {"path": pair["web"], **other}, "empty": {"path": str(tmp_path / "empty"), **share}}
    loader = shardkit.loader(blend, batch_size=10, decode=False, seed=0)
    batches = keys(loader)
    assert sorted(k for b in batches for k in b) == [f"web{i:05d}" for i in range(300)]
    it = iter(loader)
    next(it)
    state = loader.state_dict()  # the empty source's place in its stream is 0 too
    resumed = shardkit.loader(blend, batch_size=10, decode=False, seed=0)
    resumed.load_state_dict(state)
    assert keys(resumed) == [list(b["__key__"]) for b in it]
    with pytest.raises(shardkit.ConfigError, match=r"source 'empty' .* holds no samples; give it weight, count or repeat 0"):
        shardkit.loader({"web": pair["web"], "empty": str(tmp_path / "empty")}, batch_size=10)


def test_torch_dataloader_workers_read_the_blend_and_resume(pair):
    pytest.importorskip("torch")
    from shardkit.torch import ShardkitDataLoader, ShardkitDataset

    options = {"weights": {"web": 0.7, "code": 0.3}, "batch_size": 10, "decode": False, "seed": 2}
    alone = sorted(keys(shardkit.loader(pair, **options)))
    ds = ShardkitDataset(pair, **options)
    dl = ShardkitDataLoader(ds, num_workers=2)
    assert sorted(keys(dl)) == alone  # the same batches, taken in turns by the two workers
    ds.set_epoch(0)
    it = iter(dl)
    for _ in range(5):
        next(it)
    state = dl.state_dict()
    rest = [list(b["__key__"]) for b in it]
    again = ShardkitDataLoader(ShardkitDataset(pair, **options), num_workers=2)
    again.load_state_dict(state)
    assert keys(again) == rest


def test_many_piles_to_a_cell_never_stall_the_reader(tmp_path, monkeypatch):
    from shardkit.loading.blend import schedule as blend_schedule

    monkeypatch.setattr(blend_schedule, "CELL", 16)  # so an epoch spans many cells and many piles
    many = {"a": make(tmp_path, "a", 400, piles=40, seed=1), "b": make(tmp_path, "b", 200, piles=25, seed=2)}
    for extra in ({}, {"mix": 3, "prefetch": 0}):
        loader = shardkit.loader(many, weights={"a": 2, "b": 1}, batch_size=4, decode=False, **extra)
        batches = keys(loader) + keys(loader)
        assert len(of("b", batches)) == 400 and len(set(of("b", batches))) == 200


def test_a_blend_loader_is_the_loader_over_a_blends_source(pair):
    # what a blend reads differently lives in its source's epochs: the subclass overrides nothing,
    # and a plain Loader given the blended source reads the same order and resumes the same state
    assert {name for name, value in vars(BlendLoader).items() if callable(value)} == {"__init__"}
    with shardkit.loader(pair, weights={"web": 0.7, "code": 0.3}, batch_size=10, seed=3) as blended:
        with shardkit.Loader(blended.source, blended.options) as plain:
            assert keys(plain) == keys(blended)
            it = iter(plain)
            next(it)
            state = plain.state_dict()
        assert state["format"] == "shardkit.blend"
        blended.load_state_dict(state)
        assert len(keys(blended)) == len(blended) - 1


def test_a_source_that_cannot_be_opened_is_named(pair, tmp_path):
    web = pair["web"]
    with pytest.raises(shardkit.DatasetNotFoundError, match=r"^blend source 'code': .*nope: no such file or directory"):
        shardkit.loader({"web": web, "code": str(tmp_path / "nope")})
    (tmp_path / "empty").mkdir()
    with pytest.raises(shardkit.DatasetNotFoundError, match=r"^blend source 'x': .*empty: no shardkit.json here"):
        shardkit.loader([{"name": "w", "path": web}, {"name": "x", "path": str(tmp_path / "empty")}])


def test_len_counts_a_resumed_blend_epoch_s_rest(pair):
    """A blend's rest on another split is rounded up to whole batches: len() says so, so that a
    progress bar (and torch's check of it) is not short."""
    pytest.importorskip("torch", reason="the torch extra is not installed")
    import shardkit.torch as torch_data

    kw = dict(weights={"web": 0.7, "code": 0.3}, epoch_size=600, seed=0)
    first = torch_data.ShardkitDataLoader(torch_data.ShardkitDataset(pair, batch_size=10, **kw))
    it = iter(first)
    next(it)
    state = first.state_dict()
    del it
    resumed = torch_data.ShardkitDataLoader(torch_data.ShardkitDataset(pair, batch_size=16, rank=0, world_size=2, **kw))
    resumed.load_state_dict(state)
    assert len(resumed) == sum(1 for _ in resumed) == 19


@pytest.mark.parametrize("n, shuffle", [(1, True), (3, True), (3, False)])
def test_a_tiny_source_at_a_large_share_reads_its_own_epochs_one_after_another(tmp_path, n, shuffle):
    # a source read whole many times a cell is planned a use a pile, not a use a pile a cycle,
    # and one that reads in the same order every cycle is cut from that order: the order is the same
    big, tiny = make(tmp_path, "big", 500, piles=3, seed=1), make(tmp_path, "tiny", n, piles=2, seed=2)
    size = 30_000
    blended = shardkit.loader(
        {"big": big, "tiny": tiny}, weights={"big": 1, "tiny": 1}, epoch_size=size, batch_size=100, decode=False, seed=5, shuffle=shuffle
    )
    batches = keys(blended)
    stream = of("tiny", batches)
    assert len(stream) == size // 2 and all(len(of("tiny", [b])) == 50 for b in batches)
    alone = shardkit.loader(tiny, decode=False, seed=5, shuffle=shuffle)
    for cycle in [*range(12), (size // 2) // n - 1]:
        alone.set_epoch(cycle)
        assert stream[cycle * n : (cycle + 1) * n] == [s["__key__"] for s in alone]
    stream = of("big", batches)
    alone = shardkit.loader(big, decode=False, seed=5, shuffle=shuffle)
    for cycle in range(size // 2 // 500):
        alone.set_epoch(cycle)
        assert stream[cycle * 500 : (cycle + 1) * 500] == [s["__key__"] for s in alone]
