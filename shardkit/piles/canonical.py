"""Re-pile an existing tar shard without decoding it: every sample as shardkit's canonical bytes.

What :func:`shardkit.writer.encode_sample` would write for a sample read from a shard is known
without building the sample: the same names and data, plain ustar headers with fixed metadata,
fields in sorted order, zero padding. So a re-piled pile is byte-identical to encoding every
sample afresh, whatever wrote the input, and is made by copying:

- a shard already in that form (shardkit's own piles and shards) is sliced as it is;
- otherwise the headers are rebuilt in that form for all members at once and the data copied
  block by block (webdataset's pax headers and mtimes, tar's owners and modes are dropped);
- a sample that cannot be expressed that way (fields out of order, an extension starting with
  '.' or '__', a long or non-ASCII name, a bad key, a sample too large for a pile) goes through
  ``encode_sample`` itself, which sorts it, adds a pax header or raises its usual error.

    samples = canonical_samples(read_shard(url), url)
    samples.chunks[i]   # sample i's tar bytes, in input order

``prefix`` (from :func:`unit_prefix`) puts the shard's stem in front of every key, so shards
whose keys restart at ``000000`` can be merged: the headers are then rebuilt with the new names.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from shardkit.codecs import DEFAULT, Codecs
from shardkit.piles.encode import check_key, encode_sample
from shardkit.tar import compression, index, scan, write
from shardkit.tar.keys import refuse_repeat

if TYPE_CHECKING:
    from shardkit.storage import Buffer

BLOCK = scan.BLOCK
_WORDS = BLOCK // 8
_SLASH, _DOT, _UNDERSCORE = ord("/"), ord("."), ord("_")


@dataclass
class Samples:
    """The samples of one shard as canonical tar bytes, in input order, with their UTF-8 keys."""

    chunks: list[memoryview | bytes] = field(default_factory=list)
    sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    fields: set[str] = field(default_factory=set)
    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype="S1"))


def unit_prefix(url: str) -> str:
    """The key prefix for a shard's samples: its file name without ``.tar`` (or ``.tar.zst``, ``.tar.gz``...), then ``/``.

    Raises:
        SampleError: the stem cannot start a key (a ``..`` or ``__name__`` stem, a control character).
    """
    name = url.rstrip("/").rsplit("/", 1)[-1]
    for suffix in sorted(compression.SHARD_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    check_key(f"{name}/x")  # a valid directory component: dots are fine there
    return f"{name}/"


def canonical_samples(
    buf: Buffer, source: str, *, max_pile_bytes: int | None = None, codecs: Codecs = DEFAULT, prefix: str = ""
) -> Samples:
    """Every sample of the tar in ``buf`` as the bytes ``encode_sample`` gives for it.

    With ``prefix``, every key (member name) starts with it, as if the sample had been read
    and written again with ``__key__ = prefix + key``.

    Raises:
        CorruptShardError: the shard is not a valid tar (as :func:`shardkit.write.walk`), a
            sample has two members with one extension, or two samples have one key (its
            members are not adjacent).
        SampleError: a sample ``encode_sample`` refuses (bad key, no extension, too large).
    """
    layout = index.index(buf, source)
    if not len(layout):
        return Samples()
    if prefix:
        layout = _prefixed(layout, prefix)
    keylen = layout.key_lengths()
    starts = layout.samples(keylen)
    firsts = starts[:-1]
    keys = layout.sample_keys(firsts, keylen)
    refuse_repeat(source, keys, lambda i: int(layout.heads[firsts[i]]))
    padded = layout.sizes + (-layout.sizes % BLOCK)
    nbytes = np.add.reduceat(BLOCK + padded, firsts)
    fast = np.logical_and.reduceat(_expressible(layout, keylen, starts), firsts)
    if max_pile_bytes is not None:
        fast &= nbytes + len(write.TRAILER) <= max_pile_bytes
    if fast.all() and layout.plain and _canonical_already(layout, padded):
        view = memoryview(buf)
        bounds = layout.sample_bounds(starts).tolist()
        chunks: list[memoryview | bytes] = [view[a:b] for a, b in itertools.pairwise(bounds)]
        return Samples(chunks, nbytes, _extensions(layout, keylen, np.ones(len(layout), dtype=bool)), keys)
    return dataclasses.replace(_rebuilt(layout, keylen, starts, fast, nbytes, max_pile_bytes, codecs), keys=keys)


def _prefixed(layout: index.Layout, prefix: str) -> index.Layout:
    """``layout`` with ``prefix`` in front of every name; no header is canonical any more."""
    pre = np.frombuffer(prefix.encode("utf-8", "surrogateescape"), dtype=np.uint8)
    lengths = np.where(layout.lengths >= 0, layout.lengths + len(pre), -1)
    lengths[lengths > scan.NAME] = -1  # too long for a ustar name: encode_sample adds a pax header
    rows = np.concatenate([np.broadcast_to(pre, (len(layout), len(pre))), layout.rows], axis=1)[:, : scan.NAME]
    rows[lengths < 0] = 0
    names = [prefix + name for name in layout.all_names()] if (lengths < 0).any() else None
    canonical = np.zeros(len(layout), dtype=bool)
    return dataclasses.replace(layout, rows=np.ascontiguousarray(rows), lengths=lengths, names=names, canonical=canonical)


def _expressible(layout: index.Layout, keylen: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per member: its sample can be written by copying it with a canonical header."""
    rows, lengths, n = layout.rows, layout.lengths, len(layout)
    last = rows.shape[1] - 1
    ok = (lengths >= 0) & (rows < 128).all(axis=1) & (layout.sizes <= write.MAX_OCTAL_SIZE)
    at = np.arange(n)
    extlen = lengths - keylen - 1
    ext0 = rows[at, np.clip(keylen + 1, 0, last)]
    ext1 = rows[at, np.clip(keylen + 2, 0, last)]
    # encode_sample strips a leading '.' from a field name and leaves out '__' fields
    ok &= (extlen > 0) & (ext0 != _DOT) & ~((ext0 == _UNDERSCORE) & (ext1 == _UNDERSCORE) & (extlen > 1))
    # the key must pass encode_sample's check: not empty, no empty path component, no control character
    ok &= (keylen > 0) & (rows[at, np.clip(keylen - 1, 0, last)] != _SLASH)
    ok &= ~(((rows < 32) | (rows == 127)) & (keylen[:, None] > np.arange(last + 1))).any(axis=1)
    doubled = (rows[:, :-1] == _SLASH) & (rows[:, 1:] == _SLASH)
    if doubled.any():
        ok &= ~(doubled & (keylen[:, None] > np.arange(1, last + 1))).any(axis=1)
    # fields in strictly increasing order, as encode_sample writes them
    first = np.zeros(n, dtype=bool)
    first[starts[:-1]] = True
    return ok & (first | layout.increasing())


