"""Loader options: one frozen value, validated once, naming the option in every error.

opts = LoaderOptions(batch_size=64, mix=2, max_pile_bytes="2GiB")
opts.codecs()            # the decoder registry the options ask for
resolve_world(None, None)  # (rank, world_size) from RANK/WORLD_SIZE or torch.distributed
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardkit._util import check_int, check_most, parse_size, shown
from shardkit.codecs import Codecs
from shardkit.errors import ConfigError
from shardkit.option_fields import check_bools, check_choices, meta, specs
from shardkit.storage import check_storage_options
from shardkit.storage.remote import DEFAULT_CONCURRENCY

# what the loader does with a pile or sample it cannot read: listed once, read by validation and the CLI
ON_ERROR = ("raise", "skip", "warn")
# the most piles a loader mixes: each is held in memory while it is drawn from
MAX_MIX = 1024
# bounds far past any real job, so that no option sizes a loop or a pool beyond reason
MAX_THREADS = 1024
MAX_WORLD = 1 << 20


def _callable(name: str, value: Any) -> None:
    if value is not None and not callable(value):
        raise ConfigError(f"{name}: expected a function or None, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """How a :class:`shardkit.Loader` reads; see :func:`shardkit.loader` for each option.

    ``worker`` is ``(index, count)``: the share of the rank this loader reads when it runs
    inside a ``torch.utils.data.DataLoader`` worker (set by :mod:`shardkit.torch`).

    Example:
        opts = LoaderOptions(batch_size=32, seed=1)
        loader = Loader("data/", opts)
        assert loader.options.batch_size == 32
    """

    batch_size: int | None = field(
        default=None, metadata=meta(help="yield batches of this many samples per rank (default: single samples)", metavar="B")
    )
    shuffle: bool = field(default=True, metadata=meta(help="permute pile order and in-pile order every epoch (off: manifest order)"))
    seed: int = field(default=0, metadata=meta(help="the order is a pure function of seed, epoch and dataset", metavar="S"))
    decode: bool | str | Codecs = field(
        default=True, metadata=meta(help="True (images as numpy arrays), 'pil', False (raw bytes) or a Codecs registry")
    )
    map: Callable[[dict[str, Any]], Any] | None = field(default=None, metadata=meta(help="a function applied to each decoded sample"))
    num_workers: int = field(
        default=0, metadata=meta(help="worker processes for decode, map and collation (0: in this process)", metavar="N")
    )
    rank: int | None = field(
        default=None, metadata=meta(help="this process's rank (default: RANK, else torch.distributed, else 0)", metavar="R")
    )
    world_size: int | None = field(
        default=None, metadata=meta(help="ranks reading (default: WORLD_SIZE, else torch.distributed, else 1)", metavar="W")
    )
    drop_last: bool = field(
        default=True, metadata=meta(help="drop the end of the order that does not fill a batch on every rank (off: pad by wrapping round)")
    )
    prefetch: int | None = field(
        default=None,
        metadata=meta(help="piles read ahead in the background (default: 1, more for small piles in an object store)", metavar="P"),
    )
    on_error: str = field(
        default="raise",
        metadata=meta(
            help="what a pile that cannot be read or a sample that fails does: raise, skip or warn (skip and log)", choices=ON_ERROR
        ),
    )
    mix: int = field(
        default=1, metadata=meta(help="piles drawn from at once; the first epoch stays uniform, later ones repeat less", metavar="K")
    )
    max_pile_bytes: int | str | None = field(
        default=None, metadata=meta(help="refuse, before reading, a pile larger than SIZE (e.g. 2GiB)", metavar="SIZE")
    )
    verify: bool = field(default=True, metadata=meta(help="check each pile's checksum against the manifest"))
    views: bool = field(
        default=False,
        metadata=meta(help="with decode=False, raw fields as read-only memoryviews into the pile in memory instead of copies"),
    )
    allow_pickle: bool = field(default=False, metadata=meta(help="decode .pyd and .pickle fields (runs code from the data)"))
    collate: Callable[[list[dict[str, Any]]], Any] | None = field(
        default=None, metadata=meta(help="fn(list of samples) -> batch instead of the default")
    )
    worker: tuple[int, int] = field(
        default=(0, 1), metadata=meta(help="(index, count): the share of the rank read inside a DataLoader worker")
    )

    remote_concurrency: int = field(
        default=DEFAULT_CONCURRENCY, metadata=meta(help="requests at once when reading piles from an object store", metavar="N")
    )
    cache_dir: str | None = field(
        default=None, metadata=meta(help="keep local copies of remote piles here (shared by processes)", metavar="DIR")
    )
    cache_limit: int | str | None = field(
        default=None, metadata=meta(help="the most the cache holds (e.g. 200GiB); least recently used copies go first", metavar="SIZE")
    )
    storage_options: Mapping[str, Any] | None = field(
        default=None,
        repr=False,  # may hold secrets
        metadata=meta(help="options for the object store (endpoint_url, key, secret, anon...), given to fsspec as they are"),
    )

    def __post_init__(self) -> None:
        check_storage_options(self.storage_options)
        check_int("remote_concurrency", self.remote_concurrency, low=1)
        check_most("remote_concurrency", self.remote_concurrency, MAX_THREADS, "each is a request in flight")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise ConfigError(f"cache_dir: expected a local directory path or None, got {shown(self.cache_dir)}")
        if self.cache_limit is not None:
            if self.cache_dir is None:
                raise ConfigError("cache_limit: set cache_dir too: the limit is of the cache kept there")
            object.__setattr__(self, "cache_limit", parse_size(self.cache_limit, what="cache_limit"))
        check_int("batch_size", self.batch_size, low=1, none=True)
        check_int("seed", self.seed, low=0)
        check_int("num_workers", self.num_workers, low=0)
        check_most("num_workers", self.num_workers, MAX_THREADS, "each is a process")
        if self.prefetch is not None:
            check_int("prefetch", self.prefetch, low=0)
        check_most("prefetch", self.prefetch, MAX_THREADS, "each is held in memory")
        check_int("mix", self.mix, low=1)
        check_most("mix", self.mix, MAX_MIX, "each pile mixed is held in memory")
        check_int("world_size", self.world_size, low=1, none=True)
        check_most("world_size", self.world_size, MAX_WORLD, "ranks of one job")
        check_int("rank", self.rank, low=0, none=True)
        check_bools(self)
        _callable("map", self.map)
        _callable("collate", self.collate)
        if not (isinstance(self.decode, (bool, Codecs)) or self.decode in ("numpy", "pil")):
            raise ConfigError(f"decode: expected True, False, 'numpy', 'pil' or a Codecs object, got {self.decode!r}")
        check_choices(self)
        if self.mix > 1 and not self.shuffle:
            raise ConfigError(f"mix: mixing {self.mix} piles draws at random; it needs shuffle=True")
        if self.rank is not None and self.world_size is not None and self.rank >= self.world_size:
            raise ConfigError(f"rank: {self.rank} is not below world_size={self.world_size}")
        if self.max_pile_bytes is not None:
            object.__setattr__(self, "max_pile_bytes", parse_size(self.max_pile_bytes, what="max_pile_bytes"))
        worker = self.worker
        if not (isinstance(worker, tuple) and len(worker) == 2 and all(isinstance(n, int) and not isinstance(n, bool) for n in worker)):
            raise ConfigError(f"worker: expected (index, count), two integers, got {worker!r}")
        index, count = worker
        if not 0 <= index < count:
            raise ConfigError(f"worker: expected (index, count) with 0 <= index < count, got {self.worker!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> LoaderOptions:
        """Options from a mapping (a YAML job, a CLI); an unknown key is a ConfigError."""
        known = specs(cls).keys()
        if not isinstance(values, Mapping):
            raise ConfigError(f"options: expected a mapping of loader options, got {shown(values)}")
        for name in values:
            if name not in known:
                raise ConfigError(f"{name}: not a loader option (expected one of {', '.join(sorted(known))})")
        return cls(**values)

    def codecs(self) -> Codecs | None:
        """The decoder registry to use, or None when fields stay bytes."""
        if isinstance(self.decode, Codecs):
            return self.decode
        if self.decode is False:
            return None
        return Codecs(images="pil" if self.decode == "pil" else "numpy", allow_pickle=self.allow_pickle)


def resolve_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: the arguments, else ``RANK``/``WORLD_SIZE``, else torch.distributed."""
    dist = None
    torch = sys.modules.get("torch")  # never import torch just to ask
    if torch is not None and getattr(torch, "distributed", None) is not None:
        d = torch.distributed
        if d.is_available() and d.is_initialized():
            dist = d
    if world_size is None:
        world_size = _env("WORLD_SIZE") or (dist.get_world_size() if dist else 1)
    if rank is None:
        env_rank = _env("RANK")
        rank = env_rank if env_rank is not None else (dist.get_rank() if dist else 0)
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank: {rank} is not in a world of size {world_size}")
    return rank, world_size


def _env(name: str) -> int | None:
    text = os.environ.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name}: the environment variable is {text!r}, expected an integer") from None
