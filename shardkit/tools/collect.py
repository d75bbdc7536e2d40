"""Delete the files of a growing dataset that no manifest still needs: retired and replaced segments.

An append and a moving window never delete: the new manifest simply stops listing the oldest
generations' segments, and a loader pinned to an older generation keeps reading that
generation's files (its manifest is kept as ``shardkit.g<N>.json``). :func:`gc` deletes what
none of them needs any more: a file is kept while the current manifest lists it, or while a
generation that lists it stopped being the current one less than ``grace`` ago (a loader may
still be reading it). The manifests of generations older than that go too, after their files,
so a state pinned to one of them fails naming its generation, and so does the staging an
append left when it died after it published.

    report = gc("data/train", grace="1h")
    report.deleted, report.freed           # file names, bytes
"""

from __future__ import annotations

import datetime
import logging
import os
import re
from dataclasses import dataclass, field

from shardkit import manifest, storage
from shardkit._util import check_path, parse_duration
from shardkit.errors import ManifestError
from shardkit.manifest import GENERATION_FILE, Manifest, keys_name
from shardkit.piles import resume
from shardkit.piles.output import claim

log = logging.getLogger(__name__)

# what the piles of a dataset are made of: pile and segment files, and the key hashes beside them
_DATA_FILE = re.compile(r"pile-.*\.(tar|tar\.zst|tar\.gz|keys)")


@dataclass
class GcReport:
    """What :func:`gc` deleted (or, with ``dry_run``, would delete) and which generations it kept."""

    deleted: list[str] = field(default_factory=list)
    freed: int = 0
    kept_generations: list[int] = field(default_factory=list)


def gc(directory: str | os.PathLike[str], *, grace: str | int | float = "1h", dry_run: bool = False) -> GcReport:
    """Delete the files of ``directory`` that neither its manifest nor a recent generation lists.

    Args:
        grace: how long a generation's files outlive it once it is no longer the current one
            (``"1h"``, ``"7d"``, or seconds): loaders pinned to it keep reading that long.
        dry_run: only report what would be deleted.

    Raises:
        DatasetNotFoundError: no dataset there; DatasetExistsError: a job is writing to it (gc
            takes the same lock).
    """
    out = check_path("directory", directory)
    seconds = parse_duration(grace, what="grace")
    manifest.read(out)  # no dataset: fail before claim() makes the directory
    output = claim(out, overwrite=True)  # no append publishes while files are being deleted
    try:
        latest = manifest.read(output.path)
        report = _collect(output.path, latest, seconds, dry_run)
        # the staging of an append that died after it published
        if dry_run:
            stale = resume.published_staging(output.path, latest.generation) is not None
        else:
            stale = resume.remove_published(output.path, latest.generation)
        if stale:
            report.deleted.append(resume.STAGING)
        return report
    finally:
        output.release()


def _collect(out: str, latest: Manifest, grace: float, dry_run: bool) -> GcReport:
    names = storage.listdir(out)
    older = {int(m.group(1)): n for n in names if (m := GENERATION_FILE.fullmatch(n)) and int(m.group(1)) != latest.generation}
    manifests = {g: _read_copy(out, n) for g, n in older.items()}
    times = {g: t for found in [latest, *(f for f in manifests.values() if f is not None)] for g, t in found.generations.items()}
    now = datetime.datetime.now(datetime.timezone.utc)
    keep = set(latest.files())
    report = GcReport(kept_generations=[latest.generation])
    doomed_copies = []
    for g, copy in sorted(manifests.items()):
        ended = times.get(g + 1)  # when generation g stopped being the current one
        recent = ended is None or (now - datetime.datetime.fromisoformat(ended)).total_seconds() < grace
        if recent and copy is not None:
            keep |= set(copy.files())
            report.kept_generations.append(g)
        else:
            doomed_copies.append(older[g])
    keep |= {keys_name(n) for n in keep if not n.endswith(".keys")}  # a kept file's key hashes stay beside it
    for name in sorted(n for n in names if _DATA_FILE.fullmatch(n) and n not in keep) + doomed_copies:
        url = storage.join(out, name)
        report.freed += storage.size(url)
        report.deleted.append(name)
        if not dry_run:
            log.info("%s: deleting %s, which no current manifest lists", out, name)
            storage.remove(url)
    report.kept_generations.sort()
    return report


def _read_copy(out: str, name: str) -> Manifest | None:
    try:
        return manifest.parse(storage.read_bytes(storage.join(out, name)).decode("utf-8"), storage.join(out, name))
    except (ManifestError, UnicodeDecodeError) as e:
        log.warning("%s: %s is not a valid manifest, so its generation is not kept: %s", out, name, e)
        return None
