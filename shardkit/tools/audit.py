"""Describe a dataset directory (:func:`info`) and check every byte of it against its manifest (:func:`verify`).

``info`` reads only ``shardkit.json``; ``verify`` reads every pile once, so it costs one full
sequential read of the dataset and holds one pile in memory at a time.

    summary = shardkit.info("data/")
    print(summary.samples, summary.pile_samples, summary.loader_ram())
    problems = shardkit.verify("data/")   # [] when every pile is intact
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit import _util, manifest, storage
from shardkit.dataset import index_file, layout, leftovers
from shardkit.dataset.file_checks import byte_problems, tar_problem
from shardkit.dataset.transaction import Dataset
from shardkit.errors import CorruptShardError, ShardkitError, StorageError
from shardkit.loading.pile import Fetched, count_problem, open_pile
from shardkit.manifest import Manifest, PileInfo
from shardkit.piles import classes as class_maps
from shardkit.piles.leaves import HASH, hashes
from shardkit.piles.parts import Hashes
from shardkit.piles.unique_keys import CHECK_MEMORY, repeated_hashes
from shardkit.tar import compression, scan
from shardkit.tar.keys import repeated_key, sample_at
from shardkit.tools.key_files import MISSING, key_file_problems

_MAX_DUPLICATES = 10  # duplicate keys reported one by one per pile; the rest are counted
TRIES = 3  # generations verify reads when jobs keep removing the one it reads
log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Spread:
    """Minimum, mean and maximum of a per-pile quantity."""

    min: int
    mean: float
    max: int

    @classmethod
    def of(cls, values: list[int]) -> Spread:
        return cls(min=min(values), mean=sum(values) / len(values), max=max(values)) if values else cls(min=0, mean=0.0, max=0)


@dataclass(frozen=True, kw_only=True)
class DatasetInfo:
    """What :func:`info` reports about a dataset, from its manifest alone.

    ``expected_mean`` and ``expected_sd`` are the Binomial(n, 1/M) pile size a uniform router
    gives: n/M and sqrt(n/M * (1 - 1/M)). They describe piles written by pass 1; the fixed-size
    shards of :func:`shardkit.shuffle` (``kind == "shuffled"``) are not random in size.

    ``bytes`` is the piles' size as stored; for compressed piles (``compression`` names the
    codec) ``tar_bytes`` is the size of the tars inside, and ``pile_bytes`` and
    :meth:`loader_ram` count those: what a loader holds in memory. ``repeat`` is what pass 1
    recorded of its oversampling (the rule, and input samples by their number of copies) in the
    last write that had one; ``generations`` are those whose files the dataset holds now.

        summary = info("data/")
        print(f"{summary.samples} samples in {summary.piles} piles")
        print(summary.loader_ram(mix=2))   # bytes of RAM a loader mixing 2 piles needs
    """

    path: str
    kind: str
    samples: int
    bytes: int
    piles: int
    fields: tuple[str, ...]
    seed: int
    created_by: str
    skipped_units: int
    split_piles: int
    pile_samples: Spread
    pile_bytes: Spread
    expected_mean: float
    expected_sd: float
    largest_piles: tuple[int, ...]
    compression: str | None = None
    tar_bytes: int = 0
    repeat: dict[str, Any] | None = None
    generations: tuple[int, ...] = (0,)

    @property
    def ratio(self) -> float | None:
        """How many times smaller compression made the piles (tar bytes / stored bytes), or None."""
        return self.tar_bytes / self.bytes if self.compression is not None and self.bytes else None

    def loader_ram(self, *, mix: int = 1, prefetch: int = 1) -> int:
        """Bytes of pile data a loader holds at its peak: its resident piles, the largest ones.

        A loader reads from one pile (``mix + 1`` with ``mix > 1``) while it reads ahead
        ``prefetch`` more, so with the defaults this is the two largest piles.
        """
        reading = 1 if mix <= 1 else mix + 1
        return sum(self.largest_piles[: reading + prefetch])

    def to_dict(self) -> dict[str, object]:
        """A JSON-able view (what ``shardkit info --json`` prints)."""
        return {
            "path": self.path,
            "kind": self.kind,
            "samples": self.samples,
            "bytes": self.bytes,
            "piles": self.piles,
            "fields": list(self.fields),
            "seed": self.seed,
            "created_by": self.created_by,
            "skipped_units": self.skipped_units,
            "split_piles": self.split_piles,
            "pile_samples": vars(self.pile_samples) | {"expected_mean": self.expected_mean, "expected_sd": self.expected_sd},
            "pile_bytes": vars(self.pile_bytes),
            "compression": self.compression,
            "tar_bytes": self.tar_bytes,
            "repeat": self.repeat,
            "generations": list(self.generations),
            "loader_ram": {f"mix={k}": self.loader_ram(mix=k) for k in (1, 2, 4)},
        }


def _kind(m: Manifest) -> str:
    kind = m.extra.get("kind")
    return kind if isinstance(kind, str) else "piles"


def info(directory: str, *, storage_options: Mapping[str, Any] | None = None) -> DatasetInfo:
    """Summarise the dataset in ``directory`` from its manifest (no pile is read).

    ``storage_options`` are for an object-store ``directory`` (see :func:`shardkit.loader`).

    Raises:
        DatasetNotFoundError: ``directory`` holds no ``shardkit.json``.
        ManifestError: the manifest is malformed.
    """
    storage.use(directory, storage_options)
    m = manifest.read(directory)
    n, piles = m.samples, len(m.piles)
    # the binomial is over the M pass 1 drew from: split sub-piles count once
    drawn = manifest.original_piles(m)
    mean = n / drawn if drawn else 0.0
    sd = math.sqrt(mean * (1 - 1 / drawn)) if drawn else 0.0
    return DatasetInfo(
        path=directory,
        kind=_kind(m),
        samples=n,
        bytes=m.bytes,
        piles=piles,
        fields=m.fields,
        seed=m.seed,
        created_by=m.created_by,
        skipped_units=m.skipped_units,
        split_piles=m.split_piles,
        pile_samples=Spread.of([p.samples for p in m.piles]),
        pile_bytes=Spread.of([p.tar_size for p in m.piles]),
        expected_mean=mean,
        expected_sd=sd,
        largest_piles=tuple(sorted((p.tar_size for p in m.piles), reverse=True)[:64]),
        compression=", ".join(sorted({f.compression for p in m.piles for f in p.parts if f.compression is not None})) or None,
        tar_bytes=m.tar_bytes,
        repeat={"generation": 0, **m.extra["repeat"]} if isinstance(m.extra.get("repeat"), dict) else None,
        generations=tuple(sorted(m.held_generations())),
    )


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One thing :func:`verify` found wrong.

    ``kind`` is one of ``missing``, ``unreadable``, ``size``, ``checksum`` (of the file, or of
    the tar inside a compressed pile), ``compressed`` (a compressed pile that does not
    decompress to its tar), ``structure``, ``count``, ``duplicate`` (two samples of a pile share a key) for a pile listed in the
    manifest, ``keys`` (the key hashes beside a segment of a grown dataset, which appends trust,
    are not its keys': wrong size, unsorted or other hashes), ``missing-keys`` (none there:
    appends read the segment instead, and the next one writes it again), ``index`` (the stored
    random-access index of the manifest's generation does not check, or is another manifest's:
    readers pass it over and read every file to build it again), ``generation`` (a kept manifest
    of an older generation that does not read: a state pinned to it cannot resume), ``extra`` (a
    shard file the manifest does not list) or ``leftover`` (a temporary file or directory an
    interrupted job left behind, or a file an install its journal names moved in before the job
    died). ``extra``, ``leftover`` and ``missing-keys`` are warnings (:attr:`warning`).

        for problem in verify("data/"):
            print(problem)          # "pile-000003.tar: checksum is crc32:..., the manifest says ..."
    """

    name: str
    kind: str
    message: str

    @property
    def warning(self) -> bool:
        """Beside a sound dataset, not wrong with it: unlisted files, a keys file not there."""
        return self.kind in ("extra", "leftover", MISSING)

    def __str__(self) -> str:
        return f"{self.name}: {self.message}"


