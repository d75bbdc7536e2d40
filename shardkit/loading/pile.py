"""Read one pile, checked against its manifest entry: the pile read path of the loader and ``verify``.

Reading is two halves. :func:`fetch` takes the bytes and checks them (size limit, manifest
size, CRC-32), decompresses a compressed pile (``pile-000000.tar.zst``) and checks the tar
inside against its own size and CRC-32, and scans the headers with numpy: all of it mostly
without the GIL, so the loader's prefetch thread does it and the pile in memory is a plain tar. :func:`open_pile` finishes the index and checks the sample count.
A pile read again in this process whose bytes check against the same manifest entry skips the
scan and the index: its :class:`~shardkit.tar.shard.Layout` is kept; a local file unchanged since
its bytes passed is not checksummed again (:mod:`shardkit.loading.layouts`).
``verify`` runs the same checks and lists every problem instead of raising the first
(:func:`~shardkit.dataset.file_checks.byte_problems`, which the checks here share).

    fetched = fetch("data/pile-000003.tar", expected=info)
    shard = open_pile(fetched, expected=info)      # or read_pile(url, expected=info)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardkit import storage
from shardkit.dataset.file_checks import byte_problems, size_problem, unpack
from shardkit.errors import CorruptShardError, ManifestError, PileTooLargeError
from shardkit.loading.layouts import LAYOUTS
from shardkit.manifest import PileInfo
from shardkit.tar import scan
from shardkit.tar.scan import Chain
from shardkit.tar.shard import Layout, Shard, read_shard
from shardkit.tar.write import TRAILER


@dataclass(frozen=True, slots=True)
class Fetched:
    """A pile's checked bytes and the vectorized half of its index.

    Attributes:
        url: where it was read from.
        buf: the bytes (a memory map for local piles).
        chain: the header scan (None: walk it member by member).
        checked: the bytes matched the manifest's checksum.
        version: the file's version looked at before it was read, for fields left where they lie
            (:mod:`shardkit.loading.located`); None when not looked at.
        layout: the index of these checked bytes, made when the pile was read before
            (:mod:`shardkit.loading.layouts`): nothing was scanned (``chain`` is None).
    """

    url: str
    buf: storage.Buffer
    chain: Chain | None
    checked: bool
    version: str | None = None
    layout: Layout | None = None


def count_problem(shard: Shard, expected: PileInfo) -> str | None:
    """The message when ``shard`` holds another number of samples than its manifest entry says."""
    if len(shard) != expected.samples:
        return f"holds {len(shard)} samples, the manifest says {expected.samples}"
    return None


def fetch(
    url: str,
    *,
    expected: PileInfo | None = None,
    max_bytes: int | None = None,
    verify: bool = True,
    mapped: bool = True,
    reads: storage.RemoteReads | None = None,
    scratch: storage.Scratch | None = None,
) -> Fetched:
    """A pile's bytes, checked (size limit, manifest size and checksum) and scanned.

    Without ``expected`` (a plain shard, no manifest) a ``.tar.zst`` or ``.tar.gz`` is
    decompressed in memory. A pile in an object store is read as ``reads`` says (concurrent
    ranges, a cache; a cache keeps compressed piles compressed) and read again when its bytes
    come back wrong. A compressed pile is checked as stored, then decompressed (see
    :func:`unpack`, into ``scratch``'s memory when given); ``max_bytes`` applies to its tar, the memory it takes.

    Raises:
        PileTooLargeError, CorruptShardError, DatasetNotFoundError.
    """
    if expected is None:
        _check_limit(url, storage.size(url) if max_bytes is not None else 0, max_bytes)
        buf = read_shard(url, mapped=mapped)
        if max_bytes is not None and len(buf) > max_bytes:
            raise PileTooLargeError(f"{url}: decompresses to {len(buf)} bytes, over the memory limit max_pile_bytes={max_bytes}")
        return Fetched(url, buf, scan.scan(buf), checked=False)
    if expected.segments is not None and url.endswith(expected.name):  # a pile that grew: its segment files, beside it
        at = url[: len(url) - len(expected.name)]
        return fetch_segments(
            url, [at + s.name for s in expected.segments], expected=expected, max_bytes=max_bytes, verify=verify, reads=reads
        )
    known = LAYOUTS.get(url, expected) if verify else None  # used only once the bytes are checked below
    buf = _tar(url, expected, max_bytes=max_bytes, verify=verify, mapped=mapped, reads=reads, scratch=scratch)
    return _scanned(url, buf, verify, known)


def _tar(
    url: str,
    expected: PileInfo,
    *,
    max_bytes: int | None,
    verify: bool,
    mapped: bool,
    reads: storage.RemoteReads | None,
    scratch: storage.Scratch | None = None,
) -> storage.Buffer:
    """The tar of one pile or segment file, checked: the file as stored, decompressed when it is
    compressed. A local file whose every check passed is remembered as such under its lasting
    version (:mod:`shardkit.loading.layouts`): read again unchanged, it is not checked again."""
    compressed = expected.compression is not None
    if compressed:
        _check_limit(url, expected.tar_size, max_bytes)
    stored, trusted, lasting = _stored(
        url, expected, max_bytes=None if compressed else max_bytes, verify=verify, mapped=mapped or compressed, reads=reads
    )
    buf = stored
    if compressed:
        try:
            buf = unpack(url, stored, expected, checksum=verify, trusted=trusted, scratch=scratch)
        finally:
            storage.unmap(stored)
    if lasting is not None and not trusted:  # every check of these bytes passed
        LAYOUTS.passed(url, expected, lasting)
    return buf


def _scanned(url: str, buf: storage.Buffer, checked: bool, known: Layout | None) -> Fetched:
    """``buf`` with its header scan, or with the layout of the same checked bytes read before."""
    if known is not None:
        return Fetched(url, buf, None, checked=True, layout=known)
    return Fetched(url, buf, scan.scan(buf, checksums=not checked), checked=checked)


def _stored(
    url: str, expected: PileInfo, *, max_bytes: int | None, verify: bool, mapped: bool, reads: storage.RemoteReads | None
) -> tuple[storage.Buffer, bool, str | None]:
    """The pile's file as stored, checked against the manifest's size and (``verify``) checksum;
    whether these are the bytes of a file that passed every check before and is unchanged since
    (a local file whose lasting version is the one remembered), which are not checksummed again;
    and that lasting version (None: the file has none, or it changed while it was read)."""
    store, name = storage.locate(url, reads=reads or storage.RemoteReads())
    if not store.supports_mapping:  # the bytes travel: the manifest's size decides, the read finds an object of another size
        _check_limit(url, expected.bytes, max_bytes)
        # a cached copy is checksummed when first used whatever ``verify`` says: a disk or a person may have changed it
        full = None if verify else _checker(url, expected, True)
        return store.read_checked(name, size=expected.bytes, check=_checker(url, expected, verify), first_check=full), False, None
    # one look at the size, before any byte is read: over the limit, or not what the manifest says
    nbytes = store.size(name)
    _check_limit(url, nbytes, max_bytes)
    problem = size_problem(nbytes, expected)
    if problem is not None:
        raise CorruptShardError(f"{url}: {problem}")
    # the lasting version before and after the read: the same, the bytes read are that version's
    # (a file replaced, even by the one before it, has another change time)
    before = store.lasting_version(name) if verify else None
    buf = store.read_whole(name) if mapped else store.read(name)
    lasting = before if before is not None and store.lasting_version(name) == before else None
    trusted = lasting is not None and LAYOUTS.checked(url, expected) == lasting
    problems = byte_problems(url, buf, expected, checksum=verify and not trusted)
    if problems:
        raise CorruptShardError(f"{url}: {problems[0][1]}")
    return buf, trusted, lasting


def fetch_segments(
    url: str,
    segments: Sequence[str],
    *,
    expected: PileInfo,
    max_bytes: int | None = None,
    verify: bool = True,
    reads: storage.RemoteReads | None = None,
) -> Fetched:
    """A pile that is several segment files (``segments``, their URLs): each read and checked
    against its own manifest entry (a compressed one decompressed, see :func:`unpack`), then joined as one tar without the inner end-of-archive
    trailers (a stream reader stops at the first). ``url`` names the pile.

    Raises:
        PileTooLargeError, CorruptShardError (naming the segment file), DatasetNotFoundError.
    """
    _check_limit(url, expected.tar_size, max_bytes)
    bodies: list[storage.Buffer | memoryview] = []
    for seg_url, seg in zip(segments, expected.segments or (), strict=True):
        buf = _tar(seg_url, seg.info(), max_bytes=None, verify=verify, mapped=True, reads=reads)
        if len(buf) < len(TRAILER) or buf[len(buf) - len(TRAILER) :] != TRAILER:
            raise CorruptShardError(f"{seg_url}: segment of {url} does not end with the end-of-archive trailer (two zero blocks)")
        bodies.append(memoryview(buf)[: len(buf) - len(TRAILER)])
    joined = b"".join([*bodies, TRAILER])
    bodies.clear()
    return _scanned(url, joined, verify, LAYOUTS.get(url, expected) if verify else None)


def _check_limit(url: str, nbytes: int, max_bytes: int | None) -> None:
    if max_bytes is not None and nbytes > max_bytes:
        raise PileTooLargeError(
            f"{url}: {nbytes} bytes is over the memory limit max_pile_bytes={max_bytes}; raise the limit or split the piles "
            "(shardkit repile --max-pile-bytes)"
        )


def _checker(url: str, expected: PileInfo, checksum: bool) -> Callable[[storage.Buffer], str | None]:
    """The first of :func:`byte_problems` of a buffer, or None: what a remote read is checked with."""

    def check(buf: storage.Buffer) -> str | None:
        if (
            len(buf) > expected.bytes
        ):  # the read asks for one byte more than the manifest's size: the object is longer, by how much is unknown
            return f"file is over {expected.bytes} bytes, the manifest says {expected.bytes} (longer than written)"
        problems = byte_problems(url, buf, expected, checksum=checksum)
        return problems[0][1] if problems else None

    return check


def open_pile(fetched: Fetched, *, expected: PileInfo | None = None, unique: bool = False) -> Shard:
    """Finish indexing what :func:`fetch` returned and check the sample count.

    ``unique``: refuse a key that names two samples (see :class:`~shardkit.tar.shard.Shard`),
    for plain shards; piles were checked when they were written.

    Raises:
        CorruptShardError: the tar is malformed; ManifestError: the count is not the manifest's.
    """
    if fetched.layout is not None:
        return Shard(fetched.url, fetched.buf, layout=fetched.layout)  # its count was checked when it was made
    shard = Shard(fetched.url, fetched.buf, chain=fetched.chain, checked=fetched.checked, unique=unique)
    problem = count_problem(shard, expected) if expected is not None else None
    if problem is not None:
        raise ManifestError(f"{fetched.url}: {problem}")
    if expected is not None and fetched.checked:
        LAYOUTS.put(fetched.url, expected, shard.layout)
    return shard


def read_pile(
    url: str,
    *,
    expected: PileInfo | None = None,
    max_bytes: int | None = None,
    verify: bool = True,
    reads: storage.RemoteReads | None = None,
) -> Shard:
    """:func:`fetch` then :func:`open_pile`: one pile, read whole and checked."""
    fetched = fetch(url, expected=expected, max_bytes=max_bytes, verify=verify, mapped=False, reads=reads)
    return open_pile(fetched, expected=expected)
