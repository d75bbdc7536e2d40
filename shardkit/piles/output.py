"""Claim an output directory for one job: check it, lock it, clear a dead job's leftovers, let it go.

One writer per dataset. A job takes ``OUT/.shardkit-lock`` with an exclusive create (exactly one
of several racing processes wins) and writes into it who it is: process id, host, start time and
command. A second job on the same output fails at once with a :class:`DatasetExistsError` naming
the first. A lock whose process is gone (same host, pid not alive, or alive but started later:
a reused pid) is stale: the next job takes it over (renaming it aside first, so of two jobs
taking over at once only one wins) and removes what the dead job left (staging directories and
half-written temporaries), which nothing else can be writing while the lock is held.

A lock on another host cannot be checked from here: it is reported, with how to remove it.

    output = claim("data/train", overwrite=False)
    try:
        ...                                  # write into output.staging()
        output.check_unchanged()             # just before the manifest is replaced
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
import shutil
import socket
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any

from shardkit import manifest, storage
from shardkit._util import check_path
from shardkit.errors import ConfigError, DatasetExistsError, ShardkitError

log = logging.getLogger(__name__)

LOCK = ".shardkit-lock"
STAGING_PREFIX = ".shardkit-staging-"
# what a job leaves behind when it dies: staging and temporary directories, half-written files
LEFTOVERS = re.compile(r"\.shardkit-(staging|shuffle|lock\.stale|install)-.*|.*\.partial-[0-9a-f]{32}")
JOURNAL = ".shardkit-install-{token}.json"
PILE_FILE = re.compile(r"pile-.*\.tar")
# the names pass 1 gives piles: pile-000012.tar, a split sub-pile pile-000012-001.tar, an overwrite's .v1
PILE_NAME = re.compile(r"pile-\d{6,}(-\d{3,})*(\.v\d+)?\.tar")


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
    released: bool = field(default=False)

    def staging(self, prefix: str = STAGING_PREFIX) -> str:
        """A fresh staging directory's path inside the output (not created)."""
        return os.path.join(self.path, f"{prefix}{uuid.uuid4().hex}")

    def check_unchanged(self) -> None:
        """Refuse to publish over a dataset that appeared or changed since the job began.

        Raises:
            DatasetExistsError: the manifest is not the one seen when the lock was taken.
        """
        if _manifest_bytes(self.path) != self.manifest_seen:
            raise DatasetExistsError(
                f"{self.path}: its {manifest.MANIFEST} changed while this job ran (another writer ignored the lock?); "
                "nothing of this job was published"
            )

    def journal(self, names: list[str] | None) -> None:
        """Note the files an install is about to move in (None: it is done, forget them)."""
        path = os.path.join(self.path, JOURNAL.format(token=self.token))
        if names is None:
            storage.remove(path)
        else:
            storage.write_bytes(path, json.dumps({"files": names}).encode())

    def release(self) -> None:
        """Remove the lock if it is still this job's. Idempotent."""
        if self.released:
            return
        self.released = True
        lock = os.path.join(self.path, LOCK)
        with contextlib.suppress(OSError, ValueError):
            if json.loads(storage.read_bytes(lock)).get("token") == self.token:
                os.unlink(lock)


def claim(path: str | os.PathLike[str], *, overwrite: bool, files: re.Pattern[str] = PILE_FILE, job: str = "writing piles to") -> Output:
    """Check the output directory, create it, take its lock and clear a dead job's leftovers.

    Unless ``overwrite``, refuse a directory holding a dataset, or holding files named like the
    ones this job writes (``files``) without a manifest: they would be mixed with the new
    dataset or replaced by it. ``job`` words the error for remote outputs.

    Raises:
        ConfigError: a remote or non-directory output; DatasetExistsError: a dataset or such
            files are there (without ``overwrite``), or another live job holds the lock.
    """
    out = check_path("out", path)
    if storage.local_path(out) is None:
        raise ConfigError(f"{out}: {job} remote storage is not supported yet; write locally and upload")
    out = storage.local_path(out) or out
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"{out}: output exists and is not a directory")
    storage.makedirs(out)
    token = uuid.uuid4().hex
    _lock(out, token)
    try:
        _check_empty(out, overwrite, files)
        _clear_leftovers(out)
    except BaseException:
        Output(out, token, None).release()
        raise
    return Output(out, token, _manifest_bytes(out))


