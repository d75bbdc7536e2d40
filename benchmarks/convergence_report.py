"""Summarise the convergence runs as a markdown table and plot the held-out curves.

Every figure is over seeds: mean ± sd for steps to the target accuracy, the final accuracy and
the final loss; "in the reference band" is the share of evaluations at which a policy's mean
accuracy and mean loss both lie inside the reference's range (min to max over seeds), the band
the figure draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

REFERENCE = "reference"
STYLE = {  # colour, line style, width, z-order: shardkit drawn last, on top
    "sequential": ("#7f7f7f", ":", 1.6, 2),
    "webdataset": ("#ff7f0e", "-", 1.6, 3),
    "hf": ("#d62728", "--", 1.6, 3),
    "mosaic": ("#8c564b", "-.", 1.8, 4),
    "reference-2": ("#555555", (0, (4, 2)), 1.4, 5),
    "reference": ("#000000", "-", 2.2, 5),
    "shardkit-repile": ("#9467bd", (0, (1, 1.5)), 1.8, 6),
    "shardkit-mix4": ("#17becf", "--", 1.8, 7),
    "shardkit": ("#1f77b4", "-", 1.8, 8),
}


@dataclass(frozen=True)
class Summary:
    key: str
    label: str
    steps: np.ndarray
    accuracy: np.ndarray  # seeds x evaluations
    loss: np.ndarray
    classes: float
    top_share: float
    read_seconds: float


def summaries(policies: list[dict[str, Any]]) -> list[Summary]:
    out = []
    for p in policies:
        if p["status"] != "ok":
            continue
        runs = p["runs"]
        out.append(
            Summary(
                key=p["key"],
                label=p["label"],
                steps=np.asarray(runs[0]["steps"]),
                accuracy=np.asarray([r["accuracy"] for r in runs]),
                loss=np.asarray([r["loss"] for r in runs]),
                classes=float(np.mean([r["classes_per_batch"] for r in runs])),
                top_share=float(np.mean([r["top_class_share"] for r in runs])),
                read_seconds=float(np.mean([r["read_seconds"] for r in runs])),
            )
        )
    return out


def steps_to(s: Summary, target: float) -> list[int | None]:
    """Per seed, the first evaluated step at which held-out accuracy reached ``target``."""
    out: list[int | None] = []
    for row in s.accuracy:
        hit = np.flatnonzero(row >= target)
        out.append(int(s.steps[hit[0]]) if hit.size else None)
    return out


def in_band(s: Summary, ref: Summary, mask: np.ndarray) -> float:
    """Share of the evaluations in ``mask`` where the mean accuracy and loss lie in ref's range."""
    acc, loss = s.accuracy.mean(0), s.loss.mean(0)
    inside = (ref.accuracy.min(0) <= acc) & (acc <= ref.accuracy.max(0)) & (ref.loss.min(0) <= loss) & (loss <= ref.loss.max(0))
    return float(inside[mask].mean())


def paired_loss_gap(s: Summary, ref: Summary, mask: np.ndarray) -> np.ndarray:
    """Per seed, the mean over ``mask``'s evaluations of loss / reference loss - 1 (same seed, same start)."""
    return (s.loss[:, mask] / ref.loss[:, mask] - 1).mean(1)


def _pm(values: np.ndarray | list[float], fmt: str) -> str:
    v = np.asarray(values, dtype=float)
    sd = v.std(ddof=1) if v.size > 1 else 0.0
    return f"{format(v.mean(), fmt)} ± {format(sd, fmt)}"


def _pct(values: np.ndarray) -> str:
    if abs(values.mean()) >= 1:
        return f"{values.mean():+,.0%}"
    sd = values.std(ddof=1) if values.size > 1 else 0.0
    return f"{100 * values.mean():+.1f} ± {100 * sd:.1f}%"


def _steps_cell(hits: list[int | None]) -> str:
    reached = [h for h in hits if h is not None]
    if not reached:
        return "never"
    cell = _pm(reached, ",.0f")
    return cell if len(reached) == len(hits) else f"{cell} ({len(reached)} of {len(hits)} seeds)"


