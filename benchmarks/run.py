"""Benchmark shardkit side by side with the tools its users would otherwise pick.

Makes the datasets of the chosen size, runs every contender of the chosen cases in a fresh
process on the same data in the same run (``--repeats`` times, interleaved), and writes the
table as ``results.md`` and everything measured as ``results.json`` in ``--out``.

    python benchmarks/run.py --size small --out /tmp/bench-small
    python benchmarks/run.py --size smoke --cases a,c
    python benchmarks/run.py --size small --cases f      # the DataLoader path against litdata, mosaic, webdataset
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from importlib import metadata
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cases
import datagen
import harness
import report
from _timing import classes_per_window

CASES = ("a", "b", "c", "d", "e", "f")
PACKAGES = ("webdataset", "numpy", "pillow", "zlib-ng", "torch", "datasets", "mosaicml-streaming", "litdata", "psutil")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=tuple(cases.SIZES), default="small", help="data sizes and repeats (default small)")
    parser.add_argument("--out", default=None, help="results directory (default benchmarks/results/SIZE)")
    parser.add_argument("--data", default=None, help="where datasets are built and reused (default OUT/data)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated cases among a,b,c,d,e,f (default all)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per contender (default 1 for smoke, else 3)")
    parser.add_argument(
        "--cold",
        choices=("auto", "yes", "no"),
        default="auto",
        help="drop the page cache before each run of case d (auto: for --size full)",
    )
    parser.add_argument(
        "--profile", default=None, metavar="DIR", help="after the timed runs, one cProfile run of each shardkit contender into DIR"
    )
    args = parser.parse_args(argv)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in args.cases if c not in CASES]
    if bad:
        parser.error(f"--cases: unknown case(s) {','.join(bad)}; choose among {','.join(CASES)}")
    return args


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", harness.ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", harness.ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
        with open("/proc/meminfo") as f:
            ram = int(next(line.split()[1] for line in f if line.startswith("MemTotal"))) * 1024
    except (OSError, StopIteration):
        ram = 0
    import shardkit

    versions = {"shardkit": f"{shardkit.__version__} ({_git_commit()})"} | {p: _version(p) for p in PACKAGES}
    if versions["zlib-ng"] == "not installed":  # shardkit runs without it, ~4x slower at checksums
        print(
            "warning: zlib-ng is missing, so shardkit checksums with zlib's slower CRC-32; install shardkit's dependencies (pip install -e .)",
            file=sys.stderr,
        )
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gb": ram / 2**30,
        "python": platform.python_version(),
        "versions": versions,
        "load_before": f"{os.getloadavg()[0]:.2f}",
    }


def build_data(preset: cases.Preset, wanted: list[str], data_dir: str) -> dict[str, datagen.Dataset]:
    needs = {"raw5k": {"a", "f"}, "raw50k": {"a", "d", "e"}, "images": {"b"}}
    built = {}
    for name, used_by in needs.items():
        if used_by & set(wanted):
            spec = getattr(preset, name)
            start = time.perf_counter()
            built[name] = datagen.build(spec, data_dir)
            log(
                f"data {name}: {built[name].samples:,} samples, {built[name].shard_bytes / 1e6:.0f} MB ({time.perf_counter() - start:.1f} s)"
            )
    return built


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def plan(args: argparse.Namespace, preset: cases.Preset, data: dict[str, datagen.Dataset], work: str, cold: bool) -> list[cases.Entry]:
    def run(target: str, params: dict[str, Any]) -> dict[str, Any]:
        return harness.measure_python(target, params, timeout=preset.timeout)

    entries: list[cases.Entry] = []
    if "a" in args.cases:
        entries += cases.case_a(preset, data["raw5k"], "5KB", run) + cases.case_a(preset, data["raw50k"], "50KB", run)
    if "b" in args.cases:
        entries += cases.case_b(preset, data["images"])
    if "c" in args.cases:
        entries += cases.case_c(preset, work)
    if "d" in args.cases:
        text = datagen.text_file(data["raw50k"]) if cases.shutil.which("shuf") else None
        entries += cases.case_d(preset, data["raw50k"], work, cold, text)
    if "e" in args.cases:
        entries += cases.case_e(preset, data["raw50k"])
    if "f" in args.cases:
        entries += cases.case_f(preset, data["raw5k"], run)
    return entries


def _run_once(entry: cases.Entry, timeout: float, profile: str | None = None) -> dict[str, Any]:
    if entry.cold and not harness.drop_page_cache():
        raise harness.ContenderError("cannot drop the page cache (needs root)")
    if entry.command is not None:
        result = harness.measure_command(entry.command, timeout=timeout)
        result.update(samples=entry.figures["samples"], bytes=entry.figures["bytes"], first_sample_s=None)
        out = entry.figures.get("out")  # shuf's output, whose lines carry the class
        result["classes_per_batch"] = _line_classes(out) if out else None
        if out:
            os.unlink(out)
        return result
    params = dict(entry.params)
    if profile and entry.role == "shardkit":
        params["_profile"] = os.path.join(os.path.abspath(profile), f"{entry.group}-{entry.contender}".replace(" ", "_").replace("/", "_"))
    assert entry.target is not None
    return harness.measure_python(entry.target, params, timeout=timeout)


def _line_classes(path: str) -> float | None:
    """Classes per 256 lines of shuf's output (each line starts with its class digit)."""
    with open(path, "rb") as f:
        return classes_per_window([line[:1] for line in f])


def _warm(files: list[str]) -> None:
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass


