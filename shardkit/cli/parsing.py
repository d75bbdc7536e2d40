"""An argparse parser with the command line's conventions: no abbreviations, errors that name the command and the typo.

parser = ArgumentParser(prog="shardkit")     # allow_abbrev=False unless told otherwise
sub = parser.add_subparsers(dest="command")  # its parsers are ArgumentParsers too
# `shardkit pile x --piels 4` -> "shardkit pile: error: unrecognized argument --piels (did you mean --piles?)"
"""

from __future__ import annotations

import argparse
import difflib
import functools
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

_REQUIRED = "the following arguments are required"
_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` that takes no abbreviation (``--pile 4`` is not ``--piles 4``),
    refuses unknown flags itself (so its error says ``shardkit pile: error:``, not ``shardkit:``),
    names an unknown flag before a missing required one, and suggests the closest flag or command.
    """

    def __init__(self, *args: Any, subcommand: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._subcommand = subcommand
        self._seen: list[str] = []

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", functools.partial(type(self), subcommand=True))
        return super().add_subparsers(**kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> tuple[Any, list[str]]:  # type: ignore[override]
        self._seen = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(self._seen, namespace)
        if extras and self._subcommand:
            # a subcommand's parser gets every argument after its name: what it does not know is a typo here
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        unknown = self._unknown_flags(self._seen)
        if message.startswith(_REQUIRED) and unknown:
            message = f"unrecognized argument{'s' if len(unknown) > 1 else ''} {' '.join(unknown)}"
        message += self._hint(message, unknown)
        super().error(message)

    def _flags(self) -> list[str]:
        return [flag for action in self._actions for flag in action.option_strings]

    def _unknown_flags(self, args: Iterable[str]) -> list[str]:
        known = set(self._flags())
        unknown = []
        for arg in args:
            if arg == "--":
                break
            flag = arg.partition("=")[0]
            if (
                flag.startswith("-")
                and len(flag) > 1
                and not _is_number(flag)
                and flag not in known
                and not self._short_cluster(flag, known)
            ):
                unknown.append(flag)
        return unknown

    @staticmethod
    def _short_cluster(flag: str, known: set[str]) -> bool:
        """``-vv`` or ``-n4``: a known short flag with its value or repeats attached."""
        return not flag.startswith("--") and flag[:2] in known

    def _hint(self, message: str, unknown: list[str]) -> str:
        choice = _CHOICE.search(message)
        if choice is not None:
            options = [c.strip().strip("'") for c in choice.group(2).split(",")]
            return _did_you_mean(choice.group(1), options)
        if message.startswith("unrecognized argument") and unknown:
            return _did_you_mean(unknown[0], self._flags())
        return ""


def _did_you_mean(word: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """``-V/--version``: print ``PROG VERSION`` (shardkit's version) and exit."""
    from shardkit._util import VERSION

    parser.add_argument("-V", "--version", action="version", version=f"%(prog)s {VERSION}", help="print the version and exit")