def table(policies: list[dict[str, Any]], config: dict[str, Any]) -> str:
    """The markdown table: one row per policy that ran, then one line per skipped policy."""
    rows = summaries(policies)
    ref = next((s for s in rows if s.key == REFERENCE), None)
    per_epoch, target, batch = config["steps_per_epoch"], config["target"], config["batch"]
    later = f"epochs 2-{config['epochs']}" if config["epochs"] > 2 else "epoch 2"
    head = [
        "policy",
        f"classes / batch of {batch}",
        "largest class's share of a batch",
        f"steps to {target:.0%} accuracy",
        "final accuracy %",
        "final loss",
        "final loss vs reference",
        f"loss vs reference, {later} (paired)",
        "in reference band, epoch 1",
        f"in reference band, {later}",
        "read s / epoch",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in rows:
        lines.append("| " + " | ".join(_row(s, ref, per_epoch, target)) + " |")
    for p in policies:
        if p["status"] != "ok":
            lines.append(f"\n{p['label']}: {p['status']}: {p['reason']}")
    return "\n".join(lines)


def _row(s: Summary, ref: Summary | None, per_epoch: int, target: float) -> list[str]:
    cells = [
        s.label,
        f"{s.classes:.2f}",
        f"{s.top_share:.0%}",
        _steps_cell(steps_to(s, target)),
        _pm(100 * s.accuracy[:, -1], ".1f"),
        _pm(s.loss[:, -1], ".3f"),
    ]
    if ref is None or s is ref:
        return [*cells, "—", "—", "—", "—", f"{s.read_seconds:.2f}"]
    rel = s.loss[:, -1].mean() / ref.loss[:, -1].mean() - 1
    late = s.steps > per_epoch
    cells += [f"{rel:+,.0%}" if abs(rel) >= 1 else f"{rel:+.1%}", _pct(paired_loss_gap(s, ref, late))]
    if len(ref.accuracy) < 2:  # one seed draws no band
        cells += ["—", "—"]
    else:
        first = (s.steps > 0) & (s.steps <= per_epoch)
        cells += [f"{in_band(s, ref, first):.0%}", f"{in_band(s, ref, late):.0%}"]
    return [*cells, f"{s.read_seconds:.2f}"]


def plot(policies: list[dict[str, Any]], config: dict[str, Any], path: str, near: float = 0.02) -> None:
    """Accuracy and loss vs step for every policy; below, the gap to the reference for those near it.

    The lower panels draw shardkit's policies and any other whose final mean accuracy is within
    ``near`` of the reference's, on a scale that shows differences of a fraction of a point.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summaries(policies)
    ref = next((s for s in rows if s.key == REFERENCE), None)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for s in sorted(rows, key=lambda s: STYLE.get(s.key, ("", "", 0, 0))[3]):
        _curves(axes[0], s)
        if ref is not None and s is not ref and (s.key.startswith("shardkit") or _near(s, ref, near)):
            _gaps(axes[1], s, ref)
    if ref is not None:
        _reference_band(axes[1], ref)
    _decorate(fig, axes, config, near)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _near(s: Summary, ref: Summary, near: float) -> bool:
    return bool(abs(s.accuracy[:, -1].mean() - ref.accuracy[:, -1].mean()) <= near)


def _curves(top: Any, s: Summary) -> None:
    colour, style, width, z = STYLE.get(s.key, ("#bcbd22", "-", 1.5, 1))
    for ax, values in zip(top, (100 * s.accuracy, s.loss), strict=True):
        ax.fill_between(s.steps, values.min(0), values.max(0), color=colour, alpha=0.15, lw=0, zorder=z)
        ax.plot(s.steps, values.mean(0), color=colour, ls=style, lw=width, zorder=z, label=s.label)


def _gaps(bottom: Any, s: Summary, ref: Summary) -> None:
    colour, style, width, z = STYLE.get(s.key, ("#bcbd22", "-", 1.5, 1))
    for ax, gap in zip(bottom, _gap(s, ref.accuracy.mean(0), ref.loss.mean(0)), strict=True):
        ax.plot(s.steps, gap.mean(0), color=colour, ls=style, lw=width, zorder=z, label=s.label)  # the reference's band is the yardstick


def _gap(s: Summary, acc: np.ndarray, loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy minus ``acc`` in points, and loss over ``loss`` minus 1 in percent (loss falls 25-fold, so relative)."""
    return 100 * (s.accuracy - acc), 100 * (s.loss / loss - 1)


def _reference_band(bottom: Any, ref: Summary) -> None:
    for ax, gap in zip(bottom, _gap(ref, ref.accuracy.mean(0), ref.loss.mean(0)), strict=True):
        ax.fill_between(ref.steps, gap.min(0), gap.max(0), color="k", alpha=0.18, lw=0, zorder=1, label="reference band")
        ax.axhline(0, color="k", lw=0.8, zorder=1)


def _decorate(fig: Any, axes: Any, config: dict[str, Any], near: float) -> None:
    per_epoch = config["steps_per_epoch"]
    for ax in axes.flat:
        for e in range(1, config["epochs"]):
            ax.axvline(e * per_epoch, color="0.6", lw=0.8, ls=":", zorder=0)
        ax.grid(alpha=0.25)
    axes[0, 0].set_ylabel("held-out accuracy %")
    axes[0, 1].set_ylabel("held-out loss (log scale)")
    axes[0, 1].set_yscale("log")
    axes[1, 0].set_ylabel("accuracy − reference mean (points)")
    axes[1, 1].set_ylabel("loss vs reference mean, %")
    for ax in axes[1]:
        ax.set_xlabel(f"training step (batch {config['batch']}; dotted lines: epoch boundaries)")
    # above the buffer shuffles' flat lines at chance, below MosaicML's curve
    axes[0, 0].legend(loc="lower right", bbox_to_anchor=(1, 0.08), fontsize=8, framealpha=0.9)
    axes[1, 0].legend(loc="lower right", fontsize=8, framealpha=0.9)
    axes[1, 0].set_title(
        f"shardkit, and any policy ending within {100 * near:.0f} points of the reference, minus the reference", fontsize=9
    )
    axes[1, 1].set_title("bands: min to max over seeds", fontsize=9)
    fig.suptitle(
        f"{config['data']}: held-out accuracy and loss under each shuffle policy (mean of {config['seeds']} seeds, band = min to max)",
        fontsize=11,
    )
    fig.tight_layout()
