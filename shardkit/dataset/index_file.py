"""The random-access index file's format and its writing: sample bounds, key hashes and CRC-32s of a manifest's data files.

The format is described in :mod:`shardkit.loading.index`, which reads it (and builds an index of
a dataset by reading its files). What lives here is what a writer needs too, below both the
loader and pass 1: the data files of a manifest, the index's identity, one file's entries from
its bytes (:func:`file_entries`), the encoding, and :func:`write_staged`, which a transaction
calls right after it installed a manifest, to index the files it just published from their
local staged copies (no download, no second check of bytes whose checksums it computed).

    entries = file_entries(buf, "pile-000000.tar", samples=1000)   # bounds, hashes, crcs
    write_staged("data/train", manifest, {"pile-000000.tar": "staging/pile-000000.tar"})
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from shardkit import manifest, storage
from shardkit.dataset import layout
from shardkit.errors import CorruptShardError, DatasetNotFoundError, ShardkitError
from shardkit.manifest import Manifest, PileInfo
from shardkit.tar import compression
from shardkit.tar import index as tar_index
from shardkit.tar.keys import key_hashes

MAGIC = b"SKIDX02\n"
MAGIC_V1 = b"SKIDX01\n"
VERSION = 2
CRC = struct.Struct("<I")
LEN = struct.Struct("<I")
# data files indexed at once: the scan and the checksums release the GIL for a file's bytes
_THREADS = 4
# the types of the key positions that encode writes (uint32, uint64 past 2**32 samples)
_ORDER_TYPES = ("<u4", "<u8")


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


class Entries(NamedTuple):
    """One data file's part of an index: its sample bounds (``n + 1``, int64), its samples' key
    hashes (``n``, uint64, in file order) and the CRC-32 of each sample's bytes (``n``, uint32)."""

    bounds: np.ndarray
    hashes: np.ndarray
    crcs: np.ndarray


def sample_crcs(buf: storage.Buffer, bounds: np.ndarray) -> np.ndarray:
    """The CRC-32 of ``buf[bounds[j]:bounds[j + 1]]`` for each sample ``j`` (uint32)."""
    view = memoryview(buf)
    return np.array([manifest.checksum(view[a:b]) for a, b in itertools.pairwise(bounds.tolist())], dtype=np.uint32)


def file_entries(tar: storage.Buffer, where: str, samples: int, *, checked: bool = True) -> Entries:
    """The index entries of the tar ``tar`` (a data file's bytes, decompressed), which must hold
    ``samples`` samples; ``checked``: its bytes already matched their recorded checksum.

    Raises:
        CorruptShardError: naming ``where``: not a tar, or another number of samples.
    """
    found = tar_index.index(tar, where, checked=checked)
    starts = found.samples()
    if len(starts) - 1 != samples:
        raise CorruptShardError(f"{where}: holds {len(starts) - 1} samples, the manifest says {samples}")
    bounds = found.sample_bounds(starts)
    return Entries(bounds, key_hashes(found.sample_keys(starts[:-1])), sample_crcs(tar, bounds))


def encode(files: Sequence[DataFile], entries: Sequence[Entries], m: Manifest) -> bytes:
    """The bytes of the index file of the manifest ``m``, whose data files (:func:`data_files`)
    are ``files``, each with its ``entries``."""
    counts = [len(e.crcs) for e in entries]
    flat = np.concatenate([e.hashes for e in entries]) if entries else np.zeros(0, np.uint64)
    order = np.argsort(flat, kind="stable").astype(np.uint32 if len(flat) < 2**32 else np.uint64)
    sections = []
    for f, e in zip(files, entries, strict=True):
        crc = manifest.checksum(e.bounds.astype("<i8").tobytes())
        sections.append([f.info.checksum, len(e.crcs), manifest.checksum(e.crcs.astype("<u4").tobytes(), crc)])
    header = {
        "version": VERSION,
        "generation": m.generation,
        "manifest": identity(m),
        "samples": sum(counts),
        "files": [f.name for f in files],
        "order": order.dtype.str,
        "sections": sections,
    }
    text = json.dumps(header).encode("utf-8")
    head = MAGIC + LEN.pack(len(text)) + text
    head += CRC.pack(manifest.checksum(head))
    head += b"\0" * (-len(head) % 8)
    arrays = [e.bounds.astype("<i8").tobytes() for e in entries]
    arrays += [flat[order].astype("<u8").tobytes(), order.tobytes()]
    arrays += [e.crcs.astype("<u4").tobytes() for e in entries]
    body = b"".join([head, *arrays])
    return body + CRC.pack(manifest.checksum(body))


