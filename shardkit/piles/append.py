"""Add a generation to a dataset: new samples become segment files of its M piles, published in one manifest.

An append routes each new sample to one of the dataset's M piles, drawn from ``(seed,
generation, unit, ordinal)`` (:mod:`shardkit.piles.router`), exactly as pass 1 routes, so
every sample of every generation is in a uniformly drawn pile and the union is a fresh pass 1's
output. Pile p's new samples are one new immutable file, ``pile-00000p.g<generation>.tar``
(``.tar.zst`` or ``.tar.gz`` with ``compression``: each segment is compressed whole, as a pile
is, and a dataset may mix plain and compressed segments); the pile becomes the list of its segments. Nothing written before is touched: the new manifest
lists the old segments and the new ones, and replacing ``shardkit.json`` is the one atomic step
(the old generation's manifest is kept as ``shardkit.g<old>.json``, so a loader pinned to it
still reads it). A ``window`` leaves the oldest generations' segments out of the new manifest.

Keys stay unique across generations without reading the old data: beside each segment,
``<segment>.keys`` holds the sorted 64-bit hashes of its keys, and the new keys' hashes are
compared with them; only a hash that meets one is read back to compare the keys themselves.

    base = start(output, options)        # after claim(); None unless options.mode == "append"
    result = finish(base, output, runs, counts, options=options, fields=fields, staging=staging)
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit import manifest, storage
from shardkit._util import parse_duration
from shardkit.errors import ConfigError, DatasetNotFoundError, SampleError
from shardkit.manifest import Manifest, PileInfo, Segment, generation_name, joined, keys_name, whole_pile
from shardkit.piles.options import PileOptions
from shardkit.piles.output import Output
from shardkit.piles.pack import Pack
from shardkit.piles.publish import Mapper, Run, assemble_pile, install, map_threads, pile_name
from shardkit.tar import compression
from shardkit.tar.keys import key_hashes
from shardkit.tar.shard import Shard

log = logging.getLogger(__name__)

_HASH = np.dtype("<u8")


@dataclass(frozen=True)
class Base:
    """The dataset an append adds to, and the generation it writes."""

    manifest: Manifest
    generation: int
    seen: bytes  # the manifest's bytes, kept as the old generation's copy


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def segment_name(pile: int, generation: int, token: str = "", codec: str | None = None) -> str:
    """``pile-000003.g000002.tar``: generation 2's segment of pile 3 (``token`` goes after a dash;
    ``codec`` adds its suffix: ``.tar.zst``)."""
    return f"{pile_name(pile).removesuffix('.tar')}.g{generation:06d}{'-' + token if token else ''}.tar{compression.suffix(codec)}"


def start(output: Output, options: PileOptions) -> Base | None:
    """The dataset ``output`` holds, checked against ``options``; None unless ``options.mode`` is ``"append"``.

    Raises:
        DatasetNotFoundError: there is no dataset to append to.
        ConfigError: ``piles`` or ``seed`` is not the dataset's (both values named), or its
            piles were split into sub-piles (an append does not route into sub-piles).
    """
    if options.mode != "append":
        return None
    out = output.path
    if output.manifest_seen is None:
        raise DatasetNotFoundError(
            f"{out}: no shardkit dataset to append to (no {manifest.MANIFEST}); write it first (mode='create', the default)"
        )
    old = manifest.parse(output.manifest_seen.decode("utf-8"), storage.join(out, manifest.MANIFEST))
    piles = manifest.original_piles(old)
    if piles != options.piles:
        raise ConfigError(
            f"piles: {out} has {piles} piles, this append asks for {options.piles}; an append writes into the dataset's piles, "
            f"so pass piles={piles}"
        )
    if old.seed != options.seed:
        raise ConfigError(f"seed: {out} was written with seed={old.seed}, this append has seed={options.seed}; pass seed={old.seed}")
    # a pile is whole (pile-000003.tar, .v1.tar after an overwrite, .tar.zst compressed) or the segments an append made
    split = [p.name for i, p in enumerate(old.piles) if p.segments is None and whole_pile(p.name) != i]
    if split or len(old.piles) != piles:
        raise ConfigError(
            f"{out}: its piles were split into sub-piles ({split[0] if split else old.piles[-1].name}, ...); "
            "appending to such a dataset is not supported: write it with a larger max_pile_bytes or more piles"
        )
    return Base(old, old.generation + 1, output.manifest_seen)


def finish(
    base: Base,
    output: Output,
    runs: Sequence[Sequence[Run]],
    counts: Sequence[int],
    *,
    options: PileOptions,
    fields: set[str],
    staging: str,
    skipped_units: int = 0,
    extra: dict[str, Any] | None = None,
    threads: int = 1,
    progress: Callable[[int], Any] | None = None,
    mapper: Mapper | None = None,
) -> Manifest:
    """Publish the new generation: each pile's runs become its new segment, the keys are checked
    unique across generations, the window retires old generations, the manifest goes in last.

    Takes the arguments of :func:`shardkit.piles.publish.publish`. Segments are written here, on
    ``threads`` threads (``mapper`` is not used: with ``executor="ray"`` the driver writes them).
    With ``options.compression`` each segment is compressed whole. The new generation's
    ``extra["repeat"]`` (a repeat rule's record) names its generation.

    Raises:
        SampleError: a new key is already in the dataset, or twice in this append.
        DatasetExistsError: the manifest changed while the job ran (another writer).
    """
    old, g = base.manifest, base.generation
    out = output.path
    new: dict[int, Segment] = {}
    staged: list[str] = []
    # an object store has no lock: two appends may race to one generation, and the loser must not
    # replace (then delete) the winner's objects, so there each job's segment names are its own
    token = output.token[:8] if output.remote else ""
    pack = Pack.of(options)
    codec = None if pack is None else pack.codec
    work = [(runs[p], counts[p], segment_name(p, g, token, codec), g, staging, pack) for p in range(len(runs))]
    for p, segment in enumerate(map_threads(_write_segment, work, threads, progress)):
        if segment is not None:
            new[p] = segment
            staged += [os.path.join(staging, segment.name), os.path.join(staging, keys_name(segment.name))]
    generations = _times(old, out)
    generations[g] = now()
    keep = _kept(generations, options.window, g)
    piles, first = [], []
    for p, pile in enumerate(old.piles):
        segments = list(pile.segments) if pile.segments is not None else _as_segment(pile)
        if pile.segments is None and pile.samples:
            first.append(p)
        segments = [s for s in segments if s.generation in keep] + ([new[p]] if p in new else [])
        piles.append(joined(segments, pile_name(p)))
    first_keys = _first_keys(out, [old.piles[p] for p in first], staging)
    _check_unique(out, [s for pile in piles for s in pile.segments or () if s.generation != g], list(new.values()), staging)
    over = sorted((p for p in piles if options.max_bytes is not None and p.bytes > options.max_bytes), key=lambda p: -p.bytes)
    if over:
        log.warning(
            "%s: %d piles are over max_pile_bytes=%d after this append (the largest, %s, holds %d bytes of tar); an append never "
            "splits piles: repile the dataset (shardkit repile) to split them, or pass a larger max_pile_bytes to the loader",
            out,
            len(over),
            options.max_bytes,
            over[0].name,
            over[0].bytes,
        )
    retired = sorted(set(generations) - keep)
    if retired:
        log.info("%s: generations %s leave the window (%s); shardkit gc deletes their files", out, _span(retired), options.window)
    if set(fields) != set(old.fields):
        log.warning(
            "%s: generation %d has fields %s, the dataset had %s; the manifest lists both",
            out,
            g,
            sorted(fields) or "none",
            list(old.fields) or "none",
        )
    result = Manifest(
        piles=tuple(piles),
        seed=old.seed,
        fields=tuple(sorted(set(fields) | set(old.fields))),
        created_by=old.created_by,
        skipped_units=old.skipped_units + skipped_units,
        split_piles=old.split_piles,
        extra=_extra(old.extra, extra or {}, g),
        generation=g,
        generations={k: t for k, t in generations.items() if k in keep},
    )
    # the generation being replaced stays readable by loaders pinned to it
    keep_copy = storage.join(out, generation_name(old.generation))
    if not storage.exists(keep_copy):
        storage.write_bytes(keep_copy, base.seen)
    install(output, staged, result, names=[os.path.basename(path) for path in staged], keep=True)
    # shared by every append that races to this generation: put in only by the one that won
    for path in first_keys:
        if output.remote:
            storage.upload(path, storage.join(out, os.path.basename(path)))
        else:
            os.replace(path, os.path.join(out, os.path.basename(path)))
    log.info("%s: generation %d adds %d samples in %d segments; %d samples in all", out, g, sum(counts), len(new), result.samples)
    return result


def _extra(old: dict[str, Any], new: dict[str, Any], generation: int) -> dict[str, Any]:
    """The grown dataset's ``extra``: the old one updated with the new generation's; a repeat
    rule's record says which generation it describes."""
    if isinstance(new.get("repeat"), dict):
        new = {**new, "repeat": {**new["repeat"], "generation": generation}}
    return {**old, **new}


def _write_segment(work: tuple[Sequence[Run], int, str, int, str, Pack | None]) -> Segment | None:
    """Assemble one pile's new samples into a segment file in ``staging`` (compressed whole by
    ``pack``), with its key hashes beside it; None when the pile gets no sample."""
    runs, count, name, generation, staging, pack = work
    if not count:
        return None
    path = os.path.join(staging, name)
    crc, packed = assemble_pile(runs, path, pack)
    size = os.path.getsize(path)
    checksum = manifest.format_checksum(crc)
    if packed is None:
        segment = Segment(name=name, samples=count, bytes=size, checksum=checksum, generation=generation)
    else:
        tar_size = sum(run.length for run in runs) + manifest.TRAILER_BYTES
        segment = Segment(
            name=name,
            samples=count,
            bytes=packed.size,
            checksum=manifest.format_checksum(packed.crc),
            generation=generation,
            compression=packed.packer.codec,
            tar_bytes=tar_size,
            tar_checksum=checksum,
        )
    _write_keys(path, Shard(path, _tar(path, segment.info())).keys)
    return segment


def _tar(url: str, info: PileInfo) -> bytes:
    """The tar in the file ``url`` (decompressed when ``info`` says it is compressed)."""
    data = storage.read_bytes(url)
    return data if info.compression is None else compression.decompress(data, info.compression, url, size=info.tar_bytes)


def _hashes(keys: Sequence[str]) -> np.ndarray:
    return key_hashes(np.array([k.encode("utf-8", "surrogateescape") for k in keys], dtype=bytes)).astype(_HASH)


def _write_keys(segment: str, keys: Sequence[str]) -> str:
    path = keys_name(segment)
    with storage.guard(path, "write"), open(path, "wb") as f:
        f.write(np.sort(_hashes(keys)).tobytes())
    return path


def _as_segment(pile: PileInfo) -> list[Segment]:
    """A pile written whole (by pass 1) as generation 0's segment of itself; none when empty."""
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


def _first_keys(out: str, piles: Sequence[PileInfo], staging: str) -> list[str]:
    """Key hashes for piles pass 1 wrote, made once by reading them (the first append only)."""
    if piles:
        log.info("%s: reading the keys of %d piles once, to keep keys unique across generations", out, len(piles))
    staged = []
    for pile in piles:
        url = storage.join(out, pile.name)
        keys = Shard(url, _tar(url, pile)).keys
        staged.append(_write_keys(os.path.join(staging, pile.name), keys))
    return staged


def _check_unique(out: str, old: Sequence[Segment], new: Sequence[Segment], staging: str) -> None:
    """Refuse a key of ``new`` (segments in ``staging``) that an ``old`` segment or another new one has."""
    hashes = [np.fromfile(keys_name(os.path.join(staging, s.name)), dtype=_HASH) for s in new]
    mine = np.sort(np.concatenate([*hashes, np.zeros(0, dtype=_HASH)]))
    repeated = np.unique(mine[1:][mine[1:] == mine[:-1]])
    if len(repeated):
        _confirm(out, repeated, new, new, staging, "this append")
    for segment in old:
        theirs = np.frombuffer(_read_keys(out, segment, staging), dtype=_HASH)
        met = theirs[np.isin(theirs, mine)]
        if len(met):
            _confirm(out, met, [segment], new, staging, f"{segment.name} (generation {segment.generation})")


def _read_keys(out: str, segment: Segment, staging: str) -> bytes:
    """A segment's key hashes: just made in ``staging`` (a pile's first), in the dataset, or (a
    file that went missing: it is only an index) made again from the segment."""
    name = keys_name(segment.name)
    local = os.path.join(staging, name)
    if os.path.exists(local):
        return storage.read_bytes(local)
    url = storage.join(out, name)
    try:
        return storage.read_bytes(url)
    except DatasetNotFoundError:
        data = storage.join(out, segment.name)
        log.info("%s is missing: reading the keys of %s instead", url, data)
        return np.sort(_hashes(Shard(data, _tar(data, segment.info())).keys)).tobytes()


def _confirm(out: str, hashes: np.ndarray, theirs: Sequence[Segment], new: Sequence[Segment], staging: str, where: str) -> None:
    """Compare the keys behind hashes that met (a hash collision is not an error)."""
    mine = _keys_with(hashes, [(os.path.join(staging, s.name), s) for s in new])
    if theirs is new:
        seen: dict[str, str] = {}
        for key, name in mine:
            if key in seen:
                raise SampleError(f"{out}: key {key!r} is in {name} and in {seen[key]}, both written by this append; keys must be unique")
            seen[key] = name
        return
    other = dict(_keys_with(hashes, [(storage.join(out, s.name), s) for s in theirs]))
    for key, name in mine:
        if key in other:
            raise SampleError(
                f"{out}: key {key!r} of this append ({name}) is already in the dataset, in {where}; keys must stay unique "
                "across generations (was this data appended before?); nothing was published"
            )


def _keys_with(hashes: np.ndarray, files: Sequence[tuple[str, Segment]]) -> list[tuple[str, str]]:
    """(key, file name) of every sample of ``files`` (URL, segment) whose key hash is in ``hashes``."""
    found = []
    for url, segment in files:
        keys = Shard(url, _tar(url, segment.info())).keys
        hit = np.isin(_hashes(keys), hashes)
        found += [(keys[i], os.path.basename(url)) for i in np.flatnonzero(hit).tolist()]
    return found


def _times(old: Manifest, out: str) -> dict[int, str]:
    """When each generation of ``old`` was written; a dataset pass 1 wrote has its manifest's time."""
    times = dict(old.generations)
    if 0 not in times and old.generation == 0:
        path = storage.local_path(storage.join(out, manifest.MANIFEST))
        when = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc) if path else None
        times[0] = when.isoformat(timespec="seconds") if when else now()
    return times


def _kept(times: dict[int, str], window: int | str | None, generation: int) -> set[int]:
    """The generations the window keeps (the new one always)."""
    if window is None:
        return set(times)
    if isinstance(window, int):
        return {g for g in times if g > generation - window}
    cutoff = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=parse_duration(window, what="window"))
    return {g for g, t in times.items() if g == generation or datetime.datetime.fromisoformat(t) >= cutoff}


def _span(generations: list[int]) -> str:
    return str(generations[0]) if len(generations) == 1 else f"{generations[0]}..{generations[-1]}"
