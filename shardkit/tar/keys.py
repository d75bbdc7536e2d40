"""Sample keys as arrays: 64-bit hashes, the first key two samples share, and how that is said.

A key names one sample (WebDataset readers group adjacent members by key), so two samples with
one key are an error wherever they are: a reader that looks samples up by key, or joins labels
kept elsewhere, mixes them up, and two that meet in a file are read back as one sample. Keys
here are numpy bytes (``S`` dtype) of the names' UTF-8 bytes; a key never holds a NUL byte (tar
names end at one, and shardkit refuses control characters), so numpy's zero padding is never
part of a key.

    pair = first_repeat(keys)             # (i, j): sample i has the key of sample j < i, or None
    message = repeated_key(keys[i], sample_at(i, "offset 4096"), sample_at(j, "offset 0"))
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from shardkit.errors import CorruptShardError

_SEED = np.uint64(0xCBF29CE484222325)
_MIX = np.uint64(0x9E3779B97F4A7C15)
_FINAL = (np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53))


def key_hashes(keys: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each key, the same in every process and for any width of ``keys``.

    Eight bytes are mixed in at a time, with numpy over all keys at once (a few nanoseconds a
    key); a word of padding leaves the hash as it is, so ``b"ab"`` hashes alike as ``S2`` and
    ``S40``. Equal hashes only say two keys may be equal: callers compare the keys themselves.
    """
    n, width = len(keys), keys.dtype.itemsize
    if n == 0 or width == 0:
        return np.full(n, _SEED, dtype=np.uint64)
    words = -(-width // 8)
    padded = np.zeros((n, 8 * words), dtype=np.uint8)
    padded[:, :width] = np.ascontiguousarray(keys).view(np.uint8).reshape(n, width)
    columns = padded.view("<u8")
    h = np.full(n, _SEED, dtype=np.uint64)
    for c in range(words):
        word = columns[:, c]
        mixed = h ^ word
        mixed *= _MIX
        mixed ^= mixed >> np.uint64(29)
        # every key has a first byte; later words of zeros are padding
        np.copyto(h, mixed, where=word != 0 if c else True)
    # the murmur3 finalizer: every input bit reaches every output bit
    h ^= h >> np.uint64(33)
    h *= _FINAL[0]
    h ^= h >> np.uint64(33)
    h *= _FINAL[1]
    h ^= h >> np.uint64(33)
    return h


def first_repeat(keys: np.ndarray) -> tuple[int, int] | None:
    """The first sample whose key an earlier one has, as ``(i, j)`` with ``j < i``; None if all differ.

    Keys in increasing order (numbered samples, the usual case) cost one comparison each. Any
    other order is hashed and the hashes sorted; keys whose hashes meet are compared as bytes,
    so a hash collision is never reported.
    """
    if len(keys) < 2 or (keys[1:] > keys[:-1]).all():
        return None
    hashes = key_hashes(keys)
    ordered = np.sort(hashes)
    same = ordered[1:] == ordered[:-1]
    if not same.any():
        return None
    first: dict[bytes, int] = {}
    for i in np.flatnonzero(np.isin(hashes, ordered[1:][same])).tolist():  # in sample order
        j = first.setdefault(bytes(keys[i]), i)
        if j != i:
            return i, j
    return None


def sample_at(i: int, *details: str) -> str:
    """``"sample 17 (offset 8704, input unit 5)"``: a sample by position, with what else is known."""
    return f"sample {i} ({', '.join(details)})" if details else f"sample {i}"


def repeated_key(key: str | bytes, later: str, earlier: str) -> str:
    """The one wording for two samples with one key (``later`` and ``earlier`` from :func:`sample_at`);
    the caller puts where in front and may add advice after it."""
    shown = key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else key
    return f"{later} has the key {shown!r} of {earlier}: keys must be unique"


def refuse_repeat(source: str, keys: np.ndarray, offset: Callable[[int], int]) -> None:
    """Raise if two samples of the shard ``source`` have one key (``offset(i)``: where sample i starts).

    In a shard, that is a key whose members are not adjacent (``a.jpg b.jpg a.cls``): a reader
    would hand out two half samples.

    Raises:
        CorruptShardError: naming both samples, their offsets and the key.
    """
    pair = first_repeat(keys)
    if pair is not None:
        i, j = pair
        said = repeated_key(bytes(keys[i]), sample_at(i, f"offset {offset(i)}"), sample_at(j, f"offset {offset(j)}"))
        raise CorruptShardError(
            f"{source}: {said}, and the members of one sample adjacent (a tar of a folder lists files in the order the "
            "file system keeps them: make it with `tar cf x.tar --sort=name -C DIR .`)"
        )
