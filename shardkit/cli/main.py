"""The ``shardkit`` command: a thin argparse client of the public Python API.

Every subcommand builds the same option objects a Python user builds and calls the same
functions. Exit codes: 0 success, 1 failure (``shardkit pile: error: ...`` on stderr, traceback
with ``-v``), 2 usage error, 130 interrupted. Nothing printed or logged shows a secret: the log
handler masks credentials (:mod:`shardkit.redact`), and the object-store clients' request dumps
are logged only at ``-vvv``.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import sys
import traceback as _traceback
from collections.abc import Callable, Sequence

from shardkit import redact
from shardkit.cli.commands import COMMANDS
from shardkit.cli.flags import add_storage_flag, storage_options
from shardkit.cli.parsing import ArgumentParser, add_version_flag
from shardkit.errors import ShardkitError
from shardkit.storage import check_storage_options, remote

log = logging.getLogger(__name__)

Handler = Callable[[argparse.Namespace], int]


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug, -vvv the S3 client's too) and show tracebacks"
    )
    add_storage_flag(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="shardkit",
        description="Datasets shuffled for free: write piles in preprocessing (pass 1), shuffle them lazily in the loader (pass 2).",
    )
    _common(parser)
    add_version_flag(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for declared in COMMANDS:
        declared.register(sub)
    for name, command in sub.choices.items():  # errors name the command: `shardkit pile: error: ...`
        command.set_defaults(prog=f"{parser.prog} {name}")
    return parser


def guarded(run: Callable[[], int], *, traceback: bool = False, prog: str | None = None) -> int:
    """Run a command body with the CLI's error conventions; returns the exit code.

    A :class:`ShardkitError` prints one ``PROG: error: ...`` line and gives 1 (with
    ``traceback``, for ``-v``, the traceback first, credentials masked); so does an ``OSError``
    that reached here untranslated (shardkit turns the ones it expects into
    :class:`~shardkit.StorageError`, but a disk or a network can fail anywhere, a user's ``fn``
    included). Ctrl-C prints ``interrupted`` and gives 130. Scripts use it too, with their name
    as ``prog``.
    """
    try:
        code = run()
        if sys.stdout is not None:
            sys.stdout.flush()  # output still buffered meets a closed pipe here, where it is handled, not at exit
        return code
    except (ShardkitError, OSError) as e:
        if isinstance(e, BrokenPipeError) and _reader_gone():
            return 141  # as a command killed by SIGPIPE: `shardkit info DIR | head` ends quietly
        if traceback:
            print(redact.mask("".join(_traceback.format_exception(e))).rstrip("\n"), file=sys.stderr)
        print(f"{prog + ': ' if prog else ''}error: {redact.mask(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _reader_gone() -> bool:
    """Whether what reads this process's output has closed it; then stdout is pointed at the null
    device, so that nothing left in its buffer fails again at exit."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        events = poll.poll(0)
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or no stdout to look at
        return False
    if not any(mask & select.POLLERR for _, mask in events):
        return False  # the broken pipe was another one (a child's, a socket's): an error like any other
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    os.close(null)
    return True


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
    for name, value in vars(args).items():
        setattr(args, name, _home(value))
    _log_to_stderr(args.verbose)
    if not args.verbose:  # what a resumed job keeps and does again is said without -v: one line
        logging.getLogger("shardkit.piles.resume").setLevel(logging.INFO)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return guarded(lambda: _run(handler, args), traceback=bool(args.verbose), prog=getattr(args, "prog", None))


def _home(value: object) -> object:
    """A path the shell left as ``~/...`` or ``~user/...`` (quoted, as a pattern is quoted to
    reach shardkit whole) with the home directory in it, as YAML jobs expand it: otherwise
    ``-o '~/out'`` would make a folder named ``~`` here. Lists element by element; anything else as it is."""
    if isinstance(value, str) and value.startswith("~"):
        return os.path.expanduser(value)
    if isinstance(value, list):
        return [_home(v) for v in value]
    return value


# loggers of the object-store clients: their debug output dumps every request
_CLIENT_LOGGERS = ("botocore", "boto3", "aiobotocore", "s3fs", "fsspec", "urllib3", "aiohttp", "gcsfs", "adlfs", "azure")


def _log_to_stderr(verbose: int) -> None:
    """Log to stderr at the level ``-v`` asks, through a handler that masks credentials; the
    clients' request dumps only at ``-vvv``."""
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    redact.remember_environment()
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, redact.MaskingFilter) for f in handler.filters):
            handler.addFilter(redact.MaskingFilter())
    if verbose == 2:
        for name in _CLIENT_LOGGERS:
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(logging.INFO)


def _run(handler: Handler, args: argparse.Namespace) -> int:
    options = storage_options(getattr(args, "storage_option", None))
    if options is None:
        return handler(args)
    check_storage_options(options, what="--storage-option")
    before = remote.registered()
    remote.use_everywhere(options)
    try:
        return handler(args)
    finally:  # main() called from Python leaves the process's storage options as they were
        remote.restore(before)


if __name__ == "__main__":
    sys.exit(main())
