"""shardkit.torch: DataLoader workers and a real two-process DDP (gloo) run."""

from __future__ import annotations

import collections
import inspect
import itertools
import json
import logging
import os
import socket
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import shardkit
from tests.conftest import make_samples
from tests.test_elastic import check_reads

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'shardkit[torch]')")

from shardkit.torch import ShardkitDataLoader, ShardkitDataset, round_robin  # noqa: E402

N = 203  # odd on purpose: two ranks leave a remainder


@pytest.fixture
def odd_dataset(tmp_path) -> str:
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=6, seed=1) as w:
        for s in make_samples(N):
            w.write(s)
    return out


def flat_keys(batches) -> list[str]:
    return [k for b in batches for k in (b["__key__"] if isinstance(b["__key__"], list) else [b["__key__"]])]


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_workers_read_each_sample_once(odd_dataset, workers):
    ds = ShardkitDataset(odd_dataset, batch_size=8, decode=False, drop_last=False, world_size=1, rank=0)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    got = flat_keys(dl)
    assert sorted(got) == sorted(s["__key__"] for s in make_samples(N))
    assert len(list(dl)) == len(ds) == -(-N // 8)
    ds.set_epoch(1)
    assert flat_keys(dl) != got and sorted(flat_keys(dl)) == sorted(got)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_batching_batches_again_is_refused(odd_dataset, workers):
    """PyTorch's default batch_size=1 would wrap every batch in one more dimension: refused, naming the right call."""
    ds = ShardkitDataset(odd_dataset, batch_size=8, decode=True, world_size=1, rank=0)
    for batch_size in (1, 4):
        with pytest.raises(shardkit.ConfigError, match=r"ShardkitDataset\(batch_size=8\) already yields batches") as e:
            next(iter(torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=workers)))
        assert "DataLoader(ds, batch_size=None, num_workers=k)" in str(e.value)
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)))
    assert batch["cls"].shape == (8,)
    # a dataset yielding single samples may be batched by the DataLoader: nothing to refuse
    samples = ShardkitDataset(odd_dataset, decode=True, world_size=1, rank=0)
    batch = next(iter(torch.utils.data.DataLoader(samples, batch_size=4, num_workers=workers)))
    assert batch["cls"].shape == (4,) and len(batch["__key__"]) == 4


def test_shardkit_dataloader_takes_no_batch_size(odd_dataset):
    batched = ShardkitDataset(odd_dataset, batch_size=8, decode=False, world_size=1, rank=0)
    with pytest.raises(shardkit.ConfigError, match=r"batch_size=1 would give every array an extra leading dimension of 1"):
        ShardkitDataLoader(batched, batch_size=1)
    samples = ShardkitDataset(odd_dataset, decode=False, world_size=1, rank=0)
    with pytest.raises(shardkit.ConfigError, match=r"batch_size: expected None, got 4: batch in the dataset instead"):
        ShardkitDataLoader(samples, batch_size=4)
    assert len(list(ShardkitDataLoader(batched))) == len(batched)


def test_shardkit_dataloader_names_where_drop_last_goes(odd_dataset):
    """``ShardkitDataLoader(ds, drop_last=True)`` failed in torch with "batch_size=None option
    disables auto-batching and is mutually exclusive with drop_last", an argument never given."""
    ds = ShardkitDataset(odd_dataset, batch_size=8, decode=False, world_size=1, rank=0)
    with pytest.raises(shardkit.ConfigError, match=r"ShardkitDataLoader: drop_last: .*ShardkitDataset\(\.\.\., drop_last=True\)"):
        ShardkitDataLoader(ds, drop_last=True)
    assert len(list(ShardkitDataLoader(ds, drop_last=False))) == len(ds)  # the DataLoader's default, harmless


@pytest.mark.skipif(
    "in_order" not in inspect.signature(torch.utils.data.DataLoader).parameters,
    reason="this torch's DataLoader has no in_order (torch < 2.6)",
)
def test_shardkit_dataloader_takes_its_workers_in_turn(odd_dataset):
    """in_order=False lets the DataLoader yield whichever worker's batch is ready first: the order,
    the state (which counts turns) and the ledger would all be off, so it is refused up front."""
    ds = ShardkitDataset(odd_dataset, batch_size=8, decode=False, world_size=1, rank=0)
    with pytest.raises(shardkit.ConfigError, match=r"ShardkitDataLoader: in_order: expected True, got False: .*take turns"):
        ShardkitDataLoader(ds, num_workers=2, in_order=False)
    # without workers there are no turns to keep
    assert flat_keys(ShardkitDataLoader(ds, in_order=False)) == flat_keys(ShardkitDataLoader(ds))


def test_raw_batches_queue_deeper_in_the_workers_unless_told(odd_dataset):
    """Raw batches cost little to hold: four in flight a worker by default; decoded ones keep the
    DataLoader's two; a prefetch_factor given is kept, and no workers means none."""
    from shardkit.loading.torch import RAW_PREFETCH

    raw = ShardkitDataset(odd_dataset, batch_size=8, decode=False, world_size=1, rank=0)
    decoded = ShardkitDataset(odd_dataset, batch_size=8, decode=True, world_size=1, rank=0)
    assert ShardkitDataLoader(raw, num_workers=2).prefetch_factor == RAW_PREFETCH == 4
    assert ShardkitDataLoader(decoded, num_workers=2).prefetch_factor == 2
    assert ShardkitDataLoader(raw, num_workers=2, prefetch_factor=3).prefetch_factor == 3
    assert ShardkitDataLoader(raw).prefetch_factor is None
    # the depth changes nothing of what is read, nor its order
    assert flat_keys(ShardkitDataLoader(raw, num_workers=2)) == flat_keys(ShardkitDataLoader(raw, num_workers=2, prefetch_factor=2))


