"""Built-in preprocessing transforms: image folders, JSON lines, existing shards.

A transform turns the paths a user names into input units (``units``; ``prepare`` also gives
metadata for the manifest's ``extra``) and each unit into samples (calling it), so it plugs
straight into :func:`shardkit.preprocess`; YAML jobs name
them (``transform: images``) and the preprocessing scripts use the same code. Transforms are
frozen dataclasses: picklable, so they run in worker processes, and validated on creation.

    images = Images(size=224, quality=90)
    units = images.units(["raw/train"])
    shardkit.preprocess(units, images, "piles/train", piles=256, workers=8)
"""

from __future__ import annotations

import inspect
import io
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

from shardkit import manifest, storage
from shardkit._util import check_int, check_most, shown
from shardkit.errors import ConfigError, CorruptShardError, DatasetNotFoundError, SampleError
from shardkit.piles import classes as class_maps
from shardkit.piles.encode import check_key
from shardkit.tar.shard import iter_shard

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})

# the longest side an image may be resized to, and the most images a work unit holds
MAX_SIDE = 1 << 16
MAX_UNIT_IMAGES = 1 << 20


def sample_key(relative: str) -> str:
    """A WebDataset key from a relative path: ``cat/img.01.png`` -> ``cat/img_01``.

    The extension goes and the remaining dots become ``_``: readers end a key at the first dot.
    """
    stem = os.path.splitext(relative.replace(os.sep, "/"))[0]
    return "/".join(part.replace(".", "_") for part in stem.split("/"))


def _unique_keys(pairs: Sequence[tuple[str, str]], where: str) -> None:
    """Refuse two sources that map to one key: ``pairs`` holds (key, source)."""
    seen: dict[str, str] = {}
    for key, source in pairs:
        if key in seen:
            raise ConfigError(f"{where}: {seen[key]!r} and {source!r} would both get the sample key {key!r}; rename one")
        seen[key] = source


# one image: (folder it was found in, path relative to it, class name, class index)
ImageItem = tuple[str, str, str, int]


