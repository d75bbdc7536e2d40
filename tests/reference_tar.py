"""A plain-Python reference for grouping tar members into samples, for tests to check the
vectorized index against: one loop over the names, the WebDataset rule spelled out."""

from __future__ import annotations

from shardkit.errors import CorruptShardError
from shardkit.tar.scan import BLOCK
from shardkit.tar.walk import Members


def split_name(name: str) -> tuple[str, str]:
    """(key, extension): the key ends at the first dot after the last slash."""
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    return (name, "") if dot < 0 else (name[:dot], name[dot + 1 :])


def group(members: Members, source: str) -> tuple[list[str], list[int]]:
    """Sample keys, and where each sample's members start (one more entry: the member count).

    Raises CorruptShardError when a sample has two members of one extension."""
    keys: list[str] = []
    starts: list[int] = []
    previous, exts = None, set()
    for i, name in enumerate(members.names):
        key, ext = split_name(name)
        if key != previous:
            keys.append(key)
            starts.append(i)
            previous, exts = key, {ext}
        elif ext in exts:
            raise CorruptShardError(
                f"{source}: member {i} ({name!r}) at offset {members.offsets[i] - BLOCK}: sample {key!r} already has a {ext!r} member"
            )
        else:
            exts.add(ext)
    return keys, [*starts, len(members.names)]


def sample_spans(members: Members, starts: list[int]) -> list[int]:
    """Byte bounds of each sample, headers included: from the end of the one before to the
    padded end of its last member."""
    bounds = [0]
    for i in range(1, len(starts)):
        last = starts[i] - 1
        size = members.sizes[last]
        bounds.append(members.offsets[last] + size + (-size % BLOCK))
    return bounds
