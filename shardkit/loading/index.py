"""The random-access index of a dataset: where each sample's bytes are, and its key's hash.

For every data file of a manifest (a pile, or each segment of a pile that grew), in manifest
order, the index holds the byte bounds of its samples (sample ``j`` of the file is
``file[bounds[j]:bounds[j + 1]]``, headers included; in the tar inside for a compressed file),
and for the whole dataset the sorted 64-bit key hashes with the pile-order position of each.
It also holds the CRC-32 of every sample's bytes, so that one sample read by range can be
checked on its own (the loader starts its first pile that way, see :mod:`shardkit.loading.early`).
Pass 1 writes it as it publishes the dataset, from its staged files
(:mod:`shardkit.dataset.index_file`, which holds the format's writing); else it is built once
here, by reading every file whole (each checked against the manifest first), and stored beside
the manifest as ``shardkit.gNNNNNN.idx`` for the manifest's generation. Its
header names the generation and the manifest's checksum, and a CRC-32 of the rest closes it:
an index of another manifest, or one whose bytes changed, is rebuilt, never trusted.

A file that cannot be read as the build reaches it (missing, corrupt, another sample count)
leaves a hole instead of failing the whole index: its samples keep their positions, but have
no bounds and no key hashes, and :attr:`Index.failed` holds what reading it raised, for each
read of one of its samples to raise again. An index with a hole is never stored (a stored
index is trusted later): the next open builds again, and stores it once every file reads.

    idx = load_or_build("data/train", manifest.read("data/train"))
    f, start, end = idx.locate(1234)          # file number, byte range inside that file's tar
    idx.lookup(b"key-000017")                 # candidate positions in pile order

File format (little-endian): ``MAGIC``, a uint32 length and a JSON header, a uint32 CRC-32 of
those three, zero padding to 8 bytes, then ``bounds`` (int64, one run of ``n + 1`` per file),
``hashes`` (uint64, sorted), ``order`` (uint32, or uint64 past 2**32 samples) and ``crcs``
(uint32, each sample's CRC-32, files in order), then a uint32 CRC-32 of everything before it.
The header's ``sections`` give each file's manifest checksum, sample count and the CRC-32 of
its run of ``bounds`` followed by its run of ``crcs``: one file's entries are read and checked
without reading the rest (:func:`file_checks`). An index of the first version (``MAGIC_V1``:
no header checksum, no ``crcs``, no ``sections``) still serves random access.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np

from shardkit import manifest, storage
from shardkit.dataset import index_file, layout
from shardkit.dataset.index_file import DataFile
from shardkit.errors import CorruptShardError, DatasetNotFoundError, ManifestError, ShardkitError
from shardkit.loading.one_sample import key_hash
from shardkit.loading.pile import fetch
from shardkit.manifest import Manifest, PileInfo

log = logging.getLogger(__name__)

MAGIC, MAGIC_V1, VERSION = index_file.MAGIC, index_file.MAGIC_V1, index_file.VERSION
_CRC, _LEN = index_file.CRC, index_file.LEN
data_files, identity, sample_crcs = index_file.data_files, index_file.identity, index_file.sample_crcs
# what a stored index whose checksums hold but whose numbers do not is, and what to do
_WRONG = (
    "the index is wrong (its checksums hold: its writer put these numbers in it); delete it, and the next shardkit.open builds it again"
)


class Index:
    """A loaded index: per-file sample bounds, and sorted key hashes with their positions.

    Attributes:
        files: the data files, in pile order.
        starts: global pile-order position of each file's first sample, plus the total at the end.
        bounds: the byte bounds of every file's samples (one run of ``n + 1`` per file).
        hashes, order: sorted key hashes, and the pile-order position of each.
        crcs: the CRC-32 of each sample's bytes, in pile order (None: an index of the first
            version, which has none).
        failed: file number -> what reading that file raised while the index was built (empty
            for a complete index): its samples are in no array but ``starts`` (their bounds
            and CRC-32s read zero, their keys are not among ``hashes``).
        where: the index file it was read from (errors about its entries name it).
    """

    def __init__(
        self,
        files: Sequence[DataFile],
        bounds: np.ndarray,
        hashes: np.ndarray,
        order: np.ndarray,
        crcs: np.ndarray | None = None,
        failed: Mapping[int, ShardkitError] | None = None,
        *,
        where: str = "the index built in memory",
    ) -> None:
        self.files = list(files)
        counts = np.array([f.info.samples for f in self.files], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.bounds, self.hashes, self.order, self.crcs = bounds, hashes, order, crcs
        self.failed = dict(failed or {})
        self.where = where

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def nbytes(self) -> int:
        """Memory the arrays take."""
        extra = 0 if self.crcs is None else self.crcs.nbytes
        return int(self.bounds.nbytes + self.hashes.nbytes + self.order.nbytes + self.starts.nbytes + extra)

    def file_at(self, position: int) -> int:
        """The number of the file holding pile-order ``position``, whether or not it could be read."""
        return int(self.starts.searchsorted(position, side="right")) - 1

    def locate(self, position: int) -> tuple[int, int, int]:
        """``(file number, start, end)`` of the sample at pile-order ``position`` (0 <= position < len).

        Raises:
            CorruptShardError, ManifestError, DatasetNotFoundError: the sample is in a file that
                could not be read when the index was built (see :meth:`unreadable`).
            CorruptShardError: naming the index: its bounds lie outside the file (its checksums
                hold, but a writer put wrong numbers in it).
        """
        f = self.file_at(position)
        if f in self.failed:
            raise self.unreadable(f, f"sample {position - int(self.starts[f])} of its {self.files[f].info.samples} cannot be read")
        at = position + f  # each file before has one bound more than it has samples
        start, end = int(self.bounds[at]), int(self.bounds[at + 1])
        size = self.files[f].info.tar_size
        if not 0 <= start <= end <= size:  # else a read of a negative range, or of exabytes
            raise CorruptShardError(
                f"{self.where}: puts sample {position - int(self.starts[f])} of {self.files[f].name} at bytes {start}..{end}, "
                f"outside its {size} bytes of tar: {_WRONG}"
            )
        return f, start, end

    def unreadable(self, f: int, what: str) -> ShardkitError:
        """A new error of the class reading file ``f`` raised when the index was built (raised
        afresh each time, each with its own traceback), its message followed by ``what``."""
        error = self.failed[f]
        return type(error)(f"{error}; {what} (the index was built without this file: its other files' samples are served)")

    def lookup(self, key: str) -> list[int]:
        """Pile-order positions whose key has the hash of ``key`` (usually one; the caller compares keys)."""
        h = np.uint64(key_hash(key))
        lo = int(self.hashes.searchsorted(h, side="left"))
        if lo == len(self.hashes) or self.hashes[lo] != h:
            return []
        found = [int(x) for x in self.order[lo : int(self.hashes.searchsorted(h, side="right"))]]
        if max(found) >= len(self):
            raise CorruptShardError(f"{self.where}: puts key {key!r} at position {max(found)}, past its {len(self)} samples: {_WRONG}")
        return found


def build(root: str, m: Manifest, *, reads: storage.RemoteReads | None = None) -> Index:
    """Read every data file of ``m`` once (checked against the manifest) and index its samples.

    A file that is missing, corrupt or holds another number of samples than the manifest says
    is a hole of the index (see :attr:`Index.failed`); the others are indexed all the same.
    Errors that are not about one file's bytes (a store that cannot be reached) are raised.
    """
    files = data_files(m)
    bounds, hashes, crcs, positions, failed = [], [], [], [], {}
    start = 0
    for k, f in enumerate(files):
        url = storage.join(root, f.name)
        n = f.info.samples
        try:
            entries = _entries(url, f.info, reads)
        except (CorruptShardError, ManifestError, DatasetNotFoundError) as e:
            # kept without its traceback, whose frames hold the file's bytes
            failed[k] = e.with_traceback(None)
            e.__context__ = e.__cause__ = None
            entries = index_file.Entries(np.zeros(n + 1, np.int64), np.zeros(0, np.uint64), np.zeros(n, np.uint32))
        else:
            positions.append(np.arange(start, start + n, dtype=np.int64))
        bounds.append(entries.bounds)
        hashes.append(entries.hashes)
        crcs.append(entries.crcs)
        start += n
    flat = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
    by_hash = np.argsort(flat, kind="stable")
    hashes_sorted = flat[by_hash]
    if failed:  # the hashes are those of the files read, not of every position: map each to its position
        by_hash = np.concatenate([np.zeros(0, np.int64), *positions])[by_hash]
    order = by_hash.astype(np.uint32 if start < 2**32 else np.uint64)
    joined = np.concatenate(bounds) if bounds else np.zeros(0, np.int64)
    return Index(files, joined, hashes_sorted, order, np.concatenate(crcs) if crcs else np.zeros(0, np.uint32), failed)


def _entries(url: str, info: PileInfo, reads: storage.RemoteReads | None) -> index_file.Entries:
    fetched = fetch(url, expected=info, reads=reads)
    try:
        return index_file.file_entries(fetched.buf, url, info.samples, checked=fetched.checked)
    finally:
        del fetched


def encode(idx: Index, m: Manifest) -> bytes:
    """The bytes of the index file of ``idx``, built from the manifest ``m`` (it must have ``crcs``)."""
    if idx.crcs is None:
        raise ValueError("an index without sample checksums cannot be stored in this version")
    if idx.failed:
        raise ValueError(
            f"an index without the samples of {len(idx.failed)} unreadable file(s) cannot be stored: it would be trusted later"
        )
    hashes = np.empty(len(idx), dtype=np.uint64)
    hashes[idx.order] = idx.hashes  # back in pile order: encoding sorts them again, stably
    runs = []
    for f in range(len(idx.files)):
        lo, hi = int(idx.starts[f]), int(idx.starts[f + 1])
        runs.append(index_file.Entries(idx.bounds[lo + f : hi + f + 1], hashes[lo:hi], idx.crcs[lo:hi]))
    return index_file.encode(idx.files, runs, m)


def decode(data: storage.Buffer | memoryview, m: Manifest, where: str) -> Index:
    """The index in ``data`` when it is a whole index of exactly the manifest ``m`` (of this
    version, or of the first, which has no sample checksums).

    Raises:
        CorruptShardError: naming ``where`` and what does not match (magic, version, manifest,
            files, sizes, checksum).
    """
    return Index(*index_file.arrays(data, m, where), where=where)


def file_checks(data: storage.Buffer | memoryview, info: PileInfo, where: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The sample bounds (``n + 1``) and sample CRC-32s (``n``) the index in ``data`` holds for
    the data file ``info`` (a file of the manifest it was built from), read from its header and
    that file's section alone, each checked by its own CRC-32. None when the index has no
    sample checksums (the first version) or no entry for a file of that name, checksum and
    sample count.

    Raises:
        CorruptShardError: naming ``where``: the header or the section does not match its checksum,
            or is malformed.
    """
    view = memoryview(data)
    header, at, current = index_file.read_header(view, where)
    if not current:
        return None
    files, sections, order = header.get("files"), header.get("sections"), header.get("order", "<u4")
    if not (isinstance(files, list) and isinstance(sections, list) and len(files) == len(sections)):
        raise CorruptShardError(f"{where}: header has no list of sections, one a file")
    try:
        f = files.index(info.name)
        checksum, n, crc = sections[f]
        before = [int(s[1]) for s in sections[:f]]
        total = sum(int(s[1]) for s in sections)
        width = np.dtype(order).itemsize
    except ValueError:
        return None
    except (TypeError, IndexError):
        raise CorruptShardError(f"{where}: header section of {info.name} is malformed") from None
    if checksum != info.checksum or n != info.samples:
        return None
    lo = at + 8 * (sum(before) + f)
    crc_at = at + 8 * (total + len(files)) + 8 * total + width * total + 4 * sum(before)
    if crc_at + 4 * n + 4 > len(view):
        raise CorruptShardError(f"{where}: section of {info.name} runs past the end ({len(view)} bytes)")
    found = manifest.checksum(view[crc_at : crc_at + 4 * n], manifest.checksum(view[lo : lo + 8 * (n + 1)]))
    if found != crc:
        raise CorruptShardError(f"{where}: section of {info.name} does not match its checksum (torn or changed after writing)")
    bounds = np.frombuffer(view, dtype="<i8", count=n + 1, offset=lo)
    return bounds, np.frombuffer(view, dtype="<u4", count=n, offset=crc_at)


