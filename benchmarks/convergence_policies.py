"""The shuffle policies of the convergence benchmark, each read through its own library.

A policy opens a reader for one seed; ``reader.epoch(e)`` reads epoch ``e`` in full through the
library and returns its samples in the order the library yielded them. Training then takes
consecutive batches of that stream, which are exactly the batches the library's own batching
would form. Reading a whole epoch before training keeps the reading time apart from the
training time and changes nothing about the order.
"""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import numpy as np
from convergence_data import Split, import_streaming, write_mds

import shardkit

MOSAIC_INSTALL = "pip install --no-deps mosaicml-streaming, see BENCHMARKS.md"


def derive(seed: int, *path: int) -> int:
    """A 32-bit seed derived from ``(seed, *path)``; distinct paths give independent seeds."""
    return int(np.random.SeedSequence([seed, *path]).generate_state(1)[0])


@dataclass
class Setup:
    """What every policy reads: the examples in RAM, their class-sorted shards, the scale knobs."""

    split: Split
    shards: list[str]
    work: str
    batch: int
    buffer: int
    piles: int
    block: int
    mds_per_shard: int
    mds_mean: float = field(default=0.0, init=False)

    @cached_property
    def mds(self) -> str:
        path, self.mds_mean = write_mds(self.split, os.path.join(self.work, f"mds-{self.mds_per_shard}"), self.mds_per_shard)
        return path

    @cached_property
    def in_order(self) -> tuple[np.ndarray, np.ndarray]:
        """The shards read through webdataset without shuffling: one order for every epoch and seed."""
        import webdataset as wds

        return gather(wds.WebDataset(self.shards, shardshuffle=False).decode().to_tuple("npy", "cls"))

    def piled(self, seed: int) -> str:
        """The sorted shards piled as a user would (``shardkit.pile``), once per seed."""
        out = os.path.join(self.work, f"piles-{self.piles}-seed{seed}")
        if not os.path.exists(os.path.join(out, "shardkit.json")):
            shardkit.pile(self.shards, out, piles=self.piles, seed=derive(seed, 1, 0), overwrite=True, quiet=True)
        return out


class Reader(Protocol):
    def epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]: ...

    def close(self) -> None: ...


def gather(samples: Iterable[tuple[Any, Any]]) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for x, y in samples:
        xs.append(np.asarray(x, dtype=np.float32))
        ys.append(int(y))
    return np.stack(xs), np.asarray(ys, dtype=np.int64)


class Permutation:
    """The reference: a fresh uniform permutation of the in-RAM examples every epoch.

    ``stream`` picks independent permutations for the same seed: a second reference whose
    distance from the first shows what "indistinguishable" looks like in every figure.
    """

    def __init__(self, setup: Setup, seed: int, *, stream: int = 0) -> None:
        self.split, self.seed, self.stream = setup.split, seed, stream

    def epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        order = np.random.default_rng([self.seed, e, 3, self.stream]).permutation(len(self.split.y))
        return self.split.x[order], self.split.y[order]

    def close(self) -> None:
        pass


class Sequential:
    """The shards in order, no shuffle: read through webdataset once (``Setup.in_order``) and reused.

    Re-reading would give the same stream every epoch and for every seed, so only the first
    epoch of the first seed pays for the read.
    """

    def __init__(self, setup: Setup, seed: int) -> None:
        self.setup = setup

    def epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        return self.setup.in_order

    def close(self) -> None:
        pass


class WebDataset:
    """``wds.WebDataset(shards, shardshuffle=100, seed=s).shuffle(buffer, seed=s)``.

    The pipeline is rebuilt every epoch with a seed derived from (seed, epoch): a new shard order
    each epoch, as ``detshuffle`` would give. Built once with a fixed seed, webdataset 1.0
    repeats the shard order every epoch.
    """

    def __init__(self, setup: Setup, seed: int) -> None:
        self.shards, self.buffer, self.seed = setup.shards, setup.buffer, seed

    def epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        import webdataset as wds

        s = derive(self.seed, 2, e)
        # shardshuffle=100 is what shardshuffle=True means: a 100-shard buffer, so every shard
        # order is possible with this many shards
        pipeline = wds.WebDataset(self.shards, shardshuffle=100, seed=s).shuffle(self.buffer, seed=s)
        return gather(pipeline.decode().to_tuple("npy", "cls"))

    def close(self) -> None:
        pass


