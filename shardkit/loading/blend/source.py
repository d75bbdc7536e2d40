"""A blend's sources resolved into one list of piles, and the shape of each of its epochs.

A blend epoch's shape (its length, each source's share, its frame) follows from what the blend
asks for (``wanted``) and the split the epoch *began* on: whole frames of the batch size on
every rank. An epoch resumed on another world size or batch size keeps its shape; what its
phases leave is divided by :mod:`shardkit.loading.elastic` as an order with an open end: a
phase rounds what it splits *up* to whole batches on every rank, reading on into the sources
past the epoch's last position (frames past the last one repeat the schedule's pattern), as
``drop_last=False`` does for a whole epoch. Rounding down would leave positions unread in the
middle of a source's stream, which the next epoch could not start after.

Source ``s`` is read as one endless stream (its epoch 0 order, then its epoch 1 order, ...).
Blend epoch ``e`` starts where epoch ``e - 1`` stopped; without a change of split that is
``e * shares[s]``, and an :class:`Anchor` (from a state) says where an epoch resumed from began.

    source = resolve_blend(Blend({"a": "data/a", "b": "data/b"}, weights={"a": 3, "b": 1}), options)
    rest = source.rest(done, world=4, batch_size=32, drop_last=True)
    frames = source.frames(seed=0, epoch=2, done=done, world=4, batch_size=32, drop_last=True)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from shardkit import manifest, storage
from shardkit.errors import ConfigError, ShardkitError, prefixed
from shardkit.loading import elastic
from shardkit.loading.blend.frames import Frames, apportion, epoch_length, taken_before
from shardkit.loading.blend.spec import Blend
from shardkit.loading.elastic import Phase
from shardkit.loading.options import LoaderOptions
from shardkit.loading.source import Source, at_generation, resolve

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Anchor:
    """Each source's stream position ``start`` when epoch ``epoch`` began, and the phases
    ``done`` of that epoch read before the loader's own (None: ``epoch * shares``, no change)."""

    epoch: int = 0
    start: tuple[int, ...] | None = None
    done: tuple[Phase, ...] = ()


@dataclass(frozen=True)
class BlendedSource(Source):
    """The piles of every source, one list (source ``s``'s piles from ``offsets[s]``), what the
    blend asks of each source per epoch (``wanted``), and the epoch's shape on the loader's own
    split: ``shares[s]`` positions of source ``s`` in each epoch of ``length``.

    ``samples`` is the sum of ``wanted``: like the fingerprint, it does not depend on the split.
    """

    names: tuple[str, ...] = ()
    parts: tuple[Source, ...] = ()
    wanted: tuple[int, ...] = ()
    shares: tuple[int, ...] = ()
    length: int = 0
    spec: Blend | None = None  # what it was resolved from: a state may pin its sources' generations

    @property
    def samples(self) -> int:
        return sum(self.wanted)

    @property
    def offsets(self) -> list[int]:
        return np.concatenate(([0], np.cumsum([len(p.piles) for p in self.parts]))).tolist()

    def fingerprint(self) -> str:
        doc = [[n, p.fingerprint(), p.samples, w] for n, p, w in zip(self.names, self.parts, self.wanted, strict=True)]
        return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:16]

    def shape(self, *, world: int, batch_size: int | None, drop_last: bool) -> tuple[int, list[int]]:
        """Length and shares of an epoch begun on ``world`` ranks of ``batch_size``."""
        length = epoch_length(sum(self.wanted), world=world, frame=batch_size or 1, drop_last=drop_last)
        return length, apportion(self.wanted, length) if length else [0] * len(self.wanted)

    def rest(self, done: Sequence[Phase], *, world: int, batch_size: int | None, drop_last: bool) -> list[elastic.Range]:
        """What ranks of ``world`` and ``batch_size`` split of an epoch after the phases ``done``: its
        unread positions, and positions past its end up to whole batches on every rank."""
        first = done[0] if done else Phase(world, batch_size, ())
        length, _ = self.shape(world=first.world_size, batch_size=first.batch_size, drop_last=drop_last)
        return elastic.rest_for(length, done, world=world, batch_size=batch_size, drop_last=drop_last, open_end=True)

    def frames(self, *, seed: int, epoch: int, done: Sequence[Phase], world: int, batch_size: int | None, drop_last: bool) -> Frames:
        """The schedule of an epoch whose phases ``done`` came first (none: begun on ``world`` and ``batch_size``)."""
        first = done[0] if done else Phase(world, batch_size, ())
        _, shares = self.shape(world=first.world_size, batch_size=first.batch_size, drop_last=drop_last)
        return Frames(tuple(shares), frame=first.batch_size or 1, seed=seed, epoch=epoch)

    def starts(self, anchor: Anchor, epoch: int, *, seed: int, world: int, batch_size: int | None, drop_last: bool) -> np.ndarray:
        """Each source's stream position when ``epoch`` begins, read on ``world`` and ``batch_size``
        from ``anchor`` on (an epoch before the anchor's: as if no split had ever changed)."""
        shares = np.asarray(self.shape(world=world, batch_size=batch_size, drop_last=drop_last)[1], dtype=np.int64)
        if anchor.start is None or epoch < anchor.epoch:
            return epoch * shares
        start = np.asarray(anchor.start, dtype=np.int64)
        if epoch == anchor.epoch:
            return start
        # the anchor's epoch ends where its last phase read on to; the epochs after it are whole
        first = anchor.done[0] if anchor.done else Phase(world, batch_size, ())
        length, _ = self.shape(world=first.world_size, batch_size=first.batch_size, drop_last=drop_last)
        end = elastic.extent(length, anchor.done, world=world, batch_size=batch_size, drop_last=drop_last)
        frames = self.frames(seed=seed, epoch=anchor.epoch, done=anchor.done, world=world, batch_size=batch_size, drop_last=drop_last)
        return start + taken_before(frames, end) + (epoch - anchor.epoch - 1) * shares


