"""Does the loader keep a device busy? ResNet-18 trained from class-sorted JPEG piles, side by side.

For each number of DataLoader workers, three ways of feeding the same training step, each in a
fresh process (repeats alternate their order; medians shown):

- ``device``: batches already decoded and in (pinned) memory, fed again and again: the device's
  own rate, the ceiling for the others;
- ``shardkit``: ``ShardkitDataLoader(ShardkitDataset(piles, decode=True, batch_size=B))``:
  JPEGs decoded and batches collated in the workers, handed over in shared memory;
- ``webdataset``: ``WebDataset(shards).shuffle(1000).decode("rgb8").to_tuple("jpg", "cls")
  .batched(B)`` in a DataLoader with the same workers, on the class-sorted shards;

plus, for each loader, the loader alone (no training step). It prints images/s, classes per
batch (mean distinct classes in each batch of B) and each rate as a fraction of the device's.

On a GPU (``--device cuda``) batches are pinned and copied without blocking, and the step runs
under bf16 autocast. ResNet-18 is built here from ``torch.nn`` (the torchvision model's layers
and widths): torchvision's PyPI wheels are CUDA builds that cannot load next to the CPU torch.

    python benchmarks/gpu_feed.py --device cuda --images 60000 --side 112 --workers 2,4,8,14
    python benchmarks/gpu_feed.py --toy          # seconds, on CPU: what the test suite runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import datagen
import harness

SYSTEMS = ("device", "shardkit", "webdataset", "shardkit alone", "webdataset alone")


def resnet18(classes: int) -> Any:
    """ResNet-18 (He et al. 2016; the layout torchvision's ``resnet18`` uses)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + (x if self.down is None else self.down(x)))

    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


class Trainer:
    """One SGD step of ResNet-18 on a batch of HWC uint8 images, on ``device``."""

    def __init__(self, device: str, classes: int) -> None:
        import torch

        torch.manual_seed(0)
        self.torch, self.device = torch, torch.device(device)
        self.model = resnet18(classes).to(self.device).to(memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.amp = self.device.type == "cuda"

    def step(self, images: Any, labels: Any) -> None:
        torch = self.torch
        x = images.to(self.device, non_blocking=True).permute(0, 3, 1, 2).float().div_(255)
        y = labels.to(self.device, non_blocking=True).long()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            loss = torch.nn.functional.cross_entropy(self.model(x.contiguous(memory_format=torch.channels_last)), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()


def _batches(system: str, p: dict[str, Any]) -> Any:
    """The loader of ``system``, yielding ``(images NHWC uint8 tensor, labels tensor)``."""
    import torch

    pin = p["device"].startswith("cuda")
    if system.startswith("shardkit"):
        from shardkit.torch import ShardkitDataLoader, ShardkitDataset

        dataset = ShardkitDataset(p["piles"], batch_size=p["batch"], decode=True, map=_image_label, seed=0)
        loader = ShardkitDataLoader(dataset, num_workers=p["workers"], pin_memory=pin)
    else:
        import webdataset as wds

        dataset = wds.WebDataset(p["shards"], shardshuffle=True, seed=0).shuffle(1000).decode("rgb8").to_tuple("jpg", "cls")
        loader = torch.utils.data.DataLoader(dataset.batched(p["batch"]), batch_size=None, num_workers=p["workers"], pin_memory=pin)
    return loader


def _image_label(sample: dict[str, Any]) -> dict[str, Any]:
    return {"jpg": sample["jpg"], "cls": sample["cls"]}


def _pair(system: str, batch: Any) -> tuple[Any, Any]:
    import torch

    if system.startswith("shardkit"):
        return batch["jpg"], batch["cls"]
    images, labels = batch
    return (images if isinstance(images, torch.Tensor) else torch.as_tensor(images)), torch.as_tensor(labels)


def feed(p: dict[str, Any]) -> dict[str, Any]:
    """One system at one worker count, in this process: images/s and classes per batch."""
    import torch

    torch.set_num_threads(p["threads"])
    system = p["system"]
    trainer = None if system.endswith("alone") else Trainer(p["device"], 10)
    images = 0
    classes: list[int] = []
    if system == "device":
        assert trainer is not None
        pairs = [_pair("shardkit", b) for b, _ in zip(_batches("shardkit", p | {"workers": 0}), range(4), strict=False)]
        if p["device"].startswith("cuda"):
            pairs = [(x.pin_memory(), y.pin_memory()) for x, y in pairs]
        trainer.step(*pairs[0])  # warm-up: kernels chosen, memory allocated
        trainer.sync()
        start = time.perf_counter()
        for i in range(p["steps"]):
            x, y = pairs[i % len(pairs)]
            trainer.step(x, y)
            images += len(y)
        trainer.sync()
        return {"images_per_s": images / (time.perf_counter() - start), "classes_per_batch": None}
    start = time.perf_counter()
    for batch in _batches(system, p):
        x, y = _pair(system, batch)
        if trainer is not None:
            trainer.step(x, y)
        images += len(y)
        classes.append(len(set(y.tolist())))
    if trainer is not None:
        trainer.sync()
    return {"images_per_s": images / (time.perf_counter() - start), "classes_per_batch": statistics.mean(classes) if classes else None}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="torch device of the training step (cuda on a GPU machine; default cpu)")
    parser.add_argument("--images", type=int, default=60000, help="class-sorted JPEGs in the data set (default 60000)")
    parser.add_argument("--side", type=int, default=112, help="image side in pixels (default 112)")
    parser.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    parser.add_argument("--workers", default="2,4,8,14", help="comma-separated DataLoader worker counts (default 2,4,8,14)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each system at each worker count (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch compute threads in the training process (default 1)")
    parser.add_argument("--data", default=None, help="where the data set is built and reused (default benchmarks/results/gpu_feed)")
    parser.add_argument("--json", default=None, help="also write every run here")
    parser.add_argument(
        "--toy", action="store_true", help="tiny data on CPU in seconds: 48 images of 32 px, batches of 16, 1 worker, 1 run"
    )
    args = parser.parse_args(argv)
    if args.toy:
        args.images, args.side, args.batch, args.workers, args.repeats, args.device = 48, 32, 16, "1", 1, "cpu"
    args.workers = [int(w) for w in args.workers.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data_dir = os.path.abspath(args.data or os.path.join(harness.HERE, "results", "gpu_feed"))
    spec = datagen.DataSpec(f"jpeg{args.side}", samples=args.images, images=args.side, piles=(max(4, args.images // 2000),))
    data = datagen.build(spec, data_dir)
    common = {
        "piles": data.piles[spec.piles[0]], "shards": data.shards, "device": args.device, "batch": args.batch, "threads": args.threads,
        "steps": max(4, args.images // args.batch),
    }  # fmt: skip
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in range(args.repeats):
        for workers in args.workers:
            order = SYSTEMS if (r + workers) % 2 == 0 else SYSTEMS[::-1]
            for system in order:
                result = harness.measure_python("gpu_feed:feed", common | {"system": system, "workers": workers}, timeout=3600)
                runs.setdefault((system, workers), []).append(result)
                print(f"{system} workers={workers} run {r + 1}: {result['images_per_s']:,.0f} images/s", file=sys.stderr, flush=True)
    print(report(runs, args, data.samples))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": {f"{s}@{w}": v for (s, w), v in runs.items()}}, f, indent=1)
    return 0


def report(runs: dict[tuple[str, int], list[dict[str, Any]]], args: argparse.Namespace, images: int) -> str:
    """The table: per worker count and system, median images/s, classes per batch and the fraction of the device's rate."""
    lines = [
        f"Command: `python benchmarks/gpu_feed.py {' '.join(sys.argv[1:])}`".rstrip(),
        f"Device: {args.device}; {images:,} class-sorted JPEGs of {args.side} px; batch {args.batch}; "
        f"{args.repeats} run(s) each, medians; {os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.2f} at the end.",
        "",
        "| workers | feed | images/s | classes/batch | × device's rate |",
        "|---|---|---|---|---|",
    ]
    for workers in args.workers:
        device = statistics.median(r["images_per_s"] for r in runs[("device", workers)])
        for system in SYSTEMS:
            rs = runs[(system, workers)]
            rate = statistics.median(r["images_per_s"] for r in rs)
            cls = [r["classes_per_batch"] for r in rs if r["classes_per_batch"] is not None]
            shown = f"{statistics.median(cls):.2f}" if cls else "—"
            lines.append(f"| {workers} | {system} | {rate:,.0f} | {shown} | {rate / device:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
