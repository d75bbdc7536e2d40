"""``shardkit demo``: a class-sorted image dataset written naively and as piles, read back, compared.

Everything is made in memory: ``samples`` tiny synthetic JPEG images in ``classes`` classes,
stored sorted by class (all of class 0, then all of class 1, ...: how datasets often arrive).
The same samples are written twice:

1. sequentially into shards with ``webdataset.ShardWriter`` (the naive baseline), then read
   back with WebDataset's usual shuffle: shard order shuffled plus a 1000-sample buffer;
2. into M random piles with :class:`shardkit.PileWriter`, then read back with
   :func:`shardkit.loader` (pile order permuted, each pile shuffled in memory).

It prints samples/s of writing and reading (one process, raw bytes, no decoding), the mean
number of distinct classes in a batch of 256 for the order as written, for WebDataset's shuffle
and for shardkit (a uniform shuffle gets about 10 of 10), and the peak memory each reader added.

    result = demo(samples=20_000, quiet=True)
    print(result.table())
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from shardkit import _util
from shardkit._util import check_int, check_most, ctrl_c_deferred, format_size
from shardkit.errors import ConfigError
from shardkit.loading.loader import loader as open_loader
from shardkit.seeds import Stream, stream
from shardkit.tools import quality
from shardkit.tools.audit import info
from shardkit.tools.orders import webdataset_order

IMAGE_SIDE = 32
# distinct images encoded per class; samples reuse them (encoding is not what is measured)
_VARIANTS = 200

# the most of anything the demo makes: it holds its whole synthetic dataset in memory
MAX_DEMO = 10_000_000
# the file that marks a folder as an earlier demo's output, which a demo may replace
MARK = ".shardkit-demo"
# the batch of the classes-per-batch and recurrence figures, unless the caller gives another
BATCH_SIZE = 256


def check_samples(samples: int, batch_size: int = BATCH_SIZE) -> None:
    """Refuse fewer samples than one batch before anything is made: the figures measure batches."""
    if samples < batch_size:
        raise ConfigError(f"samples: expected at least {batch_size} (one batch of the classes-per-batch figure), got {samples}")


def make_images(samples: int, classes: int, seed: int) -> tuple[list[bytes], np.ndarray]:
    """Class-sorted JPEG images: sample i has class ``i * classes // samples``.

    Each class has its own colour; each variant its own noise, so images differ in bytes too.
    """
    from PIL import Image

    rng = stream(Stream.DEMO, seed)
    colours = rng.integers(40, 216, size=(classes, 3))
    encoded: list[list[bytes]] = []
    for colour in colours:
        variants = []
        for _ in range(min(_VARIANTS, samples)):
            noise = rng.integers(-40, 40, size=(IMAGE_SIDE, IMAGE_SIDE, 3))
            pixels = np.clip(colour + noise, 0, 255).astype(np.uint8)
            out = io.BytesIO()
            Image.fromarray(pixels).save(out, format="JPEG", quality=85)
            variants.append(out.getvalue())
        encoded.append(variants)
    labels = np.arange(samples) * classes // samples
    variant = rng.integers(0, len(encoded[0]), size=samples)
    return [encoded[c][v] for c, v in zip(labels.tolist(), variant.tolist(), strict=True)], labels


def _resident() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class PeakMemory:
    """Peak resident memory above the level at entry, sampled every 2 ms (Linux; else None).

    One daemon thread samples until the block exits; ``added`` is then the peak increase.

        with PeakMemory() as memory:
            work()
        print(memory.added)
    """

    def __init__(self) -> None:
        self.added: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="shardkit-demo-memory", daemon=True)
        self._base = _resident()
        self._peak = self._base or 0

    def _sample(self) -> None:
        # invariant: only this thread writes _peak until _stop is set and the thread is joined
        while not self._stop.wait(0.002):
            self._peak = max(self._peak, _resident() or 0)

    def __enter__(self) -> PeakMemory:
        if self._base is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._base is None:
            return
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, _resident() or 0)
        self.added = self._peak - self._base


@dataclass(frozen=True, kw_only=True)
class Row:
    """One line of the demo's table; None where a figure does not apply."""

    name: str
    write_per_s: float | None
    read_per_s: float | None
    classes_per_batch: float
    recurrence: float
    read_memory: int | None


