"""Pass 1 of the shuffle: route samples to M pile tar shards and publish them with a manifest.

Samples are encoded to tar members, routed by :mod:`shardkit.router` and appended to per-pile
part files in a staging directory inside the output. :func:`publish` turns part files into
``pile-000000.tar ...``: it concatenates each pile's runs in input order, splits piles that
exceed ``max_pile_bytes`` into random sub-piles, renames them into place and writes
``shardkit.json`` last. Until then the output holds no manifest, so no reader mistakes half a
dataset for a whole one.

    with shardkit.PileWriter("out/", piles=64, seed=0) as w:
        for i, (img, label) in enumerate(data):
            w.write({"__key__": f"{i:08d}", "jpg": img, "cls": label})
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import uuid
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardkit import _tar, manifest, router, storage
from shardkit._sizes import parse_size
from shardkit.codecs import DEFAULT, Codecs, encode_field
from shardkit.errors import ConfigError, CorruptShardError, DatasetExistsError, SampleError
from shardkit.manifest import Manifest, PileInfo

log = logging.getLogger(__name__)

STAGING_PREFIX = ".shardkit-staging-"


def pile_name(index: int) -> str:
    return f"pile-{index:06d}.tar"


def _version() -> str:
    from shardkit import __version__

    return f"shardkit {__version__}"


@dataclass(frozen=True, kw_only=True)
class PileOptions:
    """How pass 1 writes piles; shared by :class:`PileWriter`, :func:`preprocess` and YAML jobs.

    Args:
        piles: number of piles M (expected pile size n/M; see the README on choosing M).
        seed: seeds the router; the same inputs and seed give byte-identical piles.
        max_pile_bytes: piles larger than this (int or ``"2GiB"``) are split into random
            sub-piles at the end, so every pile fits the loader's memory.
        buffer_size: bytes buffered in memory before part files are appended to.
        overwrite: replace a dataset already in the output directory.
    """

    piles: int
    seed: int = 0
    max_pile_bytes: int | str | None = None
    buffer_size: int | str = "64MiB"
    overwrite: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.piles, bool) or not isinstance(self.piles, int) or self.piles < 1:
            raise ConfigError(f"piles: expected a positive integer, got {self.piles!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed: expected a non-negative integer, got {self.seed!r}")
        if self.max_pile_bytes is not None:
            object.__setattr__(self, "max_pile_bytes", parse_size(self.max_pile_bytes, what="max_pile_bytes"))
        object.__setattr__(self, "buffer_size", parse_size(self.buffer_size, what="buffer_size"))

    @property
    def max_bytes(self) -> int | None:
        return self.max_pile_bytes  # type: ignore[return-value]


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise SampleError(f"sample key must be a non-empty str, got {key!r}")
    parts = key.split("/")
    if key.startswith("/") or ".." in parts or "" in parts:
        raise SampleError(f"sample key {key!r}: no leading '/', empty or '..' path components allowed")
    if "." in parts[-1]:
        raise SampleError(f"sample key {key!r} has a dot in its file name: readers would split the key at it (use '_' instead)")
    if any(len(part) >= 4 and part.startswith("__") and part.endswith("__") for part in parts):
        # WebDataset treats such names as metadata and silently skips the member
        raise SampleError(f"sample key {key!r}: a path component like '__name__' is reserved (WebDataset readers skip it)")
    return key


def encode_sample(sample: Mapping[str, Any], codecs: Codecs = DEFAULT, *, max_pile_bytes: int | None = None) -> tuple[bytes, list[str]]:
    """Encode a WebDataset sample dict into tar members; returns (bytes, extensions).

    Fields are written in sorted order; keys starting with ``__`` other than ``__key__`` are
    metadata and are not written.

    Raises:
        SampleError: a bad key, an empty or duplicate extension, a value with no encoder, or a
            sample that alone would not fit in a pile of ``max_pile_bytes``.
    """
    if "__key__" not in sample:
        raise SampleError(f"sample has no '__key__' (fields: {sorted(sample)})")
    key = _check_key(sample["__key__"])
    fields: dict[str, Any] = {}
    for name, value in sample.items():
        if name.startswith("__"):
            continue
        ext = name[1:] if name.startswith(".") else name
        if not ext or "/" in ext:
            raise SampleError(f"sample {key!r}: field name {name!r} is not a valid extension")
        if ext in fields:
            raise SampleError(f"sample {key!r}: two fields with extension {ext!r}")
        fields[ext] = value
    if not fields:
        raise SampleError(f"sample {key!r} has no fields besides its key")
    exts = sorted(fields)
    data = b"".join([_tar.member(f"{key}.{ext}", encode_field(codecs, key, ext, fields[ext])) for ext in exts])
    if max_pile_bytes is not None and len(data) + len(_tar.TRAILER) > max_pile_bytes:
        raise SampleError(f"sample {key!r} is {len(data)} bytes, larger than max_pile_bytes ({max_pile_bytes}) on its own")
    return data, exts


class PileSink:
    """Per-pile append-only part files in one directory, fed through a bounded memory buffer.

    Each pile's part file records which input unit wrote which byte range (``segments``), so
    parts written by several processes can be merged back into input order. ``segments[p]`` is
    a flat ``array('q')`` of ``[unit, start, end, samples]`` quads: compact enough to keep one
    per (unit, pile) pair for millions of units and to send between processes.
    """

    def __init__(self, directory: str, piles: int, buffer_size: int) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self._chunks: list[list[bytes]] = [[] for _ in range(piles)]
        self._buffered = 0
        self._limit = buffer_size
        self.counts = [0] * piles
        self.sizes = [0] * piles
        self.segments: list[array[int]] = [array("q") for _ in range(piles)]

    def part(self, pile: int) -> str:
        return os.path.join(self.directory, f"{pile:06d}.part")

    def add(self, pile: int, data: bytes, unit: int) -> None:
        self._chunks[pile].append(data)
        n = len(data)
        start = self.sizes[pile]
        seg = self.segments[pile]
        if seg and seg[-4] == unit and seg[-2] == start:
            seg[-2] = start + n
            seg[-1] += 1
        else:
            seg.extend((unit, start, start + n, 1))
        self.sizes[pile] = start + n
        self.counts[pile] += 1
        self._buffered += n
        if self._buffered >= self._limit:
            self.flush()

    def flush(self) -> None:
        for pile, chunks in enumerate(self._chunks):
            if chunks:
                with open(self.part(pile), "ab") as f:
                    _write_joined(f, chunks)
                chunks.clear()
        self._buffered = 0


# join at most this much at once: a join of the whole buffer (one pile takes all of it when M=1)
# gets fresh pages from the OS on every flush and made M=1 slower than M=64
_JOIN_BYTES = 4 << 20


def _write_joined(f: Any, chunks: list[bytes]) -> None:
    group: list[bytes] = []
    size = 0
    for chunk in chunks:
        group.append(chunk)
        size += len(chunk)
        if size >= _JOIN_BYTES:
            f.write(b"".join(group))
            group.clear()
            size = 0
    if group:
        f.write(b"".join(group))


@dataclass(frozen=True)
class Run:
    """A byte range of a part file that belongs to a pile, in output order."""

    path: str
    offset: int
    length: int


class PileWriter:
    """Write samples into M piles chosen uniformly at random; publish them on ``close()``.

    Args:
        path: output directory (created if missing).
        piles, seed, max_pile_bytes, buffer_size, overwrite: see :class:`PileOptions`.
        codecs: encoders by extension (default :data:`shardkit.codecs.DEFAULT`).

    Leaving the ``with`` block on an exception (Ctrl-C included) removes the staging files and
    writes no manifest.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        piles: int,
        seed: int = 0,
        max_pile_bytes: int | str | None = None,
        buffer_size: int | str = "64MiB",
        overwrite: bool = False,
        codecs: Codecs | None = None,
    ) -> None:
        self.options = PileOptions(piles=piles, seed=seed, max_pile_bytes=max_pile_bytes, buffer_size=buffer_size, overwrite=overwrite)
        self.path = prepare_output(path, overwrite=overwrite)
        self._staging = os.path.join(self.path, f"{STAGING_PREFIX}{uuid.uuid4().hex}")
        self._sink = PileSink(self._staging, piles, self.options.buffer_size)  # type: ignore[arg-type]
        self._router = router.PileRouter(piles=piles, seed=seed)
        self._codecs = codecs or DEFAULT
        self._fields: set[str] = set()
        self._closed = False
        self.manifest: Manifest | None = None

    def write(self, sample: Mapping[str, Any]) -> int:
        """Encode ``sample`` and append it to a randomly chosen pile; returns the pile index."""
        if self._closed:
            raise RuntimeError("PileWriter.write() called after close(); open a new writer.")
        data, exts = encode_sample(sample, self._codecs, max_pile_bytes=self.options.max_bytes)
        self._fields.update(exts)
        pile = self._router.next()
        self._sink.add(pile, data, 0)
        return pile

    def close(self) -> Manifest:
        """Publish the piles and the manifest. Idempotent; returns the manifest."""
        if not self._closed:
            self._closed = True
            try:
                self._sink.flush()
                runs = [[Run(self._sink.part(p), 0, self._sink.sizes[p])] for p in range(self.options.piles)]
                self.manifest = publish(
                    self.path, runs, self._sink.counts, options=self.options, fields=self._fields, staging=self._staging
                )
            finally:
                shutil.rmtree(self._staging, ignore_errors=True)
        assert self.manifest is not None
        return self.manifest

    def abort(self) -> None:
        """Drop everything written so far; the output directory gets no manifest."""
        self._closed = True
        shutil.rmtree(self._staging, ignore_errors=True)

    def __enter__(self) -> PileWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def prepare_output(path: str | os.PathLike[str], *, overwrite: bool) -> str:
    """Check and create an output directory; refuse one holding a dataset unless ``overwrite``."""
    out = os.fspath(path)
    if storage.local_path(out) is None:
        raise ConfigError(f"{out}: writing piles to remote storage is not supported yet; write locally and upload")
    out = storage.local_path(out) or out
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"{out}: output exists and is not a directory")
    if manifest.is_dataset(out) and not overwrite:
        raise DatasetExistsError(
            f"{out}: already holds a shardkit dataset ({manifest.MANIFEST}); pass overwrite=True (--overwrite) to replace it"
        )
    os.makedirs(out, exist_ok=True)
    return out


