"""Check the key-hash file beside each segment of a grown dataset against the segment: verify's look at what appends trust.

An append checks its new keys against ``<stem>.keys`` beside each segment (the sorted 64-bit
hashes of the segment's keys, :func:`shardkit.manifest.keys_name`) and never reads the old data
to do it, so a file holding the wrong hashes lets a key the dataset already holds in again.
Only segments have one: a dataset pass 1 wrote has none until its first append.

    found = hashes(shard.keys)    # the keys verify read from the segment
    for kind, message in key_file_problems("data/", segment, shard.keys, found): ...
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardkit import storage
from shardkit.errors import DatasetNotFoundError, StorageError
from shardkit.manifest import PileInfo, keys_name
from shardkit.piles.leaves import HASH, keys_damage

# a keys file that is there but not its segment's (an append trusts it) / one that is not there (appends read the segment instead)
DAMAGED = "keys"
MISSING = "missing-keys"


def key_file_problems(directory: str, segment: PileInfo, keys: Sequence[str] | None, found: np.ndarray | None) -> list[tuple[str, str]]:
    """What is wrong with the keys file of ``segment`` in ``directory``, as (kind, message) pairs.

    ``keys`` and their hashes ``found`` are what verify read from the segment (None when it
    could not be read: then only the file's size and order are checked). The messages say what
    puts it right.
    """
    url = storage.join(directory, keys_name(segment.name))
    instead = f"appends read the keys of {segment.name} instead (keys stay unique), and the next one writes it again"
    try:
        data = storage.read_bytes(url)
    except DatasetNotFoundError:
        return [(MISSING, f"missing: {instead}")]
    except OSError as e:  # a StorageError names the file and says why
        said = str(e).removeprefix(f"{url}: ") if isinstance(e, StorageError) else f"cannot be read ({e.strerror or e})"
        return [(DAMAGED, said)]
    way_out = f"delete it: {instead}"
    damage = keys_damage(data, segment.samples)
    if damage is not None:
        return [(DAMAGED, f"{damage}: it is not the key hashes of {segment.name}; {way_out}")]
    if keys is None or found is None or len(found) != segment.samples:
        return []  # the segment itself is reported: nothing to compare with
    held, expected = np.frombuffer(data, dtype=HASH), np.sort(found.astype(HASH))
    wrong = np.flatnonzero(held != expected)
    if not len(wrong):
        return []
    said = f"hash {int(wrong[0])} is not the segment's: the keys file does not match {segment.name} ({len(wrong)} of {len(held)} hashes differ)"
    lost = np.flatnonzero(~np.isin(found, held))
    if len(lost):  # the dangerous half: an append would take these keys again
        said += f"; {len(lost)} of the segment's keys have no hash in it ({keys[int(lost[0])]!r} first), so an append would take them again"
    return [(DAMAGED, f"{said}; {way_out}")]
