"""The blend loader: several datasets read as one, each through its own epoch plan, mixed per batch.

Each source is read through its own pile plan (:class:`~shardkit.loading.plan.EpochOrder`, the
same seed as the blend), as an endless stream: its epoch 0 order, then its epoch 1 order, and so
on. Each blend epoch takes the next stretch of every source's stream (its share of the epoch),
so a source that gives fewer samples than it holds continues where it stopped in the next blend
epoch, one that gives more runs on into its next permutation, and no sample of a source comes
twice before all of it was read. Which source fills each position is
:mod:`~shardkit.loading.blend.frames`'s schedule, a pure function of (seed, epoch, shares, batch size):
every batch holds each source's share to within one sample.

Ranks split the positions of a blend epoch as :mod:`~shardkit.loading.elastic` splits any
epoch, so a state resumes on another world size, batch size or number of DataLoader workers
(:mod:`~shardkit.loading.blend.source` says how the rest of such an epoch is shaped). The piles
of all sources are one list for the loader's reader, so prefetch, ``mix``, workers, ``on_error``
and resume work as for one dataset. Memory: about ``mix + 1`` piles per source being read plus
``prefetch``.

    with shardkit.loader({"web": "data/web", "code": "data/code"}, weights={"web": 0.7, "code": 0.3},
                         batch_size=256) as loader:
        for batch in loader: ...
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from shardkit.errors import ConfigError
from shardkit.loading.blend.schedule import BlendSchedule
from shardkit.loading.blend.source import Anchor, BlendedSource, resolve_blend
from shardkit.loading.blend.spec import Blend, BlendSource
from shardkit.loading.elastic import Phase, Range
from shardkit.loading.loader import Loader
from shardkit.loading.loader import loader as plain_loader
from shardkit.loading.options import LoaderOptions, resolve_world
from shardkit.loading.state import (
    bounded,
    check_done,
    check_epoch,
    check_format,
    check_identity,
    check_order,
    check_position,
    check_split,
    make_state,
)
from shardkit.option_fields import from_call

log = logging.getLogger(__name__)

FORMAT = "shardkit.blend"
# the furthest stream position a state may start a source at: int64 with room for epochs after it
MAX_START = 1 << 56
# version 2 adds "done" (the phases of the epoch read before a change of split) and each
# source's "start" (its stream position when the epoch began) and "wanted"; a version 1 state
# (taken before a blend could change split) reads as one with none
VERSION = 2
READS = (1, 2)


class BlendLoader(Loader):
    """A :class:`shardkit.Loader` over a :class:`shardkit.Blend`; see :func:`shardkit.loader`.

    Example:
        loader = shardkit.loader({"a": "data/a", "b": "data/b"}, weights={"a": 3, "b": 1}, batch_size=64)
        state = loader.state_dict()       # holds each source's position
        shardkit.loader({"a": "data/a", "b": "data/b"}, weights={"a": 3, "b": 1}, batch_size=64).load_state_dict(state)
    """

    source: BlendedSource

    def __init__(self, blend: Blend | BlendedSource, options: LoaderOptions) -> None:
        rank, world = resolve_world(options.rank, options.world_size)
        options = replace(options, rank=rank, world_size=world)
        super().__init__(blend if isinstance(blend, BlendedSource) else resolve_blend(blend, options), options)
        self._anchor = Anchor()  # where the epoch a state resumed began, in every source's stream

    def _starts(self, epoch: int) -> np.ndarray:
        o = self.options
        assert o.world_size is not None
        return self.source.starts(self._anchor, epoch, seed=o.seed, world=o.world_size, batch_size=o.batch_size, drop_last=o.drop_last)

    def _over(self, epoch: int, done: Sequence[Phase], ranges: Sequence[Range], world: int, batch_size: int | None) -> BlendSchedule:  # type: ignore[override]
        o = self.options
        frames = self.source.frames(seed=o.seed, epoch=epoch, done=done, world=world, batch_size=batch_size, drop_last=o.drop_last)
        return BlendSchedule(self.source, frames, self._starts(epoch), ranges, o)

    def state_dict(self) -> dict[str, Any]:
        """This rank's position (see :meth:`shardkit.Loader.state_dict`), with each source's
        stream position when the epoch began (``start``) and where this rank stands in it."""
        epoch, position, done = self._point()
        o = self.options
        state = make_state(epoch=epoch, position=position, options=o, dataset=self._fingerprint, samples=self.source.samples, done=done)
        state.update(format=FORMAT, version=VERSION)
        sched = self._over(epoch, done, self._ranges(done), o.world_size, o.batch_size)  # type: ignore[arg-type]
        at = sched.stream_at(sched.global_at(position))
        state["sources"] = source_fields(self.source, sched.start.tolist())
        for name, part, p in zip(self.source.names, self.source.parts, at.tolist(), strict=True):
            # where this rank stands in each source's stream (for a reader: not read back)
            state["sources"][name].update(epoch=int(p) // part.samples, position=int(p) % part.samples)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a blend ``state``: the next iteration yields the rest of that epoch.

        The state may come from another world size, batch size or number of ``shardkit.torch``
        DataLoader workers, and from several changes in one epoch. What holds then:

        * the rest of the epoch is every position of it no rank had read, each once, split in
          equal shares among this job's ranks; it is rounded *up* to whole batches on every rank
          (whatever ``drop_last``) by reading on into the sources, and the next epoch starts
          where each source stopped, so no sample of a source comes twice before all of it
          was read, and none is skipped;
        * the order of the rest is a pure function of the state, which grows by a few integers
          per change;
        * the mixture: while every phase keeps the batch size the epoch began with (any world
          sizes and workers), every batch of the rest is a whole batch of the epoch's schedule,
          holding each source's share to within one sample. Once a phase has another batch
          size, a batch is a stretch of that schedule cut across its batches (and across what
          other ranks had read): its whole batches are within one sample, the parts at its ends
          are random draws, so a source may be off by a few samples in a batch; over the rest
          of the epoch every source still gives exactly its unread positions.

        Raises:
            ConfigError: the state is malformed, or was taken on other sources, shares or order
                options (each difference is named).
        """
        state = check_format(state, FORMAT, READS, "shardkit blend")
        start = check_sources(
            state, self.source, drop_last=self.options.drop_last, legacy=state["version"] == 1
        )  # first: a difference is named by source
        if state["version"] == 1:  # its fingerprint was of its split too; the sources matched
            check_order(state, self.options)
        else:
            check_identity(state, options=self.options, dataset=self._fingerprint, samples=self.source.samples, name=self.source.name)
        resume = check_position(state, options=self.options, rest=self.source.rest)
        anchor = Anchor(resume.epoch, start, resume.done)
        if resume.epoch != state["epoch"]:  # the state's phase had read all it split: the next epoch follows on
            world, batch = check_split(state)
            done, _ = check_done(state, rest=self.source.rest, world=world, batch_size=batch, drop_last=self.options.drop_last)
            o, taken = self.options, Anchor(state["epoch"], start, done)
            following = self.source.starts(taken, resume.epoch, seed=o.seed, world=world, batch_size=batch, drop_last=o.drop_last)
            anchor = Anchor(resume.epoch, tuple(following.tolist()))
        self._resume(resume)
        self._anchor = anchor


