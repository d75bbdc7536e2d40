"""preprocess and pile: output independent of workers, failures named, nothing half-written."""

from __future__ import annotations

import os
import re
import signal
import threading

import multiprocess
import pytest
from conftest import write_wds_shards

import shardkit
from shardkit import manifest
from shardkit.dataset.lock import STAGING_PREFIX
from shardkit.loading.pile import read_pile
from shardkit.piles import parts, unique_keys
from shardkit.tar.shard import iter_shard


def unit_samples(unit: int) -> list[dict]:
    """A varying number of samples per unit (zero for some)."""
    return [
        {"__key__": f"u{unit:03d}/s{i:02d}", "txt": f"unit {unit} sample {i} " * (unit % 4 + 1), "cls": unit % 5} for i in range(unit % 6)
    ]


def files(out) -> dict[str, bytes]:
    return {name: open(os.path.join(out, name), "rb").read() for name in sorted(os.listdir(out))}


def keys(out) -> list[str]:
    m = manifest.read(out)
    return sorted(s["__key__"] for p in m.piles for s in read_pile(os.path.join(out, p.name), expected=p))


def assert_no_dataset(out) -> None:
    left = os.listdir(out) if os.path.isdir(out) else []
    assert manifest.MANIFEST not in left
    assert not [e for e in left if e.startswith(STAGING_PREFIX)], left
    assert multiprocess.active_children() == []  # every worker was stopped and joined


def test_output_is_byte_identical_for_any_number_of_workers(tmp_path):
    m1 = shardkit.preprocess(range(60), unit_samples, tmp_path / "w1", piles=5, seed=9, workers=1, buffer_size="4KiB")
    m3 = shardkit.preprocess(range(60), unit_samples, tmp_path / "w3", piles=5, seed=9, workers=3, buffer_size="4KiB")
    assert m1 == m3
    assert files(tmp_path / "w1") == files(tmp_path / "w3")
    assert m1.samples == sum(len(unit_samples(u)) for u in range(60))
    assert keys(tmp_path / "w1") == sorted(s["__key__"] for u in range(60) for s in unit_samples(u))
    assert m1.extra["units"] == 60 and m1.skipped_units == 0


def test_pile_of_a_sample_depends_on_seed_unit_and_ordinal_only(tmp_path):
    """Sample k of unit u lands where PileRouter(seed, u) draws k-th, whatever came before."""
    from shardkit.piles.router import route

    shardkit.preprocess(range(10), unit_samples, tmp_path / "ds", piles=3, seed=4)
    m = manifest.read(tmp_path / "ds")
    where = {s["__key__"]: p for p, info in enumerate(m.piles) for s in read_pile(os.path.join(tmp_path, "ds", info.name))}
    for u in range(10):
        expected = route(piles=3, seed=4, unit=u, count=len(unit_samples(u))).tolist()
        assert [where[s["__key__"]] for s in unit_samples(u)] == expected


def failing(unit: int):
    yield from unit_samples(unit)
    if unit == 7:
        raise ValueError("broken input")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_unit_stops_the_job_and_is_named(tmp_path, workers):
    out = tmp_path / "ds"
    with pytest.raises(shardkit.InputError, match=r"input unit 7 \(7\): fn raised ValueError: broken input") as info:
        shardkit.preprocess(range(12), failing, out, piles=3, workers=workers)
    assert "broken input" in str(info.value.__cause__)  # the original, or its traceback from the worker
    if workers > 1:
        assert "in failing" in str(info.value.__cause__)  # the worker's traceback text travels along
    assert_no_dataset(out)


@pytest.mark.parametrize("workers", [1, 2])
def test_skip_drops_every_sample_of_a_failing_unit(tmp_path, workers):
    out = tmp_path / "ds"
    m = shardkit.preprocess(range(12), failing, out, piles=3, workers=workers, on_error="skip")
    assert len(unit_samples(7)) > 0  # unit 7 yielded samples before it raised: they must go too
    assert keys(out) == sorted(s["__key__"] for u in range(12) if u != 7 for s in unit_samples(u))
    assert m.skipped_units == 1
    assert m.extra["skipped"] == [{"unit": 7, "input": "7", "error": "ValueError: broken input"}]
    assert manifest.read(out) == m