def _class_map(m: Manifest) -> tuple[list[str], dict[str, Any]] | None:
    """The class map the manifest records and says how to check, or None."""
    check = m.extra.get(class_maps.CHECK_KEY)
    try:
        classes = class_maps.recorded(m.extra, "manifest")
    except ShardkitError:
        return None  # the map itself is malformed: nothing to check samples against
    return (classes, check) if classes is not None and isinstance(check, dict) else None


def _class_problems(name: str, shard: Any, classes: tuple[list[str], dict[str, Any]]) -> list[Problem]:
    """Samples whose class disagrees with the recorded class map (the first ten, then a count)."""
    found: list[Problem] = []
    wrong = 0
    for i in range(len(shard)):
        sample = shard.sample(i)
        said = class_maps.mismatch(sample, *classes)
        if said is None:
            continue
        wrong += 1
        if len(found) < _MAX_DUPLICATES:
            found.append(Problem(name=name, kind="class", message=f"sample {i} ({sample['__key__']!r}): {said}"))
    if wrong > len(found):
        found.append(Problem(name=name, kind="class", message=f"{wrong - len(found)} more samples disagree with the class map"))
    return found


def _check_segment(directory: str, segment: PileInfo, classes: tuple[list[str], dict[str, Any]] | None, keys: _Keys) -> list[Problem]:
    """Every problem of one segment of a grown pile, and of the keys file beside it, checked
    against the keys read once from the segment."""
    found, read = _check_pile(directory, segment, classes, keys)
    shard_keys, hashed = read if read is not None else (None, None)
    name = manifest.keys_name(segment.name)
    return found + [Problem(name=name, kind=k, message=m) for k, m in key_file_problems(directory, segment, shard_keys, hashed)]


