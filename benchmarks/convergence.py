"""Train one small model under each shuffle policy and plot held-out accuracy and loss per step.

The data are MNIST-1D, made by the ``mnist1d`` package's own generator, with the training
split sorted by class as a preprocessing job leaves it and written once as WebDataset shards.
Each policy reads those examples through its own library (webdataset, Hugging Face
``datasets`` streaming, MosaicML ``streaming``, shardkit) or, for the reference, permutes them
in RAM. For every seed, every policy trains the same 1-D CNN from the same initial weights with
the same schedule; the held-out set is evaluated every few steps. Writes ``convergence.png``,
``convergence.json`` (every curve) and ``convergence.md`` (the table) into ``--out``.

    python benchmarks/convergence.py --out benchmarks
    python benchmarks/convergence.py --quick --out /path/to/dir
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import convergence_data
import convergence_policies
import convergence_report
import convergence_train

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGES = ("torch", "numpy", "webdataset", "datasets", "mosaicml-streaming", "mnist1d", "matplotlib")


@dataclass(frozen=True)
class Preset:
    """Sizes and settings of a run; ``--quick`` shrinks everything to a smoke test."""

    train: int
    held_out: int
    per_shard: int  # samples per tar shard, all of one class
    piles: int
    buffer: int  # webdataset and HF shuffle buffer
    block: int  # MosaicML py1e shuffle_block_size
    mds_per_shard: int
    batch: int
    epochs: int
    seeds: int
    eval_every: int
    lr: float = 0.05
    momentum: float = 0.9
    clip: float = 5.0  # max gradient norm
    target: float = 0.9


FULL = Preset(
    train=50_000, held_out=5_000, per_shard=1_000, piles=50, buffer=1_000, block=1_000, mds_per_shard=64,
    batch=128, epochs=4, seeds=4, eval_every=30,
)  # fmt: skip
QUICK = Preset(
    train=2_000, held_out=500, per_shard=100, piles=20, buffer=100, block=200, mds_per_shard=20,
    batch=32, epochs=2, seeds=1, eval_every=10,
)  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny data, one seed, two epochs: checks the script runs")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "convergence"), help="where the PNG, JSON and table go")
    parser.add_argument("--data", default=None, help="keep and reuse the generated data here (default: a temporary directory)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per policy (default 4; 1 with --quick)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs (default 4; 2 with --quick)")
    parser.add_argument("--buffer", type=int, default=None, help="webdataset and HF shuffle buffer (default 1000; 100 with --quick)")
    parser.add_argument("--block", type=int, default=None, help="MosaicML py1e shuffle_block_size (default 1000; 200 with --quick)")
    keys = [p.key for p in convergence_policies.POLICIES]
    parser.add_argument(
        "--replot", metavar="JSON", default=None, help="redraw the figure and table from a saved convergence.json; no training"
    )
    parser.add_argument("--policies", default=",".join(keys), help=f"comma-separated, among {','.join(keys)} (default all)")
    args = parser.parse_args(argv)
    args.policies = [k.strip() for k in args.policies.split(",") if k.strip()]
    if unknown := [k for k in args.policies if k not in keys]:
        parser.error(f"--policies: unknown {','.join(unknown)}; choose among {','.join(keys)}")
    return args


def preset_for(args: argparse.Namespace) -> Preset:
    preset = QUICK if args.quick else FULL
    changes = {k: getattr(args, k) for k in ("seeds", "epochs", "buffer", "block") if getattr(args, k) is not None}
    return dataclasses.replace(preset, **changes)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def prepare(preset: Preset, data_dir: str) -> convergence_policies.Setup:
    start = time.perf_counter()
    split = convergence_data.mnist1d(preset.train, preset.held_out, data_dir)
    shards = convergence_data.write_shards(split, os.path.join(data_dir, f"shards-{preset.train}-{preset.per_shard}"), preset.per_shard)
    log(f"data: MNIST-1D, {len(split.y):,} training examples in {len(shards)} class-sorted shards, {len(split.y_held):,} held out "
        f"({time.perf_counter() - start:.1f} s)")  # fmt: skip
    return convergence_policies.Setup(
        split=split,
        shards=shards,
        work=os.path.join(data_dir, f"work-{preset.train}-{preset.per_shard}"),
        batch=preset.batch,
        buffer=preset.buffer,
        piles=preset.piles,
        block=preset.block,
        mds_per_shard=preset.mds_per_shard,
    )


def run_all(preset: Preset, setup: convergence_policies.Setup, wanted: list[str]) -> list[dict[str, Any]]:
    """Every wanted policy for every seed, seeds outermost so machine load spreads evenly."""
    schedule = convergence_train.Schedule(preset.batch, preset.epochs, preset.lr, preset.momentum, preset.eval_every, preset.clip)
    chosen = [p for p in convergence_policies.POLICIES if p.key in wanted]
    results = {p.key: _entry(p, setup) for p in chosen}
    for seed in range(preset.seeds):
        state = convergence_train.initial_state(seed)
        for policy in chosen:
            entry = results[policy.key]
            if entry["status"] != "ok":
                continue
            try:
                curve = _one(policy, setup, state, schedule, seed)
            except Exception as e:  # one broken peer must not lose every other policy's curves
                entry.update(status="failed", reason=f"{type(e).__name__}: {e}")
                log(f"{policy.key} seed {seed}: FAILED: {entry['reason']}")
                continue
            entry["runs"].append(_rounded(dataclasses.asdict(curve)))
    return list(results.values())


def _rounded(run: dict[str, Any]) -> dict[str, Any]:
    """Six significant digits: the JSON stays small and loses nothing the table or figure shows."""
    return {k: [v if isinstance(v, int) else float(f"{v:.6g}") for v in vs] if isinstance(vs, list) else vs for k, vs in run.items()}


def _entry(policy: convergence_policies.Policy, setup: convergence_policies.Setup) -> dict[str, Any]:
    reason = policy.missing()
    if reason:
        log(f"{policy.key}: skipped: {reason}")
    status = "skipped" if reason else "ok"
    return {"key": policy.key, "label": policy.title(setup), "status": status, "reason": reason, "runs": []}


def _one(policy, setup, state, schedule, seed: int) -> convergence_train.Curve:
    start = time.perf_counter()
    reader = policy.open(setup, seed)
    try:
        curve = convergence_train.train(state, reader, setup.split, schedule, seed)
    finally:
        reader.close()
    log(
        f"{policy.key} seed {seed}: final accuracy {curve.accuracy[-1]:.3f}, loss {curve.loss[-1]:.3f}, "
        f"{sum(curve.classes_per_batch) / len(curve.classes_per_batch):.2f} classes/batch, "
        f"read {sum(curve.read_seconds):.1f} s, total {time.perf_counter() - start:.1f} s"
    )
    return curve


def machine() -> dict[str, Any]:
    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    import shardkit

    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    versions = {"shardkit": shardkit.__version__} | {p: version(p) for p in PACKAGES}
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "versions": versions}


def describe(preset: Preset, setup: convergence_policies.Setup, args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    argv = " ".join(shlex.quote(a) for a in sys.argv[1:])
    return dataclasses.asdict(preset) | {
        "command": f"python benchmarks/convergence.py {argv}".strip(),
        "data": f"MNIST-1D, {preset.train:,} class-sorted training examples",
        "steps_per_epoch": preset.train // preset.batch,
        "mds_mean_per_shard": setup.mds_mean,
        "torch_threads": convergence_train.torch.get_num_threads(),
        "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "wall_seconds": round(seconds, 1),
        "machine": machine(),
    }


def write_outputs(policies: list[dict[str, Any]], config: dict[str, Any], out: str) -> str:
    text = convergence_report.table(policies, config)
    convergence_report.plot(policies, config, os.path.join(out, "convergence.png"))
    with open(os.path.join(out, "convergence.md"), "w") as f:
        f.write(text + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.replot:
        with open(args.replot) as f:
            doc = json.load(f)
        print(write_outputs(doc["policies"], doc["config"], args.out))
        return 0
    preset = preset_for(args)
    convergence_train.torch.set_num_threads(1)  # a small model; leave the other core free
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="convergence-") as scratch:
        setup = prepare(preset, os.path.abspath(args.data or scratch))
        policies = run_all(preset, setup, args.policies)
        config = describe(preset, setup, args, time.perf_counter() - start)
    text = write_outputs(policies, config, args.out)
    with open(os.path.join(args.out, "convergence.json"), "w") as f:
        json.dump({"config": config, "policies": policies}, f, indent=1)
    print(text)
    log(f"wrote {args.out}/convergence.png, .json and .md in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
