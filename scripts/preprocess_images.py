#!/usr/bin/env python3
"""Preprocess a folder of class-labelled images straight into shuffled pile shards.

INPUT_DIR holds one subfolder per class (``INPUT_DIR/cat/001.jpg``, ``INPUT_DIR/dog/...``).
Every image is decoded, its short side resized to ``--size`` pixels and re-encoded as JPEG at
``--quality``, then written into one of ``--piles`` random pile shards with three fields:

- ``jpg``: the re-encoded image,
- ``cls``: the class index, by sorted class folder name (also the order of ``classes`` in the
  manifest's ``extra``); with ``--append`` the dataset's recorded classes keep their indices
  and new classes get the next ones,
- ``json``: ``{"path": "cat/001.jpg", "class": "cat"}`` (path relative to INPUT_DIR).

Keys are ``CLASS/STEM`` with dots replaced by ``_`` (``cat/img.01.png`` -> ``cat/img_01``); two
images that would share a key are an error. The work is :class:`shardkit.transforms.Images`, the
same transform a YAML job names with ``transform: images``. Example::

    python scripts/preprocess_images.py raw/train --out piles/train --piles 256 --workers 8
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import shardkit
from shardkit.cli import ArgumentParser, add_version_flag, guarded
from shardkit.piles.transforms import Images, prepare


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="preprocess_images.py",
        description="Resize and re-encode a folder of class-labelled images (one subfolder per class) "
        "into M randomly chosen pile shards: fields jpg, cls (index by sorted class name) and json.",
        epilog="example: python scripts/preprocess_images.py raw/train --out piles/train --piles 256 --workers 8",
    )
    parser.add_argument("input_dir", metavar="INPUT_DIR", help="folder with one subfolder of images per class")
    parser.add_argument("-o", "--out", required=True, metavar="OUT", help="output directory for pile-*.tar and shardkit.json")
    parser.add_argument(
        "--size", type=int, default=256, metavar="PX", help="resize the short side to PX pixels; 0 keeps the size (default 256)"
    )
    parser.add_argument("--quality", type=int, default=90, metavar="Q", help="JPEG quality 1-100 (default 90)")
    parser.add_argument(
        "--images-per-unit",
        type=int,
        default=64,
        metavar="N",
        help="images per work unit (default 64); with --on-error skip a broken image drops its whole unit, so use 1 to drop only it",
    )
    parser.add_argument(
        "--classes",
        metavar="NAME,NAME,...",
        help="the class map, names in index order (default: sorted folder names; with --append the dataset's map, "
        "new classes after it); it must keep the index of every class the dataset has",
    )
    shardkit.add_pile_args(parser)
    add_version_flag(parser)
    return parser


def run(args: argparse.Namespace, images: Images) -> int:
    kwargs = shardkit.pile_kwargs(args)
    # an append extends the dataset's recorded class map: old classes keep their indices
    units, extra = prepare(images, [args.input_dir], args.out, mode=kwargs["mode"])
    manifest = shardkit.preprocess(units, images, args.out, extra=extra, **kwargs)
    skipped = f", {manifest.skipped_units} units skipped" if manifest.skipped_units else ""
    classes = len(manifest.extra["classes"])  # the dataset's, not only this run's folders
    print(f"{args.out}: {manifest.samples} images of {classes} classes in {len(manifest.piles)} piles{skipped}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        classes = None if args.classes is None else args.classes.split(",")
        images = Images(size=args.size, quality=args.quality, images_per_unit=args.images_per_unit, classes=classes)
    except shardkit.ConfigError as e:
        parser.error(str(e))  # a bad flag value is a usage error: exit 2
    return guarded(prog=parser.prog, run=lambda: run(args, images))


if __name__ == "__main__":
    sys.exit(main())
