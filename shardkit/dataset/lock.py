"""Claim an output directory for one job: lock it, clear a dead job's leftovers, check it, let it go.

One writer per dataset. A job holds a kernel lock (``flock``) on ``OUT/.shardkit-lock`` for as
long as it writes, and writes into the file who it is: process id, host, start time and command.
A second job on the same output fails at once with a :class:`DatasetExistsError` naming the
first. The kernel drops the lock when its holder dies, however it dies, so a dead job's lock is
never in the way: the next job takes it and removes what the dead one left (staging
directories, half-written temporaries, and the files of an install it did not finish, which its
journal lists), which nothing else can be writing while the lock is held. On a network file
system the lock is as good as the file system's locking (NFSv4 locks work). A job that created
the output directory and publishes nothing removes it again when it lets go, only while it is
empty (:func:`~shardkit.dataset.owned.remove_made`): a failed job leaves no folder that looks
like an output, and never touches a directory that was there, or what anyone else put in one, or
a pass 1's staging kept for a resume. Parents it made stay: another job may be making its own
folder in one.

An object-store output (``s3://bucket/prefix``) has no lock: object stores offer none that a
dead job gives back. There the store itself picks the one writer: a job commits its manifest
with a conditional write (:meth:`Output.commit`: ``If-Match`` the version of ``shardkit.json``
it began from, ``If-None-Match: *`` when there was none), so of two racing jobs exactly one
publishes and the other fails with :class:`DatasetExistsError`, removing only what it uploaded.
Its journal names the version it began from: once another job has committed, a journal from an
older version belongs to a job that can never publish, and its uploads are leftovers; a journal
from the current version may be a live job's, and what it names is left alone. A store without
conditional writes (see :func:`shardkit.storage.can_put_if_absent`) is written by one job at a
time, which is the user's to keep: the manifest is checked unchanged just before it is replaced.
The staging directory is local (in the system's temporary directory, ``TMPDIR``).

    output = claim("data/train", overwrite=False)
    try:
        ...                                  # write into output.staging()
        output.commit(manifest)              # the manifest goes in, if nobody else's did first
    finally:
        output.release()
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from shardkit import manifest, redact, storage
from shardkit._util import check_path
from shardkit.dataset import layout
from shardkit.dataset.leftovers import clear_dead_staging, clear_leftovers, journal_names, read_journals, undo_installs
from shardkit.dataset.owned import Deletion, Records, delete_owned, remove_made
from shardkit.dataset.staging import make_staging, recorded, recorded_place, write_owner
from shardkit.errors import ConfigError, DatasetExistsError, DatasetNotFoundError, ShardkitError

log = logging.getLogger(__name__)

LOCK = layout.LOCK
STAGING_LOCK = layout.STAGING_LOCK
STAGING_PREFIX = layout.STAGING_PREFIX
# seconds a job waits for a held lock before it says another job is writing
_LOCK_GRACE = 2.0
PILE_FILE = layout.PILE_FILE


@dataclass
class Output:
    """An output directory this job holds the lock of.

    Attributes:
        path: the directory.
        manifest_seen: the manifest's bytes when the job began (None: there was none).
    """

    path: str
    token: str
    manifest_seen: bytes | None
    # what the job holds while it lives: the output's lock (Store.lock), its local stagings' locks
    held: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    released: bool = field(default=False)
    # an object store with conditional writes: the manifest's version (ETag) when the job began
    conditional: bool = False
    manifest_version: str | None = None
    # what the journal says now (see journal())
    journaled: dict[str, Any] | None = None
    # the local output directory when this job created it: removed again on release while
    # empty, unless the job published (see release())
    made: str | None = None
    # what the claim removed of dead jobs' leftovers in the output (with dry_run: would remove)
    cleared: Deletion = field(default_factory=Deletion)

    @property
    def store(self) -> storage.Store:
        """The store the output's files are in."""
        return storage.store_for(self.path)

    @property
    def remote(self) -> bool:
        """The output's files are not local files (an object store, memory): files go in by
        upload, not by a second name, and the staging is in the local temporary directory."""
        return self.store.local_file() is None

    def staging(self, prefix: str = STAGING_PREFIX) -> str:
        """A fresh staging directory's path: inside a local output (not created), so its files are
        renamed into place. For a remote one it is in the system's temporary directory, created
        and locked while this job lives, so a later job removes it if this one is killed."""
        record = {"dataset": self.path, "token": self.token}
        if not self.remote:
            path = os.path.join(self.path, f"{prefix}{uuid.uuid4().hex}")
            make_staging(path, record)
            return path
        with storage.guard(tempfile.gettempdir(), "create the staging directory"):
            path = tempfile.mkdtemp(prefix=prefix)  # private (0700), a name nobody can plant a link at beforehand
        write_owner(path, record)
        self.held.enter_context(storage.store_for(path).lock(STAGING_LOCK))  # a new file: taken at once
        return path

    def check_unchanged(self) -> None:
        """Refuse to publish over a dataset that appeared or changed since the job began.

        Raises:
            DatasetExistsError: the manifest is not the one seen when the lock was taken, or (a
                remote output) another job removed this one's journal.
        """
        if _manifest_bytes(self.path) != self.manifest_seen:
            raise DatasetExistsError(
                f"{self.path}: its {manifest.MANIFEST} changed while this job ran (another writer ignored the lock?); "
                "nothing of this job was published"
            )
        journal = storage.join(self.path, layout.journal_name(self.token))
        if self.remote and not storage.exists(journal):
            # remote outputs have no lock: a second job started here took this one's uploads for a dead job's
            raise DatasetExistsError(
                f"{self.path}: another job started writing here while this one ran and removed its uploads as leftovers "
                "(one job per output prefix); nothing of this job was published"
            )

    def journal(self, files: list[str] | None, delete: list[str] | None = None) -> None:
        """Note what an install is about to do: the files it moves in and the old files it will
        delete (None: it is done, forget them). Whichever manifest a kill leaves in place, the
        next job removes every file of the two lists that manifest does not list. With
        conditional writes the journal also names the manifest version the job began from."""
        path = storage.join(self.path, layout.journal_name(self.token))
        if files is None:
            self.journaled = None
            storage.remove(path)
            return
        doc: dict[str, Any] = {"files": files, "delete": delete or []}
        if self.conditional:
            doc["base"] = self.manifest_version
        self.journaled = doc
        storage.write_bytes(path, json.dumps(doc).encode())

    def journal_more(self, name: str) -> None:
        """Add ``name`` to the files the journal says the install moves in (before it is uploaded)."""
        doc = self.journaled or {"files": [], "delete": []}
        self.journal([*doc["files"], name], doc["delete"])

    def commit(self, result: manifest.Manifest) -> None:
        """Put ``result`` in as the dataset's manifest: the step that publishes.

        On an object store with conditional writes, the store takes it only if the manifest is
        still the version this job began from (absent, if there was none): of racing jobs,
        exactly one gets through. Elsewhere the manifest is checked unchanged, then written
        (locally the lock keeps other writers out).

        Raises:
            DatasetExistsError: another job published here first.
        """
        if not self.conditional:
            self.check_unchanged()
            manifest.write(self.path, result)
            self.made = None  # the directory holds a dataset now
            return
        url = storage.join(self.path, manifest.MANIFEST)
        if not storage.put_if_unchanged(url, result.to_json().encode("utf-8"), seen=self.manifest_version):
            raise DatasetExistsError(
                f"{self.path}: another job published here while this one ran (the store refused to replace a "
                f"{manifest.MANIFEST} other than the one this job began from); nothing of this job was published"
            )
        self.manifest_seen = None  # the job's view is stale now: a second commit must not pass
        self.manifest_version = storage.version(url)

    def tidy(self) -> None:
        """After a commit, remove what jobs that can no longer publish left (see :func:`~shardkit.dataset.leftovers.undo_installs`)."""
        if self.conditional:
            undo_installs(self.path, conditional=True)

    def release(self) -> None:
        """Let the output go: remove the lock file and drop the lock; then, when the job created
        the output directory and published nothing, remove it again while it is empty. Idempotent."""
        if self.released:
            return
        self.released = True
        made, self.made = self.made, None
        try:
            self.held.close()
        finally:
            remove_made(made)


