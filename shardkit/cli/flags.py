"""Command-line flags shared by every pass-1 command and preprocessing script.

parser = argparse.ArgumentParser()
add_pile_args(parser)
shardkit.preprocess(units, fn, out, **pile_kwargs(parser.parse_args()))
"""

from __future__ import annotations

import argparse
from typing import Any


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
