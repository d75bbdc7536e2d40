"""A dataset as one object: its manifests and generations, its leftovers, and the transaction every writer runs in.

Every job that changes a dataset directory runs one :class:`Transaction`, from
:meth:`Dataset.transaction`: it takes the output's lock (clearing what dead jobs left),
reads the generation it starts from, opens staging directories, holds a pass 1's resumable
staging (and so knows its done units), and in :meth:`Transaction.commit` keeps the replaced
generation's manifest, journals and installs the new files and puts the manifest in last; on
the way out it lets everything go, whether the job published, failed or was stopped. The front
doors (``PileWriter``, ``preprocess``, ``pile``, ``repile``, an append, the eager shuffle) and gc
differ only in what they write between the two.

    with Dataset("data/train").transaction(mode="append") as txn:
        staging = txn.staging()                 # removed when the transaction ends
        ...                                     # write the new files into it
        txn.commit(files, result, keep=True)    # journal, install, manifest last
"""

from __future__ import annotations

import datetime
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from shardkit import manifest, storage
from shardkit._util import check_path, parse_duration
from shardkit.dataset import index_file, layout, leftovers
from shardkit.dataset.install import install
from shardkit.dataset.lock import STAGING_PREFIX, Output, claim, remove_staging
from shardkit.errors import ConfigError, DatasetNotFoundError, ManifestError, ShardkitError
from shardkit.manifest import Manifest

# create: a new dataset (or, with overwrite, one replacing the old); append: the next generation
# of the dataset there; collect: nothing is published (gc, or clearing a finished job's leftovers)
MODES = ("create", "append", "collect")

log = logging.getLogger(__name__)


class Stage(Protocol):
    """A resumable staging a transaction holds (pass 1's: :class:`shardkit.piles.resume.Staging`)."""

    def done(self) -> set[int]: ...

    def release(self) -> None: ...


S = TypeVar("S", bound=Stage)


class Dataset:
    """A dataset directory (a local path or an object-store URL) and its life.

    Args:
        path: the directory; nothing is made or read until a method asks.

    Example::

        ds = Dataset("data/train")
        ds.manifest().generation, [item.name for item in ds.leftovers()]
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = check_path("out", path)

    def manifest(self) -> Manifest:
        """The current generation's manifest.

        Raises:
            DatasetNotFoundError: no dataset there.
        """
        return manifest.read(self.path)

    def pinned(self, generation: int) -> Manifest:
        """The manifest of ``generation``: the current one, or the copy kept when an append
        replaced it (``shardkit.gNNNNNN.json``), which gc keeps while loaders may read it. Every
        reader that pins a generation (a resumed loader, a pickled random-access dataset) reads
        it here.

        Raises:
            DatasetNotFoundError: the dataset has no such generation (collected, or never written).
            ManifestError: the copy is not a valid manifest, or holds another generation.
        """
        current = self.manifest()
        if generation == current.generation:
            return current
        name = layout.generation_name(generation)
        url = storage.join(self.path, name)
        try:
            text = storage.read_bytes(url).decode("utf-8")
        except DatasetNotFoundError:
            raise DatasetNotFoundError(
                f"{self.path}: generation {generation} is gone: it is not kept (no {name}; the dataset is at generation "
                f"{current.generation}, and shardkit gc removes the files of generations no manifest needs)"
            ) from None
        except UnicodeDecodeError:
            raise ManifestError(f"{url}: not UTF-8 text") from None
        found = manifest.parse(text, url)
        if found.generation != generation:
            raise ManifestError(f"{url}: holds generation {found.generation}, expected {generation}")
        return found

    def kept_problems(self, current: Manifest) -> list[tuple[str, str]]:
        """``(name, what is wrong)`` for each kept manifest of a generation older than
        ``current``'s that a loader pinned to it could not read (not a valid manifest, or another
        generation's): a resumed state of that generation would fail on it."""
        found = []
        for name in storage.listdir(self.path):
            kept = layout.GENERATION_FILE.fullmatch(name)
            if kept is None or int(kept.group(1)) >= current.generation:
                continue
            try:
                self.pinned(int(kept.group(1)))
            except DatasetNotFoundError:  # removed since it was listed (gc): none, as one never there
                continue
            except ShardkitError as e:
                found.append((name, str(e).removeprefix(f"{storage.join(self.path, name)}: ")))
        return found

    def leftovers(self) -> list[leftovers.Leftover]:
        """What jobs that did not finish (or are still running) left here, as verify reports it:
        names no kept manifest lists that a job's staging, journal or temporary has.

        Raises:
            ManifestError: the manifest there does not read.
        """
        if not manifest.is_dataset(self.path):
            return leftovers.find(self.path)
        latest = self.manifest()
        return leftovers.find(self.path, leftovers.unlisted(self.path, latest), latest.generation)

    def transaction(
        self,
        *,
        mode: str = "create",
        resume: bool = False,
        overwrite: bool = False,
        files: re.Pattern[str] = layout.PILE_FILE,
        dry_run: bool = False,
    ) -> Transaction:
        """A transaction on this dataset, begun when its ``with`` block is entered (see :class:`Transaction`).

        Args:
            mode: ``"create"``, ``"append"`` or ``"collect"`` (:data:`MODES`).
            resume: the job takes up a pass 1's committed work (see :mod:`shardkit.piles.resume`).
            overwrite: a ``"create"`` may replace a dataset, or files named like ``files``.
            files: the names of the files the job writes (piles, or an eager shuffle's shards).
            dry_run: (``"collect"`` only) leave dead jobs' leftovers in place; the output's
                ``cleared`` says what would have gone (``gc --dry-run``).
        """
        if mode not in MODES:
            raise ConfigError(f"mode: expected one of {', '.join(map(repr, MODES))}, got {mode!r}")
        if dry_run and mode != "collect":
            raise ConfigError(f"dry_run: only a 'collect' transaction can leave leftovers in place, not {mode!r}")
        return Transaction(self, mode=mode, resume=resume, overwrite=overwrite, files=files, dry_run=dry_run)


