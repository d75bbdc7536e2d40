"""Turn the samples a writer holds for each pile into tar bytes when they are written, many at a time.

:class:`SampleSink` is the :class:`~shardkit.piles.parts.PileSink` of ``PileWriter``: it is fed
whole samples (key, extensions, field values, as :func:`~shardkit.piles.encode.encode_values`
makes them) and makes their tar members only at a flush: every header of a pile's held samples
in one numpy call (:func:`shardkit.tar.write.headers`), the members joined into a few large
pieces, each checksummed in one call and written in one. Made one by one, headers, checksums
and the list of pieces cost more than the rest of writing a sample of a few KB.

    sink = SampleSink("staging/part", piles=64, buffer_size=64 << 20)
    sink.put(3, "000017", ("cls", "jpg"), [b"3", jpeg], size=...)  # size from encode_values
    sink.flush()
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Sequence

import numpy as np

from shardkit import manifest, storage
from shardkit.errors import SampleError
from shardkit.piles.parts import ADVICE, PileSink
from shardkit.tar import write
from shardkit.tar.keys import key_hashes, repeated_key, sample_at
from shardkit.tar.scan import BLOCK

# bytes of members joined into one piece before it is checksummed and written: large enough that
# a call costs nothing per member, small enough to stay in the CPU cache between the two
PIECE = 1 << 20
# a field at least this large is written and checksummed as it is, never copied into a piece
LARGE = 256 << 10


class SampleSink(PileSink):
    """A :class:`PileSink` fed whole samples by :meth:`put`; their tar members are made at :meth:`flush`.

    The bytes written are exactly those of :func:`~shardkit.piles.encode.encode_parts` for each
    sample, in the order :meth:`put` received them. Memory holds the field values (not copied)
    until the next flush, as :meth:`PileSink.add` does; samples are never fed by ``add`` or
    ``extend`` to a sink fed by ``put``.

        sink = SampleSink("staging/part", piles=64, buffer_size=64 << 20)
        sink.put(3, "000017", ("cls", "jpg"), [b"3", jpeg], size=2560)
        sink.flush()
    """

    def __init__(self, directory: str, piles: int, buffer_size: int) -> None:
        super().__init__(directory, piles, buffer_size)
        # per pile since the last flush: each sample's key and extensions, all their values in order, their bytes
        self._held_keys: list[list[str]] = [[] for _ in range(piles)]
        self._held_exts: list[list[tuple[str, ...]]] = [[] for _ in range(piles)]
        self._held_values: list[list[bytes]] = [[] for _ in range(piles)]
        self._held_bytes = [0] * piles
        # the key of the last sample put in each pile, and where the last one written begins
        self._last_key: list[str | None] = [None] * piles
        self._last_start = [0] * piles

    def put(self, pile: int, key: str, exts: tuple[str, ...], values: list[bytes], size: int) -> None:
        """Append one sample to ``pile``: its valid key, its extensions in order and their values
        (``size`` bytes once they are members, as :func:`~shardkit.piles.encode.encode_values` says).

        Raises:
            SampleError: the sample just put in ``pile`` has the same key (checked before anything
                changes): read back, the two would be one sample. A repeat anywhere else in the
                pile is found by :func:`~shardkit.piles.parts.check_sink`.
        """
        if key == self._last_key[pile]:
            self._refuse_repeat(pile, key, size)
        self._last_key[pile] = key
        self._held_keys[pile].append(key)
        self._held_exts[pile].append(exts)
        self._held_values[pile] += values
        self._held_bytes[pile] += size
        self._buffered += size
        if self._buffered >= self.limit:
            self.flush()

    def add(self, *args: object, **kwargs: object) -> None:
        raise TypeError("SampleSink takes whole samples: call put(), not add()")

    def extend(self, *args: object, **kwargs: object) -> None:
        raise TypeError("SampleSink takes whole samples: call put(), not extend()")

    def _refuse_repeat(self, pile: int, key: str, size: int) -> None:
        held = self._held_keys[pile]
        n = self.counts[pile] + len(held)
        at = self.sizes[pile] + self._held_bytes[pile]
        if held:
            exts = self._held_exts[pile][-1]
            last = at - int(_member_chunks(held[-1:], [exts], self._held_values[pile][-len(exts) :])[1].sum())
        else:
            last = self._last_start[pile]
        said = repeated_key(key, sample_at(n, f"offset {at}"), sample_at(n - 1, f"offset {last}"))
        raise SampleError(f"pile {pile}: {said}{ADVICE}")

    def _write_parts(self) -> None:
        # every held sample of every pile at once: numpy's cost per call is paid once a flush, not once a pile
        piles = [pile for pile, keys in enumerate(self._held_keys) if keys]
        if not piles:
            return
        keys = [key for pile in piles for key in self._held_keys[pile]]
        exts = [e for pile in piles for e in self._held_exts[pile]]
        values = [v for pile in piles for v in self._held_values[pile]]
        chunks, sizes, raw_keys = _member_chunks(keys, exts, values)
        hashes = key_hashes(raw_keys)
        samples = np.cumsum([0] + [len(self._held_keys[pile]) for pile in piles]).tolist()
        members = np.cumsum([0] + [len(self._held_values[pile]) for pile in piles]).tolist()
        ends = np.cumsum(sizes)
        for k, pile in enumerate(piles):
            lo, hi = members[k], members[k + 1]
            start = self.sizes[pile]
            self.crcs[pile] = _append_members(self.part(pile), chunks[3 * lo : 3 * hi], sizes[lo:hi], ends[lo:hi], self.crcs[pile])
            nbytes = int(ends[hi - 1] - ends[lo] + sizes[lo])
            last = len(exts[samples[k + 1] - 1])
            self._last_start[pile] = start + nbytes - int(sizes[hi - last : hi].sum())
            self._record(pile, -1, nbytes, samples[k + 1] - samples[k])
            self._hashes[pile].append(hashes[samples[k] : samples[k + 1]])
            self._held_keys[pile].clear()
            self._held_exts[pile].clear()
            self._held_values[pile].clear()
            self._held_bytes[pile] = 0


def _member_chunks(keys: list[str], exts: list[tuple[str, ...]], values: list[bytes]) -> tuple[list[storage.Chunk], np.ndarray, np.ndarray]:
    """The tar members of samples ``keys`` (fields ``exts[i]``, values in order in ``values``):
    their pieces, three a member (header, value, padding), each member's size in the pile, and
    the keys' UTF-8 bytes (numpy bytes).

    Every ustar header is made by one :func:`~shardkit.tar.write.headers` call; a member whose
    name needs a pax header (not ASCII, over 100 bytes) has that header before its own in the
    first of its three pieces, as :func:`~shardkit.tar.write.member_parts` makes it.
    """
    n = len(keys)
    try:
        raw_keys = np.array(keys).astype(np.bytes_)
    except UnicodeEncodeError:  # not ASCII: UTF-8, an undecodable byte as itself
        raw_keys = np.array([key.encode("utf-8", "surrogateescape") for key in keys], dtype=np.bytes_)
    first = exts[0]
    if exts.count(first) == n:  # every sample has the same fields (the usual case)
        owner = np.repeat(np.arange(n), len(first))
        suffixes = np.tile(_suffixes(first), n)
    else:
        owner = np.repeat(np.arange(n), [len(e) for e in exts])
        suffixes = np.concatenate([_suffixes(e) for e in exts])
    names = np.char.add(raw_keys[owner], suffixes)
    width = names.dtype.itemsize
    sizes = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    table = np.ascontiguousarray(names).view(np.uint8).reshape(len(names), width)
    plain = (np.char.str_len(names) <= write.NAME_BYTES) & (sizes <= write.MAX_OCTAL_SIZE)
    if width:
        plain &= table.max(axis=1) < 0x80
    heads = write.headers(table[:, : min(width, write.NAME_BYTES)], np.where(plain, sizes, 0))
    chunks: list[storage.Chunk] = [b""] * (3 * len(values))
    chunks[0::3] = heads.view(f"V{BLOCK}").ravel().tolist()  # bytes, one a header: the cheapest way to n objects
    chunks[1::3] = values
    chunks[2::3] = [_PADDING[pad] for pad in (-sizes % BLOCK).tolist()]
    member_sizes = BLOCK + sizes + (-sizes % BLOCK)
    for m in np.flatnonzero(~plain).tolist():  # a pax header first (rare)
        i = int(owner[m])
        ext = exts[i][m - int(np.searchsorted(owner, i))]  # the sample's first member is the first of owner i
        parts = write.member_parts(f"{keys[i]}.{ext}", values[m])
        chunks[3 * m] = b"".join(parts[:-2])
        member_sizes[m] = sum(map(len, parts))
    return chunks, member_sizes, raw_keys


_PADDING = [bytes(n) for n in range(BLOCK)]


@functools.lru_cache(maxsize=256)
def _suffixes(exts: tuple[str, ...]) -> np.ndarray:
    """``b".EXT"`` for each extension, as numpy bytes."""
    return np.array([f".{ext}".encode("utf-8", "surrogateescape") for ext in exts], dtype=np.bytes_)


def _append_members(path: str, chunks: Sequence[storage.Chunk], sizes: np.ndarray, ends: np.ndarray, crc: int) -> int:
    """Append the members ``chunks`` (three a member, ``sizes`` bytes each, ending at ``ends``
    counted from any origin) to the file ``path``, joined into pieces of about :data:`PIECE`
    bytes; returns ``crc`` continued over them."""
    origin = int(ends[0] - sizes[0])
    total = int(ends[-1]) - origin
    if total <= PIECE and int(sizes.max()) < LARGE:  # one piece (every pile of a large M)
        bounds = [0, len(sizes)]
    else:
        # piece boundaries, by member: every PIECE bytes, and around each large field
        cuts = np.searchsorted(ends, origin + np.arange(PIECE, total, PIECE), side="right")
        large = np.flatnonzero(sizes >= LARGE)
        bounds = np.unique(np.concatenate([[0, len(sizes)], cuts, large, large + 1])).tolist()
    checksum = manifest.checksum
    with storage.guard(path, "write", size=total):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | storage.O_BINARY, 0o644)
        try:
            for lo, hi in itertools.pairwise(bounds):
                # a large field is written as it is: a copy would cost more than the calls
                pieces = chunks[3 * lo : 3 * hi] if hi == lo + 1 and sizes[lo] >= LARGE else [b"".join(chunks[3 * lo : 3 * hi])]
                for piece in pieces:
                    crc = checksum(piece, crc)
                storage.write_chunks(fd, pieces)
        finally:
            os.close(fd)
    return crc
