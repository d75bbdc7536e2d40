"""The eager pass 2: turn existing WebDataset shards into shards in uniformly random order.

Pass 1 re-piles the inputs into M temporary piles with :func:`shardkit.pile` (uniform,
data-blind routing, ``workers`` processes) in a hidden directory inside the output. Pass 2
visits the piles in a seeded random order (the loader's epoch 0), maps one pile at a time into
memory, permutes its samples and appends their raw tar bytes (nothing is decoded or re-encoded)
to fixed-size output shards ``shard-000000.tar ...`` with ``os.writev``
(:class:`~shardkit.shard_roller.ShardRoller`). Reading the output shards
in order with any WebDataset reader gives a uniformly random permutation of the input.

Memory is about one pile. Disk is about one copy of the data plus one pile: each temporary pile
is deleted once it has been written out. The output shards are staged in the hidden directory
too and moved into place at the end, with ``shardkit.json`` last; a failure or Ctrl-C removes
the hidden directory and leaves any dataset already in the output untouched.

    shardkit.shuffle("raw/shard-{000000..000099}.tar", "shuffled/", piles=64, maxcount=10_000)
    ds = webdataset.WebDataset("shuffled/shard-{000000..000099}.tar")  # already shuffled
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardkit import _util, storage
from shardkit._util import check_int, check_most, format_size, parse_size
from shardkit.dataset import layout
from shardkit.dataset.install import free_set, remove_strays
from shardkit.dataset.transaction import Dataset
from shardkit.errors import ConfigError, ManifestError
from shardkit.loading import plan
from shardkit.loading.pile import fetch
from shardkit.manifest import Manifest, PileInfo
from shardkit.option_fields import Door, check_bools, check_choices, meta, specs
from shardkit.piles import readers
from shardkit.piles.options import EXECUTORS, KEY_PREFIX, MAX_PILES, MIN_PILE_BYTES, PileOptions, check_ray_address
from shardkit.piles.pack import Pack
from shardkit.shard_roller import ShardRoller
from shardkit.tar import index, scan
from shardkit.tar.compression import check_compression, check_level

log = logging.getLogger(__name__)

TEMP_PREFIX = layout.SHUFFLE_PREFIX
DEFAULT_MEMORY = "1GiB"
# webdataset.ShardWriter's defaults, used when neither limit is given
DEFAULT_MAXCOUNT = 100_000
DEFAULT_MAXSIZE = 3_000_000_000
_SHARD = layout.SHARD_FILE


@dataclass(frozen=True, kw_only=True)
class ShuffleOptions:
    """How :func:`shuffle` works; shared by the Python API, ``shardkit shuffle`` and YAML jobs.

    Args:
        piles: temporary piles M. When None, M = ceil(2 * input bytes / memory), so the
            expected pile is half the memory budget.
        memory: the most pile bytes pass 2 may hold (int or ``"4GiB"``); piles over it are split
            into random sub-piles, which keeps the result uniform. Default 1 GiB when ``piles``
            is None, else no limit.
        maxcount: samples per output shard at most.
        maxsize: bytes per output shard at most (the trailer included); a single sample larger
            than this gets a shard of its own. With neither limit given, webdataset.ShardWriter's
            defaults apply: 100,000 samples and 3 GB.
        seed: seeds pass 1's router, the pile order and each pile's permutation.
        workers: processes for pass 1 (the output is identical for any number).
        executor, ray_address: where pass 1's input units and merge run (see
            :class:`~shardkit.PileOptions`); pass 2 runs here.
        overwrite: replace a dataset already in the output directory.
        key_prefix: ``"auto"`` (default) prefixes each key with its input shard's name when two
            shards start with the same key (keys that restart at ``000000``), ``"unit"`` always,
            ``"none"`` never (see :func:`shardkit.pile`); keys must be unique.
        compression, compression_level: ``"zstd"``, ``"gzip"`` or ``"lz4"`` writes each output shard
            compressed whole (``shard-000000.tar.zst``), as :class:`~shardkit.PileOptions` does
            for piles; ``maxsize`` still counts the tar's bytes. The temporary piles stay plain.
        index: write the output's random-access index (``shardkit.gNNNNNN.idx``) from the
            staged shards as the manifest goes in, as :class:`~shardkit.PileOptions` does for
            piles: the loader then starts its first shard by ranges. The shards are the same
            bytes either way.

    Example:
        opts = ShuffleOptions(piles=64, maxcount=10_000, seed=1)
        shuffle(urls, "out/", options=opts)   # or the same as keywords: piles=64, ...
    """

    piles: int | None = field(
        default=None,
        metadata=meta(
            help="temporary piles M (default: 2 x input bytes / memory, so a pile is half the budget)",
            metavar="M",
            yaml="output",
            group="piles",
        ),
    )
    memory: int | str | None = field(
        default=None,
        metadata=meta(
            help="most bytes of one pile in RAM; larger piles are split (default 1GiB without piles)",
            metavar="SIZE",
            yaml="output",
            group="piles",
        ),
    )
    maxcount: int | None = field(
        default=None, metadata=meta(help="samples per output shard at most", metavar="N", yaml="output", group="shards")
    )
    maxsize: int | str | None = field(
        default=None,
        metadata=meta(
            help="bytes per output shard at most, e.g. 1GB (with neither limit: 100000 samples and 3 GB)",
            metavar="SIZE",
            yaml="output",
            group="shards",
        ),
    )
    seed: int = field(
        default=0, metadata=meta(help="same inputs and seed give byte-identical output", metavar="S", yaml="output", group="piles")
    )
    workers: int = field(
        default=1,
        metadata=meta(
            help="processes for the re-piling pass; the output is identical for any number", metavar="N", yaml="job", group="executor"
        ),
    )
    overwrite: bool = field(
        default=False, metadata=meta(help="replace a dataset already in the output directory", yaml="output", group="output")
    )
    # the same option as pass 1's, read by it
    key_prefix: str = field(
        default="auto", metadata=meta(help=specs(PileOptions)["key_prefix"].help or "", choices=KEY_PREFIX, yaml="job", group="samples")
    )
    storage_options: Mapping[str, Any] | None = field(
        default=None, repr=False, metadata=meta(help=specs(PileOptions)["storage_options"].help or "", yaml="job", group="storage")
    )
    # pass 1's executor, read by it
    executor: str = field(
        default="local", metadata=meta(help=specs(PileOptions)["executor"].help or "", choices=EXECUTORS, yaml="job", group="executor")
    )
    ray_address: str | None = field(
        default=None, metadata=meta(help=specs(PileOptions)["ray_address"].help or "", metavar="ADDR", yaml="job", group="executor")
    )
    compression: str | None = field(
        default=None,
        metadata=meta(
            help="compress each output shard whole: zstd (shard-000000.tar.zst), gzip (.tar.gz) or lz4 (.tar.lz4); default: plain tar",
            metavar="CODEC",
            yaml="output",
            group="compression",
        ),
    )
    compression_level: int | None = field(
        default=None,
        metadata=meta(help=specs(PileOptions)["compression_level"].help or "", metavar="L", yaml="output", group="compression"),
    )

    index: bool = field(default=False, metadata=meta(help=specs(PileOptions)["index"].help or "", yaml="output", group="output"))

    def __post_init__(self) -> None:
        storage.check_storage_options(self.storage_options)
        check_int("piles", self.piles, low=1, none=True)
        check_most("piles", self.piles, MAX_PILES, "each is a file")
        check_int("workers", self.workers, low=1)
        check_int("seed", self.seed, low=0)
        check_int("maxcount", self.maxcount, low=1, none=True)
        check_choices(self)
        check_bools(self)
        check_ray_address(self.ray_address, self.executor)
        check_compression(self.compression)
        check_level(self.compression, self.compression_level)
        for name in ("memory", "maxsize"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, parse_size(value, what=name))
        # memory becomes pass 1's max_pile_bytes: checked here, so the error names the option given
        if self.memory is not None and self.memory < MIN_PILE_BYTES:  # type: ignore[operator]
            raise ConfigError(
                f"memory: expected at least {MIN_PILE_BYTES} bytes (a member header and the end-of-archive marker), got {self.memory}"
            )
        if self.maxsize is not None and self.maxsize < 3 * scan.BLOCK:  # type: ignore[operator]
            raise ConfigError(f"maxsize: expected at least {3 * scan.BLOCK} bytes (one header, one block, the trailer), got {self.maxsize}")

    @property
    def level(self) -> int | None:
        """The compression level in effect: ``compression_level``, or the codec's default."""
        return check_level(self.compression, self.compression_level)

    def limits(self) -> tuple[int | None, int | None]:
        """(maxcount, maxsize) in effect."""
        if self.maxcount is None and self.maxsize is None:
            return DEFAULT_MAXCOUNT, DEFAULT_MAXSIZE
        return self.maxcount, self.maxsize  # type: ignore[return-value]

    def pass1(self, input_bytes: int) -> tuple[int, int | None]:
        """(piles, max_pile_bytes) for pass 1, given the inputs' total size."""
        memory = self.memory if self.memory is not None or self.piles is not None else parse_size(DEFAULT_MEMORY)
        piles = self.piles or max(1, math.ceil(2 * input_bytes / memory))  # type: ignore[operator]
        return piles, memory  # type: ignore[return-value]


