"""The subcommands of ``shardkit``: each adds its parser and calls the public Python API.

Registered with :func:`shardkit.cli.command` in ``--help`` order; handlers return an exit code
and raise :class:`~shardkit.ShardkitError` for :func:`shardkit.cli.guarded` to report.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from shardkit.cli.flags import PILE_FLAGS, add_option_flags, add_pile_args, add_storage_flag, option_values, options_from_args
from shardkit.eager_shuffle import ShuffleOptions
from shardkit.loading.options import LoaderOptions
from shardkit.options import specs
from shardkit.piles.options import PileOptions

log = logging.getLogger(__name__)

# each entry adds one subcommand to the parser and sets ``handler``; kept in --help order
COMMANDS: list[Callable[[Any], None]] = []


def command(register: Callable[[Any], None]) -> Callable[[Any], None]:
    COMMANDS.append(register)
    return register


# --- pile: re-pile existing WebDataset shards -------------------------------------------------


# `shardkit pile` takes every PileOptions field: the scripts' flags (add_pile_args) and the rest
# every option is a flag; storage options come from --storage-option, which every command takes
PILE_COMMAND_FLAGS = tuple(name for name in specs(PileOptions) if name != "storage_options")


@command
def _register_pile(sub: Any) -> None:
    parser = sub.add_parser(
        "pile",
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
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="WebDataset tar shards (.tar, .tar.gz): paths, file:// URLs, globs or brace patterns like "
        "'src-{000000..000019}.tar' (quote patterns so the shell leaves them alone); or Parquet, Arrow, CSV/TSV files, "
        "or folders save_to_disk, MDS or litdata wrote (see --format)",
    )
    parser.add_argument("-o", "--out", required=True, metavar="OUT", help="output directory for pile-*.tar and shardkit.json")
    add_pile_args(parser)
    add_option_flags(parser, PileOptions, [name for name in PILE_COMMAND_FLAGS if name not in PILE_FLAGS])
    _reader_flags(parser)
    _verbose_flag(parser, storage=False)  # add_pile_args took --storage-option
    parser.set_defaults(handler=_pile)


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
    from shardkit._util import format_size
    from shardkit.piles.preprocess import pile

    start = time.perf_counter()
    options = options_from_args(PileOptions, args, PILE_COMMAND_FLAGS)
    result = pile(args.inputs, args.out, options=options, quiet=args.quiet, format=_reader(args))
    skipped = f", {result.skipped_units} input shards skipped" if result.skipped_units else ""
    split = f", {result.split_piles} oversized piles split" if result.split_piles else ""
    generation = f", generation {result.generation}" if result.generation else ""
    print(
        f"{args.out}: {result.samples} samples in {len(result.piles)} piles, {format_size(result.bytes)}, "
        f"{time.perf_counter() - start:.1f}s{skipped}{split}{generation}"
    )
    return 0


# --- inspection, eager shuffle, YAML jobs, demo ----------------------------------------------


def _verbose_flag(parser: argparse.ArgumentParser, *, storage: bool = True) -> None:
    """-v and (unless ``storage`` is false) --storage-option, accepted after the command too
    (``shardkit pile ... -v``).

    SUPPRESS: a subcommand default must not overwrite a -v given before the subcommand.
    """
    parser.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help="log more and show tracebacks")
    if storage:
        add_storage_flag(parser)


def _info_table(summary: Any) -> str:
    from shardkit._util import format_size

    s, b = summary.pile_samples, summary.pile_bytes
    rows = [
        ("dataset", f"{summary.path}  ({summary.kind}, seed {summary.seed}, {summary.created_by})"),
        ("samples", f"{summary.samples:,}"),
        ("fields", ", ".join(summary.fields) or "-"),
        ("bytes", _stored_size(summary)),
        ("piles", f"{summary.piles:,}" + (f"  ({summary.split_piles} oversized piles were split)" if summary.split_piles else "")),
        ("samples/pile", f"min {s.min:,}  mean {s.mean:,.1f}  max {s.max:,}"),
    ]
    if summary.kind == "piles":
        rows.append(("  binomial", f"mean {summary.expected_mean:,.1f}  sd {summary.expected_sd:,.1f}  (uniform router, n/M)"))
    rows.append(("bytes/pile", f"min {format_size(b.min)}  mean {format_size(b.mean)}  max {format_size(b.max)}"))
    ram = "  ".join(f"mix={k}: {format_size(summary.loader_ram(mix=k))}" for k in (2, 4))
    rows.append(("loader RAM", f"{format_size(summary.loader_ram())} (two largest piles; {ram})"))
    if summary.repeat:
        rows.append(("repeat", _repeat_row(summary.repeat)))
    if summary.skipped_units:
        rows.append(("skipped", f"{summary.skipped_units} input units failed and were skipped"))
    return "\n".join(f"{k:<13} {v}" for k, v in rows)


def _repeat_row(repeat: dict[str, Any]) -> str:
    """``by cls; 1000 samples written as 1250: x0 250, x1 500, x3 250``."""
    rule = repeat.get("rule")
    by = f"by {rule['field']}" if isinstance(rule, dict) and "field" in rule else f"by {rule}"
    factors = "  ".join(f"x{k} {v:,}" for k, v in (repeat.get("factors") or {}).items())
    return f"{by}; {repeat.get('input_samples', 0):,} samples written as {repeat.get('written_samples', 0):,}: {factors}"


def _stored_size(summary: Any) -> str:
    """``1.2 GiB`` for plain piles; ``420 MiB (zstd, 2.9x smaller: 1.2 GiB of tar)`` for compressed ones."""
    from shardkit._util import format_size

    if summary.compression is None:
        return format_size(summary.bytes)
    return f"{format_size(summary.bytes)} ({summary.compression}, {summary.ratio:.2f}x smaller: {format_size(summary.tar_bytes)} of tar)"


def _run_info(args: argparse.Namespace) -> int:
    import json

    from shardkit.tools.audit import info

    summary = info(args.directory)
    print(json.dumps(summary.to_dict(), indent=1) if args.json else _info_table(summary))
    return 0


# --- plan: what a pass-1 job costs at scale, without running it ------------------------------


def _count(text: str) -> int:
    """``1e9``, ``10**9`` written as 1e9, or ``1000000000``: a whole count."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count such as 1000 or 1e9, got {text!r}") from None
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"expected a whole count >= 1, got {text!r}")
    return int(value)


