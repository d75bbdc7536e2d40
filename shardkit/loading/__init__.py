"""Pass 2 of the shuffle, in the training loader: each epoch's order planned, piles read ahead.

The data flow, one module a step: :mod:`~shardkit.loading.plan` computes the epoch's order (a
pure function of seed, epoch and pile counts; ranks and workers take contiguous slices);
:mod:`~shardkit.loading.source` resolves what is read into piles; :mod:`~shardkit.loading.pile`
reads one pile, checked against its manifest entry; :mod:`~shardkit.loading.prefetch` reads the
next piles in a background thread; :mod:`~shardkit.loading.decode` and
:mod:`~shardkit.loading.batch` turn raw samples into what is yielded, here or in worker
processes; :mod:`~shardkit.loading.loader` puts it together, with :mod:`~shardkit.loading.on_error`
(skip or raise), :mod:`~shardkit.loading.position` (where a reader stands, to resume exactly) and
:mod:`~shardkit.loading.state` (a position as a state dict). :mod:`~shardkit.loading.torch`
adapts it to PyTorch's DataLoader. Blends of several datasets read as one live in
:mod:`~shardkit.loading.blend`.
"""

from __future__ import annotations

from shardkit.loading.blend.loader import BlendLoader, loader
from shardkit.loading.blend.spec import Blend, BlendSource
from shardkit.loading.loader import Loader
from shardkit.loading.options import LoaderOptions

__all__ = ["Blend", "BlendLoader", "BlendSource", "Loader", "LoaderOptions", "loader"]
