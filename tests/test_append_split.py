"""Appends that split grown piles into random leaves: uniformity, files, pins, gc, compression."""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
from scipy import stats
from test_append import LOADER_SEED, _append, _keys, _write, run_killed

import shardkit
from shardkit import manifest
from shardkit.dataset.transaction import Dataset
from shardkit.piles.router import draws, leaves
from shardkit.tar.shard import Shard

# a sample of _write is 1024 bytes of tar (a header and one block): 4 KiB holds 3 at 90%, 8 KiB 7
SMALL, MEDIUM = 4096, 8192

# (keys, window) of each stage: pass 1 (which may split a pile), an append to 8 samples (leaves,
# rewrites), then two windows that shrink the piles (leaves regroup without a rewrite)
STAGES = [([f"a{i}" for i in range(5)], None), (["b0", "b1", "b2"], None), (["c0", "c1"], 2), (["d0", "d1"], 2)]


def _grow(out: str, seed: int) -> Iterator[shardkit.Manifest]:
    """Write and grow one dataset through :data:`STAGES` with ``seed``; each stage's manifest."""
    for stage, (keys, window) in enumerate(STAGES):
        if stage == 0:
            yield _write(out, keys, seed=seed, max_pile_bytes=SMALL)
        else:
            yield _append(out, keys, seed=seed, max_pile_bytes=SMALL, window=window)


def _window(stage: int) -> list[str]:
    window = STAGES[stage][1]
    first = 0 if window is None else max(0, stage + 1 - window)
    return [k for keys, _ in STAGES[first : stage + 1] for k in keys]


def _resolution(pile: shardkit.PileInfo) -> int:
    """The k of a leaf's name (pile-000003.r4-1.tar), 1 for a whole pile."""
    return 1 if manifest.whole_pile(pile.name) is not None else int(pile.name.split(".r")[1].split("-")[0])


def _kinds(made: list[shardkit.Manifest]) -> set[str]:
    """Which kinds of split happened in one grown dataset."""
    found = set()
    if any(manifest.whole_pile(p.name) is None for p in made[0].piles):
        found.add("pass 1 split")
    if any(s.resolution > 1 and s.generation == 0 for p in made[1].piles for s in p.segments):
        found.add("rewrite")
    if any(s.resolution > _resolution(p) for m in made[2:] for p in m.piles for s in p.segments):
        found.add("regroup")
    return found


@pytest.mark.slow
def test_the_first_epoch_stays_uniform_through_splits_rewrites_and_a_shrinking_window(tmp_path):
    # after each append, every key of the window equally likely at every position of the first
    # epoch; at the last stage (4 samples) every one of the 24 orders equally likely
    trials = 400
    tables = {stage: np.zeros((len(_window(stage)),) * 2, dtype=np.int64) for stage in range(1, len(STAGES))}
    orders = dict.fromkeys(itertools.permutations(_window(len(STAGES) - 1)), 0)
    seen: set[str] = set()
    out = os.path.join(tmp_path, "ds")
    for seed in range(trials):
        shutil.rmtree(out, ignore_errors=True)
        made = []
        for stage, m in enumerate(_grow(out, seed)):
            made.append(m)
            if not stage:
                continue
            order, kept = _keys(out, seed=LOADER_SEED + seed), _window(stage)
            assert sorted(order) == sorted(kept)
            for position, key in enumerate(order):
                tables[stage][kept.index(key), position] += 1
        orders[tuple(order)] += 1
        seen |= _kinds(made)
    assert seen == {"pass 1 split", "rewrite", "regroup"}  # the trials went through each kind of split
    for table in tables.values():
        assert stats.chisquare(table.ravel()).pvalue > 1e-4, table
    assert stats.chisquare(list(orders.values())).pvalue > 1e-4, orders


def _check_leaves(out: str, m: shardkit.Manifest) -> None:
    """Every segment holds only samples of its leaf, and sits in the leaf pile that contains it."""
    for pile in m.piles:
        k = _resolution(pile)
        for segment in pile.segments:
            with open(os.path.join(out, segment.name), "rb") as f:
                keys = Shard(segment.name, f.read()).keys
            assert set(leaves(draws(m.seed, keys), segment.resolution).tolist()) == {segment.leaf}, segment
            assert segment.resolution >= k and pile.name == manifest.leaf_name(
                manifest.pile_number(pile.name), k, segment.leaf * k // segment.resolution
            )


def _epoch_is_whole(out: str, expected: list[str]) -> None:
    for seed in (1, 2):
        order = _keys(out, seed=seed)
        assert len(order) == len(set(order)) and sorted(order) == sorted(expected)


