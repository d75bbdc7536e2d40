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

import contextlib
import functools
import itertools
import os
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.char  # here, while the module loads: numpy imports it lazily, on first use, which a write runs beside its threads

from shardkit import manifest, storage
from shardkit.errors import SampleError
from shardkit.piles.parts import ADVICE, PileSink, part_name
from shardkit.tar import write
from shardkit.tar.keys import key_hashes, repeated_key, sample_at
from shardkit.tar.scan import BLOCK

# bytes of members joined into one piece before it is checksummed and written: large enough that
# a call costs nothing per member, small enough to stay in the CPU cache between the two
PIECE = 1 << 20
# a field at least this large is written and checksummed as it is, never copied into a piece
LARGE = 256 << 10
# part files a sink keeps open between flushes (a file descriptor each), at most a quarter of
# the process's limit (256 by default on macOS)
OPEN_PARTS = 256


def open_parts() -> int:
    """How many part files a sink keeps open: :data:`OPEN_PARTS`, or a quarter of the process's
    limit on open files when that is less."""
    try:
        import resource
    except ImportError:  # Windows: the C runtime allows 512 at first
        return OPEN_PARTS // 2
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return OPEN_PARTS if soft == resource.RLIM_INFINITY else min(OPEN_PARTS, soft // 4)


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

    def __init__(self, directory: str, piles: int, buffer_size: int, *, writeback: storage.Writeback | None = None) -> None:
        super().__init__(directory, piles, buffer_size)
        # started after each flush's writes (see storage.Writeback); its owner closes it
        self._writeback = writeback
        # per pile since the last flush: each sample's key and extensions, all their values in order, their bytes
        self._held_keys: list[list[str]] = [[] for _ in range(piles)]
        self._held_exts: list[list[tuple[str, ...]]] = [[] for _ in range(piles)]
        self._held_values: list[list[bytes]] = [[] for _ in range(piles)]
        self._held_bytes = [0] * piles
        # the key of the last sample put in each pile, and where the last one written begins
        self._last_key: list[str | None] = [None] * piles
        self._last_start = [0] * piles
        # part files kept open between flushes, by pile: reopening each at every flush costs more
        # than writing a small pile's bytes (the first open_parts() piles written; the others reopen)
        self._open: dict[int, int] = {}
        self._keep = open_parts()
        # making a file can cost far more than a flush's bytes of a small pile (0.3-0.5 ms each on
        # ext4 without a journal, which steps over every inode freed in the last minute): the first
        # part files are made by a thread while samples are put, not by the first flush
        self._making: threading.Thread | None = None
        if piles > 1:
            self._making = threading.Thread(
                target=self._make_parts, args=(min(piles, self._keep),), name="shardkit-part-files", daemon=True
            )
            self._making.start()

    def _make_parts(self, count: int) -> None:
        """Open part files ``0..count-1`` into :attr:`_open`, stopping at the first that fails
        (the flush then opens it itself, and names the file in its error). Alone on ``_open``
        until :meth:`_made` joins it."""
        with contextlib.suppress(OSError):  # a StorageError too
            for pile in range(count):
                self._open[pile] = self.store.open_fd(part_name(pile), append=True)

    def _made(self) -> None:
        """Wait for the thread that makes the first part files; :attr:`_open` is this thread's again."""
        if self._making is not None:
            self._making.join()
            self._making = None

    def seal(self) -> None:
        """End every part file with the end-of-archive trailer, after the last :meth:`flush`:
        each is then a whole tar, the pile itself (a :class:`~shardkit.piles.publish.Run` with
        ``sealed``), through the descriptors held. ``sizes`` and ``crcs`` stay those of the
        members, before the trailer; nothing may be put afterwards."""
        self._made()
        for pile in range(len(self.sizes)):
            with storage.guard(self.part(pile), "write", size=len(write.TRAILER)), self._part_fd(pile) as fd:
                storage.write_fully(fd, write.TRAILER)

    @contextlib.contextmanager
    def _part_fd(self, pile: int) -> Iterator[int]:
        """Pile ``pile``'s part file open for appending: the one kept open, else opened (and kept
        while fewer than :func:`open_parts` are), closed after unless kept."""
        fd = self._open.get(pile)
        if fd is None:
            fd = self.store.open_fd(part_name(pile), append=True)
            if len(self._open) < self._keep:
                self._open[pile] = fd
        try:
            yield fd
        finally:
            if pile not in self._open:
                os.close(fd)

    def close(self) -> None:
        """Close the part files kept open (idempotent); flush first to keep what is held."""
        self._made()
        while self._open:
            os.close(self._open.popitem()[1])

    def put(self, pile: int, key: str, exts: tuple[str, ...], values: list[bytes], size: int) -> None:
        """Append one sample to ``pile``: its valid key, its extensions in order and their values
        (``size`` bytes once they are members, as :func:`~shardkit.piles.encode.encode_values` says).

        Raises:
            SampleError: the sample just put in ``pile`` has the same key (checked before anything
                changes): read back, the two would be one sample. A repeat anywhere else in the
                pile is found by :func:`~shardkit.piles.unique_keys.check_sink`.
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
        self._made()
        keys = [key for pile in piles for key in self._held_keys[pile]]
        exts = [e for pile in piles for e in self._held_exts[pile]]
        values = [v for pile in piles for v in self._held_values[pile]]
        chunks, sizes, raw_keys = _member_chunks(keys, exts, values)
        hashes = key_hashes(raw_keys)
        samples = np.cumsum([0] + [len(self._held_keys[pile]) for pile in piles]).tolist()
        members = np.cumsum([0] + [len(self._held_values[pile]) for pile in piles]).tolist()
        ends = np.concatenate([[0], np.cumsum(sizes)]).tolist()  # where each member ends, from the first one's start
        large = set(np.flatnonzero(sizes >= LARGE).tolist())
        for k, pile in enumerate(piles):
            lo, hi = members[k], members[k + 1]
            nbytes = ends[hi] - ends[lo]
            # one piece for a small pile (each pile of a large M)
            bounds = _piece_bounds(sizes[lo:hi], {m - lo for m in large if lo <= m < hi}) if nbytes > PIECE or large else [0, hi - lo]
            path = self.part(pile)
            with storage.guard(path, "write", size=nbytes), self._part_fd(pile) as fd:
                self.crcs[pile] = _append_members(fd, chunks[4 * lo : 4 * hi], bounds, self.crcs[pile])
            first = hi - len(exts[samples[k + 1] - 1])  # the last sample's first member
            self._last_start[pile] = self.sizes[pile] + ends[first] - ends[lo]
            self._record(pile, -1, nbytes, samples[k + 1] - samples[k])
            self._hashes[pile].append(hashes[samples[k] : samples[k + 1]])
            self._held_keys[pile].clear()
            self._held_exts[pile].clear()
            self._held_values[pile].clear()
            self._held_bytes[pile] = 0
        if self._writeback is not None:
            self._writeback.start()


def _member_chunks(keys: list[str], exts: list[tuple[str, ...]], values: list[bytes]) -> tuple[list[storage.Chunk], np.ndarray, np.ndarray]:
    """The tar members of samples ``keys`` (fields ``exts[i]``, values in order in ``values``):
    their pieces, four a member (header start, header tail, value, padding), each member's size
    in the pile, and the keys' UTF-8 bytes (numpy bytes).

    Every ustar header is made by one :func:`~shardkit.tar.write.header_starts` call; a member
    whose name needs a pax header (not ASCII, over 100 bytes) has its whole header, pax first, as
    :func:`~shardkit.tar.write.member_parts` makes it, in its first piece (the second is empty).
    """
    n = len(keys)
    try:
        raw_keys = np.array(list(map(str.encode, keys)), dtype=np.bytes_)
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
    # a header is its start (name to checksum) and a tail shared by all: a third of the bytes to make
    starts = write.header_starts(table[:, : min(width, write.NAME_BYTES)], np.where(plain, sizes, 0))
    chunks: list[storage.Chunk] = [write.HEADER_TAIL] * (4 * len(values))
    chunks[0::4] = starts.view(f"V{starts.shape[1]}").ravel().tolist()  # bytes, one a row: the cheapest way to n objects
    chunks[2::4] = values
    chunks[3::4] = [_PADDING[pad] for pad in (-sizes % BLOCK).tolist()]
    member_sizes = BLOCK + sizes + (-sizes % BLOCK)
    for m in np.flatnonzero(~plain).tolist():  # a pax header first (rare)
        i = int(owner[m])
        ext = exts[i][m - int(np.searchsorted(owner, i))]  # the sample's first member is the first of owner i
        parts = write.member_parts(f"{keys[i]}.{ext}", values[m])
        chunks[4 * m] = b"".join(parts[:-2])
        chunks[4 * m + 1] = b""
        member_sizes[m] = sum(map(len, parts))
    return chunks, member_sizes, raw_keys


_PADDING = [bytes(n) for n in range(BLOCK)]


@functools.lru_cache(maxsize=256)
def _suffixes(exts: tuple[str, ...]) -> np.ndarray:
    """``b".EXT"`` for each extension, as numpy bytes."""
    return np.array([f".{ext}".encode("utf-8", "surrogateescape") for ext in exts], dtype=np.bytes_)


def _piece_bounds(sizes: np.ndarray, large: set[int]) -> list[int]:
    """Where the pieces of members of ``sizes`` bytes begin and end, by member: about every
    :data:`PIECE` bytes, and around each member of ``large`` (written alone, never copied)."""
    ends = np.cumsum(sizes)
    cuts = np.searchsorted(ends, np.arange(PIECE, int(ends[-1]), PIECE), side="right").tolist()
    return sorted({0, len(sizes), *cuts, *large, *(m + 1 for m in large)})


def _append_members(fd: int, chunks: Sequence[storage.Chunk], bounds: list[int], crc: int) -> int:
    """Append the members ``chunks`` (four a member) to the open file ``fd``, those from
    ``bounds[i]`` to ``bounds[i + 1]`` joined into one piece (one member alone is written as its
    pieces); returns ``crc`` continued over them."""
    checksum = manifest.checksum
    for lo, hi in itertools.pairwise(bounds):
        mine = chunks[4 * lo : 4 * hi]
        # a large member is written as it is: a copy would cost more than the calls
        pieces = mine if hi == lo + 1 and len(mine[2]) >= LARGE else [b"".join(mine)]
        for piece in pieces:
            crc = checksum(piece, crc)
        storage.write_chunks(fd, pieces)
    return crc