def _assemble(runs: Iterable[Run], dst: str) -> None:
    """Make ``dst`` a finished pile from its runs; a single whole part file is just renamed."""
    runs = [r for r in runs if r.length]
    if len(runs) == 1 and runs[0].offset == 0 and os.path.getsize(runs[0].path) == runs[0].length:
        os.replace(runs[0].path, dst)
        with open(dst, "ab") as f:
            f.write(_tar.TRAILER)
        return
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(dst, "wb"))
        sources: dict[str, Any] = {}  # one handle per part file, however many runs it has
        for run in runs:
            src = sources.get(run.path)
            if src is None:
                src = sources[run.path] = stack.enter_context(open(run.path, "rb"))
            copied = _copy_range(src, out, run.offset, run.length)
            if copied != run.length:
                raise CorruptShardError(
                    f"{run.path}: part file ends early: expected {run.length} bytes at offset {run.offset}, got {copied}"
                )
        out.write(_tar.TRAILER)


_COPY_CHUNK = 8 << 20


def _copy_range(src: Any, out: Any, offset: int, length: int) -> int:
    """Append ``length`` bytes of ``src`` from ``offset`` to ``out``; returns the bytes copied.

    Uses the kernel's ``copy_file_range`` where it exists (no trip through user space, reflinks
    on file systems that have them); memory stays bounded by ``_COPY_CHUNK`` either way.
    """
    done = 0
    if hasattr(os, "copy_file_range"):
        out.flush()
        try:
            while done < length:
                n = os.copy_file_range(src.fileno(), out.fileno(), min(length - done, 1 << 30), offset + done)
                if n == 0:
                    return done
                done += n
            out.seek(0, os.SEEK_END)
            return done
        except OSError:  # e.g. EXDEV across file systems on old kernels: fall back to reading
            out.seek(0, os.SEEK_END)
    src.seek(offset + done)
    while done < length:
        chunk = src.read(min(length - done, _COPY_CHUNK))
        if not chunk:
            break
        out.write(chunk)
        done += len(chunk)
    return done


