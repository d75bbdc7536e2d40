"""Datasets that grow: append as segments, generations, the moving window, keys across generations."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from conftest import STOP_AT, unit_samples, write_wds_shards
from scipy import stats

import shardkit
from shardkit import manifest
from shardkit.cli.main import main
from shardkit.dataset import layout
from shardkit.dataset.transaction import Dataset
from shardkit.tools import audit

LOADER_SEED = 100_000  # loader seeds kept apart from writer seeds


def _write(out: str, keys: list[str], *, seed: int = 0, piles: int = 2, **options) -> shardkit.Manifest:
    with shardkit.PileWriter(out, piles=piles, seed=seed, **options) as w:
        for key in keys:
            w.write({"__key__": key, "bin": key.encode()})
    assert w.manifest is not None
    return w.manifest


def _append(out: str, keys: list[str], **options) -> shardkit.Manifest:
    return _write(out, keys, mode="append", **options)


def _keys(out: str, seed: int = 0) -> list[str]:
    with shardkit.loader(out, decode=False, seed=seed) as loader:
        return [s["__key__"] for s in loader]


def _position_table(generations: list[list[str]], window: int | None, trials: int, tmp_path) -> np.ndarray:
    """How often each key of the window comes at each position of the first epoch, over ``trials``
    datasets written (and appended to) with seeds 0..trials-1 and read by the real loader."""
    kept = [k for g in generations[-window if window else 0 :] for k in g]
    table = np.zeros((len(kept), len(kept)), dtype=np.int64)
    out = os.path.join(tmp_path, "ds")
    for seed in range(trials):
        shutil.rmtree(out, ignore_errors=True)
        _write(out, generations[0], seed=seed)
        for keys in generations[1:]:
            _append(out, keys, seed=seed, window=window)
        order = _keys(out, seed=LOADER_SEED + seed)
        assert sorted(order) == sorted(kept)
        for position, key in enumerate(order):
            table[kept.index(key), position] += 1
    return table


@pytest.mark.slow
@pytest.mark.parametrize(
    ("generations", "window"),
    [([["a0", "a1", "a2"], ["b0", "b1"]], None), ([["a0", "a1"], ["b0", "b1", "b2"], ["c0", "c1"]], 2)],
    ids=["append", "window"],
)
def test_first_epoch_over_the_union_is_uniform(tmp_path, generations, window):
    # a new generation's samples must not cluster (at the end, in their own piles): every key is
    # equally likely at every position, as after one pass 1 over the union
    trials = 150
    table = _position_table(generations, window, trials, tmp_path)
    chi2 = stats.chisquare(table.ravel())
    assert chi2.pvalue > 1e-4, table
    # old and new samples alike: the mean position of the last generation's keys is the middle
    last = len(generations[-1])
    mean = (table[-last:] * np.arange(table.shape[1])).sum() / (last * trials)
    assert abs(mean - (table.shape[1] - 1) / 2) < 0.3, table


def test_append_adds_segments_and_leaves_the_old_files_alone(tmp_path):
    out = str(tmp_path / "ds")
    first = _write(out, [f"a{i:03d}" for i in range(40)], piles=3, seed=7)
    before = {n: (tmp_path / "ds" / n).read_bytes() for n in first.files()}
    old_loader = shardkit.loader(out, decode=False, seed=1)
    result = shardkit.preprocess(
        [0, 1], lambda u: ({"__key__": f"b{u}-{i}", "bin": b"new"} for i in range(10)), out, piles=3, seed=7, mode="append", quiet=True
    )
    assert result.generation == 1 and result.samples == 60
    assert {n: (tmp_path / "ds" / n).read_bytes() for n in first.files()} == before
    for p, pile in enumerate(result.piles):
        assert pile.name == f"pile-{p:06d}.tar"
        assert [s.generation for s in pile.segments] == [0, 1]
        assert pile.segments[1].name == f"pile-{p:06d}.g000001.tar"
    # a loader opened on generation 0 keeps reading it; a new one reads both generations
    assert sorted(s["__key__"] for s in old_loader) == sorted(f"a{i:03d}" for i in range(40))
    assert len(set(_keys(out))) == 60
    assert Dataset(out).pinned(0) == first


def test_the_segments_of_a_pile_are_read_as_one_tar_by_any_reader(tmp_path):
    out = str(tmp_path / "ds")
    _write(out, ["a0", "a1", "a2"], piles=1)
    _append(out, ["b0", "b1"], piles=1)
    (pile,) = manifest.read(out).piles
    # the inner trailers are left out: one stream, as tarfile reads it
    import tarfile

    from shardkit.loading.source import resolve

    source = resolve(out)
    buf = source.fetch(0).buf
    assert len(buf) == pile.bytes
    with tarfile.open(fileobj=__import__("io").BytesIO(bytes(buf))) as tar:
        assert sorted(m.name.split(".")[0] for m in tar.getmembers()) == ["a0", "a1", "a2", "b0", "b1"]


def test_a_key_already_in_the_dataset_is_refused_and_nothing_is_published(tmp_path):
    out = str(tmp_path / "ds")
    _write(out, [f"a{i}" for i in range(20)])
    seen = (tmp_path / "ds" / "shardkit.json").read_bytes()
    with pytest.raises(
        shardkit.SampleError,
        match=r"key 'a7' of this append is already in the dataset, in pile-00000\d\.tar .*was appended before, or its keys restart",
    ):
        _append(out, ["new", "a7"])
    assert (tmp_path / "ds" / "shardkit.json").read_bytes() == seen
    _append(out, ["b0"])
    with pytest.raises(shardkit.SampleError, match=r"key 'b0' .* in pile-00000\d\.g000001\.tar \(generation 1\)"):
        _append(out, ["b0"])


def test_a_damaged_key_hash_file_is_made_again_and_a_repeated_key_still_refused(tmp_path, caplog):
    # a .keys file is only an index of its segment: a torn or edited one is read from the segment again
    out = str(tmp_path / "ds")
    _write(out, ["a0", "a1", "a2", "a3"], piles=1)
    _append(out, ["b0", "b1", "b2"], piles=1)
    keys = tmp_path / "ds" / "pile-000000.g000001.keys"
    keys.write_bytes(keys.read_bytes()[:-3])
    with caplog.at_level(logging.WARNING), pytest.raises(shardkit.SampleError, match=r"key 'b1' .* in pile-000000\.g000001\.tar"):
        _append(out, ["c0", "b1"], piles=1)
    assert "pile-000000.g000001.keys: 21 bytes, its 3 samples need 24" in caplog.text
    keys.write_bytes(b"")  # emptied by a crash: no key to compare with would let every key through
    with pytest.raises(shardkit.SampleError, match=r"key 'b2' .* in pile-000000\.g000001\.tar"):
        _append(out, ["b2"], piles=1)


def test_a_keys_file_missing_torn_or_out_of_order_is_written_again_by_the_next_append(tmp_path, caplog):
    # every keys file an append writes is sorted and 8 bytes a sample, cheap to check: one that is
    # not was changed since, so none of its hashes is trusted; the segment's are put back
    out = str(tmp_path / "ds")
    _write(out, ["a0", "a1", "a2", "a3"], piles=1)
    _append(out, ["b0", "b1", "b2"], piles=1)
    _append(out, ["c0", "c1"], piles=1)
    files = [tmp_path / "ds" / name for name in ("pile-000000.keys", "pile-000000.g000001.keys", "pile-000000.g000002.keys")]
    held = [f.read_bytes() for f in files]
    files[0].unlink()
    files[1].write_bytes(np.frombuffer(held[1], dtype="<u8")[::-1].tobytes())
    files[2].write_bytes(held[2][:-1])
    with caplog.at_level(logging.INFO):
        _append(out, ["d0"], piles=1)
    assert "pile-000000.keys is missing: reading the keys of" in caplog.text
    assert "pile-000000.g000001.keys: not sorted: hash 1 is smaller than hash 0 (2 such places): reading the keys of" in caplog.text
    assert "pile-000000.g000002.keys: 15 bytes, its 2 samples need 16: reading the keys of" in caplog.text
    assert [f.read_bytes() for f in files] == held
    assert shardkit.verify(out, quiet=True) == []


def test_appending_shards_named_like_earlier_ones_says_why_their_keys_repeat(tmp_path, capsys):
    # ordinary shards, keys from 000000 in each: their keys are prefixed with the shard's name
    def day(d):
        folder = tmp_path / f"day{d}"
        folder.mkdir()
        return write_wds_shards(str(folder), "shard-{:06d}.tar", 2, lambda k, i: {"__key__": f"{i:06d}", "txt": f"{d}"} if i < 20 else None)

    out = str(tmp_path / "grow")
    first, second = day(1), day(2)
    assert main(["pile", *first, "-o", out, "--piles", "3", "-q"]) == 0
    seen = (tmp_path / "grow" / "shardkit.json").read_bytes()
    assert main(["pile", *second, "-o", out, "--piles", "3", "--append", "-q"]) == 1
    said = capsys.readouterr().err
    assert "key 'shard-00000" in said and "is already in the dataset" in said, said
    assert "input shards are named like earlier ones: each key starts with its shard's name ('shard-00000" in said, said
    assert (tmp_path / "grow" / "shardkit.json").read_bytes() == seen
    renamed = [os.path.join(os.path.dirname(p), "day2-" + os.path.basename(p)) for p in second]
    for old, new in zip(second, renamed, strict=True):
        os.rename(old, new)
    assert main(["pile", *renamed, "-o", out, "--piles", "3", "--append", "-q"]) == 0  # the way out the message gives
    assert len(_keys(out)) == 80


def test_a_key_twice_in_one_append_is_refused_across_piles(tmp_path):
    out = str(tmp_path / "ds")
    _write(out, ["a0"], piles=1)
    # two units with one key: pass 1 refuses them in one pile and in two
    fn = lambda u: [{"__key__": "dup" if u in (0, 5) else f"k{u}", "bin": b"x"}]  # noqa: E731
    with pytest.raises(shardkit.SampleError, match="has the key 'dup'"):  # one pile: pass 1's own check
        shardkit.preprocess(list(range(8)), fn, out, piles=1, mode="append", quiet=True)
    out2 = str(tmp_path / "ds2")
    _write(out2, ["a0"], piles=64)
    with pytest.raises(shardkit.SampleError, match=r"pile \d+: sample 0 .* has the key 'dup' of pile \d+'s sample 0"):
        shardkit.preprocess(list(range(8)), fn, out2, piles=64, mode="append", quiet=True)


def test_bad_appends_name_what_differs(tmp_path, caplog):
    out = str(tmp_path / "ds")
    with pytest.raises(shardkit.DatasetNotFoundError, match="no shardkit dataset to append to"):
        _append(out, ["a"])
    _write(out, ["a0", "a1"], piles=2, seed=3)
    with pytest.raises(shardkit.ConfigError, match=r"piles: .* has 2 piles, this append asks for 4"):
        _append(out, ["b"], piles=4, seed=3)
    with pytest.raises(shardkit.ConfigError, match=r"seed: .* written with seed=3, this append has seed=5"):
        _append(out, ["b"], piles=2, seed=5)
    with pytest.raises(shardkit.ConfigError, match="cannot also replace it"):
        _append(out, ["b"], piles=2, seed=3, overwrite=True)
    with pytest.raises(shardkit.ConfigError, match="window: only used with mode='append'"):
        _write(str(tmp_path / "other"), ["b"], window=2)
    with pytest.raises(shardkit.ConfigError, match="window: expected a duration like 90d"):
        _append(out, ["b"], piles=2, seed=3, window="soon")
    # 2.0 is no count of generations and names no unit: read as 2 seconds it would retire them all
    for number in (2.0, 1.5):
        with pytest.raises(
            shardkit.ConfigError,
            match=rf"window: expected a number of generations \(an integer\) or a duration with its unit \('7d', '12h'\), got {number}",
        ):
            _append(out, ["b"], piles=2, seed=3, window=number)
    with caplog.at_level(logging.WARNING), shardkit.PileWriter(out, piles=2, seed=3, mode="append") as w:
        w.write({"__key__": "c0", "txt": "other fields"})
    assert "generation 1 has fields ['txt'], the dataset had ['bin']" in caplog.text
    assert w.manifest.fields == ("bin", "txt")


def test_a_second_append_while_one_runs_fails_at_once_and_the_first_wins(tmp_path):
    out = str(tmp_path / "ds")
    _write(out, ["a0", "a1"])
    with shardkit.PileWriter(out, piles=2, mode="append") as first:
        first.write({"__key__": "b0", "bin": b"x"})
        with pytest.raises(shardkit.DatasetExistsError, match="another job is writing here"):
            _append(out, ["c0"])
    assert manifest.read(out).generation == 1
    assert sorted(_keys(out)) == ["a0", "a1", "b0"]


def test_window_by_count_retires_old_generations_in_the_same_manifest(tmp_path):
    out = str(tmp_path / "ds")
    _write(out, ["a0", "a1"])
    _append(out, ["b0", "b1"], window=2)
    m = _append(out, ["c0", "c1"], window=2)
    assert m.generation == 2 and sorted(m.generations) == [1, 2]
    assert sorted(_keys(out)) == ["b0", "b1", "c0", "c1"]
    assert {s.generation for p in m.piles for s in p.segments} <= {1, 2}
    # the retired files are still there (gc deletes them), and generation 1 still reads all it had
    assert (tmp_path / "ds" / "pile-000000.tar").exists()
    assert Dataset(out).pinned(1).samples == 4


def test_window_by_time_keeps_the_generations_written_within_it(tmp_path):
    out = str(tmp_path / "ds")
    _write(out, ["a0", "a1"])
    os.utime(tmp_path / "ds" / "shardkit.json", (1, 1))  # generation 0 written long ago
    m = _append(out, ["b0", "b1"], window="90d")
    assert sorted(m.generations) == [1]
    assert sorted(_keys(out)) == ["b0", "b1"]
    m = _append(out, ["c0"], window="1h")
    assert sorted(m.generations) == [1, 2]


def test_cli_append_and_yaml_mode_append(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    _write(str(src / "one"), [f"x{i}" for i in range(6)], piles=1)
    _write(str(src / "two"), [f"y{i}" for i in range(4)], piles=1)
    out = str(tmp_path / "ds")
    assert main(["pile", str(src / "one" / "pile-000000.tar"), "-o", out, "--piles", "2", "-q"]) == 0
    assert main(["pile", str(src / "two" / "pile-000000.tar"), "-o", out, "--piles", "2", "--append", "-q"]) == 0
    assert "generation 1" in capsys.readouterr().out
    assert sorted(_keys(out)) == sorted([f"x{i}" for i in range(6)] + [f"y{i}" for i in range(4)])
    job = tmp_path / "job.yaml"
    job.write_text(f"job: pile\ninputs: {src / 'one' / 'pile-000000.tar'}\noutput: {{path: {out}, piles: 2, mode: append}}\n")
    assert main(["run", str(job), "-q"]) == 1  # the same keys again
    assert "already in the dataset" in capsys.readouterr().err
    assert manifest.read(out).generation == 1


def test_plan_counts_follow_the_segments(tmp_path):
    out = str(tmp_path / "ds")
    _write(out, [f"a{i}" for i in range(30)], piles=3)
    m = _append(out, [f"b{i}" for i in range(30)], piles=3)
    counts = Counter()
    with shardkit.loader(out, decode=False) as loader:
        for pile in loader.source.piles:
            counts[os.path.basename(pile.url)] = pile.samples
    assert counts == {p.name: p.samples for p in m.piles}


# --- loader states pin a generation; gc ---------------------------------------------------------


def test_a_state_resumes_on_its_generation_after_an_append(tmp_path):
    out = str(tmp_path / "ds")
    _write(out, [f"a{i:03d}" for i in range(40)], piles=4)
    with shardkit.loader(out, decode=False, batch_size=5, seed=2) as loader:
        batches = iter(loader)
        head = [k for _ in range(3) for k in next(batches)["__key__"]]
        state = loader.state_dict()
        rest = [k for b in batches for k in b["__key__"]]
    assert state["generation"] == 0
    _append(out, [f"b{i:03d}" for i in range(40)], piles=4)
    resumed = shardkit.loader(out, decode=False, batch_size=5, seed=2)
    assert resumed.source.generation == 1 and len(resumed) == 16
    resumed.load_state_dict(state)
    assert resumed.source.generation == 0
    assert [k for b in resumed for k in b["__key__"]] == rest and len(head + rest) == 40
    # the latest generation's own state resumes on it
    latest = shardkit.loader(out, decode=False, batch_size=5, seed=2)
    state = latest.state_dict()
    assert state["generation"] == 1
    shardkit.loader(out, decode=False, batch_size=5, seed=2).load_state_dict(state)


def test_a_state_refused_leaves_the_loader_on_its_generation(tmp_path):
    out = str(tmp_path / "ds")
    _write(out, [f"a{i:03d}" for i in range(40)], piles=4)
    state = shardkit.loader(out, decode=False, batch_size=5, seed=3).state_dict()  # generation 0, another seed
    _append(out, [f"b{i:03d}" for i in range(40)], piles=4)
    loader = shardkit.loader(out, decode=False, batch_size=5, seed=2)
    with pytest.raises(shardkit.ConfigError, match="the state was taken with seed=3"):
        loader.load_state_dict(state)
    assert loader.source.generation == 1 and len(loader) == 16


def test_a_state_of_two_ranks_resumes_its_generation_on_three(tmp_path):
    # pinning a generation and changing the number of ranks, in one state
    out = str(tmp_path / "ds")
    _write(out, [f"a{i:03d}" for i in range(60)], piles=4)
    read: list[str] = []
    for rank in range(2):
        with shardkit.loader(out, decode=False, batch_size=5, seed=3, world_size=2, rank=rank) as loader:
            batches = iter(loader)
            read += [k for _ in range(2) for k in next(batches)["__key__"]]
            state = loader.state_dict()
    _append(out, [f"b{i:03d}" for i in range(30)], piles=4)
    rest: list[str] = []
    for rank in range(3):
        resumed = shardkit.loader(out, decode=False, batch_size=5, seed=3, world_size=3, rank=rank)
        resumed.load_state_dict(state)
        assert resumed.source.generation == 0
        rest += [k for b in resumed for k in b["__key__"]]
    assert len(read) == 20 and len(rest) == 30  # 40 left: two whole batches on each of three ranks
    assert len(set(read + rest)) == 50 and all(k.startswith("a") for k in read + rest)


def test_gc_deletes_retired_files_after_the_grace_and_a_state_on_them_fails_naming_its_generation(tmp_path, capsys):
    out = str(tmp_path / "ds")
    _write(out, ["a0", "a1", "a2"])
    state = shardkit.loader(out, decode=False).state_dict()
    _append(out, ["b0", "b1"], window=1)
    _append(out, ["c0", "c1"], window=1)
    before = set(os.listdir(out))
    report = shardkit.gc(out, grace="1h")  # generations 0 and 1 were replaced seconds ago
    assert report.deleted == [] and report.kept_generations == [0, 1, 2]
    assert main(["gc", out, "--grace", "90", "--dry-run"]) == 1  # 90 what? refused, not taken as seconds
    assert "grace: expected a duration like 90d, 12h, 30m or 45s, got '90'" in capsys.readouterr().err
    assert main(["gc", out, "--grace", "0", "--dry-run"]) == 0  # zero needs no unit
    said = capsys.readouterr().out
    assert "would delete" in said and set(os.listdir(out)) == before
    doomed = shardkit.gc(out, grace=0, dry_run=True).deleted
    assert "pile-000000.tar" in doomed and all(f"\n  {name}\n" in said + "\n" for name in doomed), said  # --dry-run lists them
    report = shardkit.gc(out, grace=0)
    assert report.kept_generations == [2] and report.freed > 0
    left = set(os.listdir(out))
    assert left == {"shardkit.json", *manifest.read(out).files()}
    assert all(".g000002." in n for n in left if n.startswith("pile-"))
    assert sorted(_keys(out)) == ["c0", "c1"]
    with pytest.raises(shardkit.DatasetNotFoundError, match="generation 0 is gone"):
        shardkit.loader(out, decode=False).load_state_dict(state)


def test_a_state_fails_naming_its_generation_when_its_files_are_deleted(tmp_path):
    out = str(tmp_path / "ds")
    _write(out, ["a0", "a1", "a2"])
    state = shardkit.loader(out, decode=False).state_dict()
    _append(out, ["b0"], window=1)
    os.unlink(tmp_path / "ds" / "pile-000000.tar")
    with pytest.raises(shardkit.DatasetNotFoundError, match=r"generation 0 is gone: 1 of its files were deleted \(pile-000000.tar"):
        shardkit.loader(out, decode=False).load_state_dict(state)


def test_gc_reports_what_dead_jobs_left_and_a_dry_run_lists_it_and_removes_nothing(tmp_path, capsys):
    out = tmp_path / "ds"
    _write(str(out), ["a0", "a1"])
    # what a job killed while installing leaves: its staging, a half-written manifest, a journal and the pile it moved in
    staging = out / f"{layout.STAGING_PREFIX}{'0' * 32}"
    staging.mkdir()
    (staging / layout.OWNER).write_text("{}")
    (staging / "000000.part").write_bytes(b"x" * 100)
    partial = f"{manifest.MANIFEST}.partial-{'a' * 32}"
    (out / partial).write_text("{")
    (out / "pile-000007.tar").write_bytes(b"y" * 512)
    journal = layout.journal_name("1" * 32)
    (out / journal).write_text(json.dumps({"files": ["pile-000007.tar"], "delete": []}))
    dead = {staging.name, partial, "pile-000007.tar", journal}
    before = set(os.listdir(out))
    assert main(["gc", str(out), "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert set(os.listdir(out)) == before  # a dry run removes nothing, a dead job's leftovers included
    assert "would delete 4 files" in said and all(f"\n  {name}\n" in said + "\n" for name in dead), said
    dry = shardkit.gc(str(out), dry_run=True)
    report = shardkit.gc(str(out))
    assert set(report.deleted) == dead and report.deleted == dry.deleted and report.freed == dry.freed >= 100 + 512
    assert set(os.listdir(out)) == before - dead


def test_gc_refuses_a_directory_without_a_dataset(tmp_path):
    with pytest.raises(shardkit.DatasetNotFoundError):
        shardkit.gc(str(tmp_path / "nothing"))
    assert not (tmp_path / "nothing").exists()


# --- object stores ------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [None, "zstd"])
def test_append_to_s3_reads_back_through_the_cache(s3, tmp_path, codec):
    url = s3.url(f"ds-{codec}")
    _write(url, [f"a{i}" for i in range(12)], piles=3, compression=codec)
    m = _append(url, [f"b{i}" for i in range(9)], piles=3, compression=codec)
    assert m.generation == 1 and m.samples == 21
    assert all(s.compression == codec for p in m.piles for s in p.segments)
    assert shardkit.verify(url, quiet=True) == []
    cache = str(tmp_path / "cache")
    for _ in range(2):  # the second epoch from the cache
        with shardkit.loader(url, decode=False, cache_dir=cache) as loader:
            assert sorted(s["__key__"] for s in loader) == sorted([f"a{i}" for i in range(12)] + [f"b{i}" for i in range(9)])


def test_two_appends_racing_on_s3_one_wins_and_no_manifest_is_lost(s3):
    url = s3.url("ds")
    _write(url, ["a0", "a1", "a2"], piles=2)
    loser = shardkit.PileWriter(url, piles=2, mode="append")
    loser.write({"__key__": "l0", "bin": b"x"})
    winner = _append(url, ["w0", "w1"], piles=2)
    with pytest.raises(shardkit.DatasetExistsError, match="another job published here while this one ran"):
        loser.close()
    assert manifest.read(url) == winner
    objects = {name for path in s3.client().find(s3.path("ds")) if not (name := path.rsplit("/", 1)[1]).startswith(".")}
    assert objects == {"shardkit.json", "shardkit.g000000.json", *winner.files()}  # the loser's uploads are gone
    assert sorted(_keys(url)) == ["a0", "a1", "a2", "w0", "w1"]
    assert Dataset(url).pinned(0).samples == 3


def test_verify_checks_each_segment_and_the_loader_names_a_bad_one(tmp_path):
    out = str(tmp_path / "ds")
    _write(out, ["a0", "a1", "a2", "a3"], piles=1)
    _append(out, ["b0", "b1"], piles=1)
    assert shardkit.verify(out, quiet=True) == []
    segment = tmp_path / "ds" / "pile-000000.g000001.tar"
    data = bytearray(segment.read_bytes())
    data[600] ^= 1
    segment.write_bytes(bytes(data))
    assert [(p.name, p.kind) for p in shardkit.verify(out, quiet=True)] == [("pile-000000.g000001.tar", "checksum")]
    with pytest.raises(shardkit.CorruptShardError, match=r"pile-000000\.g000001\.tar: checksum is crc32:"):
        _keys(out)


def test_verify_while_an_append_publishes_reports_none_of_its_files(tmp_path, monkeypatch):
    out = str(tmp_path / "ds")
    _write(out, [f"a{i}" for i in range(8)], piles=2)
    real = audit._check_pile

    def then_an_append(*args, **kw):  # verify holds generation 0's manifest: an append publishes generation 1
        if manifest.read(out).generation == 0:
            _append(out, [f"b{i}" for i in range(8)], piles=2)
        return real(*args, **kw)

    monkeypatch.setattr(audit, "_check_pile", then_an_append)
    assert shardkit.verify(out, quiet=True) == []


@pytest.mark.parametrize("change", ["overwrite", "window and gc"])
def test_verify_while_a_job_removes_the_generation_it_reads_verifies_the_one_there_now(tmp_path, monkeypatch, change, caplog):
    out = str(tmp_path / "ds")
    _write(out, [f"a{i}" for i in range(8)], piles=2)
    real = audit._check_pile

    def then_generation_0_goes(*args, **kw):  # verify holds generation 0's manifest; its files go
        if args[1].name == "pile-000000.tar" and manifest.read(out).piles[0].name == "pile-000000.tar":
            if change == "overwrite":
                _write(out, [f"c{i}" for i in range(8)], piles=2, overwrite=True)
            else:
                _append(out, [f"b{i}" for i in range(8)], piles=2, window=1)
                shardkit.gc(out, grace=0)
        return real(*args, **kw)

    monkeypatch.setattr(audit, "_check_pile", then_generation_0_goes)
    with caplog.at_level(logging.WARNING, logger="shardkit.tools.audit"):
        assert shardkit.verify(out, quiet=True) == []
    assert "was replaced while verify read it" in caplog.text


def test_verify_when_a_file_goes_between_its_check_and_its_read_verifies_the_generation_there_now(tmp_path, monkeypatch):
    """The overwrite lands after verify saw the file there and before it read it: 'unreadable', not 'missing', is as moot."""
    out = str(tmp_path / "ds")
    _write(out, [f"a{i}" for i in range(8)], piles=1)  # one pile: no other file of it to find missing
    real = audit.storage.exists

    def then_it_goes(url, *args, **kw):
        there = real(url, *args, **kw)
        if url.endswith("pile-000000.tar") and manifest.read(out).piles[0].name == "pile-000000.tar":
            _write(out, [f"c{i}" for i in range(8)], piles=1, overwrite=True)
        return there

    monkeypatch.setattr(audit.storage, "exists", then_it_goes)
    assert shardkit.verify(out, quiet=True) == []


# --- with compression, repeat= and resume=True --------------------------------------------------


def test_append_onto_a_compressed_dataset_writes_compressed_segments_any_reader_checks(tmp_path):
    out = str(tmp_path / "ds")
    first = _write(out, [f"a{i:02d}" for i in range(30)], piles=3, compression="zstd")
    assert all(p.name.endswith(".tar.zst") for p in first.piles)
    zstd = _append(out, [f"b{i:02d}" for i in range(20)], piles=3, compression="zstd")
    plain = _append(out, [f"c{i:02d}" for i in range(10)], piles=3)  # a dataset may mix plain and compressed segments
    gzip = _append(out, [f"d{i:02d}" for i in range(10)], piles=3, compression="gzip", compression_level=1)
    assert gzip.generation == 3 and gzip.samples == 70
    for p, pile in enumerate(gzip.piles):
        names = [s.name for s in pile.segments if s.generation in (0, 1)]
        assert names == [f"pile-{p:06d}.tar.zst", f"pile-{p:06d}.g000001.tar.zst"][: len(names)]
        for segment in pile.segments:
            suffix = {0: ".tar.zst", 1: ".tar.zst", 2: ".tar", 3: ".tar.gz"}[segment.generation]
            assert segment.name.endswith(suffix)
            assert (segment.compression is None) == (suffix == ".tar")
            assert (tmp_path / "ds" / manifest.keys_name(segment.name)).exists()
    assert manifest.read(out) == gzip  # the segments' compression fields go through the manifest
    assert gzip.tar_bytes == sum(p.bytes for p in gzip.piles) and gzip.bytes < gzip.tar_bytes
    assert sorted(_keys(out)) == sorted(f"{c}{i:02d}" for c, n in zip("abcd", (30, 20, 10, 10), strict=True) for i in range(n))
    assert shardkit.verify(out, quiet=True) == []
    assert shardkit.info(out).compression == "gzip, zstd"
    # keys stay unique against compressed segments, whatever the old and new ones are stored as
    with pytest.raises(shardkit.SampleError, match=r"key 'a07' .* already in the dataset, in pile-00000\d\.tar\.zst \(generation 0\)"):
        _append(out, ["a07"], piles=3)
    with pytest.raises(shardkit.SampleError, match=r"key 'b03' .* in pile-00000\d\.g000001\.tar\.zst \(generation 1\)"):
        _append(out, ["b03"], piles=3, compression="zstd")
    assert manifest.read(out) == gzip and zstd.generation == 1 and plain.generation == 2
    # a state taken on a compressed generation resumes on it; gc keeps what the manifest lists
    assert [g for g in shardkit.gc(out, grace=0).kept_generations] == [3]
    assert sorted(p.name for p in (tmp_path / "ds").iterdir() if p.name.startswith("pile-")) == sorted(
        n for n in gzip.files() if n.startswith("pile-")
    )
    assert shardkit.verify(out, quiet=True) == []


def test_a_damaged_compressed_segment_is_named_by_verify_and_the_loader(tmp_path):
    out = str(tmp_path / "ds")
    _write(out, ["a0", "a1", "a2"], piles=1, compression="zstd")
    _append(out, ["b0", "b1"], piles=1, compression="zstd")
    segment = tmp_path / "ds" / "pile-000000.g000001.tar.zst"
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 1
    segment.write_bytes(bytes(data))
    assert next((p.name, p.kind) for p in shardkit.verify(out, quiet=True)) == ("pile-000000.g000001.tar.zst", "checksum")
    with pytest.raises(shardkit.CorruptShardError, match=r"pile-000000\.g000001\.tar\.zst: checksum is crc32:"):
        _keys(out)


def test_append_with_repeat_routes_each_copy_like_a_sample(tmp_path):
    out = str(tmp_path / "ds")

    def fn(unit):
        for k in range(20):
            yield {"__key__": f"g{unit}-{k:02d}", "cls": str(k % 2), "bin": b"x" * 50}

    first = shardkit.preprocess([0], fn, out, piles=4, seed=5, repeat="cls:1=3", quiet=True)
    grown = shardkit.preprocess([1], fn, out, piles=4, seed=5, repeat="cls:1=3", mode="append", quiet=True)
    assert first.samples == 40 and grown.samples == 80 and grown.generation == 1
    keys = _keys(out)
    assert len(keys) == len(set(keys)) == 80
    assert {k for k in keys if k.startswith("g1-01")} == {"g1-01", "g1-01_r1", "g1-01_r2"}
    assert grown.extra["repeat"]["generation"] == 1 and grown.extra["repeat"]["written_samples"] == 40
    # the copies of the appended samples spread over the piles as the samples do
    new = Counter(s.samples for pile in grown.piles for s in pile.segments if s.generation == 1)
    assert sum(new.elements()) == 40 and len([p for p in grown.piles if any(s.generation == 1 for s in p.segments)]) > 1
    # a copy's key is unique across generations too: the same input appended again is refused
    with pytest.raises(shardkit.SampleError, match=r"key 'g1-\d\d(_r\d)?' of this append"):
        shardkit.preprocess([1], fn, out, piles=4, seed=5, repeat="cls:1=3", mode="append", quiet=True)


def _interrupted_append(out: str, units: list[int], stop_at: int, **options) -> None:
    """An append that stops (Ctrl-C) at unit ``stop_at``, after the units before it were committed."""
    from shardkit.piles import resume

    every, resume.COMMIT_SECONDS = resume.COMMIT_SECONDS, 0.0
    STOP_AT["at"] = stop_at
    try:
        with pytest.raises(KeyboardInterrupt):
            shardkit.preprocess(units, unit_samples, out, piles=3, seed=2, mode="append", quiet=True, **options)
    finally:
        resume.COMMIT_SECONDS = every
        STOP_AT["at"] = None


@pytest.mark.parametrize("options", [{}, {"max_pile_bytes": 4096}], ids=["whole", "split"])
def test_an_interrupted_append_resumes_to_the_same_segments(tmp_path, options):
    # split: 4 KiB holds 3 samples, so pass 1 splits piles and the append rewrites them into leaves
    from shardkit.piles import resume

    units = list(range(4, 16))
    reference = str(tmp_path / "reference")
    shardkit.preprocess([0, 1, 2, 3], unit_samples, reference, piles=3, seed=2, quiet=True, **options)
    whole = shardkit.preprocess(units, unit_samples, reference, piles=3, seed=2, mode="append", quiet=True, **options)
    out = str(tmp_path / "out")
    shardkit.preprocess([0, 1, 2, 3], unit_samples, out, piles=3, seed=2, quiet=True, **options)
    _interrupted_append(out, units, stop_at=10, **options)
    assert manifest.read(out).generation == 0 and os.path.isdir(resume.staging_path(out))
    with pytest.raises(shardkit.DatasetExistsError, match="holds an interrupted pass 1"):
        shardkit.preprocess(units, unit_samples, out, piles=3, seed=2, mode="append", quiet=True, **options)
    resumed = shardkit.preprocess(units, unit_samples, out, piles=3, seed=2, mode="append", resume=True, quiet=True, **options)
    assert resumed.generation == 1 and resumed.piles == whole.piles
    assert any(s.resolution > 1 for p in whole.piles for s in p.segments) == bool(options)
    for pile in whole.piles:
        for segment in pile.segments:
            assert (tmp_path / "out" / segment.name).read_bytes() == (tmp_path / "reference" / segment.name).read_bytes()
    assert not os.path.exists(resume.staging_path(out))


def test_an_interrupted_append_does_not_resume_onto_another_generation(tmp_path):
    units = list(range(4, 10))
    out = str(tmp_path / "out")
    shardkit.preprocess([0, 1, 2, 3], unit_samples, out, piles=3, seed=2, quiet=True)
    _interrupted_append(out, units, stop_at=7)
    _append(out, ["other"], piles=3, seed=2)  # another writer published generation 1 meanwhile
    with pytest.raises(
        shardkit.ConfigError,
        match=r"cannot resume: .*\(generation was 1, is 2\): it was published, by this job before it stopped or by another writer",
    ):
        shardkit.preprocess(units, unit_samples, out, piles=3, seed=2, mode="append", resume=True, quiet=True)


def test_repile_reads_every_segment_of_a_grown_compressed_dataset(tmp_path):
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    _write(src, [f"a{i:02d}" for i in range(12)], piles=3, compression="zstd")
    _append(src, [f"b{i:02d}" for i in range(8)], piles=3)
    _append(src, [f"c{i:02d}" for i in range(8)], piles=3, compression="gzip")
    result = shardkit.repile(src, dst, piles=2, quiet=True)
    assert result.samples == 28 and result.generation == 0
    assert sorted(_keys(dst)) == sorted(_keys(src))


def _units(unit: int):
    for k in range(3):
        yield {"__key__": f"u{unit:03d}-{k}", "bin": b"x" * 100}


def run_killed(code: str, out: str) -> None:
    """Run ``code`` in a child Python (``sys.argv[1]`` is ``out``, ``sys.argv[2]`` this directory)
    that must die of SIGKILL, as the code arranges."""
    died = subprocess.run([sys.executable, "-c", code, out, os.path.dirname(__file__)], capture_output=True)
    assert died.returncode == -signal.SIGKILL, died.stderr.decode()


def append_killed_at(where: str, out: str, units: range) -> None:
    """Append ``units`` to ``out`` in a child Python killed by SIGKILL when it calls ``resume.<where>``."""
    code = (
        "import os, signal, sys; sys.path.insert(0, sys.argv[2]); import shardkit; from shardkit.piles import resume; "
        f"from test_append import _units; resume.{where} = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL); "
        f"shardkit.preprocess(range({units.start}, {units.stop}), _units, sys.argv[1], piles=2, mode='append', quiet=True)"
    )
    run_killed(code, out)


def test_an_append_killed_after_it_published_does_not_stop_the_next_one(tmp_path):
    # SIGKILL between the new manifest and the removal of pass 1's staging: its committed parts
    # are of a generation the dataset has, not an interrupted job for the next append to refuse
    out = str(tmp_path / "ds")
    shardkit.preprocess(range(4), _units, out, piles=2, quiet=True)
    append_killed_at("Staging.remove", out, range(10, 14))
    assert manifest.read(out).generation == 1 and os.path.isdir(os.path.join(out, ".shardkit-pass1"))
    problems = shardkit.verify(out)
    assert {(p.name, p.kind) for p in problems} == {(".shardkit-lock", "leftover"), (".shardkit-pass1", "leftover")}, problems
    with pytest.raises(shardkit.ConfigError, match=r"wrote generation 1, and the dataset has it now .* run again without resume=True"):
        shardkit.preprocess(range(10, 14), _units, out, piles=2, mode="append", resume=True, quiet=True)
    for resume in (False, True):
        grown = shardkit.preprocess(range(20 + 4 * resume, 24 + 4 * resume), _units, out, piles=2, mode="append", resume=resume, quiet=True)
        assert grown.generation == 2 + resume
    assert not os.path.exists(os.path.join(out, ".shardkit-pass1"))
    assert sorted(_keys(out)) == sorted(f"u{u:03d}-{k}" for u in [*range(4), *range(10, 14), *range(20, 28)] for k in range(3))


def test_gc_removes_the_staging_of_an_append_killed_after_it_published_and_keeps_an_unpublished_one(tmp_path):
    out, staging = str(tmp_path / "ds"), str(tmp_path / "ds" / ".shardkit-pass1")
    shardkit.preprocess(range(4), _units, out, piles=2, quiet=True)
    # killed before it published: its committed parts are the job's to resume, gc keeps them
    append_killed_at("manifest.write", out, range(10, 14))
    assert manifest.read(out).generation == 0 and os.path.isdir(staging)
    assert ".shardkit-pass1" not in shardkit.gc(out, grace=0).deleted and os.path.isdir(staging)
    said = {p.name: p.message for p in shardkit.verify(out, quiet=True)}
    assert "resume=True continues it" in said[".shardkit-pass1"]
    shardkit.preprocess(range(10, 14), _units, out, piles=2, mode="append", resume=True, quiet=True)
    assert not os.path.exists(staging)
    # killed after it published: gc removes the staging, which nobody can resume
    append_killed_at("Staging.remove", out, range(20, 24))
    assert manifest.read(out).generation == 2 and os.path.isdir(staging)
    said = {p.name: p.message for p in shardkit.verify(out, quiet=True)}
    assert "append of generation 2, which stopped after it published" in said[".shardkit-pass1"]
    assert ".shardkit-pass1" in shardkit.gc(out, grace=0, dry_run=True).deleted and os.path.isdir(staging)
    assert ".shardkit-pass1" in shardkit.gc(out, grace=0).deleted and not os.path.exists(staging)
    assert shardkit.verify(out, quiet=True) == []


def test_an_append_killed_while_it_removes_its_staging_leaves_a_leftover_gc_removes(tmp_path):
    # SIGKILL in the middle of removing the staging (its job record already gone): what is left
    # must not look like an interrupted job to resume, and the next job (or gc) removes it
    out = str(tmp_path / "ds")
    shardkit.preprocess(range(4), _units, out, piles=2, quiet=True)
    code = (
        "import os, signal, sys; sys.path.insert(0, sys.argv[2]); import shardkit; from test_append import _units\n"
        "from shardkit.dataset import staging\n"
        "def half(fd, entry):\n"
        "    os.unlink('job.json', dir_fd=fd); os.kill(os.getpid(), signal.SIGKILL)\n"
        "staging._remove_entry = half\n"
        "shardkit.preprocess(range(10, 14), _units, sys.argv[1], piles=2, mode='append', quiet=True)"
    )
    run_killed(code, out)
    assert manifest.read(out).generation == 1 and not os.path.exists(os.path.join(out, ".shardkit-pass1"))
    left = [p for p in shardkit.verify(out, quiet=True) if p.name.startswith(".shardkit-pass1")]
    assert len(left) == 1 and left[0].kind == "leftover" and "the next job writing here removes it" in left[0].message, left
    shardkit.gc(out, grace=0)
    assert shardkit.verify(out, quiet=True) == [] and not [n for n in os.listdir(out) if n.startswith(".shardkit-pass1")]
    assert shardkit.preprocess(range(20, 24), _units, out, piles=2, mode="append", quiet=True).generation == 2


def test_a_loader_whose_files_are_gone_says_the_dataset_changed_under_it(tmp_path):
    out = str(tmp_path / "ds")
    _write(out, [f"a{i}" for i in range(40)], piles=4)
    pinned = iter(shardkit.loader(out, batch_size=2, decode=False, seed=0))
    next(pinned)  # generation 0, its first pile read
    _append(out, [f"b{i}" for i in range(40)], piles=4, window=1)  # generation 1 keeps none of generation 0's segments
    shardkit.gc(out, grace=0)  # and they are deleted
    with pytest.raises(
        shardkit.DatasetNotFoundError, match=r"pile-00000\d\.tar: no such file: the dataset at .* moved on from generation 0"
    ):
        list(pinned)

    replaced = iter(shardkit.loader(out, batch_size=2, decode=False, seed=0))
    next(replaced)
    _write(out, [f"c{i}" for i in range(40)], piles=4, overwrite=True)
    with pytest.raises(
        shardkit.DatasetNotFoundError, match=r"the dataset at .* was overwritten since this loader opened it; a new loader reads it"
    ):
        list(replaced)
    assert len(_keys(out)) == 40  # as the message says

    grown = iter(shardkit.loader(out, batch_size=2, decode=False, seed=0))
    next(grown)  # generation 0 of the dataset written over the first
    _write(out, [f"d{i}" for i in range(40)], piles=4, overwrite=True)
    _append(out, [f"e{i}" for i in range(8)], piles=4)
    with pytest.raises(
        shardkit.DatasetNotFoundError, match=r"was overwritten since this loader opened it, and grew to generation 1; a new"
    ):
        list(grown)

    damaged = iter(shardkit.loader(out, batch_size=2, decode=False, seed=0))
    next(damaged)
    for name in os.listdir(out):
        if name.startswith("pile-"):
            os.remove(os.path.join(out, name))  # the same manifest: only the file is missing, as the error says
    with pytest.raises(shardkit.DatasetNotFoundError) as missing:
        list(damaged)
    assert str(missing.value).endswith("no such file"), str(missing.value)


def test_an_append_that_adds_nothing_retires_no_generation(tmp_path, caplog):
    """Every input skipped (a daily job whose day had nothing readable): a window of 1 would keep
    only this empty generation, and gc would then delete the dataset's files. It retires none, and says so."""
    out = str(tmp_path / "ds")
    for g in range(3):
        with shardkit.PileWriter(out, piles=2, seed=0, mode="append" if g else "create") as w:
            for i in range(10):
                w.write({"__key__": f"g{g}-{i}", "txt": "x"})
    with caplog.at_level(logging.WARNING), shardkit.PileWriter(out, piles=2, seed=0, mode="append", window=1):
        pass
    assert shardkit.info(out).samples == 30
    assert "generation 3 adds no sample (0 input units skipped), so the window (1) retires no generation for it" in caplog.text
    shardkit.gc(out, grace=0)
    assert shardkit.verify(out, quiet=True) == []
    assert sum(1 for _ in shardkit.loader(out, decode=False)) == 30