def check_sources(state: dict[str, Any], source: BlendedSource, *, drop_last: bool, legacy: bool = False) -> tuple[int, ...]:
    """Each source's stream position when the state's epoch began, once the state's sources are
    ``source``'s (the first difference named by source). ``legacy``: a version 1 blend state,
    which records each source's share on its own split and no start."""
    taken = state.get("sources")
    if not isinstance(taken, dict) or sorted(taken) != sorted(source.names):
        shown = sorted(taken) if isinstance(taken, dict) else taken
        raise ConfigError(f"load_state_dict: the state was taken on sources {shown!r}, this blend has {sorted(source.names)}")
    epoch = check_epoch(state)
    if legacy:  # its epoch began on its own split
        world, batch = check_split(state)
        asked = ("share", source.shape(world=world, batch_size=batch, drop_last=drop_last)[1])
    else:
        asked = ("wanted", list(source.wanted))
    starts = []
    for name, part, count in zip(source.names, source.parts, asked[1], strict=True):
        theirs = taken[name] if isinstance(taken[name], dict) else {}
        for field, ours in (("dataset", part.fingerprint()), ("samples", part.samples), (asked[0], count)):
            if theirs.get(field) != ours:
                raise ConfigError(
                    f"load_state_dict: source {name!r}: the state has {field}={theirs.get(field)!r}, this blend has {field}={ours!r}"
                )
        start = epoch * count if legacy else theirs.get("start")
        # a stream position: numpy holds it as int64, with room for the epoch's positions after it
        starts.append(
            bounded(f"load_state_dict: sources[{name!r}].start", start, low=0, most=MAX_START, why="int64, with room for epochs after it")
        )
    return tuple(starts)


