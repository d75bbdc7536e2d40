"""Add a generation to a dataset: new samples become segment files of its M piles, published in one manifest.

An append routes each new sample to one of the dataset's M piles, drawn from ``(seed,
generation, unit, ordinal)`` (:mod:`shardkit.piles.router`), exactly as pass 1 routes, so
every sample of every generation is in a uniformly drawn pile and the union is a fresh pass 1's
output. Pile p's new samples are one new immutable file, ``pile-00000p.g<generation>.tar``;
the pile becomes the list of its segments. Nothing written before is touched: the new manifest
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
from shardkit.manifest import Manifest, PileInfo, Segment, generation_name, joined, keys_name
from shardkit.piles.options import PileOptions
from shardkit.piles.output import Output
from shardkit.piles.publish import Run, assemble_pile, install, pile_name
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


def segment_name(pile: int, generation: int, token: str = "") -> str:
    """``pile-000003.g000002.tar``: generation 2's segment of pile 3 (``token`` goes after a dash)."""
    return f"{pile_name(pile).removesuffix('.tar')}.g{generation:06d}{'-' + token if token else ''}.tar"


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
    names = [p.name for p in old.piles]
    if names != [pile_name(p) for p in range(piles)]:
        raise ConfigError(
            f"{out}: its piles were split into sub-piles ({next(n for n in names if n not in {pile_name(p) for p in range(piles)})}, ...); "
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
) -> Manifest:
    """Publish the new generation: each pile's runs become its new segment, the keys are checked
    unique across generations, the window retires old generations, the manifest goes in last.

    Takes the arguments of :func:`shardkit.piles.publish.publish` (``threads`` is unused: a
    segment is one move of a whole part file, or one copy).

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
    for p, pile_runs in enumerate(runs):
        if counts[p]:
            new[p] = _write_segment(pile_runs, counts[p], segment_name(p, g, token), g, staging)
            staged += [os.path.join(staging, new[p].name), os.path.join(staging, keys_name(new[p].name))]
        if progress is not None:
            progress(1)
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
        extra={**old.extra, **(extra or {})},
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


def _write_segment(runs: Sequence[Run], count: int, name: str, generation: int, staging: str) -> Segment:
    """Assemble one pile's new samples into a segment file in ``staging``, with its key hashes beside it."""
    path = os.path.join(staging, name)
    crc = assemble_pile(runs, path)
    size = os.path.getsize(path)
    _write_keys(path, Shard(path, storage.read_bytes(path)).keys)
    return Segment(name=name, samples=count, bytes=size, checksum=manifest.format_checksum(crc), generation=generation)


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
    return [Segment(name=pile.name, samples=pile.samples, bytes=pile.bytes, checksum=pile.checksum, generation=0)]


def _first_keys(out: str, piles: Sequence[PileInfo], staging: str) -> list[str]:
    """Key hashes for piles pass 1 wrote, made once by reading them (the first append only)."""
    if piles:
        log.info("%s: reading the keys of %d piles once, to keep keys unique across generations", out, len(piles))
    staged = []
    for pile in piles:
        url = storage.join(out, pile.name)
        keys = Shard(url, storage.read_bytes(url)).keys
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
        url = storage.join(out, keys_name(segment.name))
        theirs = np.frombuffer(_read_keys(url, staging), dtype=_HASH)
        met = theirs[np.isin(theirs, mine)]
        if len(met):
            _confirm(out, met, [segment], new, staging, f"{segment.name} (generation {segment.generation})")


def _read_keys(url: str, staging: str) -> bytes:
    """A segment's key hashes: just made in ``staging`` (a pile's first), in the dataset, or (a
    file that went missing: it is only an index) made again from the segment."""
    local = os.path.join(staging, os.path.basename(url))
    if os.path.exists(local):
        return storage.read_bytes(local)
    try:
        return storage.read_bytes(url)
    except DatasetNotFoundError:
        segment = url.removesuffix(".keys") + ".tar"
        log.info("%s is missing: reading the keys of %s instead", url, segment)
        return np.sort(_hashes(Shard(segment, storage.read_bytes(segment)).keys)).tobytes()


def _confirm(out: str, hashes: np.ndarray, theirs: Sequence[Segment], new: Sequence[Segment], staging: str, where: str) -> None:
    """Compare the keys behind hashes that met (a hash collision is not an error)."""
    mine = _keys_with(hashes, [os.path.join(staging, s.name) for s in new])
    if theirs is new:
        seen: dict[str, str] = {}
        for key, name in mine:
            if key in seen:
                raise SampleError(f"{out}: key {key!r} is in {name} and in {seen[key]}, both written by this append; keys must be unique")
            seen[key] = name
        return
    other = dict(_keys_with(hashes, [storage.join(out, s.name) for s in theirs]))
    for key, name in mine:
        if key in other:
            raise SampleError(
                f"{out}: key {key!r} of this append ({name}) is already in the dataset, in {where}; keys must stay unique "
                "across generations (was this data appended before?); nothing was published"
            )


def _keys_with(hashes: np.ndarray, urls: Sequence[str]) -> list[tuple[str, str]]:
    """(key, file name) of every sample of ``urls`` whose key hash is in ``hashes``."""
    found = []
    for url in urls:
        keys = Shard(url, storage.read_bytes(url)).keys
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