def test_skipped_output_equals_the_output_without_that_unit_s_samples(tmp_path):
    """Skipping leaves the other units' piles byte-identical for any number of workers."""
    a = shardkit.preprocess(range(12), failing, tmp_path / "a", piles=3, workers=1, on_error="skip")
    b = shardkit.preprocess(range(12), failing, tmp_path / "b", piles=3, workers=3, on_error="skip")
    assert a == b and files(tmp_path / "a") == files(tmp_path / "b")


def bad_key(unit: int):
    yield {"__key__": f"u{unit}.x", "txt": "x"}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_bad_sample_names_the_unit(tmp_path, workers):
    # both units fail; with two workers either may be reported first
    with pytest.raises(shardkit.SampleError, match=r"input unit (\d) \(\1\): sample key 'u\1.x' has a dot in its file name"):
        shardkit.preprocess(range(2), bad_key, tmp_path / "ds", piles=2, workers=workers)
    assert_no_dataset(tmp_path / "ds")


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda u: None, r"fn must return or yield an iterable of sample dicts, it returned NoneType"),
        (lambda u: {"__key__": "a", "txt": "x"}, r"fn must return or yield an iterable of sample dicts, it returned dict"),
        (lambda u: ["text"], r"fn yielded a str, expected a sample dict"),
    ],
)
def test_fn_returning_the_wrong_thing(tmp_path, fn, message):
    with pytest.raises(shardkit.InputError, match=message):
        shardkit.preprocess([0], fn, tmp_path / "ds", piles=2)


def test_lambdas_and_closures_work_in_spawned_workers(tmp_path):
    suffix = "closure"
    m = shardkit.preprocess(
        ["a", "b", "c"], lambda u: [{"__key__": u, "txt": f"{u}-{suffix}"}], tmp_path / "ds", piles=2, workers=2, mp_context="spawn"
    )
    assert m.samples == 3 and keys(tmp_path / "ds") == ["a", "b", "c"]


def interrupted(unit: int):
    yield from unit_samples(unit)
    if unit == 5:
        raise KeyboardInterrupt


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_in_fn_leaves_no_dataset(tmp_path, workers):
    out = tmp_path / "ds"
    with pytest.raises(KeyboardInterrupt):
        shardkit.preprocess(range(20), interrupted, out, piles=3, workers=workers, buffer_size=100)
    assert_no_dataset(out)


def interrupt_parent_then_hang(unit: int):
    if unit == 3:
        os.kill(os.getppid(), signal.SIGINT)  # Ctrl-C as the parent sees it
        threading.Event().wait()  # a stuck worker: the parent must terminate it
    return unit_samples(unit)


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt, as in a terminal: a process started in the background by
    a shell (``cmd &``, as CI runners may do) inherits SIGINT ignored, and Python keeps that."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_in_the_parent_stops_the_workers_and_leaves_no_dataset(tmp_path, ctrl_c_raises):
    out = tmp_path / "ds"
    with pytest.raises(KeyboardInterrupt):
        shardkit.preprocess(range(8), interrupt_parent_then_hang, out, piles=3, workers=2)
    assert_no_dataset(out)
    # queue feeder threads get their stop sentinel on close and end on their own
    feeders = [t for t in threading.enumerate() if t.name.startswith("QueueFeederThread")]
    for t in feeders:
        t.join(timeout=30)
    assert not [t for t in feeders if t.is_alive()]


def crash(unit: int):
    if unit == 4:
        os._exit(3)
    return unit_samples(unit)


def test_a_crashed_worker_fails_the_job_naming_its_units(tmp_path):
    out = tmp_path / "ds"
    with pytest.raises(shardkit.InputError, match=r"worker process \d died \(exit code 3\) while holding input units \d+\.\.\d+"):
        shardkit.preprocess(range(8), crash, out, piles=3, workers=2)
    assert_no_dataset(out)