def test_workers_share_the_rank_slice(odd_dataset):
    ds = ShardkitDataset(odd_dataset, decode=False, world_size=2, rank=1)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    got = flat_keys(dl)
    alone = flat_keys(shardkit.loader(odd_dataset, decode=False, world_size=2, rank=1))
    assert sorted(got) == sorted(alone) and len(got) == N // 2


def dataloader_turns(counts: list[int]) -> list[int]:
    """The worker of each item a DataLoader yields: turns in worker order, ended workers passed."""
    left, order = list(counts), []
    for w in itertools.cycle(range(len(counts))):
        if not any(left):
            return order
        if left[w]:
            left[w] -= 1
            order.append(w)
    return order  # pragma: no cover


@given(counts=st.lists(st.integers(0, 6), min_size=1, max_size=5))
def test_round_robin_follows_the_dataloader_turns(counts):
    order = dataloader_turns(counts)
    for taken in range(len(order) + 1):
        given_, turn = round_robin(counts, taken)
        assert given_ == [order[:taken].count(w) for w in range(len(counts))]
        if taken < len(order):  # the next item comes from `turn` or the next worker still giving
            later = [(turn + k) % len(counts) for k in range(len(counts))]
            assert order[taken] == next(w for w in later if given_[w] < counts[w])


@pytest.mark.parametrize("persistent", [False, True])
def test_set_epoch_reaches_the_workers(odd_dataset, persistent):
    ds = ShardkitDataset(odd_dataset, batch_size=8, decode=False, drop_last=False, world_size=1, rank=0)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=persistent)
    everything = sorted(s["__key__"] for s in make_samples(N))
    orders = []
    for epoch in (0, 1, 0):
        ds.set_epoch(epoch)
        orders.append(flat_keys(dl))
        assert sorted(orders[-1]) == everything, "each epoch reads every sample once"
    assert orders[0] != orders[1] and orders[2] == orders[0]


def _second_worker_starts_late(worker_id: int) -> None:
    if worker_id == 1:
        import time

        time.sleep(1.0)


@pytest.mark.parametrize("persistent", [False, True])
def test_set_epoch_inside_the_loop_waits_for_a_worker_that_has_not_started(odd_dataset, persistent):
    """Worker 1 reads where to start only after the main process took worker 0's first batch and
    moved to the next epoch: it must still read the epoch its iteration began in."""
    options = dict(batch_size=8, decode=False, drop_last=False, world_size=1, rank=0, seed=3)
    clean = ShardkitDataset(odd_dataset, **options)
    expected = [flat_keys(ShardkitDataLoader(clean, num_workers=2))]
    clean.set_epoch(1)
    expected.append(flat_keys(ShardkitDataLoader(clean, num_workers=2)))
    assert expected[0] != expected[1]
    ds = ShardkitDataset(odd_dataset, **options)
    dl = ShardkitDataLoader(ds, num_workers=2, worker_init_fn=_second_worker_starts_late, persistent_workers=persistent)
    got = []
    for i, batch in enumerate(dl):
        if i == 0:
            ds.set_epoch(1)  # the next epoch prepared early, while worker 1 sleeps
        got += batch["__key__"]
    assert got == expected[0]
    assert flat_keys(dl) == expected[1]


def test_a_worker_that_never_starts_is_waited_for_only_so_long(odd_dataset, monkeypatch, caplog):
    from shardkit.loading import shared_place

    monkeypatch.setattr(shared_place, "START_WAIT", 0.2)
    ds = ShardkitDataset(odd_dataset, batch_size=8, decode=False, drop_last=False, world_size=1, rank=0)
    dl = ShardkitDataLoader(ds, num_workers=2, worker_init_fn=_second_worker_starts_late)
    with caplog.at_level(logging.WARNING, logger="shardkit.loading.shared_place"):
        for i, _ in enumerate(dl):
            if i == 0:
                ds.set_epoch(1)
    assert "set_epoch(1) inside a DataLoader loop: 1 of its workers had not started reading after 0.2 s" in caplog.text


def _second_worker_fails_to_start(worker_id: int) -> None:
    if worker_id == 1:
        raise RuntimeError("worker 1 could not open its feature store")


@pytest.mark.parametrize("given", ["made with it", "set afterwards"])
def test_set_epoch_inside_the_loop_does_not_wait_for_a_worker_whose_init_failed(odd_dataset, given):
    import time

    ds = ShardkitDataset(odd_dataset, batch_size=8, decode=False, drop_last=False, world_size=1, rank=0)
    if given == "made with it":
        dl = ShardkitDataLoader(ds, num_workers=2, worker_init_fn=_second_worker_fails_to_start)
    else:
        dl = ShardkitDataLoader(ds, num_workers=2)
        dl.worker_init_fn = _second_worker_fails_to_start
    took = None
    with pytest.raises(RuntimeError, match="could not open its feature store"):
        for i, _ in enumerate(dl):
            if i == 0:
                started = time.monotonic()
                ds.set_epoch(1)
                took = time.monotonic() - started
    assert took is not None and took < 10, took  # not START_WAIT: the worker's error comes next


def _as_they_are(batch):
    return batch


def _as_tensors(batch):
    return torch.stack([torch.frombuffer(bytearray(v), dtype=torch.uint8) for v in batch["bin"]])


