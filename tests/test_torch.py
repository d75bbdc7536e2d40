"""shardkit.torch: DataLoader workers and a real two-process DDP (gloo) run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

import shardkit
from tests.conftest import make_samples

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'shardkit[torch]')")

from shardkit.torch import ShardkitDataset  # noqa: E402

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


def test_workers_share_the_rank_slice(odd_dataset):
    ds = ShardkitDataset(odd_dataset, decode=False, world_size=2, rank=1)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    got = flat_keys(dl)
    alone = flat_keys(shardkit.loader(odd_dataset, decode=False, world_size=2, rank=1))
    assert sorted(got) == sorted(alone) and len(got) == N // 2


_RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch, torch.distributed as dist
    from shardkit.torch import ShardkitDataset

    dist.init_process_group("gloo")
    del os.environ["RANK"], os.environ["WORLD_SIZE"]  # rank and world size must come from torch.distributed
    ds = ShardkitDataset(sys.argv[1], batch_size=4, decode=False, seed=3)
    keys = [k for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2) for k in b["__key__"]]
    lengths = [None] * dist.get_world_size()
    dist.all_gather_object(lengths, len(keys))
    with open(sys.argv[2], "w") as f:
        json.dump({"rank": dist.get_rank(), "keys": keys, "lengths": lengths, "len": len(ds)}, f)
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
