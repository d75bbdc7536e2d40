"""The ranks of a real two-process torch.distributed (gloo) job read one generation of a dataset
that grows while they make their loaders; plain shards that differ between ranks are refused."""

from __future__ import annotations

import collections
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

import shardkit
from tests.conftest import make_samples

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'shardkit[torch]')")

from shardkit.loading import one_generation  # noqa: E402

N = 203

_RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, shutil, sys
    import torch, torch.distributed as dist
    import shardkit
    from shardkit.torch import ShardkitDataLoader, ShardkitDataset

    root, other, shards, out = sys.argv[1:5]
    import datetime
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))  # a rank that failed lets the other go
    rank = dist.get_rank()
    options = dict(batch_size=4, decode=False, seed=3)

    def make():
        return {
            "open": shardkit.open(root, decode=False),
            "dataset": ShardkitDataset(root, **options),
            "loader": shardkit.loader(root, **options),
            "blend": shardkit.loader({"a": root, "b": other}, weights={"a": 1, "b": 1}, **options),
        }

    def keys(made):
        got = {"dataset": [k for b in ShardkitDataLoader(made["dataset"], num_workers=2) for k in b["__key__"]]}
        got["loader"] = [k for b in made["loader"] for k in b["__key__"]]
        got["blend"] = [k for b in made["blend"] for k in b["__key__"]]
        return got

    first = make() if rank == 0 else None
    plain = shardkit.loader(os.path.join(shards, "*.tar"), decode=False) if rank == 0 else None
    dist.barrier()
    if rank == 0:  # the dataset grows, and a shard joins the pattern, while rank 1 has not made its loaders yet
        with shardkit.PileWriter(root, piles=6, seed=1, mode="append") as w:
            for i in range(40):
                w.write({"__key__": f"new{i:04d}", "bin": b"x" * 8, "cls": 0})
        shutil.copy(os.path.join(shards, "a.tar"), os.path.join(shards, "b.tar"))
    dist.barrier()
    refused = []
    if rank == 1:
        first = make()
        try:
            shardkit.loader(os.path.join(shards, "*.tar"), decode=False)
        except shardkit.ConfigError as e:
            refused.append(str(e))
    generations = {name: made.source.generation for name, made in first.items() if name != "open"}
    generations["open"] = first["open"].manifest.generation
    generations["blend parts"] = [p.generation for p in first["blend"].source.parts]
    got = keys(first)
    class InWorkers(torch.utils.data.IterableDataset):  # a loader made in each DataLoader worker: it leaves the store alone
        def __iter__(self):
            yield shardkit.loader(root, **options).source.generation

    in_workers = list(torch.utils.data.DataLoader(InWorkers(), batch_size=None, num_workers=2))
    dist.barrier()
    # this rank's fourth loader of root is the next to ask: the workers' loaders asked nothing
    asked = dist.distributed_c10d._get_default_store().check(["shardkit/one-generation/" + root + "#3"])
    dist.barrier()
    second = ShardkitDataset(root, **options)  # made again on every rank: the grown dataset on every rank
    result = {
        "rank": rank,
        "generations": generations,
        "keys": got,
        "second": second.source.generation,
        "second keys": [k for b in ShardkitDataLoader(second, num_workers=0) for k in b["__key__"]],
        "refused": refused,
        "in workers": in_workers,
        "asked from workers": asked,
    }
    with open(out, "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write(out: str, samples: list[dict]) -> str:
    with shardkit.PileWriter(out, piles=6, seed=1) as w:
        for s in samples:
            w.write(s)
    return out


def test_ranks_read_the_generation_the_first_rank_opened(tmp_path):
    root = _write(str(tmp_path / "ds"), make_samples(N))
    other = _write(str(tmp_path / "other"), [dict(s, __key__=f"o{i:05d}") for i, s in enumerate(make_samples(60, seed=1))])
    shards = tmp_path / "shards"
    shards.mkdir()
    shutil.copy(os.path.join(root, "pile-000000.tar"), shards / "a.tar")
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2", PYTHONPATH=here)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), root, other, str(shards), str(tmp_path / f"r{r}.json")],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
        )
        for r in range(2)
    ]
    try:
        for p in procs:
            assert p.wait(timeout=300) == 0
    finally:
        for p in procs:
            p.kill()
    r0, r1 = (json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2))
    assert shardkit.loader(root).source.generation == 1, "the append published while the ranks made their loaders"
    # rank 1 made its loaders after the append, and reads generation 0 as rank 0 does
    for r in (r0, r1):
        assert (r["generations"]["dataset"], r["generations"]["loader"], r["generations"]["blend parts"]) == (0, 0, [0, 0])
        assert r["generations"]["open"] == 0
    for kind in ("dataset", "loader", "blend"):
        a, b = r0["keys"][kind], r1["keys"][kind]
        assert len(a) == len(b) > 0, kind
        assert kind == "blend" or not set(a) & set(b), f"{kind}: the ranks share no sample"  # a blend repeats its smaller source
        assert not any(k.startswith("new") for k in a + b), f"{kind}: no sample of the newer generation"
    assert len(r0["keys"]["dataset"]) == (N // 2) // 4 * 4
    # loaders made again on every rank read the grown dataset on every rank
    assert r0["second"] == r1["second"] == 1
    assert len(r0["second keys"]) == len(r1["second keys"]) == ((N + 40) // 2) // 4 * 4
    assert any(k.startswith("new") for k in r0["second keys"] + r1["second keys"])
    assert r0["in workers"] == r1["in workers"] == [1, 1]
    assert r0["asked from workers"] is r1["asked from workers"] is False, "a worker shares its rank's store connection: left alone"
    # plain shards have no generations: rank 1 sees another shard than rank 0 saw, and is refused
    assert r0["refused"] == [] and len(r1["refused"]) == 1
    assert (
        "a.tar (+1 shards): rank 1 finds other shards than rank 0 found when it made its loader (2 shards here, 1 there" in r1["refused"][0]
    )


class _Dist:
    """torch.distributed as a job of four processes shows it to one of them, over a real in-memory store."""

    def __init__(self, store) -> None:
        self.rank = 0
        self.distributed_c10d = type("c10d", (), {"_get_default_store": staticmethod(lambda: store)})

    def get_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return 4


@pytest.fixture
def job(monkeypatch):
    """The processes of a job, taking turns in this process, sharing a real store: ``job(r)``
    makes this process rank ``r`` (with that process's count of loaders made)."""
    store = torch.distributed.HashStore()
    dist = _Dist(store)
    monkeypatch.setattr(one_generation, "distributed", lambda: dist)

    made: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)

    def as_rank(rank: int) -> torch.distributed.Store:
        dist.rank = rank
        monkeypatch.setattr(one_generation, "_made", made[rank])
        return store

    return as_rank


def _grow(root: str) -> None:
    with shardkit.PileWriter(root, piles=6, seed=1, mode="append") as w:
        w.write({"__key__": "late", "bin": b"x", "cls": 0})


def test_a_generation_collected_before_a_later_rank_opens_it_is_named(tmp_path, job):
    root = _write(str(tmp_path / "ds"), make_samples(50))
    job(0)
    assert shardkit.loader(root, rank=0, world_size=2).source.generation == 0
    _grow(root)
    os.remove(os.path.join(root, "shardkit.g000000.json"))  # what gc does once its grace period is over
    job(1)
    with pytest.raises(shardkit.DatasetNotFoundError, match="generation 0 is gone"):
        shardkit.loader(root, rank=1, world_size=2)


def test_a_loader_each_rank_reads_whole_asks_nobody_and_other_worlds_agree_apart(tmp_path, job):
    root = _write(str(tmp_path / "ds"), make_samples(50))
    job(0)
    shardkit.loader(root, rank=0, world_size=2)
    _grow(root)
    store = job(1)
    assert shardkit.loader(root, rank=0, world_size=1).source.generation == 1, "world_size=1 asks nobody"
    assert shardkit.loader(root, rank=1, world_size=4).source.generation == 1, "the first loader of 4 ranks"
    assert store.check([f"{one_generation.PREFIX}{root}|4#0"]) and not store.check([f"{one_generation.PREFIX}{root}|1#0"])
    assert shardkit.loader(root, rank=1, world_size=2).source.generation == 0, "the loaders of 2 ranks follow the first"


def test_processes_sharing_a_loader_rank_and_loader_ranks_sharing_a_process_agree(tmp_path, job):
    """Tensor-parallel peers (processes 0 and 1 both read loader rank 0 of 2), and process 2
    making the loaders of ranks 0 and 1 of another world, across an append."""
    root = _write(str(tmp_path / "ds"), make_samples(50))
    job(0)
    shardkit.loader(root, rank=0, world_size=2)
    shardkit.loader(root, rank=0, world_size=3)
    _grow(root)
    job(1)
    assert shardkit.loader(root, rank=0, world_size=2).source.generation == 0
    job(2)
    assert [shardkit.loader(root, rank=r, world_size=3).source.generation for r in (1, 2)] == [0, 0]


def test_a_blend_pins_its_datasets_and_checks_its_shards(tmp_path, job):
    root = _write(str(tmp_path / "ds"), make_samples(50))
    shards = tmp_path / "shards"
    shards.mkdir()
    shutil.copy(os.path.join(root, "pile-000000.tar"), shards / "a.tar")
    blend = {"a": root, "b": str(shards / "*.tar")}
    job(0)
    first = shardkit.loader(blend, weights={"a": 1, "b": 1}, rank=0, world_size=2, batch_size=2)
    _grow(root)
    job(1)
    second = shardkit.loader(blend, weights={"a": 1, "b": 1}, rank=1, world_size=2, batch_size=2)
    assert [p.generation for p in second.source.parts] == [0, None]
    assert second.source.fingerprint() == first.source.fingerprint() and len(second) == len(first)
    job(0)
    shardkit.loader(blend, weights={"a": 1, "b": 1}, rank=0, world_size=2, batch_size=2)
    shutil.copy(shards / "a.tar", shards / "b.tar")  # a shard joins before rank 1 makes its second blend
    job(1)
    with pytest.raises(shardkit.ConfigError, match=r"blend source 'b': .*rank 1 finds other shards than rank 0 .*\(2 shards here, 1 there"):
        shardkit.loader(blend, weights={"a": 1, "b": 1}, rank=1, world_size=2, batch_size=2)


def test_a_rank_sent_to_an_older_generation_says_so(tmp_path, job, caplog):
    """Rank 0 looks at the data with a loader rank 1 does not make: rank 1's loader pairs with it."""
    root = _write(str(tmp_path / "ds"), make_samples(50))
    job(0)
    shardkit.loader(root, rank=0, world_size=2)  # the look
    _grow(root)
    shardkit.loader(root, rank=0, world_size=2)  # the training loader: generation 1
    job(1)
    with caplog.at_level("WARNING", logger="shardkit"):
        assert shardkit.loader(root, rank=1, world_size=2).source.generation == 0
    (said,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "generation" in r.getMessage()]
    assert said.startswith(f"{root}: rank 1 reads generation 0, which rank 0 read for its loader number 1 of this dataset")
    assert said.endswith("make it with world_size=1")


def test_datasets_opened_by_index_agree_apart_from_loaders(tmp_path, job):
    """shardkit.open under a DistributedSampler: every rank must see the same length."""
    root = _write(str(tmp_path / "ds"), make_samples(50))
    job(0)
    first = shardkit.open(root, decode=False)
    shardkit.loader(root, rank=0, world_size=4)
    _grow(root)
    job(1)
    second = shardkit.open(root, decode=False)
    assert len(second) == len(first) == 50 and second.manifest.generation == 0
    assert [second[i]["__key__"] for i in range(50)] == [first[i]["__key__"] for i in range(50)]
    assert shardkit.loader(root, rank=1, world_size=4).source.generation == 0, "the loaders pair apart"
    job(2)
    assert len(shardkit.open(root, decode=False, seed=0)) == 50
    assert len(shardkit.open(root, decode=False)) == 51, "a second dataset opened: the first of its place"


def test_a_dataset_one_rank_opens_alone_asks_nobody(tmp_path, job):
    root = _write(str(tmp_path / "ds"), make_samples(50))
    job(0)
    assert len(shardkit.open(root, one_generation=False)) == 50  # a look on rank 0 alone
    first = shardkit.open(root)
    _grow(root)
    job(1)
    assert len(shardkit.open(root)) == len(first) == 50, "paired with rank 0's second open, not its look"
    assert len(shardkit.open(root, one_generation=False)) == 51
    with pytest.raises(shardkit.ConfigError, match="one_generation: expected True or False"):
        shardkit.open(root, one_generation="no")


def test_a_reader_that_failed_takes_the_same_place_again(tmp_path, job, monkeypatch):
    """A throttled read of the first rank's generation, retried: the retry follows the same loader
    of rank 0, not the next (which nobody made yet, and would read the latest)."""
    root = _write(str(tmp_path / "ds"), make_samples(50))
    job(0)
    shardkit.loader(root, rank=0, world_size=2)
    opened = shardkit.open(root)
    _grow(root)
    job(1)

    def slow_down(*args):
        raise shardkit.StorageError(f"{root}: 503 SlowDown")

    with monkeypatch.context() as throttled:
        throttled.setattr(one_generation, "at_generation", slow_down)
        with pytest.raises(shardkit.StorageError, match="SlowDown"):
            shardkit.loader(root, rank=1, world_size=2)
    assert shardkit.loader(root, rank=1, world_size=2).source.generation == 0
    with monkeypatch.context() as throttled:
        throttled.setattr(one_generation.Dataset, "pinned", slow_down)
        with pytest.raises(shardkit.StorageError, match="SlowDown"):
            shardkit.open(root)
    assert len(shardkit.open(root)) == len(opened) == 50


def test_a_blend_that_failed_takes_the_same_places_again(tmp_path, job, monkeypatch):
    a = _write(str(tmp_path / "a"), make_samples(50))
    b = _write(str(tmp_path / "b"), [dict(s, __key__=f"b{i:04d}") for i, s in enumerate(make_samples(30, seed=1))])
    blend = {"a": a, "b": b}
    job(0)
    shardkit.loader(blend, weights={"a": 1, "b": 1}, rank=0, world_size=2, batch_size=2)
    _grow(a)
    _grow(b)
    job(1)
    real = one_generation.at_generation

    def b_throttled(root, generation):
        if root == b:
            raise shardkit.StorageError(f"{root}: 503 SlowDown")
        return real(root, generation)

    with monkeypatch.context() as throttled:
        throttled.setattr(one_generation, "at_generation", b_throttled)
        with pytest.raises(shardkit.StorageError, match=r"blend source 'b': .*SlowDown"):
            shardkit.loader(blend, weights={"a": 1, "b": 1}, rank=1, world_size=2, batch_size=2)
    again = shardkit.loader(blend, weights={"a": 1, "b": 1}, rank=1, world_size=2, batch_size=2)
    assert [p.generation for p in again.source.parts] == [0, 0]
