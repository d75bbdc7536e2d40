"""A dataset directory's own rules: its file names (:mod:`~shardkit.dataset.layout`), the one path that deletes them (:mod:`~shardkit.dataset.owned`), staging (:mod:`~shardkit.dataset.staging`).

It sits above ``storage/`` and ``tar/`` and below ``piles/``, ``loading/``, ``tools/`` and
``cli/``. The layout says what each name in a dataset directory is; :func:`~shardkit.dataset.owned.delete_owned`
deletes a name only when the layout gives it a form shardkit writes and a record shardkit wrote
(a manifest, an install journal, a staging directory's owner record) names it. This package
imports nothing on load, so :mod:`shardkit.manifest` can take its names from the layout.
"""