def test_an_existing_dataset_is_refused_before_any_work(tmp_path):
    out = tmp_path / "ds"
    shardkit.preprocess(range(3), unit_samples, out, piles=2)
    calls = []
    with pytest.raises(shardkit.DatasetExistsError):
        shardkit.preprocess(range(3), calls.append, out, piles=2)
    assert calls == []
    m = shardkit.preprocess(range(12), unit_samples, out, piles=3, overwrite=True)
    assert len(m.piles) == 3 and manifest.read(out) == m


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"inputs": "a.jsonl"}, r"inputs: expected a sequence of input units, got a single str \(wrap it in a list\)"),
        ({"inputs": []}, r"inputs: no input units given"),
        ({"workers": 0}, r"workers: expected an integer >= 1, got 0"),
        ({"on_error": "ignore"}, r"on_error: expected one of 'raise', 'skip', got 'ignore'"),
        ({"extra": {"units": 1}}, r"extra: keys \['units'\] are written by preprocess itself"),
        ({"extra": {"x": object()}}, r"extra: must be JSON-serializable"),
        ({"max_pile_bytes": "lots"}, r"max_pile_bytes: expected a size like 2GiB"),
    ],
)
def test_bad_options_are_refused_before_any_work(tmp_path, kwargs, message):
    args = {"inputs": [1], "piles": 2, **kwargs}
    with pytest.raises(shardkit.ConfigError, match=message):
        shardkit.preprocess(args.pop("inputs"), unit_samples, tmp_path / "ds", **args)
    assert not os.path.exists(tmp_path / "ds")


def test_extra_metadata_lands_in_the_manifest(tmp_path):
    m = shardkit.preprocess(range(3), unit_samples, tmp_path / "ds", piles=2, extra={"classes": ["a", "b"]})
    assert manifest.read(tmp_path / "ds").extra == {"classes": ["a", "b"], "units": 3} == m.extra


# ---- pile: re-piling existing shards ---------------------------------------------------------


@pytest.fixture
def shards(tmp_path) -> list[str]:
    return write_wds_shards(
        tmp_path, "src-{:06d}.tar", 4, lambda k, i: {"__key__": f"k{k}/{i:03d}", "txt": f"{k}-{i}", "cls": str(i % 3)} if i < 25 else None
    )


def test_pile_re_piles_every_sample_byte_for_byte(tmp_path, shards):
    out = tmp_path / "out"
    pattern = str(tmp_path / "src-{000000..000003}.tar")
    m = shardkit.pile(pattern, out, piles=3, workers=2, seed=1)
    assert m.samples == 100 and m.extra["units"] == 4
    got = {s["__key__"]: (bytes(s["txt"]), bytes(s["cls"])) for p in m.piles for s in read_pile(os.path.join(out, p.name))}
    want = {s["__key__"]: (s["txt"], s["cls"]) for path in shards for s in iter_shard(path)}
    assert got == want
    assert m == shardkit.pile(sorted(shards), tmp_path / "again", piles=3, seed=1)  # a list works too


def test_pile_refuses_a_missing_input_before_any_work(tmp_path, shards):
    out = tmp_path / "out"
    with pytest.raises(shardkit.DatasetNotFoundError, match=r"src-000009.tar: no such file"):
        shardkit.pile([shards[0], str(tmp_path / "src-000009.tar")], out, piles=2)
    with pytest.raises(shardkit.DatasetNotFoundError, match=r"nothing-\*.tar: pattern matches no file"):
        shardkit.pile(str(tmp_path / "nothing-*.tar"), out, piles=2)
    assert not os.path.exists(out)


def test_pile_names_a_corrupt_input(tmp_path, shards):
    with open(shards[2], "r+b") as f:
        f.truncate(3000)
    with pytest.raises(shardkit.CorruptShardError, match=r"input unit 2 \('.*src-000002.tar'\): .*src-000002.tar: member \d+"):
        shardkit.pile(shards, tmp_path / "out", piles=2)
    m = shardkit.pile(shards, tmp_path / "out", piles=2, on_error="skip")
    assert m.samples == 75 and m.skipped_units == 1


