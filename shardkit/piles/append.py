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

A pile that grows past ``max_pile_bytes`` is split into random leaves by each sample's keyed
draw (:mod:`shardkit.piles.leaves`): segments already fine enough are regrouped as they are,
coarser ones are rewritten once into finer files (a pile doubles before it is rewritten
again), and the first epoch over the window stays an exactly uniform permutation. The piles of
a dataset pass 1 split into sub-piles are such segments too.

Keys stay unique across generations without reading the old data: beside each segment,
``<segment>.keys`` holds the sorted 64-bit hashes of its keys, and the new keys' hashes are
compared with them; only a hash that meets one is read back to compare the keys themselves. A
keys file missing, or damaged in a way seen without the segment (not 8 bytes a sample, not
sorted), is made again from its segment and put back; one of the right size and order is
trusted, since comparing it would read the old data (``shardkit verify`` compares each).

    base = start(txn, options)           # in an append's transaction; None unless options.mode == "append"
    result = finish(base, txn, runs, counts, options=options, fields=fields, staging=staging)
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit import manifest, storage
from shardkit.dataset.transaction import Transaction
from shardkit.errors import ConfigError, DatasetNotFoundError, SampleError, ShardkitError
from shardkit.manifest import Manifest, PileInfo, Segment, joined, keys_name, leaf_name
from shardkit.piles import classes as class_maps
from shardkit.piles import leaves, router
from shardkit.piles.leaves import HASH, Names, segments_by_pile
from shardkit.piles.options import PileOptions
from shardkit.piles.pack import Pack
from shardkit.piles.publish import LIMIT, Mapper, Run, assemble_pile, capacity, limit_record, map_threads
from shardkit.tar.shard import Shard

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Base:
    """The dataset an append adds to, and the generation it writes."""

    manifest: Manifest
    generation: int


def start(txn: Transaction, options: PileOptions) -> Base | None:
    """The dataset the transaction ``txn`` appends to, checked against ``options``; None unless ``options.mode`` is ``"append"``.

    Raises:
        ConfigError: ``piles`` or ``seed`` is not the dataset's (both values named), or a pile
            of it is not named after one of its piles (not a dataset pass 1 wrote).
    """
    if options.mode != "append" or txn.base is None:
        return None
    out, old = txn.path, txn.base
    if old.extra.get("kind") == "shuffled":  # shards in one shuffled order, not piles: said first, not after two other refusals
        raise ConfigError(
            f"{out}: a dataset shardkit shuffle wrote (shards in one shuffled order), and an append adds to datasets pass 1 "
            "wrote (shardkit pile, PileWriter, preprocess): write the new samples elsewhere, or shuffle them all anew"
        )
    piles = manifest.original_piles(old)
    if piles != options.piles:
        raise ConfigError(
            f"piles: {out} has {piles} piles, this append asks for {options.piles}; an append writes into the dataset's piles, "
            f"so pass piles={piles}"
        )
    if old.seed != options.seed:
        raise ConfigError(f"seed: {out} was written with seed={old.seed}, this append has seed={options.seed}; pass seed={old.seed}")
    segments_by_pile(old, piles, out)  # each pile, sub-pile or leaf must belong to one of the M piles
    return Base(old, txn.generation)


