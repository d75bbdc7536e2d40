"""What dead jobs leave in a dataset directory, and the one path that finds, rolls back or removes it.

A job killed anywhere leaves things by name, never a half dataset: staging directories
(``.shardkit-pass1``, ``.shardkit-staging-*``), half-written temporaries (``*.partial-*``), the
install journal of an install it did not finish (``.shardkit-install-<token>.json``) and the files
that journal names, and on this machine the private staging of a remote output's job.
:func:`find` says what each of them is (verify reports it); :func:`clear_leftovers` and
:func:`undo_installs` remove them or finish the install (the next job's claim and gc do it);
:func:`clear_dead_staging` removes the local staging of remote jobs that died, and
:func:`remove_published` the staging of an append that died after it published (gc does it);
:func:`discard_staging` is how any staging directory goes.

    for item in find("data/train"):
        print(item.name, item.message)
"""

from __future__ import annotations

import json
import logging
import os
import stat
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from shardkit import manifest, storage
from shardkit.dataset import layout
from shardkit.dataset.owned import Deletion, Records, delete_owned, read_records
from shardkit.dataset.staging import check_staging, published_staging, staging_path
from shardkit.errors import ManifestError, ShardkitError
from shardkit.manifest import Manifest

STAGING_LOCK = layout.STAGING_LOCK

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Leftover:
    """A name a job that did not finish (or one still running) left in a dataset directory.

    ``kind``: ``"staging"`` (a pass 1's committed work, or the staging of an append already
    published), ``"journal"`` (an install journal or a file it names), or ``"temporary"``
    (anything else of a job's: another staging directory, a half-written file, the lock).
    """

    name: str
    kind: str
    message: str


_UNFINISHED = "left by a job that did not finish (or is still running); the next job writing here removes it"


def find(directory: str, names: Iterable[str] | None = None, generation: int | None = None) -> list[Leftover]:
    """The leftovers among ``names`` (default: the directory's listing), in their order, for a
    dataset now at ``generation`` (None: no dataset)."""
    names = list(storage.listdir(directory, missing_ok=True) if names is None else names)
    installing = journaled(directory, names)
    found = []
    for name in names:
        if name in (layout.STAGING, layout.REMOTE_STAGING):
            published = None if generation is None else published_staging(directory, generation)
            said = (
                "the committed parts of a pass 1 or append that did not finish: the same job run again with "
                "resume=True continues it; a job with overwrite=True discards it (an append's: delete this folder)"
                if published is None
                else f"the staging of the append of generation {published}, which stopped after it published: "
                "shardkit gc or the next append removes it"
            )
            found.append(Leftover(name, "staging", said))
        elif name in installing or layout.kind(name) == "journal":
            found.append(Leftover(name, "journal", _UNFINISHED))
        elif leftover(name) or name == layout.LOCK:
            found.append(Leftover(name, "temporary", _UNFINISHED))
    return found


def unlisted(directory: str, latest: Manifest, names: Iterable[str] | None = None) -> list[str]:
    """The names among ``names`` (default: the directory's listing) that neither the manifest
    ``latest`` nor a kept older generation's manifest lists (nor their key hashes), in their order."""
    names = list(storage.listdir(directory) if names is None else names)
    listed = {*latest.files(), manifest.MANIFEST}
    for name in names:
        if layout.GENERATION_FILE.fullmatch(name):
            url = storage.join(directory, name)
            try:
                files = manifest.parse(storage.read_bytes(url).decode("utf-8"), url).files()
            except (ManifestError, UnicodeDecodeError):
                continue  # not a manifest: its files are reported as what they are
            listed |= {name, *files, *(layout.keys_name(f) for f in files)}
    return [name for name in names if name not in listed]


def journaled(directory: str, names: Iterable[str]) -> set[str]:
    """The files the install journals among ``names`` say they move in: moved in by a job that
    died before its manifest (the next job writing here removes those the manifest does not list)."""
    found: set[str] = set()
    for doc in read_journals(directory, list(names)).values():
        try:
            found |= {n for n in doc.get("files", []) if isinstance(n, str)}
        except (AttributeError, TypeError):
            continue  # not a journal: the journal itself is reported as a leftover
    return found


def leftover(name: str) -> bool:
    """``name`` is of a kind a dead job leaves: a staging directory, a journal, a half-written file."""
    if name.startswith(layout.PREFIX) and name not in (layout.LOCK, layout.STAGING, layout.REMOTE_STAGING):
        return True
    return layout.kind(name) == "partial"


