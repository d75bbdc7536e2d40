"""Declare each option once: a dataclass field that carries its help, choices, YAML place and group.

on_error: str = field(default="raise", metadata=meta(help="what a failing unit does", choices=ON_ERROR, yaml="job", group="recovery"))
check_choices(self)                           # in __post_init__: every field declared with choices
check_bools(self)                             # ... and every bool field holds a bool
PILE = Door(PileOptions)                      # an entry point's keywords: the fields, signature and docs made from them
opts = PILE.options(options, keywords)        # in its body: options= or keywords
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
import textwrap
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar

from shardkit.errors import ConfigError

T = TypeVar("T")
C = TypeVar("C", bound=Callable[..., Any])

# where a field goes in a YAML job: under ``output:``, or beside ``job:`` at the top
Place = Literal["output", "job"]


def meta(
    *, help: str, metavar: str | None = None, choices: tuple[str, ...] | None = None, yaml: Place | None = None, group: str | None = None
) -> dict[str, Any]:
    """The metadata of an option field: what the CLI and YAML need to know about it.

    Args:
        help: one line for ``--help`` (the default is added to it where there is one).
        metavar: the placeholder ``--help`` shows for the value (``M``, ``SIZE``).
        choices: the allowed values; validation, the CLI and YAML all read this tuple.
        yaml: where the option goes in a YAML job; None keeps it out of YAML.
        group: the concern the option belongs to (``"storage"``, ``"executor"``...): ``--help``,
            the reference and the entry points' docstrings list an options class's fields by group.
    """
    return {"help": help, "metavar": metavar, "choices": choices, "yaml": yaml, "group": group}


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
    group: str | None

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
            group=data.get("group"),
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


def field_docs(cls: type) -> dict[str, str]:
    """The ``name: text`` entries of the Google-style ``Args:`` section of ``cls``'s docstring, each
    on one line; ``a, b: text`` describes both."""
    section = (inspect.getdoc(cls) or "").partition("Args:")[2]
    found: dict[str, str] = {}
    names: list[str] = []
    for line in section.splitlines():
        entry = re.match(r"^    (\w+(?:, \w+)*): (.*)", line)
        if entry:
            names = entry[1].split(", ")
            found.update(dict.fromkeys(names, entry[2]))
        elif line.startswith("        ") and names:
            found.update({name: f"{found[name]} {line.strip()}" for name in names})
        elif line.strip():
            break  # the section ends at the first line back at the margin
    return found


class Door:
    """The options one entry point takes as keywords: fields of an options class, declared there once.

    Decorating the entry point (a function, or a class for its ``__init__``) gives it a
    ``__signature__`` listing every option as a keyword-only parameter with its default and type,
    and a docstring whose ``Args:`` describes them after its ``options:`` entry. The body takes
    them as ``**keywords`` and turns them into the options value:

        PREPROCESS = Door(PileOptions, exclude=("key_prefix",))

        @PREPROCESS
        def preprocess(inputs, fn, out, *, options=None, quiet=False, **keywords):
            options = PREPROCESS.options(options, keywords)
    """

    def __init__(
        self, cls: type, *, exclude: Iterable[str] = (), defaults: Mapping[str, Any] | None = None, docs: Mapping[str, str] | None = None
    ) -> None:
        """``defaults`` and ``docs``: where this entry point's default or description of an option differs from the field's."""
        fields = specs(cls)
        exclude = tuple(exclude)
        unknown = [name for name in (*exclude, *(defaults or {}), *(docs or {})) if name not in fields]
        if unknown:
            raise TypeError(f"{cls.__name__} has no fields {', '.join(unknown)}")
        self.cls = cls
        self.names = tuple(name for name in fields if name not in exclude)
        self.defaults = {name: (defaults or {}).get(name, fields[name].default) for name in self.names}
        self.docs = dict(docs or {})
        self.name = cls.__name__  # the entry point's, once decorated
        self.accepted: tuple[str, ...] = self.names  # every keyword it takes, its own included

    def keywords(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every option of this entry point, as given or at its default.

        Raises:
            TypeError: a keyword that is none of them, named with the closest that is.
        """
        for name in given:
            if name not in self.defaults:
                close = difflib.get_close_matches(name, self.accepted, n=1)
                hint = f". Did you mean {close[0]!r}?" if close else ""
                if name in specs(self.cls):  # a field it has no use for
                    hint = f" ({name} is an option of {self.cls.__name__} that {self.name}() does not take)"
                raise TypeError(f"{self.name}() got an unexpected keyword argument {name!r}{hint}")
        return {name: given.get(name, default) for name, default in self.defaults.items()}

    def options(self, options: Any, given: Mapping[str, Any]) -> Any:
        """The options the entry point runs with: ``options``, or one built from the keywords (see :func:`from_call`)."""
        return from_call(self.cls, options, self.keywords(given))

    def __call__(self, target: C) -> C:
        function: Any = vars(target)["__init__"] if isinstance(target, type) else target
        own = inspect.signature(function)
        self.name = function.__qualname__
        self.accepted = (*self.names, *(p.name for p in own.parameters.values() if p.kind is p.KEYWORD_ONLY))
        function.__signature__ = self._signature(own)
        if target.__doc__ is not None:  # None under python -OO
            target.__doc__ = self._document(inspect.cleandoc(target.__doc__))
        return target

    def _signature(self, own: inspect.Signature) -> inspect.Signature:
        """``own`` with the options as keyword-only parameters: in place of its ``**keywords``, right
        after ``options``; or, where it has no ``options`` (it takes a mapping of them), before its ``**``."""
        params = list(own.parameters.values())
        rest = [i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD]
        if not rest:
            raise TypeError(f"{self.name}: an entry point with options takes them as **keywords")
        at = next((i + 1 for i, p in enumerate(params) if p.name == "options" and p.kind is p.KEYWORD_ONLY), None)
        if at is not None:
            del params[rest[0]]
        else:
            at = rest[0]
        types = {f.name: f.type if isinstance(f.type, str) else inspect.formatannotation(f.type) for f in dataclasses.fields(self.cls)}
        added = []
        for name, default in self.defaults.items():
            kind = types[name]
            if default is None and not re.search(r"\bNone\b|\bAny\b", kind):
                kind = f"{kind} | None"  # required without options=, or defaulting to None here
            added.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind))
        return own.replace(parameters=[*params[:at], *added, *params[at:]])

    def _document(self, doc: str) -> str:
        """``doc`` with the options described after its ``options:`` entry."""
        lines = doc.splitlines()
        at = next((i for i, line in enumerate(lines) if re.match(r"    (\*\*)?options: ", line)), None)
        if at is None:
            raise TypeError(f"{self.name}: its docstring needs an 'options:' entry under Args: to list the options after")
        end = next((i for i in range(at + 1, len(lines)) if not lines[i].startswith("        ")), len(lines))
        return "\n".join([*lines[:end], *self.describe(), *lines[end:]])

    def describe(self) -> list[str]:
        """One ``Args:`` entry per option, grouped by concern (options with one description share an entry)."""
        known = {**field_docs(self.cls), **self.docs}
        fields = specs(self.cls)
        groups: dict[str | None, dict[str, list[str]]] = {}
        for name in self.names:
            text = known.get(name) or fields[name].help or ""
            groups.setdefault(fields[name].group, {}).setdefault(text, []).append(name)
        entries = []
        for texts in groups.values():
            for text, names in texts.items():
                entries.append(textwrap.fill(text, 100, initial_indent=f"    {', '.join(names)}: ", subsequent_indent="        "))
        return entries
