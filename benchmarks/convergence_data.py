"""Build the convergence benchmark's data: MNIST-1D, class-sorted, as tar shards and as MDS.

MNIST-1D comes from the ``mnist1d`` package's own generator (``mnist1d.data.make_dataset``),
which draws every example from ten hand-made 1-D digit templates with random padding,
scaling, translation, shear and correlated noise, then resamples to 40 points. It runs
offline: only ``get_dataset`` would download, and it is never called here. The training split
is then sorted by class, as a preprocessing job that walks a labelled source class by class
leaves it, and written once as WebDataset shards (``.npy`` features, ``.cls`` label), the
input every tar-reading policy shares.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

FEATURES = 40  # mnist1d's default final_seq_length


@dataclass(frozen=True)
class Split:
    """Training examples in class order and a fixed held-out set, as float32 and int64 arrays."""

    x: np.ndarray
    y: np.ndarray
    x_held: np.ndarray
    y_held: np.ndarray


def mnist1d(train: int, held_out: int, cache_dir: str) -> Split:
    """Generate (or reuse) MNIST-1D with ``train + held_out`` examples; training part class-sorted."""
    path = os.path.join(cache_dir, f"mnist1d-{train}-{held_out}.npz")
    if not os.path.exists(path):
        os.makedirs(cache_dir, exist_ok=True)
        x, y, x_held, y_held = _generate(train, held_out)
        partial = path + ".partial.npz"
        np.savez(partial, x=x, y=y, x_held=x_held, y_held=y_held)
        os.replace(partial, path)
    with np.load(path) as z:
        x, y = z["x"], z["y"]
        order = np.argsort(y, kind="stable")  # class order, examples of a class in generator order
        return Split(x=x[order], y=y[order], x_held=z["x_held"], y_held=z["y_held"])


def _generate(train: int, held_out: int) -> tuple[np.ndarray, ...]:
    import matplotlib

    matplotlib.use("Agg")  # mnist1d imports pyplot; keep it off any display
    from mnist1d.data import get_dataset_args, make_dataset

    total = train + held_out
    if total % 10:
        raise ValueError(f"train + held_out must be a multiple of 10 (the generator makes total // 10 per class), got {total}")
    args = get_dataset_args()  # the package's defaults (its own seed, 42), only the size changed
    args.num_samples = total
    args.train_split = train / total
    data = make_dataset(args)  # seeds numpy's global generator itself; nothing here draws from it
    f32 = np.float32
    return data["x"].astype(f32), data["y"].astype(np.int64), data["x_test"].astype(f32), data["y_test"].astype(np.int64)


def write_shards(split: Split, out: str, per_shard: int) -> list[str]:
    """Write the class-sorted training examples as WebDataset shards of ``per_shard`` samples."""
    import webdataset as wds

    done = os.path.join(out, "done.json")
    if not os.path.exists(done):
        os.makedirs(out, exist_ok=True)
        with wds.ShardWriter(os.path.join(out, "sorted-%06d.tar"), maxcount=per_shard, verbose=0) as writer:
            for i in range(len(split.y)):
                writer.write({"__key__": f"{i:07d}", "npy": split.x[i], "cls": int(split.y[i])})
        files = sorted(f for f in os.listdir(out) if f.endswith(".tar"))
        with open(done, "w") as f:
            json.dump(files, f)
    with open(done) as f:
        return [os.path.join(out, name) for name in json.load(f)]


def write_mds(split: Split, out: str, per_shard: int) -> tuple[str, float]:
    """Write the same class-sorted examples as MosaicML MDS; returns (directory, mean samples a shard)."""
    index = os.path.join(out, "index.json")
    if not os.path.exists(index):
        streaming = import_streaming()
        # an MDS sample is its column bytes plus a 4-byte offset; size_limit is in bytes
        sample_bytes = FEATURES * 4 + 8 + 4
        columns = {"x": f"ndarray:float32:{FEATURES}", "y": "int"}
        with streaming.MDSWriter(out=out, columns=columns, size_limit=per_shard * sample_bytes, compression=None) as writer:
            for i in range(len(split.y)):
                writer.write({"x": split.x[i], "y": int(split.y[i])})
    with open(index) as f:
        shards = json.load(f)["shards"]
    return out, float(np.mean([s["samples"] for s in shards]))


def import_streaming():
    """Import MosaicML ``streaming`` with stand-ins for what it imports and cannot load here
    (torchvision built for another torch, transformers not installed): see
    ``bench_read._import_streaming``."""
    from bench_read import _import_streaming

    return _import_streaming()[0]
