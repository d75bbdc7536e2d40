"""The blend loader: several datasets read as one, each through its own epoch plan, mixed per batch.

Each source is read through its own pile plan (:class:`~shardkit.loading.plan.EpochOrder`, the
same seed as the blend), as an endless stream: its epoch 0 order, then its epoch 1 order, and so
on. Blend epoch ``e`` takes positions ``e * n .. (e + 1) * n - 1`` of source ``s``'s stream
(``n`` its share of an epoch), so a source that gives fewer samples than it holds continues
where it stopped in the next blend epoch, one that gives more runs on into its next
permutation, and no sample of a source comes twice before all of it was read. Which source
fills each position is :mod:`~shardkit.loading.blend`'s schedule, a pure function of (seed,
epoch, shares, batch size): every batch holds each source's share to within one sample.

A rank's slice takes a contiguous stretch of every source's stream; the piles of all sources are
one list for the loader's reader, so prefetch, ``mix``, workers, ``on_error`` and resume work as
for one dataset. Memory: about ``mix + 1`` piles per source being read plus ``prefetch``.

    with shardkit.loader({"web": "data/web", "code": "data/code"}, weights={"web": 0.7, "code": 0.3},
                         batch_size=256) as loader:
        for batch in loader: ...
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from shardkit import manifest, storage
from shardkit._util import check_int
from shardkit.errors import ConfigError
from shardkit.loading import plan
from shardkit.loading.blend import Frames, apportion, composition, epoch_length, sources, taken_before
from shardkit.loading.blend_spec import Blend, BlendSource
from shardkit.loading.elastic import Phase
from shardkit.loading.loader import Loader
from shardkit.loading.loader import loader as plain_loader
from shardkit.loading.options import LoaderOptions, resolve_world
from shardkit.loading.source import Source, resolve
from shardkit.loading.state import FORMAT as PLAIN_FORMAT
from shardkit.loading.state import ORDER_OPTIONS, SPLIT_OPTIONS, check_format, check_identity, make_state
from shardkit.options import from_call

log = logging.getLogger(__name__)

FORMAT = "shardkit.blend"
VERSION = 1
# blocks are cells of about this many positions (whole batches); a pile's use is tracked to the
# cells it is read in, so it may be loaded up to a cell early and released up to a cell late
CELL = 4096


@dataclass(frozen=True)
class BlendedSource(Source):
    """The piles of every source, one list (source ``s``'s piles from ``offsets[s]``), and the
    epoch's shape: ``shares[s]`` positions of source ``s`` in each epoch of ``length``."""

    names: tuple[str, ...] = ()
    parts: tuple[Source, ...] = ()
    shares: tuple[int, ...] = ()
    length: int = 0

    @property
    def samples(self) -> int:  # type: ignore[override]
        return self.length

    @property
    def offsets(self) -> list[int]:
        return np.concatenate(([0], np.cumsum([len(p.piles) for p in self.parts]))).tolist()

    def fingerprint(self) -> str:
        doc = [[n, p.fingerprint(), p.samples, c] for n, p, c in zip(self.names, self.parts, self.shares, strict=True)]
        return hashlib.sha256(json.dumps([doc, self.length]).encode()).hexdigest()[:16]


def resolve_blend(blend: Blend, options: LoaderOptions) -> BlendedSource:
    """Each source resolved, and each one's positions per epoch for these options (rank, batch).

    Raises:
        ConfigError: two sources are the same dataset, a source with a share holds no samples,
            or the epoch holds no whole batch on every rank.
    """
    assert options.world_size is not None
    parts = []
    for s in blend.sources:
        storage.use(s.path, options.storage_options)
        parts.append(resolve(s.path))
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
    found = BlendedSource(name, piles, names=tuple(blend.names), parts=tuple(parts), shares=tuple(shares), length=length)
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


class BlendSchedule:
    """What one rank (or worker) reads of a blend epoch: positions ``[lo, hi)``, as blocks and pile uses.

    Example:
        sched = BlendSchedule(source, epoch=0, lo=0, hi=512, options=opts)
        uses, blocks = sched.uses(), list(sched.blocks())
    """

    def __init__(self, source: BlendedSource, epoch: int, lo: int, hi: int, options: LoaderOptions) -> None:
        self.source, self.epoch, self.lo, self.hi, self.options = source, epoch, lo, hi, options
        self.frames = Frames(source.shares, frame=options.batch_size or 1, seed=options.seed, epoch=epoch)
        self._offsets = source.offsets
        self._orders: dict[tuple[int, int], plan.EpochOrder] = {}

    def __len__(self) -> int:
        return self.hi - self.lo

    def stream_at(self, pos: int) -> np.ndarray:
        """Each source's stream position at global position ``pos`` of this epoch."""
        return self.epoch * np.asarray(self.source.shares, dtype=np.int64) + taken_before(self.frames, pos)

    def _order(self, s: int, cycle: int) -> plan.EpochOrder:
        key = (s, cycle)
        if key not in self._orders:
            if len(self._orders) > 2 * len(self.source.parts):
                self._orders.pop(next(iter(self._orders)))
            o = self.options
            self._orders[key] = plan.EpochOrder(self.source.parts[s].counts, seed=o.seed, epoch=cycle, shuffle=o.shuffle, mix=o.mix)
        return self._orders[key]

    def _cycles(self, s: int, p0: int, p1: int) -> Iterator[tuple[int, int, int]]:
        """``(source epoch, first, end)`` pieces of stream positions ``p0 .. p1 - 1`` of source ``s``."""
        n = self.source.parts[s].samples
        for cycle in range(p0 // n, -(-p1 // n)):
            yield cycle, max(p0, cycle * n) - cycle * n, min(p1, (cycle + 1) * n) - cycle * n

    def _stream(self, s: int, p0: int, p1: int) -> tuple[np.ndarray, np.ndarray]:
        piles, index = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for cycle, a, b in self._cycles(s, p0, p1):
            p, i = self._order(s, cycle).take(a, b)
            piles.append(p + self._offsets[s])
            index.append(i)
        return np.concatenate(piles), np.concatenate(index)

    def _chunks(self, a: int, b: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(global position, piles, index)`` runs covering global positions ``a .. b - 1``."""
        at = self.stream_at(a)
        # one block a cell, as the uses count them: the piles a block needs are in use together
        for x in range(a, b, self._cell()):
            y = min(b, x + self._cell())
            src = sources(self.frames, x, y)
            piles, index = np.empty(y - x, np.int64), np.empty(y - x, np.int64)
            for s in range(len(self.source.parts)):
                mask = src == s
                count = int(np.count_nonzero(mask))
                if count:
                    piles[mask], index[mask] = self._stream(s, int(at[s]), int(at[s]) + count)
                    at[s] += count
            yield x, piles, index

    def blocks(self, start: int = 0) -> Iterator[plan.Block]:
        """Blocks covering slice positions ``start .. len(self) - 1`` in order."""
        for x, piles, index in self._chunks(self.lo + start, self.hi):
            yield plan.Block(x - self.lo, piles, index)

    def take(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Piles and in-pile indices of slice positions ``start .. stop - 1`` (materialized)."""
        parts = list(self._chunks(self.lo + start, self.lo + stop))
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate([p for _, p, _ in parts]), np.concatenate([i for _, _, i in parts])

    def _cell(self) -> int:
        """Positions per cell: whole frames, about :data:`CELL`."""
        return max(1, CELL // self.frames.frame) * self.frames.frame

    def _cell_counts(self, a: int) -> tuple[int, np.ndarray]:
        """Cell size and, per cell from global position ``a`` (on a frame boundary), the running count of each source."""
        width = self.frames.frame
        per = self._cell() // width
        f0, f1 = a // width, -(-self.hi // width)
        rows = []
        for x in range(f0, f1, per * 256):
            y = min(f1, x + per * 256)
            comp = composition(self.frames, x, y)
            cells = np.add.reduceat(comp, np.arange(0, y - x, per), axis=0)
            rows.append(cells)
        counts = np.concatenate(rows) if rows else np.zeros((0, len(self.source.parts)), np.int64)
        return per * width, np.cumsum(counts, axis=0)

    def uses(self, start: int = 0) -> list[plan.PileUse]:
        """Pile uses from slice position ``start`` on, in load order; bounds rounded out to cells."""
        a = self.lo + start
        if a >= self.hi:
            return []
        size, running = self._cell_counts(a)
        at, end = self.stream_at(a), self.stream_at(self.hi)
        last_pos = len(self) - 1
        found: list[plan.PileUse] = []
        for s in range(len(self.source.parts)):
            n = self.source.parts[s].samples
            for cycle, x, y in self._cycles(s, int(at[s]), int(end[s])):
                for use in self._order(s, cycle).uses(x, y):
                    # stream offsets from a -> the cells holding them -> slice positions
                    k = np.array([use.first, use.last]) + cycle * n - int(at[s])
                    cell = np.searchsorted(running[:, s], k, side="right")
                    first = start + int(cell[0]) * size
                    last = min(last_pos, start + (int(cell[1]) + 1) * size - 1)
                    found.append(plan.PileUse(use.pile + self._offsets[s], first, last))
        return _merged(sorted(found, key=lambda u: (u.first, u.pile)))


def _merged(uses: Sequence[plan.PileUse]) -> list[plan.PileUse]:
    """``uses`` with overlapping uses of one pile (a pile ending one source epoch and starting the next) made one."""
    out: list[plan.PileUse] = []
    open_: dict[int, int] = {}  # pile -> its latest use in out
    for u in uses:
        j = open_.get(u.pile)
        if j is not None and out[j].last >= u.first:
            out[j] = plan.PileUse(u.pile, out[j].first, max(out[j].last, u.last))
            continue
        open_[u.pile] = len(out)
        out.append(u)
    return out


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

    def _span(self) -> tuple[int, int]:
        """This rank's (and worker's) contiguous slice of the blend epoch's positions."""
        o = self.options
        assert o.rank is not None and o.world_size is not None
        index, workers = o.worker
        return plan.slice_span(
            self.source.samples,
            world=o.world_size,
            rank=o.rank,
            drop_last=o.drop_last,
            batch_size=o.batch_size,
            workers=workers,
            worker=index,
        )

    def _schedule(self, epoch: int, done: tuple[Phase, ...] = ()) -> BlendSchedule:  # type: ignore[override]
        if done:  # load_state_dict refuses such a state first
            raise ConfigError("a blend cannot resume an epoch begun on another world_size or batch_size")
        return BlendSchedule(self.source, epoch, *self._span(), self.options)

    def keys(self, step: int, *, epoch: int | None = None, num_workers: int = 0, done: Sequence[Phase] | None = None) -> list[list[str]]:
        """The keys of the samples global step ``step`` reads on every rank (see :meth:`shardkit.Loader.keys`).

        Raises:
            ConfigError: ``num_workers`` over 1 or phases ``done``: a blend's ledger counts the
                steps of one loader per rank, not resumed on other ranks.
        """
        if check_int("num_workers", num_workers, low=0) > 1 or done:
            raise ConfigError(
                "keys: the ledger of a blend counts one loader's steps per rank: no DataLoader workers, not resumed on other ranks"
            )
        check_int("step", step, low=0)
        check_int("epoch", epoch, low=0, none=True)
        o = self.options
        assert o.world_size is not None
        if step >= len(self):
            raise ConfigError(f"step: {step} is past the end of the epoch ({len(self)} steps a rank)")
        per = o.batch_size or 1
        found = []
        for rank in range(o.world_size):
            lo, hi = plan.rank_span(self.source.samples, world=o.world_size, rank=rank, drop_last=o.drop_last, batch_size=o.batch_size)
            sched = BlendSchedule(self.source, self._epoch if epoch is None else epoch, lo, hi, o)
            piles, index = sched.take(step * per, min((step + 1) * per, len(sched)))
            opened = {p: self.source.open(p, self.source.fetch(p, reads=self._reads)).keys for p in set(piles.tolist())}
            found.append([opened[p][i] for p, i in zip(piles.tolist(), index.tolist(), strict=True)])
        return found

    def state_dict(self) -> dict[str, Any]:
        """This rank's position, with each source's: its epoch and position in that epoch's order."""
        plain_state = super().state_dict()
        epoch, position = plain_state["epoch"], plain_state["position"]
        state: dict[str, Any] = {"format": FORMAT, "version": VERSION, "epoch": epoch, "position": position}
        state.update({name: plain_state[name] for name in ORDER_OPTIONS + SPLIT_OPTIONS})
        state.update(dataset=self._fingerprint, samples=self.source.length, sources=self._positions(epoch, position))
        return state

    def _positions(self, epoch: int, position: int) -> dict[str, dict[str, Any]]:
        lo, _ = self._span()
        at = BlendSchedule(self.source, epoch, lo, lo, self.options).stream_at(lo + position)
        src = self.source
        return {
            name: {
                "dataset": part.fingerprint(),
                "samples": part.samples,
                "share": share,
                "epoch": int(p) // part.samples,
                "position": int(p) % part.samples,
            }
            for name, part, share, p in zip(src.names, src.parts, src.shares, at.tolist(), strict=True)
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a blend ``state`` (or a plain loader state of this same blend, as
        ``shardkit.torch`` makes): the next iteration yields the rest of that epoch.

        Raises:
            ConfigError: the state is malformed, or was taken on other sources, shares or order
                options (each difference is named).
        """
        if isinstance(state, dict) and state.get("format") == PLAIN_FORMAT:
            check_same_split(state, self.options)
            super().load_state_dict(state)
            return
        state = check_format(state, FORMAT, VERSION, "shardkit blend")
        check_same_split(state, self.options)
        taken = state.get("sources")
        if not isinstance(taken, dict) or sorted(taken) != sorted(self.source.names):
            shown = sorted(taken) if isinstance(taken, dict) else taken
            raise ConfigError(f"load_state_dict: the state was taken on sources {shown!r}, this blend has {sorted(self.source.names)}")
        mine = self._positions(0, 0)
        for name, ours in mine.items():
            theirs = taken[name] if isinstance(taken[name], dict) else {}
            for key in ("dataset", "samples", "share"):
                if theirs.get(key) != ours[key]:
                    raise ConfigError(
                        f"load_state_dict: source {name!r}: the state has {key}={theirs.get(key)!r}, this blend has {key}={ours[key]!r}"
                    )
        check_identity(state, options=self.options, dataset=self._fingerprint, samples=self.source.samples, name=self.source.name)
        super().load_state_dict(
            make_state(
                epoch=state.get("epoch"),
                position=state.get("position"),
                options=self.options,
                dataset=self._fingerprint,
                samples=self.source.samples,
            )  # type: ignore[arg-type]
        )
        mine = self._positions(self._epoch, self._start)
        if any((taken[n].get("epoch"), taken[n].get("position")) != (mine[n]["epoch"], mine[n]["position"]) for n in mine):
            raise ConfigError("load_state_dict: the sources' positions in the state do not follow from its epoch and position")


def check_same_split(state: dict[str, Any], options: LoaderOptions) -> None:
    """Refuse a state taken with another world size or batch size (or after a change of them):
    a blend's slices are contiguous stretches of its schedule, and what another split of an
    epoch left is not one."""
    for name in SPLIT_OPTIONS:
        if state.get(name) != getattr(options, name):
            raise ConfigError(
                f"load_state_dict: the state was taken with {name}={state.get(name)!r}, this blend has {name}={getattr(options, name)!r}; "
                "a blend resumes only on the world_size and batch_size it was taken with (a single dataset resumes on others)"
            )
    if state.get("done"):
        raise ConfigError("load_state_dict: the state's epoch was begun on another world_size or batch_size, which a blend cannot resume")


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