def _canonical_already(layout: index.Layout, padded: np.ndarray) -> bool:
    """Every header is the one shardkit writes, nothing lies between members, padding is zero."""
    if not (layout.plain and layout.canonical.all()):
        return False
    tail = layout.sizes % BLOCK
    partial = np.flatnonzero(tail)
    blocks = scan.blocks_of(layout.buf)
    words = np.take(blocks, (layout.heads[partial] + padded[partial]) // BLOCK, axis=0).view("<u8")
    tail = tail[partial]
    # the last non-zero word of each last block must end before the padding starts
    nonzero = words != 0
    last = _WORDS - 1 - nonzero[:, ::-1].argmax(axis=1)
    last = np.where(nonzero.any(axis=1), last, -1)
    if (last > tail // 8).any():
        return False
    split = last == tail // 8  # the word holding the end of the data: its high bytes are padding
    shift = (tail[split] % 8).astype(np.uint64) * np.uint64(8)
    rows = np.flatnonzero(split)
    return not ((shift == 0) | (words[rows, last[rows]] >> shift != 0)).any()


def _rebuilt(
    layout: index.Layout,
    keylen: np.ndarray,
    starts: np.ndarray,
    fast: np.ndarray,
    nbytes: np.ndarray,
    max_pile_bytes: int | None,
    codecs: Codecs,
) -> Samples:
    """Canonical bytes with new headers for the expressible samples, ``encode_sample`` for the rest."""
    counts = np.diff(starts)
    members = np.repeat(fast, counts)
    out = _copy_with_headers(layout, np.flatnonzero(members))
    view = out.reshape(-1).data
    ends = np.cumsum(np.where(fast, nbytes, 0)).tolist()
    result = Samples(sizes=nbytes.copy(), fields=_extensions(layout, keylen, members))
    for i, ok in enumerate(fast.tolist()):
        if ok:
            result.chunks.append(view[ends[i] - int(nbytes[i]) : ends[i]])
            continue
        data, exts = encode_sample(_sample(layout, int(starts[i]), int(starts[i + 1])), codecs, max_pile_bytes=max_pile_bytes)
        result.chunks.append(data)
        result.sizes[i] = len(data)
        result.fields.update(exts)
    return result


def _copy_with_headers(layout: index.Layout, idx: np.ndarray) -> np.ndarray:
    """Members ``idx`` as one canonical tar body: new headers, data blocks copied, padding zeroed."""
    sizes = layout.sizes[idx]
    data_blocks = (sizes + BLOCK - 1) // BLOCK
    span = 1 + data_blocks
    head = np.cumsum(span) - span
    out = np.empty((int(span.sum()), BLOCK), dtype=np.uint8)
    out[head] = write.headers(layout.rows[idx], sizes)
    total = int(data_blocks.sum())
    if total:
        src = scan.blocks_of(layout.buf)
        before = np.cumsum(data_blocks) - data_blocks
        step = np.arange(total) - np.repeat(before, data_blocks)
        out[np.repeat(head + 1, data_blocks) + step] = src[np.repeat(layout.heads[idx] // BLOCK + 1, data_blocks) + step]
        tail = sizes % BLOCK
        partial = np.flatnonzero(tail)
        last = head[partial] + data_blocks[partial]
        out[last] *= (tail[partial, None] > np.arange(BLOCK)).astype(np.uint8)
    return out


def _sample(layout: index.Layout, lo: int, hi: int) -> dict[str, bytes | str]:
    """Members ``lo:hi`` as the sample dict :class:`shardkit.reader.Shard` hands out."""
    buf = layout.buf
    key, _ = index.split_name(layout.name(lo))
    sample: dict[str, bytes | str] = {"__key__": key}
    for j in range(lo, hi):
        start = int(layout.heads[j]) + BLOCK
        sample[index.split_name(layout.name(j))[1]] = bytes(buf[start : start + int(layout.sizes[j])])
    return sample


def _extensions(layout: index.Layout, keylen: np.ndarray, members: np.ndarray) -> set[str]:
    """The distinct extensions of the chosen members."""
    idx = np.flatnonzero(members)
    return index.distinct_extensions(layout.rows[idx], keylen[idx], layout.lengths[idx])
