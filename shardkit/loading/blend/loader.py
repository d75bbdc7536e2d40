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
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from shardkit.errors import ConfigError
from shardkit.loading.blend.source import BlendedSource, resolve_blend
from shardkit.loading.blend.spec import Blend, is_blend
from shardkit.loading.loader import Loader
from shardkit.loading.loader import loader as plain_loader
from shardkit.loading.one_generation import blend_of_first
from shardkit.loading.options import BLEND_LOADER, LoaderOptions, resolve_world, world_by_default
from shardkit.option_fields import from_call


class BlendLoader(Loader):
    """A :class:`shardkit.Loader` over a :class:`shardkit.Blend`; see :func:`shardkit.loader`.

    The loader is the one of a single dataset; what a blend changes, each epoch's schedule and
    the state, is its :class:`~shardkit.loading.blend.epochs.BlendEpochs` (whose ``resume`` says
    what holds when a blend state resumes on another world size, batch size or workers).

    Example:
        loader = shardkit.loader({"a": "data/a", "b": "data/b"}, weights={"a": 3, "b": 1}, batch_size=64)
        state = loader.state_dict()       # holds each source's position
        shardkit.loader({"a": "data/a", "b": "data/b"}, weights={"a": 3, "b": 1}, batch_size=64).load_state_dict(state)
    """

    def __init__(self, blend: Blend | BlendedSource, options: LoaderOptions) -> None:
        by_default = world_by_default(options.rank, options.world_size)
        rank, world = resolve_world(options.rank, options.world_size)
        options = replace(options, rank=rank, world_size=world)
        super().__init__(blend if isinstance(blend, BlendedSource) else blend_of_first(resolve_blend(blend, options), options), options)
        self._world_by_default = by_default


@BLEND_LOADER
def loader(source: Any, *, weights: Mapping[str, float] | None = None, epoch_size: int | None = None, **options: Any) -> Loader:
    """Read one dataset, or blend several.

    Args:
        source: one dataset (a directory, shard URLs or a pattern), or a blend: a
            :class:`shardkit.Blend`, ``{name: path}`` with ``weights=``, ``{name: {"path": ...,
            "weight" | "count" | "repeat": ...}}``, or a list of such mappings with a ``"name"``.
        weights: ``{name: share}`` for every source of a blend: each source's share of every epoch
            and of every batch (within one sample).
        epoch_size: positions per blend epoch when weights are used (default: all sources' samples).
        **options: the loader options, below, or ``options=`` a :class:`~shardkit.LoaderOptions`
            instead of them (not both: with ``options``, a keyword other than its default is a
            ``ConfigError``).

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