def _check_empty(out: str, overwrite: bool, files: re.Pattern[str]) -> None:
    if overwrite:
        return
    if manifest.is_dataset(out):
        raise DatasetExistsError(
            f"{out}: already holds a shardkit dataset ({manifest.MANIFEST}); pass overwrite=True (--overwrite) to replace it"
        )
    stray = sorted(n for n in os.listdir(out) if files.fullmatch(n))
    if stray:
        raise DatasetExistsError(
            f"{out}: holds {stray[0]} but no {manifest.MANIFEST}, so it is not a shardkit dataset; "
            "use an empty directory or pass overwrite=True (--overwrite) to replace such files"
        )


def _manifest_bytes(out: str) -> bytes | None:
    try:
        with open(os.path.join(out, manifest.MANIFEST), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _whoami(token: str) -> dict[str, Any]:
    pid = os.getpid()
    return {
        "pid": pid,
        "host": socket.gethostname(),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "process_start": _process_start(pid),
        "command": " ".join(sys.argv)[:300],
        "token": token,
    }


def _lock(out: str, token: str) -> None:
    """Take ``out``'s lock, taking over a stale one; DatasetExistsError when a live job holds it."""
    lock = os.path.join(out, LOCK)
    data = json.dumps(_whoami(token), indent=1).encode()
    for _ in range(100):  # each round either wins, fails, or clears a stale lock someone else left
        if storage.create_exclusive(lock, data):
            return
        holder = _read_lock(lock)
        if holder is None:
            continue  # released between our create and our read: try again
        if not _is_stale(holder):
            raise DatasetExistsError(
                f"{out}: another job is writing here ({_describe(holder)}); wait for it to finish, or {_how_to_clear(holder, lock)}"
            )
        aside = f"{lock}.stale-{uuid.uuid4().hex}"
        with contextlib.suppress(FileNotFoundError):  # another job took it over first
            os.rename(lock, aside)
            log.warning("%s: taking over the lock of a job that is gone (%s)", out, _describe(holder))
    raise DatasetExistsError(f"{out}: could not take {LOCK}: other jobs keep taking it")


def _read_lock(lock: str) -> dict[str, Any] | None:
    try:
        with open(lock, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
        return holder if isinstance(holder, dict) else {}
    except ValueError:  # written by a job killed mid-write: nobody can be holding it
        return {}


def _is_stale(holder: dict[str, Any]) -> bool:
    """A lock whose process is certainly gone: on this host, and its pid dead or reused."""
    if not holder:
        return True  # unreadable: its writer died while writing it
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    started = holder.get("process_start")
    return started is not None and _process_start(pid) not in (None, started)


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux), to tell a reused pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "unknown: its lock file is unreadable"
    return f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}: {holder.get('command') or '?'}"


def _how_to_clear(holder: dict[str, Any], lock: str) -> str:
    where = "" if holder.get("host") == socket.gethostname() else f" (it runs on {holder.get('host')}, which this host cannot check)"
    return f"if that job is dead{where}, remove {lock}"


def _clear_leftovers(out: str) -> None:
    """Remove what dead jobs left: nobody else writes here while this job holds the lock."""
    _undo_installs(out)
    for name in os.listdir(out):
        if LEFTOVERS.fullmatch(name):
            path = os.path.join(out, name)
            log.info("%s: removing %s, left by a job that did not finish", out, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


def _undo_installs(out: str) -> None:
    """Remove the files a dead job moved in without getting its manifest in (its journal lists
    them); those the manifest lists now are the dataset's and stay."""
    journals = [n for n in os.listdir(out) if n.startswith(".shardkit-install-") and n.endswith(".json")]
    if not journals:
        return
    try:
        listed = {p.name for p in manifest.read(out).piles} if manifest.is_dataset(out) else set()
    except ShardkitError:
        return  # no sound manifest to tell ours from theirs: leave everything for the user
    for journal in journals:
        try:
            names = json.loads(storage.read_bytes(os.path.join(out, journal))).get("files", [])
        except (ShardkitError, ValueError, AttributeError):
            names = []
        for name in names:
            if isinstance(name, str) and name not in listed and "/" not in name:
                log.info("%s: removing %s, moved in by a job that died before publishing", out, name)
                storage.remove(os.path.join(out, name))
        storage.remove(os.path.join(out, journal))
