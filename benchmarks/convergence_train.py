"""Train the convergence benchmark's model on one policy's stream and record held-out curves.

The model is a small 1-D CNN (three convolutions and a linear layer, 9,610 parameters) trained
with SGD and momentum on a cosine learning-rate schedule. For a given seed every policy starts
from the same initial weights and runs the same number of steps with the same schedule; only
the order of the training examples differs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from convergence_data import FEATURES, Split
from torch import nn

if TYPE_CHECKING:
    from convergence_policies import Reader


@dataclass(frozen=True)
class Schedule:
    """Batch size, epochs, optimizer settings and how often the held-out set is evaluated."""

    batch: int
    epochs: int
    lr: float
    momentum: float
    eval_every: int
    clip: float


@dataclass
class Curve:
    """One training run: held-out accuracy and loss at ``steps``, and what each epoch cost to read."""

    seed: int
    steps: list[int] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    read_seconds: list[float] = field(default_factory=list)
    classes_per_batch: list[float] = field(default_factory=list)
    top_class_share: list[float] = field(default_factory=list)


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Unflatten(1, (1, FEATURES)),
        nn.Conv1d(1, 32, kernel_size=5, padding=2),
        nn.ReLU(),
        nn.Conv1d(32, 32, kernel_size=3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv1d(32, 32, kernel_size=3, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * FEATURES // 4, 10),
    )


def initial_state(seed: int) -> dict[str, torch.Tensor]:
    """The initial weights for ``seed``, drawn without touching torch's global generator."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return {k: v.clone() for k, v in build_model().state_dict().items()}


def batch_mix(y: np.ndarray, batch: int) -> tuple[float, float]:
    """Mean distinct labels per batch, and mean share of a batch taken by its most common label.

    The second says what the first hides: a batch of 128 with 5 classes can still be 80% one class.
    """
    rows = y[: len(y) // batch * batch].reshape(-1, batch)
    counts = np.stack([np.bincount(r, minlength=10) for r in rows])
    return float(np.mean((counts > 0).sum(1))), float(np.mean(counts.max(1) / batch))


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    logits = model(x)
    return float((logits.argmax(1) == y).float().mean()), float(nn.functional.cross_entropy(logits, y))


def train(state: dict[str, torch.Tensor], reader: Reader, split: Split, schedule: Schedule, seed: int) -> Curve:
    """Train from ``state`` on ``reader``'s epochs; evaluate at step 0, every ``eval_every`` and at the end."""
    model = build_model()
    model.load_state_dict(state)
    per_epoch = len(split.y) // schedule.batch
    total = per_epoch * schedule.epochs
    optimizer = torch.optim.SGD(model.parameters(), lr=schedule.lr, momentum=schedule.momentum)
    cosine = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + np.cos(np.pi * s / total)))
    held = torch.from_numpy(split.x_held), torch.from_numpy(split.y_held)
    curve = Curve(seed=seed)
    _record(curve, 0, model, held)
    step = 0
    for e in range(schedule.epochs):
        x, y = _read_epoch(reader, e, curve, per_epoch * schedule.batch)
        classes, top = batch_mix(y, schedule.batch)
        curve.classes_per_batch.append(classes)
        curve.top_class_share.append(top)
        for k in range(per_epoch):
            batch = slice(k * schedule.batch, (k + 1) * schedule.batch)
            _step(model, optimizer, x[batch], y[batch], schedule.clip)
            cosine.step()
            step += 1
            if step % schedule.eval_every == 0 or step == total:
                _record(curve, step, model, held)
    return curve


def _read_epoch(reader: Reader, e: int, curve: Curve, needed: int) -> tuple[torch.Tensor, np.ndarray]:
    start = time.perf_counter()
    x, y = reader.epoch(e)
    curve.read_seconds.append(time.perf_counter() - start)
    if len(y) < needed:
        raise RuntimeError(f"epoch {e} yielded {len(y)} samples, fewer than the {needed} its steps need")
    return torch.from_numpy(np.ascontiguousarray(x[:needed])), y[:needed]


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: np.ndarray, clip: float) -> None:
    loss = nn.functional.cross_entropy(model(x), torch.from_numpy(y))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    # one-class batches push logits without bound until the next class's gradients explode;
    # clipping (far above what shuffled batches reach) keeps those runs finite
    nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()


def _record(curve: Curve, step: int, model: nn.Module, held: tuple[torch.Tensor, torch.Tensor]) -> None:
    accuracy, loss = evaluate(model, *held)
    curve.steps.append(step)
    curve.accuracy.append(accuracy)
    curve.loss.append(loss)
