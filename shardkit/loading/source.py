"""Resolve what a loader reads into piles: a shardkit dataset directory or any WebDataset tars.

A dataset directory is described by its manifest (names, counts, sizes, checksums). Plain tar
shards (a list, a glob or a brace pattern) are walked once to count their samples; the counts
are cached per process by (URL, size, version: a local file's modification time), so a second loader starts at once.
Each plain shard is read as one pile, so its samples stay together in the order: the loader
says so once, with the command that makes piles. A plain shard is also checked for a key that
names two samples (its members are not adjacent), which a pile cannot hold.

    src = resolve("data/")                       # or resolve("shards/train-{000..099}.tar")
    src.counts                                    # samples per pile, in order
    pile = src.open(3, src.fetch(3, max_bytes=2**31, verify=True))
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from shardkit import manifest, storage
from shardkit._util import check_paths
from shardkit.dataset import layout
from shardkit.dataset.transaction import Dataset
from shardkit.errors import ConfigError, CorruptShardError, DatasetNotFoundError, ShardkitError, StorageError
from shardkit.loading import elastic
from shardkit.loading.elastic import Phase, Range
from shardkit.loading.pile import Fetched, fetch, fetch_segments, open_pile
from shardkit.manifest import PileInfo
from shardkit.tar import compression
from shardkit.tar.shard import Shard, read_shard

SourceLike = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

log = logging.getLogger(__name__)

_SHARD_SUFFIXES = compression.SHARD_SUFFIXES

_counts_cache: dict[tuple[str, int, str], int] = {}
_cache_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Pile:
    """One pile (or tar shard): where it is, how many samples it holds, its manifest entry."""

    url: str
    samples: int
    info: PileInfo | None = None
    # the URLs of its segment files, for a pile that is several (see shardkit.manifest.Segment)
    segments: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Source:
    """The piles a loader reads, in manifest (or listing) order, and a fingerprint of them."""

    name: str
    piles: tuple[Pile, ...]
    # the manifest's generation (None: plain tar shards, which have none)
    generation: int | None = None

    @property
    def counts(self) -> list[int]:
        return [p.samples for p in self.piles]

    @property
    def samples(self) -> int:
        return sum(p.samples for p in self.piles)

    def rest(self, done: Sequence[Phase], *, world: int, batch_size: int | None, drop_last: bool) -> list[Range]:
        """The global ranges of an epoch that ranks of ``world`` and ``batch_size`` split after the
        phases ``done`` (see :mod:`shardkit.loading.elastic`)."""
        return elastic.remaining(self.samples, done, drop_last=drop_last)

    def fingerprint(self) -> str:
        """Changes whenever a pile is added, removed, renamed, resized or rewritten."""
        doc = [
            [os.path.basename(p.url), p.samples, p.info.bytes if p.info else None, p.info.checksum if p.info else None] for p in self.piles
        ]
        return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:16]

    def fetch(
        self,
        index: int,
        *,
        max_bytes: int | None = None,
        verify: bool = True,
        reads: storage.RemoteReads | None = None,
        scratch: storage.Scratch | None = None,
    ) -> Fetched:
        """Pile ``index``'s checked bytes and the vectorized half of its index (see
        :func:`shardkit.loading.pile.fetch`): the work a background thread can do without the GIL."""
        pile = self.piles[index]
        try:
            if pile.segments is not None and pile.info is not None:
                return fetch_segments(pile.url, pile.segments, expected=pile.info, max_bytes=max_bytes, verify=verify, reads=reads)
            return fetch(pile.url, expected=pile.info, max_bytes=max_bytes, verify=verify, reads=reads, scratch=scratch)
        except (DatasetNotFoundError, CorruptShardError) as e:
            gone = self.gone(pile.info.parts if pile.info is not None else None)
            if gone is None:
                raise
            raise type(e)(f"{e}: {gone}") from e

    def gone(self, files: Sequence[PileInfo] | None = None) -> str | None:
        """Why a file of this dataset (one of ``files``, where known) is missing or holds other
        bytes, when its manifest says why (see :func:`why_gone`)."""
        if self.generation is None:  # plain tar shards: no manifest to ask
            return None
        listed = {os.path.basename(p.url): p.info.checksum if p.info else None for p in self.piles}
        return why_gone(self.name, self.generation, listed, files=files)

    def open(self, index: int, fetched: Fetched) -> Shard:
        """Finish indexing what :meth:`fetch` returned and check the sample count."""
        pile = self.piles[index]
        if pile.info is not None:
            return open_pile(fetched, expected=pile.info)
        data = open_pile(fetched, unique=True)
        if len(data) != pile.samples:
            raise CorruptShardError(f"{pile.url}: holds {len(data)} samples, {pile.samples} when it was first counted (the file changed)")
        return data


def resolve(source: SourceLike, *, skip: Callable[[BaseException, str], None] | None = None) -> Source:
    """A dataset directory (with ``shardkit.json``) or tar shard URLs/patterns -> :class:`Source`.

    ``skip(error, url)``, when given, is called for a plain shard that cannot be read to count
    its samples; it raises ``error`` or returns, and the shard is then kept with no samples
    (the loader's ``on_error`` decides).

    Plain shards log one warning: each is read as one pile, so the order is shuffled only
    within the shards' bounds.

    Raises:
        ConfigError: ``source`` is not a path, a URL, a pattern or a non-empty list of them.
        DatasetNotFoundError: nothing matches, or a directory holds no ``shardkit.json`` (the
            message lists what it holds); ManifestError: the manifest is invalid;
        CorruptShardError: a plain shard cannot be walked to count its samples, or a key in it
            names two samples.
    """
    source = check_paths("source", source)
    if isinstance(source, (str, os.PathLike)):
        root = os.fspath(source)
        named = root.rstrip("/").rsplit("/", 1)
        if named[-1] == manifest.MANIFEST and len(named) == 2 and not _is_directory(root) and storage.exists(root):
            raise ConfigError(f"{root}: a dataset's manifest, not a shard: pass the dataset's directory, {named[0]}")
        m = _manifest(root)
        if m is not None:
            return of_manifest(root, m)
        if _is_directory(root):
            raise _not_a_dataset(root)
        if _nothing_at(root):
            raise DatasetNotFoundError(
                f"{root}: no such file or directory (expected a shardkit dataset: a directory holding {manifest.MANIFEST}; or tar shards)"
            )
    urls = storage.expand(source, once=True)  # a shard named twice would be read twice an epoch
    name = urls[0] if len(urls) == 1 else f"{urls[0]} (+{len(urls) - 1} shards)"
    found = Source(name, tuple(Pile(u, _counted(u, skip)) for u in urls))
    shown = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "SHARDS"
    log.warning(
        "%s: plain tar shards, not piles: each shard is read as one pile, so the order is shuffled only within the "
        "shards' bounds (a class-sorted shard gives class-sorted batches); piles are shuffled uniformly. "
        "Make piles with: shardkit pile '%s' -o DIR --piles M",
        name,
        shown,
    )
    return found


def of_manifest(root: str, m: manifest.Manifest) -> Source:
    """The piles the manifest ``m`` of the dataset ``root`` lists."""
    piles = []
    for p in m.piles:
        segments = None if p.segments is None else tuple(storage.join(root, s.name) for s in p.segments)
        piles.append(Pile(storage.join(root, p.name), p.samples, p, segments))
    return Source(root, tuple(piles), m.generation)


def why_gone(
    root: str,
    generation: int,
    listed: Mapping[str, str | None],
    *,
    files: Sequence[PileInfo] | None = None,
    since: str = "this loader opened it",
    reader: str = "this loader",
    anew: str = "a new loader",
) -> str | None:
    """Why a file of generation ``generation`` of the dataset ``root`` (whose piles were ``listed``:
    name -> checksum) is missing or holds other bytes, when the manifest there says why: the dataset is no longer the
    one its reader opened (overwritten, removed, or moved on and its older files collected).
    None when it is the same dataset, its generation is still kept, or the manifest there now
    lists ``files`` (the entries of the file that failed, where known) as they were: whatever
    happened to the file happened to it alone, as the error says; None too when the manifest
    cannot be read. ``since``, ``reader`` and ``anew`` name the reader in the sentence."""
    try:
        now = manifest.read(root)
    except DatasetNotFoundError:
        return f"the dataset at {root} was removed since {since}"
    except ShardkitError:
        return None  # the manifest cannot be read either: the error as it is says enough
    held = {(f.name, f.checksum) for p in now.piles for f in p.parts}
    if files and all((f.name, f.checksum) in held for f in files):
        return None  # the dataset there still holds these very files: a deleted or damaged file, not a dataset that changed
    if now.generation == generation and dict(listed) == {p.name: p.checksum for p in now.piles}:
        return None
    if now.generation <= generation:  # an overwrite starts again at generation 0
        return f"the dataset at {root} was overwritten since {since}; {anew} reads it"
    kept = _kept(root, generation, listed)
    if kept:
        return None  # moved on, but not collected: a file went missing, as the error says
    if kept is False:  # the generation's manifest there lists other piles: an overwrite, then appends
        return f"the dataset at {root} was overwritten since {since}, and grew to generation {now.generation}; {anew} reads it"
    return (
        f"the dataset at {root} moved on from generation {generation}, which {reader} reads, to {now.generation}, "
        f"and generation {generation}'s files are gone (an overwrite, or shardkit gc after its grace period); {anew} "
        f"reads generation {now.generation}"
    )


def gone_file(source: Source, url: str) -> str | None:
    """Why the file ``url`` of ``source`` (a dataset, or a blend's datasets) is gone, where the
    manifest of its dataset says (see :func:`why_gone`)."""
    for part in getattr(source, "parts", None) or (source,):
        if any(url == p.url or url in (p.segments or ()) for p in part.piles):
            return part.gone()
    return None


def _kept(root: str, generation: int, listed: Mapping[str, str | None]) -> bool | None:
    """Whether generation ``generation``'s manifest kept at ``root`` lists the piles ``listed``
    (False: it lists others, a dataset written over this one); None when it is not kept (gc
    removes it with the generation's files)."""
    try:
        kept = Dataset(root).pinned(generation)
    except ShardkitError:
        return None
    return dict(listed) == {p.name: p.checksum for p in kept.piles}


def at_generation(root: str, generation: int) -> Source:
    """The dataset ``root`` as generation ``generation`` of it listed it (pinned through
    :meth:`shardkit.dataset.transaction.Dataset.pinned`), every file checked present.

    Raises:
        DatasetNotFoundError: that generation's manifest or one of its files is gone (named,
            with the generation).
    """
    m = Dataset(root).pinned(generation)
    present = set(storage.listdir(root))
    missing = [name for p in m.piles if p.samples for name in p.files if name not in present]
    if missing:
        raise DatasetNotFoundError(
            f"{root}: generation {generation} is gone: {len(missing)} of its files were deleted ({missing[0]}, ...); "
            "shardkit gc removes the files of generations no current manifest lists once their grace period is over"
        )
    return of_manifest(root, m)


def _manifest(root: str) -> manifest.Manifest | None:
    """The manifest of the dataset ``root``, or None when it is not one. The store is asked
    once (a read that may find nothing), not twice (does it exist? then the read)."""
    if glob.has_magic(root) or storage.brace_expand(root) != [root]:  # a pattern of shards
        return None
    try:
        return manifest.read(root)
    except DatasetNotFoundError as e:
        if getattr(e, "bucket", None):  # no bucket at all: said as such
            raise
        return None
    except StorageError as e:
        if e.errno == errno.ENOTDIR:  # a file (a plain shard), not a directory
            return None
        raise


def _nothing_at(root: str) -> bool:
    """``root`` is one name (no pattern), not a shard's, under which there is nothing at all."""
    if glob.has_magic(root) or storage.brace_expand(root) != [root] or root.rstrip("/").endswith(_SHARD_SUFFIXES):
        return False  # a shard's name: "no such file" says it
    return not storage.exists(root.rstrip("/") or root)


def _is_directory(root: str) -> bool:
    store, name = storage.locate(root)
    return store.is_dir(name)


def _not_a_dataset(root: str) -> DatasetNotFoundError:
    """The error for a directory without a manifest, saying what it holds and what to do."""
    names = storage.listdir(root)
    where = f"{root}: no {manifest.MANIFEST} here, so it is not a shardkit dataset"
    if not names:
        return DatasetNotFoundError(f"{where}, and the directory is empty")
    shards = [n for n in names if n.endswith(_SHARD_SUFFIXES)]
    others = [n for n in names if n not in shards]
    said = [_count(shards, "tar shard") if shards else "no tar shard"] + ([_count(others, "other entry")] if others else [])
    message = f"{where}; it holds {' and '.join(said)}"
    if any(layout.unfinished(n) for n in names):
        message += ": piles without a manifest are what a pile job that did not finish leaves; run it again"
    elif shards:
        suffix = max(_SHARD_SUFFIXES, key=lambda x: sum(n.endswith(x) for n in shards))
        pattern = storage.join(root, f"*{suffix}")
        message += (
            f": pass them as a glob like '{pattern}' to read them as plain shards, or make piles with "
            f"shardkit pile '{pattern}' -o DIR --piles M"
        )
    return DatasetNotFoundError(message)


def _count(names: list[str], what: str) -> str:
    """``"12 tar shards (a.tar, b.tar, c.tar, ...)"``"""
    plural = what if len(names) == 1 else (what[:-1] + "ies" if what.endswith("y") else what + "s")
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"{len(names)} {plural} ({shown})"


def _counted(url: str, skip: Callable[[BaseException, str], None] | None) -> int:
    """The samples of the plain shard ``url``; 0 when it cannot be read and ``skip`` returns."""
    if skip is None:
        return count_samples(url)
    try:
        return count_samples(url)
    except (ShardkitError, OSError) as e:
        skip(e, url)
        return 0


def count_samples(url: str) -> int:
    """Samples in a WebDataset tar, walked once and then remembered for this process."""
    store, name = storage.locate(url)
    # a cheap look (a stat) also gives the version; of an object the size is one request, its version would be another
    key = (store.url(name), store.size(name), (store.version(name) if store.supports_mapping else None) or "")
    with _cache_lock:
        if key in _counts_cache:
            return _counts_cache[key]
    count = len(Shard(url, read_shard(url, mapped=True), unique=True))
    with _cache_lock:
        _counts_cache[key] = count
    return count