@dataclass(frozen=True, kw_only=True)
class Images:
    """Image folders with one subfolder per class -> ``jpg``, ``cls`` and ``json`` fields.

    Each image is decoded, turned upright (EXIF), converted to RGB, its short side resized to
    ``size`` pixels (0 keeps the size) and re-encoded as JPEG at ``quality``. ``cls`` is the
    class index by sorted class name over all input folders; ``json`` holds the source path
    (relative to its folder) and the class name. Keys are ``CLASS/STEM`` (see :func:`sample_key`).
    The class map is recorded in the manifest (``extra["classes"]``); an append reads it back
    (``prepare(inputs, recorded=manifest.extra)``), so every class keeps its index and a new
    class gets the next one (see :mod:`shardkit.piles.classes`).

    Args:
        size: short side in pixels after resizing; 0 keeps the original size.
        quality: JPEG quality, 1-100.
        images_per_unit: images per input unit; a unit is what a worker takes at a time and,
            with ``on_error="skip"``, what a broken image drops (use 1 to drop only it).
        classes: the class map to use, names in index order (default: the dataset's recorded
            map, extended by the new classes in sorted order); it must keep the index of every
            class the dataset has and name every class folder.

        images = Images(size=64)
        for sample in images(images.units(["raw/train"])[0]):
            print(sample["__key__"], sample["cls"])
    """

    size: int = 256
    quality: int = 90
    images_per_unit: int = 64
    classes: Sequence[str] | None = None

    def __post_init__(self) -> None:
        check_int("size", self.size, low=0)
        check_most("size", self.size, MAX_SIDE, "pixels on a side, as PIL allows")
        check_int("quality", self.quality, low=1, high=100)
        check_int("images_per_unit", self.images_per_unit, low=1)
        check_most("images_per_unit", self.images_per_unit, MAX_UNIT_IMAGES, "a unit's images are held by one worker")
        if self.classes is not None:
            names = self.classes
            if isinstance(names, str) or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
                raise ConfigError(f"classes: expected a list of distinct class names in index order, got {names!r}")
            object.__setattr__(self, "classes", tuple(names))

    def prepare(self, inputs: Sequence[str], recorded: dict[str, Any] | None = None) -> tuple[list[list[ImageItem]], dict[str, Any]]:
        """Scan the folders; the units (images in a deterministic order) and the manifest's
        ``extra``: the class names in index order and how a sample is checked against them.

        ``recorded``: the ``extra`` of the dataset an append adds to; its class map is kept.

        Raises:
            ConfigError: the recorded map, ``classes`` and the folders cannot be reconciled.
        """
        old = class_maps.recorded(recorded, "images")
        if recorded is not None and old is None:
            raise ConfigError(
                "images: the dataset appended to records no class map (extra['classes']), so the cls of its samples "
                "cannot be matched; append images only to a dataset the image transform wrote"
            )
        classes, items = scan_images(inputs, known=old, given=self.classes)
        step = self.images_per_unit
        extra = {class_maps.CLASSES: classes, class_maps.CHECK_KEY: dict(class_maps.CHECK)}
        return [items[i : i + step] for i in range(0, len(items), step)], extra

    def units(self, inputs: Sequence[str], recorded: dict[str, Any] | None = None) -> list[list[ImageItem]]:
        return self.prepare(inputs, recorded)[0]

    def extra_of(self, units: Sequence[Any], recorded: Sequence[str] | None = None) -> dict[str, Any]:
        """The ``extra`` that :meth:`prepare` gives with ``units``, read back from them (each image
        carries its class name and index): for a caller that passes the units alone, so the map
        is still recorded, and an append still checked against the dataset's. ``recorded``: the
        map of the dataset an append adds to; the units may hold some of its classes, under its
        indices, and new ones after it. ``{}`` for units that are not this transform's (they fail
        as units).

        Raises:
            ConfigError: an index with two names, a class the units number otherwise than
                ``recorded`` (its samples would be relabelled), or a new index with no image (an
                empty class folder), so the map cannot be read from the units.
        """
        try:
            pairs = sorted({(index, name) for unit in units for _, _, name, index in unit})
        except (TypeError, ValueError):
            return {}
        way_out = "pass the extra that made the units: units, extra = shardkit.transforms.prepare(images, inputs, out, mode=...)"
        old = list(recorded or [])
        by_index: dict[int, str] = {}
        by_name = {name: index for index, name in enumerate(old)}
        for index, name in pairs:
            if by_index.setdefault(index, name) != name:
                raise ConfigError(f"extra: the units give class index {index} two names, {by_index[index]!r} and {name!r}; {way_out}")
            if by_name.setdefault(name, index) != index:
                where = "the dataset's map gives it" if name in old else "the units give it"
                raise ConfigError(f"extra: the units number class {name!r} {index}, where {where} {by_name[name]}; {way_out}")
            if index < len(old) and old[index] != name:
                raise ConfigError(
                    f"extra: the units number class {name!r} {index}, which the dataset's map {old} gives to {old[index]!r}: "
                    f"its samples would be relabelled; {way_out}"
                )
        new = [i for i in sorted(by_index) if i >= len(old)]
        if new != list(range(len(old), len(old) + len(new))):
            missing = sorted(set(range(len(old), new[-1] + 1)) - set(new))
            raise ConfigError(
                f"extra: no image of the units has class index {', '.join(map(str, missing))} (an empty class folder?); {way_out}"
            )
        return {class_maps.CLASSES: old + [by_index[i] for i in new], class_maps.CHECK_KEY: dict(class_maps.CHECK)}

    def __call__(self, unit: Sequence[ImageItem]) -> Iterator[dict[str, Any]]:
        for root, relative, name, index in unit:
            path = os.path.join(root, relative)
            try:
                jpg = encode_image(path, size=self.size, quality=self.quality)
            except (OSError, ValueError, SyntaxError) as e:  # Pillow reports broken files as any of these
                raise SampleError(f"{path}: cannot read image ({e})") from e
            yield {"__key__": sample_key(relative), "jpg": jpg, "cls": index, "json": {"path": relative, "class": name}}


def not_a_folder(path: str) -> str | None:
    """Why ``path`` is no folder (``"a file, not a folder"``, ``"no such folder"``), or None when it is one."""
    if os.path.isdir(path):
        return None
    return "a file, not a folder" if os.path.exists(path) else "no such folder"


def _class_folders(root: str) -> list[str]:
    if (why := not_a_folder(root)) is not None:
        raise DatasetNotFoundError(f"{root}: {why}: expected a folder of one subfolder per class")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise DatasetNotFoundError(f"{root}: expected one subfolder per class, found none")
    return classes


def _images_in(root: str, folder: str) -> Iterator[str]:
    """Image paths under ``root/folder``, relative to ``root`` and '/'-separated, sorted."""
    for here, dirs, files in os.walk(os.path.join(root, folder)):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for file in sorted(files):
            if not file.startswith(".") and os.path.splitext(file)[1].lower() in IMAGE_EXTENSIONS:
                yield os.path.relpath(os.path.join(here, file), root).replace(os.sep, "/")


