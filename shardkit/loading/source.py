"""Resolve what a loader reads into piles: a shardkit dataset directory or any WebDataset tars.

A dataset directory is described by its manifest (names, counts, sizes, checksums). Plain tar
shards (a list, a glob or a brace pattern) are walked once to count their samples; the counts
are cached per process by (URL, size, modification time), so a second loader starts at once.

    src = resolve("data/")                       # or resolve("shards/train-{000..099}.tar")
    src.counts                                    # samples per pile, in order
    pile = src.open(3, src.fetch(3, max_bytes=2**31, verify=True))
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardkit import manifest, storage
from shardkit._util import check_paths
from shardkit.errors import CorruptShardError, ShardkitError
from shardkit.loading.pile import Fetched, fetch, open_pile
from shardkit.manifest import PileInfo
from shardkit.tar.shard import Shard, read_shard

SourceLike = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

_counts_cache: dict[tuple[str, int, int], int] = {}
_cache_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Pile:
    """One pile (or tar shard): where it is, how many samples it holds, its manifest entry."""

    url: str
    samples: int
    info: PileInfo | None = None


@dataclass(frozen=True)
class Source:
    """The piles a loader reads, in manifest (or listing) order, and a fingerprint of them."""

    name: str
    piles: tuple[Pile, ...]

    @property
    def counts(self) -> list[int]:
        return [p.samples for p in self.piles]

    @property
    def samples(self) -> int:
        return sum(p.samples for p in self.piles)

    def fingerprint(self) -> str:
        """Changes whenever a pile is added, removed, renamed, resized or rewritten."""
        doc = [
            [os.path.basename(p.url), p.samples, p.info.bytes if p.info else None, p.info.checksum if p.info else None] for p in self.piles
        ]
        return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:16]

    def fetch(self, index: int, *, max_bytes: int | None = None, verify: bool = True) -> Fetched:
        """Pile ``index``'s checked bytes and the vectorized half of its index (see
        :func:`shardkit.loading.pile.fetch`): the work a background thread can do without the GIL."""
        pile = self.piles[index]
        return fetch(pile.url, expected=pile.info, max_bytes=max_bytes, verify=verify)

    def open(self, index: int, fetched: Fetched) -> Shard:
        """Finish indexing what :meth:`fetch` returned and check the sample count."""
        pile = self.piles[index]
        if pile.info is not None:
            return open_pile(fetched, expected=pile.info)
        data = open_pile(fetched)
        if len(data) != pile.samples:
            raise CorruptShardError(f"{pile.url}: holds {len(data)} samples, {pile.samples} when it was first counted (the file changed)")
        return data


def resolve(source: SourceLike, *, skip: Callable[[BaseException, str], None] | None = None) -> Source:
    """A dataset directory (with ``shardkit.json``) or tar shard URLs/patterns -> :class:`Source`.

    ``skip(error, url)``, when given, is called for a plain shard that cannot be read to count
    its samples; it raises ``error`` or returns, and the shard is then kept with no samples
    (the loader's ``on_error`` decides).

    Raises:
        ConfigError: ``source`` is not a path, a URL, a pattern or a non-empty list of them.
        DatasetNotFoundError: nothing matches; ManifestError: the manifest is invalid;
        CorruptShardError: a plain shard cannot be walked to count its samples.
    """
    source = check_paths("source", source)
    if isinstance(source, (str, os.PathLike)):
        root = os.fspath(source)
        if manifest.is_dataset(root):
            m = manifest.read(root)
            return Source(root, tuple(Pile(storage.join(root, p.name), p.samples, p) for p in m.piles))
    urls = storage.expand(source)
    name = urls[0] if len(urls) == 1 else f"{urls[0]} (+{len(urls) - 1} shards)"
    return Source(name, tuple(Pile(u, _counted(u, skip)) for u in urls))


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
    path = storage.local_path(url)
    if path is not None:
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    else:
        key = (url, storage.size(url), 0)
    with _cache_lock:
        if key in _counts_cache:
            return _counts_cache[key]
    count = len(Shard(url, read_shard(url, mapped=True)))
    with _cache_lock:
        _counts_cache[key] = count
    return count
