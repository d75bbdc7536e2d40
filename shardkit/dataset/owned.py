"""The one way shardkit deletes a dataset's files: only names it wrote, as its layout and a record of its own say.

Every delete in a dataset directory goes through :func:`delete_owned`: gc, the old files an
overwrite replaces, a dead job's leftovers and half-installed files, staging directories. A name
is deleted only when both hold:

- the layout gives it a form shardkit writes (:func:`shardkit.dataset.layout.kind`), and
- a record shardkit wrote names it: the dataset's manifest or a kept generation's manifest (for
  pile, segment and key-hash files), an install journal (for the files an install moved in or
  was to delete, the kept manifests and indexes of the dataset an overwrite replaced, and for
  the journal itself), the owner record written first into every staging directory (for the
  directory).

Anything else (a user's ``pile-notes.tar``, a folder named ``pile-dir.tar``, a file a tampered
manifest names) is skipped, logged and returned by name: a delete never aborts half-way. A
directory is removed without ever following a link: it is opened with ``O_NOFOLLOW`` and emptied
through its descriptor, its owner record last (:mod:`shardkit.dataset.staging`), so a kill in
the middle leaves a directory the next job still knows as its own.

The output directory itself goes only through :func:`remove_made`: when the job that created it
published nothing, and only while it is empty.

    done = delete_owned("data/train", ["pile-000000.tar"], reason="replaced by an overwrite")
    done.deleted, done.skipped          # names; (name, why) pairs
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shardkit import manifest, storage
from shardkit.dataset import layout
from shardkit.dataset.staging import remove_tree
from shardkit.errors import DatasetNotFoundError, ShardkitError, StorageError
from shardkit.manifest import Manifest

log = logging.getLogger(__name__)

# bytes a key hash takes in a keys file
KEY_BYTES = 8


@dataclass
class Records:
    """What the records in a dataset directory say shardkit wrote there.

    Attributes:
        latest: the manifest (None: none, or none that checks).
        generations: the kept manifests of older generations that check, by generation.
        journals: the install journals that parse, by name: ``{"files": [...], "delete": [...]}``.
        named: every file name those records name (a kept file's key hashes included).
    """

    latest: Manifest | None = None
    generations: dict[int, Manifest] = field(default_factory=dict)
    journals: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    named: set[str] = field(default_factory=set)
    # the size a manifest records for a file it names: a file of that name and another size is not the one shardkit wrote
    sizes: dict[str, int] = field(default_factory=dict)

    def add(self, m: Manifest) -> None:
        """Take the files ``m`` names (their key hashes too) as shardkit's, with the sizes it records."""
        for pile in m.piles:
            if pile.segments is None:
                self.sizes[pile.name] = pile.bytes
                self.named.add(pile.name)
                continue
            for s in pile.segments:
                keys = layout.keys_name(s.name)
                self.sizes.update({s.name: s.bytes, keys: s.samples * KEY_BYTES})
                self.named |= {s.name, keys}
        self.named |= {layout.keys_name(f) for f in m.files()}

    def kept(self) -> set[str]:
        """Every name the manifest and the kept generations account for: the files they list and
        those files' key hashes, the kept manifests, and the index of each of those generations."""
        if self.latest is None:
            return set()
        found = {layout.generation_name(g) for g in self.generations}
        for m in (self.latest, *self.generations.values()):
            files = m.files()
            found |= {*files, *(layout.keys_name(f) for f in files), layout.index_name(m.generation)}
        return found


def read_journal(directory: str, name: str) -> dict[str, list[str]] | None:
    """The install journal ``name`` in ``directory`` when it is one (lists of plain names), else None."""
    try:
        doc: Any = json.loads(storage.read_bytes(storage.join(directory, name)))
    except (ShardkitError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    lists = {key: doc.get(key, []) for key in ("files", "delete")}
    if not all(isinstance(v, list) for v in lists.values()):
        return None
    return {key: [n for n in v if layout.plain(n)] for key, v in lists.items()}


def read_records(directory: str, names: Iterable[str] | None = None) -> Records:
    """The records of the dataset ``directory`` (``names``: its listing, when the caller has it)."""
    listed = storage.listdir(directory, missing_ok=True) if names is None else list(names)
    records = Records()
    with contextlib.suppress(ShardkitError):
        records.latest = manifest.read(directory) if layout.MANIFEST in listed else None
    latest = records.latest
    for name in listed:
        kind = layout.kind(name)
        if kind == "journal" and (doc := read_journal(directory, name)) is not None:
            records.journals[name] = doc
            records.named |= {n for n in doc["files"] + doc["delete"] if layout.kind(n) == "data"}
            # an overwrite deletes the kept manifests and indexes of the dataset it replaced
            records.named |= {n for n in doc["delete"] if layout.kind(n) in ("generation", "index")}
        elif kind == "generation" and latest is not None:
            g = int(layout.GENERATION_FILE.fullmatch(name).group(1))  # type: ignore[union-attr]
            copy = _read_copy(directory, name)
            # a copy of this dataset's: an older generation, its own number inside, the same seed
            if copy is not None and copy.generation == g < latest.generation and copy.seed == latest.seed:
                records.generations[g] = copy
    for m in [*([latest] if latest is not None else []), *records.generations.values()]:
        records.add(m)
    return records


def _read_copy(directory: str, name: str) -> Manifest | None:
    url = storage.join(directory, name)
    try:
        return manifest.parse(storage.read_bytes(url).decode("utf-8"), url)
    except (ShardkitError, UnicodeDecodeError) as e:
        log.warning("%s: %s is not a valid manifest: %s", directory, name, e)
        return None


def _manifest_or_gone(directory: str, name: str) -> bool:
    """``name`` in ``directory`` reads as a manifest, or is not there (nothing to delete)."""
    url = storage.join(directory, name)
    try:
        manifest.parse(storage.read_bytes(url).decode("utf-8"), url)
    except DatasetNotFoundError:
        return True
    except (ShardkitError, UnicodeDecodeError):
        return False
    return True


@dataclass
class Deletion:
    """What :func:`delete_owned` deleted (or, ``dry_run``, would delete), the bytes, and what it left and why."""

    deleted: list[str] = field(default_factory=list)
    freed: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def add(self, other: Deletion) -> Deletion:
        """This deletion with ``other``'s names, bytes and skips added (returned for chaining)."""
        self.deleted += other.deleted
        self.freed += other.freed
        self.skipped += other.skipped
        return self


def why_not(directory: str, name: str, records: Records) -> str | None:
    """Why ``name`` in ``directory`` is not shardkit's to delete; None when it is (see the module's docstring)."""
    kind = layout.kind(name)
    if kind is None or not layout.plain(name):
        return "not a name shardkit gives a file"
    if kind == "data":
        return None if name in records.named else "no manifest or journal of this dataset names it"
    if kind == "generation":
        g = int(layout.GENERATION_FILE.fullmatch(name).group(1))  # type: ignore[union-attr]
        if g in records.generations or (name in records.named and _manifest_or_gone(directory, name)):
            return None
        return "not a kept manifest of an older generation of this dataset"
    if kind == "index":
        g = int(layout.INDEX_FILE.fullmatch(name).group(1))  # type: ignore[union-attr]
        latest = records.latest
        if (latest is not None and g <= latest.generation) or name in records.named:
            return None
        return "no generation of this dataset has that number yet"
    if kind == "journal":
        return None if name in records.journals else "not an install journal"
    if kind == "partial":  # an atomic write's temporary (a 128-bit random name) of a name of the layout
        return None
    if kind == "staging":
        return _staging_owned(directory, name)
    if kind == "remote-staging":
        return None
    return f"the dataset's {kind}: never deleted"


def _staging_owned(directory: str, name: str) -> str | None:
    path = storage.store_for(directory).local_file()
    if path is None:
        return "a staging directory lives on a local disk"
    try:
        st = os.lstat(os.path.join(path, name))
    except FileNotFoundError:
        return None  # gone already: nothing to do
    except OSError as e:
        return f"cannot be looked at ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "a link, never followed"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    try:
        inside = os.listdir(os.path.join(path, name))
    except OSError as e:
        return f"cannot be listed ({e.strerror})"
    if not inside or layout.OWNER in inside or layout.JOB in inside:
        return None
    return "holds no record that shardkit made it"


def delete_owned(
    directory: str,
    names: Iterable[str],
    *,
    reason: str,
    records: Records | None = None,
    dry_run: bool = False,
) -> Deletion:
    """Delete each of ``names`` in the dataset ``directory`` that shardkit wrote; skip and name the rest.

    Args:
        directory: the dataset's path or URL.
        names: base names in it.
        reason: why they go, for the log (``"replaced by an overwrite"``).
        records: :func:`read_records` of ``directory``, when the caller read them (read here otherwise).
        dry_run: only say what would be deleted.

    Returns:
        What was deleted, the bytes freed, and each name left with the reason. A name that
        cannot be deleted (a directory where a file was expected, a denied permission) is
        skipped, never raised: the rest still go.
    """
    records = read_records(directory) if records is None else records
    done = Deletion()
    local = storage.store_for(directory).local_file()
    for name in names:
        problem = why_not(directory, name, records)
        if problem is None:
            try:
                freed = _delete(directory, local, name, dry_run, records)
            except (ShardkitError, OSError) as e:
                problem = f"could not be deleted: {e}"
            else:
                if freed is not None:
                    done.deleted.append(name)
                    done.freed += freed
                    if not dry_run:
                        log.info("%s: deleted %s (%s)", directory, name, reason)
                continue
        done.skipped.append((name, problem))
        log.warning("%s: left %s in place (%s): %s", directory, name, reason, problem)
    return done


def _delete(directory: str, local: str | None, name: str, dry_run: bool, records: Records) -> int | None:
    """Delete one owned name; its bytes, or None when it was not there."""
    if local is None:
        url = storage.join(directory, name)
        try:
            size = storage.size(url)
        except DatasetNotFoundError:  # any other failure is not an answer: the name stays for the next job
            return None
        _check_size(name, size, records)
        if not dry_run:
            storage.remove(url)
        return size
    path = os.path.join(local, name)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        if layout.kind(name) != "staging":
            raise StorageError(f"{path}: is a directory, expected a file", url=path)
        size = _tree_size(path)
        if not dry_run:
            remove_tree(path)
        return size
    _check_size(name, st.st_size, records)
    if not dry_run:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return st.st_size


def _check_size(name: str, size: int, records: Records) -> None:
    recorded = records.sizes.get(name)
    if recorded is not None and recorded != size:
        raise StorageError(f"{name}: holds {size} bytes, the manifest naming it records {recorded}: not the file shardkit wrote")


def _tree_size(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):  # os.walk follows no link to a directory
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def remove_made(directory: str | None) -> bool:
    """Remove again the output directory a job created (``directory``, as
    :func:`shardkit.storage.makedirs` returned it; None: it made none) when it published nothing,
    only while it is empty (``rmdir``, which removes nothing else and follows no link): a file
    that appeared in it meanwhile (another process's, a pass 1's staging kept for a resume) keeps
    it. Never raises: the job's own error is the one to see. Returns whether it was removed."""
    if directory is None:
        return False
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        return False  # gone already
    except OSError as e:
        log.debug("%s: left in place (%s): it holds what this job did not leave", directory, e.strerror)
        return False
    log.info("%s: removed, as the job that made it published nothing", directory)
    return True
