"""The ``shardkit`` command: a thin argparse client of the public Python API.

Every subcommand builds the same option objects a Python user builds and calls the same
functions. Exit codes: 0 success, 1 failure (``error: ...`` on stderr, traceback with ``-v``),
2 usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from shardkit.errors import ShardkitError

log = logging.getLogger(__name__)

Handler = Callable[[argparse.Namespace], int]


def add_pile_args(parser: argparse.ArgumentParser) -> None:
    """Add the pass-1 flags every preprocessing script shares.

    ``--piles --workers --seed --max-pile-bytes --overwrite --on-error --quiet``; turn the parsed
    namespace into keyword arguments for :func:`shardkit.preprocess` with :func:`pile_kwargs`.
    """
    group = parser.add_argument_group("piles (pass 1 of the shuffle)")
    group.add_argument("--piles", type=int, required=True, metavar="M", help="number of pile shards to write (expected pile size n/M)")
    group.add_argument("--workers", type=int, default=1, metavar="N", help="worker processes (output is identical for any N; default 1)")
    group.add_argument(
        "--seed", type=int, default=0, metavar="S", help="router seed: same inputs and seed give byte-identical piles (default 0)"
    )
    group.add_argument(
        "--max-pile-bytes", default=None, metavar="SIZE", help="split piles larger than SIZE (e.g. 2GiB) into random sub-piles"
    )
    group.add_argument("--overwrite", action="store_true", help="replace a dataset already in the output directory")
    group.add_argument("--on-error", choices=("raise", "skip"), default="raise", help="what to do when an input unit fails (default raise)")
    group.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def pile_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for :func:`shardkit.preprocess` from :func:`add_pile_args` flags."""
    return {
        "piles": args.piles,
        "workers": args.workers,
        "seed": args.seed,
        "max_pile_bytes": args.max_pile_bytes,
        "overwrite": args.overwrite,
        "on_error": args.on_error,
        "quiet": args.quiet,
    }


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug) and show tracebacks")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardkit",
        description="Datasets shuffled for free: write piles in preprocessing (pass 1), shuffle them lazily in the loader (pass 2).",
    )
    _common(parser)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    import shardkit._commands  # noqa: F401  (registers the subcommands)

    for register in _COMMANDS:
        register(sub)
    return parser


def _version() -> str:
    from shardkit import __version__

    return __version__


# each entry adds one subcommand to the parser and sets ``handler``; kept in --help order
_COMMANDS: list[Callable[[Any], None]] = []


def command(register: Callable[[Any], None]) -> Callable[[Any], None]:
    _COMMANDS.append(register)
    return register


def guarded(run: Callable[[], int], *, traceback: bool = False) -> int:
    """Run a command body with the CLI's error conventions; returns the exit code.

    A :class:`ShardkitError` prints one ``error: ...`` line and gives 1 (re-raised with
    ``traceback``, for ``-v``); Ctrl-C prints ``interrupted`` and gives 130. Scripts use it too.
    """
    try:
        return run()
    except ShardkitError as e:
        if traceback:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)], format="%(levelname)s %(name)s: %(message)s"
    )
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return guarded(lambda: handler(args), traceback=bool(args.verbose))


if __name__ == "__main__":
    sys.exit(main())
