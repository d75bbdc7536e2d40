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
from shardkit.option_fields import Door, check_bools, check_choices, meta
from shardkit.piles import key_prefix
from shardkit.piles.repeat import check_rule
from shardkit.storage import check_storage_options
from shardkit.tar.compression import check_compression, check_level
from shardkit.tar.scan import BLOCK

# the smallest pile that holds a sample: one 512-byte header (empty data) and the trailer
MIN_PILE_BYTES = 3 * BLOCK
# the most piles a dataset may have: each is a file, and each worker keeps a buffer per pile
MAX_PILES = 1_000_000
# the most worker processes (or Ray tasks at once) of a job
MAX_WORKERS = 1 << 14
# the most generations a window keeps: each is a manifest read when the dataset opens
MAX_WINDOW = 1_000_000


# what a failing input unit does (pass 1), and how keys of input shards are kept: listed once,
# read by validation, the CLI and YAML
ON_ERROR = ("raise", "skip")
KEY_PREFIX = key_prefix.KEY_PREFIX
# where the input units run: processes of this machine, or tasks of a Ray cluster
EXECUTORS = ("local", "ray")
# what a job does with the output: write a new dataset, or add a generation to the one there
MODES = ("create", "append")


def check_ray_address(address: Any, executor: str) -> None:
    """Refuse a Ray address that is not a non-empty string, or one given without ``executor="ray"``."""
    if address is not None and (not isinstance(address, str) or not address):
        raise ConfigError(f"ray_address: expected a Ray address ('auto', 'host:port', 'ray://host:10001') or None, got {address!r}")
    if address is not None and executor != "ray":
        raise ConfigError(f"ray_address: only used with executor='ray', got executor={executor!r}")


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
        overwrite: replace a dataset already in the output directory (and discard what an
            interrupted job left there).
        resume: continue a job that was interrupted (killed, Ctrl-C, a lost machine) from the
            parts it committed, processing only the units it had not finished; the result is
            byte-identical to an uninterrupted run. The inputs, ``fn`` and the options that
            change the bytes must be those of the interrupted job (checked). Without it, such
            leftovers are refused.
        workers: processes running the input units; the output is byte-identical for any number.
        on_error: ``"raise"`` stops the job at the first failing input unit; ``"skip"`` drops
            every sample of a failing unit, logs it and counts it in the manifest.
        storage_options: options for the object store of every ``s3://``... URL the job reads
            or writes, given to fsspec as they are (``{"endpoint_url": ..., "anon": True}``);
            without them the store's usual environment applies (``AWS_ENDPOINT_URL``,
            ``AWS_PROFILE``...). Never written, logged or shown.
        compression: ``"zstd"``, ``"gzip"`` or ``"lz4"`` compresses each pile whole as it is
            assembled (``pile-000000.tar.zst``, ``.tar.gz``, ``.tar.lz4``: still readable by
            ``tar`` and ``tarfile``, and gzip by webdataset); None writes plain tars. The loader
            decompresses in its prefetch thread: lz4 reads fastest, zstd is smallest.
        compression_level: the codec's level (zstd 1-22, gzip 1-9, lz4 0-16); None: the codec's
            default (zstd 3, gzip 6, lz4 0, chosen by ``benchmarks/compression.py``).
        key_prefix: how the keys of input shards are kept (:func:`pile` and what runs on it;
            :func:`preprocess` takes keys from its function and refuses ``"unit"``). ``"unit"``
            prefixes each key with its input shard's name (``train-000003/000017``); ``"none"``
            keeps the keys; ``"auto"`` (default) reads the first key of every input shard and
            prefixes every key when two shards start with the same one (shards whose keys
            restart at ``000000``, as most writers number them), recording it in the manifest's
            ``extra["key_prefix"]`` (see :mod:`shardkit.piles.key_prefix`).
        executor: ``"local"`` runs the units in ``workers`` processes here; ``"ray"`` runs them
            as Ray tasks (``pip install 'shardkit[ray]'``), the output byte-identical either way.
        repeat: oversampling at pile creation: ``repeat(sample) -> int`` copies of each sample
            (0 drops it), each routed to its own uniformly drawn pile, copy i keyed
            ``f"{key}_r{i}"``; or ``{"field": "cls", "counts": {"3": 4}, "default": 1}``, or its
            text form ``"cls:3=4"``, to repeat by a field's value. The manifest records the
            rule and how many samples got each count (``extra["repeat"]``).
        ray_address: the Ray cluster to use with ``executor="ray"``: None starts a Ray on this
            machine for the job (or uses the session the process has open, or the cluster
            ``RAY_ADDRESS`` names); ``"auto"`` (the cluster ``ray start`` made here),
            ``"host:port"`` or ``"ray://host:10001"`` connects.
        mode: ``"create"`` writes a new dataset; ``"append"`` adds the samples to the dataset
            in the output as its next generation: each sample goes to one of its M piles drawn
            at random, as a new segment file, and a new manifest is published (see the README,
            "Growing datasets"). ``piles`` and ``seed`` must be the dataset's; with
            ``max_pile_bytes`` (pass the dataset's), piles grown past it are split into random
            leaves, rewriting only what is not already fine enough.
        window: with ``mode="append"``, keep only the last ``window`` generations (an int), or
            the generations written in the last ``window`` (``"90d"``, ``"12h"``): older ones
            leave the manifest in the same update (``shardkit gc`` deletes their files later).
        index: write the dataset's random-access index (``shardkit.gNNNNNN.idx``, what
            ``shardkit.open`` builds otherwise; off by default: it adds CPU to pass 1) right after the manifest goes in, from the
            piles' staged copies (no pile is read back from the output, an object store
            included): the loader then starts its first pile by ranges, and the first sample
            comes without reading a whole pile (see docs/loader-speed.md). The piles are the
            same bytes either way. An append takes the entries of the files it keeps from the
            index of the generation it starts from, and writes none where that has none.

    ``workers``, ``on_error``, ``key_prefix``, ``executor``, ``ray_address``, ``resume`` and ``repeat`` describe a job over input units:
    :class:`PileWriter` writes in the calling process and refuses values other than the defaults.

    Example:
        opts = PileOptions(piles=64, max_pile_bytes="2GiB", workers=8)
        shardkit.preprocess(units, fn, "out/", options=opts)
        shardkit.pile("src/*.tar", "piles/", options=dataclasses.replace(opts, key_prefix="unit"))
    """

    piles: int = field(
        metadata=meta(help="number of pile shards to write (expected pile size n/M)", metavar="M", yaml="output", group="piles")
    )
    seed: int = field(
        default=0,
        metadata=meta(help="router seed: same inputs and seed give byte-identical piles", metavar="S", yaml="output", group="piles"),
    )
    max_pile_bytes: int | str | None = field(
        default=None,
        metadata=meta(help="split piles larger than SIZE (e.g. 2GiB) into random sub-piles", metavar="SIZE", yaml="output", group="piles"),
    )
    buffer_size: int | str = field(
        default="64MiB",
        metadata=meta(help="bytes buffered in memory before part files are written", metavar="SIZE", yaml="output", group="piles"),
    )
    overwrite: bool = field(
        default=False, metadata=meta(help="replace a dataset already in the output directory", yaml="output", group="output")
    )
    resume: bool = field(
        default=False,
        metadata=meta(
            help="continue an interrupted job from the parts it committed; the inputs, fn and options must be the same",
            yaml="job",
            group="recovery",
        ),
    )
    workers: int = field(
        default=1, metadata=meta(help="worker processes; the output is identical for any number", metavar="N", yaml="job", group="executor")
    )
    on_error: str = field(
        default="raise",
        metadata=meta(
            help="what a failing input unit does: raise stops the job, skip drops the unit and counts it",
            choices=ON_ERROR,
            yaml="job",
            group="recovery",
        ),
    )
    key_prefix: str = field(
        default="auto",
        metadata=meta(
            help="unit: prefix each key with its input shard's name (train-000003/000017); none: keep the keys; auto: prefix "
            "them when two input shards start with the same key (keys that restart at 000000 in every shard)",
            choices=KEY_PREFIX,
            yaml="job",
            group="samples",
        ),
    )
    executor: str = field(
        default="local",
        metadata=meta(
            help="where input units run: local worker processes, or ray tasks (pip install 'shardkit[ray]'); the output is identical",
            choices=EXECUTORS,
            yaml="job",
            group="executor",
        ),
    )
    ray_address: str | None = field(
        default=None,
        metadata=meta(
            help="with --executor ray: the cluster to connect to (auto, host:port, ray://host:10001); default: a Ray on this machine",
            metavar="ADDR",
            yaml="job",
            group="executor",
        ),
    )

    repeat: Any = field(
        default=None,
        metadata=meta(
            help="oversample at pile creation: copies of each sample by a field's value, FIELD:VALUE=N,... "
            "(cls:3=4,7=2; *=N sets the rest), each copy routed to its own pile as KEY_r1, KEY_r2...",
            metavar="RULE",
            yaml="job",
            group="samples",
        ),
    )

    compression: str | None = field(
        default=None,
        metadata=meta(
            help="compress each pile whole: zstd (pile-000000.tar.zst), gzip (.tar.gz) or lz4 (.tar.lz4, the fastest to write); default: plain tar",
            metavar="CODEC",
            yaml="output",
            group="compression",
        ),
    )
    compression_level: int | None = field(
        default=None,
        metadata=meta(
            help="the codec's level (zstd 1-22, default 3; gzip 1-9, default 6; lz4 0-16, default 0)",
            metavar="L",
            yaml="output",
            group="compression",
        ),
    )

    mode: str = field(
        default="create",
        metadata=meta(
            help="create a new dataset, or append a generation to the one in the output", choices=MODES, yaml="output", group="growth"
        ),
    )
    window: int | str | None = field(
        default=None,
        metadata=meta(
            help="with mode append: keep the last K generations (an integer) or those of the last DURATION (90d, 12h)",
            metavar="K|DURATION",
            yaml="output",
            group="growth",
        ),
    )

    index: bool = field(
        default=False,
        metadata=meta(
            help="write the random-access index (shardkit.gNNNNNN.idx) from the staged piles as the dataset is published, "
            "so the loader's first sample comes without reading a whole pile",
            yaml="output",
            group="output",
        ),
    )

    storage_options: Mapping[str, Any] | None = field(
        default=None,
        repr=False,  # may hold secrets
        metadata=meta(
            help="options for the object store (endpoint_url, key, secret, anon...), given to fsspec as they are",
            yaml="job",
            group="storage",
        ),
    )

    def __post_init__(self) -> None:
        check_storage_options(self.storage_options)
        check_int("piles", self.piles, low=1)
        check_most("piles", self.piles, MAX_PILES, "each is a file")
        check_int("seed", self.seed, low=0)
        check_int("workers", self.workers, low=1)
        check_most("workers", self.workers, MAX_WORKERS, "each is a process or a Ray task at once")
        check_choices(self)
        check_ray_address(self.ray_address, self.executor)
        check_bools(self)
        object.__setattr__(self, "repeat", check_rule(self.repeat))
        check_compression(self.compression)
        check_level(self.compression, self.compression_level)
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
            check_int("window", window, low=1, high=MAX_WINDOW)
        elif isinstance(window, float):  # 2.0 read as 2 seconds would retire every generation but the new one
            raise ConfigError(
                f"window: expected a number of generations (an integer) or a duration with its unit ('7d', '12h'), got {window!r}"
            )
        else:
            parse_duration(window, what="window")
        object.__setattr__(self, "window", window)

    @property
    def max_bytes(self) -> int | None:
        return self.max_pile_bytes  # type: ignore[return-value]

    @property
    def level(self) -> int | None:
        """The compression level in effect: ``compression_level``, or the codec's default."""
        return check_level(self.compression, self.compression_level)


# the options that describe a job over input units (worker processes, skipping units, keys of input
# shards): a PileWriter writes in the calling process and takes none of them
JOB_ONLY = ("workers", "on_error", "key_prefix", "executor", "ray_address", "resume", "repeat")

# the options each entry point takes as keywords: every field, less those it has no use for
PILE = Door(PileOptions)
PREPROCESS = Door(PileOptions, exclude=("key_prefix",))  # its keys come from its function
WRITER = Door(PileOptions, exclude=JOB_ONLY)
REPILE = Door(
    PileOptions,
    exclude=("buffer_size", "on_error", "key_prefix", "repeat", "mode", "window"),  # it reads one dataset whole into a new one
    defaults={"piles": None, "seed": None},
    docs={
        "piles": "M of the new dataset (default: the M of ``src``).",
        "seed": "the new router seed (default: the source's seed + 1); must differ from the one ``src`` was written with.",
    },
)