def test_a_unit_that_cannot_reach_a_worker_is_named(tmp_path):
    units = [1, 2, (i for i in range(3))]  # generators do not pickle
    with pytest.raises(shardkit.InputError, match=r"input unit 2 \(<generator object .*\) cannot be sent to a worker process"):
        shardkit.preprocess(units, lambda u: [], tmp_path / "ds", piles=2, workers=2)
    assert_no_dataset(tmp_path / "ds")


def test_an_fn_that_cannot_reach_spawned_workers_is_a_config_error(tmp_path):
    stream = (i for i in range(3))
    with pytest.raises(shardkit.ConfigError, match=r"fn cannot be sent to worker processes .*; use workers=1 or mp_context='fork'"):
        shardkit.preprocess(
            [1, 2], lambda u: [{"__key__": f"k{next(stream)}", "txt": "x"}], tmp_path / "ds", piles=2, workers=2, mp_context="spawn"
        )
    assert_no_dataset(tmp_path / "ds")


def _numbered(unit):
    # every unit numbers its samples from 0: unit u's last key meets unit u+1's first in a pile
    return ({"__key__": f"{i:03d}", "txt": f"{unit}"} for i in (range(2) if unit % 2 else range(1, -1, -1)))


def test_equal_keys_where_two_units_meet_in_a_pile_are_refused(tmp_path):
    with pytest.raises(
        shardkit.SampleError,
        match=r"pile 0: sample 2 \(offset 2048, input unit 1 \(1\)\) has the key '000' of sample 1 \(offset 1024, input unit 0 \(0\)\): "
        r"keys must be unique across all inputs, and preprocess takes them from its function: give each sample a unique '__key__'",
    ) as refused:
        shardkit.preprocess([0, 1], _numbered, tmp_path / "out", piles=1, quiet=True)
    assert "key_prefix='unit'" not in str(refused.value)  # refused by preprocess: it must not be advised
    assert not shardkit.manifest.is_dataset(tmp_path / "out")


@pytest.mark.parametrize("workers", [1, 3])
def test_equal_keys_anywhere_in_a_pile_are_refused_whatever_wrote_them(tmp_path, workers):
    # unit 4 repeats a key of unit 0: far apart in the pile, written by different processes
    def fn(unit):
        return [{"__key__": f"k{unit}-{i}" if (unit, i) != (4, 2) else "k0-1", "txt": "x"} for i in range(3)]

    with pytest.raises(
        shardkit.SampleError, match=r"pile 0: sample 14 \(offset 14336, input unit 4 \(4\)\) has the key 'k0-1' of sample 1 "
    ):
        shardkit.preprocess(range(6), fn, tmp_path / "out", piles=1, workers=workers, quiet=True)
    assert not shardkit.manifest.is_dataset(tmp_path / "out")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_key_in_two_piles_is_refused_whatever_the_seed(tmp_path, workers):
    # unit 5's last sample repeats unit 0's first key: refused for every seed, wherever the two land
    def fn(unit):
        return [{"__key__": "shared" if (unit, i) in ((0, 0), (5, 3)) else f"u{unit}-{i}", "txt": f"{unit}"} for i in range(4)]

    places = set()
    for seed in range(40):
        out = tmp_path / f"s{seed}"
        with pytest.raises(shardkit.SampleError, match=r"has the key 'shared' of .*keys must be unique across all inputs") as refused:
            shardkit.preprocess(range(8), fn, out, piles=8, seed=seed, workers=workers, buffer_size="1KiB", quiet=True)
        said = str(refused.value)
        assert "input unit 0 (0)" in said and "input unit 5 (5)" in said, said
        places.add(re.search(r"has the key 'shared' of pile \d+'s sample", said) is not None)  # named when it differs
        assert_no_dataset(out)
        if len(places) == 2:
            break
    assert places == {True, False}, places  # both cases came up (seeds 0 to 39): one pile and two


def test_a_skipped_units_keys_are_not_repeats_in_other_piles_either(tmp_path):
    def fn(unit):
        if unit == 3:
            yield {"__key__": "u0-0", "txt": "x"}  # unit 0's key, then the unit fails: its samples are dropped
            raise ValueError("bad unit")
        yield {"__key__": f"u{unit}-0", "txt": "x"}

    m = shardkit.preprocess(range(6), fn, tmp_path / "out", piles=64, on_error="skip", quiet=True)
    assert m.samples == 5 and m.skipped_units == 1


