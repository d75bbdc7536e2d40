"""The eager pass 2: turn existing WebDataset shards into shards in uniformly random order.

Pass 1 re-piles the inputs into M temporary piles with :func:`shardkit.pile` (uniform,
data-blind routing, ``workers`` processes) in a hidden directory inside the output. Pass 2 visits the piles in a seeded random order, loads one pile
at a time into memory, permutes its samples and appends their raw tar bytes (nothing is decoded
or re-encoded) to fixed-size output shards ``shard-000000.tar ...``. Reading the output shards
in order with any WebDataset reader gives a uniformly random permutation of the input.

Memory is about one pile. Disk is about one copy of the data plus one pile: each temporary pile
is deleted once it has been written out. The output shards are staged in the hidden directory
too and moved into place at the end, with ``shardkit.json`` last; a failure or Ctrl-C removes
the hidden directory and leaves any dataset already in the output untouched.

    shardkit.shuffle("raw/shard-{000000..000099}.tar", "shuffled/", piles=64, maxcount=10_000)
    ds = webdataset.WebDataset("shuffled/shard-{000000..000099}.tar")  # already shuffled
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

from shardkit import _progress, _tar, manifest, plan, storage
from shardkit._sizes import format_size, parse_size
from shardkit.errors import ConfigError, DatasetExistsError
from shardkit.manifest import Manifest, PileInfo
from shardkit.reader import read_pile

log = logging.getLogger(__name__)

TEMP_PREFIX = ".shardkit-shuffle-"
DEFAULT_MEMORY = "1GiB"
# webdataset.ShardWriter's defaults, used when neither limit is given
DEFAULT_MAXCOUNT = 100_000
DEFAULT_MAXSIZE = 3_000_000_000
_SHARD = re.compile(r"^shard-\d{6,}\.tar$")


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.tar"


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}: expected a positive integer, got {value!r}")


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
        overwrite: replace a dataset already in the output directory.
        key_prefix: ``"unit"`` prefixes each key with its input shard's name, for shards whose
            keys restart at ``000000`` (see :func:`shardkit.pile`); keys must be unique.

        opts = ShuffleOptions(piles=64, maxcount=10_000, seed=1)
        shuffle(urls, "out/", **vars(opts))
    """

    piles: int | None = None
    memory: int | str | None = None
    maxcount: int | None = None
    maxsize: int | str | None = None
    seed: int = 0
    workers: int = 1
    overwrite: bool = False
    key_prefix: str = "none"

    def __post_init__(self) -> None:
        if self.piles is not None:
            _positive_int("piles", self.piles)
        _positive_int("workers", self.workers)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed: expected a non-negative integer, got {self.seed!r}")
        if self.maxcount is not None:
            _positive_int("maxcount", self.maxcount)
        if self.key_prefix not in ("none", "unit"):
            raise ConfigError(f"key_prefix: expected 'none' or 'unit', got {self.key_prefix!r}")
        for name in ("memory", "maxsize"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, parse_size(value, what=name))
        if self.maxsize is not None and self.maxsize < 3 * _tar.BLOCK:  # type: ignore[operator]
            raise ConfigError(f"maxsize: expected at least {3 * _tar.BLOCK} bytes (one header, one block, the trailer), got {self.maxsize}")

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


class ShardRoller:
    """Append raw sample bytes to ``shard-000000.tar, ...``, starting a new shard at the limits.

    Each shard is closed with an end-of-archive trailer; its size, sample count and checksum
    are recorded as it is written.

        roller = ShardRoller("staging/", maxcount=1000, maxsize=None)
        roller.add(sample_bytes)
        infos = roller.close()
    """

    def __init__(self, directory: str, *, maxcount: int | None, maxsize: int | None) -> None:
        self.directory = directory
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.shards: list[PileInfo] = []
        self._file: IO[bytes] | None = None
        self._count = 0
        self._bytes = 0
        self._crc = 0

    def _full(self, size: int) -> bool:
        if self.maxcount is not None and self._count >= self.maxcount:
            return True
        return self.maxsize is not None and self._bytes + size + len(_tar.TRAILER) > self.maxsize

    def add(self, data: bytes | memoryview) -> None:
        """Write one sample's members (headers included) to the current shard."""
        if self._file is not None and self._full(len(data)):
            self._finish()
        if self._file is None:
            self._file = open(os.path.join(self.directory, shard_name(len(self.shards))), "wb")  # noqa: SIM115
            if self.maxsize is not None and len(data) + len(_tar.TRAILER) > self.maxsize:
                log.warning(
                    "%s: one sample of %d bytes is over maxsize=%d: it gets a shard of its own",
                    shard_name(len(self.shards)),
                    len(data),
                    self.maxsize,
                )
        self._file.write(data)
        self._crc = manifest.checksum(data, self._crc)
        self._count += 1
        self._bytes += len(data)

    def _finish(self) -> None:
        assert self._file is not None
        self._file.write(_tar.TRAILER)
        self._file.close()
        self._file = None
        crc = manifest.checksum(_tar.TRAILER, self._crc)
        name = shard_name(len(self.shards))
        self.shards.append(
            PileInfo(name=name, samples=self._count, bytes=self._bytes + len(_tar.TRAILER), checksum=manifest.format_checksum(crc))
        )
        self._count = self._bytes = self._crc = 0

    def close(self) -> list[PileInfo]:
        """Finish the last shard (an empty input still gives one valid, empty shard)."""
        if self._file is None and not self.shards:
            self._file = open(os.path.join(self.directory, shard_name(0)), "wb")  # noqa: SIM115
        if self._file is not None:
            self._finish()
        return self.shards

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _check_output(out: str, overwrite: bool) -> str:
    if storage.local_path(out) is None:
        raise ConfigError(f"{out}: shuffling into remote storage is not supported yet; write locally and upload")
    out = storage.local_path(out) or out
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"{out}: output exists and is not a directory")
    stale = [n for n in (os.listdir(out) if os.path.isdir(out) else []) if _SHARD.match(n)]
    if manifest.is_dataset(out) and not overwrite:
        raise DatasetExistsError(
            f"{out}: already holds a shardkit dataset ({manifest.MANIFEST}); pass overwrite=True (--overwrite) to replace it"
        )
    if stale and not overwrite:
        raise DatasetExistsError(
            f"{out}: holds {stale[0]} and other shard files; use an empty directory or pass overwrite=True (--overwrite)"
        )
    os.makedirs(out, exist_ok=True)
    return out


