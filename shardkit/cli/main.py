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

from shardkit._util import VERSION
from shardkit.cli.commands import COMMANDS
from shardkit.cli.flags import add_storage_flag, storage_options
from shardkit.errors import ShardkitError
from shardkit.storage import remote

log = logging.getLogger(__name__)

Handler = Callable[[argparse.Namespace], int]


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug) and show tracebacks")
    add_storage_flag(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardkit",
        description="Datasets shuffled for free: write piles in preprocessing (pass 1), shuffle them lazily in the loader (pass 2).",
    )
    _common(parser)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
    return parser


def _version() -> str:
    return VERSION


def guarded(run: Callable[[], int], *, traceback: bool = False) -> int:
    """Run a command body with the CLI's error conventions; returns the exit code.

    A :class:`ShardkitError` prints one ``error: ...`` line and gives 1 (re-raised with
    ``traceback``, for ``-v``); so does an ``OSError`` that reached here untranslated (shardkit
    turns the ones it expects into :class:`~shardkit.StorageError`, but a disk or a network can
    fail anywhere, a user's ``fn`` included). Ctrl-C prints ``interrupted`` and gives 130.
    Scripts use it too.
    """
    try:
        return run()
    except (ShardkitError, OSError) as e:
        if traceback:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (130 on Ctrl-C, whenever it comes)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)], format="%(levelname)s %(name)s: %(message)s"
    )
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return guarded(lambda: _run(handler, args), traceback=bool(args.verbose))


def _run(handler: Handler, args: argparse.Namespace) -> int:
    options = storage_options(getattr(args, "storage_option", None))
    if options is None:
        return handler(args)
    before = remote.registered()
    remote.use_everywhere(options)
    try:
        return handler(args)
    finally:  # main() called from Python leaves the process's storage options as they were
        remote.restore(before)


if __name__ == "__main__":
    sys.exit(main())