def _split(path: str, name: str, *, limit: int, seed: int, trail: tuple[int, ...], staging: str) -> list[tuple[str, str, int]]:
    """Split the finished pile at ``path`` into random sub-piles of at most ``limit`` bytes.

    Returns (staged file, pile name, sample count) for each piece, splitting again as needed.
    """
    data = storage.read_bytes(path)
    members = _tar.walk(data, name)
    keys, starts = _tar.group(members, name)
    if len(data) <= limit:
        return [(path, name, len(keys))]
    if len(keys) <= 1:
        raise SampleError(f"{name}: sample {keys[0]!r} alone is larger than max_pile_bytes ({limit})")
    bounds = _tar.sample_spans(members, starts)
    parts = max(2, math.ceil(len(data) / (0.9 * limit)))
    assignment = router.split_assignment(parts=parts, seed=seed, path=trail, count=len(keys))
    stem = name[: -len(".tar")]
    pieces = []
    for part in range(parts):
        chosen = [i for i in range(len(keys)) if assignment[i] == part]
        if not chosen:
            continue
        sub_name = f"{stem}-{part:03d}.tar"
        sub_path = os.path.join(staging, sub_name)
        with open(sub_path, "wb") as f:
            for i in chosen:
                f.write(data[bounds[i] : bounds[i + 1]])
            f.write(_tar.TRAILER)
        pieces.extend(_split(sub_path, sub_name, limit=limit, seed=seed, trail=(*trail, part), staging=staging))
    os.unlink(path)
    return pieces


