"""Split the piles an append grows into random leaves by each sample's keyed draw, and write segment files.

Every sample has a draw u in [0, 1) that only the dataset's seed and the sample's key decide
(:func:`shardkit.piles.router.draws`). A pile that holds more samples than fit
``max_pile_bytes`` is cut into k leaves, k a power of two (:func:`shardkit.piles.router.resolution`),
and a sample goes to leaf ``floor(u * k)``. Leaves nest: leaf j at resolution k is leaves 2j
and 2j+1 at 2k. Each segment file records the resolution r and leaf j its samples share, so a
segment at ``r >= k`` already lies in one leaf (``j * k // r``) and stays as it is; only a
segment at ``r < k`` is read and rewritten into files at resolution k. A pile doubles before it
is rewritten again, so each byte is rewritten O(1) times on average.

    names = Names(set(storage.listdir(out)), token="", codec=None)
    made = split_tar(data, "pile-000003.tar", seed=0, resolution=4, name=names.of(3, 0, 4), generation=0,
                     staging=staging, pack=None)   # a segment per leaf, pile-000003.g000000.r4-<leaf>.tar
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from collections.abc import Callable, Sequence

import numpy as np

from shardkit import manifest, storage
from shardkit.dataset.layout import segment_name
from shardkit.errors import ConfigError, CorruptShardError
from shardkit.manifest import Manifest, PileInfo, Segment, keys_name, pile_number
from shardkit.piles import router
from shardkit.piles.pack import Pack, check_stop
from shardkit.piles.publish import Run
from shardkit.tar import compression, index, write
from shardkit.tar.keys import key_hashes

HASH = np.dtype("<u8")
# a split holds a whole segment in memory: one at a time, however many threads write segments
_SPLITTING = threading.Lock()


class Names:
    """Names for the segment files an append writes, none that the dataset directory holds
    (``taken``: its files), for the file or for its key hashes beside it. Thread-safe.

    A name is taken only by files a crash or an overwrite left behind; then ``.v1`` (``.v2``...)
    goes before ``.tar``, as :func:`shardkit.dataset.install.free_names` does for piles.
    """

    def __init__(self, taken: set[str], token: str, codec: str | None) -> None:
        self.taken, self.token, self.codec = set(taken), token, codec
        self._lock = threading.Lock()

    def segment(self, pile: int, generation: int, resolution: int = 1, leaf: int = 0) -> str:
        name = segment_name(pile, generation, self.token, self.codec, resolution, leaf)
        stem, suffix = name.split(".tar", 1)
        version = 0
        with self._lock:
            while name in self.taken or keys_name(name) in self.taken:
                version += 1
                name = f"{stem}.v{version}.tar{suffix}"
            self.taken |= {name, keys_name(name)}
        return name

    def of(self, pile: int, generation: int, resolution: int) -> Callable[[int], str]:
        """A name for each leaf of ``pile`` and ``generation`` at ``resolution``, chosen when the leaf is written."""
        return functools.partial(self.segment, pile, generation, resolution)


def segments_by_pile(m: Manifest, piles: int, where: str) -> list[list[Segment]]:
    """The segment files of each of the ``piles`` piles pass 1 drew, whatever the manifest
    ``m`` (of the dataset ``where``) made of them: a whole pile or a sub-pile of a split is one
    segment of generation 0 at resolution 1 (any file holds leaf 0 of resolution 1).

    Raises:
        ConfigError: a pile of ``m`` is not named after one of the ``piles`` (a dataset no
            writer of piles made, such as an eager shuffle's shards).
    """
    found: list[list[Segment]] = [[] for _ in range(piles)]
    for pile in m.piles:
        number = pile_number(pile.name)
        if number is None or number >= piles:
            raise ConfigError(
                f"{where}: {pile.name!r} is not one of the {piles} piles (pile-000000.tar to {manifest.leaf_name(piles - 1, 1, 0)}, "
                "or a part of one); an append adds to datasets made by pass 1 (shardkit pile, PileWriter, preprocess)"
            )
        found[number] += list(pile.segments) if pile.segments is not None else as_segment(pile)
    return found


def as_segment(pile: PileInfo) -> list[Segment]:
    """A file written whole (by pass 1) as generation 0's segment of itself; none when empty."""
    if not pile.samples:
        return []
    return [
        Segment(
            name=pile.name,
            samples=pile.samples,
            bytes=pile.bytes,
            checksum=pile.checksum,
            generation=0,
            compression=pile.compression,
            tar_bytes=pile.tar_bytes,
            tar_checksum=pile.tar_checksum,
        )
    ]


def place(segment: Segment, resolution: int) -> int | None:
    """The leaf at ``resolution`` that holds all of ``segment``, or None when it is coarser and
    must be rewritten. Resolutions are powers of two, so the leaves nest."""
    if segment.resolution < resolution:
        return None
    return segment.leaf * resolution // segment.resolution


def read_tar(url: str, segment: Segment | PileInfo) -> storage.Buffer:
    """The tar a segment or pile file holds, checked against its manifest entry first: a rewrite
    must not copy damaged bytes into a file with a fresh checksum.

    Raises:
        CorruptShardError: the file's size or checksum is not the manifest's.
    """
    data = storage.read_bytes(url)
    crc = manifest.format_checksum(manifest.checksum(data))
    if len(data) != segment.bytes or crc != segment.checksum:
        raise CorruptShardError(
            f"{url}: is {len(data)} bytes with checksum {crc}, the manifest says {segment.bytes} and {segment.checksum}; "
            "it is not rewritten (shardkit verify names what is damaged)"
        )
    if segment.compression is None:
        return data
    return compression.decompress(data, segment.compression, url, size=segment.tar_bytes)


def hashes(keys: Sequence[str]) -> np.ndarray:
    """The 64-bit hashes of ``keys`` that ``.keys`` files hold."""
    return key_hashes(np.array([k.encode("utf-8", "surrogateescape") for k in keys], dtype=bytes)).astype(HASH)


def keys_damage(data: bytes, samples: int) -> str | None:
    """What is wrong with ``data`` as the ``.keys`` file of a segment of ``samples`` samples, as far
    as can be told without reading the segment: not one hash a sample (``"21 bytes, its 3
    samples need 24"``), or not sorted; None when neither."""
    if len(data) != samples * HASH.itemsize:
        return f"{len(data)} bytes, its {samples} samples need {samples * HASH.itemsize}"
    found = np.frombuffer(data, dtype=HASH)
    # two keys may share a hash, so equal neighbours are sorted
    down = np.flatnonzero(found[1:] < found[:-1])
    if len(down):
        return f"not sorted: hash {int(down[0]) + 1} is smaller than hash {int(down[0])} ({len(down)} such places)"
    return None


def write_keys(segment: str, found: np.ndarray) -> str:
    """Write the sorted key hashes ``found`` beside the segment file ``segment``; returns the path."""
    path = keys_name(segment)
    storage.write_bytes(path, np.sort(found.astype(HASH)).tobytes(), sync=False)
    return path


def split_tar(
    data: bytes, source: str, *, seed: int, resolution: int, name: Callable[[int], str], generation: int, staging: str, pack: Pack | None
) -> list[Segment]:
    """Write the samples of the tar ``data`` as one segment file per leaf at ``resolution``
    (named ``name(leaf)``, in ``staging``, compressed by ``pack`` when given, key hashes beside
    it); empty leaves get no file. ``source`` names ``data`` in errors.

    Raises:
        CorruptShardError: ``data`` is not a well-formed tar of samples.
    """
    layout = index.index(data, source, checked=True)  # read against its checksum, or written by this job
    starts = layout.samples()
    bounds = layout.sample_bounds(starts).tolist()
    keys = layout.sample_keys(starts[:-1])
    leaf = router.leaves(router.draws(seed, keys.tolist()), resolution)
    made = []
    for j in range(resolution):
        chosen = np.flatnonzero(leaf == j)
        if not len(chosen):
            continue
        tar = b"".join([*(data[bounds[i] : bounds[i + 1]] for i in chosen.tolist()), write.TRAILER])
        path = os.path.join(staging, name(j))
        made.append(_store(tar, path, samples=len(chosen), generation=generation, resolution=resolution, leaf=j, pack=pack))
        write_keys(path, key_hashes(keys[chosen]))
    return made


def _store(tar: bytes, path: str, *, samples: int, generation: int, resolution: int, leaf: int, pack: Pack | None) -> Segment:
    """Write ``tar`` to ``path`` (compressed whole by ``pack``) and return its segment entry."""
    crc = manifest.format_checksum(manifest.checksum(tar))
    stored = tar if pack is None else compression.compress(tar, pack.codec, level=pack.level, between=check_stop)
    storage.write_bytes(path, stored, sync=False)
    segment = Segment(
        name=os.path.basename(path), samples=samples, bytes=len(tar), checksum=crc, generation=generation, resolution=resolution, leaf=leaf
    )
    if pack is None:
        return segment
    packed = manifest.format_checksum(manifest.checksum(stored))
    return dataclasses.replace(segment, bytes=len(stored), checksum=packed, compression=pack.codec, tar_bytes=len(tar), tar_checksum=crc)


def rewrite(
    urls: Sequence[str],
    segments: Sequence[Segment],
    *,
    seed: int,
    resolution: int,
    name: Callable[[int], str],
    staging: str,
    pack: Pack | None,
) -> list[Segment]:
    """Rewrite the segment files ``urls`` of one generation of one pile as segments at
    ``resolution`` of that generation (so a window still retires them): one file per leaf,
    however many files they came from. The files themselves are left alone (older manifests list them).

    Raises:
        CorruptShardError: a file is not what the manifest says.
    """
    with _SPLITTING:
        tars = [read_tar(url, segment) for url, segment in zip(urls, segments, strict=True)]
        # one tar of them all: each one's end-of-archive trailer left out but the last
        data = b"".join([*(memoryview(tar)[: len(tar) - len(write.TRAILER)] for tar in tars), write.TRAILER])
        tars.clear()
        made = split_tar(
            data, urls[0], seed=seed, resolution=resolution, name=name, generation=segments[0].generation, staging=staging, pack=pack
        )
    if sum(s.samples for s in made) != sum(s.samples for s in segments):
        raise CorruptShardError(
            f"{', '.join(urls)}: hold {sum(s.samples for s in made)} samples, the manifest says {sum(s.samples for s in segments)}"
        )
    return made


def split_runs(
    runs: Sequence[Run],
    count: int,
    *,
    seed: int,
    resolution: int,
    name: Callable[[int], str],
    generation: int,
    staging: str,
    pack: Pack | None,
) -> list[Segment]:
    """Write an append's ``count`` new samples of one pile, ``runs`` of part files, as segments at
    ``resolution`` (see :func:`split_tar`).

    Raises:
        CorruptShardError: a part file ends before a run does.
    """
    with _SPLITTING:
        chunks = []
        for run in runs:
            chunk = storage.read_range(run.path, run.offset, run.offset + run.length)
            if len(chunk) != run.length:
                raise CorruptShardError(
                    f"{run.path}: part file ends early: expected {run.length} bytes at offset {run.offset}, got {len(chunk)}"
                )
            chunks.append(chunk)
        data = b"".join([*chunks, write.TRAILER])
        chunks.clear()
        made = split_tar(data, runs[0].path, seed=seed, resolution=resolution, name=name, generation=generation, staging=staging, pack=pack)
    if sum(s.samples for s in made) != count:
        raise CorruptShardError(f"{runs[0].path}: the part files hold {sum(s.samples for s in made)} samples, the job counted {count}")
    return made
