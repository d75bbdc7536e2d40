"""Parse the few tar members of one sample, and hash one key: the per-call work of ``ds[i]``, in plain Python.

The vectorized readers (:class:`~shardkit.tar.shard.Shard`, :func:`~shardkit.tar.keys.key_hashes`)
pay numpy's fixed costs, tens of microseconds, which dwarf one sample of a few members. Here a
sample written as shardkit writes it (one ustar header per regular-file member, no pax or GNU
long-name records) is parsed member by member, each header's checksum checked; anything else
returns None and the caller takes the careful path.

    sample = parse(data)                 # {"__key__": "k", "jpg": b"...", "cls": b"3"}, or None
    key_hash("k") == key_hashes(np.array([b"k"]))[0]
"""

from __future__ import annotations

from typing import Any

from shardkit.tar.index import split_name

_BLOCK = 512
_M64 = (1 << 64) - 1
_SEED = 0xCBF29CE484222325
_MIX = 0x9E3779B97F4A7C15
_FINAL = (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53)
_REGULAR = (0x30, 0)  # typeflag '0' or NUL


def key_hash(key: str) -> int:
    """:func:`shardkit.tar.keys.key_hashes` of one key, without numpy (the same 64-bit value)."""
    data = key.encode("utf-8", "surrogateescape")
    h = _SEED
    for c in range(0, max(1, len(data)), 8):
        word = int.from_bytes(data[c : c + 8], "little")
        if c and not word:
            continue
        mixed = ((h ^ word) * _MIX) & _M64
        h = mixed ^ (mixed >> 29)
    h ^= h >> 33
    h = (h * _FINAL[0]) & _M64
    h ^= h >> 33
    h = (h * _FINAL[1]) & _M64
    return h ^ (h >> 33)


def parse(data: bytes) -> dict[str, Any] | None:
    """The sample in ``data`` (its members, headers included, nothing else) as a dict of raw
    bytes, or None when it is not in the simple form (then read it with ``Shard``)."""
    out: dict[str, Any] = {}
    key = None
    at, end = 0, len(data)
    while at < end:
        head = data[at : at + _BLOCK]
        if len(head) < _BLOCK or head[156] not in _REGULAR or head[345] or head[124] & 0x80:
            return None  # a short header, a link, pax or long-name record, a ustar prefix or a base-256 size
        try:
            size = int(head[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
            stored = int(head[148:156].split(b"\0", 1)[0].strip(), 8)
        except ValueError:
            return None
        if sum(head) - sum(head[148:156]) + 8 * 32 != stored:
            return None
        name = head[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        k, ext = split_name(name)
        if key is None:
            key = out["__key__"] = k
        if k != key or ext in out or ext == "__key__":
            return None
        body = at + _BLOCK
        out[ext] = data[body : body + size]
        at = body + size + (-size % _BLOCK)
    return out if key is not None and at == end else None