def _check_pile(
    directory: str, pile: PileInfo, classes: tuple[list[str], dict[str, Any]] | None, keys: _Keys
) -> tuple[list[Problem], tuple[list[str], np.ndarray] | None]:
    """Every problem of one pile, found by the loader's own read path (its checks listed, not
    raised), and its keys with their hashes (which go to ``keys`` too); None when it could not be read."""
    url = storage.join(directory, pile.name)
    if not storage.exists(url):
        return [Problem(name=pile.name, kind="missing", message="listed in the manifest but the file does not exist")], None
    try:
        buf: storage.Buffer = storage.read_bytes(url, size=pile.bytes, concurrency=storage.remote.DEFAULT_CONCURRENCY)
    except OSError as e:  # a StorageError names the file and says why
        message = str(e).removeprefix(f"{url}: ") if isinstance(e, StorageError) else f"cannot be read ({e.strerror or e})"
        return [Problem(name=pile.name, kind="unreadable", message=message)], None
    found = [Problem(name=pile.name, kind=kind, message=message) for kind, message in byte_problems(url, buf, pile)]
    if pile.compression is not None:  # the file checked as stored, now the tar inside
        try:
            buf = compression.decompress(buf, pile.compression, url, size=pile.tar_bytes)
        except CorruptShardError as e:
            return [*found, Problem(name=pile.name, kind="compressed", message=str(e).removeprefix(f"{url}: "))], None
        problem = tar_problem(buf, pile)
        if problem is not None:
            found.append(Problem(name=pile.name, kind="checksum", message=problem))
    try:
        # unchecked: every header checksum is summed and the careful walk names the first bad one
        shard = open_pile(Fetched(url, buf, scan.scan(buf), checked=False))
        shard.check()
    except CorruptShardError as e:
        return [*found, Problem(name=pile.name, kind="structure", message=str(e).removeprefix(f"{url}: "))], None
    count = count_problem(shard, pile)
    if count is not None:
        found.append(Problem(name=pile.name, kind="count", message=count))
    found += _class_problems(pile.name, shard, classes) if classes is not None else []
    hashed = hashes(shard.keys)
    keys.add(pile, hashed)
    return found + _duplicate_keys(pile.name, shard.keys, shard.sample_offsets()), (shard.keys, hashed)


