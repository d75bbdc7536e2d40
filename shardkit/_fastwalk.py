"""Index plain ustar archives with numpy: the common case of reading a pile, vectorized.

A pile written by shardkit (and most tars of short names) is a chain of plain ustar headers.
Every 512-byte block that looks like such a header is checked at once (magic, octal size,
checksum, a short name without prefix, a safe path); then the chain is followed from the start,
so data blocks that happen to look like headers are never taken for one. Anything else (pax,
GNU, links, damage) returns None and the member-by-member walk in :mod:`shardkit._tar` decides.

    plain = plain_archive(buf)
    if plain is not None:
        layout = plain.layout()   # keys, sample boundaries, extensions
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from shardkit.storage import Buffer

BLOCK = 512
_USTAR = np.frombuffer(b"ustar\x00", dtype=np.uint8)
_POWERS = 8 ** np.arange(10, -1, -1, dtype=np.int64)
_COLS = np.arange(100)
_READ = 346  # header bytes read: name, size, typeflag, magic, the prefix's first byte


@dataclass(frozen=True, slots=True)
class Plain:
    """Members of a plain archive: header offsets, data sizes, name fields (NUL-padded, cut to
    the longest name plus one) and name lengths."""

    heads: np.ndarray
    sizes: np.ndarray
    named: np.ndarray
    lengths: np.ndarray
    end: int

    def names(self, buf: Buffer) -> list[str]:
        text = self.ascii()
        if text is not None:
            step = self.named.shape[1]
            return [text[i : i + n] for i, n in zip(range(0, len(text), step), self.lengths.tolist(), strict=True)]
        return [buf[h : h + n].decode("utf-8", "surrogateescape") for h, n in zip(self.heads.tolist(), self.lengths.tolist(), strict=True)]

    def ascii(self) -> str | None:
        """All name fields as one string (``named.shape[1]`` characters each), when ASCII."""
        if self.named.max(initial=0) >= 128:
            return None
        return self.named.tobytes().decode("ascii")

    def layout(self) -> Layout | None:
        """Sample keys and boundaries, and the member extensions, split the WebDataset way.

        The key is the name up to the first dot after the last slash; adjacent members with
        equal keys form a sample. When every sample has the same extensions in the same order
        (what a writer of one schema makes), they are found with numpy and named once, not once
        per member. None for non-ASCII names. Duplicate extensions within a sample are not
        checked here (the caller does it).
        """
        text = self.ascii()
        if text is None:
            return None
        named, lengths = self.named, self.lengths
        step = named.shape[1]
        cols = _COLS[:step]
        dots = named == 46
        slashes = named == 47
        if slashes.any():  # only a dot after the last slash splits the key
            dots &= np.where(slashes, cols, -1).max(axis=1)[:, None] < cols
        keylen = np.where(dots.any(axis=1), dots.argmax(axis=1), lengths)
        same = np.zeros(len(named), dtype=bool)
        if len(named) > 1:
            inside = keylen[1:, None] > cols
            same[1:] = (keylen[1:] == keylen[:-1]) & ((named[1:] == named[:-1]) | ~inside).all(axis=1)
        firsts = np.flatnonzero(~same)
        keys = [text[b : b + k] for b, k in zip((firsts * step).tolist(), keylen[firsts].tolist(), strict=True)]
        ext_from = np.minimum(keylen + 1, lengths)
        fields = _repeated_fields(named, ext_from, lengths, firsts, text)
        if fields is not None:
            return Layout(keys, [*firsts.tolist(), len(named)], None, fields)
        base = range(0, len(text), step)
        exts = [text[b + e : b + n] for b, e, n in zip(base, ext_from.tolist(), lengths.tolist(), strict=True)]
        return Layout(keys, [*firsts.tolist(), len(named)], exts, None)


@dataclass(frozen=True, slots=True)
class Layout:
    """How members form samples: ``keys[i]`` owns members ``starts[i]:starts[i + 1]``.

    Either ``exts`` names every member's extension, or ``fields`` says that every sample has
    exactly these extensions, in this order (then ``exts`` is None).
    """

    keys: list[str]
    starts: list[int]
    exts: list[str] | None
    fields: tuple[str, ...] | None


def _repeated_fields(named: np.ndarray, ext_from: np.ndarray, lengths: np.ndarray, firsts: np.ndarray, text: str) -> tuple[str, ...] | None:
    """The extensions every sample has in the same order, or None when samples differ."""
    members, samples = len(named), len(firsts)
    if samples == 0 or members % samples:
        return None
    width = members // samples
    if not (firsts == np.arange(0, members, width)).all():
        return None
    longest = int((lengths - ext_from).max())
    # each extension left-aligned; positions past a name are its NUL padding (the last column)
    at = np.minimum(ext_from[:, None] + _COLS[:longest], named.shape[1] - 1)
    exts = np.take_along_axis(named, at, axis=1).reshape(samples, width, longest)
    if not (exts == exts[0]).all():
        return None
    step = named.shape[1]
    return tuple(text[j * step + int(ext_from[j]) : j * step + int(lengths[j])] for j in range(width))


def plain_archive(buf: Buffer, *, checked: bool = False) -> Plain | None:
    """The :class:`Plain` index of ``buf``, or None when it is not a valid plain archive.

    ``checked``: the bytes already matched the checksum the writer recorded for the whole
    file, so per-header checksums are not summed again.
    """
    nblocks = len(buf) // BLOCK
    if nblocks == 0 or len(buf) % BLOCK:
        return None
    blocks = np.frombuffer(buf, dtype=np.uint8).reshape(nblocks, BLOCK)
    cand = np.flatnonzero(blocks[:, 156] == 48)  # typeflag "0"
    # one gather of the header fields read (up to the prefix), or of whole blocks when their
    # checksums must be summed: gathering scattered headers costs cache misses, not bytes
    rows = blocks[cand] if not checked else blocks[cand, :_READ]
    magic, prefix = rows[:, 257:263], rows[:, 345]
    ok = (magic == _USTAR).all(axis=1) & (prefix == 0) & (rows[:, 99] == 0) & (rows[:, 0] != 0)
    digits = rows[:, 124:135]
    ok &= ((digits >= 48) & (digits <= 55)).all(axis=1) & ((rows[:, 135] == 0) | (rows[:, 135] == 32))
    sizes = (digits.astype(np.int64) - 48) @ _POWERS
    if not checked:
        field = rows[:, 148:156]
        total = np.add.reduce(rows, axis=1, dtype=np.uint32).astype(np.int64)
        ok &= _checksum_field(field) == total - field.sum(axis=1, dtype=np.int64) + 8 * 32
    chain, b = _follow(cand[ok], sizes[ok], nblocks)
    if b > nblocks or not zeros_from(buf, b * BLOCK):
        # truncated, a block that is not a plain header, or data after the end-of-archive
        # marker (a concatenated tar): the careful walk decides, and names the error
        return None
    picked = np.flatnonzero(ok)[np.asarray(chain, dtype=np.int64)]
    named = rows[picked, :100]
    lengths = (named == 0).argmax(axis=1)
    if np.count_nonzero(named) != int(lengths.sum()) or not _safe(named, lengths):
        return None  # bytes after a name's NUL, or an unsafe path: leave it to the careful walk
    # keep only the columns a name reaches: the key/extension split then touches little memory
    width = int(lengths.max(initial=0)) + 1
    return Plain(cand[picked] * BLOCK, sizes[picked], np.ascontiguousarray(named[:, :width]), lengths, b * BLOCK)


def zeros_from(buf: Buffer, offset: int) -> bool:
    """Whether every byte of ``buf`` from ``offset`` on is zero (true past the end)."""
    if offset >= len(buf):
        return True
    return not np.frombuffer(buf, dtype=np.uint8, offset=offset).any()


def _follow(blocks: np.ndarray, sizes: np.ndarray, nblocks: int) -> tuple[list[int], int]:
    """Follow the header chain from block 0; returns the candidates on it and where it stopped.

    Sizes are parsed from octal digits only, so they are never negative and every step of the
    chain moves forward by at least one block.
    """
    steps = 1 + (sizes + BLOCK - 1) // BLOCK
    nxt = blocks + steps
    if len(blocks) and blocks[0] == 0 and (nxt[:-1] == blocks[1:]).all():
        return list(range(len(blocks))), int(nxt[-1])  # every candidate is on the chain
    lookup = dict(zip(blocks.tolist(), range(len(blocks)), strict=True))
    step = steps.tolist()
    chain: list[int] = []
    b = 0
    while b < nblocks:
        c = lookup.get(b, -1)
        if c < 0:
            break
        chain.append(c)
        b += step[c]
    return chain, b


def _checksum_field(field: np.ndarray) -> np.ndarray:
    """Parse (n, 8) checksum fields: optional leading spaces, octal digits, NUL/space end; -1 if not."""
    value = np.zeros(len(field), dtype=np.int64)
    started = np.zeros(len(field), dtype=bool)
    done = np.zeros(len(field), dtype=bool)
    for col in range(field.shape[1]):
        byte = field[:, col].astype(np.int64)
        is_digit = (byte >= 48) & (byte <= 55) & ~done
        value = np.where(is_digit, value * 8 + byte - 48, value)
        started |= is_digit
        done |= started & ~is_digit
    return np.where(started, value, -1)


def _safe(named: np.ndarray, lengths: np.ndarray) -> bool:
    """No name starts with '/' and none has a '..' path component."""
    if (named[:, 0] == 47).any():
        return False
    dotdot = (named[:, :-1] == 46) & (named[:, 1:] == 46)
    if not dotdot.any():
        return True
    rows, cols = np.nonzero(dotdot)
    for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
        before = c == 0 or named[r, c - 1] == 47
        after = c + 2 >= lengths[r] or named[r, c + 2] == 47
        if before and after:
            return False
    return True
