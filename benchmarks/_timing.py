"""Time the consumption of a stream of samples or batches, inside a contender's process.

The clock starts when the caller has imported its library and before it builds its dataset or
loader, so "first sample" includes everything a user waits for after ``import``: opening files,
reading indexes, filling shuffle buffers, loading the first pile.

    clock = Clock()
    stream = build_loader()
    figures = consume(stream, clock, label=lambda s: s["cls"])
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

CLASS_WINDOW = 256


def cpu_seconds() -> float:
    """User + system time of this process and of its children that have been waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def load_shardkit() -> None:
    """Import every public name of shardkit now: its names load on first use, and the first use
    must fall with the imports, not in the timed part (as it did when the package loaded all at once)."""
    try:
        import shardkit
    except ImportError:  # a peer's run without shardkit on the path
        return
    for name in shardkit.__all__:
        getattr(shardkit, name)


class Clock:
    """A started stopwatch; ``elapsed()`` is seconds since it was made.

    The last clock made is kept in ``Clock.last`` with the CPU time at its start, so the
    process entry point can report the CPU spent from then on, workers included.
    """

    last: Clock | None = None

    def __init__(self) -> None:
        self.cpu_start = cpu_seconds()
        self.start = time.perf_counter()
        Clock.last = self

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def classes_per_window(labels: list[Any], window: int = CLASS_WINDOW) -> float | None:
    """Mean number of distinct labels in consecutive windows of ``window`` (partial one dropped)."""
    counts = [len(set(labels[i : i + window])) for i in range(0, len(labels) - window + 1, window)]
    return sum(counts) / len(counts) if counts else None


def _label_key(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return int(bytes(value))
    return int(value)


def consume(
    stream: Iterable[Any],
    clock: Clock,
    *,
    label: Callable[[Any], Any] | None = None,
    batch_labels: Callable[[Any], Iterable[Any]] | None = None,
    batch_len: Callable[[Any], int] | None = None,
) -> dict[str, Any]:
    """Drain ``stream``; returns samples, seconds, first-sample time and classes per 256 samples.

    For a stream of single samples pass ``label``; for batches pass ``batch_len`` (samples in a
    batch) and optionally ``batch_labels``. Labels are kept as they come and parsed after the
    clock stops, so the loop costs about what the consumer a user would write costs.
    """
    labels: list[Any] = []
    samples = 0
    first = None
    if batch_len is None:
        for item in stream:
            if first is None:
                first = clock.elapsed()
            samples += 1
            if label is not None:
                labels.append(label(item))
    else:
        for item in stream:
            if first is None:
                first = clock.elapsed()
            samples += batch_len(item)
            if batch_labels is not None:
                labels.extend(batch_labels(item))
    seconds = clock.elapsed()
    labels = [_label_key(v) for v in labels]
    return {
        "samples": samples,
        "seconds": seconds,
        "first_sample_s": first,
        "classes_per_batch": classes_per_window(labels) if labels else None,
    }
