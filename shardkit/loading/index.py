"""The random-access index of a dataset: where each sample's bytes are, and its key's hash.

For every data file of a manifest (a pile, or each segment of a pile that grew), in manifest
order, the index holds the byte bounds of its samples (sample ``j`` of the file is
``file[bounds[j]:bounds[j + 1]]``, headers included; in the tar inside for a compressed file),
and for the whole dataset the sorted 64-bit key hashes with the pile-order position of each.
It is built once, by reading every file whole, and stored beside the manifest as
``shardkit.gNNNNNN.idx`` for the manifest's generation. Its header names the generation and
the manifest's checksum, and a CRC-32 of the rest closes it: an index of another manifest, or
one whose bytes changed, is rebuilt, never trusted.

    idx = load_or_build("data/train", manifest.read("data/train"))
    f, start, end = idx.locate(1234)          # file number, byte range inside that file's tar
    idx.lookup(b"key-000017")                 # candidate positions in pile order

File format (little-endian): ``MAGIC``, a uint32 length and a JSON header, zero padding to 8
bytes, then ``bounds`` (int64, one run of ``n + 1`` per file), ``hashes`` (uint64, sorted) and
``order`` (uint32, or uint64 past 2**32 samples), then a uint32 CRC-32 of everything before it.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardkit import manifest, storage
from shardkit.dataset import layout
from shardkit.errors import CorruptShardError, DatasetNotFoundError, ShardkitError
from shardkit.loading.one_sample import key_hash
from shardkit.loading.pile import fetch
from shardkit.manifest import Manifest, PileInfo
from shardkit.tar import index as tar_index
from shardkit.tar.keys import key_hashes

log = logging.getLogger(__name__)

MAGIC = b"SKIDX01\n"
VERSION = 1
_CRC = struct.Struct("<I")


@dataclass(frozen=True)
class DataFile:
    """One file samples are read from: its name, the pile it belongs to, its manifest entry."""

    name: str
    pile: int
    info: PileInfo


def data_files(m: Manifest) -> list[DataFile]:
    """The files of ``m`` in the order their samples come in pile order (segments in pile order)."""
    return [DataFile(part.name, p, part) for p, pile in enumerate(m.piles) for part in pile.parts if part.samples]


def identity(m: Manifest) -> str:
    """What an index of ``m`` is checked against: the checksum of its serialized form."""
    return manifest.format_checksum(manifest.checksum(m.to_json().encode("utf-8")))


class Index:
    """A loaded index: per-file sample bounds, and sorted key hashes with their positions.

    Attributes:
        files: the data files, in pile order.
        starts: global pile-order position of each file's first sample, plus the total at the end.
        bounds: the byte bounds of every file's samples (one run of ``n + 1`` per file).
        hashes, order: sorted key hashes, and the pile-order position of each.
    """

    def __init__(self, files: Sequence[DataFile], bounds: np.ndarray, hashes: np.ndarray, order: np.ndarray) -> None:
        self.files = list(files)
        counts = np.array([f.info.samples for f in self.files], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.bounds, self.hashes, self.order = bounds, hashes, order

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def nbytes(self) -> int:
        """Memory the arrays take."""
        return int(self.bounds.nbytes + self.hashes.nbytes + self.order.nbytes + self.starts.nbytes)

    def locate(self, position: int) -> tuple[int, int, int]:
        """``(file number, start, end)`` of the sample at pile-order ``position`` (0 <= position < len)."""
        f = int(self.starts.searchsorted(position, side="right")) - 1
        at = position + f  # each file before has one bound more than it has samples
        return f, int(self.bounds[at]), int(self.bounds[at + 1])

    def lookup(self, key: str) -> list[int]:
        """Pile-order positions whose key has the hash of ``key`` (usually one; the caller compares keys)."""
        h = np.uint64(key_hash(key))
        lo = int(self.hashes.searchsorted(h, side="left"))
        if lo == len(self.hashes) or self.hashes[lo] != h:
            return []
        return [int(x) for x in self.order[lo : int(self.hashes.searchsorted(h, side="right"))]]


def build(root: str, m: Manifest, *, reads: storage.RemoteReads | None = None) -> Index:
    """Read every data file of ``m`` once (checked against the manifest) and index its samples.

    Raises:
        CorruptShardError, ManifestError, DatasetNotFoundError: a file is missing, corrupt or
            holds another number of samples than the manifest says (named).
    """
    files = data_files(m)
    bounds, hashes = [], []
    for f in files:
        url = storage.join(root, f.name)
        fetched = fetch(url, expected=f.info, reads=reads)
        try:
            found = tar_index.index(fetched.buf, url, checked=fetched.checked)
            starts = found.samples()
            if len(starts) - 1 != f.info.samples:
                raise CorruptShardError(f"{url}: holds {len(starts) - 1} samples, the manifest says {f.info.samples}")
            bounds.append(found.sample_bounds(starts))
            hashes.append(key_hashes(found.sample_keys(starts[:-1])))
        finally:
            del fetched
    flat = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
    order = np.argsort(flat, kind="stable").astype(np.uint32 if len(flat) < 2**32 else np.uint64)
    return Index(files, np.concatenate(bounds) if bounds else np.zeros(0, np.int64), flat[order], order)


def encode(idx: Index, m: Manifest) -> bytes:
    """The bytes of the index file of ``idx``, built from the manifest ``m``."""
    header = {
        "version": VERSION,
        "generation": m.generation,
        "manifest": identity(m),
        "samples": len(idx),
        "files": [f.name for f in idx.files],
        "order": idx.order.dtype.str,
    }
    text = json.dumps(header).encode("utf-8")
    head = MAGIC + struct.pack("<I", len(text)) + text
    head += b"\0" * (-len(head) % 8)
    body = b"".join([head, idx.bounds.astype("<i8").tobytes(), idx.hashes.astype("<u8").tobytes(), idx.order.tobytes()])
    return body + _CRC.pack(manifest.checksum(body))


def decode(data: storage.Buffer | memoryview, m: Manifest, where: str) -> Index:
    """The index in ``data`` when it is a whole index of exactly the manifest ``m``.

    Raises:
        CorruptShardError: naming ``where`` and what does not match (magic, version, manifest,
            files, sizes, checksum).
    """
    view = memoryview(data)
    if len(view) < len(MAGIC) + 8 or bytes(view[: len(MAGIC)]) != MAGIC:
        raise CorruptShardError(f"{where}: not a shardkit index (no {MAGIC!r} at offset 0)")
    if manifest.checksum(view[:-4]) != _CRC.unpack(view[-4:])[0]:
        raise CorruptShardError(f"{where}: checksum does not match its bytes (torn or changed after writing)")
    (n,) = struct.unpack_from("<I", view, len(MAGIC))
    at = len(MAGIC) + 4
    try:
        header = json.loads(bytes(view[at : at + n]))
    except ValueError:
        raise CorruptShardError(f"{where}: header at offset {at} is not JSON") from None
    files = data_files(m)
    want = {"version": VERSION, "generation": m.generation, "manifest": identity(m), "files": [f.name for f in files]}
    for name, value in want.items():
        if header.get(name) != value:
            raise CorruptShardError(f"{where}: header {name}={str(header.get(name))[:80]!r}, the manifest needs {str(value)[:80]!r}")
    at += n + (-(at + n) % 8)
    total = m.samples
    order_type = np.dtype(header.get("order", "<u4"))
    sizes = [(total + len(files)) * 8, total * 8, total * order_type.itemsize]
    if at + sum(sizes) + 4 != len(view):
        raise CorruptShardError(f"{where}: {len(view)} bytes, a header for {total} samples needs {at + sum(sizes) + 4}")
    bounds = np.frombuffer(view, dtype="<i8", count=total + len(files), offset=at)
    hashes = np.frombuffer(view, dtype="<u8", count=total, offset=at + sizes[0])
    order = np.frombuffer(view, dtype=order_type, count=total, offset=at + sizes[0] + sizes[1])
    return Index(files, bounds, hashes, order)


def load_or_build(root: str, m: Manifest, *, reads: storage.RemoteReads | None = None, store: bool = True) -> Index:
    """The stored index of ``m`` when there is one that checks, else one built now (and stored,
    with ``store``; a dataset that cannot be written to is read all the same, with a warning)."""
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
    if store:
        try:
            storage.write_bytes(url, encode(idx, m))
        except ShardkitError as e:
            log.warning("%s: the index was built but cannot be stored (%s); it is built again next time", url, e)
    return idx