def finish(
    base: Base,
    txn: Transaction,
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
    """Publish the new generation: each pile's runs become its new segments, the keys are checked
    unique across generations, the window retires old generations, piles over
    ``max_pile_bytes`` are split into leaves, the manifest goes in last.

    Takes the arguments of :func:`shardkit.piles.publish.publish`. Segments are written here, on
    ``threads`` threads (``mapper`` is not used: with ``executor="ray"`` the driver writes them).
    With ``options.compression`` each segment (new or rewritten) is compressed whole. The new
    generation's ``extra["repeat"]`` (a repeat rule's record) names its generation.

    Raises:
        SampleError: a new key is already in the dataset (one twice in this append was refused before, by pass 1 or the writer).
        DatasetExistsError: the manifest changed while the job ran (another writer).
        CorruptShardError: a segment to be rewritten is not what the manifest says.
    """
    old, g = base.manifest, base.generation
    out, output = txn.path, txn.output
    assert output is not None
    options = _with_limit(options, old)
    if options.window is not None and not sum(counts):  # every unit skipped or empty: it must not push real ones out
        why = f"{out}: generation {g} adds no sample ({skipped_units} input units skipped), so the window ({options.window})"
        log.warning("%s retires no generation for it", why)
    generations, keep = txn.advance(options.window if sum(counts) else None)
    kept = [[s for s in segments if s.generation in keep] for segments in segments_by_pile(old, len(runs), out)]
    resolutions = _resolutions(kept, runs, counts, options.max_bytes)
    pack = Pack.of(options)
    # an object store has no lock: two appends may race to one generation, and the loser must not
    # replace (then delete) the winner's objects, so there each job's segment names are its own
    names = Names(set(storage.listdir(out)), output.token[:8] if output.remote else "", None if pack is None else pack.codec)
    work = [(runs[p], counts[p], resolutions[p], names.of(p, g, resolutions[p]), g, staging, pack, old.seed) for p in range(len(runs))]
    new = map_threads(_write_segments, work, threads, progress)
    first = [p for p in old.piles if p.segments is None and p.samples and 0 in keep]
    first_keys = _first_keys(out, first, staging)
    prefixed = (extra or {}).get("key_prefix") == "unit"
    remade = _check_unique(out, [s for segments in kept for s in segments], [s for made in new for s in made], staging, prefixed=prefixed)
    grouped = [_regroup(out, p, kept[p], resolutions[p], names, staging, pack, old.seed) for p in range(len(runs))]
    piles = []
    for p, (by_leaf, _) in enumerate(grouped):
        k = resolutions[p]
        for segment in new[p]:
            by_leaf[segment.leaf].append(segment)
        # an empty leaf is left out; pile p keeps one entry (maybe empty) so the dataset's M stays readable
        piles += [joined(by_leaf[j], leaf_name(p, k, j)) for j in range(k) if by_leaf[j] or k == 1]
    staged = [
        os.path.join(staging, path)
        for segment in [*(s for made in new for s in made), *(s for _, rewritten in grouped for s in rewritten)]
        for path in (segment.name, keys_name(segment.name))
    ]
    _log_changes(out, g, old, sorted(set(generations) - keep), fields, resolutions, grouped, counts, options)
    over = _over_limit(out, piles, options.max_bytes)
    result = Manifest(
        piles=tuple(piles),
        seed=old.seed,
        fields=tuple(sorted(set(fields) | set(old.fields))),
        created_by=old.created_by,
        skipped_units=old.skipped_units + skipped_units,
        split_piles=sum(k > 1 for k in resolutions),
        extra=_extra(old.extra, limit_record(extra, options), g, over),
        generation=g,
        generations={k: t for k, t in generations.items() if k in keep},
    )
    # the generation being replaced stays readable by loaders pinned to it (the transaction keeps its manifest)
    txn.commit(staged, result, names=[os.path.basename(path) for path in staged], keep=True, index=options.index)
    # shared by every append that races to this generation: put in only by the one that won. The
    # manifest is in, and a keys file missing is read from its pile (_read_keys): one that cannot
    # be put in is logged, not an error that would make a published append look failed. A keys
    # file made again goes back in while its segment stays listed (a rewritten one leaves)
    listed = set(result.files())
    for path in [*first_keys, *(p for p in remade if os.path.basename(p) in listed)]:
        try:
            output.store.upload(os.path.basename(path), path)
        except ShardkitError as e:
            log.warning(
                "%s: generation %d is published, but %s was not put in (%s); the next append reads the keys from its pile and puts it in",
                out,
                g,
                os.path.basename(path),
                e,
            )
    log.info("%s: generation %d adds %d samples in %d segments; %d samples in all", out, g, sum(counts), sum(map(len, new)), result.samples)
    return result


def _resolutions(kept: Sequence[Sequence[Segment]], runs: Sequence[Sequence[Run]], counts: Sequence[int], limit: int | None) -> list[int]:
    """The leaves each pile is split into: from its count and the capacity of the dataset-wide
    totals (never from which samples it holds, nor from when they came: that keeps the first
    epoch exactly uniform)."""
    samples = sum(s.samples for segments in kept for s in segments) + sum(counts)
    body = sum(s.tar_size - manifest.TRAILER_BYTES for segments in kept for s in segments)
    most = capacity(limit, samples, body + sum(run.length for pile in runs for run in pile))
    return [router.resolution(sum(s.samples for s in segments) + count, most) for segments, count in zip(kept, counts, strict=True)]


def _regroup(
    out: str, pile: int, kept: Sequence[Segment], resolution: int, names: Names, staging: str, pack: Pack | None, seed: int
) -> tuple[list[list[Segment]], list[Segment]]:
    """Pile ``pile``'s kept segments by leaf at ``resolution``, and the segments rewritten (into
    ``staging``) from those coarser than it, one generation at a time (one file per leaf each)."""
    by_leaf: list[list[Segment]] = [[] for _ in range(resolution)]
    coarse: dict[int, list[Segment]] = {}
    for segment in kept:
        j = leaves.place(segment, resolution)
        if j is None:
            coarse.setdefault(segment.generation, []).append(segment)
        else:
            by_leaf[j].append(segment)
    rewritten: list[Segment] = []
    for generation, segments in sorted(coarse.items()):
        rewritten += leaves.rewrite(
            [storage.join(out, s.name) for s in segments],
            segments,
            seed=seed,
            resolution=resolution,
            name=names.of(pile, generation, resolution),
            staging=staging,
            pack=pack,
        )
    for piece in rewritten:
        by_leaf[piece.leaf].append(piece)
    for segments in by_leaf:  # oldest first, as a pile's segments always were
        segments.sort(key=lambda s: s.generation)
    return by_leaf, rewritten


def _log_changes(
    out: str,
    g: int,
    old: Manifest,
    retired: list[int],
    fields: set[str],
    resolutions: Sequence[int],
    grouped: Sequence[tuple[list[list[Segment]], list[Segment]]],
    counts: Sequence[int],
    options: PileOptions,
) -> None:
    """Say what this append changed besides adding samples: leaves, rewrites, the window, fields."""
    for p, (_, rewritten) in enumerate(grouped):
        if rewritten:
            log.info(
                "%s: pile %d is split into %d leaves: %d samples rewritten into %d segment files (%d bytes of tar)",
                out,
                p,
                resolutions[p],
                sum(s.samples for s in rewritten),
                len(rewritten),
                sum(s.tar_size for s in rewritten),
            )
    moved = [s for _, rewritten in grouped for s in rewritten]
    if any(k > 1 for k in resolutions):
        log.info(
            "%s: generation %d: %d piles are split into leaves (up to %d); %d bytes of old segments rewritten for it, "
            "%d samples (of %d new)",
            out,
            g,
            sum(k > 1 for k in resolutions),
            max(resolutions),
            sum(s.tar_size for s in moved),
            sum(s.samples for s in moved),
            sum(counts),
        )
    if old.split_piles and options.max_bytes is None:
        log.warning(
            "%s: the dataset had %d piles split into sub-piles, and this append has no max_pile_bytes, so it joins them back into "
            "whole piles (nothing is rewritten); pass the max_pile_bytes the dataset was written with to keep them split",
            out,
            old.split_piles,
        )
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


def _over_limit(out: str, piles: Sequence[PileInfo], limit: int | None) -> list[dict[str, Any]]:
    """The piles over ``limit`` after the split, as ``extra["over_max_pile_bytes"]`` lists them; logged."""
    over = sorted((p for p in piles if limit is not None and p.tar_size > limit), key=lambda p: -p.tar_size)
    if over:
        log.warning(
            "%s: %d piles are over max_pile_bytes=%d after this append (the largest, %s, holds %d bytes of tar): piles are split "
            "by sample count alone and each sample's leaf is drawn at random, which keeps the first epoch uniform, so a leaf may "
            "hold more than its share of samples, or samples larger than average; a loader needs max_pile_bytes=%d",
            out,
            len(over),
            limit,
            over[0].name,
            over[0].tar_size,
            over[0].tar_size,
        )
    return [{"name": p.name, "bytes": p.tar_size} for p in over]


def _with_limit(options: PileOptions, old: Manifest) -> PileOptions:
    """``options``, with the ``max_pile_bytes`` the dataset was written with when they give none:
    an append that forgot it keeps the dataset's piles split, not joined back into whole ones."""
    recorded = old.extra.get(LIMIT)
    if options.max_bytes is not None or not isinstance(recorded, int) or isinstance(recorded, bool) or recorded < 1:
        return options
    log.info("max_pile_bytes: none given, the dataset's %d is used", recorded)
    return dataclasses.replace(options, max_pile_bytes=recorded)


def _extra(old: dict[str, Any], new: dict[str, Any], generation: int, over: list[dict[str, Any]]) -> dict[str, Any]:
    """The grown dataset's ``extra``: the old one updated with the new generation's; a repeat
    rule's record says which generation it describes, ``over_max_pile_bytes`` which piles are
    over the limit now."""
    if class_maps.CLASSES in new:  # the write-time check (preprocess made it under the lock already, before any work)
        class_maps.appended(old, new[class_maps.CLASSES], "append")
    if isinstance(new.get("repeat"), dict):
        new = {**new, "repeat": {**new["repeat"], "generation": generation}}
    grown = {**old, **new, "over_max_pile_bytes": over}
    if not over:
        del grown["over_max_pile_bytes"]
    return grown


def _write_segments(work: tuple[Sequence[Run], int, int, Callable[[int], str], int, str, Pack | None, int]) -> list[Segment]:
    """Write one pile's new samples as segment files in ``staging`` (compressed whole by
    ``pack``), with their key hashes beside them: one file, or one per leaf at ``resolution``
    when the pile is split (leaf j's named ``name(j)``); none when the pile gets no sample."""
    runs, count, resolution, name, generation, staging, pack, seed = work
    if not count:
        return []
    if resolution > 1:
        return leaves.split_runs(
            runs, count, seed=seed, resolution=resolution, name=name, generation=generation, staging=staging, pack=pack
        )
    path = os.path.join(staging, name(0))
    crc, packed = assemble_pile(runs, path, pack)
    size = storage.size(path)
    checksum = manifest.format_checksum(crc)
    if packed is None:
        segment = Segment(name=os.path.basename(path), samples=count, bytes=size, checksum=checksum, generation=generation)
    else:
        tar_size = sum(run.length for run in runs) + manifest.TRAILER_BYTES
        segment = Segment(
            name=os.path.basename(path),
            samples=count,
            bytes=packed.size,
            checksum=manifest.format_checksum(packed.crc),
            generation=generation,
            compression=packed.packer.codec,
            tar_bytes=tar_size,
            tar_checksum=checksum,
        )
    leaves.write_keys(path, leaves.hashes(Shard(path, leaves.read_tar(path, segment)).keys))
    return [segment]


def _first_keys(out: str, piles: Sequence[PileInfo], staging: str) -> list[str]:
    """Key hashes for piles pass 1 wrote, made once by reading them (the first append only)."""
    if piles:
        log.info("%s: reading the keys of %d piles once, to keep keys unique across generations", out, len(piles))
    staged = []
    for pile in piles:
        url = storage.join(out, pile.name)
        keys = Shard(url, leaves.read_tar(url, pile)).keys
        staged.append(leaves.write_keys(os.path.join(staging, pile.name), leaves.hashes(keys)))
    return staged


def _check_unique(out: str, old: Sequence[Segment], new: Sequence[Segment], staging: str, *, prefixed: bool = False) -> list[str]:
    """Refuse a key of ``new`` (segments in ``staging``) that an ``old`` segment has (``prefixed``:
    this append's keys carry their input shard's name, which the message explains). Two new
    samples with one key were refused before, where pass 1 or the writer checks every pile.
    Returns the keys files of old segments made again in ``staging`` (see :func:`_read_keys`)."""
    hashes = [np.fromfile(keys_name(os.path.join(staging, s.name)), dtype=HASH) for s in new]
    mine = np.concatenate([*hashes, np.zeros(0, dtype=HASH)])
    made = []
    for segment in old:
        found, again = _read_keys(out, segment, staging)
        theirs = np.frombuffer(found, dtype=HASH)
        if again:
            made.append(keys_name(os.path.join(staging, segment.name)))
        met = theirs[np.isin(theirs, mine)]
        if len(met):
            _confirm(out, met, [segment], new, staging, f"{segment.name} (generation {segment.generation})", prefixed=prefixed)
    return made


def _read_keys(out: str, segment: Segment, staging: str) -> tuple[bytes, bool]:
    """A segment's key hashes, and whether they were made again: just made in ``staging`` (a
    pile's first), in the dataset, or (a file that went missing, or is damaged in a way seen
    without the segment: not one hash a sample, not sorted; it is only an index) made again from
    the segment into ``staging``, to be put in once the new generation is published."""
    name = keys_name(segment.name)
    local = os.path.join(staging, name)
    if storage.exists(local):
        return storage.read_bytes(local), False
    url = storage.join(out, name)
    data = storage.join(out, segment.name)
    try:
        found = storage.read_bytes(url)
    except DatasetNotFoundError:
        log.info("%s is missing: reading the keys of %s instead, and writing it again", url, data)
    else:
        damage = leaves.keys_damage(found, segment.samples)
        if damage is None:
            return found, False
        # not what an append wrote (torn, emptied, scrambled): a hash it lacks would let a repeated key through unseen
        log.warning("%s: %s: reading the keys of %s instead, and writing it again", url, damage, data)
    made = np.sort(leaves.hashes(Shard(data, leaves.read_tar(data, segment)).keys))
    leaves.write_keys(os.path.join(staging, segment.name), made)
    return made.tobytes(), True


def _confirm(
    out: str, hashes: np.ndarray, theirs: Sequence[Segment], new: Sequence[Segment], staging: str, where: str, *, prefixed: bool = False
) -> None:
    """Compare the keys behind hashes that met (a hash collision is not an error)."""
    mine = _keys_with(hashes, [(os.path.join(staging, s.name), s) for s in new])
    other = dict(_keys_with(hashes, [(storage.join(out, s.name), s) for s in theirs]))
    for key, _ in mine:
        if key in other:
            raise SampleError(f"{out}: key {key!r} of this append is already in the dataset, in {where}; {_why_repeated(key, prefixed)}")


def _why_repeated(key: str, prefixed: bool) -> str:
    """What to do about a key an append repeats: the two ways it happens, and the way out of each."""
    said = "keys must stay unique across generations, so nothing was published. Either this data was appended before"
    if prefixed:
        shard = key.split("/", 1)[0]  # the prefix is a shard's name, which holds no slash
        return (
            f"{said}, or its input shards are named like earlier ones: each key starts with its shard's name "
            f"({shard!r}, key_prefix='unit'), so new shards need names of their own (a date or a source in each file's name)"
        )
    return f"{said}, or its keys restart like an earlier input's: give each sample a unique '__key__', or prefix keys with their shard's name (key_prefix='unit')"


def _keys_with(hashes: np.ndarray, files: Sequence[tuple[str, Segment]]) -> list[tuple[str, str]]:
    """(key, file name) of every sample of ``files`` (URL, segment) whose key hash is in ``hashes``."""
    found = []
    for url, segment in files:
        keys = Shard(url, leaves.read_tar(url, segment)).keys
        hit = np.isin(leaves.hashes(keys), hashes)
        found += [(keys[i], os.path.basename(url)) for i in np.flatnonzero(hit).tolist()]
    return found


def _span(generations: list[int]) -> str:
    return str(generations[0]) if len(generations) == 1 else f"{generations[0]}..{generations[-1]}"
