"""Progress bars for long jobs: tqdm on stderr, off when it is not a TTY or when asked."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm


def bar(*, total: int | None, desc: str, unit: str, quiet: bool = False, **kwargs: Any) -> tqdm:
    """A tqdm bar that is silent when ``quiet`` or when stderr is not a terminal."""
    disable = quiet or not sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, disable=disable, dynamic_ncols=True, file=sys.stderr, **kwargs)
