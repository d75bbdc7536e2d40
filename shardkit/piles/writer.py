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

import functools
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from shardkit import _tar, router
from shardkit._checks import check_int
from shardkit._publish import STAGING_PREFIX, Run, pile_name, prepare_output, publish
from shardkit._sink import PileSink
from shardkit._sizes import parse_size
from shardkit.codecs import DEFAULT, Codecs, encode_field
from shardkit.errors import ConfigError, SampleError
from shardkit.manifest import Manifest

__all__ = [
    "STAGING_PREFIX",
    "PileOptions",
    "PileSink",
    "PileWriter",
    "Run",
    "encode_sample",
    "pile_name",
    "prepare_output",
    "publish",
]


# the smallest pile that holds a sample: one 512-byte header (empty data) and the trailer
MIN_PILE_BYTES = 3 * _tar.BLOCK


@dataclass(frozen=True, kw_only=True)
class PileOptions:
    """How pass 1 writes piles; shared by :class:`PileWriter`, :func:`preprocess` and YAML jobs.

    Args:
        piles: number of piles M (expected pile size n/M; see the README on choosing M).
        seed: seeds the router; the same inputs and seed give byte-identical piles.
        max_pile_bytes: the pile size to stay under (int or ``"2GiB"``), so piles fit the
            loader's memory. It is enforced through sample counts, which keeps the first epoch
            exactly uniform: a pile holding more samples than 90% of it fits at the dataset's
            mean sample size is split into random sub-piles. With very uneven sample sizes a
            pile can end up above it: it is logged and listed in the manifest's
            ``extra["over_max_pile_bytes"]``, and ``shardkit info`` shows the largest pile. A
            single sample larger than it is a ``SampleError`` when written. At least 1536.
        buffer_size: bytes buffered in memory before part files are appended to.
        overwrite: replace a dataset already in the output directory.
    """

    piles: int
    seed: int = 0
    max_pile_bytes: int | str | None = None
    buffer_size: int | str = "64MiB"
    overwrite: bool = False

    def __post_init__(self) -> None:
        check_int("piles", self.piles, low=1)
        check_int("seed", self.seed, low=0)
        if self.max_pile_bytes is not None:
            limit = parse_size(self.max_pile_bytes, what="max_pile_bytes")
            if limit < MIN_PILE_BYTES:
                raise ConfigError(
                    f"max_pile_bytes: expected at least {MIN_PILE_BYTES} bytes (a member header and the end-of-archive marker), got {limit}"
                )
            object.__setattr__(self, "max_pile_bytes", limit)
        object.__setattr__(self, "buffer_size", parse_size(self.buffer_size, what="buffer_size"))

    @property
    def max_bytes(self) -> int | None:
        return self.max_pile_bytes  # type: ignore[return-value]


# C0 and C1 control characters, DEL: tar cuts a name at NUL, and none belongs in a file name
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise SampleError(f"sample key must be a non-empty str, got {key!r}")
    if _CONTROL.search(key):
        raise SampleError(f"sample key {key!r} contains a control character (NUL, newline, tab...): keys must be printable")
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
    order = _field_order(tuple(sample))
    if order is None:  # something is wrong with the field names: say what
        _refuse_fields(key, sample)
    parts: list[bytes | bytearray | memoryview] = []
    for name, ext in order:
        parts.extend(_tar.member_parts(f"{key}.{ext}", encode_field(codecs, key, ext, sample[name])))
    data = b"".join(parts)  # one copy of the payload, not one per member and one per sample
    if max_pile_bytes is not None and len(data) + len(_tar.TRAILER) > max_pile_bytes:
        raise SampleError(f"sample {key!r} is {len(data)} bytes, larger than max_pile_bytes ({max_pile_bytes}) on its own")
    return data, [ext for _, ext in order]


@functools.lru_cache(maxsize=1024)
def _field_order(names: tuple[str, ...]) -> tuple[tuple[str, str], ...] | None:
    """(field name, extension) of the fields a sample with these names writes, by extension.

    Samples of one dataset share their field names, so this runs once per kind of sample.
    None when the names are not valid (:func:`_refuse_fields` says why).
    """
    fields: dict[str, str] = {}
    for name in names:
        if name.startswith("__"):
            continue
        ext = name[1:] if name.startswith(".") else name
        if not ext or "/" in ext or ext in fields:
            return None
        fields[ext] = name
    return tuple((fields[ext], ext) for ext in sorted(fields)) or None


def _refuse_fields(key: str, sample: Mapping[str, Any]) -> NoReturn:
    seen: set[str] = set()
    for name in sample:
        if name.startswith("__"):
            continue
        ext = name[1:] if name.startswith(".") else name
        if not ext or "/" in ext:
            raise SampleError(f"sample {key!r}: field name {name!r} is not a valid extension")
        if ext in seen:
            raise SampleError(f"sample {key!r}: two fields with extension {ext!r}")
        seen.add(ext)
    raise SampleError(f"sample {key!r} has no fields besides its key")


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
        """Encode ``sample`` and append it to a randomly chosen pile; returns the pile index.

        Raises:
            SampleError: a sample :func:`encode_sample` refuses, or one whose key is the key of
                the sample just appended to the same pile (readers would merge the two).
        """
        if self._closed:
            raise RuntimeError("PileWriter.write() called after close(); open a new writer.")
        data, exts = encode_sample(sample, self._codecs, max_pile_bytes=self.options.max_bytes)
        self._fields.update(exts)
        pile = self._router.next()
        self._sink.add(pile, data, -1, sample["__key__"])
        return pile

    def close(self) -> Manifest:
        """Publish the piles and the manifest. Idempotent; returns the manifest.

        Raises:
            RuntimeError: an earlier ``close()`` failed, or ``abort()`` was called: nothing was
                published.
        """
        if not self._closed:
            self._closed = True
            try:
                self._sink.flush()
                sink = self._sink
                runs = [[Run(sink.part(p), 0, sink.sizes[p], sink.crcs[p])] for p in range(self.options.piles)]
                self.manifest = publish(
                    self.path, runs, self._sink.counts, options=self.options, fields=self._fields, staging=self._staging
                )
            finally:
                shutil.rmtree(self._staging, ignore_errors=True)
        if self.manifest is None:
            raise RuntimeError(
                "PileWriter.close(): nothing was published (an earlier close() failed or abort() was called); "
                "open a new writer and write the samples again."
            )
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
