"""A blend's epochs: each one's schedule over its sources' streams, and what a resume state records of them.

Each blend epoch takes the next stretch of every source's endless stream
(:mod:`~shardkit.loading.blend.source`), mixed by :mod:`~shardkit.loading.blend.frames`'s
schedule. A blend state is a loader state with each source's identity and its stream position
when the epoch began; an :class:`~shardkit.loading.blend.source.Anchor` keeps where the epoch a
state resumed began, so the epochs after it follow on from there.

    epochs = BlendEpochs(resolve_blend(blend, options), options)
    schedule = epochs.schedule(0, (), [(0, 512)], world=1, batch_size=64)
    found = epochs.save(Position(0, Phase(1, 64, (128,))))
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from shardkit.errors import ConfigError
from shardkit.loading import state
from shardkit.loading.blend.schedule import BlendSchedule
from shardkit.loading.blend.source import Anchor, BlendedSource, resolve_blend
from shardkit.loading.elastic import Phase, Range
from shardkit.loading.epochs import on_split, rank_ranges
from shardkit.loading.options import LoaderOptions
from shardkit.loading.position import Position
from shardkit.loading.state import bounded, check_epoch, check_split

log = logging.getLogger(__name__)

# the furthest stream position a state may start a source at: int64 with room for epochs after it
MAX_START = 1 << 56


class BlendEpochs:
    """The epochs of a blend read with ``options``; see the module docstring.

    Example:
        epochs = BlendEpochs(source, options)
        position = epochs.resume(epochs.load(state), workers=1)   # the epochs after it follow on from it
    """

    def __init__(self, source: BlendedSource, options: LoaderOptions) -> None:
        self.source, self.options = source, options
        self.fingerprint = source.fingerprint()
        self.anchor = Anchor()  # where the epoch a state resumed began, in every source's stream

    def starts(self, epoch: int) -> np.ndarray:
        """Each source's stream position when ``epoch`` begins."""
        o = self.options
        assert o.world_size is not None
        return self.source.starts(self.anchor, epoch, seed=o.seed, world=o.world_size, batch_size=o.batch_size, drop_last=o.drop_last)

    def schedule(self, epoch: int, done: Sequence[Phase], ranges: Sequence[Range], *, world: int, batch_size: int | None) -> BlendSchedule:
        o = self.options
        frames = self.source.frames(seed=o.seed, epoch=epoch, done=done, world=world, batch_size=batch_size, drop_last=o.drop_last)
        return BlendSchedule(self.source, frames, self.starts(epoch), ranges, o)

    def save(self, position: Position, *, torch: bool = False) -> dict[str, Any]:
        """A state with each source's stream position when the epoch began (``start``) and, a
        loader's, where this rank stands in it."""
        o, src = self.options, self.source
        found = state.write(position, state.TORCH if torch else state.BLEND, options=o, dataset=self.fingerprint, samples=src.samples)
        found["sources"] = source_fields(src, self.starts(position.epoch).tolist())
        for name, part in zip(src.names, src.parts, strict=True):
            if part.generation is not None:
                found["sources"][name]["generation"] = part.generation
        if torch:
            return found
        done = position.done
        sched = self.schedule(position.epoch, done, rank_ranges(src.rest, done, o), world=o.world_size, batch_size=o.batch_size)  # type: ignore[arg-type]
        at = sched.stream_at(sched.global_at(position.phase.read[0]))
        for name, part, p in zip(src.names, src.parts, at.tolist(), strict=True):
            # where this rank stands in each source's stream (for a reader: not read back)
            n = max(part.samples, 1)  # an empty source (given a zero share) stays at 0
            found["sources"][name].update(epoch=int(p) // n, position=int(p) % n)
        return found

    def load(self, found: Any, *, torch: bool = False) -> Position:
        """The position a blend state records, with each source's stream position when its epoch began.

        Raises:
            ConfigError: the state is malformed, or was taken on other sources, shares or order
                options (each difference is named).
        """
        fmt = state.TORCH if torch else state.BLEND
        found = state.check_format(found, fmt)
        legacy = fmt is state.BLEND and found["version"] == 1  # its fingerprint was of its split too; the sources matched
        start = check_sources(found, self.source, drop_last=self.options.drop_last, legacy=legacy)  # first: a difference is named by source
        src = self.source
        position = state.read(
            found, fmt, options=self.options, dataset=self.fingerprint, samples=src.samples, name=src.name, rest=src.rest, order_only=legacy
        )
        return replace(position, start=start)

    def resume(self, position: Position, *, workers: int) -> Position:
        """``position`` settled on this blend's split (``workers`` workers a rank); the epochs
        after it follow on from where it stood (a position with no ``start`` leaves them as they were).

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
        """
        o = self.options
        settled = on_split(position, o, self.source, workers=workers)
        if position.start is None:
            return settled
        anchor = Anchor(settled.epoch, position.start, settled.done)
        if settled.epoch != position.epoch:  # the position's phase had read all it split: the next epoch follows on
            world, batch, _ = position.split
            taken = Anchor(position.epoch, position.start, position.done)
            following = self.source.starts(taken, settled.epoch, seed=o.seed, world=world, batch_size=batch, drop_last=o.drop_last)
            anchor = Anchor(settled.epoch, tuple(following.tolist()))
        self.anchor = anchor
        return settled

    def pins(self, found: Any) -> dict[str, int] | None:
        """The generation each source of the state ``found`` was taken on, for the sources read at another one; else None."""
        taken = found.get("sources") if isinstance(found, dict) else None
        if not isinstance(taken, dict):
            return None  # load() names what is wrong
        pinned = {}
        for name, part in zip(self.source.names, self.source.parts, strict=True):
            generation = state.pinned_generation(taken.get(name), f"load_state_dict: sources[{name!r}].generation")
            if generation is not None and part.generation not in (None, generation):
                pinned[name] = generation
        return pinned or None

    def at_generation(self, generation: dict[str, int]) -> BlendEpochs:
        """This blend with the sources ``generation`` names read at those generations."""
        if self.source.spec is None:
            raise ConfigError(
                f"load_state_dict: the state pins {self.source.name} to generations {generation}; give the blend, not its resolved source"
            )
        pinned = BlendEpochs(resolve_blend(self.source.spec, self.options, generations=generation), self.options)
        log.info("%s: reading %s, the generations the state was taken on", self.source.name, generation)
        return pinned


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
