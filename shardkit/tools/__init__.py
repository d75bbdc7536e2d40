"""Tools around a dataset: describe it, verify it, measure its shuffle, and the demo.

:mod:`~shardkit.tools.audit` (``info`` and ``verify``), :mod:`~shardkit.tools.quality` (shuffle
metrics next to their uniform expectations), :mod:`~shardkit.tools.orders` (the reference
orders: sequential, WebDataset's buffer shuffle), :mod:`~shardkit.tools.compare` (the loader's
own order against them), :mod:`~shardkit.tools.report` and :mod:`~shardkit.tools.plot` (showing
the result), :mod:`~shardkit.tools.demo` (``shardkit demo``), :mod:`~shardkit.tools.garbage_collect` (deleting
the files of generations a growing dataset no longer lists), :mod:`~shardkit.tools.export` (a
dataset back to Parquet). They read datasets through
:mod:`shardkit.loading` and write them through :mod:`shardkit.piles`, never around them.
"""

from __future__ import annotations

from shardkit.tools.audit import DatasetInfo, Problem, info, verify
from shardkit.tools.compare import compare_shuffles
from shardkit.tools.garbage_collect import GcReport, gc
from shardkit.tools.report import QualityReport

__all__ = ["DatasetInfo", "GcReport", "Problem", "QualityReport", "compare_shuffles", "gc", "info", "verify"]