def clear_dead_staging(temp: str) -> None:
    """Remove the local staging directories of remote jobs that died: their lock is free (or,
    renamed for removal, they have none). Only real directories of this user that hold shardkit's
    owner record go (:func:`~shardkit.dataset.owned.delete_owned`); a pass-1 staging is its
    dataset's to remove (its record in the dataset says where it is)."""
    import fcntl

    try:
        names = [n for n in os.listdir(temp) if layout.kind(n) == "staging"]
    except OSError:
        return
    dead = []
    for name in names:
        path = os.path.join(temp, name)
        lock = STAGING_LOCK
        if name.startswith(layout.STAGING + "-") and "-removed-" not in name:
            # a pass 1's: its dataset's record names it, and it may hold work to resume; only one
            # whose job died before it wrote its job record is nobody's
            if os.path.lexists(os.path.join(path, layout.JOB)):
                continue
            lock = layout.STAGING_JOB_LOCK
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
            continue  # a link, a file, another user's: never touched
        if "-removed-" in name:
            dead.append(name)
            continue
        try:
            fd = os.open(os.path.join(path, lock), os.O_RDWR | storage.O_BINARY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue  # its job may be between creating it and locking it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live job's
        else:
            dead.append(name)
        finally:
            os.close(fd)
    if dead:
        delete_owned(temp, dead, reason="left by a job that did not finish", records=read_records(temp, []))


def clear_leftovers(out: str, *, dry_run: bool = False) -> Deletion:
    """Remove what dead jobs left: nobody else writes here while this job holds the lock. Returns
    what went (with ``dry_run``, what would go: nothing is removed)."""
    done = undo_installs(out, dry_run=dry_run)
    # journals are undo_installs' alone: one it kept names a file it could not remove yet, for the next job to retry
    names = [n for n in storage.listdir(out) if leftover(n) and layout.kind(n) in ("staging", "partial") and n not in done.deleted]
    if names:
        done.add(delete_owned(out, names, reason="left by a job that did not finish", dry_run=dry_run))
    return done


def read_journals(out: str, names: list[str] | None = None) -> dict[str, Any]:
    """The install journals in ``out`` (among ``names``, its listing, when given), by name, each
    as it reads (None: unreadable)."""
    found: dict[str, Any] = {}
    for name in storage.listdir(out, missing_ok=True) if names is None else names:
        if layout.kind(name) == "journal":
            try:
                found[name] = json.loads(storage.read_bytes(storage.join(out, name)))
            except (ShardkitError, ValueError):
                found[name] = None
    return found


def live(doc: Any, version: str | None) -> bool:
    """A journal (``doc``) of a job that may still publish: it began from the manifest version
    now in place (``version``). Any other job's commit would be refused, so it can only fail."""
    return isinstance(doc, dict) and "base" in doc and doc["base"] == version


def journal_names(doc: Any) -> list[str]:
    """The file names a journal lists: those its install moves in and those it deletes."""
    try:
        return [n for n in (*doc.get("files", []), *doc.get("delete", [])) if isinstance(n, str)]
    except (AttributeError, TypeError):
        return []


def undo_installs(out: str, *, conditional: bool = False, dry_run: bool = False) -> Deletion:
    """Finish or undo the install of a job that died in it: of the files its journal lists (those
    it moved in, those it was to delete), remove every one the manifest in place and its kept
    older generations do not account for (:meth:`~shardkit.dataset.owned.Records.kept`), then
    the journal (kept when a file of it could not be removed, for the next job to retry).

    With conditional writes (no lock), only the journals of jobs that can no longer publish
    (:func:`live`): the journals are read before the manifest's version is asked, so a journal
    from another version is from one replaced before.

    Returns what went (with ``dry_run``, what would go: nothing is removed)."""
    undone = Deletion()
    names = storage.listdir(out, missing_ok=True)
    journals = [n for n in names if layout.kind(n) == "journal"]
    if conditional and journals:
        docs = read_journals(out, journals)
        version = storage.version(storage.join(out, manifest.MANIFEST))
        # one that vanished since the listing was its job's to remove (it lost, or published)
        journals = [n for n in journals if docs[n] is not None and not live(docs[n], version)]
    if not journals:
        return undone
    records = read_records(out, names)
    if layout.MANIFEST in names and records.latest is None:
        return undone  # no sound manifest to tell ours from theirs: leave everything for the user
    # what the dataset in place still has: an overwrite undone keeps its older generations whole
    listed = records.kept()
    for journal in journals:
        doc = records.journals.get(journal)
        stale = sorted({*doc["files"], *doc["delete"]} - listed - set(undone.deleted)) if doc is not None else []
        done = delete_owned(out, stale, reason="left by a job that died while publishing", records=records, dry_run=dry_run)
        undone.add(done)
        if not done.skipped or all(why.startswith("not a name") for _, why in done.skipped):
            undone.add(delete_owned(out, [journal], reason="its install is undone", records=records, dry_run=dry_run))
    return undone


def discard_staging(path: str, out: str = "") -> None:
    """Remove a staging directory: renamed first, so a kill in the middle leaves a leftover by its
    name (the next job writing here removes it), never a half-removed staging that looks like an
    interrupted job. Its records go last, and no link is followed (see
    :func:`shardkit.dataset.owned.delete_owned`)."""
    if not check_staging(path):
        return
    trash = f"{path}-removed-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    except OSError:
        trash = path  # a filesystem that will not rename it: removed where it is
    delete_owned(os.path.dirname(trash), [os.path.basename(trash)], reason="the staging of a finished pass 1", records=Records())
    if out and storage.store_for(out).local_file() is None:  # its record in the output goes once the directory is gone
        delete_owned(out, [layout.REMOTE_STAGING], reason="its staging is removed", records=Records())


def remove_published(out: str, generation: int, *, dry_run: bool = False) -> bool:
    """Remove the staging of an append ``out`` already has (see
    :func:`~shardkit.dataset.staging.published_staging`), unless a job holds it now; whether it
    was removed (with ``dry_run``, whether it would be). The caller holds the output's claim, so
    no job takes the staging while it goes: gc's ``collect`` transaction, or pass 1's."""
    path = staging_path(out)
    if path is None or published_staging(out, generation) is None:
        return False
    if dry_run:
        return True
    fd = storage.lock_file(os.path.join(path, layout.STAGING_JOB_LOCK), wait=False)
    if fd is None:
        return False  # a job took it: it clears the staging itself
    try:
        if published_staging(out, generation) is None:
            return False
        log.info("%s: removing %s, the staging of an append already published", out, path)
        discard_staging(path, out)  # the lock file too: lock_file() copes with that
    finally:
        os.close(fd)
    return True
