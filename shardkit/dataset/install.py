"""Install a finished dataset: journal the names, link or upload the files, put the manifest in last, delete the old files.

:func:`install` is the one place a dataset is published, for pass 1, an append, the eager
shuffle and repile. Its journal (``.shardkit-install-<token>.json``, written through
:meth:`~shardkit.dataset.lock.Output.journal`) names what it moves in and what it will delete
before it does either, so that whoever finds it after a kill rolls the install back or forward
(:mod:`shardkit.dataset.leftovers`).

    names = free_names(output.path, [p.name for p in result.piles])   # never an old file's name
    install(output, staged_files, result)                             # manifest last
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import re
import threading
from collections.abc import Sequence

from shardkit import manifest, storage
from shardkit.dataset import layout
from shardkit.dataset.layout import journal_name
from shardkit.dataset.lock import Output
from shardkit.dataset.owned import Records, delete_owned, read_records
from shardkit.errors import DatasetExistsError, ShardkitError, StorageError
from shardkit.manifest import Manifest

log = logging.getLogger(__name__)

# piles uploaded at once to an object store: each holds one request's worth of memory
# (storage.remote.UPLOAD_CHUNK) and a connection
UPLOADS = 8


def _old_manifest(out: str) -> Manifest | None:
    """The manifest of the dataset ``out`` holds now (None when there is none, or none that checks):
    its files are all a new one deletes.

    Raises:
        StorageError: it could not be read (the store did not answer): nothing may be replaced yet.
    """
    if not manifest.is_dataset(out):
        return None
    try:
        return manifest.read(out)
    except StorageError as e:  # no answer yet (unreachable, throttled): replaced now, the old files would be named by no record
        raise StorageError(f"{e}; the old dataset's manifest names the files to replace, so nothing was replaced: run the job again") from e
    except ShardkitError as e:
        log.warning("%s: the old manifest is unreadable, its files are left in place: %s", out, e)
        return None


def _replaced(out: str) -> tuple[Records, list[str]]:
    """The records of the dataset ``out`` holds now (no manifest when there is none, or none that
    checks) and every name of it a new dataset deletes: the files its manifest and its kept older
    generations list with their key hashes, then those kept manifests and the indexes. Left
    behind, they would be taken for a user's files, and a kept manifest for one of the new
    dataset's own generations once it grows that far."""
    previous = _old_manifest(out)
    if previous is None:
        return Records(), []
    names = storage.listdir(out, missing_ok=True)
    found = read_records(out, names)
    if found.latest is None:  # read a moment ago: it checked then
        found.add(previous)
    found.latest = previous
    kept = found.kept()
    files = set(previous.files()) | {n for n in names if n in kept and layout.kind(n) == "data"}
    records = {n for n in names if n in kept and layout.kind(n) != "data"}
    records |= {n for n in names if (m := layout.INDEX_FILE.fullmatch(n)) and int(m.group(1)) <= previous.generation}
    # the manifests go after their files: a kill in between leaves them named by the journal
    return found, sorted(files) + sorted(records)


def free_names(out: str, names: Sequence[str]) -> list[str]:
    """Names for new files in ``out`` that no file there has: each of ``names`` as it is, else
    ``STEM.vN.tar`` (``STEM.vN.tar.zst``) with the smallest free N. An overwrite's files then
    never replace the old dataset's before its manifest is replaced."""
    taken = set(storage.listdir(out, missing_ok=True))
    chosen = []
    for name in names:
        if name in taken:
            name = _next_free(name, taken)
        taken.add(name)
        chosen.append(name)
    return chosen


def free_set(out: str, names: Sequence[str]) -> list[str]:
    """Names for new files in ``out`` that no file there has, with one version for all: ``names``
    as they are when all are free, else each as ``STEM.vN.tar`` with the smallest N free for every
    one. A set read by a brace pattern (an eager shuffle's shards) then keeps one pattern after an
    overwrite, which :func:`free_names`' name-by-name choice would break (``shard-000000.v1.tar``
    beside ``shard-000001.tar``)."""
    taken = set(storage.listdir(out, missing_ok=True))
    version = 0
    while not taken.isdisjoint(chosen := [_versioned(name, version) for name in names]):
        version += 1
    return chosen


