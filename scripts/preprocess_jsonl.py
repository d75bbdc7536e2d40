#!/usr/bin/env python3
"""Write JSON-lines records straight into shuffled pile shards, one record per sample.

Each input file (``.jsonl``, or ``.jsonl.gz``) is one work unit. Every non-blank line must be a
JSON object; it becomes one sample with a single field:

- ``json``: the line itself, byte for byte (so numbers and key order stay exactly as written);
  decode it with ``json.loads``.

The sample key is the record's ``"__key__"``, else its ``"id"``, else ``STEM-LINE`` (the file
name without extensions, dots replaced by ``_``, and the 1-based line number: ``part_1-000000042``).
A line that is not a JSON object, or a key used twice in one file, is an error naming the file
and line. The work is :class:`shardkit.transforms.JsonLines`, the same transform a YAML job names
with ``transform: jsonl``. Example::

    python scripts/preprocess_jsonl.py data/*.jsonl --out piles/ --piles 64 --workers 4
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import shardkit
from shardkit.cli import ArgumentParser, add_version_flag, guarded
from shardkit.piles.transforms import JsonLines


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="preprocess_jsonl.py",
        description="Write JSON-lines records into M randomly chosen pile shards: one sample per line, "
        "its json field the line itself; key from '__key__' or 'id', else FILESTEM-LINENUMBER.",
        epilog="example: python scripts/preprocess_jsonl.py data/*.jsonl --out piles/ --piles 64 --workers 4",
    )
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="JSON-lines files (.jsonl or .jsonl.gz); each file is one work unit")
    parser.add_argument("-o", "--out", required=True, metavar="OUT", help="output directory for pile-*.tar and shardkit.json")
    parser.add_argument("--key", default=None, metavar="FIELD", help="use this record field as the sample key")
    shardkit.add_pile_args(parser)
    add_version_flag(parser)
    return parser


def run(args: argparse.Namespace, records: JsonLines) -> int:
    units, _ = records.prepare(args.inputs)
    manifest = shardkit.preprocess(units, records, args.out, **shardkit.pile_kwargs(args))
    skipped = f", {manifest.skipped_units} files skipped" if manifest.skipped_units else ""
    print(f"{args.out}: {manifest.samples} records from {len(units)} files in {len(manifest.piles)} piles{skipped}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        records = JsonLines(key=args.key)
    except shardkit.ConfigError as e:
        parser.error(str(e))  # a bad flag value is a usage error: exit 2
    return guarded(prog=parser.prog, run=lambda: run(args, records))


if __name__ == "__main__":
    sys.exit(main())
