"""Fused pass 1 over many inputs: run the user's function on each input unit, write piles.

Each input unit (a path, a shard URL, any picklable item) goes to ``fn(unit)``, which yields
sample dicts. Sample k of unit u goes to the pile a :class:`~shardkit.router.PileRouter` seeded
by ``(seed, u)`` draws k-th, so the output is byte-identical whatever the number of workers.
With ``workers > 1``, worker processes take units in small chunks as they become free; each
writes its own part files in a staging directory inside the output, recording which unit wrote
which bytes. At the end the parent orders every pile's byte ranges by unit and publishes them
with :func:`shardkit.writer.publish` (manifest last). A failed or interrupted job removes the
staging directory and writes no manifest.

    manifest = shardkit.preprocess(sorted(glob.glob("raw/*.jsonl")), parse_file, "out/",
                                   piles=256, workers=8)
    print(manifest.samples)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

from shardkit import manifest, storage
from shardkit._util import check_bool, check_path, check_paths, shown
from shardkit.codecs import DEFAULT, Codecs, check_codecs
from shardkit.dataset import file_checks
from shardkit.dataset.transaction import Dataset
from shardkit.errors import ConfigError, DatasetNotFoundError, ShardkitError
from shardkit.manifest import Manifest, PileInfo
from shardkit.piles import append, canonical, fingerprint, readers, resume
from shardkit.piles import classes as class_maps
from shardkit.piles import key_prefix as key_prefix_rule
from shardkit.piles.advice import sparse_piles, too_many_piles
from shardkit.piles.options import PILE, PREPROCESS, PileOptions
from shardkit.piles.pass1 import run_pass1
from shardkit.piles.transforms import Images
from shardkit.piles.units import UnitWork
from shardkit.tar.shard import Shard, iter_shard

log = logging.getLogger(__name__)


_RESERVED_EXTRA = ("units", "skipped", "over_max_pile_bytes", "repeat")
# the multiprocessing start methods mp_context may name
_START_METHODS = ("fork", "spawn", "forkserver")


def _validate(inputs: Any, extra: Mapping[str, Any] | None) -> list[Any]:
    """The input units as a list, and ``extra`` checked; the options are checked by :class:`PileOptions`."""
    if extra is not None:
        if not isinstance(extra, Mapping):
            raise ConfigError(f"extra: expected a mapping of JSON-serializable metadata or None, got {shown(extra)}")
        taken = [k for k in _RESERVED_EXTRA if k in extra]
        if taken:
            raise ConfigError(f"extra: keys {taken} are written by preprocess itself; use other names")
        try:
            json.dumps(dict(extra))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"extra: must be JSON-serializable ({e})") from None
    if isinstance(inputs, (str, bytes, os.PathLike)):
        raise ConfigError(f"inputs: expected a sequence of input units, got a single {type(inputs).__name__} (wrap it in a list)")
    if not isinstance(inputs, Iterable):
        raise ConfigError(f"inputs: expected a sequence of input units, got {shown(inputs)}")
    units = list(inputs)
    if not units:
        raise ConfigError("inputs: no input units given")
    return units


@PREPROCESS
def preprocess(
    inputs: Iterable[Any],
    fn: Callable[[Any], Iterable[Mapping[str, Any]]],
    out: str | os.PathLike[str],
    *,
    options: PileOptions | None = None,
    quiet: bool = False,
    codecs: Codecs | None = None,
    mp_context: str | None = None,
    extra: Mapping[str, Any] | None = None,
    **keywords: Any,
) -> Manifest:
    """Run ``fn`` on every input unit and write its samples into M random piles in ``out``.

    Args:
        inputs: the input units (paths, URLs, any picklable items); unit i is the i-th item.
        fn: ``fn(unit)`` returns or yields sample dicts (``__key__`` plus fields by extension).
            A reader (:mod:`shardkit.piles.readers`) given paths plans its own units from them.
            With ``workers > 1`` it runs in worker processes: lambdas and closures work (they
            are sent with dill), but it must not rely on state changed in the parent later.
        out: output directory; gets ``pile-000000.tar ...`` and ``shardkit.json`` (last).
        options: a :class:`~shardkit.PileOptions` holding every option below that it names,
            instead of the keywords (not both: a keyword other than its default is then a
            ``ConfigError``). ``piles`` is required without it.
        quiet: no progress bar (it is also off when stderr is not a terminal).
        codecs: encoders by extension (default :data:`shardkit.codecs.DEFAULT`).
        mp_context: multiprocessing start method (``"fork"``, ``"spawn"``, ``"forkserver"``);
            default: the platform's.
        extra: JSON-serializable metadata kept in ``manifest.extra`` (class names, a source
            version...). ``preprocess`` adds ``units`` (the number of input units) and, when
            units were skipped, ``skipped``.

    The options above are the fields of :class:`~shardkit.PileOptions` but ``key_prefix``
    (the keys come from ``fn``). A failing unit ``on_error="skip"`` drops is counted in
    ``manifest.skipped_units`` and listed in ``manifest.extra["skipped"]``. ``out`` may be an
    object-store URL (``s3://bucket/prefix``): part files are then staged in the local
    temporary directory (``TMPDIR``; up to the dataset's size, freed pile by pile) and each pile
    is uploaded once, the manifest last; with ``executor="ray"`` that staging directory (inside
    ``out``, or ``TMPDIR`` for a remote ``out``) must be a path every node of the cluster sees.

    Sample keys must be unique across all inputs. A key a unit repeats fails that unit (as
    ``fn`` raising would); a key two units share is refused when they land in one pile, found
    at the merge from 64-bit key hashes kept beside the part files (8 bytes of disk a sample;
    16 bytes of memory a sample of the pile being checked, one pile at a time).

    Returns:
        The manifest that was written.

    Raises:
        InputError: ``fn`` raised on a unit (named, with its index), with ``on_error="raise"``;
            the original exception (or, from a worker, its traceback) is the ``__cause__``.
        SampleError: a sample could not be encoded. Like every shardkit error raised while
            processing a unit, it keeps its class and the message names the unit first.
        DatasetExistsError: ``out`` holds a dataset and ``overwrite`` is false.
        ConfigError: an option is invalid.
    """
    options = PREPROCESS.options(options, keywords)
    if not callable(fn):
        raise ConfigError(f"fn: expected a function fn(unit) that yields sample dicts, got {shown(fn)}")
    refuse_key_prefix(options)
    units = _validate(inputs, extra)
    # the dataset an append adds to, read only when a class map is at stake
    classes = isinstance(fn, Images) or bool(extra and class_maps.CLASSES in extra)
    dataset = _recorded(out, options) if classes else None
    if isinstance(fn, Images) and class_maps.CLASSES not in (extra or {}):
        # the map its cls numbers by must be recorded, and an append's checked against the
        # dataset's: units made without the dataset's map would relabel its classes silently
        known = class_maps.recorded(dataset, f"{out}: append") if dataset is not None else None
        extra = {**(extra or {}), **fn.extra_of(units, known)}
    if extra and class_maps.CLASSES in extra and dataset is not None:
        # refused before any work, not at the publish (which checks again, for a race)
        class_maps.appended(dataset, extra[class_maps.CLASSES], f"{out}: append")
    if readers.is_reader(fn) and all(isinstance(u, (str, os.PathLike)) for u in units):
        units = _validate(cast(Any, fn).prepare(units)[0], None)  # paths to a reader: its units are what runs
    job = _work(options, fn, codecs=check_codecs(codecs), keyed_by_fn=not readers.is_reader(fn))
    return _run(job, units, out, options, workers=options.workers, quiet=quiet, mp_context=mp_context, extra=extra)


def _work(options: PileOptions, fn: Callable[[Any], Iterable[Mapping[str, Any]]], *, codecs: Codecs = DEFAULT, **changes: Any) -> UnitWork:
    """What each worker needs of ``options`` to run ``fn`` on units, with ``changes`` made."""
    job = UnitWork(
        fn=fn,
        piles=options.piles,
        seed=options.seed,
        max_pile_bytes=options.max_bytes,
        codecs=codecs,
        on_error=options.on_error,
        repeat=options.repeat,
    )
    return dataclasses.replace(job, **changes)


def _run(
    job: UnitWork,
    units: list[Any],
    out: str | os.PathLike[str],
    options: PileOptions,
    *,
    workers: int,
    quiet: bool,
    mp_context: str | None,
    extra: Mapping[str, Any] | None,
) -> Manifest:
    """Run ``job`` over ``units`` and publish the piles (the body of :func:`preprocess` and :func:`pile`)."""
    check_bool("quiet", quiet)
    storage.use([*(u for u in units if isinstance(u, (str, os.PathLike))), check_path("out", out)], options.storage_options)
    job = dataclasses.replace(job, storage=storage.remote.registered())
    if mp_context is not None and mp_context not in _START_METHODS:
        raise ConfigError(f"mp_context: expected one of {', '.join(map(repr, _START_METHODS))} or None, got {shown(mp_context)}")
    if (advice := too_many_piles(options.piles, check_path("out", out))) is not None:
        log.warning(advice)
    dataset = Dataset(out)
    if options.resume and options.mode == "create" and (done := resume.published(dataset.path, _fingerprint(job, units))):
        # stopped after its manifest went in: nothing is left to do but free what it held
        with dataset.transaction(mode="collect") as held:  # a dead job's lock and leftovers cleared; nothing is replaced
            resume.finish_published(held.path, len(units))
        return done
    with dataset.transaction(mode=options.mode, resume=options.resume, overwrite=options.overwrite) as txn:
        base = append.start(txn, options)  # None unless mode="append"
        if base is not None and extra and class_maps.CLASSES in extra:
            # again under the lock, before any staging: another append may have grown the map since
            # preprocess checked it, and a failure at the publish would leave this job's work in the way of its rerun
            class_maps.appended(base.manifest.extra, extra[class_maps.CLASSES], f"{txn.path}: append")
        if base is not None:  # its samples are routed by the generation, which the fingerprint then names
            job = dataclasses.replace(job, generation=base.generation)
        merge = {"compression": options.compression, "level": options.level}  # what finished piles a resume keeps were made with
        # an interrupted job leaves its committed parts for resume=True (the next job refuses them
        # without it); whatever happens, the transaction lets the staging and the output go
        stage = txn.hold(
            resume.open_staging(txn.path, _fingerprint(job, units), resume=options.resume, overwrite=options.overwrite, merge=merge)
        )
        try:
            result = run_pass1(txn, stage, job, units, options, workers=workers, mp_context=mp_context, quiet=quiet, extra=extra, base=base)
        except ShardkitError as e:
            if (full := resume.out_of_space(e)) is None:
                raise
            raise stage.full_disk(full) from e
    if (advice := sparse_piles(result, options.piles, txn.path)) is not None:
        log.warning(advice)
    return result


def _shard_samples(url: str, *, unit_prefix: bool, listed: Mapping[str, PileInfo] | None = None) -> Iterator[Mapping[str, Any]]:
    """The samples of one input shard, as :func:`pile` routes them; keys prefixed with the
    shard's stem when ``unit_prefix`` (the same bytes as the byte-range copy writes). A shard
    ``listed`` names (a dataset's own file) is checked against its manifest entry first."""
    prefix = canonical.unit_prefix(url) if unit_prefix else ""
    info = None if listed is None else listed.get(url)
    for sample in iter_shard(url) if info is None else Shard(url, file_checks.read_listed(url, info), unique=True):
        yield {**sample, "__key__": prefix + sample["__key__"]} if prefix else sample


def _fingerprint(job: UnitWork, units: Sequence[Any]) -> dict[str, Any]:
    """What a resumed job must share with the interrupted one (see :func:`~shardkit.piles.fingerprint.fingerprint`)."""
    codecs = {ext: fingerprint.describe_fn(fn) for ext, fn in sorted(job.codecs.encoders.items())}
    options = {
        "piles": job.piles,
        "seed": job.seed,
        "max_pile_bytes": job.max_pile_bytes,
        "shards": job.shards,
        "key_prefix": job.key_prefix,
        "encoders": hashlib.sha256(json.dumps(codecs, sort_keys=True).encode()).hexdigest()[:16],
        "repeat": None if job.repeat is None else fingerprint.describe_fn(job.repeat),
    }
    if job.generation:  # an append routes by the generation it writes: another one's parts are of no use
        options["generation"] = job.generation
    return fingerprint.fingerprint(units, job.fn, options)


@PILE
def pile(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    options: PileOptions | None = None,
    quiet: bool = False,
    mp_context: str | None = None,
    format: Any = None,
    **keywords: Any,
) -> Manifest:
    """Re-pile existing WebDataset tar shards: every sample of ``inputs`` into M random piles.

    ``inputs`` are paths, URLs, globs or brace patterns (``src-{000000..000019}.tar``); each
    shard is one input unit. Samples are copied without being decoded, field bytes unchanged.
    The piles are in shardkit's canonical form whatever wrote the inputs: byte-identical to
    re-encoding every sample with ``preprocess(urls, iter_shard, ...)``, i.e. plain
    ustar headers with fixed metadata and fields in sorted order (webdataset's pax headers
    and mtimes are dropped). Input already in that form, such as shardkit's own piles, is
    copied as whole byte ranges.

    Args:
        inputs: tar shard paths, URLs, globs or brace patterns, or inputs a reader takes (below).
        out: output directory, or an object-store URL, as in :func:`preprocess`.
        options: a :class:`~shardkit.PileOptions` instead of the keywords (not both: a keyword
            other than its default is then a ``ConfigError``). ``piles`` is required without it.
        quiet: no progress bar (it is also off when stderr is not a terminal).
        mp_context: multiprocessing start method, as in :func:`preprocess`.
        format: the inputs' reader, when they are not tar shards (below).

    Keys must be unique across the inputs, as in :func:`preprocess`: a shard that repeats a
    key (its members are not adjacent) is corrupt, and a key two shards share is refused
    (``SampleError``) when they land in one pile. Shards whose keys restart at ``000000`` (as
    most writers number them) work as they are: with ``key_prefix="auto"`` (default) the first
    key of every shard is read first, and when two shards start with one key every key is
    prefixed with its shard's file name without ``.tar``/``.tar.gz`` and a slash,
    ``train-000003/000017`` for sample ``000017`` of ``train-000003.tar`` (the headers are
    rebuilt), and ``manifest.extra["key_prefix"]`` says ``"unit"``; an append to a dataset that
    says so prefixes its keys too, even those of a single shard. ``"unit"`` always prefixes,
    ``"none"`` never does. Two inputs with the same file name in different directories still
    share a prefix.

    Inputs in other formats are read by a reader (:mod:`shardkit.piles.readers`), chosen by
    ``format`` (``"parquet"``, ``"arrow"``, ``"hf"``, ``"mds"``, ``"litdata"``, ``"csv"``, or a
    reader object such as ``Parquet(fields={"image": "jpg"})``) or, when it is None, by the
    inputs' suffixes and folders: ``.parquet``, ``.arrow``/``.feather``, ``.csv``/``.tsv``, a
    folder ``save_to_disk``, MDS or litdata wrote; a ``datasets.Dataset`` may be passed as it is.

    Raises:
        DatasetNotFoundError: an input is missing or a pattern matches nothing (before any work).
        CorruptShardError: an input shard is not a valid tar or repeats a key; the message
            names the unit first (with ``on_error="skip"`` the shard is skipped instead).
        SampleError: a sample shardkit cannot write (a key with an empty path component or a
            control character, a member without extension, a sample over ``max_pile_bytes``), or
            a key two inputs share.
    """
    options = PILE.options(options, keywords)
    found = readers.resolve(inputs, format)
    if found is not None:
        return _read(*found, out, options, quiet=quiet, mp_context=mp_context)
    storage.use(check_paths("inputs", inputs), options.storage_options)  # before the inputs are listed
    readers.refuse_datasets(check_paths("inputs", inputs))
    units = _validate(storage.expand(check_paths("inputs", inputs), once=True), None)
    readers.refuse_own_files(units, out)
    if format is None and options.on_error == "raise":  # named "shards": read as tar, whatever their names; else skipped as units
        for unit in units:
            if (why := readers.unknown_file(unit)) is not None:
                raise ConfigError(why)
    return pile_shards(units, out, options, quiet=quiet, mp_context=mp_context)


def refuse_key_prefix(options: PileOptions) -> None:
    """Refuse ``key_prefix="unit"`` for preprocess, which takes its keys from its function.

    Raises:
        ConfigError: naming the option.
    """
    if options.key_prefix == "unit":
        raise ConfigError(
            "key_prefix: preprocess takes sample keys from its function, so expected 'auto' or 'none' "
            f"(key_prefix is for pile and shuffle), got {options.key_prefix!r}"
        )


def pile_shards(
    units: list[str],
    out: str | os.PathLike[str],
    options: PileOptions,
    *,
    quiet: bool,
    mp_context: str | None = None,
    listed: Mapping[str, PileInfo] | None = None,
    kept: Mapping[str, Any] | None = None,
) -> Manifest:
    """:func:`pile` over the tar shards ``units`` (URLs, found and checked); ``kept``: records of
    the source's manifest its samples still answer to (a re-pile's class map). ``listed``: the
    manifest entries of units that are a dataset's own files, by URL (:func:`~shardkit.piles.repile.repile`):
    each is checked against its entry as it is read, and one that differs fails the job."""
    prefix = key_prefix_rule.resolve(options.key_prefix, units, recorded=(_recorded(out, options) or {}).get(key_prefix_rule.RECORD))
    options = dataclasses.replace(options, key_prefix=prefix)
    job = _work(options, iter_shard, shards=True, key_prefix=options.key_prefix, repeat=None, listed=listed or {})
    if options.repeat is not None:  # copies get keys of their own: samples are decoded, not copied as byte ranges
        fn = functools.partial(_shard_samples, unit_prefix=options.key_prefix == "unit")
        if listed:  # a dataset's own files are checked on this path too
            fn = functools.partial(fn, listed=listed)
        job = dataclasses.replace(job, fn=fn, shards=False, key_prefix="none", repeat=options.repeat)
    extra = {key_prefix_rule.RECORD: "unit"} if prefix == "unit" else None  # a reader can strip the shard's name again
    if kept:
        extra = {**kept, **(extra or {})}
    return _run(job, units, out, options, workers=options.workers, quiet=quiet, mp_context=mp_context, extra=extra)


def _recorded(out: str | os.PathLike[str], options: PileOptions) -> dict[str, Any] | None:
    """The ``extra`` of the dataset an append adds to; None for a new dataset, or when there is
    none to append to (the append itself says so)."""
    if options.mode != "append":
        return None
    url = check_path("out", out)
    storage.use(url, options.storage_options)
    try:
        return manifest.read(url).extra
    except DatasetNotFoundError:
        return None


def _read(
    reader: Any, sources: list[Any], out: str | os.PathLike[str], options: PileOptions, *, quiet: bool, mp_context: str | None
) -> Manifest:
    """:func:`pile` over inputs a reader turns into units (Parquet files, a Hugging Face dataset...)."""
    if options.key_prefix == "unit":
        raise ConfigError(
            f"key_prefix: a reader's keys already name the file they come from, so expected 'auto' or 'none', got {options.key_prefix!r}"
        )
    storage.use(sources, options.storage_options)  # before the inputs are listed
    units, extra = reader.prepare(sources)
    if not units:  # files or a dataset with no rows: say which, not that no inputs were given
        named = ", ".join(sources[:3]) + (f" and {len(sources) - 3} more" if len(sources) > 3 else "") if sources else "the dataset"
        raise ConfigError(f"inputs: {named}: no rows to pile ({type(reader).__name__} found no unit to read)")
    job = _work(options, reader)
    return _run(job, _validate(units, None), out, options, workers=options.workers, quiet=quiet, mp_context=mp_context, extra=extra or None)
