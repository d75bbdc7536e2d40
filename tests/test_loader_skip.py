"""on_error="skip"/"warn": what is skipped is counted, and ranks stay in step whatever fails."""

from __future__ import annotations

import os

import pytest

import shardkit
from shardkit import manifest
from shardkit.loading.pile import read_pile
from shardkit.tar import write as tarwrite

N = 160
PILES = 6


def bad_label(i: int) -> bool:
    return i % 11 == 3


@pytest.fixture
def damaged(tmp_path) -> tuple[str, dict, set[str]]:
    """A dataset with undecodable labels, and one of its piles truncated after the clean run.

    Returns the directory, per (world, rank, batch_size, drop_last, mix) the clean batches' keys
    taken before the damage, and the keys of the truncated pile.
    """
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=PILES, seed=4) as w:
        for i in range(N):
            w.write({"__key__": f"k{i:04d}", "cls": b"not a number" if bad_label(i) else str(i).encode()})
    clean: dict = {}
    for config in configs():
        world, rank, batch_size, drop_last, mix = config
        loader = shardkit.loader(out, decode=False, batch_size=batch_size, drop_last=drop_last, mix=mix, rank=rank, world_size=world)
        clean[config] = [b["__key__"] for b in loader]
    piles = manifest.read(out).piles
    bad = max(piles, key=lambda p: p.samples)  # the largest pile: some batches lie wholly inside it
    path = os.path.join(out, bad.name)
    lost = set(read_pile(path).keys)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    return out, clean, lost


def configs() -> list[tuple[int, int, int, bool, int]]:
    return [(2, r, b, d, m) for r in (0, 1) for b in (4, 7) for d in (True, False) for m in (1, 2)]


@pytest.mark.parametrize("policy", ["skip", "warn"])
@pytest.mark.parametrize("workers", [0, 1])
def test_every_rank_yields_len_batches_whatever_is_skipped(damaged, policy, workers):
    out, clean, _ = damaged
    empties = 0
    skipped: dict[tuple, int] = {}
    for world, rank, batch_size, drop_last, mix in configs():
        options = dict(batch_size=batch_size, drop_last=drop_last, mix=mix, world_size=world, on_error=policy, num_workers=workers)
        with shardkit.loader(out, rank=rank, **options) as loader:
            got = list(loader)
            assert len(got) == len(loader) == len(clean[(world, rank, batch_size, drop_last, mix)])
            assert loader.stats.skipped_samples > 0
            key = (batch_size, drop_last, mix)
            skipped[key] = skipped.get(key, 0) + loader.stats.skipped_piles
        for batch, reference in zip(got, clean[(world, rank, batch_size, drop_last, mix)], strict=True):
            # each batch keeps its slot: what is left of it, in its order
            assert batch["__key__"] == [k for k in reference if k in batch["__key__"]]
            assert not any(bad_label(int(k[1:])) for k in batch["__key__"])
            assert list(batch.get("cls", [])) == [int(k[1:]) for k in batch["__key__"]]
            if not batch["__key__"]:
                assert batch == {"__key__": []}
                empties += 1
    assert empties > 0, "the truncated pile must empty some batches wholly"
    assert set(skipped.values()) <= {1, 2}, "the bad pile is skipped once per rank that reads it"


def test_both_ranks_together_yield_every_readable_sample(damaged):
    out, _, lost = damaged
    readable = {f"k{i:04d}" for i in range(N) if not bad_label(i)} - lost
    got = [
        k
        for r in (0, 1)
        for b in shardkit.loader(out, batch_size=5, drop_last=False, world_size=2, rank=r, on_error="skip")
        for k in b["__key__"]
    ]
    assert set(got) == readable and len(got) == len(set(got))


def test_a_custom_collate_gets_the_empty_batch(damaged):
    out, clean, _ = damaged
    sizes = []
    for rank in (0, 1):
        batches = list(shardkit.loader(out, batch_size=4, world_size=2, rank=rank, on_error="skip", collate=list))
        assert len(batches) == len(clean[(2, rank, 4, True, 1)])
        sizes.extend(len(b) for b in batches)
    assert 0 in sizes


def test_unbatched_skips_are_not_yielded_and_counted(damaged):
    out, _, _ = damaged
    for rank in (0, 1):
        loader = shardkit.loader(out, world_size=2, rank=rank, on_error="skip")
        got = list(loader)
        assert len(got) + loader.stats.skipped_samples == len(loader)
        raw = shardkit.loader(out, world_size=2, rank=rank, on_error="skip", decode=False)
        assert len(list(raw)) + raw.stats.skipped_samples == len(raw)


def test_a_malformed_sample_is_skipped_alone(tmp_path):
    """Two members of one extension spoil their sample, not the pile (fast index only)."""
    url = str(tmp_path / "dup.tar")
    members = [tarwrite.member(f"k{i}.cls", b"%d" % i) for i in range(4)]
    members.insert(2, tarwrite.member("k1.cls", b"9"))  # sample k1 now has two .cls members
    with open(url, "wb") as f:
        f.write(b"".join(members) + tarwrite.TRAILER)
    for batch_size in (None, 2):
        loader = shardkit.loader(url, shuffle=False, on_error="skip", batch_size=batch_size, drop_last=False)
        got = list(loader)
        assert keys_flat(got) == ["k0", "k2", "k3"] and loader.stats.skipped_samples == 1
        assert "already has a 'cls' member" in loader.stats.errors[0]
        if batch_size:
            assert len(got) == len(loader) == 2
    with pytest.raises(shardkit.CorruptShardError, match="already has a 'cls' member"):
        list(shardkit.loader(url, shuffle=False))


def keys_flat(items) -> list[str]:
    return [k for item in items for k in (item["__key__"] if isinstance(item["__key__"], list) else [item["__key__"]])]