def remove_staging(path: str) -> None:
    """Remove a job's staging directory (made by :meth:`Output.staging`), never following a link."""
    delete_owned(os.path.dirname(path), [os.path.basename(path)], reason="the job's staging", records=Records())


def claim(
    path: str | os.PathLike[str], *, overwrite: bool, resume: bool = False, files: re.Pattern[str] = PILE_FILE, dry_run: bool = False
) -> Output:
    """Create the output directory, take its lock, clear a dead job's leftovers, check what is there.

    Unless ``overwrite``, refuse a directory holding a dataset, or holding files named like the
    ones this job writes (``files``) without a manifest: they would be mixed with the new
    dataset or replaced by it. On an object store, ``resume`` takes the files a stopped job
    uploaded before it could publish (its journal names them) for leftovers, as ``overwrite``
    does: the job continues from its staging and removes them once it publishes. What was
    cleared is in the output's ``cleared``; with ``dry_run`` (gc's) the leftovers stay, and
    ``cleared`` says what would have gone.

    Raises:
        ConfigError: the output is a file; DatasetExistsError: a dataset or such
            files are there (without ``overwrite``), or another job holds the lock.
    """
    out = check_path("out", path)
    store = storage.store_for(out)
    local = store.local_file()
    if local is None:
        return _claim_remote(out.rstrip("/"), overwrite, resume, files, dry_run)
    out = local
    if store.exists("") and not store.is_dir(""):
        raise ConfigError(f"{out}: output exists and is not a directory")
    output = Output(out, uuid.uuid4().hex, None)
    try:
        _lock(output)
    except BaseException:
        output.release()  # the directory it made goes again
        raise
    try:
        output.cleared = clear_leftovers(out, dry_run=dry_run)  # first: a dead job's half-installed files are not a dataset
        _check_empty(out, overwrite, files)
        output.manifest_seen = _manifest_bytes(out)
    except BaseException:
        output.release()
        raise
    return output


