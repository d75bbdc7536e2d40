"""Oversampling at pile creation: how many copies of each sample pass 1 writes.

A rule maps a sample dict to a count: ``repeat(sample) -> int``. Copy 0 keeps the sample's key,
copy ``i`` is written under ``f"{key}_r{i}"`` (no dot: WebDataset readers split keys at dots).
Each copy is routed like any other sample, to a pile of its own, so the first epoch is a
uniform permutation of the expanded multiset. A count of 0 drops the sample.

    rule = ByField("cls", {"3": 4, "7": 2})   # class 3 four times, class 7 twice, the rest once
    shardkit.preprocess(units, fn, "out/", piles=64, repeat=rule)
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardkit.errors import ConfigError, SampleError

Rule = Callable[[Mapping[str, Any]], int]

# the most copies one sample may get: a typo (400 for 4) should fail, not fill the disk
MAX_COPIES = 10_000


def copy_key(key: str, copy: int) -> str:
    """The key of copy ``copy`` of the sample ``key`` (copy 0 keeps it)."""
    return key if copy == 0 else f"{key}_r{copy}"


@dataclass(frozen=True)
class ByField:
    """Copies by the value of one field: ``counts`` maps the value, as text, to a count;
    other values get ``default``. Bytes values (a ``.cls`` member read from a shard) are read
    as UTF-8 text, stripped."""

    field: str
    counts: Mapping[str, int]
    default: int = 1
    if TYPE_CHECKING:  # set by __post_init__, not a field at run time
        _lookup: dict[str, int] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.field, str) or not self.field:
            raise ConfigError(f"repeat: field: expected the name of a sample field ('cls'), got {self.field!r}")
        if not isinstance(self.counts, Mapping) or not self.counts:
            raise ConfigError(f"repeat: counts: expected a mapping of field values to copies ({{'3': 4}}), got {self.counts!r}")
        lookup = {}
        for value, count in self.counts.items():
            lookup[str(value)] = check_count(count, f"repeat: counts[{value!r}]", ConfigError)
        check_count(self.default, "repeat: default", ConfigError)
        object.__setattr__(self, "_lookup", lookup)  # str keys: YAML may give ints

    def __call__(self, sample: Mapping[str, Any]) -> int:
        if self.field not in sample:
            raise SampleError(f"repeat: sample has no field {self.field!r} (it has {sorted(k for k in sample if k != '__key__')})")
        value = sample[self.field]
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = bytes(value).decode("utf-8", "replace").strip()
        return self._lookup.get(str(value), self.default)

    def describe(self) -> dict[str, Any]:
        return {"field": self.field, "counts": dict(sorted(self._lookup.items())), "default": self.default}


def check_count(count: Any, what: str, error: type[Exception] = SampleError) -> int:
    """``count`` if it is an int in ``0..MAX_COPIES``."""
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_COPIES:
        raise error(f"{what}: expected a number of copies, an int from 0 to {MAX_COPIES}, got {count!r}")
    return count


def parse(text: str) -> ByField:
    """The command-line form: ``"cls:3=4,7=2"`` is ``ByField("cls", {"3": 4, "7": 2})``; a value
    ``*`` sets the default (``"cls:3=4,*=0"`` keeps only class 3, four times)."""
    name, colon, pairs = text.partition(":")
    counts: dict[str, int] = {}
    default = 1
    for pair in pairs.split(",") if colon else []:
        value, eq, count = pair.strip().rpartition("=")
        if not eq or not value or not count.strip().isdigit():
            raise ConfigError(
                f"repeat: expected FIELD:VALUE=COPIES[,VALUE=COPIES...] (cls:3=4,7=2), got {text!r}: {pair!r} is not VALUE=COPIES"
            )
        if value == "*":
            default = int(count)
        else:
            counts[value] = int(count)
    if not colon or not name or not counts:
        raise ConfigError(f"repeat: expected FIELD:VALUE=COPIES[,VALUE=COPIES...] (cls:3=4,7=2), got {text!r}")
    return ByField(name.strip(), counts, default)


def check_rule(repeat: Any) -> Rule | None:
    """A callable rule; a :class:`ByField` from its mapping form (``{"field": "cls", "counts":
    {...}}``) or its text form (:func:`parse`); or None."""
    if repeat is None or callable(repeat):
        return repeat
    if isinstance(repeat, str):
        return parse(repeat)
    if isinstance(repeat, Mapping):
        unknown = set(repeat) - {"field", "counts", "default"}
        if unknown or "field" not in repeat or "counts" not in repeat:
            raise ConfigError(
                f"repeat: expected {{field: NAME, counts: {{VALUE: COPIES}}, default: 1}}, got {dict(repeat)!r}"
                + (f" (unknown: {', '.join(sorted(map(str, unknown)))})" if unknown else "")
            )
        return ByField(repeat["field"], repeat["counts"], repeat.get("default", 1))
    raise ConfigError(f"repeat: expected a function fn(sample) -> int or {{field: NAME, counts: {{...}}}}, got {repeat!r}")


def describe(rule: Rule) -> Any:
    """What the manifest records of the rule: a :class:`ByField`'s field and counts, else the
    function's qualified name."""
    if isinstance(rule, ByField):
        return rule.describe()
    target = rule if hasattr(rule, "__qualname__") else type(rule)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"


def copies(rule: Rule, sample: Mapping[str, Any]) -> int:
    """How many copies of ``sample`` to write. Raises SampleError naming the sample's key."""
    try:
        count = rule(sample)
    except SampleError as e:
        raise SampleError(f"sample {sample.get('__key__')!r}: {e}") from None
    return check_count(count, f"sample {sample.get('__key__')!r}: repeat returned")


def record(rule: Rule, factors: Mapping[int, int]) -> dict[str, Any]:
    """The manifest's ``extra["repeat"]``: the rule, and how many input samples got each count."""
    counted = Counter({int(k): int(v) for k, v in factors.items()})
    return {
        "rule": describe(rule),
        "factors": {str(k): counted[k] for k in sorted(counted)},
        "input_samples": sum(counted.values()),
        "written_samples": sum(k * v for k, v in counted.items()),
    }
