"""Draw a shuffle comparison as one PNG (matplotlib, the optional ``plot`` extra).

Three panels, one colour per order: output position against source index (a subsample of
points), the histogram of normalized displacement against the uniform density 2(1-x), and the
number of classes in each batch across the first epoch against its uniform expectation.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from shardkit._util import ctrl_c_deferred
from shardkit.errors import ConfigError
from shardkit.seeds import Stream, stream
from shardkit.tools import quality


class Comparison(Protocol):
    """What is drawn: the orders compared (per name, one per epoch), their labels and reports
    (:class:`shardkit.tools.compare.Comparison` is one)."""

    @property
    def reports(self) -> tuple[quality.QualityReport, ...]: ...
    @property
    def orders(self) -> dict[str, list[np.ndarray]]: ...
    @property
    def labels(self) -> np.ndarray | None: ...
    @property
    def batch_size(self) -> int: ...


_POINTS = 6000  # scatter points per order: enough to see structure, few enough to stay legible
_COLORS = ("tab:blue", "tab:gray", "tab:orange", "tab:green", "tab:red")


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend; a ConfigError with the install hint when absent."""
    try:
        with ctrl_c_deferred():
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'shardkit[plot]'") from None
    return plt


def plot_comparison(result: Comparison, path: str) -> None:
    """Write the three-panel figure for ``result`` to ``path`` (PNG)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), layout="constrained")
    firsts = {name: epochs[0] for name, epochs in result.orders.items()}
    n = len(next(iter(firsts.values())))
    picked = np.sort(stream(Stream.SUBSAMPLE, 0).choice(n, size=min(n, _POINTS), replace=False))
    ax = axes[0]
    for (name, order), color in zip(firsts.items(), _COLORS, strict=False):
        ax.scatter(order[picked], picked, s=2, alpha=0.5, color=color, label=name, rasterized=True)
    ax.set(xlabel="source index", ylabel="output position", title="output position vs source index", xlim=(0, n), ylim=(0, n))
    ax.legend(markerscale=5, loc="upper left", fontsize="small")
    _displacement_panel(axes[1], firsts, n)
    _classes_panel(axes[2], result, firsts)
    fig.suptitle(f"shuffle quality: {n} samples, batch {result.batch_size}")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _displacement_panel(ax, firsts: dict[str, np.ndarray], n: int) -> None:
    bins = np.linspace(0, 1, 51)
    for (name, order), color in zip(firsts.items(), _COLORS, strict=False):
        x = np.abs(np.arange(n) - order) / n
        ax.hist(x, bins=bins, density=True, histtype="step", linewidth=1.5, color=color, label=name)
    grid = np.linspace(0, 1, 200)
    ax.plot(grid, 2 * (1 - grid), "k--", linewidth=1, label="uniform: 2(1-x)")
    ax.set(xlabel="|pos - src| / n", ylabel="density", title="displacement", xlim=(0, 1), ylim=(0, 3))
    ax.legend(fontsize="small")


def _classes_panel(ax, result: Comparison, firsts: dict[str, np.ndarray]) -> None:
    if result.labels is None:
        ax.text(0.5, 0.5, "no label field", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    cats = np.unique(result.labels, return_inverse=True)[1].reshape(-1)
    batch = result.batch_size
    expected = result.reports[0].get("classes_per_batch")
    if expected is not None:  # drawn first, dotted: a uniform shuffle's line lies right on it
        ax.axhline(expected.expected, color="k", linestyle=":", linewidth=1.5, label=f"uniform: {expected.expected:.3g}", zorder=3)
    top = expected.expected if expected is not None else 1.0
    for (name, order), color in zip(firsts.items(), _COLORS, strict=False):
        series = quality.distinct_series(cats[order], batch)
        ax.plot(np.arange(len(series)), series, linewidth=1.0, color=color, label=name, zorder=2)
        top = max(top, float(series.max(initial=0)))
    ax.set(xlabel="batch", ylabel="distinct classes", title="classes per batch (first epoch)", ylim=(0, top * 1.12))
    ax.legend(fontsize="small")