def _claim_remote(out: str, overwrite: bool, resume: bool, files: re.Pattern[str], dry_run: bool) -> Output:
    """:func:`claim` for an object-store output: no lock (see the module's docstring)."""
    if not dry_run:
        clear_dead_staging(tempfile.gettempdir())
    output = Output(out, uuid.uuid4().hex, None)
    _check_writable(output)
    url = storage.join(out, manifest.MANIFEST)
    output.conditional = storage.can_put_if_absent(url)
    if not output.conditional:
        _single_writer(out)
    output.cleared = undo_installs(out, conditional=output.conditional, dry_run=dry_run)
    _check_empty(out, overwrite, files, resume=resume)
    if output.conditional:
        output.manifest_version = storage.version(url)  # first: bytes read after it are as new or newer
    output.manifest_seen = _manifest_bytes(out)
    return output


_warned: set[str] = set()


def _single_writer(out: str) -> None:
    root = storage.remote.root(out)
    if root not in _warned:
        _warned.add(root)
        log.warning(
            "%s: this store has no conditional writes, so shardkit cannot tell two jobs writing here apart: "
            "run one job at a time on an output (S3 through s3fs has them)",
            out,
        )


def _check_writable(output: Output) -> None:
    """Write and remove this job's empty journal: a missing bucket or a denied write fails now,
    not after the whole job, when it publishes (a listing of a missing bucket finds nothing)."""
    output.journal([])
    output.journal(None)