def read_header(view: memoryview, where: str) -> tuple[dict[str, Any], int, bool]:
    """The JSON header of the index in ``view``, the offset of its arrays, and whether it is of
    this version (else the first, whose header has no checksum of its own).

    Raises:
        CorruptShardError: naming ``where``: no magic, a header past the end, not JSON, or (this
            version) a header whose checksum does not match.
    """
    magic = bytes(view[: len(MAGIC)])
    if len(view) < len(MAGIC) + 8 or magic not in (MAGIC, MAGIC_V1):
        raise CorruptShardError(f"{where}: not a shardkit index (no {MAGIC!r} at offset 0)")
    current = magic == MAGIC
    (n,) = LEN.unpack_from(view, len(MAGIC))
    at = len(MAGIC) + 4 + n
    if at + (4 if current else 0) > len(view):
        raise CorruptShardError(f"{where}: header of {n} bytes runs past the end ({len(view)} bytes)")
    if current:
        if manifest.checksum(view[:at]) != CRC.unpack_from(view, at)[0]:
            raise CorruptShardError(f"{where}: header checksum does not match its bytes (torn or changed after writing)")
        at += 4
    try:
        header = json.loads(bytes(view[len(MAGIC) + 4 : len(MAGIC) + 4 + n]))
    except ValueError:
        raise CorruptShardError(f"{where}: header at offset {len(MAGIC) + 4} is not JSON") from None
    if not isinstance(header, dict):
        raise CorruptShardError(f"{where}: header at offset {len(MAGIC) + 4} is not a JSON object")
    return header, at + (-at % 8), current


