"""Resume an interrupted pass 1: its staging directory, taken again, checked and handed on, or refused.

Pass 1 stages its part files in one directory per output (:func:`~shardkit.dataset.staging.staging_path`),
with one subdirectory per process or Ray task, each committed now and then
(:mod:`shardkit.piles.commits`). A job that dies (kill -9, Ctrl-C, a lost machine) leaves the
staging directory, with :data:`JOB` describing the job. Run again with ``resume=True``, it checks
that the job is the same one (:mod:`shardkit.piles.fingerprint`: inputs, ``fn``, options and
seed), checks every committed part file by name, size and CRC-32, cuts the uncommitted tail off,
and hands the committed parts on: only the units no record names are processed again.
Publishing orders every pile's bytes by unit, so the result is byte-identical to a run that
never stopped. Without ``resume``, a staging directory holding committed work is refused
(:func:`open_staging`), saying how to resume or to discard it.

    staging = txn.hold(open_staging(txn.path, job_doc, resume=True, overwrite=False))
    print(len(staging.commits), "parts reused;", len(staging.todo(units)), "units left")
"""

from __future__ import annotations

import errno
import glob
import json
import logging
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardkit import manifest, storage
from shardkit._util import format_size
from shardkit.dataset import layout
from shardkit.dataset.leftovers import discard_staging
from shardkit.dataset.staging import check_staging, clear_tree, make_staging, new_remote, read_job, staging_path
from shardkit.errors import ConfigError, DatasetExistsError, ShardkitError, StorageError
from shardkit.piles.commits import Commit, check_all, committed
from shardkit.piles.fingerprint import differences
from shardkit.piles.merge_records import finished_piles, merged_infos

log = logging.getLogger(__name__)

# the staging directory of a local output's pass 1, inside it (a remote output's is local: TMPDIR)
STAGING = layout.STAGING
# the job's fingerprint, written when its staging directory is made
JOB = layout.JOB
# where the merge assembles piles, inside the staging directory: the piles it finished before it
# stopped are kept for a resumed job (their part files are gone: each is deleted once its pile is made)
MERGING = layout.MERGING
# held by the job that uses a staging directory, so a second job on the same output fails
LOCK = layout.STAGING_JOB_LOCK
# seconds between the commits of a process that keeps working: what a kill can cost it
COMMIT_SECONDS = 15.0


# -- the staging directory ---------------------------------------------------------------------


@dataclass
class Staging:
    """The staging directory of a pass-1 job, and what earlier runs of the same job committed in it.

    ``commits`` maps each reused part directory to its (checked) commit.
    """

    path: str
    commits: dict[str, Commit]
    lock_fd: int = -1
    out: str = ""  # the output it stages for
    merged: dict[int, int] = field(default_factory=dict)  # piles a stopped merge finished: their samples

    @property
    def merging(self) -> str:
        """Where the merge assembles the piles (see :data:`MERGING`)."""
        return os.path.join(self.path, MERGING)

    def done(self) -> set[int]:
        """Units a reused commit names, written or skipped."""
        return {u for c in self.commits.values() for u in c.units} | {f.index for c in self.commits.values() for f in c.failures}

    def todo(self, count: int) -> list[int]:
        """The units of ``range(count)`` still to process, in order."""
        done = self.done()
        return [i for i in range(count) if i not in done]

    def attempt(self) -> str:
        """A name prefix for the part directories of this run, none an earlier run used."""
        return f"part-{uuid.uuid4().hex[:8]}"

    def remove(self) -> None:
        """The job is published (or can never succeed as it is): remove the staging directory."""
        discard_staging(self.path, self.out)
        self.release()

    def full_disk(self, error: StorageError) -> StorageError:
        """The one-line error of a job that ran out of disk, once what no resume can use (the
        publish scratch, parts no commit names) is removed: how much the staging keeps and how to
        continue or discard it; nothing kept when nothing was committed (:meth:`release` removes it)."""
        kept = committed(self.path)
        if not kept:
            said = f"the job's staging {self.path} is removed: none of its work was committed, so nothing could be resumed"
        else:
            clear_tree(self.path, keep={LOCK, JOB, layout.OWNER, *(os.path.basename(d) for d in kept)})
            units = sum(len(c.units) + len(c.failures) for c in kept.values())
            held = sum(os.lstat(os.path.join(root, f)).st_size for root, _, files in os.walk(self.path) for f in files)
            said = (
                f"the job's staging {self.path} keeps {format_size(held)} of committed work ({units} input units): free space "
                f"and run the same job again with resume=True (--resume) to continue it, or delete {self.path} to start over"
            )
        return StorageError(f"{error}; {said}", url=error.url, errno=error.errno)

    def release(self) -> None:
        """Let the directory go; removed unless it holds committed work (for ``resume=True``). Idempotent."""
        if self.lock_fd < 0:
            return
        if not committed(self.path):
            discard_staging(self.path, self.out)
        os.close(self.lock_fd)
        self.lock_fd = -1