def test_an_append_to_a_shuffled_dataset_says_at_once_that_it_cannot_be(tmp_path):
    """It took two refusals (piles, then the shard names) to learn that shuffle's output takes no append."""
    src, out = str(tmp_path / "src"), str(tmp_path / "shuffled")
    with shardkit.PileWriter(src, piles=2, seed=0) as w:
        for i in range(40):
            w.write({"__key__": f"s{i:03d}", "txt": "x"})
    shardkit.shuffle(os.path.join(src, "pile-*.tar"), out, maxcount=10, quiet=True)
    for piles in (2, 4):
        refused = r"shuffled: a dataset shardkit shuffle wrote \(shards in one shuffled order\), and an append"
        with pytest.raises(shardkit.ConfigError, match=refused), shardkit.PileWriter(out, piles=piles, seed=0, mode="append") as w:
            w.write({"__key__": "new", "txt": "x"})
    assert shardkit.info(out).samples == 40


def test_an_empty_generation_does_not_count_in_a_later_window(tmp_path):
    """Generations 0 and 1 hold samples, 2 none (every input skipped): a window of 2 at the next
    append keeps 3 and 1, not 3 and the empty 2 (which would retire generation 1's samples)."""
    out = str(tmp_path / "ds")
    for g in range(4):
        with shardkit.PileWriter(out, piles=2, seed=0, mode="append" if g else "create", window=2 if g == 3 else None) as w:
            for i in range(10 if g != 2 else 0):
                w.write({"__key__": f"g{g}-{i}", "txt": "x"})
    keys = sorted(s["__key__"] for s in shardkit.loader(out, decode=False))
    assert keys == sorted([f"g1-{i}" for i in range(10)] + [f"g3-{i}" for i in range(10)])