@dataclass(frozen=True, kw_only=True)
class DemoResult:
    """What :func:`demo` measured.

    result = demo(samples=20_000, quiet=True)
    sequential, webdataset, piles = result.rows
    print(piles.classes_per_batch, result.uniform_classes)
    """

    samples: int
    classes: int
    piles: int
    batch_size: int
    rows: tuple[Row, ...]
    uniform_classes: float
    loader_ram: int
    out: str | None

    def table(self) -> str:
        """The side-by-side comparison printed by ``shardkit demo``; every column says which way is better."""
        head = (
            f"shardkit demo: {self.samples:,} synthetic {IMAGE_SIDE}x{IMAGE_SIDE} JPEG images in {self.classes} classes, "
            f"stored sorted by class\n"
        )
        lines = [
            head,
            f"{'':<40} {'write/s':>9} {'read/s':>9} {'classes/batch':>14} {'recurrence':>11} {'read memory':>12}",
            f"{'better when':<40} {'higher':>9} {'higher':>9} {'higher':>14} {'lower':>11} {'lower':>12}",
        ]
        for row in self.rows:
            write = f"{row.write_per_s:,.0f}" if row.write_per_s else "-"
            read = f"{row.read_per_s:,.0f}" if row.read_per_s else "-"
            memory = f"+{format_size(row.read_memory)}" if row.read_memory is not None else "-"
            lines.append(f"{row.name:<40} {write:>9} {read:>9} {row.classes_per_batch:>14.1f} {row.recurrence:>11.1f} {memory:>12}")
        lines.append(f"{'a uniform shuffle, for reference':<40} {'-':>9} {'-':>9} {self.uniform_classes:>14.1f} {1.0:>11.1f} {'-':>12}")
        lines.append("\n" + self._legend())
        if self.out:
            lines.append(f"data kept in {self.out} (sequential/, piles/)")
        return "\n".join(lines)

    def _legend(self) -> str:
        return "\n".join(
            (
                "write/s, read/s: samples per second in one process, raw bytes, no decoding. Higher is better.",
                f"classes/batch: distinct classes in a batch of {self.batch_size}. Higher is better, up to the "
                f"{self.uniform_classes:.1f} a uniform shuffle gets.",
                "recurrence: pairs batched together in epoch 0 and again in epoch 1, over what two independent shuffles give.\n"
                "  Lower is better, down to 1.0 (fresh shuffles). Later epochs reuse pile membership; loader(mix=k) and\n"
                "  shardkit repile lower it (shardkit quality DIR measures it).",
                f"read memory: the most memory a reader added. Lower is better. shardkit's loader holds at most two piles:\n"
                f"  {format_size(self.loader_ram)} here (shardkit info DIR shows it).",
            )
        )


def _samples(images: list[bytes], labels: np.ndarray) -> Iterator[dict]:
    for i, (jpg, label) in enumerate(zip(images, labels.tolist(), strict=True)):
        yield {"__key__": f"{i:08d}", "jpg": jpg, "cls": label}


def _claim(root: str) -> None:
    """Make ``root`` the demo's, refusing one whose ``sequential/`` or ``piles/`` holds what an
    earlier demo did not write there (the demo replaces both): marked by :data:`MARK`.

    Raises:
        ConfigError: naming what is there and what to do.
    """
    mark = os.path.join(root, MARK)
    held = [d for d in (os.path.join(root, "sequential"), os.path.join(root, "piles")) if os.path.isdir(d) and os.listdir(d)]
    if held and not os.path.exists(mark):
        raise ConfigError(
            f"{root}: {' and '.join(held)} hold files an earlier shardkit demo did not write, and the demo replaces "
            "sequential/ and piles/ there: give it a new or empty folder"
        )
    os.makedirs(root, exist_ok=True)
    with open(mark, "w", encoding="utf-8") as f:
        f.write("written by shardkit demo: it replaces sequential/ and piles/ here when run again\n")


def _write_sequential(directory: str, images: list[bytes], labels: np.ndarray, maxcount: int) -> tuple[list[str], float]:
    with ctrl_c_deferred():  # webdataset imports torch, which mishandles Ctrl-C while importing
        import webdataset as wds

    os.makedirs(directory, exist_ok=True)
    for old in glob.glob(os.path.join(directory, "shard-*.tar")):
        os.unlink(old)
    start = time.perf_counter()
    with wds.ShardWriter(os.path.join(directory, "shard-%06d.tar"), maxcount=maxcount, verbose=0) as sink:
        for sample in _samples(images, labels):
            sink.write(sample)
    return sorted(glob.glob(os.path.join(directory, "shard-*.tar"))), time.perf_counter() - start


def _write_piles(directory: str, images: list[bytes], labels: np.ndarray, piles: int, seed: int) -> float:
    from shardkit.piles.writer import PileWriter

    start = time.perf_counter()
    with PileWriter(directory, piles=piles, seed=seed, overwrite=True) as sink:
        for sample in _samples(images, labels):
            sink.write(sample)
    return time.perf_counter() - start


def _timed_order(samples: Iterator[dict]) -> tuple[np.ndarray, float, int | None]:
    """Drain a sample stream: source indices in read order, the seconds it took, the memory it added."""
    with PeakMemory() as memory:
        start = time.perf_counter()
        order = np.array([int(s["__key__"]) for s in samples], dtype=np.int64)
        seconds = time.perf_counter() - start
    return order, seconds, memory.added


