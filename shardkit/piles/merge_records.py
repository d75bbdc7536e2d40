"""What pass 1's merge records in its staging: each finished pile, so a resumed job takes it up.

The merge writes ``pile-000003.tar.done`` beside each pile it finished (its files, sizes,
checksums and samples) and ``merge.json`` (what it was asked for) before any pile. A job
stopped in the merge and run again with ``resume=True`` keeps the piles a record names
(:func:`finished_piles`); a job stopped after its manifest went in is found published by
comparing the records with the manifest (:func:`merged_infos`).

    begin_merge(staging, {"compression": None, "level": None})
    finished_piles(staging, {"compression": None, "level": None})   # {pile: samples}
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardkit import manifest, storage
from shardkit.dataset import layout
from shardkit.errors import ShardkitError
from shardkit.manifest import PileInfo


@dataclass(frozen=True)
class Staged:
    """A finished pile file in the staging directory, waiting to be moved into place.

    ``size`` and ``crc`` are the file's; a compressed pile also has its tar's (``tar``).
    """

    path: str
    name: str
    samples: int
    size: int
    crc: int
    compression: str | None = None
    tar: tuple[int, int] | None = None  # (size, crc) of the tar inside a compressed pile

    @property
    def tar_size(self) -> int:
        return self.size if self.tar is None else self.tar[0]

    def info(self) -> PileInfo:
        """Its manifest entry."""
        if self.tar is None:
            return PileInfo(name=self.name, samples=self.samples, bytes=self.size, checksum=manifest.format_checksum(self.crc))
        return PileInfo(
            name=self.name,
            samples=self.samples,
            bytes=self.size,
            checksum=manifest.format_checksum(self.crc),
            compression=self.compression,
            tar_bytes=self.tar[0],
            tar_checksum=manifest.format_checksum(self.tar[1]),
        )


# what a merge in a staging directory was asked for: its finished piles serve a resumed job only
# if it asks for the same (the job's fingerprint covers the rest: piles, seed, max_pile_bytes)
MERGE = layout.MERGE


_DONE = layout.DONE_FILE


def begin_merge(staging: str, merge: Mapping[str, Any]) -> None:
    """Record what the merge in ``staging`` makes (compression and level), before any pile."""
    storage.makedirs(staging)
    storage.write_bytes(os.path.join(staging, MERGE), json.dumps(dict(merge), sort_keys=True).encode())


def finished_piles(staging: str, merge: Mapping[str, Any]) -> dict[int, int]:
    """The piles a stopped merge in ``staging`` finished, with their samples: each has a record
    and every file it names is there at its size. None count when the merge was asked for
    something else than ``merge`` (another compression), or there was none."""
    try:
        said = json.loads(storage.read_bytes(os.path.join(staging, MERGE)))
        names = storage.listdir(staging)
    except (ValueError, ShardkitError):
        return {}
    if said != json.loads(json.dumps(dict(merge), sort_keys=True)):
        return {}
    found = {}
    for name in names:
        if (match := _DONE.fullmatch(name)) is None:
            continue
        try:
            pieces, _ = read_record(os.path.join(staging, name))
        except (OSError, ValueError, TypeError, ShardkitError):
            continue
        if all(_size(p.path) == p.size for p in pieces):
            found[int(match.group(1))] = sum(p.samples for p in pieces)
    return found


def merged_infos(staging: str) -> list[PileInfo]:
    """The manifest entries of the piles the merge in ``staging`` recorded as finished, in no
    order (their files are not looked at); none when it recorded none."""
    names = storage.listdir(staging, missing_ok=True)
    infos = []
    for name in names:
        if _DONE.fullmatch(name) is not None:
            try:
                pieces, _ = read_record(os.path.join(staging, name))
            except (OSError, ValueError, TypeError, ShardkitError):
                continue
            infos += [piece.info() for piece in pieces]
    return infos


def read_record(record: str) -> tuple[list[Staged], bool]:
    """The finished pile (or its sub-piles) a record names, and whether it was split."""
    pieces, split = json.loads(storage.read_bytes(record))
    staged = [Staged(*piece) for piece in pieces]
    return [dataclasses.replace(p, tar=(p.tar[0], p.tar[1])) if p.tar is not None else p for p in staged], bool(split)


def write_record(record: str, staged: list[Staged], split: bool) -> None:
    """Record a finished pile (renamed into place but not synced: it guards against a process
    that dies, as a retry needs)."""
    storage.write_bytes(record, json.dumps([[dataclasses.astuple(p) for p in staged], split]).encode(), sync=False)


def _size(path: str) -> int | None:
    """The size of the file ``path``; None when it is not there."""
    try:
        return storage.size(path)
    except ShardkitError:
        return None