def _file_crc(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            crc = manifest.checksum(chunk, crc)
    return crc


def publish(
    out: str,
    runs: Iterable[Iterable[Run]],
    counts: Sequence[int],
    *,
    options: PileOptions,
    fields: set[str],
    staging: str,
    skipped_units: int = 0,
    extra: dict[str, Any] | None = None,
) -> Manifest:
    """Assemble each pile from its runs, split oversized piles, move them in, write the manifest.

    ``runs`` gives, pile by pile, its byte ranges in output order (it may be a lazy iterable);
    ``counts[p]`` is pile p's sample count.
    """
    staged: list[tuple[str, str, int]] = []
    split = 0
    for p, pile_runs in enumerate(runs):
        name = pile_name(p)
        path = os.path.join(staging, name)
        _assemble(pile_runs, path)
        limit = options.max_bytes
        if limit is not None and os.path.getsize(path) > limit:
            pieces = _split(path, name, limit=limit, seed=options.seed, trail=(p,), staging=staging)
            log.info("%s is over max_pile_bytes=%d: split into %d random sub-piles", name, limit, len(pieces))
            split += 1
            staged.extend(pieces)
        else:
            staged.append((path, name, counts[p]))
    # the old dataset stops being one before any of its files change
    storage.remove(os.path.join(out, manifest.MANIFEST))
    for entry in os.listdir(out):
        if entry.startswith("pile-") and entry.endswith(".tar"):
            os.unlink(os.path.join(out, entry))
    infos = []
    for path, name, count in staged:
        size = os.path.getsize(path)
        crc = _file_crc(path)
        os.replace(path, os.path.join(out, name))
        infos.append(PileInfo(name=name, samples=count, bytes=size, checksum=manifest.format_checksum(crc)))
    result = Manifest(
        piles=tuple(infos),
        seed=options.seed,
        fields=tuple(sorted(fields)),
        created_by=_version(),
        skipped_units=skipped_units,
        split_piles=split,
        extra=extra or {},
    )
    manifest.write(out, result)
    with contextlib.suppress(OSError):
        shutil.rmtree(staging)
    return result
