"""Draw a shuffle comparison as one PNG (matplotlib, the optional ``plot`` extra).

Four panels, one style per order: output position against source index (a subsample of points),
the histogram of normalized displacement against the uniform density 2(1-x), the number of
classes in each batch across the first epoch against its uniform expectation, and the co-batch
recurrence of each pair of consecutive epochs against 1 (independent shuffles). Every uniform
reference is drawn first, dashed, and shardkit's order last, so a shuffle that lies on the
reference still shows and no other order hides it.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Protocol

import numpy as np

from shardkit import storage
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
# a uniform reference: wide and pale beneath the orders, so a line lying on it still shows
_REFERENCE = {"color": "0.45", "linestyle": "--", "linewidth": 4, "alpha": 0.6, "zorder": 1}
_SHARDKIT = {"color": "tab:blue", "linestyle": "-", "marker": "o", "linewidth": 1.8, "zorder": 4}
_OTHERS = (
    {"color": "tab:orange", "linestyle": "-.", "marker": "^"},
    {"color": "tab:gray", "linestyle": ":", "marker": "s"},
    {"color": "tab:green", "linestyle": "-.", "marker": "D"},
    {"color": "tab:red", "linestyle": ":", "marker": "v"},
)
_KNOWN = {"webdataset": _OTHERS[0], "sequential": _OTHERS[1]}
_DENSITY_CAP = 4.5  # displacement densities above this are named, not drawn to scale


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


def styles(names: list[str]) -> dict[str, dict[str, Any]]:
    """A style per order, in drawing order: every other order first, shardkit's last (on top).

    Example:
        list(styles(["shardkit", "sequential", "webdataset"]))  # ['sequential', 'webdataset', 'shardkit']
    """
    others = [n for n in names if not n.startswith("shardkit")]
    spare = itertools.cycle(_OTHERS[2:])
    drawn = {n: {**(_KNOWN.get(n) or next(spare)), "linewidth": 1.2, "zorder": 2 + i / len(names)} for i, n in enumerate(others)}
    drawn.update({n: dict(_SHARDKIT) for n in names if n.startswith("shardkit")})
    return drawn


def draw(result: Comparison) -> Any:
    """The figure for ``result`` (a matplotlib Figure; the caller saves and closes it)."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(14, 10), layout="constrained")
    order_styles = styles(list(result.orders))
    firsts = {name: result.orders[name][0] for name in order_styles}
    n = len(next(iter(firsts.values())))
    _scatter_panel(axes[0, 0], firsts, order_styles, n)
    _displacement_panel(axes[0, 1], firsts, order_styles, n)
    _classes_panel(axes[1, 0], result, firsts, order_styles)
    _recurrence_panel(axes[1, 1], result, order_styles)
    # one legend for all four panels, outside them: a legend inside a panel would cover points
    handles = [plt.Line2D([], [], label="uniform shuffle", **_REFERENCE)]
    handles += [plt.Line2D([], [], label=name, markersize=6, **style) for name, style in reversed(order_styles.items())]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
    fig.suptitle(f"shuffle quality: {n:,} samples, batch {result.batch_size}")
    return fig


def check_path(path: str, what: str = "path") -> str:
    """The image format of ``path``, from its suffix; a ConfigError naming ``what`` when matplotlib
    cannot write that suffix (checked before the work)."""
    pyplot()  # the install hint first, when matplotlib is missing
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = os.path.splitext(path)[1]
    if suffix[1:].lower() not in FigureCanvasBase.get_supported_filetypes():
        raise ConfigError(f"{what}: {path}: expected an image file name (.png, .svg, .pdf, ...), got the suffix {suffix!r}")
    return suffix[1:].lower()


def plot_comparison(result: Comparison, path: str) -> None:
    """Write the four-panel figure for ``result`` to ``path`` (PNG, or the image format its suffix
    names), whole or not at all."""
    kind = check_path(path)
    fig = draw(result)
    try:
        with storage.atomic_write(path) as f:
            fig.savefig(f, dpi=100, format=kind)
    finally:
        pyplot().close(fig)


