"""Loader state dicts: small and JSON-able, and refused with the reason when they do not fit.

A state records the epoch, the position of a rank in its slice, the options that fix the order,
the world size and batch size that split it, and the phases of the epoch read before the last
change of those (:mod:`shardkit.loading.elastic`). Ranks move in step, so every rank's state is
the same: any one of them resumes all ranks, on the same world size or another.

state = make_state(epoch=2, position=512, options=opts, dataset="3539d8ee", samples=10_000)
resume = check_state(state, options=opts, dataset="3539d8ee", samples=10_000, name="data/")
resume.epoch, resume.position, resume.done
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shardkit._util import check_int, check_most, shown
from shardkit.errors import ConfigError
from shardkit.loading import elastic
from shardkit.loading.elastic import Phase
from shardkit.loading.options import MAX_WORLD, LoaderOptions

FORMAT = "shardkit.loader"
# version 2 adds "done", the phases read before a change of world size or batch size; a
# version 1 state (which has none) reads as a version 2 state with none
VERSION = 2
READS = (1, 2)
# options that change the order itself: a state taken with other values cannot resume
ORDER_OPTIONS = ("seed", "shuffle", "mix", "drop_last")
# options that split the order among ranks: a state taken with other values resumes on what is
# left of its epoch (its phase ends and the loader's starts)
SPLIT_OPTIONS = ("world_size", "batch_size")
# bounds on what a state may say, far past any real job, so a tampered state is refused rather
# than sized, looped over or overflowed: ranks, DataLoader workers a rank, phases in one epoch,
# epochs, and samples or stream positions (int64 in numpy)
MAX_WORKERS = 1 << 12
MAX_PHASES = 1 << 12
MAX_EPOCH = 1 << 40
MAX_POSITION = 1 << 62


def bounded(name: str, value: Any, *, low: int, most: int, why: str, none: bool = False) -> Any:
    """``value`` checked as an integer >= ``low`` (or None, when ``none``) and at most ``most``."""
    found = check_int(name, value, low=low, none=none)  # type: ignore[call-overload]
    check_most(name, found, most, why)
    return found


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a loader with given options resumes: ``position`` in its slice of the epoch's
    ``epoch`` that the phases ``done`` left."""

    epoch: int
    position: int
    done: tuple[Phase, ...] = ()


def identity(options: LoaderOptions, dataset: str, samples: int) -> dict[str, Any]:
    """What a state records of the loader: the order and split options and the data's fingerprint and size."""
    found: dict[str, Any] = {name: getattr(options, name) for name in ORDER_OPTIONS + SPLIT_OPTIONS}
    found.update(dataset=dataset, samples=samples)
    return found


def make_state(
    *,
    epoch: int,
    position: int,
    options: LoaderOptions,
    dataset: str,
    samples: int,
    done: Sequence[Phase] = (),
    generation: int | None = None,
) -> dict[str, Any]:
    """The state of a rank at ``position`` (samples read) of its slice of ``epoch`` (after the
    phases ``done``); ``generation`` pins the dataset's generation it was taken on (None: plain
    shards, which have none)."""
    state: dict[str, Any] = {"format": FORMAT, "version": VERSION, "epoch": epoch, "position": position}
    state.update(identity(options, dataset, samples))
    state["done"] = [phase.to_dict() for phase in done]
    if generation is not None:
        state["generation"] = generation
    return state


def pinned_generation(state: Any) -> int | None:
    """The dataset generation a state was taken on, or None when it names none."""
    generation = state.get("generation") if isinstance(state, dict) else None
    return None if generation is None else bounded("load_state_dict: generation", generation, low=0, most=MAX_EPOCH, why="generations")


def check_format(state: Any, fmt: str, version: int | tuple[int, ...], what: str) -> dict[str, Any]:
    """``state`` if it is a dict of format ``fmt`` and a version in ``version``, else a ConfigError."""
    versions = version if isinstance(version, tuple) else (version,)
    if not isinstance(state, dict) or state.get("format") != fmt:
        raise ConfigError(f"load_state_dict: not a {what} state (expected 'format': {fmt!r})")
    if state.get("version") not in versions:
        read = " or ".join(map(str, versions))
        raise ConfigError(f"load_state_dict: state version {state.get('version')!r}, this shardkit reads version {read}")
    return state


def check_identity(state: dict[str, Any], *, options: LoaderOptions, dataset: str, samples: int, name: str) -> None:
    """Refuse a state taken on other data or with other order options (each difference named)."""
    if state.get("dataset") != dataset or state.get("samples") != samples:
        raise ConfigError(
            f"load_state_dict: the state was taken on a different dataset (fingerprint {state.get('dataset')}, "
            f"{state.get('samples')} samples); this loader reads {name} (fingerprint {dataset}, {samples} samples). "
            "Resuming would not continue the same order."
        )
    check_order(state, options)


def check_order(state: dict[str, Any], options: LoaderOptions) -> None:
    """Refuse a state taken with other options that change the order (the first difference named)."""
    for option in ORDER_OPTIONS:
        if state.get(option) != getattr(options, option):
            raise ConfigError(
                f"load_state_dict: the state was taken with {option}={state.get(option)!r}, this loader has {option}={getattr(options, option)!r}"
            )