def _pile_keys(directory: str, pile: PileInfo) -> tuple[list[str], list[int]]:
    """The keys of a pile :func:`_check_pile` read whole before, and where each sample starts."""
    url = storage.join(directory, pile.name)
    buf: storage.Buffer = storage.read_bytes(url, size=pile.bytes, concurrency=storage.remote.DEFAULT_CONCURRENCY)
    if pile.compression is not None:
        buf = compression.decompress(buf, pile.compression, url, size=pile.tar_bytes)
    shard = open_pile(Fetched(url, buf, scan.scan(buf), checked=False))
    return shard.keys, shard.sample_offsets()


class _Keys:
    """The key hashes of every file checked, in a temporary file (8 bytes a sample), to find a key
    that two files share once all are read (:meth:`repeats`)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.path = os.path.join(folder, "keys")
        self._fd = storage.open_fd(self.path, append=True)
        self.files: list[tuple[PileInfo, int, int]] = []  # (file, first hash, count)
        self._written = 0

    def add(self, pile: PileInfo, found: np.ndarray) -> None:
        with storage.guard(self.path, "write key hashes"):
            storage.write_chunks(self._fd, [found.tobytes()])
        self.files.append((pile, self._written, len(found)))
        self._written += len(found)

    def close(self) -> None:
        os.close(self._fd)

    def repeats(self, directory: str) -> list[Problem]:
        """Samples whose key an earlier file (in manifest order) has too, in the writers' words:
        only files with a hash that meets another are read again, and their keys decide."""
        runs = np.array([[first, count] for _, first, count in self.files], dtype=np.int64).reshape(-1, 2)
        suspects, _ = repeated_hashes([Hashes(self.path, runs)], CHECK_MEMORY, self.folder)
        if not len(suspects):
            return []
        places: dict[str, list[tuple[int, int, int]]] = {}  # key -> (file, sample, offset)
        for f, (pile, first, count) in enumerate(self.files):
            mine = np.frombuffer(storage.read_range(self.path, first * HASH.itemsize, (first + count) * HASH.itemsize), dtype=HASH)
            hit = np.flatnonzero(np.isin(mine, suspects)).tolist()
            if hit:
                keys, offsets = _pile_keys(directory, pile)
                for i in hit:
                    places.setdefault(keys[i], []).append((f, i, offsets[i]))
        found = []
        for key, at in places.items():
            earliest = min(at)
            later = [a for a in at if a[0] != earliest[0]]
            if later:
                (f, i, offset), (g, j, other) = min(later), earliest
                earlier = f"{self.files[g][0].name}'s {sample_at(j, f'offset {other}')}"
                said = repeated_key(key, sample_at(i, f"offset {offset}"), earlier)
                found.append((f, i, Problem(name=self.files[f][0].name, kind="duplicate", message=said)))
        found.sort(key=lambda item: item[:2])
        problems = [problem for _, _, problem in found[:_MAX_DUPLICATES]]
        if len(found) > _MAX_DUPLICATES:
            more = len(found) - _MAX_DUPLICATES
            problems.append(Problem(name=directory, kind="duplicate", message=f"{more} more keys are in two files"))
        return problems


def _duplicate_keys(name: str, keys: list[str], offsets: list[int]) -> list[Problem]:
    """Samples of one pile that share a key (not adjacent, or they would be one sample), in the
    words the writers use when they refuse one.

    Every writer of shardkit's refuses these, and the loader does not look for them in piles
    (only in plain shards); readers that index by key, and joins with labels kept elsewhere,
    would mix such samples up.
    """
    first: dict[str, int] = {}
    found: list[Problem] = []
    for i, key in enumerate(keys):
        j = first.setdefault(key, i)
        if j == i:
            continue
        if len(found) == _MAX_DUPLICATES:
            more = len(keys) - len(set(keys)) - len(found)
            found.append(Problem(name=name, kind="duplicate", message=f"{more} more samples repeat a key of an earlier sample"))
            break
        said = repeated_key(key, sample_at(i, f"offset {offsets[i]}"), sample_at(j, f"offset {offsets[j]}"))
        found.append(Problem(name=name, kind="duplicate", message=said))
    return found


def _index_problems(directory: str, m: Manifest) -> list[Problem]:
    """What is wrong with the stored random-access index of ``m``'s generation, if it has one."""
    name = layout.index_name(m.generation)
    try:
        message = index_file.problem(directory, m)
    except StorageError as e:  # no answer about its bytes: said as for a pile, not taken for damage
        return [Problem(name=name, kind="unreadable", message=str(e).removeprefix(f"{storage.join(directory, name)}: "))]
    return [] if message is None else [Problem(name=name, kind="index", message=message)]


