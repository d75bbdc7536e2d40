"""Pass 1 of the shuffle: route samples to M pile tar shards and publish them with a manifest.

Samples are encoded to tar members, routed by :mod:`shardkit.piles.router` and appended to per-pile
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

import logging
import os
from collections.abc import Mapping
from typing import Any

from shardkit import storage
from shardkit._util import check_path, shown
from shardkit.codecs import Codecs, check_codecs
from shardkit.dataset.transaction import Dataset
from shardkit.errors import ConfigError, SampleError, prefixed
from shardkit.manifest import Manifest
from shardkit.option_fields import specs
from shardkit.piles import append, router
from shardkit.piles.advice import sparse_piles, too_many_piles
from shardkit.piles.encode import encode_values
from shardkit.piles.gather import SampleSink
from shardkit.piles.options import JOB_ONLY, WRITER, PileOptions
from shardkit.piles.publish import Run, publish
from shardkit.piles.unique_keys import check_sink

log = logging.getLogger(__name__)


def _in_process(options: PileOptions) -> PileOptions:
    """``options``, refused when it asks for what only a job over input units does."""
    for name in JOB_ONLY:
        value, default = getattr(options, name), specs(PileOptions)[name].default
        if value != default:
            raise ConfigError(
                f"{name}: PileWriter writes samples in the calling process; {name} applies to preprocess and pile "
                f"(expected {default!r}, got {value!r})"
            )
    return options


@WRITER
class PileWriter:
    """Write samples into M piles chosen uniformly at random; publish them on ``close()``.

    Args:
        path: output directory (created if missing), or an object-store URL
            (``s3://bucket/prefix``): part files are then staged in the local temporary
            directory and each pile is uploaded once on ``close()``, the manifest last.
        options: a :class:`PileOptions` instead of the keyword options below (not both);
            ``piles`` is required without it. Its ``workers``, ``on_error``, ``key_prefix``...
            describe jobs over input units: the writer writes in the calling process and refuses
            values other than the defaults.
        codecs: encoders by extension (default :data:`shardkit.codecs.DEFAULT`).

    Leaving the ``with`` block on an exception (Ctrl-C included) removes the staging files and
    writes no manifest; an output folder the writer made goes too, unless something else is in it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        options: PileOptions | None = None,
        codecs: Codecs | None = None,
        **keywords: Any,
    ) -> None:
        self.options = _in_process(WRITER.options(options, keywords))
        if (advice := too_many_piles(self.options.piles, f"PileWriter({check_path('out', path)!r})")) is not None:
            log.warning(advice)
        self._codecs = check_codecs(codecs)
        storage.use(path, self.options.storage_options)
        # held until close() or abort(): the lock, and the staging the transaction removes when it ends
        self._txn = Dataset(path).transaction(mode=self.options.mode, overwrite=self.options.overwrite).open()
        self.path = self._txn.path
        self._writeback: storage.Writeback | None = None
        try:
            self._staging = self._txn.staging()
            self._base = append.start(self._txn, self.options)  # None unless mode="append"
            # a local output is synced before it is published: the disk writes each flush back meanwhile
            self._writeback = None if self._txn.remote else storage.Writeback(self._staging)
            self._sink = SampleSink(self._staging, self.options.piles, self.options.buffer_size, writeback=self._writeback)  # type: ignore[arg-type]
            generation = 0 if self._base is None else self._base.generation
            self._router = router.PileRouter(piles=self.options.piles, seed=self.options.seed, generation=generation)
        except BaseException:
            self._release()
            raise
        self._fields: set[str] = set()
        self._exts: tuple[str, ...] = ()
        self._closed = False
        self._written = 0
        self.manifest: Manifest | None = None

    def write(self, sample: Mapping[str, Any]) -> int:
        """Encode ``sample`` and append it to a randomly chosen pile; returns the pile index.

        Raises:
            SampleError: a sample :func:`~shardkit.piles.encode.encode_sample` refuses (a surrogate that is no byte,
                a control character, a dot in its file name...), or one whose key is the key of
                the sample just appended to the same pile (readers would merge the two), before
                anything changes. A key repeated elsewhere in a pile is found by :meth:`close`.
        """
        if self._closed:
            raise RuntimeError("PileWriter.write() called after close(); open a new writer.")
        if type(sample) is not dict and not isinstance(sample, Mapping):
            raise SampleError(f"PileWriter.write: expected a sample dict with '__key__', got {shown(sample)}")
        at = self._written  # which of the calls to write this is, refused or not: where to look in the caller's stream
        self._written += 1
        try:
            key, exts, values, size = encode_values(sample, self._codecs, max_pile_bytes=self.options.max_bytes)
            if exts is not self._exts:  # one tuple for every sample with the same fields
                self._fields.update(exts)
                self._exts = exts
            pile = self._router.next()
            self._sink.put(pile, key, exts, values, size)
        except SampleError as e:
            prefixed(e, f"PileWriter.write: sample {at:,} (counting from 0; not written): ")
            raise
        return pile

    def close(self) -> Manifest:
        """Publish the piles and the manifest. Idempotent; returns the manifest.

        The piles are first checked for two samples with one key, in one pile or in two, from
        the 64-bit key hashes kept beside the part files (see :func:`~shardkit.piles.unique_keys.check_sink`).

        Raises:
            SampleError: two samples have one key (nothing is published).
            StorageError: the disk could not write the piles (nothing is published).
            RuntimeError: an earlier ``close()`` failed, or ``abort()`` was called: nothing was
                published.
        """
        if not self._closed:
            self._closed = True
            try:
                sink = self._sink
                sink.flush()
                sink.seal()  # each part is then its pile, installed as it is
                sink.close()
                check_sink(sink)
                runs = [[Run(sink.part(p), 0, sink.sizes[p], sink.crcs[p], sealed=True)] for p in range(self.options.piles)]
                if self._writeback is not None:
                    self._writeback.finish()  # a write error it met is reported once, to it: raised here, nothing published
                if self._base is None:  # a writer is not resumed: no records of finished piles
                    self.manifest = publish(
                        self._txn, runs, sink.counts, options=self.options, fields=self._fields, staging=self._staging, resumable=False
                    )
                else:
                    self.manifest = append.finish(
                        self._base, self._txn, runs, sink.counts, options=self.options, fields=self._fields, staging=self._staging
                    )
                if (advice := sparse_piles(self.manifest, self.options.piles, f"PileWriter({self.path!r})")) is not None:
                    log.warning(advice)
            finally:
                self._release()
        if self.manifest is None:
            raise RuntimeError(
                "PileWriter.close(): nothing was published (an earlier close() failed or abort() was called); "
                "open a new writer and write the samples again."
            )
        return self.manifest

    def abort(self) -> None:
        """Drop everything written so far; the output directory gets no manifest."""
        self._closed = True
        self._release()

    def _release(self) -> None:
        """Close the part files, wait for the writeback and end the transaction (the lock, the
        staging): each step whatever the one before raised (a second Ctrl-C included)."""
        try:
            sink: SampleSink | None = getattr(self, "_sink", None)  # None when the constructor failed before it
            if sink is not None:
                sink.close()
        finally:
            try:
                if self._writeback is not None:
                    self._writeback.close()
            finally:
                self._txn.close()

    def __enter__(self) -> PileWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
