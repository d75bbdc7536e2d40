"""Check a data file's bytes against its manifest entry: size, CRC-32, and a compressed file's tar.

The loader, ``verify`` and ``repile`` read a dataset's files through these checks, so each names
what it found in the same words. :func:`read_listed` reads one local or remote file whole and
raises at the first problem; the others list or return what is wrong with bytes already read.

    tar = read_listed("data/pile-000003.tar.zst", info)   # checked, then decompressed and checked
    problems = byte_problems(url, buf, info)               # [("checksum", "checksum is ...")]
"""

from __future__ import annotations

from shardkit import manifest, storage
from shardkit.errors import CorruptShardError
from shardkit.manifest import PileInfo
from shardkit.tar import compression


def byte_problems(url: str, buf: storage.Buffer, expected: PileInfo, *, checksum: bool = True) -> list[tuple[str, str]]:
    """What is wrong with a pile's bytes against its manifest entry, as ``(kind, message)``:
    ``size`` and ``checksum`` (checked only when ``checksum``)."""
    found = []
    size = size_problem(len(buf), expected)
    if size is not None:
        found.append(("size", size))
    if checksum:
        crc = manifest.format_checksum(manifest.checksum(buf))
        if crc != expected.checksum:
            found.append(("checksum", f"checksum is {crc}, the manifest says {expected.checksum}: the bytes changed after writing"))
    return found


def size_problem(nbytes: int, expected: PileInfo) -> str | None:
    """The message when a pile's file is ``nbytes`` long and its manifest entry says otherwise."""
    if nbytes == expected.bytes:
        return None
    what = "truncated" if nbytes < expected.bytes else "longer than written"
    return f"file is {nbytes} bytes, the manifest says {expected.bytes} ({what})"


def tar_problem(buf: storage.Buffer, expected: PileInfo, *, crc: int | None = None) -> str | None:
    """The message when a compressed pile's tar (decompressed, so its size was checked) is not
    the one the manifest's ``tar_checksum`` names; ``crc``: the tar's CRC-32 when already taken."""
    found = manifest.format_checksum(manifest.checksum(buf) if crc is None else crc)
    if expected.tar_checksum is not None and found != expected.tar_checksum:
        return f"the tar inside has checksum {found}, the manifest says {expected.tar_checksum}: the bytes changed after writing"
    return None


def unpack(
    url: str,
    stored: storage.Buffer,
    expected: PileInfo,
    *,
    checksum: bool = True,
    trusted: bool = False,
    scratch: storage.Scratch | None = None,
) -> storage.Buffer:
    """The tar of a pile as its manifest entry describes it: ``stored`` itself for a plain pile,
    else decompressed (into one of ``scratch``'s maps where the codec can) and checked against
    ``tar_bytes`` (and ``tar_checksum`` when ``checksum``, unless ``trusted``: ``stored`` is
    bytes whose tar passed before, which decompress to the same tar).

    Raises:
        CorruptShardError: naming ``url``: not the codec's data, truncated or corrupt, or a tar
            of another size or checksum than the manifest's.
    """
    if expected.compression is None:
        return stored
    # with ``checksum`` the tar's CRC-32 is checked just below, so an lz4 frame's own checksum of the same bytes is skipped
    if checksum and not trusted and expected.tar_bytes is not None:  # the CRC-32 taken as the tar is decoded where it can be
        tar, crc = compression.decompress_with_crc(stored, expected.compression, url, size=expected.tar_bytes, into=scratch)
        problem = tar_problem(tar, expected, crc=crc)
    else:
        tar = compression.decompress(stored, expected.compression, url, size=expected.tar_bytes, checked=checksum, into=scratch)
        problem = None
    if problem is not None:
        raise CorruptShardError(f"{url}: {problem}")
    return tar


def read_listed(url: str, expected: PileInfo) -> storage.Buffer:
    """The tar of the data file ``url`` (a local one memory-mapped), read whole and checked as
    :func:`byte_problems` and :func:`unpack` check it.

    Raises:
        CorruptShardError: naming ``url`` and the first problem found.
        DatasetNotFoundError: the file is missing.
    """
    stored = storage.map_bytes(url)
    problems = byte_problems(url, stored, expected)
    if problems:
        raise CorruptShardError(f"{url}: {problems[0][1]}")
    return unpack(url, stored, expected)