def test_a_key_a_unit_repeats_is_that_units_fault(tmp_path):
    def fn(unit):
        return [{"__key__": key, "txt": "x"} for key in (["a", "b", "a"] if unit == 1 else [f"u{unit}"])]

    with pytest.raises(shardkit.SampleError, match=r"input unit 1 \(1\): sample 2 has the key 'a' of sample 0: keys must be unique"):
        shardkit.preprocess(range(3), fn, tmp_path / "out", piles=2, quiet=True)
    m = shardkit.preprocess(range(3), fn, tmp_path / "out", piles=2, quiet=True, on_error="skip")
    assert m.samples == 2 and m.skipped_units == 1


def test_a_skipped_units_keys_are_not_repeats(tmp_path):
    def fn(unit):
        yield {"__key__": "shared", "txt": "x"}
        if unit == 0:
            raise ValueError("broken input")  # unit 0 is skipped: its "shared" is not in the pile

    m = shardkit.preprocess(range(2), fn, tmp_path / "out", piles=1, quiet=True, on_error="skip")
    assert m.samples == 1 and m.skipped_units == 1


def test_a_key_hash_collision_where_units_meet_is_not_an_error(tmp_path, monkeypatch):
    import numpy as np

    # every key hashes alike: every pair of samples is a candidate, and the keys decide
    monkeypatch.setattr(parts, "key_hashes", lambda keys: np.zeros(len(keys), dtype=np.uint64))
    m = shardkit.preprocess(
        [1, 3, 5], lambda u: ({"__key__": f"{u}-{i}", "txt": "x"} for i in range(2)), tmp_path / "out", piles=1, quiet=True
    )
    keys = [s["__key__"] for s in read_pile(str(tmp_path / "out" / m.piles[0].name))]
    assert keys == ["1-0", "1-1", "3-0", "3-1", "5-0", "5-1"]


def test_repeats_are_placed_a_few_hash_values_at_a_time_and_a_collision_does_not_stop_the_search(tmp_path, monkeypatch):
    import numpy as np

    monkeypatch.setattr(unique_keys, "PLACED", 1)
    # hash 0 for every key but "a": b and c collide (no repeat), then a repeats under hash 1
    monkeypatch.setattr(parts, "key_hashes", lambda keys: np.array([1 if k == b"a" else 0 for k in keys], dtype=np.uint64))
    fn = lambda u: [{"__key__": k, "txt": "x"} for k in u]  # noqa: E731
    with pytest.raises(shardkit.SampleError, match=r"has the key 'a' of (pile \d's )?sample \d \(offset \d+, input unit 0 \('ab'\)\)"):
        shardkit.preprocess(["ab", "ca"], fn, tmp_path / "out", piles=3, quiet=True)
    m = shardkit.preprocess(["ab", "c"], fn, tmp_path / "ok", piles=3, quiet=True)  # b and c collide, a is once: it passes
    assert m.samples == 3


def test_pile_counts_that_deserve_a_word_are_logged(tmp_path, caplog, monkeypatch):
    from shardkit.piles import advice

    monkeypatch.setattr(advice, "MANY_PILES", 20)  # the real bound, 100,000, would write 100,000 files here
    out = str(tmp_path / "out")
    with caplog.at_level("WARNING", logger="shardkit"):
        m = shardkit.preprocess(range(4), unit_samples, out, piles=21, quiet=True)
    many, sparse = (r.getMessage() for r in caplog.records)
    assert {r.name for r in caplog.records} == {"shardkit.piles.preprocess"}
    assert many.startswith(f"{out}: piles=21 writes 21 pile files")
    empty = sum(p.samples == 0 for p in m.piles)
    assert m.samples == 6 and sparse.startswith(f"{out}: 6 samples in 21 piles: {empty} piles are empty")
    caplog.clear()
    with caplog.at_level("WARNING", logger="shardkit"):
        shardkit.preprocess(range(4), unit_samples, out, piles=6, overwrite=True, quiet=True)
    assert caplog.records == []