class HFStreaming:
    """``load_dataset("webdataset", data_files=shards, streaming=True).shuffle(seed, buffer_size)``."""

    def __init__(self, setup: Setup, seed: int) -> None:
        import datasets

        datasets.disable_progress_bars()
        dataset = datasets.load_dataset("webdataset", data_files={"train": setup.shards}, split="train", streaming=True)
        self.dataset = dataset.shuffle(seed=seed, buffer_size=setup.buffer)

    def epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        self.dataset.set_epoch(e)  # its effective seed becomes seed + epoch
        return gather((s["npy"], s["cls"]) for s in self.dataset)

    def close(self) -> None:
        pass


class MosaicPy1e:
    """``StreamingDataset(local=MDS, shuffle_algo="py1e", shuffle_block_size=block)``, one process."""

    def __init__(self, setup: Setup, seed: int) -> None:
        streaming = import_streaming()
        from streaming.base.util import clean_stale_shared_memory

        self._clean = clean_stale_shared_memory
        self._clean()  # a dataset left by the previous seed would claim the same local directory
        self.dataset = streaming.StreamingDataset(
            local=setup.mds, shuffle=True, shuffle_algo="py1e", shuffle_seed=seed, shuffle_block_size=setup.block, batch_size=setup.batch
        )
        self.next = 0

    def epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        if e != self.next:  # it counts epochs itself: each full pass is the next epoch
            raise ValueError(f"MosaicML streaming reads epochs in order: expected epoch {self.next}, got {e}")
        self.next += 1
        return gather((s["x"], s["y"]) for s in self.dataset)

    def close(self) -> None:
        del self.dataset
        self._clean()


class Shardkit:
    """``shardkit.loader(piles, seed=seed, mix=k)`` with ``set_epoch``; optionally re-piled each epoch."""

    def __init__(self, setup: Setup, seed: int, *, mix: int = 1, repile: bool = False) -> None:
        self.setup, self.seed, self.mix, self.repile = setup, seed, mix, repile
        self.source = setup.piled(seed)
        self.made: list[str] = []

    def epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        if self.repile and e > 0:
            self._repile(e)
        with shardkit.loader(self.source, batch_size=self.setup.batch, seed=self.seed, mix=self.mix) as loader:
            loader.set_epoch(e)
            batches = list(loader)
        return np.concatenate([b["npy"] for b in batches]), np.concatenate([b["cls"] for b in batches])

    def _repile(self, e: int) -> None:
        out = os.path.join(self.setup.work, f"repiled-seed{self.seed}-epoch{e}")
        shardkit.repile(self.source, out, seed=derive(self.seed, 1, e), overwrite=True, quiet=True)
        self._drop_made()
        self.source = out
        self.made.append(out)

    def _drop_made(self) -> None:
        for path in self.made:
            shutil.rmtree(path, ignore_errors=True)
        self.made.clear()

    def close(self) -> None:
        self._drop_made()


@dataclass(frozen=True)
class Policy:
    """A named policy: ``label`` is formatted with the Setup's fields; ``needs`` names its module."""

    key: str
    label: str
    open: Callable[[Setup, int], Reader]
    needs: str | None = None
    install: str = ""

    def title(self, setup: Setup) -> str:
        return self.label.format(buffer=setup.buffer, piles=setup.piles, block=setup.block)

    def missing(self) -> str | None:
        """Why the policy cannot run here, or None."""
        if self.needs is None:
            return None
        try:
            if self.needs == "streaming":
                import_streaming()
            else:
                importlib.import_module(self.needs)
        except Exception as e:  # an install that is present but broken is skipped just the same
            return f"{self.needs} cannot be imported ({type(e).__name__}: {e}); {self.install}"
        return None


POLICIES = (
    Policy("sequential", "sequential shards, no shuffle", Sequential),
    Policy("webdataset", "WebDataset shard shuffle + .shuffle({buffer})", WebDataset),
    Policy("hf", "HF streaming .shuffle(buffer_size={buffer})", HFStreaming, "datasets", "pip install datasets, or the bench extra"),
    Policy("mosaic", "MosaicML py1e, block {block}", MosaicPy1e, "streaming", MOSAIC_INSTALL),
    Policy("shardkit", "shardkit, M={piles}", lambda s, seed: Shardkit(s, seed)),
    Policy("shardkit-mix4", "shardkit, M={piles}, mix=4", lambda s, seed: Shardkit(s, seed, mix=4)),
    Policy("shardkit-repile", "shardkit, M={piles}, repile every epoch", lambda s, seed: Shardkit(s, seed, repile=True)),
    Policy("reference", "full permutation in RAM (reference)", Permutation),
    Policy("reference-2", "2nd reference, other permutations (null check)", lambda s, seed: Permutation(s, seed, stream=1)),
)
