"""The epoch plan: exact coverage, determinism, rank/worker slicing, resume, mix, uniformity."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.loading import plan
from shardkit.loading.plan import EpochOrder, Schedule, rank_span, worker_span
from shardkit.piles import router


def reference(counts: list[int], seed: int, epoch: int, shuffle: bool = True) -> list[tuple[int, int]]:
    """The plain schedule written the obvious way: piles one after another."""
    order = plan.generator(plan.PILE_ORDER, seed, epoch).permutation(len(counts)) if shuffle else range(len(counts))
    out = []
    for p in order:
        inner = plan.generator(plan.IN_PILE, seed, epoch, int(p)).permutation(counts[p]) if shuffle else range(counts[p])
        out.extend((int(p), int(i)) for i in inner)
    return out


def spread_reference(counts: list[int], seed: int, epoch: int, mix: int) -> list[tuple[int, int]]:
    """The mix=k order written the obvious way: the plain order, sorted by jittered pile time."""
    plain = reference(counts, seed, epoch)
    order = plan.generator(plan.PILE_ORDER, seed, epoch).permutation(len(counts))
    sizes = [counts[p] for p in order if counts[p]]
    # u: rank of the pile in the read order plus the fraction of it read before the sample
    rank = np.repeat(np.arange(len(sizes)), sizes)
    size = np.repeat(np.array(sizes, dtype=np.float64), sizes)
    frac = np.concatenate([np.arange(s) for s in sizes]) * (1.0 / size) if sizes else np.zeros(0)
    runs = -(-len(plain) // plan.JITTER_RUN)
    jitter = np.concatenate(
        [plan.generator(plan.MIX, seed, epoch, r).random(min(plan.JITTER_RUN, len(plain) - r * plan.JITTER_RUN)) for r in range(runs)]
        or [np.zeros(0)]
    )
    t = rank + frac + mix * jitter
    return [plain[q] for q in sorted(range(len(plain)), key=lambda q: (t[q], q))]


def pairs(piles: np.ndarray, index: np.ndarray) -> list[tuple[int, int]]:
    return list(zip(piles.tolist(), index.tolist(), strict=True))


def read_slice(sched: Schedule, start: int = 0) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for block in sched.blocks(start):
        assert block.start == start + len(out), "blocks are contiguous"
        out.extend(pairs(block.piles, block.index))
    return out


@pytest.fixture(params=[None, (1, 2), (2, 3)], ids=["default", "cell-1-run-2", "cell-2-run-3"])
def tiny(request, monkeypatch):
    """Force tiny mix cells and jitter runs so multi-cell, multi-run and resume paths run on tiny piles."""
    if request.param is not None:
        monkeypatch.setattr(plan, "CELL", request.param[0])
        monkeypatch.setattr(plan, "JITTER_RUN", request.param[1])
    return request.param


@pytest.mark.parametrize("counts", [[5], [3, 0, 4], [1, 1, 1, 1], [10, 7, 0, 12, 3], [0, 0]])
@pytest.mark.parametrize("shuffle", [True, False])
def test_plain_schedule_matches_reference(counts, shuffle):
    for epoch in range(3):
        order = EpochOrder(counts, seed=11, epoch=epoch, shuffle=shuffle)
        assert pairs(*order.take(0, order.total)) == reference(counts, 11, epoch, shuffle)


def test_shuffle_false_is_manifest_order():
    order = EpochOrder([2, 3], seed=5, epoch=9, shuffle=False)
    assert pairs(*order.take(0, 5)) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]


@pytest.mark.parametrize("mix", [2, 3, 5])
@pytest.mark.parametrize("counts", [[6, 0, 9, 1, 4, 7], [1] * 9, [40, 3, 25, 60]])
def test_mix_matches_reference(counts, mix, tiny):
    for seed in range(4):
        order = EpochOrder(counts, seed=seed, epoch=seed, mix=mix)
        got = pairs(*order.take(0, order.total))
        assert sorted(got) == [(p, i) for p, c in enumerate(counts) for i in range(c)]
        assert got == spread_reference(counts, seed, seed, mix)
        for lo, hi in [(1, order.total), (order.total // 3, order.total // 2 + 1), (order.total - 1, order.total)]:
            assert pairs(*order.take(lo, hi)) == got[lo:hi], "any stretch equals the same stretch of the whole"


def test_mix_one_equals_plain_schedule(tiny):
    counts = [4, 9, 2, 6]
    assert pairs(*EpochOrder(counts, seed=3, epoch=2, mix=1).take(0, 21)) == reference(counts, 3, 2)


def test_mix_actually_interleaves():
    order = EpochOrder([50] * 4, seed=0, epoch=0, mix=2)
    piles = order.take(0, 200)[0]
    assert np.count_nonzero(np.diff(piles)) > 10


def test_epochs_differ_and_repeat():
    counts = [40] * 6
    orders = {e: pairs(*EpochOrder(counts, seed=7, epoch=e).take(0, 240)) for e in range(4)}
    assert len({tuple(v) for v in orders.values()}) == 4
    assert pairs(*EpochOrder(counts, seed=7, epoch=2).take(0, 240)) == orders[2]
    assert pairs(*EpochOrder(counts, seed=8, epoch=2).take(0, 240)) != orders[2]


@pytest.mark.parametrize(("n", "world", "drop_last", "batch", "expected"), [
    (10, 3, True, None, 3),
    (10, 3, False, None, 4),
    (10, 3, True, 2, 2),
    (10, 3, False, 2, 4),
    (2, 4, True, None, 0),
    (2, 4, False, None, 1),
])  # fmt: skip
def test_rank_lengths(n, world, drop_last, batch, expected):
    for rank in range(world):
        lo, hi = rank_span(n, world=world, rank=rank, drop_last=drop_last, batch_size=batch)
        assert hi - lo == expected


def test_padding_wraps_to_the_start():
    order = EpochOrder([3, 4], seed=1, epoch=0)
    full = pairs(*order.take(0, 7))
    got = [read_slice(Schedule(order, *rank_span(7, world=3, rank=r, drop_last=False))) for r in range(3)]
    assert got == [full[0:3], full[3:6], full[6:7] + full[0:2]]


def test_worker_spans_split_on_batches():
    spans = [worker_span(10, 31, workers=3, worker=w, batch_size=4) for w in range(3)]
    assert spans == [(10, 18), (18, 26), (26, 31)]
    assert [worker_span(0, 2, workers=3, worker=w) for w in range(3)] == [(0, 0), (0, 1), (1, 2)]


@pytest.mark.parametrize("bad", [dict(mix=0), dict(mix=2, shuffle=False)])
def test_bad_arguments(bad):
    with pytest.raises(ValueError):
        EpochOrder([3], seed=0, epoch=0, **bad)


@settings(max_examples=150, deadline=None)
@given(
    counts=st.lists(st.integers(0, 12), min_size=1, max_size=7),
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 5),
    mix=st.integers(1, 4),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    batch=st.sampled_from([None, 1, 2, 3]),
    drop_last=st.booleans(),
    start=st.integers(0, 40),
    tiny=st.sampled_from([None, (1, 2), (2, 3)]),
)
def test_slices_cover_the_global_order(counts, seed, epoch, mix, world, workers, batch, drop_last, start, tiny):
    with pytest.MonkeyPatch.context() as mp:
        if tiny:
            mp.setattr(plan, "CELL", tiny[0])
            mp.setattr(plan, "JITTER_RUN", tiny[1])
        _check_slices(counts, seed, epoch, mix, world, workers, batch, drop_last, start)


def _check_slices(counts, seed, epoch, mix, world, workers, batch, drop_last, start):
    order = EpochOrder(counts, seed=seed, epoch=epoch, mix=mix)
    n = order.total
    full = pairs(*order.take(0, n))
    assert sorted(full) == [(p, i) for p, c in enumerate(counts) for i in range(c)]
    per = n // world if drop_last else -(-n // world)
    padded = (full * (world + 1))[: per * world] if n else []
    lengths = set()
    for rank in range(world):
        lo, hi = rank_span(n, world=world, rank=rank, drop_last=drop_last, batch_size=batch)
        lengths.add(hi - lo)
        rank_items: list[tuple[int, int]] = []
        for w in range(workers):
            sched = Schedule(order, *worker_span(lo, hi, workers=workers, worker=w, batch_size=batch))
            items = read_slice(sched)
            assert len(items) == len(sched)
            _check_uses(sched, items, mix)
            s = min(start, len(items))
            assert read_slice(sched, s) == items[s:], "resume from any start equals the tail"
            assert read_slice(sched, len(items)) == [] and sched.uses(len(items)) == []
            rank_items += items
        # ranks and workers together read the padded global order, in order
        assert rank_items == padded[rank * per : rank * per + (hi - lo)]
        if batch and drop_last:
            assert len(rank_items) % batch == 0
    assert len(lengths) == 1, "every rank reads the same number of samples"
    if not drop_last and n:
        everything = [x for r in range(world) for x in padded[r * per : (r + 1) * per]]
        assert set(everything) == set(full) and len(everything) == per * world


def _check_uses(sched: Schedule, items: list[tuple[int, int]], mix: int) -> None:
    uses = sched.uses()
    assert [u.first for u in uses] == sorted(u.first for u in uses), "uses come in load order"
    for t, (p, _) in enumerate(items):
        assert any(u.pile == p and u.first <= t <= u.last for u in uses), f"position {t} of pile {p} has no use"
    held = [sum(u.first <= t <= u.last for u in uses) for t in range(len(items))]
    assert plan.peak(uses) == max(held, default=0)
    assert plan.peak(uses) <= (mix + 1 if mix > 1 else 1), "never more than mix + 1 piles resident"
    # a loader holds the piles of a whole block at once: blocks must not straddle a use's ends
    for block in sched.blocks():
        end = block.start + len(block.piles) - 1
        assert all((u.first <= block.start) == (u.first <= end) and (u.last < block.start) == (u.last < end) for u in uses)


@pytest.mark.parametrize("mix", [1, 2, 3])
def test_every_window_reads_its_stretch_with_its_uses(mix, tiny):
    counts = [1, 3, 0, 2, 1, 1]
    for seed in range(3):
        order = EpochOrder(counts, seed=seed, epoch=0, mix=mix)
        full = pairs(*order.take(0, order.total))
        for lo, hi in itertools.combinations(range(order.total + 1), 2):
            sched = Schedule(order, lo, hi)
            items = read_slice(sched)
            assert items == full[lo:hi]
            _check_uses(sched, items, mix)


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 30), min_size=1, max_size=6), start=st.integers(0, 100), mix=st.integers(1, 3))
def test_uses_from_start_cover_the_tail(counts, start, mix):
    order = EpochOrder(counts, seed=4, epoch=1, mix=mix)
    sched = Schedule(order, 0, order.total)
    items = read_slice(sched)
    start = min(start, len(items))
    uses = sched.uses(start)
    for t in range(start, len(items)):
        assert any(u.pile == items[t][0] and u.first <= t <= u.last for u in uses)
    assert all(u.first >= start for u in uses)


@pytest.mark.parametrize(("cell", "run"), [(8192, 1 << 16), (2, 3), (4, 2)])
def test_offsets_and_locate_equal_brute_force(monkeypatch, cell, run):
    monkeypatch.setattr(plan, "CELL", cell)
    monkeypatch.setattr(plan, "JITTER_RUN", run)
    counts = [31, 0, 17, 45, 2, 28, 19]
    for mix in (2, 5):
        order = EpochOrder(counts, seed=mix, epoch=1, mix=mix)
        spread = order._spread
        t = np.sort(spread.times(0, order.total))
        cuts = np.arange(spread.end + spread.cells + 1)
        brute = np.searchsorted(t, cuts / spread.cells, side="left")  # samples below each cut
        assert [spread.offset(int(m)) for m in cuts] == brute.tolist()
        assert spread.tally(3, len(cuts) - 1).tolist() == brute[3:].tolist()
        for pos in range(order.total):
            m, at = spread.locate(pos)
            assert at == brute[m] <= pos < brute[m + 1]


def test_ties_go_to_the_earlier_position(monkeypatch):
    # jitters chosen so that samples of different piles land on the same t
    real = plan.stream

    class Fixed:
        def random(self, n):
            return np.resize([0.5, 0.0, 0.25, 0.0, 0.5, 0.75], n)

    monkeypatch.setattr(plan, "stream", lambda tag, *v: Fixed() if tag == plan.MIX else real(tag, *v))
    counts = [2, 2, 2]
    order = EpochOrder(counts, seed=0, epoch=0, mix=2)
    t = order._spread.times(0, order.total)
    assert len(np.unique(t)) < len(t)
    assert pairs(*order.take(0, order.total)) == spread_reference(counts, 0, 0, 2)


@pytest.mark.parametrize("mix", [2, 4, 8])
def test_mix_holds_exactly_mix_plus_one_piles(mix):
    counts = np.random.default_rng(mix).binomial(20_000, 1 / 40, size=40)
    order = EpochOrder(counts, seed=1, epoch=2, mix=mix)
    uses = Schedule(order, 0, order.total).uses()
    assert plan.peak(uses) == mix + 1
    # each pile is held from about its first sample to about its last: its extreme samples sit
    # about sqrt(2 k s) positions inside the span of k + 1 piles
    piles, _ = order.take(0, order.total)
    slack = 5 * np.sqrt(2 * mix * counts.mean())
    for u in uses:
        at = np.flatnonzero(piles == u.pile)
        assert u.first <= at[0] < u.first + slack and u.last - slack < at[-1] <= u.last


def plan_permutation(seed: int, mix: int, n: int = 5, piles: int = 3) -> tuple[int, ...]:
    """The order of samples 0..n-1 after pass 1 (the real router) and the plan, both seeded by ``seed``."""
    routed = router.route(piles=piles, seed=seed, unit=0, count=n)
    members = [np.flatnonzero(routed == p) for p in range(piles)]
    order = EpochOrder([len(m) for m in members], seed=seed, epoch=0, mix=mix)
    p, i = order.take(0, n)
    return tuple(int(members[a][b]) for a, b in zip(p.tolist(), i.tolist(), strict=True))


def permutation_counts(seeds: int, mix: int, n: int = 5, piles: int = 3) -> np.ndarray:
    """How often each of the n! orders comes out of ``plan_permutation`` over ``seeds`` seeds."""
    rank = {p: i for i, p in enumerate(itertools.permutations(range(n)))}
    hits = np.zeros(len(rank), dtype=np.int64)
    for seed in range(seeds):
        hits[rank[plan_permutation(seed, mix, n, piles)]] += 1
    return hits


def chi_square_p(hits: np.ndarray) -> float:
    from scipy import stats

    return float(stats.chisquare(hits).pvalue)


@pytest.mark.parametrize("mix", [2, 3])
def test_first_epoch_is_uniform_with_tiny_cells(mix, monkeypatch):
    # one jitter run per sample and many cells per pile; uniformity must not depend on them
    monkeypatch.setattr(plan, "CELL", 1)
    monkeypatch.setattr(plan, "JITTER_RUN", 1)
    hits = permutation_counts(4000, mix)
    assert hits.min() > 0
    assert chi_square_p(hits) > 1e-4, hits


def test_chi_square_catches_a_biased_plan(monkeypatch):
    # the test above must be able to fail: reading piles in manifest order is biased
    monkeypatch.setattr(plan.EpochOrder, "in_pile", lambda self, p: np.arange(self.counts[p]))
    assert chi_square_p(permutation_counts(3000, 1)) < 1e-6
    assert math.isfinite(chi_square_p(permutation_counts(10, 1)))