class Transaction:
    """One job's hold on a dataset, from its lock to its release.

    Attributes:
        base: the manifest an append adds to (None for ``"create"`` and ``"collect"``).
        generation: the generation the job writes: the base's next for an append, else 0.
        result: the manifest :meth:`commit` put in (None until then).
    """

    def __init__(
        self, dataset: Dataset, *, mode: str, resume: bool, overwrite: bool, files: re.Pattern[str], dry_run: bool = False
    ) -> None:
        self.dataset, self.mode, self.resume, self.overwrite, self.files = dataset, mode, resume, overwrite, files
        self.dry_run = dry_run
        self.output: Output | None = None
        self.base: Manifest | None = None
        self.generation = 0
        self.result: Manifest | None = None
        self._staging: list[str] = []
        self._held: list[Stage] = []

    # -- begin and end ---------------------------------------------------------------------------

    def open(self) -> Transaction:
        """Take the lock (clearing dead jobs' leftovers) and read the generation the job starts from.

        Raises:
            DatasetExistsError: another job holds the lock, or (``"create"`` without ``overwrite``)
                a dataset or files named like the job's are there.
            DatasetNotFoundError: an append with no dataset to add to.
        """
        if self.mode == "append":
            store = storage.store_for(self.dataset.path)
            local = store.local_file()
            if local is not None and not store.exists(""):
                # fail before the lock makes the directory: a failed job leaves nothing that was not there
                raise DatasetNotFoundError(_nothing_to_append(local))
        overwrite = self.overwrite or self.mode != "create"
        self.output = claim(self.dataset.path, overwrite=overwrite, resume=self.resume, files=self.files, dry_run=self.dry_run)
        try:
            if self.mode == "append":
                self._read_base()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Let everything go: the held stagings (kept when they hold committed work), the staging
        directories, the lock. Idempotent."""
        held, self._held = self._held, []
        staging, self._staging = self._staging, []
        try:
            for stage in held:
                stage.release()
            for path in staging:
                remove_staging(path)
        finally:
            if self.output is not None:
                self.output.release()

    def __enter__(self) -> Transaction:
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- what the job uses -----------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The dataset's directory, as the lock names it (a local path for a ``file://`` URL)."""
        return self.dataset.path if self.output is None else self.output.path

    @property
    def remote(self) -> bool:
        """The dataset is in an object store: files go in by upload, not by rename."""
        return self._claim().remote

    def staging(self, prefix: str = STAGING_PREFIX) -> str:
        """A fresh, private staging directory for the job's files, removed when the transaction ends."""
        path = self._claim().staging(prefix)
        self._staging.append(path)
        return path

    def hold(self, stage: S) -> S:
        """Hold a pass 1's resumable staging (returned as given) until the transaction ends."""
        self._held.append(stage)
        return stage

    @property
    def done(self) -> set[int]:
        """The input units the held stagings' commits name: a resumed job does not run them again."""
        return {unit for stage in self._held for unit in stage.done()}

    def advance(self, window: int | str | None) -> tuple[dict[int, str], set[int]]:
        """The generation an append writes, stamped now, beside those of its base: when each was
        written, and those ``window`` keeps (the last K generations that hold samples, or those of
        the last ``"90d"``; all when None; the new one always). A dataset pass 1 wrote has its
        manifest's time. A generation that holds no sample (an append whose inputs were all skipped)
        does not count among the K: it would push out one that does.
        """
        if self.base is None:
            raise ConfigError(f"{self.path}: only an append transaction advances the generation")
        times = dict(self.base.generations)
        if 0 not in times and self.base.generation == 0:
            when = self._claim().store.modified(manifest.MANIFEST)
            times[0] = when.isoformat(timespec="seconds") if when else _now()
        times[self.generation] = _now()
        if window is None:
            return times, set(times)
        if isinstance(window, int):
            holding = self.base.held_generations(with_samples=True)
            return times, {self.generation, *sorted(holding | {self.generation}, reverse=True)[:window]}
        cutoff = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=parse_duration(window, what="window"))
        return times, {g for g, t in times.items() if g == self.generation or datetime.datetime.fromisoformat(t) >= cutoff}

    def commit(
        self, files: Sequence[str], result: Manifest, *, names: Sequence[str] | None = None, keep: bool = False, index: bool = False
    ) -> Manifest:
        """Publish ``result``: an append first keeps the manifest it replaces (loaders pinned to it
        read on), then :func:`~shardkit.dataset.install.install` journals the names, moves
        ``files`` in (as ``names``, default the piles' names) and puts the manifest in last;
        ``keep`` leaves the old files (an append's manifest still lists them). With ``index``
        the random-access index of the published manifest is written next, from ``files`` (see
        :func:`write_index`). Returns the manifest published.

        Raises:
            DatasetExistsError: another job published here while this one ran; nothing of it stays.
        """
        output = self._claim()
        if self.mode == "collect":
            raise ConfigError(f"{output.path}: a collect transaction publishes nothing")
        if self.base is not None:
            self._keep_base(output)
        self.result = install(output, files, result, names=names, keep=keep)
        if index:
            published = [p.name for p in self.result.piles] if names is None else list(names)  # install keeps the order
            self.write_index(dict(zip(published, files, strict=True)))
        return self.result

    def write_index(self, staged: Mapping[str, str]) -> None:
        """Write the random-access index (``shardkit.gNNNNNN.idx``) of the manifest just
        published, from ``staged`` (file name -> local staged copy), so that a loader starts
        its first pile by ranges and ``shardkit.open`` reads no pile to build it. The dataset
        is published already: an index that cannot be made is logged, and built when first
        needed. An append takes the entries of the files it kept from its base generation's
        index; none is written when that has none (its old files are not read again)."""
        output, result = self._claim(), self.result
        assert result is not None
        # where the file system has no links, the staged copy was renamed in
        staged = {name: path if storage.exists(path) else storage.join(output.path, name) for name, path in staged.items()}
        try:
            if not index_file.write_staged(output.path, result, staged, self.base):
                log.info("%s: no index written: generation %d keeps files of one that has none", output.path, result.generation)
        except ShardkitError as e:
            log.warning("%s: the dataset is published, but its index was not written (%s); it is built when first needed", output.path, e)

    # -- inside ----------------------------------------------------------------------------------

    def _claim(self) -> Output:
        if self.output is None or self.output.released:
            raise RuntimeError("the transaction is not open: use it inside its with block")
        return self.output

    def _read_base(self) -> None:
        output = self._claim()
        if output.manifest_seen is None:
            raise DatasetNotFoundError(_nothing_to_append(output.path))
        self.base = manifest.parse(output.manifest_seen.decode("utf-8"), storage.join(output.path, manifest.MANIFEST))
        self.generation = self.base.generation + 1

    def _keep_base(self, output: Output) -> None:
        """Keep the replaced generation's manifest, as it was read, for loaders pinned to it.

        Under the lock, a copy already there is kept when it holds the same bytes (a rerun
        writes exactly these). Other bytes are an older dataset's, left by an overwrite made
        before overwrites removed every generation: they are replaced, or a loader pinned to
        this generation would read that other dataset. In an object store (no lock) a copy there
        is always kept: racing appends from one generation write the same bytes, and one that
        differs may be the copy of the dataset that replaced this append's base meanwhile."""
        assert self.base is not None and output.manifest_seen is not None
        copy = storage.join(output.path, layout.generation_name(self.base.generation))
        if output.conditional:
            storage.put_if_absent(copy, output.manifest_seen)
            return
        try:
            there: bytes | None = storage.read_bytes(copy)
        except DatasetNotFoundError:
            there = None
        if there == output.manifest_seen:
            return
        if there is not None:
            log.warning("%s: replacing a copy of generation %d that is another dataset's manifest", copy, self.base.generation)
        storage.write_bytes(copy, output.manifest_seen)


def _nothing_to_append(path: str) -> str:
    return f"{path}: no shardkit dataset to append to (no {manifest.MANIFEST}); write it first (mode='create', the default)"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
