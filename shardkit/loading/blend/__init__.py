"""Blends: several datasets read as one, each through its own epoch plan, mixed per batch.

:mod:`~shardkit.loading.blend.spec` says what a blend asks for (its sources and their shares),
:mod:`~shardkit.loading.blend.frames` which source fills each position of an epoch (pure),
:mod:`~shardkit.loading.blend.source` the sources as one list of piles and each epoch's shape,
:mod:`~shardkit.loading.blend.schedule` what one rank reads of an epoch, and
:mod:`~shardkit.loading.blend.loader` the loader over a blend and ``loader()``, which takes one
dataset or a blend.
"""
