"""A dataset directory's life: its names, its one writer, its transaction, install, leftovers and deletes.

:mod:`~shardkit.dataset.layout` says what each name in a dataset directory is;
:mod:`~shardkit.dataset.transaction` holds the :class:`~shardkit.dataset.transaction.Dataset`
(manifests, pinned generations, leftovers) and the transaction every writer and gc runs in, built
on :mod:`~shardkit.dataset.lock` (one writer), :mod:`~shardkit.dataset.staging`,
:mod:`~shardkit.dataset.install` (the journal, the install, manifest last) and
:mod:`~shardkit.dataset.leftovers` (what dead jobs leave); :func:`~shardkit.dataset.owned.delete_owned`
deletes a name only when the layout gives it a form shardkit writes and a record shardkit wrote
(a manifest, an install journal, a staging directory's owner record) names it.
:mod:`~shardkit.dataset.file_checks` checks a data file's bytes against its manifest entry.

It sits above ``storage/`` and ``tar/`` and below ``piles/``, ``loading/``, ``tools/`` and
``cli/``. This package imports nothing on load, so :mod:`shardkit.manifest` can take its names
from the layout.
"""
