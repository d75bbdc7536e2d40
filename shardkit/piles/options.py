"""How pass 1 writes piles: one frozen value shared by the Python API, the CLI and YAML jobs.

opts = PileOptions(piles=64, max_pile_bytes="2GiB")
shardkit.preprocess(units, fn, "out/", options=opts)
"""

from __future__ import annotations

from dataclasses import dataclass

from shardkit._util import check_int, parse_size
from shardkit.errors import ConfigError
from shardkit.tar.scan import BLOCK

# the smallest pile that holds a sample: one 512-byte header (empty data) and the trailer
MIN_PILE_BYTES = 3 * BLOCK


@dataclass(frozen=True, kw_only=True)
class PileOptions:
    """How pass 1 writes piles; shared by :class:`PileWriter`, :func:`preprocess` and YAML jobs.

    Args:
        piles: number of piles M (expected pile size n/M; see the README on choosing M).
        seed: seeds the router; the same inputs and seed give byte-identical piles.
        max_pile_bytes: the pile size to stay under (int or ``"2GiB"``), so piles fit the
            loader's memory. It is enforced through sample counts, which keeps the first epoch
            exactly uniform: a pile holding more samples than 90% of it fits at the dataset's
            mean sample size is split into random sub-piles. With very uneven sample sizes a
            pile can end up above it: it is logged and listed in the manifest's
            ``extra["over_max_pile_bytes"]``, and ``shardkit info`` shows the largest pile. A
            single sample larger than it is a ``SampleError`` when written. At least 1536.
        buffer_size: bytes buffered in memory before part files are appended to.
        overwrite: replace a dataset already in the output directory.
    """

    piles: int
    seed: int = 0
    max_pile_bytes: int | str | None = None
    buffer_size: int | str = "64MiB"
    overwrite: bool = False

    def __post_init__(self) -> None:
        check_int("piles", self.piles, low=1)
        check_int("seed", self.seed, low=0)
        if self.max_pile_bytes is not None:
            limit = parse_size(self.max_pile_bytes, what="max_pile_bytes")
            if limit < MIN_PILE_BYTES:
                raise ConfigError(
                    f"max_pile_bytes: expected at least {MIN_PILE_BYTES} bytes (a member header and the end-of-archive marker), got {limit}"
                )
            object.__setattr__(self, "max_pile_bytes", limit)
        object.__setattr__(self, "buffer_size", parse_size(self.buffer_size, what="buffer_size"))

    @property
    def max_bytes(self) -> int | None:
        return self.max_pile_bytes  # type: ignore[return-value]