def arrays(
    data: storage.Buffer | memoryview, m: Manifest, where: str
) -> tuple[list[DataFile], np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """The arrays of the index in ``data`` when it is a whole index of exactly the manifest
    ``m`` (of this version, or of the first, which has no sample checksums): its data files,
    bounds, sorted hashes, their positions, and the sample CRC-32s (None in the first version).

    Raises:
        CorruptShardError: naming ``where`` and what does not match (magic, version, manifest,
            files, sizes, checksum).
    """
    view = memoryview(data)
    header, at, current = read_header(view, where)
    if manifest.checksum(view[:-4]) != CRC.unpack(view[-4:])[0]:
        raise CorruptShardError(f"{where}: checksum does not match its bytes (torn or changed after writing)")
    files = data_files(m)
    version = VERSION if current else 1
    want = {"version": version, "generation": m.generation, "manifest": identity(m), "files": [f.name for f in files]}
    for name, value in want.items():
        if header.get(name) != value:
            raise CorruptShardError(f"{where}: header {name}={str(header.get(name))[:80]!r}, the manifest needs {str(value)[:80]!r}")
    total = m.samples
    order = header.get("order", "<u4")
    if order not in _ORDER_TYPES:  # a signed or float type would turn positions negative or fractional, yet read
        raise CorruptShardError(f"{where}: header order={str(order)[:20]!r}, expected one of {', '.join(map(repr, _ORDER_TYPES))}")
    order_type = np.dtype(order)
    sizes = [(total + len(files)) * 8, total * 8, total * order_type.itemsize, total * 4 if current else 0]
    if at + sum(sizes) + 4 != len(view):
        raise CorruptShardError(f"{where}: {len(view)} bytes, a header for {total} samples needs {at + sum(sizes) + 4}")
    bounds = np.frombuffer(view, dtype="<i8", count=total + len(files), offset=at)
    hashes = np.frombuffer(view, dtype="<u8", count=total, offset=at + sizes[0])
    order = np.frombuffer(view, dtype=order_type, count=total, offset=at + sizes[0] + sizes[1])
    crcs = np.frombuffer(view, dtype="<u4", count=total, offset=at + sum(sizes[:3])) if current else None
    return files, bounds, hashes, order, crcs


def staged_entries(path: str, info: PileInfo) -> Entries:
    """The entries of the data file ``info`` from its local staged copy ``path`` (its bytes
    written by this job, their checksum computed as they were: not checked again)."""
    data = storage.map_bytes(path)
    try:
        tar = data if info.compression is None else compression.decompress(data, info.compression, path, size=info.tar_bytes, checked=True)
        return file_entries(tar, path, info.samples)
    finally:
        del data


def stored_entries(root: str, m: Manifest) -> dict[str, Entries]:
    """The entries of each data file of ``m`` (a generation of ``root``) that its stored index
    holds, by file name; empty when it has none of this version, or one that does not check."""
    try:
        files, bounds, hashes, order, crcs = arrays(storage.read_bytes(storage.join(root, layout.index_name(m.generation))), m, root)
    except ShardkitError:
        return {}
    if crcs is None:
        return {}
    in_order = np.empty(len(hashes), dtype=np.uint64)
    in_order[order] = hashes
    starts = np.concatenate([[0], np.cumsum([f.info.samples for f in files])]).astype(np.int64).tolist()
    found = {}
    for k, f in enumerate(files):
        lo, hi = starts[k], starts[k + 1]
        found[f.name] = Entries(bounds[lo + k : hi + k + 1], in_order[lo:hi], crcs[lo:hi])
    return found


def write_staged(root: str, m: Manifest, staged: Mapping[str, str], base: Manifest | None = None) -> bool:
    """Write the index of ``m``, just installed in ``root``, from the local staged copies of its
    data files (``staged``: file name -> local path) and, for files this job kept, the stored
    index of ``base`` (the generation an append started from). False (nothing written) when a
    data file is in neither (an append to a dataset that has no index: its files are not read
    again).

    Raises:
        CorruptShardError: a staged copy does not hold what the manifest says.
        ShardkitError: the index cannot be written (see :mod:`shardkit.io_errors`).
    """
    files = data_files(m)
    kept = [f for f in files if f.name not in staged]
    known = stored_entries(root, base) if kept and base is not None else {}
    if any(f.name not in known for f in kept):
        return False
    threads = max(1, min(_THREADS, os.cpu_count() or 1, len(files)))
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="shardkit-index") as pool:
        made = list(pool.map(lambda f: known[f.name] if f.name not in staged else staged_entries(staged[f.name], f.info), files))
    storage.write_bytes(storage.join(root, layout.index_name(m.generation)), encode(files, made, m))
    return True


def problem(root: str, m: Manifest) -> str | None:
    """What is wrong with the stored index of ``m``'s generation in ``root`` (``verify``'s look),
    or None when it checks or there is none.

    Raises:
        StorageError: it could not be read (unreachable, denied): that says nothing of its bytes.
    """
    name = layout.index_name(m.generation)
    url = storage.join(root, name)
    try:
        arrays(storage.read_bytes(url), m, name)
    except DatasetNotFoundError:
        return None
    except CorruptShardError as e:
        said = str(e).removeprefix(f"{name}: ").removeprefix(f"{url}: ")
        return f"{said}; readers pass it over and read every file to build it again; delete it, and the next shardkit.open stores a new one"
    return None
