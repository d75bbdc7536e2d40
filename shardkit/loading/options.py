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
from shardkit.option_fields import Door, check_bools, check_choices, meta, specs
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
    """How a :class:`shardkit.Loader` reads; :func:`shardkit.loader` takes each option as a keyword.

    Args:
        batch_size: yield batches of this many samples (per rank) instead of single samples:
            ``{"__key__": [keys], field: numpy array or list}``.
        shuffle: permute pile order and in-pile order every epoch; False reads manifest order.
        seed: the order is a pure function of (seed, epoch, dataset).
        decode: True (images -> HWC uint8 numpy), ``"pil"``, False (raw bytes), or a
            :class:`~shardkit.Codecs` registry.
        map: a function applied to each decoded sample.
        num_workers: worker processes for decode, map and collation (0 = in this process);
            the output is identical, in order, whatever the count.
        rank, world_size: default to ``RANK``/``WORLD_SIZE``, else torch.distributed, else 0/1.
        drop_last: True: each rank reads ``N // world_size`` samples and only full batches.
            False: the order is padded by wrapping round to its start to a multiple of
            ``world_size``, and the last batch may be partial (the same size on every rank).
        prefetch: piles read ahead in the background (memory: ``1 + prefetch`` piles, or
            ``mix + 1 + prefetch``). None: 1, or for small piles in an object store as many as
            keep ``remote_concurrency`` requests busy within 256 MiB (piles under 16 MiB are one
            request each, so 8 of them at once by default), read at once.
        on_error: ``"raise"``, or ``"skip"``/``"warn"`` (also logs each) a pile that cannot be
            read, or a sample that is malformed or fails to decode or map; counts in
            ``loader.stats``. Batched, a skip never changes how many batches a rank yields:
            each batch keeps its slot, so a failed sample makes its batch smaller, and a batch
            whose samples all failed is yielded empty: ``collate([])``, by default
            ``{"__key__": []}`` (check ``len(batch["__key__"])``; under DDP every rank must still
            take its step, e.g. with a loss weighted zero). Unbatched, a failed sample is not
            yielded, so a rank may yield fewer than ``len(loader)`` samples: batch here, not
            after the loader, when ranks must stay in step.
        mix: spread each pile over ``mix + 1`` piles' worth of positions, reading from ``mix +
            1`` piles at once (memory ``mix + 1 + prefetch`` piles). The first epoch stays
            exactly uniform; in later epochs pile-mates share a batch again about ``mix ** 2``
            times less often (while that stays well below the number of piles).
        max_pile_bytes: refuse, before reading, a pile larger than this (``"2GiB"``).
        verify: check each pile's checksum against the manifest.
        allow_pickle: decode ``.pyd``/``.pickle`` fields (runs code from the data).
        views: with ``decode=False``, yield raw fields as read-only ``memoryview`` slices of the
            pile in memory instead of ``bytes`` copies (faster for large fields). A view keeps
            its whole pile in memory while it is held: copy (``bytes(view)``) what you keep. Not
            with ``num_workers`` > 0 when batching or mapping (the workers cannot be sent views).
        collate: ``fn(list of samples) -> batch`` instead of the default.
        remote_concurrency: requests in flight at once when piles are read from an object
            store (``s3://``...), shared by the piles read at once; a pile is one request, or
            ranges of at least 8 MiB when it is larger. Each pile's checksum is checked, and a pile whose
            bytes come back wrong is read again before it is an error.
        cache_dir: a local directory where copies of remote piles are kept, so later epochs
            read them from disk; processes and ranks on one machine can share it. Copies are
            checked against the manifest on every read; the source is never touched.
        cache_limit: the most the cache holds (``"200GiB"``); least recently used copies are
            evicted first. A pile larger than the limit is read without caching. Default: no limit.
        storage_options: options for the object store, given to fsspec as they are
            (``{"endpoint_url": ..., "anon": True}``); otherwise its usual environment applies
            (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``...). Never logged or shown.

        worker: ``(index, count)``: the share of the rank this loader reads when it runs inside a
            ``torch.utils.data.DataLoader`` worker (set by :mod:`shardkit.torch`).

    Example:
        opts = LoaderOptions(batch_size=32, seed=1)
        loader = Loader("data/", opts)
        assert loader.options.batch_size == 32
    """

    batch_size: int | None = field(
        default=None,
        metadata=meta(help="yield batches of this many samples per rank (default: single samples)", metavar="B", group="order"),
    )
    shuffle: bool = field(
        default=True, metadata=meta(help="permute pile order and in-pile order every epoch (off: manifest order)", group="order")
    )
    seed: int = field(default=0, metadata=meta(help="the order is a pure function of seed, epoch and dataset", metavar="S", group="order"))
    decode: bool | str | Codecs = field(
        default=True, metadata=meta(help="True (images as numpy arrays), 'pil', False (raw bytes) or a Codecs registry", group="decode")
    )
    map: Callable[[dict[str, Any]], Any] | None = field(
        default=None, metadata=meta(help="a function applied to each decoded sample", group="decode")
    )
    num_workers: int = field(
        default=0,
        metadata=meta(help="worker processes for decode, map and collation (0: in this process)", metavar="N", group="throughput"),
    )
    rank: int | None = field(
        default=None, metadata=meta(help="this process's rank (default: RANK, else torch.distributed, else 0)", metavar="R", group="ranks")
    )
    world_size: int | None = field(
        default=None, metadata=meta(help="ranks reading (default: WORLD_SIZE, else torch.distributed, else 1)", metavar="W", group="ranks")
    )
    drop_last: bool = field(
        default=True,
        metadata=meta(
            help="drop the end of the order that does not fill a batch on every rank (off: pad by wrapping round)", group="order"
        ),
    )
    prefetch: int | None = field(
        default=None,
        metadata=meta(
            help="piles read ahead in the background (default: 1; 2 for local compressed piles; more for small piles in an object store)",
            metavar="P",
            group="throughput",
        ),
    )
    on_error: str = field(
        default="raise",
        metadata=meta(
            help="what a pile that cannot be read or a sample that fails does: raise, skip or warn (skip and log)",
            choices=ON_ERROR,
            group="checks",
        ),
    )
    mix: int = field(
        default=1,
        metadata=meta(
            help="move each sample by up to K piles, drawing from K + 1 piles at once (1: one pile after another); "
            "the first epoch stays uniform, later ones repeat less",
            metavar="K",
            group="order",
        ),
    )
    max_pile_bytes: int | str | None = field(
        default=None, metadata=meta(help="refuse, before reading, a pile larger than SIZE (e.g. 2GiB)", metavar="SIZE", group="checks")
    )
    verify: bool = field(default=True, metadata=meta(help="check each pile's checksum against the manifest", group="checks"))
    views: bool = field(
        default=False,
        metadata=meta(
            help="with decode=False, raw fields as read-only memoryviews into the pile in memory instead of copies", group="decode"
        ),
    )
    allow_pickle: bool = field(
        default=False, metadata=meta(help="decode .pyd and .pickle fields (runs code from the data)", group="decode")
    )
    collate: Callable[[list[dict[str, Any]]], Any] | None = field(
        default=None, metadata=meta(help="fn(list of samples) -> batch instead of the default", group="decode")
    )
    worker: tuple[int, int] = field(
        default=(0, 1), metadata=meta(help="(index, count): the share of the rank read inside a DataLoader worker", group="ranks")
    )

    remote_concurrency: int = field(
        default=DEFAULT_CONCURRENCY,
        metadata=meta(help="requests at once when reading piles from an object store", metavar="N", group="storage"),
    )
    cache_dir: str | None = field(
        default=None, metadata=meta(help="keep local copies of remote piles here (shared by processes)", metavar="DIR", group="storage")
    )
    cache_limit: int | str | None = field(
        default=None,
        metadata=meta(help="the most the cache holds (e.g. 200GiB); least recently used copies go first", metavar="SIZE", group="storage"),
    )
    storage_options: Mapping[str, Any] | None = field(
        default=None,
        repr=False,  # may hold secrets
        metadata=meta(
            help="options for the object store (endpoint_url, key, secret, anon...), given to fsspec as they are", group="storage"
        ),
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
        if self.views and self.decode is not False:
            raise ConfigError(
                f"views: True hands out raw fields as memoryviews, which needs decode=False; with decode={self.decode!r} every "
                "field is decoded into an object of its own: pass decode=False, or leave views off"
            )
        if self.views and self.num_workers and (self.batch_size is not None or self.map is not None):
            raise ConfigError(
                f"views: True with num_workers={self.num_workers}: the views are of piles held in this process, and the worker "
                "processes that batch or map the samples cannot be sent them; set num_workers=0 (raw fields need little work) or views=False"
            )
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


# the loader (of one dataset, or of a blend) and the PyTorch dataset take every option as a keyword
# but the DataLoader worker's share, which shardkit.torch sets
LOADER, BLEND_LOADER, DATASET = (Door(LoaderOptions, exclude=("worker",)) for _ in range(3))


def resolve_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: the arguments, else ``RANK``/``WORLD_SIZE``, else torch.distributed.

    Raises:
        ConfigError: a world of several ranks with no rank found anywhere (every process would
            read rank 0's share), or a rank outside the world; each names where the value came from.
    """
    dist = distributed()
    world_from = "world_size"
    if world_size is None:
        env_world = _env("WORLD_SIZE")
        world_from = "WORLD_SIZE" if env_world else "torch.distributed" if dist else "the default"
        world_size = env_world or (dist.get_world_size() if dist else 1)
    rank_from = "rank"
    if rank is None:
        env_rank = _env("RANK")
        if env_rank is not None:
            rank, rank_from = env_rank, "RANK"
        elif dist is not None:
            rank, rank_from = dist.get_rank(), "torch.distributed"
        elif world_size > 1:
            raise ConfigError(
                f"world_size is {world_size} (from {world_from}) but no rank was given: every process would read rank 0's "
                "share. Pass rank=, set RANK (torchrun sets both), or make the loader once torch.distributed is initialized "
                "(under Lightning, in the DataModule's setup())"
            )
        else:
            rank = 0
    if not 0 <= rank < world_size:
        raise ConfigError(
            f"rank: {rank} (from {rank_from}) is not in a world of size {world_size} (from {world_from}): expected 0 to {world_size - 1}"
        )
    return rank, world_size


def distributed() -> Any:
    """``torch.distributed`` when it is initialized in this process, else None (torch is never
    imported just to ask)."""
    d = getattr(sys.modules.get("torch"), "distributed", None)
    return d if d is not None and d.is_available() and d.is_initialized() else None


def world_by_default(rank: int | None, world_size: int | None) -> bool:
    """Whether :func:`resolve_world` takes the world to be this one process for want of any other
    answer: no argument, no ``RANK``/``WORLD_SIZE``, torch.distributed not initialized (yet)."""
    return rank is None and world_size is None and _env("WORLD_SIZE") is None and _env("RANK") is None and distributed() is None


def check_world_kept(by_default: bool) -> None:
    """Refuse to read when the world was taken as one process by default (``by_default``, see
    :func:`world_by_default`) and torch.distributed has been initialized with several since: every
    rank would read the whole dataset, as rank 0 of 1.

    Raises:
        ConfigError: saying so, and what to do.
    """
    d = distributed() if by_default else None
    if d is not None and d.get_world_size() > 1:
        raise ConfigError(
            f"this loader was made before torch.distributed.init_process_group, so it took the world to be one process "
            f"(rank 0 of 1): each of the {d.get_world_size()} ranks would read the whole dataset. Make it after "
            "init_process_group (under Lightning, in the DataModule's setup()), or pass rank= and world_size="
        )


def _env(name: str) -> int | None:
    text = os.environ.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name}: the environment variable is {text!r}, expected an integer") from None
