"""One subcommand of ``shardkit`` declared as data: its name, its texts, its arguments in order, its handler.

    INFO = Command(name="info", help="...", description="...", run=_run_info,
                   arguments=(arg("directory", metavar="DIR", help="..."), VERBOSE))
    INFO.register(sub)   # sub = parser.add_subparsers(...)

An argument is an :func:`arg` (one ``add_argument`` call), an :class:`Options` (one flag per
option field, made by :func:`~shardkit.cli.flags.add_option_flags`), or any function that adds
arguments to a parser (``add_pile_args``). A handler takes the parsed namespace and returns the
exit code; it raises :class:`~shardkit.ShardkitError` for :func:`shardkit.cli.guarded` to report.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardkit.cli.flags import add_option_flags, add_storage_flag

Adds = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class Arg:
    """One ``parser.add_argument(*flags, **settings)`` call."""

    flags: tuple[str, ...]
    settings: Mapping[str, Any]

    def __call__(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(*self.flags, **self.settings)


def arg(*flags: str, **settings: Any) -> Arg:
    """An argument as ``add_argument`` takes it: ``arg("-o", "--out", required=True, help="...")``."""
    return Arg(flags, settings)


def quiet(help: str = "no progress bar") -> Arg:
    """``-q/--quiet``: what it silences differs by command, so the help is the command's."""
    return arg("-q", "--quiet", action="store_true", help=help)


@dataclass(frozen=True)
class Options:
    """One flag per option field named, in that order: ``Options(PileOptions, ["piles", "seed"])``;
    ``overrides`` changes a flag's argparse settings where the command's default differs."""

    cls: type
    names: Sequence[str]
    overrides: Mapping[str, Mapping[str, Any]] | None = None

    def __call__(self, parser: argparse.ArgumentParser) -> None:
        add_option_flags(parser, self.cls, self.names, overrides=self.overrides)


@dataclass(frozen=True)
class Verbose:
    """``-v``, and unless ``storage`` is false ``--storage-option``, accepted after the command
    too (``shardkit pile ... -v``).

    SUPPRESS: a subcommand default must not overwrite a -v given before the subcommand.
    """

    storage: bool = True

    def __call__(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help="log more and show tracebacks")
        if self.storage:
            add_storage_flag(parser)


# the last argument of nearly every command; VERBOSE_ONLY where the command's flags took --storage-option
VERBOSE = Verbose()
VERBOSE_ONLY = Verbose(storage=False)


@dataclass(frozen=True, kw_only=True)
class Command:
    """A subcommand: ``shardkit NAME``, listed in ``shardkit --help`` with ``help``.

    A ``description`` written in lines (it holds a newline) is printed as written, with the
    ``epilog`` (examples) below it; a one-paragraph description is wrapped to the terminal.
    """

    name: str
    help: str
    description: str
    run: Callable[[argparse.Namespace], int]
    arguments: tuple[Adds, ...] = field(default=())
    epilog: str | None = None

    def register(self, sub: Any) -> argparse.ArgumentParser:
        """Add the command's parser to ``sub`` (what ``add_subparsers`` returned) and return it."""
        lines = "\n" in self.description
        parser: argparse.ArgumentParser = sub.add_parser(
            self.name,
            help=self.help,
            description=self.description,
            epilog=self.epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter if lines else argparse.HelpFormatter,
        )
        for add in self.arguments:
            add(parser)
        parser.set_defaults(handler=self.run)
        return parser
