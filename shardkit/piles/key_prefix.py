"""Choose whether input shards' keys are prefixed by shard: ``key_prefix="auto"`` reads each first key.

Most writers number keys from ``000000`` in every shard, so the keys of ordinary shards repeat
across shards and cannot name a sample of the merged piles. ``"auto"`` (the default of
:func:`shardkit.pile` and :func:`shardkit.shuffle`) reads the first sample key of every input
shard (one header, the start of the file) before any work: when two shards start with the same
key, every key is prefixed with its shard's name (``train-000003/000017``), as
``key_prefix="unit"`` does, and the manifest records it (``extra["key_prefix"] = "unit"``);
otherwise every key is kept as written. Prefixing all keys, not only those that collide, keeps a
rule a reader can undo, and one that does not depend on which samples happen to meet in a pile.
Shards whose keys repeat elsewhere than at their first sample are still refused where two
samples with one key meet, with a message naming ``key_prefix="unit"``.

    resolve("auto", ["a/000000.tar", "a/000001.tar"])   # 'unit': both start with key 000000
"""

from __future__ import annotations

import contextlib
import logging
import tarfile
from collections.abc import Iterator, Sequence
from typing import IO

from shardkit import storage
from shardkit.errors import ShardkitError
from shardkit.tar import compression

log = logging.getLogger(__name__)

# the values of key_prefix, listed once: read by validation, the CLI and YAML
KEY_PREFIX = ("auto", "none", "unit")
# the manifest's extra field that says the keys were prefixed by shard
RECORD = "key_prefix"


@contextlib.contextmanager
def _tar_stream(url: str) -> Iterator[IO[bytes]]:
    """The tar bytes of a shard as a stream, decompressed as its name says."""
    codec = compression.from_name(url)
    with storage.open_read(url) as raw:
        if codec == "zstd":
            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(raw) as unpacked:
                yield unpacked
        elif codec == "gzip":
            import gzip

            with gzip.GzipFile(fileobj=raw) as unpacked:
                yield unpacked  # type: ignore[misc]
        elif codec == "lz4":
            import lz4.frame

            with lz4.frame.LZ4FrameFile(raw, mode="rb") as unpacked:
                yield unpacked
        else:
            yield raw


def first_key(url: str) -> str | None:
    """The key of a shard's first sample (its first regular member's name up to the first dot of
    the file name); None for a shard with no member, or one whose start cannot be read as a tar:
    pass 1 reads it again and reports it in its own words (or skips it, with ``on_error="skip"``).

    Raises:
        StorageError: the store failed to read it.
    """
    try:
        with _tar_stream(url) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                if member.isfile():
                    folder, _, name = member.name.rpartition("/")
                    return (folder + "/" if folder else "") + name.split(".", 1)[0]
    except ShardkitError:
        raise  # a missing file or a storage failure, named by storage
    except Exception:  # tarfile, gzip and zstandard each report a bad stream in their own way
        log.debug("%s: no first key to choose key_prefix by", url, exc_info=True)
    return None


def restart(urls: Sequence[str]) -> tuple[str, str] | None:
    """Two shards whose first samples share a key, or None."""
    seen: dict[str, str] = {}
    for url in urls:
        key = first_key(url)
        if key is None:
            continue
        if key in seen:
            return seen[key], url
        seen[key] = url
    return None


def resolve(value: str, urls: Sequence[str], *, recorded: str | None = None) -> str:
    """``"none"`` or ``"unit"``: ``value`` itself, or what ``"auto"`` chooses for ``urls``.

    ``recorded``: the rule of the dataset an append adds to (its ``extra["key_prefix"]``). Its
    keys are prefixed, so an append's are too, however few shards it brings: unprefixed new keys
    would break the rule a reader undoes, and the next day's shard would collide with them.
    """
    if value != "auto":
        return value
    if recorded == "unit":
        return "unit"
    pair = restart(urls) if len(urls) > 1 else None
    if pair is None:
        return "none"
    log.info("%s and %s both start with one key: every key is prefixed with its shard's name (key_prefix='unit')", *pair)
    return "unit"
