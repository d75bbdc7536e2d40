"""Declare each option once: a dataclass field that carries its help, choices and YAML place.

on_error: str = field(default="raise", metadata=meta(help="what a failing unit does", choices=ON_ERROR, yaml="job"))
check_choices(self)                           # in __post_init__: every field declared with choices
check_bools(self)                             # ... and every bool field holds a bool
opts = from_call(PileOptions, options, {"piles": piles, "seed": seed})  # options= or keywords
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from shardkit.errors import ConfigError

T = TypeVar("T")

# where a field goes in a YAML job: under ``output:``, or beside ``job:`` at the top
Place = Literal["output", "job"]


def meta(*, help: str, metavar: str | None = None, choices: tuple[str, ...] | None = None, yaml: Place | None = None) -> dict[str, Any]:
    """The metadata of an option field: what the CLI and YAML need to know about it.

    Args:
        help: one line for ``--help`` (the default is added to it where there is one).
        metavar: the placeholder ``--help`` shows for the value (``M``, ``SIZE``).
        choices: the allowed values; validation, the CLI and YAML all read this tuple.
        yaml: where the option goes in a YAML job; None keeps it out of YAML.
    """
    return {"help": help, "metavar": metavar, "choices": choices, "yaml": yaml}


@dataclasses.dataclass(frozen=True)
class Spec:
    """One option field as the CLI and YAML see it: name, type, default and metadata.

    spec = specs(PileOptions)["max_pile_bytes"]
    spec.flag, spec.metavar, spec.yaml     # ('--max-pile-bytes', 'SIZE', 'output')
    """

    name: str
    kind: Any  # the resolved annotation: int, bool, int | None, int | str | None, ...
    default: Any  # None for a required option
    required: bool
    help: str | None
    metavar: str | None
    choices: tuple[str, ...] | None
    yaml: Place | None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def is_bool(self) -> bool:
        return self.kind is bool

    @property
    def is_int(self) -> bool:
        """An integer (or None), never a string: a size such as ``"2GiB"`` stays text."""
        kinds = typing.get_args(self.kind) or (self.kind,)
        return int in kinds and str not in kinds and bool not in kinds


_SPECS: dict[type, dict[str, Spec]] = {}


def specs(cls: type) -> dict[str, Spec]:
    """The fields of an options class, in declaration order, keyed by name."""
    if cls not in _SPECS:
        _SPECS[cls] = _read_specs(cls)
    return _SPECS[cls]


def _read_specs(cls: type) -> dict[str, Spec]:
    hints = typing.get_type_hints(cls)
    found = {}
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        data = f.metadata
        found[f.name] = Spec(
            name=f.name,
            kind=hints[f.name],
            default=None if required else f.default,
            required=required,
            help=data.get("help"),
            metavar=data.get("metavar"),
            choices=data.get("choices"),
            yaml=data.get("yaml"),
        )
    return found


def yaml_names(cls: type, place: Place) -> tuple[str, ...]:
    """The fields of ``cls`` a YAML job holds at ``place``, in declaration order."""
    return tuple(name for name, spec in specs(cls).items() if spec.yaml == place)


def check_choices(options: Any) -> None:
    """Refuse a value outside its field's ``choices``, naming the option and the values allowed."""
    for spec in specs(type(options)).values():
        value = getattr(options, spec.name)
        if spec.choices is not None and value not in spec.choices:
            raise ConfigError(f"{spec.name}: expected one of {', '.join(map(repr, spec.choices))}, got {value!r}")


def check_bools(options: Any) -> None:
    """Refuse a value other than True or False in any ``bool`` field: ``overwrite="false"`` is a
    mistake (the string is true), not a request."""
    for spec in specs(type(options)).values():
        value = getattr(options, spec.name)
        if spec.is_bool and not isinstance(value, bool):
            raise ConfigError(f"{spec.name}: expected True or False, got {value!r}")


def from_call(cls: type[T], options: T | None, keywords: Mapping[str, Any]) -> T:
    """The options an entry point runs with: ``options`` as given, or built from its keywords.

    ``options=`` and keyword options do not mix: with ``options`` given, a keyword that is
    neither None nor its field's default is a ConfigError naming it (a keyword left at its
    default cannot be told apart from one not passed, so it is not counted).

    Raises:
        ConfigError: ``options`` is not a ``cls``; a keyword was given besides it; without it,
            a required option is missing or a value is invalid.
    """
    fields = specs(cls)
    if options is None:
        for name, value in keywords.items():
            if value is None and fields[name].required:
                raise ConfigError(f"{name}: missing (required): pass {name}=... or options={cls.__name__}(...)")
        return cls(**keywords)
    if not isinstance(options, cls):
        raise ConfigError(f"options: expected a {cls.__name__}, got {type(options).__name__}")
    given = [f"{name}={value!r}" for name, value in keywords.items() if _given(value, fields[name].default)]
    if given:
        raise ConfigError(f"options: pass options= or keyword options, not both: got options= and {', '.join(given)}")
    return options


def _given(value: Any, default: Any) -> bool:
    return value is not None and value is not default and bool(value != default)
