"""Command-line flags made from option fields, and the pass-1 flags every preprocessing script shares.

parser = argparse.ArgumentParser()
add_pile_args(parser)     # --piles --workers --seed --max-pile-bytes --buffer-size --overwrite --resume ... --append --quiet --storage-option
shardkit.preprocess(units, fn, out, **pile_kwargs(parser.parse_args()))
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import yaml

from shardkit._util import shown
from shardkit.errors import ConfigError
from shardkit.option_fields import Spec, specs
from shardkit.piles.options import PREPROCESS, PileOptions

T = TypeVar("T")

# the options of shardkit.preprocess every preprocessing script takes as flags; storage options come
# from --storage-option, which every command takes and applies to every URL
PILE_FLAGS = tuple(name for name in PREPROCESS.names if name != "storage_options")


def add_option_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    names: Sequence[str] | None = None,
    *,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Add one flag per option field named (default: every field): ``max_pile_bytes`` becomes ``--max-pile-bytes``.

    The type (int, a bool switch, or text such as a size), the default, ``required``, the
    choices, the help and the metavar all come from the field; ``overrides`` replaces any of
    these argparse settings for one flag, where a command's default differs from the field's.
    """
    fields = specs(cls)
    for name in fields if names is None else names:
        settings = {**_flag_settings(fields[name], cls), **(overrides or {}).get(name, {})}
        if "help" not in (overrides or {}).get(name, {}):
            settings["help"] = _help(fields[name], settings)
        _group(parser, fields[name].group).add_argument(fields[name].flag, dest=name, **settings)


def _group(parser: argparse.ArgumentParser | argparse._ArgumentGroup, group: str | None) -> Any:
    """Where ``--help`` lists an option of ``group``: under "GROUP options", made on first use;
    where the caller gave a group of its own, or the field names none, there."""
    if not isinstance(parser, argparse.ArgumentParser) or group is None:
        return parser
    title = f"{group} options"
    found = next((g for g in parser._action_groups if g.title == title), None)
    return found or parser.add_argument_group(title)


def _flag_settings(spec: Spec, cls: type) -> dict[str, Any]:
    if spec.help is None:
        raise TypeError(f"{cls.__name__}.{spec.name} declares no help text, so it cannot be a command-line flag")
    if spec.is_bool:
        return {"action": "store_true" if spec.default is False else argparse.BooleanOptionalAction, "default": spec.default}
    settings: dict[str, Any] = {"default": spec.default, "required": spec.required}
    if spec.choices is not None:
        settings["choices"] = spec.choices
    else:
        settings["metavar"] = spec.metavar
    if spec.is_int:
        settings["type"] = int
    return settings


def _help(spec: Spec, settings: Mapping[str, Any]) -> str:
    default = settings.get("default")
    if settings.get("required") or default is None or isinstance(default, bool):
        return spec.help or ""
    return f"{spec.help} (default {default})"


def option_values(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    """The parsed values of the flags ``names`` added, as keyword arguments."""
    return {name: getattr(args, name) for name in names}


class _Mode(argparse.Action):
    """``--mode`` and ``--append`` (``--mode append``): each remembers it was given, and a second
    that asks for another mode is refused, in whichever order they come."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None
    ) -> None:
        mode = "append" if option_string == "--append" else values
        flag = "--append" if option_string == "--append" else f"--mode {mode}"
        said = getattr(namespace, "mode_given", None)
        if said is not None and said[1] != mode:
            parser.error(f"{said[0]} and {flag} ask for different modes: give one")
        namespace.mode, namespace.mode_given = mode, (flag, mode)


def options_from_args(cls: type[T], args: argparse.Namespace, names: Sequence[str]) -> T:
    """An option object from flags :func:`add_option_flags` added; fields not named keep their defaults."""
    return cls(**option_values(args, names))


def add_storage_flag(parser: argparse.ArgumentParser) -> None:
    """``--storage-option KEY=VALUE``, repeatable: options for the object store of every remote
    URL the command touches (see :func:`storage_options`)."""
    parser.add_argument(
        "--storage-option",
        dest="storage_option",
        action="append",
        default=argparse.SUPPRESS,
        metavar="KEY=VALUE",
        help="an option for the object store, given to fsspec (endpoint_url=http://..., anon=true, client_kwargs.region_name=...); repeatable",
    )


def storage_options(pairs: Sequence[str] | None) -> dict[str, Any] | None:
    """``["anon=true", "client_kwargs.region_name=eu-west-1"]`` -> ``{"anon": True, "client_kwargs": {"region_name": "eu-west-1"}}``.

    Values are read as YAML scalars (``true``, ``3``, text); dots in a key make nested options.

    Raises:
        ConfigError: a pair without ``=`` or with an empty key (the value is never shown).
    """
    if not pairs:
        return None
    found: dict[str, Any] = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        if not eq or not key or any(not part for part in key.split(".")):
            got = f"the key {key!r}" if eq else "text without '=' (not shown: it may be a secret)"
            raise ConfigError(f"--storage-option: expected KEY=VALUE (e.g. endpoint_url=http://127.0.0.1:9000), got {got}")
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            value = text
        if not isinstance(value, (str, int, float, bool)) or value is None:
            value = text
        *parents, last = key.split(".")
        place = found
        for part in parents:
            place = place.setdefault(part, {})
            if not isinstance(place, dict):
                raise ConfigError(f"--storage-option: {key}: {part} is given both as a value and as a group of options")
        place[last] = value
    return found


def add_pile_args(parser: argparse.ArgumentParser) -> None:
    """Add the pass-1 flags every preprocessing script shares.

    ``--piles --workers --seed --max-pile-bytes --buffer-size --overwrite --resume --on-error --executor --ray-address
    --compression --compression-level --repeat --mode --window --index --append --quiet --storage-option``; turn the parsed
    namespace into keyword arguments for :func:`shardkit.preprocess` with :func:`pile_kwargs`.
    """
    add_option_flags(parser, PileOptions, PILE_FLAGS, overrides={"mode": {"action": _Mode}})
    _group(parser, specs(PileOptions)["mode"].group).add_argument(
        "--append",
        dest="mode",
        action=_Mode,
        nargs=0,
        default=argparse.SUPPRESS,
        help="the same as --mode append: add the samples to the dataset in the output as its next generation",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_storage_flag(parser)


def pile_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for :func:`shardkit.preprocess` from :func:`add_pile_args` flags."""
    if not isinstance(args, argparse.Namespace):
        raise ConfigError(f"args: expected the argparse.Namespace parse_args() returned, got {shown(args)}")
    stored = storage_options(getattr(args, "storage_option", None))
    return {**option_values(args, PILE_FLAGS), "storage_options": stored, "quiet": args.quiet}
