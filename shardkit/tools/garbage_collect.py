"""Delete the files of a growing dataset that no manifest still needs: retired and replaced segments.

An append and a moving window never delete: the new manifest simply stops listing the oldest
generations' segments, and a loader pinned to an older generation keeps reading that
generation's files (its manifest is kept as ``shardkit.g<N>.json``). :func:`gc` deletes what
none of them needs any more: a file is kept while the current manifest lists it, or while a
generation that lists it stopped being the current one less than ``grace`` ago (a loader may
still be reading it). The manifests of generations older than that go too, after their files,
so a state pinned to one of them fails naming its generation, and so does the staging an
append left when it died after it published.

On an object store with conditional writes, jobs write beside gc (there is no lock): gc then
deletes an object only if it was written more than ``grace`` ago (by the object's own time)
and no journal of a job that may still publish names it. It lists the objects, then the
journals, then reads the manifest, so an object a running job uploaded is either named by its
journal or, once it has published, by the manifest.

    report = gc("data/train", grace="1h")
    report.deleted, report.freed           # file names, bytes
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass, field

from shardkit import manifest, storage
from shardkit._util import check_path, parse_duration
from shardkit.dataset import layout, leftovers
from shardkit.dataset.owned import delete_owned, read_records
from shardkit.dataset.transaction import Dataset
from shardkit.manifest import Manifest, keys_name

log = logging.getLogger(__name__)


@dataclass
class GcReport:
    """What :func:`gc` deleted (or, with ``dry_run``, would delete), the leftovers of dead jobs it
    cleared first included, and which generations it kept."""

    deleted: list[str] = field(default_factory=list)
    freed: int = 0
    kept_generations: list[int] = field(default_factory=list)
    # names of the dataset's kind it left: not shardkit's (no record names them), or not deletable
    skipped: list[str] = field(default_factory=list)


def gc(directory: str | os.PathLike[str], *, grace: str | int | float = "1h", dry_run: bool = False) -> GcReport:
    """Delete the files of ``directory`` that neither its manifest nor a recent generation lists.

    Only files shardkit wrote go: a name of the dataset's layout that a record of it names (a
    kept generation's manifest, an install journal; see :mod:`shardkit.dataset.owned`). Anything
    else, a user's ``pile-notes.tar`` or a folder ``pile-dir.tar``, is left, logged and listed in
    the report's ``skipped``; gc never stops half-way.

    Args:
        grace: how long a generation's files outlive it once it is no longer the current one
            (``"1h"``, ``"7d"``, or seconds): loaders pinned to it keep reading that long.
        dry_run: only report what would be deleted (dead jobs' leftovers stay too).

    Raises:
        DatasetNotFoundError: no dataset there; DatasetExistsError: a job is writing to it (gc
            takes the same lock).
    """
    out = check_path("directory", directory)
    seconds = parse_duration(grace, what="grace")
    manifest.read(out)  # no dataset: fail before the transaction makes the directory
    # locally no append publishes while files are being deleted; taking the output clears what
    # dead jobs left (dry, says what it would clear): those files are gc's deletions too
    with Dataset(out).transaction(mode="collect", dry_run=dry_run) as txn:
        assert txn.output is not None
        cleared = txn.output.cleared
        if txn.output.conditional:
            latest, names, spare = _beside_jobs(txn.path, seconds)
        else:
            latest = manifest.read(txn.path)
            names, spare = storage.listdir(txn.path), None
        names = [n for n in names if n not in cleared.deleted]  # a dry run still sees them: not counted twice
        report = _collect(txn.path, latest, seconds, dry_run, names, spare)
        report.deleted[:0] = cleared.deleted
        report.freed += cleared.freed
        # the staging of an append that died after it published
        if leftovers.remove_published(txn.path, latest.generation, dry_run=dry_run):
            report.deleted.append(layout.STAGING)
        return report


def _beside_jobs(out: str, grace: float) -> tuple[Manifest, list[str], set[str]]:
    """The manifest, the objects of ``out``, and those of them gc may delete as jobs go on
    writing (see the module's docstring): written over ``grace`` ago, named by no live journal."""
    found = storage.entries(out)
    journals = leftovers.read_journals(out)
    version = storage.version(storage.join(out, manifest.MANIFEST))
    latest = manifest.read(out)  # last: a job that published since the listing is in it
    busy = {name for doc in journals.values() if leftovers.live(doc, version) for name in leftovers.journal_names(doc)}
    now = datetime.datetime.now(datetime.timezone.utc)
    old = {e.name for e in found if (now - e.modified).total_seconds() >= grace and e.name not in busy}
    for name in sorted(busy & {e.name for e in found}):
        log.info("%s: keeping %s, which a running job is publishing", out, name)
    return latest, [e.name for e in found], old


def _collect(out: str, latest: Manifest, grace: float, dry_run: bool, names: list[str], spare: set[str] | None) -> GcReport:
    """Delete what no kept generation lists among ``names`` (only those of ``spare``, when given)."""
    records = read_records(out, names)
    times = {g: t for found in [latest, *records.generations.values()] for g, t in found.generations.items()}
    now = datetime.datetime.now(datetime.timezone.utc)
    keep = set(latest.files())
    report = GcReport(kept_generations=[latest.generation])
    doomed = []
    for g, copy in sorted(records.generations.items()):
        ended = manifest.parse_time(times[g + 1]) if g + 1 in times else None  # when generation g stopped being the current one
        if ended is None or (now - ended).total_seconds() < grace:
            keep |= set(copy.files())
            report.kept_generations.append(g)
        else:
            doomed.append(g)
    keep |= {keys_name(n) for n in keep if not n.endswith(".keys")}  # a kept file's key hashes stay beside it
    kept = set(report.kept_generations)
    files = sorted(n for n in names if layout.kind(n) == "data" and n in records.named and n not in keep)
    copies = [
        n for n in names if (m := layout.GENERATION_FILE.fullmatch(n) or layout.INDEX_FILE.fullmatch(n)) and int(m.group(1)) in doomed
    ]
    indexes = [n for n in names if (m := layout.INDEX_FILE.fullmatch(n)) and int(m.group(1)) not in kept and int(m.group(1)) not in doomed]
    # the manifests go after their files: a kill in between leaves them, and the next gc finishes
    doomed_names = files + sorted(set(copies + indexes))
    if spare is not None:  # jobs write beside gc: only what is old enough and no live journal names
        doomed_names = [n for n in doomed_names if n in spare]
    done = delete_owned(out, doomed_names, reason="no current manifest lists it", records=records, dry_run=dry_run)
    report.deleted, report.freed = done.deleted, done.freed
    ours = keep | records.named | set(done.deleted) | {layout.MANIFEST, layout.generation_name(latest.generation)}
    ours |= {layout.generation_name(g) for g in report.kept_generations} | {layout.index_name(g) for g in report.kept_generations}
    unknown = [n for n in names if n not in ours and n.startswith(layout.NAME_PREFIXES)]
    for name in unknown:
        log.warning("%s: gc leaves %s: no manifest or journal of this dataset names it, so shardkit did not write it", out, name)
    report.skipped = sorted({*unknown, *(name for name, _ in done.skipped)})
    report.kept_generations.sort()
    return report
