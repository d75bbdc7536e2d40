#!/usr/bin/env python3
"""Write JSON-lines records straight into shuffled pile shards, one record per sample.

Each input file (``.jsonl``, or ``.jsonl.gz``) is one work unit. Every non-blank line must be a
JSON object; it becomes one sample with a single field:

- ``json``: the line itself, byte for byte (so numbers and key order stay exactly as written);
  decode it with ``json.loads``.

The sample key is the record's ``"__key__"``, else its ``"id"``, else ``STEM-LINE`` (the file
name without extensions, dots replaced by ``_``, and the 1-based line number: ``part_1-000000042``).
A line that is not a JSON object, or a key used twice in one file, is an error naming the file
and line. Example::

    python scripts/preprocess_jsonl.py data/*.jsonl --out piles/ --piles 64 --workers 4
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import IO, Any

import shardkit


def _open(path: str) -> gzip.GzipFile | IO[bytes]:
    return gzip.GzipFile(path, "rb") if path.endswith(".gz") else open(path, "rb")


def file_stem(path: str) -> str:
    """``data/part.1.jsonl.gz`` -> ``part_1``: a key prefix with no dots."""
    name = os.path.basename(path)
    for ext in (".gz", ".jsonl", ".ndjson", ".json"):
        if name.endswith(ext):
            name = name[: -len(ext)]
    return name.replace(".", "_")


def _key(record: dict[str, Any], stem: str, line: int) -> str:
    for field in ("__key__", "id"):
        value = record.get(field)
        if value is not None and value != "":
            return str(value)
    return f"{stem}-{line:09d}"


def records(path: str) -> Iterator[dict[str, Any]]:
    """The samples of one JSON-lines file.

    Raises:
        ValueError: a line that is not a JSON object, or a key seen earlier in the file.
    """
    stem = file_stem(path)
    seen: dict[str, int] = {}
    with _open(path) as f:
        for line_no, raw in enumerate(f, 1):
            line = raw.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ValueError(f"{path}: line {line_no}: not valid JSON ({e})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}: line {line_no}: expected a JSON object, got {type(record).__name__}")
            key = _key(record, stem, line_no)
            if key in seen:
                raise ValueError(f"{path}: line {line_no}: key {key!r} was already used on line {seen[key]}")
            seen[key] = line_no
            yield {"__key__": key, "json": line}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Write JSON-lines records into M randomly chosen pile shards: one sample per line, "
        "its json field the line itself; key from '__key__' or 'id', else FILESTEM-LINENUMBER.",
        epilog="example: python scripts/preprocess_jsonl.py data/*.jsonl --out piles/ --piles 64 --workers 4",
    )
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="JSON-lines files (.jsonl or .jsonl.gz); each file is one work unit")
    parser.add_argument("--out", required=True, metavar="OUT", help="output directory for pile-*.tar and shardkit.json")
    shardkit.add_pile_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        for path in args.inputs:
            if not os.path.isfile(path):
                raise shardkit.DatasetNotFoundError(f"{path}: no such file")
        manifest = shardkit.preprocess(args.inputs, records, args.out, **shardkit.pile_kwargs(args))
    except shardkit.ShardkitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    skipped = f", {manifest.skipped_units} files skipped" if manifest.skipped_units else ""
    print(f"{args.out}: {manifest.samples} records from {len(args.inputs)} files in {len(manifest.piles)} piles{skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