def out_of_space(error: BaseException) -> StorageError | None:
    """The StorageError of a full disk (or quota) that ``error`` is or was raised from, if any."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, StorageError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def open_staging(out: str, job: Mapping[str, Any], *, resume: bool, overwrite: bool, merge: Mapping[str, Any] | None = None) -> Staging:
    """Take the staging directory of the pass-1 job ``job`` (its :func:`fingerprint`) into ``out``.

    A fresh job gets an empty directory. Leftovers of an earlier run that committed work are
    refused without ``resume`` (discarded with ``overwrite``); with ``resume`` they must come from
    the same job, and every committed part is checked and reused (a part that fails its check is
    removed, and its units are processed again). The piles a stopped merge finished are kept when
    it was asked for the same ``merge`` (compression and level) and every part checks: their part
    files are gone, so the units count as done by the piles. One line (logged at INFO) says what
    was kept and what is done again. Without ``resume`` the leftovers of an append
    whose generation the dataset already has (killed after it published) are cleared: nobody can
    resume them.

    Raises:
        DatasetExistsError: leftovers holding committed work, without ``resume`` or ``overwrite``;
            or another job is using the directory.
        ConfigError: ``resume`` and the leftovers come from a different job (each difference named).
    """
    path = staging_path(out)
    if path is None:
        path = new_remote(out, f"{STAGING}-")
    elif not check_staging(path):  # a link or a file there is an error naming it, never a target
        make_staging(path, {"dataset": out})
    fd = storage.lock_file(os.path.join(path, LOCK), wait=False)
    if fd is None:
        raise DatasetExistsError(f"{out}: another pass-1 job is writing into {path}; wait for it to finish")
    try:
        staging = Staging(path, {}, fd, out)
        before = read_job(path)
        found = {} if not resume and _published(before, job) else committed(path)
        if found and not resume and not overwrite:
            discard = f"delete {path}" if job.get("generation") else "with overwrite=True (--overwrite, YAML overwrite: true under output)"
            units = sum(len(c.units) + len(c.failures) for c in found.values())
            started = before.get("started", "?") if before else "?"
            raise DatasetExistsError(
                f"{out}: holds an interrupted pass 1 ({units} of {before.get('units', '?') if before else '?'} input units "
                f"committed, started {started}, in {path}); run the same job again with resume=True (--resume, "
                f"YAML resume: true) to continue it, or {discard} to discard it"
            )
        if resume and found:
            said = differences(before or {}, job)
            if said and _was_published(before, job):
                raise ConfigError(
                    f"{out}: cannot resume: the append in {path} wrote generation {(before or {}).get('generation')}, and the dataset "
                    f"has it now ({'; '.join(said)}): it was published, by this job before it stopped or by another writer. "
                    "Nothing of it can be resumed: run again without resume=True to append anew (its leftovers are cleared)"
                )
            if said:
                raise ConfigError(
                    f"{out}: cannot resume: the interrupted pass 1 in {path} was another job: {'; '.join(said)}. "
                    "Compared: the input units (in order), fn (qualified name and a hash of its code), the options that change "
                    "the bytes, and the shardkit version. Run it as it was, or pass overwrite=True (--overwrite, YAML overwrite: true under output) to start over"
                )
            merged = finished_piles(os.path.join(path, MERGING), merge) if merge is not None else {}
            staging.commits, staging.merged = _checked(found, merged)
            _clear(path, keep={*staging.commits, *([os.path.join(path, MERGING)] if staging.merged else [])})
            _said_resume(out, staging, job.get("units"))
        else:
            _clear(path, keep=set())
        started = before.get("started") if (before and staging.commits) else None
        doc = {**job, "started": started or time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        storage.write_bytes(os.path.join(path, JOB), json.dumps(doc, indent=1, sort_keys=True).encode())
    except BaseException:
        os.close(fd)
        raise
    return staging


def published(out: str, job: Mapping[str, Any]) -> manifest.Manifest | None:
    """The dataset in ``out``, when the pass-1 job ``job`` (its :func:`fingerprint`) published it
    and was stopped before it removed its staging, or while it did: the staging (or what is left
    of it under its leftover name) is this job's, and the manifest in place lists exactly the piles
    its merge finished (by checksum, size and samples). None otherwise (no staging, another
    job's, a merge that did not finish, or a dataset that is not this job's). Reads only: the
    caller claims the output, which clears such leftovers, then calls :func:`finish_published`."""
    path = staging_path(out)
    if path is None or not manifest.is_dataset(out):
        return None
    found = [path, *sorted(glob.glob(glob.escape(path) + "-removed-*"))]
    try:
        current = manifest.read(out)
    except ShardkitError:
        return None
    mine = sorted((p.checksum, p.bytes, p.samples) for p in current.piles)
    for candidate in found:
        if not check_staging(candidate):
            continue
        before = read_job(candidate)
        merged = merged_infos(os.path.join(candidate, MERGING))
        if (
            before is not None
            and merged
            and not differences(before, job)
            and sorted((p.checksum, p.bytes, p.samples) for p in merged) == mine
        ):
            return current
    return None


def finish_published(out: str, units: Any) -> None:
    """Remove the staging of a job :func:`published` found published (unless a job holds it now),
    and say so in the one line a resumed job logs."""
    path = staging_path(out)
    log.info(
        "%s: resuming: keeping %s of %s input units (the job published its dataset before it stopped), processing 0 again",
        out,
        units,
        units,
    )
    if path is None or not check_staging(path):
        return  # the claim removed what was left of it
    fd = storage.lock_file(os.path.join(path, LOCK), wait=False)
    if fd is None:
        return  # a job holds it: it clears it itself
    try:
        discard_staging(path, out)
    finally:
        os.close(fd)


def _was_published(before: Mapping[str, Any] | None, job: Mapping[str, Any]) -> bool:
    """The leftovers are an append's whose generation the dataset already has (killed after its
    manifest went in, or another writer's came first)."""
    then, now = (before or {}).get("generation"), job.get("generation")
    return isinstance(then, int) and isinstance(now, int) and then < now


