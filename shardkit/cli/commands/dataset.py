"""The commands that look after a dataset where it is: ``info`` (what it holds), ``verify`` (every byte checked), ``gc``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shardkit.cli.command import VERBOSE, Command, arg, quiet

# --- info: a dataset's summary, from its manifest --------------------------------------------


def _info_table(summary: Any) -> str:
    from shardkit._util import counted, format_size

    s, b = summary.pile_samples, summary.pile_bytes
    rows = [
        ("dataset", f"{summary.path}  ({summary.kind}, seed {summary.seed}, {summary.created_by})"),
        ("samples", f"{summary.samples:,}"),
        ("fields", ", ".join(summary.fields) or "-"),
        ("bytes", _stored_size(summary)),
        ("piles", f"{summary.piles:,}" + (f"  ({counted(summary.split_piles, 'oversized pile')} split)" if summary.split_piles else "")),
        ("samples/pile", f"min {s.min:,}  mean {s.mean:,.1f}  max {s.max:,}"),
    ]
    if summary.kind == "piles":
        rows.append(("  binomial", f"mean {summary.expected_mean:,.1f}  sd {summary.expected_sd:,.1f}  (uniform router, n/M)"))
    rows.append(("bytes/pile", f"min {format_size(b.min)}  mean {format_size(b.mean)}  max {format_size(b.max)}"))
    ram = "  ".join(f"mix={k}: {format_size(summary.loader_ram(mix=k))}" for k in (2, 4))
    rows.append(("loader RAM", f"{format_size(summary.loader_ram())} (two largest piles; {ram})"))
    if summary.repeat:
        rows.append(("repeat", _repeat_row(summary.repeat, summary.generations)))
    if summary.skipped_units:
        rows.append(("skipped", f"{summary.skipped_units} input units failed and were skipped"))
    return "\n".join(f"{k:<13} {v}" for k, v in rows)


def _repeat_row(repeat: dict[str, Any], generations: tuple[int, ...]) -> str:
    """``by cls; 1000 samples written as 1250: x0 250, x1 500, x3 250``; in a dataset of several
    generations, which one that is (the record is the last write's that repeated samples)."""
    rule = repeat.get("rule")
    by = f"by {rule['field']}" if isinstance(rule, dict) and "field" in rule else f"by {rule}"
    factors = "  ".join(f"x{k} {v:,}" for k, v in (repeat.get("factors") or {}).items())
    row = f"{by}; {repeat.get('input_samples', 0):,} samples written as {repeat.get('written_samples', 0):,}: {factors}"
    g = repeat.get("generation", 0)
    if generations == (g,):
        return row
    held = "" if g in generations or not repeat.get("written_samples") else ", since retired by the window"  # none written: no file
    return f"{row}  (generation {g}{held}, the last write that repeated samples; other generations are not counted here)"


def _stored_size(summary: Any) -> str:
    """``1.2 GiB`` for plain piles; ``420 MiB (zstd, 2.9x smaller: 1.2 GiB of tar)`` for compressed ones."""
    from shardkit._util import format_size

    if summary.compression is None:
        return format_size(summary.bytes)
    return f"{format_size(summary.bytes)} ({summary.compression}, {summary.ratio:.2f}x smaller: {format_size(summary.tar_bytes)} of tar)"


def _run_info(args: argparse.Namespace) -> int:
    import json

    from shardkit.tools.audit import info

    summary = info(args.directory)
    print(json.dumps(summary.to_dict(), indent=1) if args.json else _info_table(summary))
    return 0


INFO = Command(
    name="info",
    help="summarise a dataset: samples, fields, pile sizes, loader RAM",
    description="Summarise a dataset from its manifest (no pile is read).",
    run=_run_info,
    arguments=(
        arg("directory", metavar="DIR", help="a shardkit dataset directory (holds shardkit.json)"),
        arg("--json", action="store_true", help="print JSON instead of a table"),
        VERBOSE,
    ),
)

# --- verify: every pile against the manifest --------------------------------------------------


def _run_verify(args: argparse.Namespace) -> int:
    from shardkit.tools.audit import verify

    problems = verify(args.directory, quiet=args.quiet)
    for problem in problems:
        print(f"{args.directory}: {'warning: ' if problem.warning else ''}{problem}")
    errors = [p for p in problems if not p.warning]
    if errors:
        print(f"shardkit verify: error: {len(errors)} problem(s) found in {args.directory}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"{args.directory}: ok" + (f" ({len(problems)} warning(s))" if problems else ""))
    return 0


VERIFY = Command(
    name="verify",
    help="check every pile's size, checksum, tar structure and sample count against the manifest, and the keys files",
    description="Read every pile (and each segment of a grown one) and compare it with shardkit.json, and each segment's "
    "keys file with its keys. Exit 0 when all is well, 1 listing each problem.",
    run=_run_verify,
    arguments=(
        arg("directory", metavar="DIR", help="a shardkit dataset directory"),
        quiet("no progress bar, no 'ok' line"),
        VERBOSE,
    ),
)

# --- gc: the files no manifest needs any more -------------------------------------------------


def _run_gc(args: argparse.Namespace) -> int:
    from shardkit._util import counted, format_size
    from shardkit.tools.garbage_collect import gc

    report = gc(args.directory, grace=args.grace, dry_run=args.dry_run)
    did = "would delete" if args.dry_run else "deleted"
    kept = ", ".join(map(str, report.kept_generations))
    print(f"{args.directory}: {did} {counted(len(report.deleted), 'file')} ({format_size(report.freed)}); generations kept: {kept}")
    if args.dry_run:  # what the option promises: the files themselves, to check before anything goes
        for name in report.deleted:
            print(f"  {name}")
    if report.skipped:
        shown = ", ".join(report.skipped[:5]) + (", ..." if len(report.skipped) > 5 else "")
        print(f"{args.directory}: left {counted(len(report.skipped), 'file')} no record of this dataset names (not shardkit's): {shown}")
    return 0


GC = Command(
    name="gc",
    help="delete the segment files of a growing dataset that no current manifest lists",
    description=(
        "Delete the pile and segment files no manifest needs: those the current manifest does not list and\n"
        "no generation replaced less than --grace ago lists (a loader pinned to it may still read them).\n"
        "The manifests of older generations go too, so a state taken on one fails naming it, and so does\n"
        "the staging directory of an append that was killed after it published."
    ),
    epilog="example:\n  shardkit gc data/train --grace 1h",
    run=_run_gc,
    arguments=(
        arg("directory", metavar="DIR", help="a shardkit dataset directory"),
        arg("--grace", default="1h", metavar="DURATION", help="keep the files of generations replaced within this long (default 1h)"),
        arg("--dry-run", action="store_true", help="only list what would be deleted"),
        VERBOSE,
    ),
)
