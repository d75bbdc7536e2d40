"""Shuffle-quality reports: one value per metric next to its uniform expectation, as text or JSON.

metric = Metric("kendall_tau", "Kendall tau", 0.001, 0.0, z=0.7)
report = QualityReport(name="x", samples=n, batch_size=256, epochs=1, metrics=(metric,))
print(report.table()); json.dumps(report.to_dict())
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Metric", "QualityReport", "side_by_side"]


@dataclass(frozen=True)
class Metric:
    """One measured value next to its expectation under a uniform permutation.

    Attributes:
        key: machine name (``"kendall_tau"``).
        label: what the table prints.
        value: the measured value.
        expected: its mean under a uniformly random permutation of the same data.
        z: ``(value - expected) / sd`` when the null standard deviation is known, else None.
        note: how the null was obtained when that is not exact.
    """

    key: str
    label: str
    value: float
    expected: float
    z: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """``value / expected``, or None when the expectation is 0."""
        return self.value / self.expected if self.expected else None

    def score(self) -> str:
        """``z=+1.23`` when a z-score exists, else ``x1.02`` (the ratio)."""
        if self.z is not None:
            return f"z={self.z:+.2f}" if abs(self.z) < 1e4 else f"z={self.z:+.2e}"
        return f"x{self.ratio:.3g}" if self.ratio is not None else "-"


def _fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 1e5 else f"{x:.3e}"


@dataclass(frozen=True, kw_only=True)
class QualityReport:
    """The metrics of one order (and its later epochs), printable and JSON-able.

    Example::

        report = measure(order, labels=labels, batch_size=256, name="shardkit")
        print(report.table())
        report["dispersion"].value   # ~1.0 for a uniform shuffle
    """

    name: str
    samples: int
    batch_size: int
    epochs: int
    metrics: tuple[Metric, ...]

    def __getitem__(self, key: str) -> Metric:
        metric = self.get(key)
        if metric is not None:
            return metric
        raise KeyError(f"{self.name}: no metric {key!r} (have {[m.key for m in self.metrics]})")

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None

    def get(self, key: object) -> Metric | None:
        """The metric named ``key``, or None when this report lacks it."""
        return next((m for m in self.metrics if m.key == key), None)

    def table(self) -> str:
        """A text table: metric, value, expected under uniform, z-score or ratio."""
        rows = [(m.label, _fmt(m.value), _fmt(m.expected), m.score()) for m in self.metrics]
        title = f"{self.name}: {self.samples} samples, batch {self.batch_size}, {self.epochs} epoch(s)"
        return title + "\n" + _render(("metric", "value", "uniform", "z / ratio"), rows)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-able): name, samples, batch_size, epochs and the metrics by key."""
        metrics = {m.key: {**asdict(m), "ratio": m.ratio} for m in self.metrics}
        return {"name": self.name, "samples": self.samples, "batch_size": self.batch_size, "epochs": self.epochs, "metrics": metrics}


def _render(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def side_by_side(reports: Sequence[QualityReport]) -> str:
    """One table with a column pair (value, z or ratio) per report, for the metrics of the first.

    The ``uniform`` column is taken from the first report; metrics a report lacks print ``-``.
    """
    if not reports:
        return ""
    first = reports[0]
    header = ["metric", "uniform"]
    for r in reports:
        header += [r.name, ""]
    rows = []
    for m in first.metrics:
        row = [m.label, _fmt(m.expected)]
        for r in reports:
            other = r.get(m.key)
            row += [_fmt(other.value), other.score()] if other else ["-", ""]
        rows.append(row)
    title = f"{first.samples} samples, batch {first.batch_size}, {first.epochs} epoch(s)"
    return title + "\n" + _render(header, rows)