def _next_free(name: str, taken: set[str]) -> str:
    """``STEM.vN.SUFFIX`` for ``name`` (``STEM.SUFFIX`` or ``STEM.vK.SUFFIX``), the smallest N none of ``taken`` has."""
    version = 1
    while _versioned(name, version) in taken:
        version += 1
    return _versioned(name, version)


def _versioned(name: str, version: int) -> str:
    """``STEM.vN.SUFFIX`` for ``name`` (``STEM.SUFFIX`` or ``STEM.vK.SUFFIX``); ``STEM.SUFFIX`` for version 0."""
    if version == 0:
        return name
    at = name.rfind(".tar")
    stem, suffix = (name[:at], name[at + 1 :]) if at > 0 else name.rsplit(".", 1)
    stem = re.sub(r"\.v\d+$", "", stem)
    return f"{stem}.v{version}.{suffix}"


def _link_new(output: Output, src: str, name: str) -> None:
    """Give the staged file ``src`` the name ``name`` in the output, which must not exist: a link
    refuses to replace a file. ``src`` keeps its name until the caller removes its staging, after
    the manifest: a job killed while it installs still has every finished pile to resume from
    (the next job removes the names it gave, which its journal lists), and no byte is copied.
    Where the file system has no links it is moved in: names were chosen free under the lock."""
    if not output.store.link_in(name, src, exclusive=True):
        raise DatasetExistsError(f"{storage.join(output.path, name)}: appeared while this job was publishing; nothing was replaced")


def remove_strays(out: str, stray: re.Pattern[str]) -> None:
    """Remove the files ``stray`` matches that the dataset in ``out`` (if any) does not list and
    a record of it names (a kept generation, a journal): files of this kind nobody can be
    reading. A file no record names is not shardkit's, and stays."""
    names = storage.listdir(out, missing_ok=True)
    records = read_records(out, names)
    listed = set(records.latest.files()) if records.latest is not None else set()
    strays = sorted(n for n in names if stray.fullmatch(n) and n not in listed and n in records.named)
    if strays:
        delete_owned(out, strays, reason="no manifest lists it", records=records)


