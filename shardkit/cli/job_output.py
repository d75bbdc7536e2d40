"""What stops a YAML job at its output before any work, said in the job file's words.

The run refuses the same outputs (:mod:`shardkit.dataset.lock`, :mod:`shardkit.piles.resume`),
but in the words of the Python keywords and the flags (``overwrite=True (--overwrite)``), which
``shardkit run`` does not have; ``--check`` finds them too.

    conflict = output_conflict(load_job("job.yaml"))   # "output.path: out: already holds ..." or None
"""

from __future__ import annotations

import os

from shardkit import manifest, storage
from shardkit.cli.jobs import DemoJob, Job, ShuffleJob
from shardkit.dataset import layout
from shardkit.dataset.owned import read_records
from shardkit.dataset.staging import read_job, staging_path
from shardkit.errors import ShardkitError
from shardkit.piles.commits import committed


def output_conflict(job: Job) -> str | None:
    """What stops ``job`` at its output before any work, in the job file's words, or None: a
    file where its folder goes, a dataset already there that the job would neither replace nor
    append to, files named as the job's would be but no dataset, or a stopped pass 1 it would
    neither resume nor discard."""
    if isinstance(job, DemoJob) or job.output is None:
        return None
    options, out = job.options, job.output
    local = storage.store_for(out).local_file()
    if local is not None and os.path.exists(local) and not os.path.isdir(local):
        return f"output.path: {out}: a file, not a folder: name the folder the dataset goes in"
    if options.overwrite:
        return None  # replaced
    if getattr(options, "mode", "create") == "append":  # added to: there must be a dataset
        try:
            storage.use([out], options.storage_options)
            there = manifest.is_dataset(out)
        except ShardkitError:
            return None  # an unreadable output: the run says what is wrong with it
        return None if there else f"output.path: {out}: no shardkit dataset to append to; drop 'mode: append' to write a new one"
    resume = getattr(options, "resume", False)
    try:
        storage.use([out], options.storage_options)  # an object store is looked at with the job's options
        there = manifest.is_dataset(out)
        stopped = None if isinstance(job, ShuffleJob) else staging_path(out)
        done = committed(stopped) if stopped is not None and not resume else {}
        stray = None if resume or there else _stray(job, out)
    except ShardkitError:
        return None  # an unreadable output: the run says what is wrong with it
    append = ", or 'mode: append' to add to it" if not isinstance(job, ShuffleJob) else ""
    if resume:  # a stopped job, published or not, is the run's to judge; a dataset alone is not resumed
        if not there or (stopped is not None and storage.exists(stopped)):
            return None
        return f"output.path: {out}: already holds a shardkit dataset and no stopped job to resume; set 'overwrite: true' under output to replace it{append}"
    if there:
        return f"output.path: {out}: already holds a shardkit dataset; set 'overwrite: true' under output to replace it{append}"
    if stray is not None:
        return (
            f"output.path: {out}: holds {stray} but no {manifest.MANIFEST}, so it is not a shardkit dataset; use an empty folder, "
            "or set 'overwrite: true' under output to write the dataset beside such files (they are left as they are)"
        )
    if done:
        units = sum(len(c.units) + len(c.failures) for c in done.values())
        total = (read_job(stopped) or {}).get("units", "?") if stopped is not None else "?"
        return (
            f"output.path: {out}: holds a stopped job ({units} of {total} input units done); "
            "set 'resume: true' to continue it, or 'overwrite: true' under output to discard it"
        )
    return None


def _stray(job: Job, out: str) -> str | None:
    """The first file in ``out``, which holds no dataset, named as the job's own files are
    (``pile-000000.tar``, ``shard-000000.tar``): the run takes no folder holding one. A file a dead
    job's journal names is left out: the run's claim removes it as a leftover first."""
    pattern = layout.SHARD_FILE if isinstance(job, ShuffleJob) else layout.PILE_FILE
    names = storage.listdir(out, missing_ok=True)
    named = read_records(out, names).named
    found = sorted(name for name in names if pattern.fullmatch(name) and name not in named)
    return found[0] if found else None
