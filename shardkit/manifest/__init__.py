"""shardkit.json: the dataset manifest, read, validated and written atomically (always last).

A directory is a shardkit dataset exactly when it holds this file, so a job that dies before
the end never leaves something that looks like a whole dataset. A dataset that grows has
generations: generation g's manifest is also kept as ``shardkit.g<g>.json`` (see
:func:`generation_name`), and a pile may be a list of immutable segment files (:class:`Segment`),
read as one tar.

This module reads and writes the file in a dataset directory; the values it holds are in
:mod:`~shardkit.manifest.model` and the field-by-field check of its JSON in
:mod:`~shardkit.manifest.validation`. Every public name of both is importable from here.
"""

from __future__ import annotations

import errno

from shardkit import storage
from shardkit._util import check_path
from shardkit.dataset import layout
from shardkit.dataset.layout import GENERATION_FILE, generation_name, keys_name, leaf_name, pile_number, whole_pile
from shardkit.errors import DatasetNotFoundError, ManifestError, StorageError
from shardkit.manifest.model import (
    FORMAT,
    FORMAT_VERSION,
    GROWING_VERSION,
    TRAILER_BYTES,
    Manifest,
    PileInfo,
    Segment,
    checksum,
    format_checksum,
    joined,
    original_piles,
)
from shardkit.manifest.validation import MOST, MOST_GENERATION, parse, parse_time

MANIFEST = layout.MANIFEST

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "GENERATION_FILE",
    "GROWING_VERSION",
    "MANIFEST",
    "MOST",
    "MOST_GENERATION",
    "TRAILER_BYTES",
    "Manifest",
    "PileInfo",
    "Segment",
    "checksum",
    "format_checksum",
    "generation_name",
    "is_dataset",
    "joined",
    "keys_name",
    "leaf_name",
    "original_piles",
    "parse",
    "parse_time",
    "pile_number",
    "read",
    "whole_pile",
    "write",
]


def is_dataset(directory: str) -> bool:
    return storage.exists(storage.join(directory, MANIFEST))


def read(directory: str) -> Manifest:
    """Read and validate ``DIRECTORY/shardkit.json``.

    Raises:
        ConfigError: ``directory`` is not a path or URL; DatasetNotFoundError: no manifest there;
        StorageError: it cannot be read (a file, not a directory; no permission...);
        ManifestError: it is not a valid manifest.
    """
    directory = check_path("directory", directory)
    url = storage.join(directory, MANIFEST)
    try:
        text = storage.read_bytes(url).decode("utf-8")
    except DatasetNotFoundError as e:
        if getattr(e, "bucket", None):  # no bucket at all: say that, not "no manifest"
            missing = DatasetNotFoundError(f"{directory}: the bucket {e.bucket} does not exist (a typo? create it first)")  # type: ignore[attr-defined]
            missing.bucket = e.bucket  # type: ignore[attr-defined]
            raise missing from None
        if storage.store_for(directory).local_file() is not None and not storage.exists(directory):  # a mistyped path
            raise DatasetNotFoundError(f"{directory}: no such directory (expected a shardkit dataset)") from None
        raise DatasetNotFoundError(f"{directory}: not a shardkit dataset (no {MANIFEST}; a job that did not finish leaves none)") from None
    except StorageError as e:
        if e.errno == errno.ENOTDIR and storage.exists(directory):  # the name is there, and is no directory
            raise StorageError(
                f"{directory}: is a file, expected a shardkit dataset directory (holding {MANIFEST})", url=url, errno=e.errno
            ) from e
        raise
    except UnicodeDecodeError:
        raise ManifestError(f"{url}: not UTF-8 text") from None
    return parse(text, url)


def write(directory: str, manifest: Manifest) -> None:
    """Write the manifest atomically. Call this last: it is what makes a dataset whole."""
    storage.write_bytes(storage.join(directory, MANIFEST), manifest.to_json().encode("utf-8"))