def resolve_blend(blend: Blend, options: LoaderOptions, *, generations: Mapping[str, int] | None = None) -> BlendedSource:
    """Each source resolved (at ``generations[name]`` where given, else its latest), and each
    one's positions per epoch for these options (rank, batch).

    Raises:
        ConfigError: two sources are the same dataset, a source with a share holds no samples,
            or the epoch holds no whole batch on every rank.
        DatasetNotFoundError: a pinned generation is gone (its files were deleted).
    """
    assert options.world_size is not None
    parts = []
    pinned = generations or {}
    for name, s in zip(blend.names, blend.sources, strict=True):
        storage.use(s.path, options.storage_options)
        pin = name in pinned and isinstance(s.path, (str, os.PathLike))  # a dataset directory: shards have no generations
        try:
            parts.append(at_generation(os.fspath(s.path), pinned[name]) if pin else resolve(s.path))  # type: ignore[arg-type]
        except ShardkitError as e:  # which source, of several: the same error, named
            prefixed(e, f"blend source {name!r}: ")
            raise
    return blend_of(blend, parts, options)


def blend_of(blend: Blend, parts: Sequence[Source], options: LoaderOptions) -> BlendedSource:
    """The blend of sources already resolved (``parts``, in ``blend``'s order), shaped for these options.

    Raises:
        ConfigError: as :func:`resolve_blend`.
    """
    assert options.world_size is not None
    seen: dict[str, str] = {}
    for name, part in zip(blend.names, parts, strict=True):
        other = seen.setdefault(part.fingerprint(), name)
        if other != name:
            raise ConfigError(
                f"blend: sources {other!r} and {name!r} are the same dataset ({part.name}); list it once, with a larger share"
            )
    wanted = blend.counts([p.samples for p in parts])
    frame = options.batch_size or 1
    length = epoch_length(sum(wanted), world=options.world_size, frame=frame, drop_last=options.drop_last)
    if length == 0:
        raise ConfigError(
            f"blend: an epoch of {sum(wanted)} positions holds no whole batch of {frame} on each of {options.world_size} ranks; "
            "raise the shares or epoch_size, or set drop_last=False"
        )
    shares = apportion(wanted, length)
    if shares != wanted:
        log.info("blend: epoch of %d positions made %d (whole batches on every rank): shares %s", sum(wanted), length, shares)
    piles = tuple(p for part in parts for p in part.piles)
    name = "blend(" + ", ".join(blend.names) + ")"
    found = BlendedSource(
        name, piles, names=tuple(blend.names), parts=tuple(parts), wanted=tuple(wanted), shares=tuple(shares), length=length, spec=blend
    )
    _say_fields(found)
    return found


def _say_fields(source: BlendedSource) -> None:
    """One log line when the sources' manifests list different fields: how batches collate then."""
    fields = {n: manifest.read(p.name).fields for n, p in zip(source.names, source.parts, strict=True) if p.piles and p.piles[0].info}
    if len({tuple(sorted(f)) for f in fields.values()}) > 1:
        shown = "; ".join(f"{n}: {', '.join(sorted(f))}" for n, f in fields.items())
        log.info(
            "blend: the sources hold different fields (%s); a batch holds every field any of its samples has, "
            "with None where a sample lacks it (the default collate)",
            shown,
        )
