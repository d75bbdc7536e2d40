"""Turn measured runs into medians, ratios and goal verdicts, and render them as markdown and JSON.

A *row* is one contender on one data set: its runs, their medians, its ratios to the best peer
and to raw sequential I/O of the same files in its *group*, and the goals checked on it. Goals
are the issue's targets, checked exactly as stated; a missed goal is shown as missed.

    rows = [summarize(row) for row in measured]
    check_goals(rows)
    print(markdown(rows, machine))
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MB = 1e6
FIGURES = (
    "samples_per_s", "mb_per_s", "peak_rss_mb", "first_sample_s", "bytes_per_sample", "classes_per_batch", "cpu_us_per_sample", "seconds",
)  # fmt: skip

LOADER = "shardkit.loader"
WEBDATASET = "webdataset"
WDS_DATALOADER = "webdataset + DataLoader"
TAR_WRITER = "webdataset.TarWriter"
SHUFFLE = "shardkit.shuffle"
SHUF = "GNU shuf (text, in RAM)"
RAW_READ = "raw sequential read"
RAW_WRITE = "raw sequential write"
TORCH_DATALOADER = "shardkit.torch + DataLoader"
LITDATA_LOADER = "litdata StreamingDataLoader"
LOADER_VIEWS = "shardkit.loader views=True"
CAT = "cat"


def pile_writer_name(piles: int) -> str:
    return f"shardkit.PileWriter M={piles}"


def _figures(run: dict[str, Any]) -> dict[str, float | None]:
    seconds = run["seconds"]
    return {
        "samples_per_s": run["samples"] / seconds if seconds else None,
        "mb_per_s": run["bytes"] / seconds / MB if seconds else None,
        "peak_rss_mb": run["peak_rss"] / MB,
        "first_sample_s": run.get("first_sample_s"),
        # per sample of the data set, which a loader dropping a last partial batch does not yield
        "bytes_per_sample": run["bytes"] / (run.get("dataset_samples") or run["samples"]) if run["samples"] else None,
        "classes_per_batch": run.get("classes_per_batch"),
        "cpu_us_per_sample": run["cpu_s"] / run["samples"] * 1e6 if run.get("cpu_s") is not None and run["samples"] else None,
        "seconds": seconds,
    }


def summarize(row: dict[str, Any]) -> dict[str, Any]:
    """Add each figure's median over the row's successful runs (``row["median"]``)."""
    runs = [_figures(r) for r in row.get("runs", [])]
    median: dict[str, float | None] = {}
    for name in FIGURES:
        values = [r[name] for r in runs if r[name] is not None]
        median[name] = statistics.median(values) if values else None
    row["median"] = median
    return row


def _ok(row: dict[str, Any] | None) -> bool:
    return row is not None and row["status"] == "ok"


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each figure as a ratio to the group's best peer (by samples/s) and to its raw I/O row."""
    for row in rows:
        group = [r for r in rows if r["group"] == row["group"] and _ok(r)]
        peers = [r for r in group if r["role"] == "peer" and r["median"]["samples_per_s"]]
        best = max(peers, key=lambda r: r["median"]["samples_per_s"]) if peers else None
        raw = next((r for r in group if r["contender"] == row.get("raw_ref")), None)
        row["best_peer"] = best["contender"] if best else None
        row["ratios"] = {"vs_best_peer": _ratios(row, best), "vs_raw": _ratios(row, raw)}


def _ratios(row: dict[str, Any], ref: dict[str, Any] | None) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name in FIGURES:
        a = row.get("median", {}).get(name)
        b = ref["median"].get(name) if ref and _ok(row) else None
        out[name] = a / b if a is not None and b else None
    return out