def test_a_collate_fn_that_returns_views_from_workers_is_an_error_not_a_hang(odd_dataset):
    """A worker's queue drops an item it cannot pickle (a memoryview of views=True): the DataLoader
    would wait for it forever, so a custom collate_fn's result holding one is an error naming where."""
    ds = ShardkitDataset(odd_dataset, batch_size=8, decode=False, views=True, world_size=1, rank=0)
    with pytest.raises(shardkit.ConfigError, match=r"collate_fn returned a memoryview at \['bin'\]\[0\].*views=False"):
        next(iter(ShardkitDataLoader(ds, num_workers=1, collate_fn=_as_they_are, timeout=20)))
    # in the main process views need no pickling; a collate_fn that copies them is fine in workers
    assert type(next(iter(ShardkitDataLoader(ds, collate_fn=_as_they_are)))["bin"][0]) is memoryview
    assert next(iter(ShardkitDataLoader(ds, num_workers=1, collate_fn=_as_tensors))).shape == (8, 64)


def test_an_iteration_left_open_at_exit_ends_quietly(tmp_path):
    script = textwrap.dedent(
        f"""
        import shardkit
        from shardkit.torch import ShardkitDataLoader, ShardkitDataset
        with shardkit.PileWriter({str(tmp_path / "ds")!r}, piles=2, seed=1) as w:
            for i in range(40):
                w.write({{"__key__": f"{{i:04d}}", "cls": i % 3}})
        ds = ShardkitDataset({str(tmp_path / "ds")!r}, batch_size=8, decode=False, world_size=1, rank=0)
        it = iter(ShardkitDataLoader(ds))
        first = next(it)
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=dict(env, PYTHONPATH=root))
    assert done.returncode == 0 and "Exception ignored" not in done.stderr, done.stderr


def test_reading_an_epoch_again_warns(odd_dataset, caplog):
    ds = ShardkitDataset(odd_dataset, batch_size=8, decode=False, world_size=1, rank=0)
    first = flat_keys(ds)
    with caplog.at_level(logging.WARNING, logger="shardkit.torch"):
        assert flat_keys(ds) == first
    assert "call set_epoch()" in caplog.text
    caplog.clear()
    ds.set_epoch(1)
    with caplog.at_level(logging.WARNING, logger="shardkit.torch"):
        assert flat_keys(ds) != first
    assert caplog.text == ""


def _resumed_after_five_batches(path: str, workers: int) -> tuple[ShardkitDataLoader, dict, list[str]]:
    """A fresh DataLoader of ``workers`` that loaded the state after 5 batches of 8 of epoch 0,
    that state, and the keys of the whole epoch."""
    options = dict(batch_size=8, decode=False, drop_last=False, world_size=1, rank=0)
    dl = ShardkitDataLoader(ShardkitDataset(path, **options), num_workers=workers)
    whole = flat_keys(dl)
    list(itertools.islice(dl, 5))
    state = dl.state_dict()
    dl = ShardkitDataLoader(ShardkitDataset(path, **options), num_workers=workers)
    dl.load_state_dict(state)
    return dl, state, whole


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_epoch_read_again_without_set_epoch_is_read_whole(odd_dataset, workers, caplog):
    """The warning says the epoch is read again from its start, and so it is: the position a
    state loaded for it was spent by the read that resumed it. A state after the read again
    names the next epoch."""
    dl, _, whole = _resumed_after_five_batches(odd_dataset, workers)
    assert flat_keys(dl) == whole[40:]
    with caplog.at_level(logging.WARNING, logger="shardkit.torch"):
        assert flat_keys(dl) == whole and flat_keys(dl) == whole
    assert "epoch 0 is read again from its start" in caplog.text
    assert (dl.state_dict()["epoch"], dl.state_dict()["taken"]) == (1, 0)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_left_midway_reads_from_the_same_place_again_however_long_the_workers_took(odd_dataset, workers):
    """Only an iteration the DataLoader yielded to its end spends a loaded position: the workers
    may have read their shares to the end before the main process let the iteration go."""
    import time

    dl, state, _ = _resumed_after_five_batches(odd_dataset, workers)
    rest = flat_keys(dl)
    for pause in (0.0, 0.5):
        dl.load_state_dict(state)
        it = iter(dl)
        list(itertools.islice(it, len(rest) // 8 - 2))
        time.sleep(pause)  # the workers end their shares meanwhile
        del it
        assert flat_keys(dl) == rest  # from the loaded position, as the iteration left midway began


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loop_that_takes_exactly_the_rest_and_stops_spends_the_loaded_position(odd_dataset, workers):
    """zip(range(n), dl) takes the last batch without asking for one more: the epoch still ended."""
    dl, _, whole = _resumed_after_five_batches(odd_dataset, workers)
    batches = len(whole) // 8 + (len(whole) % 8 > 0)
    assert [k for _, b in zip(range(batches - 5), dl, strict=False) for k in b["__key__"]] == whole[40:]  # the loop stops here
    dl.dataset.set_epoch(0)
    assert (dl.state_dict()["epoch"], dl.state_dict()["taken"]) == (0, 0)
    assert flat_keys(dl) == whole


def test_a_move_inside_a_loop_without_workers_counts_nothing_of_the_new_place_as_read(odd_dataset):
    options = dict(batch_size=8, decode=False, drop_last=False, world_size=1, rank=0)
    ds = ShardkitDataset(odd_dataset, **options)
    for i, _ in enumerate(torch.utils.data.DataLoader(ds, batch_size=None)):
        if i == 3:
            ds.set_epoch(1)  # the next epoch prepared early: the loop goes on reading epoch 0
        if i == 6:
            assert (ds.state_dict()["epoch"], ds.state_dict()["taken"]) == (1, 0)
            break
    ds = ShardkitDataset(odd_dataset, **options)
    for i, _ in enumerate(ds):
        if i == 4:
            at_five = ds.state_dict()
        if i == 6:
            ds.load_state_dict(at_five)  # a rollback: the running loop goes on 3 more batches
        if i == 9:
            assert ds.state_dict() == at_five
            break


@pytest.mark.parametrize("workers", [0, 2])
def test_set_epoch_of_an_epoch_read_to_its_end_reads_it_anew_and_the_state_says_so(odd_dataset, workers):
    options = dict(batch_size=8, decode=False, drop_last=False, world_size=1, rank=0)
    ds = ShardkitDataset(odd_dataset, **options)
    dl = ShardkitDataLoader(ds, num_workers=workers)
    ds.set_epoch(0)
    whole = flat_keys(dl)
    ds.set_epoch(0)
    assert (dl.state_dict()["epoch"], dl.state_dict()["taken"]) == (0, 0)
    assert flat_keys(dl) == whole
    list(itertools.islice(dl, 5))
    state = dl.state_dict()
    dl.load_state_dict(state)
    assert flat_keys(dl) == whole[40:]
    ds.set_epoch(0)  # after the resumed read's end: the epoch anew, whole
    assert (dl.state_dict()["epoch"], dl.state_dict()["taken"]) == (0, 0)
    assert flat_keys(dl) == whole


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True), (3, False)])
def test_resume_mid_epoch_is_exact(odd_dataset, workers, persistent):
    options = dict(batch_size=8, decode=False, drop_last=False, world_size=1, rank=0, seed=5)
    ds = ShardkitDataset(odd_dataset, **options)
    ds.set_epoch(2)
    full = [b["__key__"] for b in ShardkitDataLoader(ds, num_workers=workers)]
    assert len(full) == len(ds) == 26
    for stop in (1, 4, 13, 25):
        ds = ShardkitDataset(odd_dataset, **options)
        dl = ShardkitDataLoader(ds, num_workers=workers, persistent_workers=persistent)
        ds.set_epoch(2)
        it = iter(dl)
        head = [next(it)["__key__"] for _ in range(stop)]
        state = json.loads(json.dumps(dl.state_dict()))
        del it
        assert (state["epoch"], state["taken"]) == (2, stop)
        again = ShardkitDataset(odd_dataset, **options)
        resumed = ShardkitDataLoader(again, num_workers=workers, persistent_workers=persistent)
        resumed.load_state_dict(state)
        again.set_epoch(2)  # a training loop's usual call keeps the resume point of that epoch
        rest = [b["__key__"] for b in resumed]
        assert head + rest == full, f"stop {stop}"
        assert resumed.state_dict()["epoch"] == 3 and resumed.state_dict()["taken"] == 0


def test_resume_twice_in_one_epoch(odd_dataset):
    """A state taken in a resumed iteration counts what was yielded before the resume too."""
    options = dict(batch_size=8, decode=False, world_size=1, rank=0)
    full = [b["__key__"] for b in ShardkitDataLoader(ShardkitDataset(odd_dataset, **options), num_workers=2)]
    ds = ShardkitDataset(odd_dataset, **options)
    dl = ShardkitDataLoader(ds, num_workers=2)
    got = [b["__key__"] for b in itertools.islice(dl, 5)]
    for _ in range(2):
        state = dl.state_dict()
        ds = ShardkitDataset(odd_dataset, **options)
        dl = ShardkitDataLoader(ds, num_workers=2)
        dl.load_state_dict(state)
        got += [b["__key__"] for b in itertools.islice(dl, 3)]
    ds.load_state_dict(dl.state_dict())
    got += [b["__key__"] for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)]
    assert got == full


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_taken_before_an_epoch_is_read_names_its_start(odd_dataset, workers):
    """A checkpoint at the top of an epoch (set_epoch, then state_dict) names that epoch's start,
    whether the epoch before was read to its end or left midway; one right after load_state_dict
    is the state loaded. The items the DataLoader yielded before were of what was read before."""
    options = dict(batch_size=8, decode=False, world_size=1, rank=0)
    ds = ShardkitDataset(odd_dataset, **options)
    dl = ShardkitDataLoader(ds, num_workers=workers)
    list(dl)
    ds.set_epoch(1)
    assert (dl.state_dict()["epoch"], dl.state_dict()["taken"]) == (1, 0)
    list(itertools.islice(dl, 5))
    ds.set_epoch(2)
    assert (dl.state_dict()["epoch"], dl.state_dict()["taken"]) == (2, 0)
    list(itertools.islice(dl, 3))
    mid = dl.state_dict()
    list(itertools.islice(dl, 7))
    dl.load_state_dict(mid)
    assert dl.state_dict() == mid
    if workers == 0:  # a plain DataLoader: the dataset counts its own items
        plain = ShardkitDataset(odd_dataset, **options)
        list(torch.utils.data.DataLoader(plain, batch_size=None))
        plain.set_epoch(1)
        assert (plain.state_dict()["epoch"], plain.state_dict()["taken"]) == (1, 0)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_plain_dataloader_states(odd_dataset):
    ds = ShardkitDataset(odd_dataset, batch_size=8, decode=False, world_size=1, rank=0)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    it = iter(dl)
    head = [next(it)["__key__"] for _ in range(3)]
    with pytest.raises(RuntimeError, match=r"pass state_dict\(yielded=\.\.\.\)"):
        ds.state_dict()
    state = ds.state_dict(yielded=3)
    del it
    with pytest.raises(shardkit.ConfigError, match="more than"):
        ds.state_dict(yielded=10**6)
    again = ShardkitDataset(odd_dataset, batch_size=8, decode=False, world_size=1, rank=0)
    again.load_state_dict(state)
    rest = [b["__key__"] for b in torch.utils.data.DataLoader(again, batch_size=None, num_workers=2)]
    assert head + rest == [b["__key__"] for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)]
    for workers in (0, 3):  # other numbers of workers read the same samples, split anew
        other = ShardkitDataset(odd_dataset, batch_size=8, decode=False, world_size=1, rank=0)
        ShardkitDataLoader(other, num_workers=workers).load_state_dict(state)
        rest_elsewhere = [b["__key__"] for b in ShardkitDataLoader(other, num_workers=workers)]
        assert sorted(k for b in head + rest_elsewhere for k in b) == sorted(k for b in head + rest for k in b)
    with pytest.raises(shardkit.ConfigError, match="seed"):
        ShardkitDataset(odd_dataset, batch_size=8, decode=False, world_size=1, rank=0, seed=1).load_state_dict(state)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"epoch": -1}, "load_state_dict: epoch: expected an integer >= 0, got -1"),
        ({"taken": N}, f"load_state_dict: taken: expected an integer between 0 and {N - 1}, got {N}"),
        ({"workers": True}, "load_state_dict: workers: expected an integer >= 1, got True"),
    ],
)
def test_state_numbers_are_checked(odd_dataset, change, message):
    ds = ShardkitDataset(odd_dataset, decode=False, world_size=1, rank=0)
    with pytest.raises(shardkit.ConfigError, match=message):
        ds.load_state_dict(dict(ds.state_dict(), **change))
    with pytest.raises(shardkit.ConfigError, match=r"state_dict: yielded: expected an integer >= 0 or None, got 1\.5"):
        ds.state_dict(yielded=1.5)


def test_skips_keep_ranks_and_workers_in_step(odd_dataset):
    from shardkit import manifest

    bad = manifest.read(odd_dataset).piles[1]
    path = os.path.join(odd_dataset, bad.name)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 1024)
    lengths = []
    for rank in (0, 1):
        ds = ShardkitDataset(odd_dataset, batch_size=8, decode=False, world_size=2, rank=rank, on_error="skip")
        batches = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
        lengths.append(len(batches))
        assert len(batches) == len(ds)
    assert lengths[0] == lengths[1]


_RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch, torch.distributed as dist
    import shardkit
    from shardkit.torch import ShardkitDataLoader, ShardkitDataset

    rank, world = int(os.environ.pop("RANK")), int(os.environ.pop("WORLD_SIZE"))  # from torch.distributed below
    early = [ShardkitDataset(sys.argv[1], batch_size=4), shardkit.loader(sys.argv[1]), shardkit.loader({"a": sys.argv[1]})]
    spawned = ShardkitDataset(sys.argv[1], batch_size=4)  # read by a spawned worker, whose torch.distributed is not initialized
    dist.init_process_group("gloo", rank=rank, world_size=world)
    refused = []
    for made_before in early:  # each took the world to be this one process: it must not read the whole dataset
        try:
            next(iter(ShardkitDataLoader(made_before) if isinstance(made_before, ShardkitDataset) else made_before))
        except shardkit.ConfigError as e:
            refused.append(str(e))
    try:
        next(iter(ShardkitDataLoader(spawned, num_workers=1, multiprocessing_context="spawn")))
    except shardkit.ConfigError as e:
        refused.append(str(e))
    ds = ShardkitDataset(sys.argv[1], batch_size=4, decode=False, seed=3)
    keys = [k for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2) for k in b["__key__"]]
    lengths = [None] * dist.get_world_size()
    dist.all_gather_object(lengths, len(keys))
    with open(sys.argv[2], "w") as f:
        json.dump({"rank": dist.get_rank(), "keys": keys, "lengths": lengths, "len": len(ds), "refused": refused}, f)
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_process_gloo_run(odd_dataset, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2", PYTHONPATH=root)
    procs = [
        subprocess.Popen([sys.executable, str(script), odd_dataset, str(tmp_path / f"r{r}.json")], env=dict(base, RANK=str(r)))
        for r in range(2)
    ]
    for p in procs:
        assert p.wait(timeout=240) == 0
    results = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    a, b = (r["keys"] for r in results)
    per_rank = N // 2 - (N // 2) % 4  # drop_last: N // world, then whole batches of 4
    assert len(a) == len(b) == per_rank and results[0]["lengths"] == [per_rank, per_rank]
    assert results[0]["len"] == per_rank // 4
    assert not set(a) & set(b)
    everything = {s["__key__"] for s in make_samples(N)}
    assert set(a) | set(b) <= everything and len(everything - set(a) - set(b)) == N - 2 * per_rank
    for r in results:  # made before init_process_group: refused, not read whole on each rank
        assert len(r["refused"]) == 4 and all("made before torch.distributed.init_process_group" in m for m in r["refused"])


def test_spawned_persistent_workers_follow_set_epoch_and_resume(odd_dataset):
    """set_epoch and load_state_dict reach workers that were spawned (not forked) before them."""
    options = dict(batch_size=16, decode=False, drop_last=False, world_size=1, rank=0)
    reference_ds = ShardkitDataset(odd_dataset, **options)
    reference_ds.set_epoch(3)
    reference = [b["__key__"] for b in ShardkitDataLoader(reference_ds, num_workers=2)]
    ds = ShardkitDataset(odd_dataset, **options)
    dl = ShardkitDataLoader(ds, num_workers=2, multiprocessing_context="spawn", persistent_workers=True)
    first = [b["__key__"] for b in dl]  # epoch 0; the workers start here
    ds.set_epoch(3)
    it = iter(dl)
    head = [next(it)["__key__"] for _ in range(5)]
    state = dl.state_dict()
    assert head + [b["__key__"] for b in it] == reference != first
    dl.load_state_dict(state)
    assert head + [b["__key__"] for b in dl] == reference


# -- resume on another world size, batch size or number of DataLoader workers ---------------------


def read_phases(path, specs, *, drop_last, epoch=1, batches=None, **extra):
    """Read ``epoch`` through ShardkitDataLoaders in phases ``(world, batch, workers, steps)`` (the
    last to the epoch's end), each rank of a phase resumed from the state the phase before left.
    Returns the samples each rank read in each phase and the states after each phase; appends to
    ``batches`` each phase's steps, a step being every rank's keys."""
    state, read, states = None, [], []
    for i, (world, batch, workers, steps) in enumerate(specs):
        last = i == len(specs) - 1
        ranks, taken, by_rank = [], [], []
        for rank in range(world):
            ds = ShardkitDataset(path, batch_size=batch, decode=False, drop_last=drop_last, world_size=world, rank=rank, seed=3, **extra)
            dl = ShardkitDataLoader(ds, num_workers=workers)
            ds.set_epoch(epoch)
            if state is not None:
                dl.load_state_dict(state)
            got = [flat_keys([b]) for b in (dl if last else itertools.islice(dl, steps))]
            ranks.append([k for b in got for k in b])
            by_rank.append(got)
            taken.append(json.loads(json.dumps(dl.state_dict())))
        assert all(t == taken[0] for t in taken), "ranks move in step: every rank's state is the same"
        assert len({len(r) for r in ranks}) == 1, "every rank reads as many samples"
        state = taken[0]
        read.append(ranks)
        if batches is not None:
            batches += [list(step) for step in zip(*by_rank, strict=True)]
        states.append(state)
        if state["epoch"] == epoch + 1:
            break
    return read, states


torch_phase = st.tuples(st.integers(1, 4), st.sampled_from([None, 4, 8]), st.sampled_from([0, 2, 3]), st.integers(0, 9))


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(torch_phase, min_size=2, max_size=4), drop_last=st.booleans())
@example(specs=[(4, 8, 0, 4), (1, 8, 0, 6), (4, 8, 0, 0)], drop_last=True)  # the last phase's rest fills no batch: the epoch still ends
def test_resume_across_world_sizes_and_workers_reads_each_sample_once(odd_dataset, specs, drop_last):
    read, states = read_phases(odd_dataset, specs, drop_last=drop_last)
    assert (states[-1]["epoch"], states[-1]["taken"], states[-1]["done"]) == (2, 0, [])
    counts = collections.Counter(int(k[1:]) for phase in read for rank in phase for k in rank)
    used = specs[: len(read)]
    world, batch = used[-1][0], used[-1][1] or 1
    check_reads(counts, N, drop_last=drop_last, padding=sum(w - 1 for w, *_ in used), dropped=world * batch + world)


def test_a_resumed_split_is_a_pure_function_of_the_state(odd_dataset):
    specs = [(3, 4, 2, 5), (2, 8, 0, 3), (4, 4, 3, 0)]
    first, states = read_phases(odd_dataset, specs, drop_last=False)
    again, _ = read_phases(odd_dataset, specs, drop_last=False)
    assert first == again
    # a phase is recorded once the next one starts: the first one's two workers took turns over 5 batches
    assert states[1]["done"] == [{"world_size": 3, "batch_size": 4, "read": [12, 8]}]
    assert {k: states[1][k] for k in ("world_size", "batch_size", "workers", "taken")} == {
        "world_size": 2,
        "batch_size": 8,
        "workers": 1,
        "taken": 3,
    }


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize(
    "specs",
    [
        [(2, 4, 2, 0)],
        [(1, 4, 2, 0)],  # 51 batches: the first worker ends one turn before the second
        [(1, 8, 3, 0)],  # 26 batches over 3 workers: the first ends first
        [(3, 4, 2, 5), (2, 8, 0, 3), (2, 4, 3, 0)],
        [(1, None, 2, 7), (3, None, 3, 0)],
    ],
)
def test_the_ledger_names_each_dataloader_step_through_workers_and_changes(odd_dataset, specs):
    steps: list[list[list[str]]] = []
    _, states = read_phases(odd_dataset, specs, drop_last=False, batches=steps)
    world, batch, workers, _ = specs[-1]
    ds = ShardkitDataset(odd_dataset, batch_size=batch, decode=False, drop_last=False, world_size=world, rank=0, seed=3)
    dl = ShardkitDataLoader(ds, num_workers=workers)
    if len(states) > 1:
        dl.load_state_dict(states[-2])  # the state the last phase resumed from
    assert [dl.keys(k, epoch=1) for k in range(len(steps))] == steps
    with pytest.raises(shardkit.ConfigError, match=f"step: {len(steps)} is past the end of the epoch"):
        dl.keys(len(steps), epoch=1)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_trace_reads_a_torch_state_and_dataloader_workers(odd_dataset, tmp_path, capsys):
    from shardkit.cli.main import main

    steps: list[list[list[str]]] = []
    _, states = read_phases(odd_dataset, [(3, 4, 2, 5), (2, 8, 3, 0)], drop_last=False, batches=steps)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(states[-2]))
    trace = [odd_dataset, "--epoch", "1", "--batch-size", "8", "--world-size", "2", "--seed", "3", "--no-drop-last"]
    for step in (0, 4, 5, len(steps) - 1):  # before the change (3 ranks of 4, 2 workers) and after
        assert main(["trace", *trace, "--step", str(step), "--state", str(path), "--dataloader-workers", "3", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {str(r): k for r, k in enumerate(steps[step])}


def test_the_state_does_not_grow_with_the_dataset(odd_dataset, tmp_path):
    big = str(tmp_path / "big")
    with shardkit.PileWriter(big, piles=6, seed=1) as w:
        for s in make_samples(20 * N):
            w.write(s)
    specs = [(4, 4, 2, 3), (3, 8, 0, 2), (2, 4, 3, 4), (3, 4, 2, 1), (1, 4, 0, 0)]
    small_state, big_state = (read_phases(path, specs, drop_last=True)[1][-2] for path in (odd_dataset, big))
    assert len(small_state["done"]) == len(big_state["done"]) == 3
    assert small_state["done"] == big_state["done"], "what was read is counted in batches, not in samples of the dataset"
    assert abs(len(json.dumps(big_state)) - len(json.dumps(small_state))) <= 4, "only the sample count has more digits"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": 4}, "the state was taken with seed=3, this loader has seed=4"),
        ({"drop_last": True}, "the state was taken with drop_last=False, this loader has drop_last=True"),
        ({"mix": 2}, "the state was taken with mix=1, this loader has mix=2"),
    ],
)
def test_a_state_of_other_order_options_is_refused_on_any_world_size(odd_dataset, change, message):
    _, states = read_phases(odd_dataset, [(2, 4, 0, 3), (3, 4, 0, 2), (1, 4, 0, 0)], drop_last=False)
    options = dict(batch_size=4, decode=False, drop_last=False, world_size=3, rank=0, seed=3)
    with pytest.raises(shardkit.ConfigError, match=message):
        ShardkitDataset(odd_dataset, **(options | change)).load_state_dict(states[1])


def test_a_state_of_another_dataset_is_refused(odd_dataset, tmp_path):
    other = str(tmp_path / "other")
    with shardkit.PileWriter(other, piles=6, seed=2) as w:
        for s in make_samples(N, seed=1):
            w.write(s)
    _, states = read_phases(odd_dataset, [(2, 4, 0, 3), (3, 4, 0, 2), (1, 4, 0, 0)], drop_last=False)
    with pytest.raises(shardkit.ConfigError, match="fingerprint"):
        ShardkitDataset(other, batch_size=4, decode=False, world_size=3, rank=0, seed=3).load_state_dict(states[1])


def test_spawned_persistent_workers_resume_a_state_of_other_ranks(odd_dataset):
    """The phases of a state taken on 3 ranks reach workers spawned before it was loaded."""
    head, state = [], None
    for rank in range(3):
        dl = ShardkitDataLoader(
            ShardkitDataset(odd_dataset, batch_size=4, decode=False, drop_last=False, world_size=3, rank=rank), num_workers=2
        )
        head += flat_keys(itertools.islice(dl, 5))
        state = dl.state_dict()
    ds = ShardkitDataset(odd_dataset, batch_size=4, decode=False, drop_last=False, world_size=1, rank=0)
    dl = ShardkitDataLoader(ds, num_workers=2, multiprocessing_context="spawn", persistent_workers=True)
    list(dl)  # epoch 0; the workers start here
    dl.load_state_dict(state)
    rest = flat_keys(dl)
    assert sorted(head + rest) == sorted(s["__key__"] for s in make_samples(N))
    assert dl.state_dict()["epoch"] == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_items_are_taken_without_a_profiler_label_unless_a_profiler_runs(odd_dataset, monkeypatch, workers):
    """torch labels each item of a DataLoader for its profiler, at a cost the main process feels
    (tens of µs an item): ShardkitDataLoader leaves the label out while no profiler runs, and
    keeps it when one does."""
    from torch.autograd import profiler

    labels: list[str] = []
    enter = profiler.record_function.__enter__

    def counted(self):
        labels.append(self.name)
        return enter(self)

    monkeypatch.setattr(profiler.record_function, "__enter__", counted)
    ds = ShardkitDataset(odd_dataset, batch_size=8, decode=False, drop_last=False, world_size=1, rank=0)
    dl = ShardkitDataLoader(ds, num_workers=workers)
    everything = sorted(s["__key__"] for s in make_samples(N))
    assert sorted(flat_keys(dl)) == everything
    assert not [name for name in labels if "DataLoader" in name]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert sorted(flat_keys(dl)) == everything
    assert sum("DataLoader" in name for name in labels) == len(ds) + 1  # each batch, and the end
    assert any("enumerate(DataLoader)" in event.name for event in prof.events())


def test_items_past_a_length_the_dataloader_reported_still_warn():
    """The items a DataLoader's iterator gives past the length it reported go through torch's own
    ``__next__``, which warns."""
    from shardkit.loading.handoff import taken

    class Longer(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(5))

        def __len__(self):
            return 3

    dl = torch.utils.data.DataLoader(Longer(), batch_size=None)
    assert len(dl) == 3
    with pytest.warns(UserWarning, match="reported to be 3"):
        assert list(taken(iter(dl))) == [0, 1, 2, 3, 4]


def _write_keys(out, keys, **options):
    with shardkit.PileWriter(out, piles=4, seed=0, **options) as w:
        for key in keys:
            w.write({"__key__": key, "bin": key.encode()})


@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_a_state_resumes_on_its_generation_after_an_append(tmp_path, workers, persistent):
    out = str(tmp_path / "ds")
    _write_keys(out, [f"a{i:03d}" for i in range(40)])
    ds = ShardkitDataset(out, decode=False, batch_size=5, seed=2)
    batches = iter(dl := ShardkitDataLoader(ds, num_workers=workers))
    head = [k for _ in range(3) for k in next(batches)["__key__"]]
    state = dl.state_dict()
    rest = [k for b in batches for k in b["__key__"]]
    assert state["generation"] == 0
    _write_keys(out, [f"b{i:03d}" for i in range(40)], mode="append")

    ds = ShardkitDataset(out, decode=False, batch_size=5, seed=2)
    dl = ShardkitDataLoader(ds, num_workers=workers, persistent_workers=persistent)
    if persistent:  # its workers started on generation 1: they follow the state to generation 0
        assert len(list(dl)) == 16
    dl.load_state_dict(state)
    assert [k for b in dl for k in b["__key__"]] == rest
    ds.set_epoch(1)  # and read generation 0 from then on, as a loader does
    assert sorted(k for b in dl for k in b["__key__"]) == sorted(head + rest)
    assert dl.state_dict()["generation"] == 0


def test_a_persistent_worker_refuses_a_loaded_generation_overwritten_since(tmp_path):
    out = str(tmp_path / "ds")
    _write_keys(out, [f"a{i:03d}" for i in range(40)])
    ds = ShardkitDataset(out, decode=False, batch_size=5, seed=2)
    state = ds.state_dict()
    _write_keys(out, [f"b{i:03d}" for i in range(40)], mode="append")
    ds = ShardkitDataset(out, decode=False, batch_size=5, seed=2)
    dl = ShardkitDataLoader(ds, num_workers=1, persistent_workers=True)
    assert len(list(dl)) == 16  # its worker started on generation 1
    dl.load_state_dict(state)  # generation 0, as the main process reads it
    _write_keys(out, [f"c{i:03d}" for i in range(40)], overwrite=True)  # generation 0 again, other samples
    for _ in range(2):  # and again the next epoch: the worker did not move onto the other dataset's samples
        with pytest.raises(shardkit.DatasetNotFoundError, match=r"ds: generation 0, which the loaded state was taken on, was overwritten"):
            list(dl)


def test_a_state_refused_leaves_the_dataset_on_its_generation(tmp_path):
    out = str(tmp_path / "ds")
    _write_keys(out, [f"a{i:03d}" for i in range(40)])
    state = ShardkitDataset(out, decode=False, batch_size=5, seed=3).state_dict()  # generation 0, another seed
    _write_keys(out, [f"b{i:03d}" for i in range(40)], mode="append")
    ds = ShardkitDataset(out, decode=False, batch_size=5, seed=2)
    with pytest.raises(shardkit.ConfigError, match="the state was taken with seed=3"):
        ds.load_state_dict(state)
    assert ds.source.generation == 1 and len(ds) == 16


def test_a_position_too_large_for_the_shared_memory_says_what_fills_it(tmp_path, monkeypatch):
    """Not only the phases done fill it: a blend's starts and each source's generation do too."""
    from shardkit.loading import shared_place

    out = str(tmp_path / "ds")
    _write_keys(out, [f"a{i:03d}" for i in range(40)])
    ds = ShardkitDataset(out, decode=False, batch_size=5, seed=2)
    state = ds.state_dict()
    monkeypatch.setattr(shared_place, "POSITION_BYTES", 64)
    with pytest.raises(
        shardkit.ConfigError, match=r"load_state_dict: the position takes \d+ bytes \(0 phases done, 1 source\), more than the 64"
    ):
        ds.load_state_dict(state)


def test_a_state_after_a_dataloader_batched_samples_in_its_workers_is_refused(odd_dataset):
    """Its workers take turns a batch of its batch_size at a time, which the dataset cannot see:
    any count would resume wrongly (samples read twice, others never). Refused; without workers,
    or batched in the dataset, the state is exact."""
    ds = ShardkitDataset(odd_dataset, seed=0, decode=False)
    it = iter(torch.utils.data.DataLoader(ds, batch_size=10, num_workers=2))
    for _ in range(5):
        next(it)
    with pytest.raises(shardkit.ConfigError, match=r"state_dict: a DataLoader with batch_size set batched .* in its 2 workers"):
        ds.state_dict(yielded=5)
    ds.set_epoch(1)  # nothing of epoch 1 read yet: its start is a state, whoever read epoch 0
    assert ds.state_dict(yielded=0)["epoch"] == 1
    ds.set_epoch(0)
    del it
    seen = [k for b in itertools.islice(torch.utils.data.DataLoader(ds, batch_size=10), 5) for k in b["__key__"]]
    rest = ShardkitDataset(odd_dataset, seed=0, decode=False)
    rest.load_state_dict(ds.state_dict())  # in this process: counted by itself, exact
    assert sorted(seen + [s["__key__"] for s in rest]) == sorted(s["__key__"] for s in ShardkitDataset(odd_dataset, seed=0, decode=False))