def _published(before: Mapping[str, Any] | None, job: Mapping[str, Any]) -> bool:
    """:func:`_was_published`, logged: a fresh job clears such leftovers, as no job can resume
    them (``resume=True`` says why it cannot)."""
    then = (before or {}).get("generation")
    if _was_published(before, job):
        log.info("removing the staging of the append of generation %d: it was published (the dataset is past it)", then)
        return True
    return False


def _clear(path: str, keep: set[str]) -> None:
    """Remove everything in the staging directory but its lock, its owner and job records and the
    directories in ``keep``, following no link. The job record stays until the new one replaces
    it: a job stopped between the two would leave kept commits that no record names, which no
    resume could take."""
    clear_tree(path, keep={LOCK, layout.OWNER, JOB, *(os.path.basename(k) for k in keep)})


def _said_resume(out: str, staging: Staging, units: Any) -> None:
    """The one line a resumed job logs: what it keeps, what it does again."""
    done = len(staging.done())
    total = units if isinstance(units, int) else done
    merged = f", {len(staging.merged)} piles already merged" if staging.merged else ""
    log.info(
        "%s: resuming: keeping %d of %d input units (%d committed parts%s), processing %d again",
        out,
        done,
        total,
        len(staging.commits),
        merged,
        max(total - done, 0),
    )


def _checked(found: Mapping[str, Commit], merged: Mapping[int, int]) -> tuple[dict[str, Commit], dict[int, int]]:
    """The commits whose part files check (name, size, CRC-32), their tails cut to the commit;
    of two that name one unit, the first by directory name; and the merged piles kept.

    The part files of a merged pile are not looked at (they were deleted, or are links to the
    pile itself). The merged piles are kept only if every commit checks: a unit done again
    would belong in them.
    """
    kept, failed = check_all(found, merged)
    if failed and merged:
        log.warning("%d committed parts do not check: the %d piles a stopped merge finished are made again", failed, len(merged))
        kept, _ = check_all(found, {})
        return kept, {}
    return kept, dict(merged)