def _read_webdataset(urls: list[str], buffer: int, seed: int) -> tuple[np.ndarray, float, int | None]:
    with ctrl_c_deferred():  # webdataset imports torch, which mishandles Ctrl-C while importing
        import webdataset as wds

    dataset = wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False).shuffle(buffer, seed=seed)
    return _timed_order(iter(dataset))


def _read_shardkit(directory: str, seed: int) -> tuple[np.ndarray, float, int | None, np.ndarray]:
    """Epoch 0 timed, then epoch 1's order (for the recurrence between them)."""
    with open_loader(directory, seed=seed, decode=False, world_size=1, rank=0) as piles:
        order, seconds, memory = _timed_order(iter(piles))
        second = np.array([int(s["__key__"]) for s in piles], dtype=np.int64)
    return order, seconds, memory, second


def demo(
    out: str | os.PathLike[str] | None = None,
    *,
    samples: int = 50_000,
    classes: int = 10,
    piles: int = 16,
    batch_size: int = BATCH_SIZE,
    buffer: int = 1000,
    seed: int = 0,
    quiet: bool = False,
) -> DemoResult:
    """Make the class-sorted dataset, write and read it both ways, and measure.

    Args:
        out: keep the data here (``OUT/sequential/shard-*.tar``, ``OUT/piles/``; both replaced
            when an earlier demo wrote them, refused when they hold anything else); None works
            in a temporary directory removed afterwards.
        samples, classes: size of the synthetic dataset.
        piles: M for the pile writer.
        batch_size: batch size of the classes-per-batch figure.
        buffer: WebDataset's shuffle buffer.
        quiet: no progress bar.
    """
    for name, value in (("samples", samples), ("classes", classes), ("piles", piles), ("batch_size", batch_size), ("buffer", buffer)):
        check_int(name, value, low=1)
        check_most(name, value, MAX_DEMO, "the demo holds its whole dataset in memory")
    check_samples(samples, batch_size)
    with contextlib.ExitStack() as stack:
        root = os.fspath(out) if out is not None else stack.enter_context(tempfile.TemporaryDirectory(prefix="shardkit-demo-"))
        if out is not None:
            _claim(root)
        progress = stack.enter_context(_util.bar(total=5, desc="demo", unit="step", quiet=quiet))

        def step(what: str) -> None:
            progress.set_postfix_str(what)
            progress.update(1)

        labels, rows = _measure(
            root, samples=samples, classes=classes, piles=piles, batch_size=batch_size, buffer=buffer, seed=seed, step=step
        )
        loader_ram = info(os.path.join(root, "piles")).loader_ram()
    return DemoResult(
        samples=samples,
        classes=classes,
        piles=piles,
        batch_size=batch_size,
        rows=rows,
        uniform_classes=quality.classes_per_window(labels, batch_size).expected,
        loader_ram=loader_ram,
        out=os.fspath(out) if out is not None else None,
    )


def _measure(
    root: str, *, samples: int, classes: int, piles: int, batch_size: int, buffer: int, seed: int, step: Callable[[str], None]
) -> tuple[np.ndarray, tuple[Row, ...]]:
    """Make, write and read the data in ``root``; the labels as written and one row per order."""
    images, labels = make_images(samples, classes, seed)
    step("images made")
    urls, seq_write = _write_sequential(os.path.join(root, "sequential"), images, labels, max(1, samples // 10))
    step("sequential shards written")
    pile_write = _write_piles(os.path.join(root, "piles"), images, labels, piles, seed)
    del images
    step("piles written")
    wds_order, wds_read, wds_memory = _read_webdataset(urls, buffer, seed)
    step("read with webdataset")
    sk_order, sk_read, sk_memory, sk_next = _read_shardkit(os.path.join(root, "piles"), seed)
    step("read with shardkit")
    # webdataset's next epoch, pick for pick as its reader would make it, without a second slow read
    counts = [samples // len(urls) + (i < samples % len(urls)) for i in range(len(urls))]
    wds_next = webdataset_order(counts, seed=seed, epoch=1, bufsize=buffer, initial=min(100, buffer), shardshuffle=len(urls))
    sequential = np.arange(samples)

    def mixing(order: np.ndarray, following: np.ndarray) -> dict[str, float]:
        return {
            "classes_per_batch": quality.classes_per_window(labels[order], batch_size).value,
            "recurrence": quality.recurrence(order, following, batch_size).value,
        }

    rows = (
        Row(name="sequential shards, in written order", write_per_s=samples / seq_write, read_per_s=None, read_memory=None,
            **mixing(sequential, sequential)),
        Row(name=f"webdataset: shard shuffle + buffer {buffer}", write_per_s=None, read_per_s=len(wds_order) / wds_read,
            read_memory=wds_memory, **mixing(wds_order, wds_next)),
        Row(name=f"shardkit: {piles} piles, loader", write_per_s=samples / pile_write, read_per_s=len(sk_order) / sk_read,
            read_memory=sk_memory, **mixing(sk_order, sk_next)),
    )  # fmt: skip
    return labels, rows