def _check_empty(out: str, overwrite: bool, files: re.Pattern[str], *, resume: bool = False) -> None:
    if overwrite:
        return
    if manifest.is_dataset(out):
        raise DatasetExistsError(
            f"{out}: already holds a shardkit dataset ({manifest.MANIFEST}); pass overwrite=True (--overwrite, YAML overwrite: true under output) to replace it"
        )
    names = storage.listdir(out, missing_ok=True)
    stray = sorted(n for n in names if files.fullmatch(n))
    if not stray:
        return
    journals = read_journals(out, names)
    unpublished = [j for j, doc in journals.items() if stray[0] in journal_names(doc)]
    listed = {name for doc in journals.values() for name in journal_names(doc)}
    if resume and listed.issuperset(stray):  # its user says the job stopped: if it still runs, the store lets one of the two publish
        if recorded(out) is None:  # nothing here to go on from: the job ran on another machine, or its staging is gone
            raise DatasetExistsError(
                f"{out}: holds {stray[0]} but no {manifest.MANIFEST}: a file of a job that began to publish here and has not "
                f"finished (its journal {unpublished[0]} lists it), and resume=True finds no staging of it on this machine "
                f"({socket.gethostname()}; the output records {recorded_place(out)}). Resume it on the machine that ran it, or "
                "run it again with overwrite=True (--overwrite, YAML overwrite: true under output) to write the dataset anew"
            )
        log.info("%s: the files of a stopped job (its journal %s) stay until this job publishes, which removes them", out, unpublished[0])
        return
    if unpublished:  # the files of a job that began publishing here and has not (on an object store: no lock tells if it runs)
        raise DatasetExistsError(
            f"{out}: holds {stray[0]} but no {manifest.MANIFEST}: a file of a job that began to publish here and has not "
            f"finished (its journal {unpublished[0]} lists it). If that job still runs, let it finish; if it was stopped, "
            "run it again with resume=True (--resume, YAML resume: true) to go on from what it finished, or with "
            "overwrite=True (--overwrite, YAML overwrite: true under output) to write the dataset anew; either removes the "
            "stopped job's files once it publishes"
        )
    raise DatasetExistsError(
        f"{out}: holds {stray[0]} but no {manifest.MANIFEST}, so it is not a shardkit dataset; "
        "use an empty directory, or pass overwrite=True (--overwrite, YAML overwrite: true under output) to write the dataset beside such files (they are left as they are)"
    )


def _manifest_bytes(out: str) -> bytes | None:
    try:
        return storage.read_bytes(storage.join(out, manifest.MANIFEST))
    except DatasetNotFoundError:
        return None


def _whoami(token: str) -> bytes:
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        # storage option values hidden: the lock is a file any user of the directory may read
        "command": redact.masked_command(sys.argv)[:300],
        "token": token,
    }
    return json.dumps(me, indent=1).encode()


def _lock(output: Output) -> None:
    """Take the output's lock (:meth:`Store.lock`, saying who holds it), held until :meth:`Output.release`.

    Raises:
        DatasetExistsError: another job holds it (named from what it wrote into the file).
    """
    store, me = output.store, _whoami(output.token)
    deadline = time.monotonic() + _LOCK_GRACE
    while True:
        # made again when the job that held the lock made the directory, failed and removed it meanwhile
        output.made = storage.makedirs(output.path) or output.made
        try:
            if output.held.enter_context(store.lock(LOCK, wait=False, holder=me)):
                return
        except DatasetNotFoundError:
            if store.exists("") or time.monotonic() >= deadline:
                raise
            continue  # removed between the two steps
        if time.monotonic() >= deadline:
            raise DatasetExistsError(
                f"{output.path}: another job is writing here ({_read_holder(store)}); wait for it to finish (a dead job's lock is "
                "released by the system, so this one is alive)"
            )
        time.sleep(0.05)  # the worker processes of a job just killed take a moment to die


def _read_holder(store: storage.Store) -> str:
    """Who holds the lock, as its holder wrote it (it writes just after it takes the lock)."""
    for _ in range(40):
        try:
            holder = json.loads(store.read_range(LOCK, 0, 1 << 16))
            return redact.mask(f"pid {holder['pid']} on {holder['host']}, started {holder['started']}: {holder.get('command') or '?'}")
        except (ShardkitError, ValueError, KeyError, TypeError):
            time.sleep(0.005)
    return "a job that has not said who it is"