def install(output: Output, files: Sequence[str], result: Manifest, *, names: Sequence[str] | None = None, keep: bool = False) -> Manifest:
    """Swap a finished dataset in: ``files[i]`` (staged elsewhere) becomes ``result.piles[i]``
    (a second name: the staged one stays until the caller removes its staging), then the
    manifest goes in, last. The one place a dataset is published, for pass 1, the eager
    shuffle and repile. Returns the manifest published.

    An overwrite is atomic: the new files' names (see :func:`free_names`) are none the directory
    has, so the old dataset stays whole and readable until the manifest, renamed over the old one,
    says otherwise; then the old dataset's own files are removed, those of the older generations
    it kept too, their manifests and indexes last. Data and directory are made durable before the
    manifest is renamed, and the names about to move in and to go are noted first
    (:meth:`Output.journal`) so that the next job removes the new ones if this one dies before its
    manifest is in, and the old ones if it dies after. A kill at any moment leaves the old dataset
    (with the generations it kept) or the new one whole. Into an object store the files are uploaded, several at
    once, and the manifest is one request, made after every upload succeeded; with conditional
    writes each object is created only where none is (a pile whose name another job took first
    takes the next free ``.vN`` name), and the manifest is committed by :meth:`Output.commit`.

    ``names`` (default: the piles' names) are the names ``files`` take; ``keep`` leaves the old
    dataset's files in place (an append's new manifest still lists them).

    Raises:
        DatasetExistsError: another job published here while this one ran; nothing of this job's
            stays.
        StorageError: the old dataset's manifest could not be read (the store did not answer);
            nothing was installed.
    """
    out = output.path
    replaced, old = (Records(), []) if keep else _replaced(out)
    # in an object store (no lock) an append to the new dataset may write its own kept manifest or
    # index under one of these names between this commit and the deletes: those go only unchanged
    seen = {n: storage.version(storage.join(out, n)) for n in old if layout.kind(n) != "data"} if output.conditional else {}
    renamable = names is None
    names = [pile.name for pile in result.piles] if names is None else list(names)
    output.journal(names, old)
    # what the old dataset's manifests name (read_records took them as shardkit's), and this job's journal
    records = dataclasses.replace(
        replaced, named=replaced.named | set(names) | set(old), journals={journal_name(output.token): {"files": names, "delete": old}}
    )
    moved: list[str] = []
    try:
        if output.remote:
            final = _upload_all(output, files, names, moved, renamable=renamable)
            if final != names:
                renamed = dict(zip(names, final, strict=True))
                result = dataclasses.replace(result, piles=tuple(dataclasses.replace(p, name=renamed[p.name]) for p in result.piles))
                names = final
        else:
            for path, name in zip(files, names, strict=True):
                _link_new(output, path, name)
                moved.append(name)
            storage.fsync_dir(out)
        output.commit(result)
    except BaseException as e:
        # the old dataset (or none) stays as it was
        records.named |= set(moved)  # a pile renamed on upload is in the journal too
        done = delete_owned(out, moved, reason="this job's install failed: the old dataset stays", records=records)
        if isinstance(e, DatasetExistsError) and output.conditional and not done.skipped:
            with contextlib.suppress(ShardkitError, OSError):
                output.journal(None)  # what it named is gone: this job lost the race
        raise
    changed = {n for n, version in seen.items() if storage.version(storage.join(out, n)) != version}
    if changed:
        log.info("%s: kept, rewritten since the overwrite began (a later append's own): %s", out, ", ".join(sorted(changed)))
    gone = delete_owned(out, [n for n in old if n not in moved and n not in changed], reason="replaced by the new dataset", records=records)
    # the manifest is in: the job has published, so a failure to tidy up must not say it failed
    # (its user would run it again); what is left is the next job's to remove
    try:
        if not gone.skipped:
            output.journal(None)  # else kept: the next job writing here retries what is left
        output.tidy()
    except ShardkitError as e:
        log.warning(
            "%s: the dataset is published, but its leftovers were not all removed (%s); the next job writing here removes them", out, e
        )
    return result


def _upload_all(output: Output, files: Sequence[str], names: Sequence[str], moved: list[str], *, renamable: bool) -> list[str]:
    """Upload ``files[i]`` to ``names[i]`` in the output, :data:`UPLOADS` at a time; ``moved`` gets
    each name as its object is in. Returns the names taken. The local copies stay until the job
    removes its staging (after the manifest): a job stopped during the uploads resumes from its
    finished piles, uploading them again, and the disk held no more at its peak (every pile is
    made before the first upload).

    With conditional writes an object is only created, never replaced: a name another job took
    first becomes the next free ``.vN`` one when ``renamable`` (noted in the journal before the
    upload), else the job has lost the race.
    """
    out = output.path
    lock = threading.Lock()
    final = list(names)
    taken = set(names)

    def send(i: int) -> None:
        name = final[i]
        # an append's names carry its token: an object found there holding its bytes is its own upload
        while output.conditional and not storage.upload_if_absent(files[i], storage.join(out, name), name_is_mine=not renamable):
            if not renamable:
                raise DatasetExistsError(
                    f"{storage.join(out, name)}: another job wrote this object while this one was publishing; "
                    "nothing of this job was published"
                )
            with lock:
                name = _next_free(name, taken)
                taken.add(name)
                output.journal_more(name)
            log.info("%s: %s was taken by another job, uploading as %s", out, final[i], name)
        if not output.conditional:
            storage.upload(files[i], storage.join(out, name))
        with lock:
            final[i] = name
            moved.append(name)

    # unlike the merge, an upload under way is waited for when another fails or Ctrl-C comes: the
    # caller then removes every object this job sent, and none lands after that as a stray
    with concurrent.futures.ThreadPoolExecutor(UPLOADS, thread_name_prefix="shardkit-upload") as pool:
        futures = [pool.submit(send, i) for i in range(len(files))]
        try:
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            concurrent.futures.wait(futures)
            raise
    return final