def execute(entries: list[cases.Entry], repeats: int, timeout: float, profile: str | None) -> list[dict[str, Any]]:
    """Run every entry ``repeats`` times, interleaved within each group; returns the rows."""
    rows = []
    by_group: dict[str, list[tuple[cases.Entry, dict[str, Any]]]] = {}
    for e in entries:
        row = {
            "case": e.case, "group": e.group, "data": e.data, "contender": e.contender, "role": e.role, "raw_ref": e.raw_ref,
            "status": "skipped" if e.skip else "ok", "reason": e.skip, "runs": [], "meta": e.meta, "cold": e.cold,
        }  # fmt: skip
        rows.append(row)
        by_group.setdefault(e.group, []).append((e, row))
    for group, members in by_group.items():
        files = [f for e, _ in members if e.target == "bench_read:raw_read" and not e.cold for f in e.params["files"]]
        _warm(files)
        for r in range(repeats):
            # alternate the order, so no contender always runs right after the same one
            for entry, row in members if r % 2 == 0 else members[::-1]:
                if row["status"] != "ok":
                    continue
                try:
                    result = _run_once(entry, timeout)
                except harness.ContenderError as e:
                    row.update(status="failed", reason=str(e))
                    log(f"[{group}] {entry.contender}: FAILED: {e}")
                    continue
                result.setdefault("dataset_samples", entry.meta.get("samples"))
                row["runs"].append(result)
                rate = result["samples"] / result["seconds"] if result["seconds"] else 0
                log(f"[{group}] {entry.contender} run {r + 1}/{repeats}: {rate:,.0f} samples/s, peak RSS {result['peak_rss'] / 1e6:.0f} MB")
        if profile:
            _profile_group(group, members, timeout, profile)
    return rows


def _profile_group(group: str, members: list[tuple[cases.Entry, dict[str, Any]]], timeout: float, profile: str) -> None:
    """One extra run of each shardkit contender under cProfile; its figures are not reported."""
    for entry, row in members:
        if entry.role == "shardkit" and row["status"] == "ok":
            try:
                _run_once(entry, timeout, profile)
                log(f"[{group}] {entry.contender}: profile written to {profile}")
            except harness.ContenderError as e:
                log(f"[{group}] {entry.contender}: profiled run failed: {e}")


def notes(rows: list[dict[str, Any]], machine: dict[str, Any], cold: bool, cold_ok: bool) -> list[str]:
    out = [
        "samples/s and MB/s: one pass over the data in one process (plus its workers), measured from after the imports "
        "to the last sample; MB/s counts the bytes of the files the contender reads or writes (tar for shardkit, webdataset "
        "and HF; MDS for MosaicML); bytes/sample is that size per sample.",
        "first sample: seconds from building the loader or dataset (imports done) to the first sample or batch.",
        "CPU µs/sample: user + system CPU time of the contender's process and its worker processes over the timed part, "
        "per sample; unlike samples/s it hardly depends on what else the machine is running.",
        "Goals: 'raw I/O would score' is the goal's ratio for a reader as fast as the raw sequential read of the same "
        "files in the same run; a target above it cannot be met on this machine by any reader.",
        "peak RSS: " + next((r["runs"][0]["rss_method"] for r in rows if r["runs"]), "—") + "; worker processes count in full "
        "(shared pages once per process).",
        "Data: class-sorted samples (10 classes, in order). shardkit reads the piles PileWriter made from them; the peers "
        "read the same samples in class order, in as many tar shards as there are piles (what a preprocessing job writing "
        "sequential shards leaves). classes/256: mean distinct classes (of 10) in consecutive windows of 256 samples as "
        "yielded (for d: of the output read in order).",
        "× best peer: samples/s over the best peer's in the same group (for writers: over the best webdataset writer). "
        "× raw: MB/s over raw sequential read of the piles (c: raw sequential write of the same tar bytes). "
        "The JSON holds every figure's ratios and every run.",
    ]
    if cold and cold_ok:
        out.append("Case d ran with the page cache dropped before every run (cold reads for every contender).")
    else:
        out.append(
            "Cases a, b, e read from a warm page cache (the raw read is the page-cache ceiling). Case d also ran warm: the "
            "random-access figure comes from the page cache and so flatters random access."
        )
    load = float(machine["load_before"])
    if load > 0.5 * (machine["cores"] or 1):
        out.append(f"PROVISIONAL: the machine was busy (load average {machine['load_before']} on {machine['cores']} cores before the run).")
    out += sorted({f"{r['contender']}: {run['note']}" for r in rows for run in r["runs"] if run.get("note")})
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    preset = cases.SIZES[args.size]
    repeats = args.repeats or preset.repeats
    out = os.path.abspath(args.out or os.path.join(harness.HERE, "results", args.size))
    data_dir = os.path.abspath(args.data or os.path.join(out, "data"))
    work = os.path.join(out, "work")
    os.makedirs(work, exist_ok=True)
    cold = args.cold == "yes" or (args.cold == "auto" and args.size == "full")
    machine = machine_info()
    started = datetime.datetime.now(datetime.timezone.utc)
    data = build_data(preset, args.cases, data_dir)
    entries = plan(args, preset, data, work, cold)
    rows = execute(entries, repeats, preset.timeout, args.profile)
    for row in rows:
        report.summarize(row)
    report.add_ratios(rows)
    verdicts = report.check_goals(rows)
    machine["load_after"] = f"{os.getloadavg()[0]:.2f}"
    cold_ok = not any(r["status"] == "failed" and "page cache" in (r["reason"] or "") for r in rows)
    context = {
        "command": "python benchmarks/run.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "size": args.size,
        "repeats": repeats,
        "when": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine,
        "notes": notes(rows, machine, cold, cold_ok),
    }
    text = report.markdown(rows, verdicts, context)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"context": context, "rows": rows, "goals": verdicts}, f, indent=1, default=str)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