# shuffle takes every option as a keyword
SHUFFLE = Door(ShuffleOptions)


def _pass1(urls: list[str], directory: str, *, piles: int, max_pile_bytes: int | None, opts: ShuffleOptions, quiet: bool) -> Manifest:
    """Re-pile the inputs into ``directory`` (a throwaway shardkit dataset)."""
    from shardkit.piles.preprocess import pile

    # the write buffer counts against the memory budget too: a quarter of it, 1-64 MiB
    buffer = 64 << 20 if max_pile_bytes is None else min(64 << 20, max(1 << 20, max_pile_bytes // 4))
    options = PileOptions(
        piles=piles,
        seed=opts.seed,
        max_pile_bytes=max_pile_bytes,
        buffer_size=buffer,
        workers=opts.workers,
        key_prefix=opts.key_prefix,
        storage_options=opts.storage_options,
        executor=opts.executor,
        ray_address=opts.ray_address,
    )
    with storage.throwaway_writes():  # pass 2 reads these piles back and removes them: a crash leaves them staged, unnamed
        return pile(urls, directory, options=options, quiet=quiet)


def _pass2(piles_dir: str, piles: Manifest, staging: str, opts: ShuffleOptions, quiet: bool) -> list[PileInfo]:
    """Write the piles' samples, each pile permuted, in a random pile order, into output shards."""
    maxcount, maxsize = opts.limits()
    roller = ShardRoller(staging, maxcount=maxcount, maxsize=maxsize, pack=Pack.of(opts))
    try:
        with _util.bar(total=piles.samples, desc="pass 2", unit="sample", quiet=quiet) as progress:
            # the order is the loader's epoch 0 over these piles: one definition of "shuffled"
            order = plan.EpochOrder([p.samples for p in piles.piles], seed=opts.seed, epoch=0)
            for index in order.pile_order.tolist():
                info = piles.piles[index]
                url = os.path.join(piles_dir, info.name)
                _copy_pile(url, info, order.in_pile(index), roller)
                storage.remove(url)  # disk stays at about one copy of the data
                progress.update(info.samples)
        return roller.close()
    finally:
        roller.abort()


def _copy_pile(url: str, info: PileInfo, permutation: np.ndarray, roller: ShardRoller) -> None:
    """Append the samples of one pile to ``roller`` in ``permutation``'s order.

    The pile is memory-mapped (checked against its manifest entry first) and unmapped as soon
    as it is written out, so its pages leave this process's memory before the next pile's come in.
    """
    buf = fetch(url, expected=info).buf
    try:
        layout = index.index(buf, url, checked=True)  # fetch checked its checksum
        starts = layout.samples()
        bounds = layout.sample_bounds(starts)
        if len(bounds) - 1 != info.samples:
            raise ManifestError(f"{url}: holds {len(bounds) - 1} samples, the manifest says {info.samples}")
        keys = layout.sample_keys(starts[:-1])[permutation]
        roller.extend(buf, bounds[:-1][permutation], bounds[1:][permutation], keys)
    finally:
        storage.unmap(buf)


@SHUFFLE
def shuffle(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    options: ShuffleOptions | None = None,
    quiet: bool = False,
    **keywords: Any,
) -> Manifest:
    """Shuffle existing WebDataset shards into ``out/shard-000000.tar ...`` plus ``shardkit.json``.

    Args:
        inputs: shard URLs, globs or brace patterns (``raw/shard-{000000..000099}.tar``); read in
            order, ``.tar.zst`` and ``.tar.gz`` accepted.
        out: output directory; it holds only the shards and the manifest when done.
        options: a :class:`ShuffleOptions`, instead of the keyword options below (not both).
        quiet: no progress bars.

    Returns:
        The output's manifest: its piles are the output shards, in reading order, and
        ``extra["kind"] == "shuffled"``.

    Raises:
        ConfigError, DatasetExistsError, DatasetNotFoundError, CorruptShardError, SampleError.
    """
    opts = SHUFFLE.options(options, keywords)
    _util.check_bool("quiet", quiet)
    storage.use([*_util.check_paths("inputs", inputs), _util.check_path("out", out)], opts.storage_options)
    readers.refuse_datasets(_util.check_paths("inputs", inputs))
    urls = storage.expand(_util.check_paths("inputs", inputs), once=True)
    readers.refuse_own_files(urls, out, "shuffle")
    for url in urls:  # files of a format pile reads by its suffix go through its reader in pass 1
        if readers.detect(url) is None and (why := readers.unknown_file(url, "shuffle")) is not None:
            raise ConfigError(why)
    with Dataset(out).transaction(overwrite=opts.overwrite, files=_SHARD) as txn:
        m, limit = opts.pass1(sum(storage.size(u) for u in urls))
        log.info("shuffling %d input shards through %d piles (max %s each)", len(urls), m, format_size(limit) if limit else "unlimited")
        temp = txn.staging(TEMP_PREFIX)
        piles_dir, staging = os.path.join(temp, "piles"), os.path.join(temp, "shards")
        storage.makedirs(staging)
        piled = _pass1(urls, piles_dir, piles=m, max_pile_bytes=limit, opts=opts, quiet=quiet)
        shards = _pass2(piles_dir, piled, staging, opts, quiet)
        maxcount_, maxsize_ = opts.limits()
        extra = {"kind": "shuffled", "piles": m, "split_piles": piled.split_piles, "maxcount": maxcount_, "maxsize": maxsize_}
        if "key_prefix" in piled.extra:  # pass 1 prefixed every key with its shard's name: say so
            extra["key_prefix"] = piled.extra["key_prefix"]
        remove_strays(txn.path, _SHARD)
        names = free_set(txn.path, [shard.name for shard in shards])  # one brace pattern reads them, overwrite or not
        staged = [os.path.join(staging, shard.name) for shard in shards]
        shards = [dataclasses.replace(shard, name=name) for shard, name in zip(shards, names, strict=True)]
        result = Manifest(piles=tuple(shards), seed=opts.seed, fields=piled.fields, created_by=piled.created_by, extra=extra)
        result = txn.commit(staged, result, index=opts.index)
    log.info("wrote %d samples into %d shards in %s", result.samples, len(shards), out)
    return result