def _line(style: dict[str, Any], points: int) -> dict[str, Any]:
    """``style`` for a line of ``points`` points: markers spaced so that about 40 show."""
    return {**style, "markevery": max(1, points // 40), "markersize": 4}


def _outline(style: dict[str, Any]) -> dict[str, Any]:
    """``style`` for a histogram outline (no markers)."""
    return {k: v for k, v in style.items() if k != "marker"}


def _scatter_panel(ax: Any, firsts: dict[str, np.ndarray], order_styles: dict[str, dict[str, Any]], n: int) -> None:
    picked = np.sort(stream(Stream.SUBSAMPLE, 0).choice(n, size=min(n, _POINTS), replace=False))
    for name, style in order_styles.items():
        ax.scatter(firsts[name][picked], picked, s=3, alpha=0.6, color=style["color"], zorder=style["zorder"], rasterized=True)
    ax.set(xlabel="source index", ylabel="output position", title="output position vs source index (first epoch)")
    ax.set(xlim=(0, n), ylim=(0, n))


def _displacement_panel(ax: Any, firsts: dict[str, np.ndarray], order_styles: dict[str, dict[str, Any]], n: int) -> None:
    bins = np.linspace(0, 1, 51)
    grid = np.linspace(0, 1, 200)
    ax.plot(grid, 2 * (1 - grid), **_REFERENCE)
    peaks = {}
    for name, style in order_styles.items():
        x = np.abs(np.arange(n) - firsts[name]) / n
        heights, _, _ = ax.hist(x, bins=bins, density=True, histtype="step", **_outline(style))
        peaks[name] = float(np.max(heights))
    # a sorted order's spike would flatten every other line: cap the scale and say what is off it
    top = min(max(2.0, *peaks.values()), _DENSITY_CAP)
    off = [f"{name} peaks at {peak:.3g}" for name, peak in peaks.items() if peak > top]
    if off:
        ax.text(0.98, 0.97, "off the scale: " + ", ".join(off), ha="right", va="top", fontsize="small", transform=ax.transAxes)
    ax.set(xlabel="|pos - src| / n", ylabel="density", title="displacement (first epoch; uniform: 2(1-x))")
    ax.set(xlim=(0, 1), ylim=(0, top * 1.12))


def _classes_panel(ax: Any, result: Comparison, firsts: dict[str, np.ndarray], order_styles: dict[str, dict[str, Any]]) -> None:
    if result.labels is None:
        _empty(ax, "classes per batch: no label field")
        return
    cats = np.unique(result.labels, return_inverse=True)[1].reshape(-1)
    expected = result.reports[0].get("classes_per_batch")
    top, title = 1.0, "classes per batch (first epoch)"
    if expected is not None:
        ax.axhline(expected.expected, **_REFERENCE)
        top, title = expected.expected, f"classes per batch (first epoch; uniform: {expected.expected:.3g})"
    for name, style in order_styles.items():
        series = quality.distinct_series(cats[firsts[name]], result.batch_size)
        ax.plot(np.arange(len(series)), series, **_line(style, len(series)))
        top = max(top, float(series.max(initial=0)))
    ax.set(xlabel="batch", ylabel="distinct classes (higher is better)", title=title, ylim=(0, top * 1.1))


def _recurrence_panel(ax: Any, result: Comparison, order_styles: dict[str, dict[str, Any]]) -> None:
    epochs = min(len(o) for o in result.orders.values())
    if epochs < 2:
        _empty(ax, "co-batch recurrence: needs 2 or more epochs (--epochs 2)")
        return
    pairs = np.arange(epochs - 1)
    ax.axhline(1.0, **_REFERENCE)
    values = [1.0]
    for name, style in order_styles.items():
        ratios = [quality.recurrence(a, b, result.batch_size).value for a, b in itertools.pairwise(result.orders[name][:epochs])]
        ax.plot(pairs, ratios, markersize=7, **style)
        # the value, in the margin right of the last pair where no line runs
        note = {"xytext": (12, 0), "textcoords": "offset points", "va": "center", "color": style["color"], "fontsize": "small"}
        ax.annotate(f"{ratios[-1]:.3g}", (pairs[-1], ratios[-1]), **note)
        values += ratios
    _ratio_scale(ax, min(values), max(values))
    ax.set_xticks(pairs, [f"{e} -> {e + 1}" for e in pairs])
    ax.set_xlim(-0.4, epochs - 2 + 0.6)
    ax.set(xlabel="epoch pair", title="co-batch recurrence, later epochs (uniform: 1)")


def _ratio_scale(ax: Any, low: float, high: float) -> None:
    """A log scale for ratios from ``low`` to ``high`` with plain tick labels (linear when one is 0:
    a log scale would not show it)."""
    if low <= 0:
        ax.set(ylim=(0, high * 1.1), ylabel="recurrence (lower is better)")
        return
    ax.set_yscale("log")
    ticks = [t for t in (k * 10.0**e for e in range(-3, 7) for k in (1, 2, 5)) if low / 1.5 <= t <= high * 1.5]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.set(ylim=(low / 1.5, high * 1.5), ylabel="recurrence (lower is better; log scale)")


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
