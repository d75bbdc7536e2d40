"""The commands about the order a loader reads: ``trace`` (one step's samples), ``quality`` (the shuffle measured), ``export``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from shardkit.cli.command import VERBOSE, Command, Options, arg, quiet
from shardkit.cli.flags import option_values
from shardkit.loading.options import LoaderOptions

if TYPE_CHECKING:
    from collections.abc import Sequence

    from shardkit.loading.loader import Loader
    from shardkit.loading.position import Phase

# --- trace: which samples a step read ---------------------------------------------------------

# the loader options that decide the order a step reads
TRACE_FLAGS = ("batch_size", "seed", "world_size", "mix", "shuffle", "drop_last")


def _read_state(path: str) -> Any:
    """The JSON in the ``--state`` file; what cannot be read or parsed is one line naming the file."""
    import json

    from shardkit.errors import ConfigError

    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:  # a missing file, a folder: the OS's words, not its errno
        raise ConfigError(f"{path}: cannot read the state file ({e.strerror or e})") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ConfigError(f"{path}: not a JSON loader state ({e})") from None


def _load_state(loader: Loader, path: str, epoch: int, workers: int) -> Sequence[Phase] | None:
    """Put ``loader`` where the state in ``path`` stands; for a ``shardkit.torch`` state, the
    phases of ``epoch`` it had read. A state the loader refuses names the file."""
    from shardkit.errors import ConfigError
    from shardkit.loading import state as states
    from shardkit.loading.epochs import on_split

    state = _read_state(path)
    try:
        if isinstance(state, dict) and state.get("format") == states.TORCH.name:
            position = loader.read_state(state, torch=True)
            return on_split(position, loader.options, loader.source, workers=max(1, workers)).done if position.epoch == epoch else ()
        loader.load_state_dict(state)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return None


def _trace(args: argparse.Namespace) -> int:
    import json

    from shardkit._util import check_int
    from shardkit.loading.loader import Loader

    options = LoaderOptions(decode=False, rank=0, **option_values(args, TRACE_FLAGS))
    loader = Loader(args.source, options)
    workers = check_int("--dataloader-workers", args.dataloader_workers, low=0)
    done = _load_state(loader, args.state, args.epoch, workers) if args.state else None
    keys = loader.keys(args.step, epoch=args.epoch, num_workers=workers, done=done)
    if args.json:
        print(json.dumps({str(rank): k for rank, k in enumerate(keys)}, indent=1))
    else:
        for rank, k in enumerate(keys):
            print(f"rank {rank}: {' '.join(k)}")
    return 0


TRACE = Command(
    name="trace",
    help="print the keys of the samples one step of an epoch reads on every rank",
    description=(
        "Compute from the epoch plan which samples global step K reads on every rank (rank r's\n"
        "batch, in order), for a loss spike, an audit, or data to remove. Give the options the\n"
        "training run used; only the piles holding those samples are read, for their keys."
    ),
    epilog="example:\n  shardkit trace data/train --step 4711 --epoch 2 --batch-size 256 --world-size 8 --seed 0",
    run=_trace,
    arguments=(
        arg("source", metavar="SOURCE", help="a shardkit dataset directory or URL"),
        arg("--step", type=int, required=True, metavar="K", help="the step (batch number within the epoch, from 0)"),
        arg("--epoch", type=int, default=0, metavar="E", help="the epoch (default 0)"),
        Options(LoaderOptions, TRACE_FLAGS, overrides={"world_size": {"default": 1, "help": "ranks of the run (default 1)"}}),
        arg(
            "--state",
            metavar="FILE",
            help="a loader or shardkit.torch state (JSON) the run resumed from on other ranks: steps of its epoch count on "
            "from before the change",
        ),
        arg(
            "--dataloader-workers",
            type=int,
            default=0,
            metavar="N",
            help="num_workers of the run's DataLoader under shardkit.torch: its workers take turns, and K counts its steps (default 0)",
        ),
        arg("--json", action="store_true", help="print {rank: [keys]} as JSON"),
        VERBOSE,
    ),
)

# --- quality: measure the shuffle -------------------------------------------------------------


def _quality(args: argparse.Namespace) -> int:
    import json
    import os

    from shardkit import manifest
    from shardkit.errors import ConfigError
    from shardkit.tools.compare import compare_shuffles

    label = args.label_field
    if label is None and "cls" in manifest.read(args.source).fields:
        label = "cls"
    if args.plot:
        from shardkit.tools.plot import check_path

        check_path(args.plot, "--plot")  # fail before the work: matplotlib missing, a bad name
        folder = os.path.dirname(args.plot)
        if "://" not in args.plot and folder and not os.path.isdir(folder):
            raise ConfigError(f"--plot: {args.plot}: no such folder {folder}")
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
        # with --json, stdout holds the JSON alone: `shardkit quality ... --json --plot q.png | jq`
        print(f"wrote {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return 0


QUALITY = Command(
    name="quality",
    help="measure the loader's shuffle of a dataset against sequential and WebDataset-style orders",
    description=(
        "Compute the loader's own epoch order from the manifest (nothing is decoded) and print\n"
        "shuffle-quality metrics next to their values under a uniform permutation, for shardkit,\n"
        "for sequential reading, and for a WebDataset-style shard shuffle + buffer of 1000 over the\n"
        "same data in source order. The source position of a sample is its key's natural order\n"
        "(or --source-field); labels come from --label-field (default: cls, when present)."
    ),
    epilog="example:\n  shardkit quality piles/ --batch-size 256 --epochs 3 --plot quality.png",
    run=_quality,
    arguments=(
        arg("source", metavar="SOURCE", help="a shardkit dataset directory"),
        Options(
            LoaderOptions,
            ["batch_size"],
            overrides={"batch_size": {"default": 256, "help": "batch size for label mixing and recurrence (default 256)"}},
        ),
        arg("--epochs", type=int, default=2, metavar="E", help="epochs to plan; 2+ reports co-batch recurrence (default 2)"),
        arg("--label-field", default=None, metavar="FIELD", help="field holding the class (default: cls if the dataset has it)"),
        arg("--source-field", default=None, metavar="FIELD", help="integer field holding the source position (default: key order)"),
        arg(
            "--source-shards",
            type=int,
            default=None,
            metavar="N",
            help="shards the reference orders read (default: the number of piles, or of samples when fewer)",
        ),
        Options(LoaderOptions, ["seed", "mix"]),
        arg("--plot", default=None, metavar="FILE.png", help="also write a PNG (needs shardkit[plot])"),
        arg("--json", action="store_true", help="print the metrics as JSON instead of a table"),
        quiet(),
        VERBOSE,
    ),
)

# --- export: a dataset back into the formats other tools read ---------------------------------


def _export(args: argparse.Namespace) -> int:
    from shardkit._util import counted
    from shardkit.tools.export import export

    if args.epoch and args.seed is None:
        from shardkit.errors import ConfigError

        raise ConfigError("--epoch: epochs differ only in the shuffled order: give --seed too")
    result = export(
        args.dataset, args.out, to=args.to, seed=args.seed, epoch=args.epoch, rows_per_group=args.rows_per_group, quiet=args.quiet
    )
    order = "pile order" if args.seed is None else f"seed {args.seed}, epoch {args.epoch}"
    print(f"{result.path}: {counted(result.rows, 'sample')}, columns {', '.join(result.columns)} ({order})")
    return 0


EXPORT = Command(
    name="export",
    help="write a dataset's samples to a Parquet file, in pile order or one epoch's shuffled order",
    description=(
        "Write every sample of DATASET to one Parquet file: a __key__ column and one binary column per\n"
        "field, the bytes as stored. Pile order by default; with --seed, the order a loader with that\n"
        "seed reads in --epoch."
    ),
    epilog="example:\n  shardkit export piles/ --to parquet -o train.parquet --seed 0 --epoch 3",
    run=_export,
    arguments=(
        arg("dataset", metavar="DATASET", help="a shardkit dataset directory or URL"),
        arg("--to", default="parquet", choices=["parquet"], help="the output format (default: parquet)"),
        arg("-o", "--out", required=True, metavar="OUT", help="the file to write"),
        arg("--seed", type=int, default=None, metavar="S", help="write the shuffled order of a loader with this seed"),
        arg("--epoch", type=int, default=0, metavar="E", help="with --seed: which epoch's order (default 0)"),
        arg("--rows-per-group", type=int, default=10_000, metavar="N", help="rows per Parquet row group"),
        quiet(),
        VERBOSE,
    ),
)