def _unlisted(directory: str) -> list[Problem]:
    # the manifest there now (an append that published while the piles were checked put in its files);
    # an older generation's files (retired, or rewritten by a split) are a pinned loader's until gc: not strays
    rest = leftovers.unlisted(directory, m := manifest.read(directory))
    left = {item.name: item for item in leftovers.find(directory, rest, m.generation)}
    found = []
    for name in rest:
        if name in left:
            found.append(Problem(name=name, kind="leftover", message=left[name].message))
        elif name.endswith(compression.SHARD_SUFFIXES):
            said = "shard file not listed in the manifest (readers ignore it; an interrupted overwrite leaves such files)"
            found.append(Problem(name=name, kind="extra", message=said))
    return found


def verify(directory: str, *, quiet: bool = False, storage_options: Mapping[str, Any] | None = None) -> list[Problem]:
    """Check every pile of a dataset against its manifest; returns what is wrong (``[]`` if nothing).

    Each listed pile must exist, have the recorded size and checksum (a compressed pile: the file's, then the tar's it
    decompresses to), be a well-formed tar (every header checksum, no truncation, no unsafe or non-regular member, no sample
    with two members of one extension), hold the recorded number of samples and no two samples with one key, in one pile or
    in two (the first ten are listed with both positions). Where the manifest records a class map and how to check it (the
    image transform's ``classes`` and ``class_check``), every sample's ``cls`` must index a class whose name is the one its
    ``json`` says. Beside each segment of a grown pile, the keys file appends check new keys against must be there and hold
    the sorted hashes of that segment's keys, one a sample (compared with the keys read for the checksum: no second read).
    The stored random-access index of the manifest's generation, if there is one, must be whole and of this manifest. Shard
    files neither the manifest nor a kept older generation's manifest lists, and temporaries left by an interrupted job, are
    reported too. When a job replaced the generation being read (an overwrite, gc) and it had problems, the one there now
    is verified instead (logged), up to :data:`TRIES` times.

    Args:
        quiet: no progress bar (there is none anyway when stderr is not a terminal).
        storage_options: for an object-store ``directory`` (see :func:`shardkit.loader`).

    Raises:
        DatasetNotFoundError: ``directory`` holds no ``shardkit.json``.
        ManifestError: the manifest itself is malformed.
    """
    _util.check_bool("quiet", quiet)
    storage.use(directory, storage_options)
    m, tries = manifest.read(directory), 1
    while True:
        problems = _verified(directory, m, quiet=quiet)
        now = manifest.read(directory)
        # any problem, not only 'missing': a file removed between its check and its read is 'unreadable'
        if tries == TRIES or not problems or index_file.identity(now) == index_file.identity(m):
            return problems + _unlisted(directory)
        log.warning("%s: generation %d was replaced while verify read it: verifying the one there now", directory, m.generation)
        m, tries = now, tries + 1


def _verified(directory: str, m: Manifest, *, quiet: bool) -> list[Problem]:
    """What :func:`verify` finds wrong with the piles and index of ``m``."""
    problems: list[Problem] = []
    classes = _class_map(m)
    with (
        tempfile.TemporaryDirectory(prefix="shardkit-verify-") as folder,
        _util.bar(total=m.bytes, desc="verify", unit="B", quiet=quiet, unit_scale=True, unit_divisor=1024) as progress,
    ):
        keys = _Keys(folder)
        try:
            for pile in m.piles:
                if pile.segments is None:
                    problems.extend(_check_pile(directory, pile, classes, keys)[0])
                else:  # a pile that grew: each segment on its own, with the keys file beside it
                    for segment in pile.parts:
                        problems.extend(_check_segment(directory, segment, classes, keys))
                progress.update(pile.stored_bytes)
        finally:
            keys.close()
        problems.extend(keys.repeats(directory))
    kept = [Problem(name=n, kind="generation", message=said) for n, said in Dataset(directory).kept_problems(m)]
    return problems + _index_problems(directory, m) + kept
