"""Pass 2 of the shuffle, in the training loader: each epoch's order planned, piles read ahead.

The data flow, one module a step: :mod:`~shardkit.loading.plan` computes the epoch's order (a
pure function of seed, epoch and pile counts; ranks and workers take contiguous slices);
:mod:`~shardkit.loading.source` resolves what is read into piles; :mod:`~shardkit.loading.pile`
reads one pile, checked against its manifest entry; :mod:`~shardkit.loading.prefetch` reads the
next piles in a background thread; :mod:`~shardkit.loading.decode` and
:mod:`~shardkit.loading.batch` turn raw samples into what is yielded, here or in worker
processes; :mod:`~shardkit.loading.loader` puts it together, with :mod:`~shardkit.loading.on_error`
(skip or raise) and :mod:`~shardkit.loading.state` (exact resume). :mod:`~shardkit.loading.torch`
adapts it to PyTorch's DataLoader. Blends of several datasets: :mod:`~shardkit.loading.blend_spec`
(what is asked), :mod:`~shardkit.loading.blend` (the pure schedule of sources),
:mod:`~shardkit.loading.blend_source` (the sources as one list of piles, and each epoch's shape),
:mod:`~shardkit.loading.blend_schedule` (what a rank reads of an epoch) and
:mod:`~shardkit.loading.blend_loader` (the loader, and ``loader()``, which takes one dataset or a blend).
"""

from __future__ import annotations

from shardkit.loading.blend_loader import BlendLoader, loader
from shardkit.loading.blend_spec import Blend, BlendSource
from shardkit.loading.loader import Loader
from shardkit.loading.options import LoaderOptions

__all__ = ["Blend", "BlendLoader", "BlendSource", "Loader", "LoaderOptions", "loader"]
