"""The commands that write a dataset: ``pile``, ``plan`` (its dry run), ``shuffle``, ``repile``, ``run`` and ``demo``."""

from __future__ import annotations

import argparse
import logging
import math
import time
from typing import Any

from shardkit.cli.command import VERBOSE, VERBOSE_ONLY, Command, Options, arg, quiet
from shardkit.cli.flags import PILE_FLAGS, add_pile_args, option_values, options_from_args
from shardkit.eager_shuffle import SHUFFLE as SHUFFLE_DOOR
from shardkit.eager_shuffle import ShuffleOptions
from shardkit.errors import ConfigError
from shardkit.piles.options import PILE as PILE_DOOR
from shardkit.piles.options import REPILE as REPILE_DOOR
from shardkit.piles.options import PileOptions

log = logging.getLogger(__name__)

# --- pile: re-pile existing WebDataset shards -------------------------------------------------

# `shardkit pile` takes every option of shardkit.pile: the scripts' flags (add_pile_args) and the
# rest; storage options come from --storage-option, which every command takes
PILE_COMMAND_FLAGS = tuple(name for name in PILE_DOOR.names if name != "storage_options")


def _reader_flags(parser: argparse.ArgumentParser) -> None:
    """--format and --reader-arg: inputs other than tar shards (Parquet, Arrow, Hugging Face, MDS, litdata, CSV)."""
    from shardkit.piles.readers import READERS, SHARDS

    parser.add_argument(
        "--format",
        default=None,
        choices=[*READERS, *SHARDS],
        help="the inputs' format; default: from their suffixes (.parquet .arrow .feather .csv .tsv .tar) or, for a folder, "
        "what wrote it (save_to_disk, MDS, litdata)",
    )
    parser.add_argument(
        "--reader-arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an argument of the format's reader, the value read as YAML: --reader-arg 'fields={image: jpg}' --reader-arg key=id",
    )


def _reader(args: argparse.Namespace) -> Any:
    """The format ``--format`` and ``--reader-arg`` ask for: a name, a reader object, or None (detect)."""
    if not args.reader_arg:
        return args.format
    from shardkit.cli.schema import reader_args
    from shardkit.errors import ConfigError
    from shardkit.piles import readers

    name = args.format or readers.detect(args.inputs[0])
    if name is None or name in readers.SHARDS:
        raise ConfigError("--reader-arg: tar shards take no reader arguments (name the inputs' format with --format)")
    return readers.make(name, **reader_args(args.reader_arg))


def _pile(args: argparse.Namespace) -> int:
    from shardkit._util import counted, format_size
    from shardkit.piles.preprocess import pile

    start = time.perf_counter()
    options = options_from_args(PileOptions, args, PILE_COMMAND_FLAGS)
    result = pile(args.inputs, args.out, options=options, quiet=args.quiet, format=_reader(args))
    skipped = f", {counted(result.skipped_units, 'input shard')} skipped" if result.skipped_units else ""
    split = f", {counted(result.split_piles, 'oversized pile')} split" if result.split_piles else ""
    generation = f", generation {result.generation}" if result.generation else ""
    print(
        f"{args.out}: {counted(result.samples, 'sample')} in {counted(len(result.piles), 'pile')}, {format_size(result.bytes)}, "
        f"{time.perf_counter() - start:.1f}s{skipped}{split}{generation}"
    )
    return 0


PILE = Command(
    name="pile",
    help="re-pile WebDataset tar shards into M random piles (pass 1 of the shuffle)",
    description=(
        "Copy every sample of the input tar shards into M pile shards, each sample to a pile\n"
        "drawn uniformly at random (seeded, never from the data), and write the shardkit.json\n"
        "manifest last. The loader then shuffles the piles lazily (pass 2). Samples are copied\n"
        "without decoding, field bytes unchanged; the piles are in shardkit's canonical tar form\n"
        "(plain ustar, fixed metadata, fields sorted) whatever wrote the inputs, and identical\n"
        "for any --workers."
    ),
    epilog="examples:\n  shardkit pile 'src/train-{000000..000099}.tar' -o piles/ --piles 256 --workers 8\n"
    "  shardkit pile 'data/train-*.parquet' -o piles/ --piles 256 --reader-arg 'fields={image: jpg}'",
    run=_pile,
    arguments=(
        arg(
            "inputs",
            nargs="+",
            metavar="INPUT",
            help="WebDataset tar shards (.tar, .tar.gz, .tar.zst, .tar.lz4): paths, file:// URLs, globs or brace patterns like "
            "'src-{000000..000019}.tar' (quote patterns so the shell leaves them alone); or Parquet, Arrow, CSV/TSV files, "
            "or folders save_to_disk, MDS or litdata wrote (see --format)",
        ),
        arg("-o", "--out", required=True, metavar="OUT", help="output directory for pile-*.tar and shardkit.json"),
        add_pile_args,
        Options(PileOptions, [name for name in PILE_COMMAND_FLAGS if name not in PILE_FLAGS]),
        _reader_flags,
        VERBOSE_ONLY,  # add_pile_args took --storage-option
    ),
)