def check_split(state: dict[str, Any]) -> tuple[int, int | None]:
    """The world size and batch size a state was taken with."""
    world = bounded("load_state_dict: world_size", state.get("world_size"), low=1, most=MAX_WORLD, why="ranks of one job")
    return world, bounded("load_state_dict: batch_size", state.get("batch_size"), low=1, most=MAX_POSITION, why="int64", none=True)


def check_epoch(state: dict[str, Any]) -> int:
    """The epoch a state was taken in."""
    return bounded("load_state_dict: epoch", state.get("epoch"), low=0, most=MAX_EPOCH, why="epochs of one run")


class RestOf(Protocol):
    """The global ranges of an epoch a phase of ``world`` ranks of ``batch_size`` splits after the
    phases ``done`` (:meth:`shardkit.loading.source.Source.rest`); ValueError for phases that
    cannot be."""

    def __call__(self, done: Sequence[Phase], *, world: int, batch_size: int | None, drop_last: bool) -> list[elastic.Range]: ...


def check_done(
    state: dict[str, Any], *, rest: RestOf, world: int, batch_size: int | None, drop_last: bool
) -> tuple[tuple[Phase, ...], list[elastic.Range]]:
    """The phases a state records as read before its own, and the ranges of the epoch its own
    phase (``world`` ranks of ``batch_size``) splits after them."""
    found = state.get("done", [])
    if not isinstance(found, list):
        raise ConfigError(f"load_state_dict: done: expected a list of phases, got {type(found).__name__}")
    if len(found) > MAX_PHASES:
        raise ConfigError(f"load_state_dict: done: expected at most {MAX_PHASES} phases in one epoch, got {len(found)}")
    done = []
    for i, item in enumerate(found):
        where = f"load_state_dict: done[{i}]"
        if not isinstance(item, dict) or set(item) != {"world_size", "batch_size", "read"} or not isinstance(item["read"], list):
            raise ConfigError(f"{where}: expected {{'world_size': int, 'batch_size': int or None, 'read': [int, ...]}}, got {shown(item)}")
        world_ = bounded(f"{where}.world_size", item["world_size"], low=1, most=MAX_WORLD, why="ranks of one job")
        batch = bounded(f"{where}.batch_size", item["batch_size"], low=1, most=MAX_POSITION, why="int64", none=True)
        if not 1 <= len(item["read"]) <= MAX_WORKERS:
            raise ConfigError(f"{where}.read: expected one count per worker, 1 to {MAX_WORKERS} of them, got {len(item['read'])}")
        read = tuple(bounded(f"{where}.read[{w}]", n, low=0, most=MAX_POSITION, why="int64") for w, n in enumerate(item["read"]))
        done.append(Phase(world_, batch, read))
    try:
        return tuple(done), rest(done, world=world, batch_size=batch_size, drop_last=drop_last)
    except ValueError as e:
        raise ConfigError(f"load_state_dict: {e}") from None


def check_state(state: Any, *, options: LoaderOptions, dataset: str, samples: int, name: str, rest: RestOf) -> Resume:
    """Where a loader with ``options`` resumes a state taken on the same data with the same order options.

    A state taken with another world size or batch size ends its phase there: the loader reads
    what is left of the epoch, split among its own ranks (:mod:`shardkit.loading.elastic`);
    ``rest`` says what each phase splits.

    Raises:
        ConfigError: the state is malformed, was taken on other data (fingerprint or sample
            count differ), with other order options (each is named), or points off its slice
            or off a batch boundary.
    """
    state = check_format(state, FORMAT, READS, "shardkit loader")
    check_identity(state, options=options, dataset=dataset, samples=samples, name=name)
    return check_position(state, options=options, rest=rest)


def check_position(state: dict[str, Any], *, options: LoaderOptions, rest: RestOf) -> Resume:
    """Where a loader with ``options`` resumes ``state`` (whose data and order options were checked)."""
    epoch = check_epoch(state)
    world, batch = check_split(state)
    done, left = check_done(state, rest=rest, world=world, batch_size=batch, drop_last=options.drop_last)
    index, workers = options.worker
    length = elastic.length(
        elastic.share(left, world=world, rank=0, drop_last=options.drop_last, batch_size=batch, workers=workers, worker=index)
    )
    position = check_int("load_state_dict: position", state.get("position"), low=0, high=length)
    if batch and position % batch and position != length:
        raise ConfigError(f"load_state_dict: position {position} is not on a batch boundary (batch_size={batch})")
    if (world, batch) == (options.world_size, options.batch_size):
        return Resume(epoch, position, done)
    return close(Resume(epoch, position, done), Phase(world, batch, (position,)), left, drop_last=options.drop_last)


def close(resume: Resume, phase: Phase, rest: Sequence[elastic.Range], *, drop_last: bool) -> Resume:
    """``resume`` with its phase, which read as far as ``phase`` says, ended: the next one starts.

    A phase that read nothing is dropped; one that read all of its slices ended the epoch.
    """
    if not any(phase.read):
        return Resume(resume.epoch, 0, resume.done)
    sizes = elastic.worker_lengths(rest, world=phase.world_size, drop_last=drop_last, batch_size=phase.batch_size, workers=len(phase.read))
    if list(phase.read) == sizes:
        return Resume(resume.epoch + 1, 0)
    return Resume(resume.epoch, 0, (*resume.done, phase))