def load_or_build(root: str, m: Manifest, *, reads: storage.RemoteReads | None = None, store: bool = True) -> Index:
    """The stored index of ``m`` when there is one that checks, else one built now (and stored,
    with ``store``; a dataset that cannot be written to is read all the same, with a warning).
    An index built with holes (:attr:`Index.failed`) is never stored; a warning names the files."""
    url = storage.join(root, layout.index_name(m.generation))
    try:
        data: storage.Buffer | None = storage.map_bytes(url)  # local: the page cache's pages, shared by every worker
    except DatasetNotFoundError:
        data = None
    if data is not None:
        try:
            return decode(data, m, url)
        except CorruptShardError as e:
            log.warning("%s: rebuilding the index: %s", url, e)
    idx = build(root, m, reads=reads)
    if idx.failed:
        named = "; ".join(str(e) for e in list(idx.failed.values())[:3])
        more = f" (and {len(idx.failed) - 3} more)" if len(idx.failed) > 3 else ""
        log.warning(
            "%s: %d of %d data files could not be read, their samples raise and the index is not stored: %s%s",
            root,
            len(idx.failed),
            len(idx.files),
            named,
            more,
        )
        return idx
    if store:
        try:
            storage.write_bytes(url, encode(idx, m))
        except ShardkitError as e:
            log.warning("%s: the index was built but cannot be stored (%s); it is built again next time", url, e)
    return idx