# --- plan: what a pass-1 job costs at scale, without running it ------------------------------


def _count(text: str) -> int:
    """``1e9``, ``10**9`` written as 1e9, or ``1000000000``: a whole count."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count such as 1000 or 1e9, got {text!r}") from None
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"expected a whole count >= 1, got {text!r}")
    return int(value)


# what plan's simulation routes in reasonable time (a Python step a unit, numpy a sample)
SIMULATED_UNITS = 1_000_000
SIMULATED_SAMPLES = 10**11


def _run_plan(args: argparse.Namespace) -> int:
    from shardkit._util import bar, parse_size
    from shardkit.piles import scale

    shape = scale.Shape(
        samples=args.samples,
        units=args.units,
        piles=args.piles,
        sample_bytes=parse_size(args.sample_bytes, what="--sample-bytes"),
        executor=args.executor,
        workers=args.workers,
        remote=not args.local,
        max_pile_bytes=None if args.max_pile_bytes is None else parse_size(args.max_pile_bytes, what="--max-pile-bytes"),
    )
    # the limits pile itself holds to (piles, max_pile_bytes, workers), said as pile says them
    PileOptions(piles=shape.piles, max_pile_bytes=shape.max_pile_bytes, workers=shape.workers)
    if not args.no_simulate and (shape.units > SIMULATED_UNITS or shape.samples > SIMULATED_SAMPLES):
        raise ConfigError(
            f"--units {shape.units:,} and --samples {shape.samples:,}: routing every sample takes too long past "
            f"{SIMULATED_UNITS:,} units or {SIMULATED_SAMPLES:,} samples; pass --no-simulate for the formulas alone"
        )
    simulated = None
    if not args.no_simulate:
        with bar(total=shape.units, desc="routing", unit="unit", quiet=False) as progress:
            simulated = scale.simulate(shape, progress=progress.update)
    print(scale.format_plan(scale.plan(shape), simulated))
    return 0


PLAN = Command(
    name="plan",
    help="dry run of pass 1 at scale: files, objects, requests, fan-in and memory, nothing written",
    description=(
        "Print what a pass-1 job of the given shape costs: part files, objects and PUT requests\n"
        "(for an object-store output), the merge's fan-in, a task's buffer and the driver's memory,\n"
        "from formulas, and beside them the same counts from routing every sample with the real\n"
        "router (seeded by unit and ordinal). Nothing is read or written."
    ),
    epilog="example:\n  shardkit plan --samples 1e9 --units 1e4 --piles 1e4 --executor ray",
    run=_run_plan,
    arguments=(
        arg("--samples", type=_count, required=True, help="samples in the dataset (1e9 is fine)"),
        arg("--units", type=_count, required=True, help="input units (files, shards)"),
        arg("--piles", type=_count, required=True, help="piles M"),
        arg("--sample-bytes", default="4KiB", metavar="SIZE", help="mean bytes a sample (default 4KiB)"),
        arg("--executor", choices=("local", "ray"), default="local", help="local worker processes, or Ray tasks"),
        arg("--workers", type=_count, default=8, help="processes at once: local workers, or the Ray cluster's CPUs (default 8)"),
        arg("--max-pile-bytes", default=None, metavar="SIZE", help="split piles over SIZE, as pass 1 would"),
        arg("--local", action="store_true", help="the output is a local directory, not an object store"),
        arg("--no-simulate", action="store_true", help="formulas only (the simulation routes every sample)"),
    ),
)

# --- shuffle: the eager pass 2 ----------------------------------------------------------------

# every option of shardkit.shuffle is a flag of `shardkit shuffle`; storage options come from --storage-option
SHUFFLE_FLAGS = tuple(name for name in SHUFFLE_DOOR.names if name != "storage_options")


def _run_shuffle(args: argparse.Namespace) -> int:
    from shardkit._util import counted
    from shardkit.eager_shuffle import shuffle

    m = shuffle(args.inputs, args.out, options=options_from_args(ShuffleOptions, args, SHUFFLE_FLAGS), quiet=args.quiet)
    if not args.quiet:
        names = m.piles[0].name if len(m.piles) == 1 else f"{m.piles[0].name} ... {m.piles[-1].name}"
        print(
            f"{args.out}: {counted(m.samples, 'sample', grouped=True)} in {counted(len(m.piles), 'shard')} ({names}), "
            f"via {counted(m.extra['piles'], 'pile')}"
        )
    return 0


SHUFFLE = Command(
    name="shuffle",
    help="shuffle existing WebDataset shards into new shards in uniformly random order",
    description="The eager pass 2: re-pile INPUT shards into temporary piles, shuffle each pile in memory and write "
    "fixed-size shards OUT/shard-000000.tar ... that any WebDataset reader reads in uniformly random order.",
    run=_run_shuffle,
    arguments=(
        arg("inputs", nargs="+", metavar="INPUT", help="input shards: paths, globs or brace patterns (src-{000000..000099}.tar)"),
        arg("-o", "--out", required=True, metavar="OUT", help="output directory"),
        Options(ShuffleOptions, SHUFFLE_FLAGS),
        quiet("no progress bars, no summary line"),
        VERBOSE,
    ),
)

# --- repile: fresh pile membership for later epochs --------------------------------------------

# the options of shardkit.repile; piles and seed default to the source's
REPILE_FLAGS = tuple(name for name in REPILE_DOOR.names if name != "storage_options")
REPILE_DEFAULTS: dict[str, dict[str, Any]] = {
    "piles": {"default": None, "required": False, "help": "piles of the new dataset (default: the M of SRC)"},
    "seed": {"default": None, "help": "the new router seed (default: SRC's seed + 1)"},
}


def _repile(args: argparse.Namespace) -> int:
    from shardkit._util import counted, format_size
    from shardkit.piles.repile import repile

    result = repile(args.src, args.out, quiet=args.quiet, **option_values(args, REPILE_FLAGS))
    print(
        f"{args.out}: {counted(result.samples, 'sample')} in {counted(len(result.piles), 'pile')}, "
        f"{format_size(result.bytes)}, seed {result.seed}"
    )
    return 0


REPILE = Command(
    name="repile",
    help="write a dataset's samples into new piles with a new seed (fresh membership for later epochs)",
    description=(
        "Run pass 1 again over an existing shardkit dataset: every sample of SRC's piles goes to a\n"
        "pile of DST drawn with a new seed, in one read and one write. Epochs after the first reuse\n"
        "pile membership (pile-mates share batches about M times more often than fresh shuffles);\n"
        "training on DST next cuts that back to chance. `shardkit quality` measures it."
    ),
    epilog="example:\n  shardkit repile piles/ -o piles-2/ --seed 1",
    run=_repile,
    arguments=(
        arg("src", metavar="SRC", help="a shardkit dataset directory"),
        arg("-o", "--out", required=True, metavar="DST", help="the new dataset's directory (not SRC)"),
        Options(PileOptions, REPILE_FLAGS, overrides=REPILE_DEFAULTS),
        quiet(),
        VERBOSE,
    ),
)

# --- run: a YAML job; demo: the point in a minute ---------------------------------------------


def _run_job(args: argparse.Namespace) -> int:
    from shardkit.cli.job_output import output_conflict
    from shardkit.cli.jobs import DemoJob, describe, load_job, run_job, summary
    from shardkit.errors import DatasetExistsError

    job = load_job(args.config)
    conflict = output_conflict(job)
    if conflict is not None:  # said in the job file's words: `shardkit run` has no --overwrite
        raise DatasetExistsError(f"{args.config}: {conflict}")
    if args.check:
        print(f"{args.config}: ok: {describe(job)}")
        return 0
    log.info("%s: %s", args.config, describe(job))
    result = run_job(job, quiet=args.quiet)
    if isinstance(job, DemoJob):  # the table is what the demo is for: printed as `shardkit demo` prints it, -q or not
        print(summary(result))
    elif not args.quiet:
        print(f"{args.config}: done: {summary(result)}")
    return 0


RUN = Command(
    name="run",
    help="run a YAML batch job (preprocess, pile, shuffle or demo)",
    description="Run the batch job described in CONFIG. The whole file is validated before any work starts; "
    "relative paths in it are relative to the file's directory.",
    run=_run_job,
    arguments=(
        arg("config", metavar="CONFIG.yaml", help="the job file"),
        arg(
            "--check",
            action="store_true",
            help="only validate the job (fields, inputs, fn import, what its output holds) and say what it would do",
        ),
        quiet("no progress bars, no summary line (a demo job still prints its table)"),
        VERBOSE,
    ),
)


def _run_demo(args: argparse.Namespace) -> int:
    from shardkit.tools.demo import demo

    print(demo(args.out, samples=args.samples, piles=args.piles, seed=args.seed, quiet=args.quiet).table())
    return 0


DEMO = Command(
    name="demo",
    help="see the point in a minute: class-sorted images written naively and as piles, read back, compared",
    description="Make a class-sorted synthetic image dataset in memory (nothing is downloaded), write it as sequential "
    "shards with webdataset.ShardWriter and as piles with shardkit, read both back, and compare speed, classes per "
    "batch and memory.",
    run=_run_demo,
    arguments=(
        arg(
            "-o",
            "--out",
            default=None,
            metavar="DIR",
            help="keep the data in DIR: DIR/sequential and DIR/piles, replaced when an earlier demo wrote them (default: a temporary directory, removed)",
        ),
        arg("--samples", type=int, default=50_000, metavar="N", help="images in the dataset (default 50000)"),
        arg("--piles", type=int, default=16, metavar="M", help="piles for shardkit (default 16)"),
        arg("--seed", type=int, default=0, metavar="S", help="seed of the data, the piles and both shuffles (default 0)"),
        quiet(),
        VERBOSE,
    ),
)