@command
def _register_plan(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="dry run of pass 1 at scale: files, objects, requests, fan-in and memory, nothing written",
        description=(
            "Print what a pass-1 job of the given shape costs: part files, objects and PUT requests\n"
            "(for an object-store output), the merge's fan-in, a task's buffer and the driver's memory,\n"
            "from formulas, and beside them the same counts from routing every sample with the real\n"
            "router (seeded by unit and ordinal). Nothing is read or written."
        ),
        epilog="example:\n  shardkit plan --samples 1e9 --units 1e4 --piles 1e4 --executor ray",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--samples", type=_count, required=True, help="samples in the dataset (1e9 is fine)")
    p.add_argument("--units", type=_count, required=True, help="input units (files, shards)")
    p.add_argument("--piles", type=_count, required=True, help="piles M")
    p.add_argument("--sample-bytes", default="4KiB", metavar="SIZE", help="mean bytes a sample (default 4KiB)")
    p.add_argument("--executor", choices=("local", "ray"), default="local", help="local worker processes, or Ray tasks")
    p.add_argument("--workers", type=int, default=8, help="processes at once: local workers, or the Ray cluster's CPUs (default 8)")
    p.add_argument("--max-pile-bytes", default=None, metavar="SIZE", help="split piles over SIZE, as pass 1 would")
    p.add_argument("--local", action="store_true", help="the output is a local directory, not an object store")
    p.add_argument("--no-simulate", action="store_true", help="formulas only (the simulation routes every sample)")
    p.set_defaults(handler=_run_plan)


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
    simulated = None
    if not args.no_simulate:
        with bar(total=shape.units, desc="routing", unit="unit", quiet=False) as progress:
            simulated = scale.simulate(shape, progress=progress.update)
    print(scale.format_plan(scale.plan(shape), simulated))
    return 0


@command
def _register_info(sub: Any) -> None:
    p = sub.add_parser(
        "info",
        help="summarise a dataset: samples, fields, pile sizes, loader RAM",
        description="Summarise a dataset from its manifest (no pile is read).",
    )
    p.add_argument("directory", metavar="DIR", help="a shardkit dataset directory (holds shardkit.json)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _verbose_flag(p)
    p.set_defaults(handler=_run_info)


def _run_verify(args: argparse.Namespace) -> int:
    from shardkit.tools.audit import verify

    problems = verify(args.directory, quiet=args.quiet)
    for problem in problems:
        print(f"{args.directory}: {'warning: ' if problem.warning else ''}{problem}")
    errors = [p for p in problems if not p.warning]
    if errors:
        print(f"shardkit verify: error: {len(errors)} problem(s) found in {args.directory}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"{args.directory}: ok" + (f" ({len(problems)} warning(s))" if problems else ""))
    return 0


@command
def _register_verify(sub: Any) -> None:
    p = sub.add_parser(
        "verify",
        help="check every pile's size, checksum, tar structure and sample count against the manifest",
        description="Read every pile and compare it with shardkit.json. Exit 0 when all is well, 1 listing each problem.",
    )
    p.add_argument("directory", metavar="DIR", help="a shardkit dataset directory")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, no 'ok' line")
    _verbose_flag(p)
    p.set_defaults(handler=_run_verify)


def _run_gc(args: argparse.Namespace) -> int:
    from shardkit._util import format_size
    from shardkit.tools.garbage_collect import gc

    report = gc(args.directory, grace=args.grace, dry_run=args.dry_run)
    did = "would delete" if args.dry_run else "deleted"
    kept = ", ".join(map(str, report.kept_generations))
    print(f"{args.directory}: {did} {len(report.deleted)} files ({format_size(report.freed)}); generations kept: {kept}")
    if report.skipped:
        shown = ", ".join(report.skipped[:5]) + (", ..." if len(report.skipped) > 5 else "")
        print(f"{args.directory}: left {len(report.skipped)} files no record of this dataset names (not shardkit's): {shown}")
    return 0


@command
def _register_gc(sub: Any) -> None:
    p = sub.add_parser(
        "gc",
        help="delete the segment files of a growing dataset that no current manifest lists",
        description=(
            "Delete the pile and segment files no manifest needs: those the current manifest does not list and\n"
            "no generation replaced less than --grace ago lists (a loader pinned to it may still read them).\n"
            "The manifests of older generations go too, so a state taken on one fails naming it, and so does\n"
            "the staging directory of an append that was killed after it published."
        ),
        epilog="example:\n  shardkit gc data/train --grace 1h",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("directory", metavar="DIR", help="a shardkit dataset directory")
    p.add_argument("--grace", default="1h", metavar="DURATION", help="keep the files of generations replaced within this long (default 1h)")
    p.add_argument("--dry-run", action="store_true", help="only list what would be deleted")
    _verbose_flag(p)
    p.set_defaults(handler=_run_gc)


# every ShuffleOptions field is a flag of `shardkit shuffle`
SHUFFLE_FLAGS = tuple(name for name in specs(ShuffleOptions) if name != "storage_options")


def _run_shuffle(args: argparse.Namespace) -> int:
    from shardkit.eager_shuffle import shuffle

    m = shuffle(args.inputs, args.out, options=options_from_args(ShuffleOptions, args, SHUFFLE_FLAGS), quiet=args.quiet)
    if not args.quiet:
        print(
            f"{args.out}: {m.samples:,} samples in {len(m.piles)} shards (shard-000000.tar ... {m.piles[-1].name}), via {m.extra['piles']} piles"
        )
    return 0


@command
def _register_shuffle(sub: Any) -> None:
    p = sub.add_parser(
        "shuffle",
        help="shuffle existing WebDataset shards into new shards in uniformly random order",
        description="The eager pass 2: re-pile INPUT shards into temporary piles, shuffle each pile in memory and write "
        "fixed-size shards OUT/shard-000000.tar ... that any WebDataset reader reads in uniformly random order.",
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="input shards: paths, globs or brace patterns (src-{000000..000099}.tar)")
    p.add_argument("-o", "--out", required=True, metavar="OUT", help="output directory")
    add_option_flags(p, ShuffleOptions, SHUFFLE_FLAGS)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars, no summary line")
    _verbose_flag(p)
    p.set_defaults(handler=_run_shuffle)


def _run_job(args: argparse.Namespace) -> int:
    from shardkit.cli.jobs import DemoJob, describe, load_job, run_job, summary

    job = load_job(args.config)
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


@command
def _register_run(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a YAML batch job (preprocess, pile, shuffle or demo)",
        description="Run the batch job described in CONFIG. The whole file is validated before any work starts; "
        "relative paths in it are relative to the file's directory.",
    )
    p.add_argument("config", metavar="CONFIG.yaml", help="the job file")
    p.add_argument("--check", action="store_true", help="only validate the job (fields, inputs, fn import) and say what it would do")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars, no summary line (a demo job still prints its table)")
    _verbose_flag(p)
    p.set_defaults(handler=_run_job)


def _run_demo(args: argparse.Namespace) -> int:
    from shardkit.tools.demo import demo

    print(demo(args.out, samples=args.samples, piles=args.piles, seed=args.seed, quiet=args.quiet).table())
    return 0


@command
def _register_demo(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="see the point in a minute: class-sorted images written naively and as piles, read back, compared",
        description="Make a class-sorted synthetic image dataset in memory (nothing is downloaded), write it as sequential "
        "shards with webdataset.ShardWriter and as piles with shardkit, read both back, and compare speed, classes per "
        "batch and memory.",
    )
    p.add_argument("-o", "--out", default=None, metavar="DIR", help="keep the data in DIR (default: a temporary directory, removed)")
    p.add_argument("--samples", type=int, default=50_000, metavar="N", help="images in the dataset (default 50000)")
    p.add_argument("--piles", type=int, default=16, metavar="M", help="piles for shardkit (default 16)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the data, the piles and both shuffles (default 0)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _verbose_flag(p)
    p.set_defaults(handler=_run_demo)


# --- trace: which samples a step read ---------------------------------------------------------

# the loader options that decide the order a step reads
TRACE_FLAGS = ("batch_size", "seed", "world_size", "mix", "shuffle", "drop_last")


@command
def _register_trace(sub: Any) -> None:
    parser = sub.add_parser(
        "trace",
        help="print the keys of the samples one step of an epoch reads on every rank",
        description=(
            "Compute from the epoch plan which samples global step K reads on every rank (rank r's\n"
            "batch, in order), for a loss spike, an audit, or data to remove. Give the options the\n"
            "training run used; only the piles holding those samples are read, for their keys."
        ),
        epilog="example:\n  shardkit trace data/train --step 4711 --epoch 2 --batch-size 256 --world-size 8 --seed 0",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", metavar="SOURCE", help="a shardkit dataset directory or URL")
    parser.add_argument("--step", type=int, required=True, metavar="K", help="the step (batch number within the epoch, from 0)")
    parser.add_argument("--epoch", type=int, default=0, metavar="E", help="the epoch (default 0)")
    add_option_flags(parser, LoaderOptions, TRACE_FLAGS, overrides={"world_size": {"default": 1, "help": "ranks of the run (default 1)"}})
    parser.add_argument(
        "--state",
        metavar="FILE",
        help="a loader or shardkit.torch state (JSON) the run resumed from on other ranks: steps of its epoch count on "
        "from before the change",
    )
    parser.add_argument(
        "--dataloader-workers",
        type=int,
        default=0,
        metavar="N",
        help="num_workers of the run's DataLoader under shardkit.torch: its workers take turns, and K counts its steps (default 0)",
    )
    parser.add_argument("--json", action="store_true", help="print {rank: [keys]} as JSON")
    _verbose_flag(parser)
    parser.set_defaults(handler=_trace)


def _trace(args: argparse.Namespace) -> int:
    import json

    from shardkit._util import check_int
    from shardkit.loading import turns
    from shardkit.loading.loader import Loader

    options = LoaderOptions(decode=False, rank=0, **option_values(args, TRACE_FLAGS))
    loader = Loader(args.source, options)
    workers = check_int("--dataloader-workers", args.dataloader_workers, low=0)
    done = None
    if args.state:
        with open(args.state, encoding="utf-8") as f:
            state = json.load(f)
        if isinstance(state, dict) and state.get("format") == turns.FORMAT:
            source = loader.source
            point = turns.parse(
                state, options=loader.options, dataset=source.fingerprint(), samples=source.samples, name=source.name, rest=source.rest
            )
            done = turns.done_before(point, options=loader.options, rest=source.rest, workers=max(1, workers))
            done = done if point.epoch == args.epoch else ()
        else:
            loader.load_state_dict(state)
    keys = loader.keys(args.step, epoch=args.epoch, num_workers=workers, done=done)
    if args.json:
        print(json.dumps({str(rank): k for rank, k in enumerate(keys)}, indent=1))
    else:
        for rank, k in enumerate(keys):
            print(f"rank {rank}: {' '.join(k)}")
    return 0


# --- quality and repile: measure the shuffle, fresh pile membership ---------------------------


@command
def _register_quality(sub: Any) -> None:
    parser = sub.add_parser(
        "quality",
        help="measure the loader's shuffle of a dataset against sequential and WebDataset-style orders",
        description=(
            "Compute the loader's own epoch order from the manifest (nothing is decoded) and print\n"
            "shuffle-quality metrics next to their values under a uniform permutation, for shardkit,\n"
            "for sequential reading, and for a WebDataset-style shard shuffle + buffer of 1000 over the\n"
            "same data in source order. The source position of a sample is its key's natural order\n"
            "(or --source-field); labels come from --label-field (default: cls, when present)."
        ),
        epilog="example:\n  shardkit quality piles/ --batch-size 256 --epochs 3 --plot quality.png",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", metavar="SOURCE", help="a shardkit dataset directory")
    batch = {"default": 256, "help": "batch size for label mixing and recurrence (default 256)"}
    add_option_flags(parser, LoaderOptions, ["batch_size"], overrides={"batch_size": batch})
    parser.add_argument("--epochs", type=int, default=2, metavar="E", help="epochs to plan; 2+ reports co-batch recurrence (default 2)")
    parser.add_argument("--label-field", default=None, metavar="FIELD", help="field holding the class (default: cls if the dataset has it)")
    parser.add_argument(
        "--source-field", default=None, metavar="FIELD", help="integer field holding the source position (default: key order)"
    )
    parser.add_argument(
        "--source-shards", type=int, default=None, metavar="N", help="shards the reference orders read (default: number of piles)"
    )
    add_option_flags(parser, LoaderOptions, ["seed", "mix"])
    parser.add_argument("--plot", default=None, metavar="FILE.png", help="also write a PNG (needs shardkit[plot])")
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON instead of a table")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _verbose_flag(parser)
    parser.set_defaults(handler=_quality)


def _quality(args: argparse.Namespace) -> int:
    import json

    from shardkit import manifest
    from shardkit.tools.compare import compare_shuffles

    label = args.label_field
    if label is None and "cls" in manifest.read(args.source).fields:
        label = "cls"
    if args.plot:
        from shardkit.tools.plot import pyplot

        pyplot()  # fail before the work when matplotlib is missing
    result = compare_shuffles(
        args.source,
        batch_size=args.batch_size,
        epochs=args.epochs,
        seed=args.seed,
        mix=args.mix,
        label_field=label,
        source_field=args.source_field,
        source_shards=args.source_shards,
        quiet=args.quiet,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        print(result.table())
        if label is None:
            print("(no label field: classes per batch and dispersion not measured; pass --label-field)")
    if args.plot:
        result.plot(args.plot)
        print(f"wrote {args.plot}")
    return 0


# the PileOptions fields `shardkit repile` takes; piles and seed default to the source's
REPILE_FLAGS = (
    "piles",
    "seed",
    "workers",
    "max_pile_bytes",
    "overwrite",
    "resume",
    "executor",
    "ray_address",
    "compression",
    "compression_level",
)
REPILE_DEFAULTS: dict[str, dict[str, Any]] = {
    "piles": {"default": None, "required": False, "help": "piles of the new dataset (default: the M of SRC)"},
    "seed": {"default": None, "help": "the new router seed (default: SRC's seed + 1)"},
}


@command
def _register_repile(sub: Any) -> None:
    parser = sub.add_parser(
        "repile",
        help="write a dataset's samples into new piles with a new seed (fresh membership for later epochs)",
        description=(
            "Run pass 1 again over an existing shardkit dataset: every sample of SRC's piles goes to a\n"
            "pile of DST drawn with a new seed, in one read and one write. Epochs after the first reuse\n"
            "pile membership (pile-mates share batches about M times more often than fresh shuffles);\n"
            "training on DST next cuts that back to chance. `shardkit quality` measures it."
        ),
        epilog="example:\n  shardkit repile piles/ -o piles-2/ --seed 1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("src", metavar="SRC", help="a shardkit dataset directory")
    parser.add_argument("-o", "--out", required=True, metavar="DST", help="the new dataset's directory (not SRC)")
    add_option_flags(parser, PileOptions, REPILE_FLAGS, overrides=REPILE_DEFAULTS)
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _verbose_flag(parser)
    parser.set_defaults(handler=_repile)


def _repile(args: argparse.Namespace) -> int:
    from shardkit._util import format_size
    from shardkit.piles.repile import repile

    result = repile(args.src, args.out, quiet=args.quiet, **option_values(args, REPILE_FLAGS))
    print(f"{args.out}: {result.samples} samples in {len(result.piles)} piles, {format_size(result.bytes)}, seed {result.seed}")
    return 0


# --- export: a dataset back into the formats other tools read ---------------------------------


@command
def _register_export(sub: Any) -> None:
    parser = sub.add_parser(
        "export",
        help="write a dataset's samples to a Parquet file, in pile order or one epoch's shuffled order",
        description=(
            "Write every sample of DATASET to one Parquet file: a __key__ column and one binary column per\n"
            "field, the bytes as stored. Pile order by default; with --seed, the order a loader with that\n"
            "seed reads in --epoch."
        ),
        epilog="example:\n  shardkit export piles/ --to parquet -o train.parquet --seed 0 --epoch 3",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dataset", metavar="DATASET", help="a shardkit dataset directory or URL")
    parser.add_argument("--to", default="parquet", choices=["parquet"], help="the output format (default: parquet)")
    parser.add_argument("-o", "--out", required=True, metavar="OUT", help="the file to write")
    parser.add_argument("--seed", type=int, default=None, metavar="S", help="write the shuffled order of a loader with this seed")
    parser.add_argument("--epoch", type=int, default=0, metavar="E", help="with --seed: which epoch's order (default 0)")
    parser.add_argument("--rows-per-group", type=int, default=10_000, metavar="N", help="rows per Parquet row group")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _verbose_flag(parser)
    parser.set_defaults(handler=_export)


def _export(args: argparse.Namespace) -> int:
    from shardkit.tools.export import export

    if args.epoch and args.seed is None:
        from shardkit.errors import ConfigError

        raise ConfigError("--epoch: epochs differ only in the shuffled order: give --seed too")
    result = export(
        args.dataset, args.out, to=args.to, seed=args.seed, epoch=args.epoch, rows_per_group=args.rows_per_group, quiet=args.quiet
    )
    order = "pile order" if args.seed is None else f"seed {args.seed}, epoch {args.epoch}"
    print(f"{result.path}: {result.rows} samples, columns {', '.join(result.columns)} ({order})")
    return 0