def scan_images(
    roots: Sequence[str], *, known: Sequence[str] | None = None, given: Sequence[str] | None = None
) -> tuple[list[str], list[ImageItem]]:
    """The class map and every image under the class folders of ``roots``, in order.

    The map is ``known`` (a dataset's recorded one) extended by the classes found in sorted
    order, or ``given`` (see :func:`shardkit.piles.classes.reconcile`).

    Raises:
        DatasetNotFoundError: a root is missing, has no class folder, or no image is found.
        ConfigError: two images would get the same sample key; the maps cannot be reconciled.
    """
    per_root = {root: _class_folders(root) for root in roots}
    found = sorted({name for names in per_root.values() for name in names})
    classes = class_maps.reconcile(known, found, given=given, where=f"{', '.join(roots)}: images")
    index = {name: i for i, name in enumerate(classes)}
    items = [(root, rel, name, index[name]) for root, names in per_root.items() for name in names for rel in _images_in(root, name)]
    if not items:
        raise DatasetNotFoundError(f"{', '.join(roots)}: no images found in {len(found)} class folders")
    _unique_keys([(sample_key(rel), os.path.join(root, rel)) for root, rel, _, _ in items], "images")
    return classes, items


def encode_image(path: str, *, size: int, quality: int) -> bytes:
    """Decode, orient, convert to RGB, resize the short side to ``size`` (0 keeps it), encode JPEG."""
    from PIL import Image, ImageOps

    with Image.open(path) as img:
        if size and img.format == "JPEG":
            # let libjpeg decode at a reduced scale: much faster for large photos
            scale = size / min(img.size)
            img.draft("RGB", (max(1, round(img.size[0] * scale)), max(1, round(img.size[1] * scale))))
        rgb = ImageOps.exif_transpose(img).convert("RGB")
    if size:
        w, h = rgb.size
        scale = size / min(w, h)
        target = (max(1, round(w * scale)), max(1, round(h * scale)))
        if target != rgb.size:
            rgb = rgb.resize(target, Image.Resampling.BICUBIC, reducing_gap=3.0)
    out = io.BytesIO()
    rgb.save(out, format="JPEG", quality=quality)
    return out.getvalue()


@dataclass(frozen=True, kw_only=True)
class JsonLines:
    """JSON-lines files, one record a sample whose ``json`` field is the line exactly as written.

    Each file (``.jsonl``, ``.ndjson``, ``.gz`` decompressed) is one input unit; every non-blank
    line must be a JSON object. The key is the record's ``key`` field when ``key`` is given,
    else its ``"__key__"``, else its ``"id"``, else ``STEM-LINE``: the file name without its
    extensions, dots replaced by ``_``, and the 1-based line number (``part_1-000000042``).
    A key must be a string or an integer, as in a Parquet key column. A line that is not a JSON
    object, a key of another type, or a key used twice in one file, is an error naming the file
    and the line.

    Args:
        key: a record field every record has, used as the sample key.

        jsonl = JsonLines()
        shardkit.preprocess(jsonl.units(["raw/*.jsonl"]), jsonl, "out/", piles=64)
    """

    key: str | None = None

    def __post_init__(self) -> None:
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise ConfigError(f"key: expected a record field name, got {self.key!r}")

    def prepare(self, inputs: Sequence[str], recorded: dict[str, Any] | None = None) -> tuple[list[str], dict[str, Any]]:
        """The files the paths, globs and brace patterns name (DatasetNotFoundError if none);
        no dataset-wide state, so ``recorded`` is not needed."""
        return storage.expand(list(inputs), once=True), {}

    def units(self, inputs: Sequence[str]) -> list[str]:
        return self.prepare(inputs)[0]

    def __call__(self, unit: str) -> Iterator[dict[str, Any]]:
        stem = file_stem(unit)
        seen: dict[str, int] = {}
        for number, raw in enumerate(_lines(unit), start=1):
            line = raw.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, an int past 4300 digits, deep nesting
                raise SampleError(f"{unit}: line {number}: not valid JSON ({e})") from None
            if not isinstance(record, dict):
                raise SampleError(f"{unit}: line {number}: expected a JSON object, got {type(record).__name__}")
            key = self._key(record, stem, unit, number)
            if key in seen:
                raise SampleError(f"{unit}: line {number}: key {key!r} was already used on line {seen[key]}")
            seen[key] = number
            yield {"__key__": key, "json": line}

    def _key(self, record: dict[str, Any], stem: str, unit: str, number: int) -> str:
        if self.key is not None:
            if record.get(self.key) in (None, ""):
                raise SampleError(f"{unit}: line {number}: record has no {self.key!r} field to use as its key")
            return _key_text(record[self.key], self.key, unit, number)
        for name in ("__key__", "id"):
            if record.get(name) not in (None, ""):
                return _key_text(record[name], name, unit, number)
        return f"{stem}-{number:09d}"


