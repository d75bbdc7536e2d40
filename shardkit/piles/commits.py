"""The commit records of pass 1's part directories: what each holds, written atomically, read back and checked.

Now and then, and when it finishes, a process of pass 1 *commits* its part directory: it writes
out its buffers, then renames :data:`COMMIT` into place, a record of the units it has done (and
skipped) and how long each part file and the key-hash file were at that moment. Bytes written
after the last commit belong to no record; a unit is done once a record names it. At resume
every committed part file is checked by name, size and CRC-32 and its uncommitted tail cut off
(:func:`check_all`).

    write_commit(directory, commit)
    committed(staging)          # {directory: Commit} of those that hold a sound one
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import struct
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from shardkit import manifest, storage
from shardkit.dataset import layout
from shardkit.dataset.staging import check_staging
from shardkit.errors import DatasetNotFoundError, Failure, ShardkitError
from shardkit.piles.parts import keys_file, part_file

log = logging.getLogger(__name__)

# the record a committed part directory holds
COMMIT = layout.COMMIT


# 2: one key-hash file a part directory (1 had one a part file): a record of 1 is no commit
_MAGIC = b"shardkit-commit-2\n"


# the key-hash files hold 8 bytes a sample
_HASH_BYTES = 8


@dataclass
class Commit:
    """What a part directory held when it was last committed.

    ``sizes[p]``/``crcs[p]``: length and CRC-32 of part file p; ``counts[p]``: its samples;
    ``segments[p]``: its ``[unit, start, end, samples]`` rows; ``key_runs[p]``: where its key
    hashes are in the key file, which holds ``hashed`` of them (8 bytes each); ``units``: the
    units written completely; ``failures``: the units skipped (``on_error="skip"``);
    ``factors``: input samples by their number of copies (with a repeat rule).
    """

    sizes: list[int]
    crcs: list[int]
    counts: list[int]
    segments: list[Any]
    key_runs: list[Any]
    hashed: int
    fields: set[str]
    units: list[int]
    failures: list[Failure]
    samples: int
    nbytes: int
    factors: dict[int, int] = field(default_factory=dict)


def write_commit(directory: str, commit: Commit) -> None:
    """Record ``commit`` atomically (a rename), once its part files are written.

    Nothing is synced to disk here (a sync per commit costs more than a task's work on a busy
    disk): after a lost machine a record may survive bytes that did not, and the size and
    CRC-32 check at resume finds it. Publishing syncs the piles before the manifest names them.
    """
    commit = dataclasses.replace(commit, failures=[f.portable() for f in commit.failures])
    payload = pickle.dumps(commit, protocol=pickle.HIGHEST_PROTOCOL)
    data = _MAGIC + struct.pack("<I", manifest.checksum(payload)) + payload
    storage.write_bytes(os.path.join(directory, COMMIT), data, sync=False)


def read_commit(directory: str) -> Commit | None:
    """The commit a part directory holds; None when it holds none or one that does not check."""
    try:
        data = storage.read_bytes(os.path.join(directory, COMMIT))
    except ShardkitError:
        return None
    head = len(_MAGIC) + 4
    if not data.startswith(_MAGIC) or len(data) < head:
        return None
    (crc,) = struct.unpack("<I", data[len(_MAGIC) : head])
    if manifest.checksum(data[head:]) != crc:
        return None
    try:
        commit = pickle.loads(data[head:])
    except Exception:
        return None
    return commit if isinstance(commit, Commit) else None


def committed(path: str) -> dict[str, Commit]:
    """The part directories in ``path`` that hold a sound commit."""
    found = {}
    try:
        names = storage.listdir(path)
    except ShardkitError:
        return {}
    for name in names:
        directory = os.path.join(path, name)
        try:
            real = check_staging(directory)  # a link or a file is never followed or read
        except ShardkitError:
            continue
        if real and (commit := read_commit(directory)) is not None:
            found[directory] = commit
    return found


def check_all(found: Mapping[str, Commit], merged: Mapping[int, int]) -> tuple[dict[str, Commit], int]:
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="shardkit-resume") as pool:
        problems = list(pool.map(lambda item: _check_dir(item[0], item[1], skip=merged), found.items()))
    kept: dict[str, Commit] = {}
    claimed: set[int] = set()
    for (directory, commit), problem in zip(found.items(), problems, strict=True):
        units = {*commit.units, *(f.index for f in commit.failures)}
        if problem is None and units & claimed:
            # a task a killed run left on a cluster committed units a later run did again
            problem = f"holds units another committed part holds ({min(units & claimed)}...)"
        if problem is None:
            kept[directory] = commit
            claimed |= units
        else:
            log.warning("%s: %s; its %d units are processed again", directory, problem, len(units))
    return kept, len(found) - len(kept)


def _check_dir(directory: str, commit: Commit, skip: Mapping[int, int]) -> str | None:
    checked = [(keys_file(directory), commit.hashed * _HASH_BYTES)]
    for pile, size in enumerate(commit.sizes):
        if pile not in skip:  # a merged pile's part file went into the pile (a link to it, or deleted)
            checked.append((part_file(directory, pile), size))
    for path, length in checked:
        have = _size(path)  # a pile no unit wrote to has no file
        if have < length:
            return f"{os.path.basename(path)} holds {have} bytes, the commit says {length}"
        if have > length:
            storage.truncate(path, length)  # written after the commit: belongs to no unit that is done
    for pile, (size, crc) in enumerate(zip(commit.sizes, commit.crcs, strict=True)):
        if pile not in skip and size and _crc(part_file(directory, pile), size) != crc:
            return f"{os.path.basename(part_file(directory, pile))} does not match its checksum"
    return None


def _crc(path: str, size: int) -> int:
    crc = 0
    with storage.open_read(path) as f:
        while chunk := f.read(min(1 << 20, size)):
            crc = manifest.checksum(chunk, crc)
    return crc


def _size(path: str) -> int:
    """The size of the file ``path``; 0 when there is none."""
    try:
        return storage.size(path)
    except DatasetNotFoundError:
        return 0
