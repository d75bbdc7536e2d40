"""Class maps that never drift: a dataset's class names by index, kept across appends and checked.

A transform that numbers classes (``cls``) records the map in the manifest's ``extra``: the
names in index order (``classes``) and how a sample says its class by name (``class_check``),
so the map can be checked sample by sample. An append reads the recorded map and extends it:
every class already there keeps its index, a new class gets the next one (new names in sorted
order). A map that cannot be extended that way is refused, naming both maps.

    classes = reconcile(["cat", "dog"], found=["dog", "owl"])      # ['cat', 'dog', 'owl']
    mismatch(sample, classes, CHECK)      # None, or "cls 0 says 'cat', json.class says 'owl'"
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping, Sequence
from typing import Any

from shardkit.errors import ConfigError

# where a dataset records its class names (index order), and how a sample is checked against them
CLASSES = "classes"
CHECK_KEY = "class_check"
# the image transform's samples: ``cls`` holds the index, ``json``'s "class" the name
CHECK = {"index": "cls", "name": "json.class"}


def _shown(names: Sequence[str]) -> str:
    if len(names) > 12:
        return "[" + ", ".join(repr(n) for n in names[:12]) + f", ... ({len(names)} in all)]"
    return "[" + ", ".join(repr(n) for n in names) + "]"


def recorded(extra: Mapping[str, Any] | None, where: str) -> list[str] | None:
    """The class map a manifest's ``extra`` records; None when it records none.

    Raises:
        ConfigError: ``classes`` is there but is not a list of distinct names.
    """
    if not extra or CLASSES not in extra:
        return None
    names = extra[CLASSES]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise ConfigError(f"{where}: the manifest's extra['classes'] is not a list of distinct class names: {names!r}")
    return list(names)


def reconcile(old: Sequence[str] | None, found: Sequence[str], *, given: Sequence[str] | None = None, where: str = "classes") -> list[str]:
    """The class map for samples whose classes are ``found``, extending the recorded ``old``.

    Every class of ``old`` keeps its index; classes of ``found`` that ``old`` lacks follow in
    sorted order. ``given`` (a map the user names) must agree with ``old`` on every class ``old``
    has and hold every class ``found``; it is then the map.

    Raises:
        ConfigError: ``given`` disagrees with ``old`` (both maps named) or lacks a class found.
    """
    base = list(old or [])
    if given is not None:
        given = list(given)
        moved = [n for i, n in enumerate(base) if i >= len(given) or given[i] != n]
        if moved:
            raise ConfigError(
                f"{where}: the dataset's class map {_shown(base)} and the one given, {_shown(given)}, disagree on "
                f"{_shown(moved)}: a class keeps its index for the life of a dataset; give a map that extends the dataset's"
            )
        missing = sorted(set(found) - set(given))
        if missing:
            raise ConfigError(f"{where}: the folders hold classes the given map {_shown(given)} lacks: {_shown(missing)}")
        return given
    known = set(base)
    return base + sorted({n for n in found if n not in known})


def extended(old: Sequence[str] | None, new: Sequence[str], where: str) -> None:
    """Refuse a new map that does not keep every index of ``old`` (the write-time check of an append).

    Raises:
        ConfigError: ``new`` names a class twice, or does not start with ``old`` (both maps named).
    """
    if len(set(new)) != len(new):
        repeated = sorted(name for name, n in collections.Counter(new).items() if n > 1)
        raise ConfigError(f"{where}: the new samples' class map {_shown(list(new))} names {', '.join(map(repr, repeated))} twice")
    if old is not None and list(new[: len(old)]) != list(old):
        raise ConfigError(
            f"{where}: the dataset's class map {_shown(list(old))} and the new samples' {_shown(list(new))} disagree: "
            "a class keeps its index for the life of a dataset (another append may have added classes meanwhile; run it again)"
        )


def appended(dataset: Mapping[str, Any], new: Sequence[str], where: str) -> None:
    """Refuse an append whose samples number classes by ``new`` to the dataset whose ``extra`` is
    ``dataset``: one that records no map (the cls of its samples cannot be matched), or one whose
    map ``new`` does not keep (:func:`extended`).

    Raises:
        ConfigError: the dataset records no map, or the two maps disagree (both named).
    """
    old = recorded(dataset, where)
    if old is None:
        raise ConfigError(
            f"{where}: the dataset appended to records no class map (extra['classes']), so the cls of its samples cannot be "
            f"matched to the new samples' {_shown(list(new))}; append images only to a dataset the image transform wrote"
        )
    extended(old, new, where)


def _field(sample: Mapping[str, Any], path: str) -> Any:
    """A sample's value at ``path``: ``cls`` (an integer's text) or ``json.class`` (a JSON member's key)."""
    ext, _, inner = path.partition(".")
    raw = sample.get(ext)
    if raw is None:
        return None
    data: Any = bytes(raw) if not isinstance(raw, (dict, int, str)) else raw
    if not inner:
        try:
            return int(data)
        except (TypeError, ValueError):
            return None
    try:
        doc = json.loads(data) if isinstance(data, (bytes, str)) else data
    except ValueError:
        return None
    return doc.get(inner) if isinstance(doc, dict) else None


def mismatch(sample: Mapping[str, Any], classes: Sequence[str], check: Mapping[str, Any]) -> str | None:
    """What is wrong with a sample's class under the map (None if nothing): its index field must
    be an index of ``classes`` whose name is the one its name field holds."""
    index_path, name_path = str(check.get("index")), str(check.get("name"))
    index, name = _field(sample, index_path), _field(sample, name_path)
    if not isinstance(index, int) or not 0 <= index < len(classes):
        return f"{index_path} is {index!r}, not an index of the {len(classes)} classes"
    if name is not None and classes[index] != name:
        return f"{index_path} {index} is class {classes[index]!r} by the manifest, but {name_path} says {name!r}"
    return None
