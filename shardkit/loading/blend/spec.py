"""What a blend asks for: its sources and each one's share of an epoch, validated once.

Each source takes one of three choices (as MosaicML Streaming's ``proportion``, ``choose`` and
``repeat``): a ``weight`` (its share of ``epoch_size`` positions), a ``count`` (positions per
epoch) or a ``repeat`` factor (``repeat * samples`` positions per epoch; 1 when nothing is
given). Weights go together: all sources have one, or none do.

    Blend({"web": "data/web", "code": "s3://b/code"}, weights={"web": 0.7, "code": 0.3})
    Blend([{"name": "web", "path": "data/web", "count": 1000}, {"name": "code", "path": "data/code", "repeat": 2}])
    Blend.from_dict({"sources": {"web": {"path": "data/web", "weight": 0.7}, ...}, "epoch_size": 10000})
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardkit._util import shown
from shardkit.errors import ConfigError
from shardkit.loading.blend.frames import apportion

_CHOICES = ("weight", "count", "repeat")


def _number(where: str, value: Any, *, whole: bool = False) -> float | int:
    """``value`` if it is a finite number >= 0 (an integer when ``whole``), else a ConfigError."""
    kind = "an integer >= 0" if whole else "a number >= 0"
    ok = isinstance(value, numbers.Integral if whole else numbers.Real) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise ConfigError(f"blend: {where} is {shown(value)}; expected {kind}")
    return int(value) if whole else float(value)


@dataclass(frozen=True)
class BlendSource:
    """One source of a blend: a name, what :func:`shardkit.loader` reads, and at most one of
    ``weight``, ``count`` or ``repeat``.

    Example:
        BlendSource("code", "s3://b/code", repeat=2)
    """

    name: str
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
    weight: float | None = None
    count: int | None = None
    repeat: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"blend: a source name must be a non-empty string, got {shown(self.name)}")
        given = [c for c in _CHOICES if getattr(self, c) is not None]
        if len(given) > 1:
            raise ConfigError(f"blend: source {self.name!r} has {' and '.join(given)}; expected at most one of weight, count or repeat")
        for choice in given:
            object.__setattr__(self, choice, _number(f"{choice} of {self.name!r}", getattr(self, choice), whole=choice == "count"))

    @classmethod
    def from_dict(cls, name: str, doc: Any) -> BlendSource:
        """A source from ``"path"`` or ``{"path": ..., "weight" | "count" | "repeat": ...}``."""
        if isinstance(doc, (str, os.PathLike)):
            return cls(name, doc)
        if not isinstance(doc, Mapping) or "path" not in doc:
            raise ConfigError(f"blend: source {name!r}: expected a path or a mapping with 'path', got {shown(doc)}")
        unknown = set(doc) - {"path", "name", *_CHOICES}
        if unknown:
            raise ConfigError(f"blend: source {name!r}: unknown key {sorted(unknown)[0]!r} (expected path, weight, count or repeat)")
        return cls(name, doc["path"], **{c: doc[c] for c in _CHOICES if c in doc})


def _sources(sources: Any) -> tuple[BlendSource, ...]:
    """The sources of any accepted form, each name once."""
    if isinstance(sources, Mapping):
        found = [BlendSource.from_dict(str(name), doc) for name, doc in sources.items()]
    elif isinstance(sources, Sequence) and not isinstance(sources, (str, bytes)):
        found = [s if isinstance(s, BlendSource) else _listed(s, i) for i, s in enumerate(sources)]
    else:
        raise ConfigError(f"blend: expected a mapping of name -> path or a list of sources, got {shown(sources)}")
    if not found:
        raise ConfigError("blend: no sources; expected at least one")
    seen: set[str] = set()
    for s in found:
        if s.name in seen:
            raise ConfigError(f"blend: source {s.name!r} is listed twice; expected each name once")
        seen.add(s.name)
    return tuple(found)


def _listed(doc: Any, index: int) -> BlendSource:
    if not isinstance(doc, Mapping) or "name" not in doc:
        raise ConfigError(f"blend: sources[{index}]: expected a mapping with 'name' and 'path', got {shown(doc)}")
    return BlendSource.from_dict(str(doc["name"]), doc)


def _with_weights(sources: tuple[BlendSource, ...], weights: Any) -> tuple[BlendSource, ...]:
    """``sources`` with the weights of the ``weights=`` mapping set."""
    if not isinstance(weights, Mapping) or not weights:
        raise ConfigError(f"blend: weights: expected a mapping of source name -> weight naming every source, got {shown(weights)}")
    names = [s.name for s in sources]
    for name in weights:
        if name not in names:
            raise ConfigError(f"blend: weights name {name!r}, which is not a source (sources: {', '.join(names)})")
    out = []
    for s in sources:
        if s.name not in weights:
            raise ConfigError(f"blend: weights: no weight for source {s.name!r}; expected one for each of {', '.join(names)}")
        if s.weight is not None or s.count is not None or s.repeat is not None:
            raise ConfigError(f"blend: source {s.name!r} has its own weight, count or repeat and is also in weights=; give one")
        out.append(BlendSource(s.name, s.path, weight=weights[s.name]))
    return tuple(out)


@dataclass(frozen=True, init=False)
class Blend:
    """Several datasets read as one: each source's share of every epoch and of every batch.

    Args:
        sources: ``{name: path}``, ``{name: {"path": ..., "weight" | "count" | "repeat": ...}}``, or a
            list of :class:`BlendSource` or of such mappings with a ``"name"``.
        weights: ``{name: weight}`` for every source (shares, normalised; need not sum to 1).
        epoch_size: positions per epoch when weights are used (default: the sources' samples together).

    Example:
        blend = shardkit.Blend({"web": "data/web", "code": "data/code"}, weights={"web": 0.7, "code": 0.3})
        loader = shardkit.loader(blend, batch_size=256)
    """

    sources: tuple[BlendSource, ...]
    epoch_size: int | None

    def __init__(self, sources: Any, *, weights: Mapping[str, float] | None = None, epoch_size: int | None = None) -> None:
        if isinstance(sources, Blend):
            # a Blend given again (to loader, ShardkitDataset) keeps its epoch size unless one is given
            epoch_size = sources.epoch_size if epoch_size is None else epoch_size
            sources = sources.sources
        found = _sources(sources)
        if weights is not None:
            found = _with_weights(found, weights)
        weighted = [s.weight is not None for s in found]
        if any(weighted) and not all(weighted):
            unweighted = [s.name for s, w in zip(found, weighted, strict=True) if not w]
            raise ConfigError(f"blend: source {unweighted[0]!r} has no weight while others do; expected weights on all sources or on none")
        if all(weighted) and not any(s.weight for s in found):
            raise ConfigError(f"blend: the weights of {', '.join(s.name for s in found)} are all zero; expected at least one > 0")
        if epoch_size is not None:
            if not all(weighted):
                raise ConfigError(
                    f"blend: epoch_size={shown(epoch_size)} needs a weight on every source (it is the size their shares divide); "
                    "without weights an epoch is what the sources' samples, counts and repeats add up to"
                )
            if not isinstance(epoch_size, numbers.Integral) or isinstance(epoch_size, bool) or epoch_size < 1:
                raise ConfigError(f"blend: epoch_size is {shown(epoch_size)}; expected an integer >= 1")
        object.__setattr__(self, "sources", found)
        object.__setattr__(self, "epoch_size", epoch_size)

    @classmethod
    def from_dict(cls, doc: Any) -> Blend:
        """A blend from a YAML-style mapping: ``{"sources": {...} or [...], "weights": {...}, "epoch_size": N}``."""
        if not isinstance(doc, Mapping) or "sources" not in doc:
            raise ConfigError(f"blend: expected a mapping with 'sources', got {shown(doc)}")
        unknown = set(doc) - {"sources", "weights", "epoch_size"}
        if unknown:
            raise ConfigError(f"blend: unknown key {sorted(unknown)[0]!r} (expected sources, weights, epoch_size)")
        return cls(doc["sources"], weights=doc.get("weights"), epoch_size=doc.get("epoch_size"))

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

    def counts(self, samples: Sequence[int]) -> list[int]:
        """Positions of each source per epoch, given each source's number of samples.

        Raises:
            ConfigError: a source asked to give samples has none, or the epoch would be empty.
        """
        for s, n in zip(self.sources, samples, strict=True):
            # the share a source was given decides; repeat 1 stands only when none was given
            share = s.weight if s.weight is not None else s.count if s.count is not None else 1 if s.repeat is None else s.repeat
            if n == 0 and share > 0:
                raise ConfigError(f"blend: source {s.name!r} ({s.path}) holds no samples; give it weight, count or repeat 0, or drop it")
        if self.sources[0].weight is not None:
            size = self.epoch_size if self.epoch_size is not None else sum(samples)
            counts = apportion([s.weight for s in self.sources], size)  # type: ignore[misc]
        else:
            counts = [
                s.count if s.count is not None else round((1.0 if s.repeat is None else s.repeat) * n)
                for s, n in zip(self.sources, samples, strict=True)
            ]
        if sum(counts) == 0:
            raise ConfigError(f"blend: every source gives 0 samples per epoch ({', '.join(self.names)}); expected at least one > 0")
        return counts


def is_blend(source: Any) -> bool:
    """Whether ``source`` names several datasets (a Blend, a mapping, or a list of named sources)."""
    if isinstance(source, (Blend, Mapping)):
        return True
    return (
        isinstance(source, Sequence) and not isinstance(source, (str, bytes)) and any(isinstance(s, (BlendSource, Mapping)) for s in source)
    )