def _pass1(urls: list[str], directory: str, *, piles: int, max_pile_bytes: int | None, opts: ShuffleOptions, quiet: bool) -> Manifest:
    """Re-pile the inputs into ``directory`` (a throwaway shardkit dataset)."""
    from shardkit.preprocess import pile

    # the write buffer counts against the memory budget too: a quarter of it, 1-64 MiB
    buffer = 64 << 20 if max_pile_bytes is None else min(64 << 20, max(1 << 20, max_pile_bytes // 4))
    return pile(
        urls,
        directory,
        piles=piles,
        workers=opts.workers,
        seed=opts.seed,
        max_pile_bytes=max_pile_bytes,
        buffer_size=buffer,
        quiet=quiet,
        key_prefix=opts.key_prefix,
    )


def _pass2(piles_dir: str, piles: Manifest, staging: str, opts: ShuffleOptions, quiet: bool) -> list[PileInfo]:
    """Write the piles' samples, each pile permuted, in a random pile order, into output shards."""
    maxcount, maxsize = opts.limits()
    roller = ShardRoller(staging, maxcount=maxcount, maxsize=maxsize)
    try:
        with _progress.bar(total=piles.samples, desc="pass 2", unit="sample", quiet=quiet) as progress:
            # the order is the loader's epoch 0 over these piles: one definition of "shuffled"
            order = plan.EpochOrder([p.samples for p in piles.piles], seed=opts.seed, epoch=0)
            for index in order.pile_order.tolist():
                info = piles.piles[index]
                url = os.path.join(piles_dir, info.name)
                pile = read_pile(url, expected=info)
                spans = pile.raw_spans()
                view = memoryview(pile.buf)
                for i in order.in_pile(index).tolist():
                    roller.add(view[spans[i] : spans[i + 1]])
                del view, pile
                os.unlink(url)  # disk stays at about one copy of the data
                progress.update(info.samples)
        return roller.close()
    finally:
        roller.abort()


def _publish(out: str, staging: str, shards: list[PileInfo], result: Manifest) -> None:
    """Swap the staged shards in: the old dataset stops being one before any of its files go."""
    old = manifest.read(out).piles if manifest.is_dataset(out) else ()
    storage.remove(os.path.join(out, manifest.MANIFEST))
    for name in {p.name for p in old} | {n for n in os.listdir(out) if _SHARD.match(n)}:
        storage.remove(os.path.join(out, name))
    for info in shards:
        os.replace(os.path.join(staging, info.name), os.path.join(out, info.name))
    manifest.write(out, result)


def shuffle(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    piles: int | None = None,
    memory: int | str | None = None,
    maxcount: int | None = None,
    maxsize: int | str | None = None,
    seed: int = 0,
    workers: int = 1,
    overwrite: bool = False,
    quiet: bool = False,
    key_prefix: str = "none",
) -> Manifest:
    """Shuffle existing WebDataset shards into ``out/shard-000000.tar ...`` plus ``shardkit.json``.

    Args:
        inputs: shard URLs, globs or brace patterns (``raw/shard-{000000..000099}.tar``); read in
            order, ``.tar.gz`` accepted.
        out: output directory; it holds only the shards and the manifest when done.
        piles, memory, maxcount, maxsize, seed, workers, overwrite, key_prefix: see :class:`ShuffleOptions`.
        quiet: no progress bars.

    Returns:
        The output's manifest: its piles are the output shards, in reading order, and
        ``extra["kind"] == "shuffled"``.

    Raises:
        ConfigError, DatasetExistsError, DatasetNotFoundError, CorruptShardError, SampleError.
    """
    opts = ShuffleOptions(
        piles=piles,
        memory=memory,
        maxcount=maxcount,
        maxsize=maxsize,
        seed=seed,
        workers=workers,
        overwrite=overwrite,
        key_prefix=key_prefix,
    )
    urls = storage.expand(inputs)
    out = _check_output(os.fspath(out), overwrite)
    m, limit = opts.pass1(sum(storage.size(u) for u in urls))
    log.info("shuffling %d input shards through %d piles (max %s each)", len(urls), m, format_size(limit) if limit else "unlimited")
    temp = os.path.join(out, f"{TEMP_PREFIX}{uuid.uuid4().hex}")
    try:
        piles_dir, staging = os.path.join(temp, "piles"), os.path.join(temp, "shards")
        os.makedirs(staging)
        piled = _pass1(urls, piles_dir, piles=m, max_pile_bytes=limit, opts=opts, quiet=quiet)
        shards = _pass2(piles_dir, piled, staging, opts, quiet)
        maxcount_, maxsize_ = opts.limits()
        extra = {"kind": "shuffled", "piles": m, "split_piles": piled.split_piles, "maxcount": maxcount_, "maxsize": maxsize_}
        result = Manifest(piles=tuple(shards), seed=seed, fields=piled.fields, created_by=piled.created_by, extra=extra)
        _publish(out, staging, shards, result)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    log.info("wrote %d samples into %d shards in %s", result.samples, len(shards), out)
    return result