def _key_text(value: Any, name: str, unit: str, number: int) -> str:
    """A record's key field as its sample key: a string, or an integer in decimal.

    The values a key column of a Parquet or Arrow input takes (readers/columns.py); str() of
    anything else is a Python repr (``[1, 2]``, ``True``) or has a dot (``1.5``), no key.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise SampleError(f"{unit}: line {number}: key field {name!r}: expected a non-empty string or an integer, got {shown(value)}")
    try:
        return check_key(value)
    except SampleError as e:  # a dot, a control character...: said here, where the line is known
        raise SampleError(f"{unit}: line {number}: key field {name!r}: {e}") from None


def file_stem(path: str) -> str:
    """``data/part.1.jsonl.gz`` -> ``part_1``: a key prefix without dots."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    for ext in (".gz", ".jsonl", ".ndjson", ".json"):
        name = name.removesuffix(ext)
    return name.replace(".", "_")


def _lines(url: str) -> Iterator[bytes]:
    with storage.open_read(url) as raw:
        if url.endswith(".gz"):
            import gzip
            import zlib

            number = 0
            try:
                with gzip.GzipFile(fileobj=raw) as unzipped:
                    for line in unzipped:
                        number += 1
                        yield line
            except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # the file's bytes, not the storage: corrupt, not a StorageError
                raise CorruptShardError(f"{url}: line {number + 1}: not valid gzip: corrupt or truncated ({e})") from None
        else:
            yield from raw


@dataclass(frozen=True, kw_only=True)
class Shards:
    """Existing WebDataset tar shards, one unit per shard, samples passed on as raw bytes.

    shards = Shards()
    shardkit.preprocess(shards.units(["old/shard-{000..099}.tar"]), shards, "new/", piles=64)
    """

    def prepare(self, inputs: Sequence[str], recorded: dict[str, Any] | None = None) -> tuple[list[str], dict[str, Any]]:
        return storage.expand(list(inputs), once=True), {}

    def units(self, inputs: Sequence[str]) -> list[str]:
        return self.prepare(inputs)[0]

    def __call__(self, unit: str) -> Iterator[dict[str, Any]]:
        return iter_shard(unit)


def prepare(transform: Any, inputs: Sequence[str], out: str, *, mode: str) -> tuple[list[Any], dict[str, Any]]:
    """The units and manifest ``extra`` of ``transform`` over ``inputs`` for a job writing ``out``.

    With ``mode="append"`` the dataset's recorded ``extra`` is read first and handed on to a
    ``prepare`` that takes it (``recorded``), so a transform that derives fields from
    dataset-wide state (the image transform's class map) extends the dataset's state instead of
    recomputing it from the new inputs alone. Readers, which derive nothing, get the inputs only.
    """
    if "recorded" not in inspect.signature(transform.prepare).parameters:
        units, extra = transform.prepare(list(inputs))
        return list(units), extra
    recorded = manifest.read(out).extra if mode == "append" and manifest.is_dataset(out) else None
    units, extra = transform.prepare(list(inputs), recorded)
    return list(units), extra


TRANSFORMS: dict[str, type[Images] | type[JsonLines] | type[Shards]] = {"images": Images, "jsonl": JsonLines, "shards": Shards}


def get(name: str, **args: Any) -> Images | JsonLines | Shards:
    """The built-in transform ``name`` made with ``args``.

    Raises:
        ConfigError: an unknown transform, an unknown argument or a bad value (named).
    """
    if name not in TRANSFORMS:
        raise ConfigError(f"expected one of {', '.join(TRANSFORMS)}, got {name!r}")
    cls = TRANSFORMS[name]
    allowed = [f.name for f in fields(cls)]
    for arg in args:
        if arg not in allowed:
            expected = f"expected one of: {', '.join(allowed)}" if allowed else "it takes none"
            raise ConfigError(f"{arg}: unknown argument for transform {name!r} ({expected})")
    return cls(**args)