def test_an_append_splits_grown_piles_and_rewrites_only_the_coarse_segments(tmp_path, caplog):
    out = str(tmp_path / "ds")
    first = _write(out, [f"a{i:02d}" for i in range(40)], seed=4, max_pile_bytes=MEDIUM)
    assert first.split_piles == 2 and all(manifest.whole_pile(p.name) is None for p in first.piles)  # pass-1 sub-piles
    with caplog.at_level(logging.INFO, logger="shardkit.piles.append"):
        grown = _append(out, [f"b{i:02d}" for i in range(40)], seed=4, max_pile_bytes=MEDIUM)
    assert "rewritten" in caplog.text and "bytes of old segments rewritten" in caplog.text
    _check_leaves(out, grown)
    assert {_resolution(p) for p in grown.piles} == {8} and grown.split_piles == 2
    assert manifest.original_piles(grown) == 2 and shardkit.info(out).piles == len(grown.piles)
    assert all(s.generation in (0, 1) and s.name.endswith(".tar") for p in grown.piles for s in p.segments)
    _epoch_is_whole(out, [f"{c}{i:02d}" for c in "ab" for i in range(40)])
    assert shardkit.verify(out, quiet=True) == []  # the sub-piles a loader pinned to generation 0 reads are not strays
    # a small append: the piles keep their leaves, nothing old is rewritten
    small = _append(out, ["c0", "c1", "c2"], seed=4, max_pile_bytes=MEDIUM)
    old = {s for p in grown.piles for s in p.segments}
    assert old <= {s for p in small.piles for s in p.segments}
    # a window that halves the dataset: leaves regroup at a coarser resolution, no file is written but the new one
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="shardkit.piles.append"):
        shrunk = _append(out, ["d0"], seed=4, max_pile_bytes=MEDIUM, window=3)
    assert "rewritten into" not in caplog.text
    _check_leaves(out, shrunk)
    assert {_resolution(p) for p in shrunk.piles} <= {4} and any(s.resolution == 8 for p in shrunk.piles for s in p.segments)
    assert {s for p in shrunk.piles for s in p.segments if s.generation != 3} <= old | {s for p in small.piles for s in p.segments}
    _epoch_is_whole(out, [*(f"b{i:02d}" for i in range(40)), "c0", "c1", "c2", "d0"])
    assert shardkit.verify(out, quiet=True) == []


def test_an_older_generation_still_reads_and_gc_keeps_its_files_for_the_grace(tmp_path):
    out = str(tmp_path / "ds")
    _write(out, [f"a{i:02d}" for i in range(30)], seed=1, max_pile_bytes=SMALL)
    with shardkit.loader(out, decode=False, batch_size=5, seed=2) as loader:
        batches = iter(loader)
        head = [k for k in next(batches)["__key__"]]
        state = loader.state_dict()
    grown = _append(out, [f"b{i:02d}" for i in range(30)], seed=1, max_pile_bytes=SMALL)
    assert shardkit.gc(out, grace="1h").deleted == []
    resumed = shardkit.loader(out, decode=False, batch_size=5, seed=2)
    resumed.load_state_dict(state)
    assert resumed.source.generation == 0
    rest = [k for b in resumed for k in b["__key__"]]
    assert sorted(head + rest) == [f"a{i:02d}" for i in range(30)]
    report = shardkit.gc(out, grace=0)
    assert report.deleted and all(manifest.whole_pile(n) is None for n in report.deleted)  # the sub-piles, rewritten
    assert {n for n in os.listdir(out) if n.startswith("pile-")} == set(grown.files())
    _epoch_is_whole(out, [f"{c}{i:02d}" for c in "ab" for i in range(30)])


@pytest.mark.parametrize("later", ["zstd", None])
def test_rewritten_and_new_segments_follow_the_appends_compression(tmp_path, later):
    out = str(tmp_path / "ds")
    _write(out, [f"a{i:02d}" for i in range(30)], seed=2, max_pile_bytes=SMALL, compression="zstd")
    grown = _append(out, [f"b{i:02d}" for i in range(30)], seed=2, max_pile_bytes=SMALL, compression=later)
    suffix = ".tar.zst" if later else ".tar"
    assert all(s.name.endswith(suffix) and (s.compression == later) for p in grown.piles for s in p.segments)
    assert all(s.resolution > 1 for p in grown.piles for s in p.segments)
    assert manifest.read(out) == grown and shardkit.verify(out, quiet=True) == []
    _epoch_is_whole(out, [f"{c}{i:02d}" for c in "ab" for i in range(30)])


def test_a_leaf_over_the_limit_is_named_with_why(tmp_path, caplog):
    out = str(tmp_path / "ds")
    _write(out, ["a0", "a1"], piles=1, max_pile_bytes=MEDIUM)
    with caplog.at_level(logging.WARNING), shardkit.PileWriter(out, piles=1, mode="append", max_pile_bytes=MEDIUM) as w:
        for i in range(30):  # one sample near the limit alone, among small ones
            w.write({"__key__": f"b{i:02d}", "bin": b"x" * (6600 if i == 7 else 10)})
    grown = w.manifest
    assert len(grown.piles) > 1  # split: the counts say so
    big = max(grown.piles, key=lambda p: p.tar_size)
    over = sorted((p for p in grown.piles if p.tar_size > MEDIUM), key=lambda p: -p.tar_size)
    assert grown.extra["over_max_pile_bytes"] == [{"name": p.name, "bytes": p.tar_size} for p in over] and over[0] == big
    assert f"the largest, {big.name}, holds {big.tar_size} bytes of tar): piles are split by sample count alone" in caplog.text
    assert "samples larger than average" in caplog.text


