#!/usr/bin/env python3
"""Preprocess a folder of class-labelled images straight into shuffled pile shards.

INPUT_DIR holds one subfolder per class (``INPUT_DIR/cat/001.jpg``, ``INPUT_DIR/dog/...``).
Every image is decoded, its short side resized to ``--size`` pixels and re-encoded as JPEG at
``--quality``, then written into one of ``--piles`` random pile shards with three fields:

- ``jpg``: the re-encoded image,
- ``cls``: the class index, by sorted class folder name (also the order of ``classes`` in the
  manifest's ``extra``),
- ``json``: ``{"path": "cat/001.jpg", "class": "cat"}`` (path relative to INPUT_DIR).

Keys are ``CLASS/STEM`` with dots replaced by ``_`` (``cat/img.01.png`` -> ``cat/img_01``); two
images that would share a key are an error. Example::

    python scripts/preprocess_images.py raw/train --out piles/train --piles 256 --workers 8
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import shardkit

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}

# (path relative to the input folder, class name, class index)
Item = tuple[str, str, int]


def scan(root: str) -> tuple[list[str], list[Item]]:
    """Class names and every image under ``root``, in a deterministic order.

    Raises:
        shardkit.DatasetNotFoundError: ``root`` is not a folder or holds no class folder.
        shardkit.ConfigError: two images map to the same sample key.
    """
    if not os.path.isdir(root):
        raise shardkit.DatasetNotFoundError(f"{root}: no such folder")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise shardkit.DatasetNotFoundError(f"{root}: expected one subfolder per class, found none")
    items: list[Item] = []
    seen: dict[str, str] = {}
    for index, name in enumerate(classes):
        for rel in _images(root, name):
            key = sample_key(rel)
            if key in seen:
                raise shardkit.ConfigError(f"{root}: images {seen[key]!r} and {rel!r} would both get the sample key {key!r}; rename one")
            seen[key] = rel
            items.append((rel, name, index))
    return classes, items


def _images(root: str, name: str) -> Iterator[str]:
    """Image paths (relative to ``root``, '/'-separated) in class folder ``name``, sorted."""
    for folder, dirs, files in os.walk(os.path.join(root, name)):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for file in sorted(files):
            if not file.startswith(".") and os.path.splitext(file)[1].lower() in IMAGE_EXTENSIONS:
                yield os.path.relpath(os.path.join(folder, file), root).replace(os.sep, "/")


def sample_key(rel: str) -> str:
    """``cat/sub/img.01.png`` -> ``cat/sub/img_01``: WebDataset keys end at the first dot."""
    stem = os.path.splitext(rel)[0]
    return "/".join(part.replace(".", "_") for part in stem.split("/"))


def encode_image(path: str, size: int, quality: int) -> bytes:
    """Decode, orient, convert to RGB, resize the short side to ``size`` (0 keeps it), JPEG."""
    from PIL import Image, ImageOps

    with Image.open(path) as img:
        if size and img.format == "JPEG":
            scale = size / min(img.size)
            img.draft("RGB", (max(1, round(img.size[0] * scale)), max(1, round(img.size[1] * scale))))
        rgb = ImageOps.exif_transpose(img).convert("RGB")
    if size:
        w, h = rgb.size
        scale = size / min(w, h)
        new = (max(1, round(w * scale)), max(1, round(h * scale)))
        if new != rgb.size:
            rgb = rgb.resize(new, Image.Resampling.BICUBIC, reducing_gap=3.0)
    out = io.BytesIO()
    rgb.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def process(unit: Sequence[Item], *, root: str, size: int, quality: int) -> Iterator[dict[str, Any]]:
    """The samples of one unit (a chunk of images)."""
    for rel, name, index in unit:
        try:
            jpg = encode_image(os.path.join(root, rel), size, quality)
        except (OSError, ValueError, SyntaxError) as e:  # PIL reports broken files with all three
            raise ValueError(f"{os.path.join(root, rel)}: cannot read image ({e})") from e
        yield {"__key__": sample_key(rel), "jpg": jpg, "cls": index, "json": {"path": rel, "class": name}}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Resize and re-encode a folder of class-labelled images (one subfolder per class) "
        "into M randomly chosen pile shards: fields jpg, cls (index by sorted class name) and json.",
        epilog="example: python scripts/preprocess_images.py raw/train --out piles/train --piles 256 --workers 8",
    )
    parser.add_argument("input_dir", metavar="INPUT_DIR", help="folder with one subfolder of images per class")
    parser.add_argument("--out", required=True, metavar="OUT", help="output directory for pile-*.tar and shardkit.json")
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
    shardkit.add_pile_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.size < 0 or not 1 <= args.quality <= 100 or args.images_per_unit < 1:
        parser.error("--size must be >= 0, --quality within 1..100 and --images-per-unit >= 1")
    try:
        classes, items = scan(args.input_dir)
        if not items:
            raise shardkit.DatasetNotFoundError(f"{args.input_dir}: no images found in {len(classes)} class folders")
        step = args.images_per_unit
        units = [items[i : i + step] for i in range(0, len(items), step)]
        fn = functools.partial(process, root=args.input_dir, size=args.size, quality=args.quality)
        manifest = shardkit.preprocess(units, fn, args.out, extra={"classes": classes}, **shardkit.pile_kwargs(args))
    except shardkit.ShardkitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    skipped = f", {manifest.skipped_units} units skipped" if manifest.skipped_units else ""
    print(f"{args.out}: {manifest.samples} images of {len(classes)} classes in {len(manifest.piles)} piles{skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
