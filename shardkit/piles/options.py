"""How pass 1 writes piles: one frozen value shared by the Python API, the CLI and YAML jobs.

opts = PileOptions(piles=64, max_pile_bytes="2GiB", workers=8)
shardkit.preprocess(units, fn, "out/", options=opts)   # the same as the keyword form
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardkit._util import check_int, check_most, parse_duration, parse_size
from shardkit.errors import ConfigError
from shardkit.options import check_bools, check_choices, meta
from shardkit.storage import check_storage_options
from shardkit.tar.scan import BLOCK

# the smallest pile that holds a sample: one 512-byte header (empty data) and the trailer
MIN_PILE_BYTES = 3 * BLOCK
# the most piles a dataset may have: each is a file, and each worker keeps a buffer per pile
MAX_PILES = 1_000_000


# what a failing input unit does (pass 1), and how keys of input shards are kept: listed once,
# read by validation, the CLI and YAML
ON_ERROR = ("raise", "skip")
KEY_PREFIX = ("none", "unit")
# where the input units run: processes of this machine, or tasks of a Ray cluster
EXECUTORS = ("local", "ray")
# what a job does with the output: write a new dataset, or add a generation to the one there
MODES = ("create", "append")


@dataclass(frozen=True, kw_only=True)
class PileOptions:
    """How pass 1 writes piles; shared by :func:`preprocess`, :func:`pile`, :class:`PileWriter`, the CLI and YAML.

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
        buffer_size: bytes buffered in memory before part files are appended to (the total
            across workers).
        overwrite: replace a dataset already in the output directory.
        workers: processes running the input units; the output is byte-identical for any number.
        on_error: ``"raise"`` stops the job at the first failing input unit; ``"skip"`` drops
            every sample of a failing unit, logs it and counts it in the manifest.
        storage_options: options for the object store of every ``s3://``... URL the job reads
            or writes, given to fsspec as they are (``{"endpoint_url": ..., "anon": True}``);
            without them the store's usual environment applies (``AWS_ENDPOINT_URL``,
            ``AWS_PROFILE``...). Never written, logged or shown.
        key_prefix: ``"unit"`` prefixes each key with its input shard's name, for shards whose
            keys restart at ``000000`` (:func:`pile` and what runs on it; :func:`preprocess`
            takes keys from its function and refuses it); ``"none"`` keeps the keys.
        executor: ``"local"`` runs the units in ``workers`` processes here; ``"ray"`` runs them
            as Ray tasks (``pip install 'shardkit[ray]'``), the output byte-identical either way.
        ray_address: the Ray cluster to use with ``executor="ray"``: None starts (or reuses) a
            Ray on this machine; ``"auto"``, ``"host:port"`` or ``"ray://host:10001"`` connects.
        mode: ``"create"`` writes a new dataset; ``"append"`` adds the samples to the dataset
            in the output as its next generation: each sample goes to one of its M piles drawn
            at random, as a new segment file, and a new manifest is published (see the README,
            "Growing datasets"). ``piles`` and ``seed`` must be the dataset's.
        window: with ``mode="append"``, keep only the last ``window`` generations (an int), or
            the generations written in the last ``window`` (``"90d"``, ``"12h"``): older ones
            leave the manifest in the same update (``shardkit gc`` deletes their files later).

    ``workers``, ``on_error``, ``key_prefix``, ``executor`` and ``ray_address`` describe a job over input units:
    :class:`PileWriter` writes in the calling process and refuses values other than the defaults.

    Example:
        opts = PileOptions(piles=64, max_pile_bytes="2GiB", workers=8)
        shardkit.preprocess(units, fn, "out/", options=opts)
        shardkit.pile("src/*.tar", "piles/", options=dataclasses.replace(opts, key_prefix="unit"))
    """

    piles: int = field(metadata=meta(help="number of pile shards to write (expected pile size n/M)", metavar="M", yaml="output"))
    seed: int = field(
        default=0, metadata=meta(help="router seed: same inputs and seed give byte-identical piles", metavar="S", yaml="output")
    )
    max_pile_bytes: int | str | None = field(
        default=None, metadata=meta(help="split piles larger than SIZE (e.g. 2GiB) into random sub-piles", metavar="SIZE", yaml="output")
    )
    buffer_size: int | str = field(
        default="64MiB", metadata=meta(help="bytes buffered in memory before part files are written", metavar="SIZE", yaml="output")
    )
    overwrite: bool = field(default=False, metadata=meta(help="replace a dataset already in the output directory", yaml="output"))
    workers: int = field(default=1, metadata=meta(help="worker processes; the output is identical for any number", metavar="N", yaml="job"))
    on_error: str = field(
        default="raise",
        metadata=meta(
            help="what a failing input unit does: raise stops the job, skip drops the unit and counts it", choices=ON_ERROR, yaml="job"
        ),
    )
    key_prefix: str = field(
        default="none",
        metadata=meta(
            help="'unit': prefix each key with its input shard's name (train-000003/000017), for shards whose keys restart "
            "at 000000; keys must be unique across inputs",
            choices=KEY_PREFIX,
        ),
    )
    executor: str = field(
        default="local",
        metadata=meta(
            help="where input units run: local worker processes, or ray tasks (pip install 'shardkit[ray]'); the output is identical",
            choices=EXECUTORS,
            yaml="job",
        ),
    )
    ray_address: str | None = field(
        default=None,
        metadata=meta(
            help="with --executor ray: the cluster to connect to (auto, host:port, ray://host:10001); default: a Ray on this machine",
            metavar="ADDR",
            yaml="job",
        ),
    )

    mode: str = field(
        default="create",
        metadata=meta(help="create a new dataset, or append a generation to the one in the output", choices=MODES, yaml="output"),
    )
    window: int | str | None = field(
        default=None,
        metadata=meta(
            help="with mode append: keep the last K generations (an integer) or those of the last DURATION (90d, 12h)",
            metavar="K|DURATION",
            yaml="output",
        ),
    )

    storage_options: Mapping[str, Any] | None = field(
        default=None,
        repr=False,  # may hold secrets
        metadata=meta(help="options for the object store (endpoint_url, key, secret, anon...), given to fsspec as they are", yaml="job"),
    )

    def __post_init__(self) -> None:
        check_storage_options(self.storage_options)
        check_int("piles", self.piles, low=1)
        check_most("piles", self.piles, MAX_PILES, "each is a file")
        check_int("seed", self.seed, low=0)
        check_int("workers", self.workers, low=1)
        check_choices(self)
        if self.ray_address is not None and (not isinstance(self.ray_address, str) or not self.ray_address):
            raise ConfigError(
                f"ray_address: expected a Ray address ('auto', 'host:port', 'ray://host:10001') or None, got {self.ray_address!r}"
            )
        if self.ray_address is not None and self.executor != "ray":
            raise ConfigError(f"ray_address: only used with executor='ray', got executor={self.executor!r}")
        check_bools(self)
        if self.max_pile_bytes is not None:
            limit = parse_size(self.max_pile_bytes, what="max_pile_bytes")
            if limit < MIN_PILE_BYTES:
                raise ConfigError(
                    f"max_pile_bytes: expected at least {MIN_PILE_BYTES} bytes (a member header and the end-of-archive marker), got {limit}"
                )
            object.__setattr__(self, "max_pile_bytes", limit)
        object.__setattr__(self, "buffer_size", parse_size(self.buffer_size, what="buffer_size"))
        self._check_window()

    def _check_window(self) -> None:
        if self.mode == "append" and self.overwrite:
            raise ConfigError("overwrite: mode='append' adds to the dataset in the output; it cannot also replace it")
        window = self.window
        if window is None:
            return
        if self.mode != "append":
            raise ConfigError(f"window: only used with mode='append' (it retires old generations), got mode={self.mode!r}")
        if isinstance(window, str) and window.strip().isdigit():
            window = int(window)  # from the command line or YAML
        if isinstance(window, int) and not isinstance(window, bool):
            check_int("window", window, low=1)
        else:
            parse_duration(window, what="window")
        object.__setattr__(self, "window", window)

    @property
    def max_bytes(self) -> int | None:
        return self.max_pile_bytes  # type: ignore[return-value]