def test_a_dataset_whose_piles_are_not_pass_1_piles_is_refused_by_name(tmp_path):
    out = str(tmp_path / "ds")
    m = _write(out, ["a0", "a1"], piles=1)
    os.rename(os.path.join(out, "pile-000000.tar"), os.path.join(out, "shard-000000.tar"))
    renamed = shardkit.PileInfo(name="shard-000000.tar", samples=2, bytes=m.piles[0].bytes, checksum=m.piles[0].checksum)
    manifest.write(out, shardkit.Manifest(piles=(renamed,), seed=0, fields=m.fields, created_by=m.created_by))
    with pytest.raises(shardkit.ConfigError, match=r"'shard-000000.tar' is not one of the 1 piles .* made by pass 1"):
        _append(out, ["b0"], piles=1)


def test_two_splitting_appends_racing_on_s3_leave_the_winners_files(s3):
    url = s3.url("ds")
    _write(url, [f"a{i}" for i in range(10)], piles=2, max_pile_bytes=SMALL)
    loser = shardkit.PileWriter(url, piles=2, mode="append", max_pile_bytes=SMALL)
    for i in range(6):
        loser.write({"__key__": f"l{i}", "bin": b"x"})
    winner = _append(url, [f"w{i}" for i in range(6)], piles=2, max_pile_bytes=SMALL)
    with pytest.raises(shardkit.DatasetExistsError, match="another job published here while this one ran"):
        loser.close()
    first = Dataset(url).pinned(0).files()
    objects = {name for path in s3.client().find(s3.path("ds")) if not (name := path.rsplit("/", 1)[1]).startswith(".")}
    assert objects == {"shardkit.json", "shardkit.g000000.json", *winner.files(), *first, *map(manifest.keys_name, first)}
    assert any(s.resolution > 1 for p in winner.piles for s in p.segments)
    assert sorted(_keys(url)) == sorted([f"a{i}" for i in range(10)] + [f"w{i}" for i in range(6)])
    # the loser removed its uploads and its install journal when the store refused its manifest: nothing is left over
    assert shardkit.verify(url, quiet=True) == []


def test_an_append_without_max_pile_bytes_keeps_the_datasets_limit(tmp_path, caplog):
    out = str(tmp_path / "ds")
    first = _write(out, [f"a{i}" for i in range(12)], piles=1, max_pile_bytes=SMALL)
    assert first.extra["max_pile_bytes"] == SMALL and len(first.piles) > 1  # pass 1 split the one pile
    with caplog.at_level(logging.INFO, logger="shardkit.piles.append"):
        grown = _append(out, [f"b{i}" for i in range(12)], piles=1)
    assert "the dataset's 4096 is used" in caplog.text
    assert grown.extra["max_pile_bytes"] == SMALL
    assert len(grown.piles) >= 4 and all(p.tar_size <= 2 * SMALL for p in grown.piles), "still split, not joined back"
    assert sorted(_keys(out)) == sorted([f"a{i}" for i in range(12)] + [f"b{i}" for i in range(12)])


def test_a_splitting_append_killed_in_its_install_leaves_files_verify_calls_leftovers(tmp_path):
    # killed (SIGKILL) after its segments moved in, before its manifest: the files its journal
    # names are the next job's to remove, not strays of the dataset
    out = str(tmp_path / "ds")
    _write(out, [f"a{i:02d}" for i in range(30)], seed=1, max_pile_bytes=SMALL)
    code = (
        "import os, signal, sys; sys.path.insert(0, sys.argv[2]); from shardkit import manifest; from test_append import _append; "
        "manifest.write = lambda *a: os.kill(os.getpid(), signal.SIGKILL); "
        "_append(sys.argv[1], [f'b{i:02d}' for i in range(30)], seed=1, max_pile_bytes=4096)"
    )
    run_killed(code, out)
    moved = [n for n in os.listdir(out) if n.startswith("pile-") and ".g000001." in n]
    assert moved and manifest.read(out).generation == 0
    problems = shardkit.verify(out, quiet=True)
    assert {p.kind for p in problems} == {"leftover"} and set(moved) <= {p.name for p in problems}
    grown = _append(out, [f"b{i:02d}" for i in range(30)], seed=1, max_pile_bytes=SMALL)  # the rerun removes them first
    assert grown.generation == 1 and shardkit.verify(out, quiet=True) == []
    assert sorted(_keys(out)) == sorted([f"{c}{i:02d}" for c in "ab" for i in range(30)])


def test_the_kill_campaign_on_splitting_appends_runs_clean_for_two_rounds():
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "kill_append.py")
    done = subprocess.run([sys.executable, script, "--rounds", "2", "--seed", "3"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 rounds identical to an uninterrupted append, 0 failed" in done.stdout
