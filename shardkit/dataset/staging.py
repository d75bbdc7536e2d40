"""A job's staging directory: made fresh and private, found again, emptied and removed without following a link.

Every staging directory shardkit makes holds an owner record (:data:`~shardkit.dataset.layout.OWNER`)
written first and removed last: what :func:`shardkit.dataset.owned.delete_owned` takes as the
record that the directory is shardkit's. A local output's staging lives inside it; an
object-store output's is a private ``mkdtemp`` directory in the system's temporary directory,
whose place the output records (:data:`~shardkit.dataset.layout.REMOTE_STAGING`) so the next job
and gc on this machine find it.

    path = new_remote("s3://bucket/ds", ".shardkit-pass1-")   # made, recorded in the output
    remove_tree(path)                                          # no link followed, records last
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterable
from typing import Any

from shardkit import storage
from shardkit.dataset import layout
from shardkit.errors import ShardkitError, StorageError

_NOFOLLOW_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)


def clear_tree(path: str, keep: Iterable[str] = ()) -> None:
    """Remove all the directory ``path`` holds but the names ``keep``, without following a link
    anywhere: ``path`` is opened with ``O_NOFOLLOW`` (a link there is an error) and emptied
    through its descriptor, its records (:data:`~shardkit.dataset.layout.OWNER`, the job
    record) last.

    Raises:
        StorageError: ``path`` is a link or not a directory, or cannot be emptied.
    """
    kept = set(keep)
    with storage.guard(path, "empty the directory"):
        fd = os.open(path, _NOFOLLOW_DIR)
        try:
            entries = sorted(os.listdir(fd), key=lambda n: n in (layout.OWNER, layout.JOB))
            for entry in entries:
                if entry not in kept:
                    _remove_entry(fd, entry)
        finally:
            os.close(fd)


def remove_tree(path: str) -> None:
    """Remove the directory ``path`` and all it holds without following a link anywhere (see :func:`clear_tree`).

    Raises:
        StorageError: ``path`` is a link or not a directory, or cannot be removed.
    """
    parent, name = os.path.split(os.path.abspath(path))
    clear_tree(path)
    with storage.guard(path, "remove the directory"):
        parent_fd = os.open(parent or ".", _NOFOLLOW_DIR)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(name, dir_fd=parent_fd)
        finally:
            os.close(parent_fd)


def _remove_entry(fd: int, entry: str) -> None:
    try:
        st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(entry, dir_fd=fd)  # the fd-based walk: it follows no link (shutil.rmtree.avoids_symlink_attacks)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry, dir_fd=fd)


def make_staging(path: str, record: dict[str, Any]) -> None:
    """Create the staging directory ``path`` fresh (mode 0700), its owner record first.

    Raises:
        StorageError: something is already there (a link is named, never followed).
    """
    with storage.guard(path, "create the staging directory"):
        os.mkdir(path, 0o700)  # fails on anything already there, a link included
    write_owner(path, record)


def write_owner(path: str, record: dict[str, Any]) -> None:
    """Write the owner record into the staging directory ``path`` (opened without following a link)."""
    with storage.guard(path, "write the staging record"):
        fd = os.open(path, _NOFOLLOW_DIR)
        try:
            out = os.open(layout.OWNER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600, dir_fd=fd)
            try:
                storage.write_fully(out, json.dumps(record, sort_keys=True).encode())
            finally:
                os.close(out)
        finally:
            os.close(fd)


def check_staging(path: str) -> bool:
    """Whether the staging directory ``path`` exists, as a real directory of this user.

    Raises:
        StorageError: a link, or anything but a directory, is where it should be (named, not followed).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise StorageError(
            f"{path}: is {what}, where shardkit keeps its staging directory; it is never followed or replaced: "
            "remove it yourself if it is not yours",
            url=path,
        )
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise StorageError(f"{path}: the staging directory belongs to another user (uid {st.st_uid}); it is never used", url=path)
    return True


def _record(out: str) -> tuple[str, str] | None:
    """``(host, path)`` of the pass-1 staging the object-store output ``out`` records (see
    :func:`new_remote`); None when it records none, or nothing readable."""
    try:
        doc: Any = json.loads(storage.read_bytes(storage.join(out, layout.REMOTE_STAGING)))
    except (ShardkitError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("path"), str) or not isinstance(doc.get("host"), str):
        return None
    return doc["host"], doc["path"]


def recorded_place(out: str) -> str:
    """Where the object-store output ``out`` records its pass 1's staging: ``"PATH on HOST"``, or
    ``"nowhere it records"``."""
    found = _record(out)
    return "nowhere it records" if found is None else f"{found[1]} on {found[0]}"


def recorded(out: str) -> str | None:
    """The staging directory the object-store output ``out`` records for a job on this machine,
    when it is a real directory of this user in the temporary directory whose owner record names
    ``out``; None otherwise (none recorded, another machine's, a link...: never used)."""
    found = _record(out)
    path = found[1] if found is not None and found[0] == socket.gethostname() else None
    if path is None or os.path.dirname(path) != tempfile.gettempdir() or layout.kind(os.path.basename(path)) != "staging":
        return None
    try:
        if not check_staging(path):
            return None
        owner = json.loads(storage.read_range(os.path.join(path, layout.OWNER), 0, 1 << 16))
    except (ShardkitError, OSError, ValueError):
        return None  # a link, another user's, no record: never used
    return path if isinstance(owner, dict) and owner.get("dataset") == out else None


def new_remote(out: str, prefix: str) -> str:
    """A fresh private staging directory (``mkdtemp``: mode 0700, a name nobody can plant a link
    at first) for the object-store output ``out``, its owner record in it, its place recorded in ``out``."""
    with storage.guard(tempfile.gettempdir(), "create the staging directory"):
        path = tempfile.mkdtemp(prefix=prefix)
    write_owner(path, {"dataset": out})
    record = {"host": socket.gethostname(), "path": path}
    storage.write_bytes(storage.join(out, layout.REMOTE_STAGING), json.dumps(record).encode())
    return path


def staging_path(out: str) -> str | None:
    """Where pass 1 into ``out`` stages its parts: inside a local output. For an object-store
    output it is a private directory in the local temporary directory, made by ``mkdtemp`` (so
    nobody can plant a link at its name beforehand) and recorded in ``OUT/.shardkit-pass1.json``:
    the one that record names when it is on this machine, a real directory of this user made for
    ``out``; None when there is none."""
    local = storage.store_for(out).local_file(layout.STAGING)
    return local if local is not None else recorded(out)


def published_staging(out: str, generation: int) -> int | None:
    """The generation the pass-1 staging of ``out`` was an append of, if the dataset (now at
    ``generation``) already has it: the append died after publishing, before it removed its
    staging, and nobody can resume it. None when there is no such staging (none, a job's that
    did not publish, or a new dataset's)."""
    path = staging_path(out)
    then = (read_job(path) or {}).get("generation") if path is not None else None
    return then if isinstance(then, int) and then <= generation else None


def read_job(path: str) -> dict[str, Any] | None:
    """The job record (fingerprint) of the pass-1 staging ``path``; None when it has none that reads."""
    try:
        doc = json.loads(storage.read_bytes(os.path.join(path, layout.JOB)))
    except (ShardkitError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