@dataclass(frozen=True)
class Goal:
    """One target of the issue, checked on the group's rows and shown on ``row``."""

    group: str
    row: str
    text: str
    measure: Callable[[dict[str, dict[str, Any]]], float | None]
    target: float
    at_least: bool  # met when measured >= target, else when measured <= target
    unit: str = "×"
    ceiling: Callable[[dict[str, dict[str, Any]]], float | None] | None = None  # what raw I/O would score

    def verdict(self, rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
        value = _safe(self.measure, rows)
        met = None if value is None else (value >= self.target if self.at_least else value <= self.target)
        ceiling = _safe(self.ceiling, rows) if self.ceiling else None
        return {"goal": self.text, "measured": value, "target": self.target, "unit": self.unit, "met": met, "raw_io_scores": ceiling}


def _safe(fn: Callable[[dict[str, dict[str, Any]]], float | None], rows: dict[str, dict[str, Any]]) -> float | None:
    try:
        return fn(rows)
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def _m(rows: dict[str, dict[str, Any]], name: str, figure: str) -> float:
    row = rows[name]
    if not _ok(row) or row["median"][figure] is None:
        raise KeyError(name)
    return float(row["median"][figure])


def _ratio(a: str, b: str, figure: str = "samples_per_s") -> Callable[[dict[str, dict[str, Any]]], float]:
    return lambda rows: _m(rows, a, figure) / _m(rows, b, figure)


def _rss_over_two_piles(name: str) -> Callable[[dict[str, dict[str, Any]]], float]:
    """Peak RSS as a fraction of (two largest piles + 150 MB): met when <= 1."""

    def measure(rows: dict[str, dict[str, Any]]) -> float:
        pile = rows[name]["meta"]["max_pile_bytes"]
        return _m(rows, name, "peak_rss_mb") / (2 * pile / MB + 150)

    return measure


def _first_after_one_pile(rows: dict[str, dict[str, Any]]) -> float:
    """First-sample time minus the time raw read needs for one (the largest) pile."""
    pile_mb = rows[LOADER]["meta"]["max_pile_bytes"] / MB
    return _m(rows, LOADER, "first_sample_s") - pile_mb / _m(rows, RAW_READ, "mb_per_s")


def _shuffle_rss_fraction(rows: dict[str, dict[str, Any]]) -> float:
    return _m(rows, SHUFFLE, "peak_rss_mb") * MB / rows[SHUFFLE]["meta"]["data_bytes"]


def goals_for(rows: list[dict[str, Any]]) -> list[Goal]:
    """The issue's goals for the groups present in ``rows``."""
    goals = [
        Goal("a-5KB", LOADER, "≥ 15× webdataset samples/s", _ratio(LOADER, WEBDATASET), 15, True, ceiling=_ratio(RAW_READ, WEBDATASET)),
        Goal("a-5KB", LOADER, "first sample ≤ one pile's raw read + 0.5 s", _first_after_one_pile, 0.5, False, " s after one pile's read"),
        Goal("a-5KB", LOADER, "peak RSS ≤ two piles + 150 MB", _rss_over_two_piles(LOADER), 1, False, "× the bound"),
        Goal("a-50KB", LOADER, "≥ 15× webdataset samples/s", _ratio(LOADER, WEBDATASET), 15, True, ceiling=_ratio(RAW_READ, WEBDATASET)),
        Goal("a-50KB", LOADER, "≥ 50% of raw read MB/s", _ratio(LOADER, RAW_READ, "mb_per_s"), 0.5, True),
        Goal("b", LOADER, "≥ 1.2× webdataset + DataLoader samples/s", _ratio(LOADER, WDS_DATALOADER), 1.2, True),
        Goal("c", pile_writer_name(64), "≥ 8× TarWriter samples/s", _ratio(pile_writer_name(64), TAR_WRITER), 8, True),
        Goal(
            "c",
            pile_writer_name(256),
            "time ≤ 1.25× M=1's",
            _ratio(pile_writer_name(1), pile_writer_name(256)),  # time ratio = inverse samples/s ratio
            1.25,
            False,
        ),
        Goal("f", TORCH_DATALOADER, "≥ 0.8× one shardkit.loader process", _ratio(TORCH_DATALOADER, LOADER), 0.8, True),
        Goal("f", TORCH_DATALOADER, "≥ 1.5× litdata StreamingDataLoader", _ratio(TORCH_DATALOADER, LITDATA_LOADER), 1.5, True),
        Goal("f", LOADER_VIEWS, "≥ 0.4× cat MB/s", _ratio(LOADER_VIEWS, CAT, "mb_per_s"), 0.4, True),
        Goal("f", LOADER, "first sample ≤ 0.05 s", lambda rows: _m(rows, LOADER, "first_sample_s"), 0.05, False, " s"),
        Goal("d", SHUFFLE, "≥ 0.5× GNU shuf bytes/s", _ratio(SHUFFLE, SHUF, "mb_per_s"), 0.5, True),
        Goal("d", SHUFFLE, "peak RSS ≤ 1/8 of the data", _shuffle_rss_fraction, 1 / 8, False, " of the data"),
    ]
    for row in rows:
        if row["group"] == "e" and row["role"] == "shardkit":
            goals.append(
                Goal(
                    "e",
                    row["contender"],
                    "peak RSS ≤ two piles + 150 MB",
                    _rss_over_two_piles(row["contender"]),
                    1,
                    False,
                    "× the bound",
                )
            )
    return goals


def check_goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Attach goal verdicts to their rows (``row["goals"]``); returns all verdicts."""
    verdicts = []
    for row in rows:
        row.setdefault("goals", [])
    for goal in goals_for(rows):
        group = {r["contender"]: r for r in rows if r["group"] == goal.group}
        if goal.row not in group:
            continue
        verdict = goal.verdict(group) | {"group": goal.group, "row": goal.row}
        group[goal.row]["goals"].append(verdict)
        verdicts.append(verdict)
    return verdicts


def _num(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "—"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}" if abs(value) >= 1 else f"{value:.2g}"


def _times(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}×"


def _verdict_text(verdict: dict[str, Any]) -> str:
    if verdict["met"] is None:
        return "not measured"
    return "yes" if verdict["met"] else "**NO**"


COLUMNS = (
    "case", "data", "contender", "samples/s", "MB/s", "peak RSS MB", "first sample s", "bytes/sample",
    "classes/256", "CPU µs/sample", "× best peer", "× raw", "goal", "met?",
)  # fmt: skip


def _cells(row: dict[str, Any]) -> list[str]:
    head = [row["case"], row["data"], row["contender"]]
    if row["status"] != "ok":
        return [
            *head,
            row["status"],
            *["—"] * 8,
            "; ".join(g["goal"] for g in row.get("goals", [])) or "",
            "not measured" if row.get("goals") else "",
        ]
    m = row["median"]
    ratios = row.get("ratios", {})
    goals = row.get("goals", [])
    return [
        *head,
        _num(m["samples_per_s"]),
        _num(m["mb_per_s"]),
        _num(m["peak_rss_mb"]),
        _num(m["first_sample_s"]),
        _num(m["bytes_per_sample"], 4),
        _num(m["classes_per_batch"]),
        _num(m["cpu_us_per_sample"]),
        _times(ratios.get("vs_best_peer", {}).get("samples_per_s"))
        if row["role"] != "peer" or row["contender"] != row.get("best_peer")
        else "best",
        _times(ratios.get("vs_raw", {}).get("mb_per_s")),
        "; ".join(g["goal"] for g in goals),
        "; ".join(_verdict_text(g) for g in goals),
    ]


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def goals_table(verdicts: list[dict[str, Any]]) -> str:
    lines = ["| case | row | goal | measured | raw I/O would score | met? |", "|---|---|---|---|---|---|"]
    for v in verdicts:
        measured = "—" if v["measured"] is None else f"{v['measured']:.3g}{v['unit']}"
        ceiling = "" if v.get("raw_io_scores") is None else f"{v['raw_io_scores']:.3g}{v['unit']}"
        lines.append(f"| {v['group']} | {v['row']} | {v['goal']} | {measured} | {ceiling} | {_verdict_text(v)} |")
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]], verdicts: list[dict[str, Any]], context: dict[str, Any]) -> str:
    """The whole report: how it was made, the table, the goals, skipped rows and method notes."""
    machine = context["machine"]
    parts = [
        f"Command: `{context['command']}`  ",
        f"Size: {context['size']}, {context['repeats']} run(s) per contender, medians shown; {context['when']}.  ",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['ram_gb']:.0f} GB RAM, Python {machine['python']}, "
        f"load average {machine['load_before']} before and {machine['load_after']} after the run.  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in machine["versions"].items()) + ".",
        "",
        table(rows),
        "",
        "Goals:",
        "",
        goals_table(verdicts),
    ]
    skipped = [r for r in rows if r["status"] != "ok"]
    if skipped:
        parts += ["", "Not measured:", ""] + [
            f"- {r['case']} {r['contender']} ({r['data']}): {r['status']}: {r['reason']}" for r in skipped
        ]
    parts += ["", "Notes:", ""] + [f"- {note}" for note in context["notes"]]
    return "\n".join(parts) + "\n"
