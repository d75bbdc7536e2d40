"""Advice on the number of piles M: the warnings for very many pile files and for more piles than samples.

Pure: each returns the sentence to log, or None; the writer and the jobs log it at WARNING.

    if (advice := too_many_piles(options.piles, "out/")) is not None:
        log.warning(advice)
"""

from __future__ import annotations

import math

from shardkit._util import format_size
from shardkit.manifest import Manifest
from shardkit.tar.write import TRAILER

# above this, a pile count is far more files than a dataset usually needs
MANY_PILES = 100_000
# the loader memory a suggested M is sized for, as `shardkit shuffle` sizes its piles by default
_SUGGESTED_MEMORY = 1 << 30

_RULE = "pick the smallest M for which two piles of s + 6 sqrt(s) samples (s = n/M) fit in the memory the loader may use (docs/concepts.md, 'Choosing M')"


def too_many_piles(piles: int, where: str) -> str | None:
    """The warning for asking more than :data:`MANY_PILES` piles (one file each, empty or not)."""
    if piles <= MANY_PILES:
        return None
    return (
        f"{where}: piles={piles:,} writes {piles:,} pile files (pile-000000.tar ..., every pile a file even when empty). "
        f"Each is a file to open, and later epochs batch pile-mates together again up to about M times more often than "
        f"fresh shuffles: {_RULE}; that is rarely more than a few thousand"
    )


def sparse_piles(manifest: Manifest, piles: int, where: str) -> str | None:
    """The warning for a finished pass 1 that had more piles (``piles``, before any split) than samples."""
    n = manifest.samples
    if piles <= max(n, 1):
        return None
    empty = sum(p.samples == 0 for p in manifest.piles)
    data = sum(p.tar_size - len(TRAILER) for p in manifest.piles if p.samples)  # an empty pile is only a trailer
    suggested = max(1, min(n, math.ceil(2 * data / _SUGGESTED_MEMORY)))
    others = " and most others hold one sample" if empty < len(manifest.piles) else ""
    return (
        f"{where}: {n:,} samples in {piles:,} piles: {empty:,} piles are empty{others}, "
        f"each pile its own file for a loader to open. Larger piles read faster and give the same exactly uniform "
        f"first epoch: {_RULE}. These {format_size(data)} of samples fit in piles={suggested:,} for a loader given "
        f"{format_size(_SUGGESTED_MEMORY)}"
    )