def source_fields(source: BlendedSource, starts: Sequence[int]) -> dict[str, dict[str, Any]]:
    """What a state records of each source: what identifies it, and its stream position when the epoch began."""
    return {
        name: {"dataset": part.fingerprint(), "samples": part.samples, "wanted": wanted, "start": int(start)}
        for name, part, wanted, start in zip(source.names, source.parts, source.wanted, starts, strict=True)
    }


def is_blend(source: Any) -> bool:
    """Whether ``source`` names several datasets (a Blend, a mapping, or a list of named sources)."""
    if isinstance(source, (Blend, Mapping)):
        return True
    return (
        isinstance(source, Sequence) and not isinstance(source, (str, bytes)) and any(isinstance(s, (BlendSource, Mapping)) for s in source)
    )


def loader(source: Any, *, weights: Mapping[str, float] | None = None, epoch_size: int | None = None, **options: Any) -> Loader:
    """Read one dataset, or blend several (see :func:`shardkit.loading.loader.loader` for every option).

    Args:
        source: one dataset (a directory, shard URLs or a pattern), or a blend: a
            :class:`shardkit.Blend`, ``{name: path}`` with ``weights=``, ``{name: {"path": ...,
            "weight" | "count" | "repeat": ...}}``, or a list of such mappings with a ``"name"``.
        weights: ``{name: share}`` for every source of a blend: each source's share of every epoch
            and of every batch (within one sample).
        epoch_size: positions per blend epoch when weights are used (default: all sources' samples).
        **options: the loader options (``batch_size``, ``seed``, ``options=`` ...).

    Example:
        shardkit.loader({"web": "data/web", "code": "s3://b/code"}, weights={"web": 0.7, "code": 0.3}, batch_size=256)
    """
    if not is_blend(source) and weights is None and epoch_size is None:
        return plain_loader(source, **options)
    blend = Blend(source, weights=weights, epoch_size=epoch_size)
    given = options.pop("options", None)
    if isinstance(options.get("cache_dir"), os.PathLike):
        options["cache_dir"] = os.fspath(options["cache_dir"])
    unknown = set(options) - set(inspect.signature(plain_loader).parameters)
    if unknown:
        raise ConfigError(f"{sorted(unknown)[0]}: not a loader option")
    return BlendLoader(blend, from_call(LoaderOptions, given, options))


loader.__signature__ = inspect.signature(plain_loader).replace(  # type: ignore[attr-defined]
    parameters=[
        *inspect.signature(plain_loader).parameters.values(),
        inspect.Parameter("weights", inspect.Parameter.KEYWORD_ONLY, default=None),
        inspect.Parameter("epoch_size", inspect.Parameter.KEYWORD_ONLY, default=None),
    ]
)
