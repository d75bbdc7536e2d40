"""State dicts: a :class:`~shardkit.loading.position.Position` written small and JSON-able, and
read back, or refused with the reason, by every reader through the same two functions.

A state records the epoch, the options that fix the order, the world size and batch size that
split it, the phases of the epoch read before the last change of those
(:mod:`shardkit.loading.elastic`), what identifies the data, and how far the phase in progress
got, in one of three formats (:class:`Format`): a loader's and a blend's count the samples a
rank read of its slice (a blend's add each source's stream position, a dataset's its
generation), ``shardkit.torch``'s the items a rank's DataLoader yielded and its workers. Ranks
move in step, so every rank's state is the same: any one of them resumes all ranks, on the
same split or another.

    state = write(position, LOADER, options=opts, dataset="3539d8ee", samples=10_000)
    position = read(check_format(state, LOADER), LOADER, options=opts, dataset="3539d8ee",
                    samples=10_000, name="data/", rest=source.rest)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardkit._util import check_int, check_most, shown
from shardkit.errors import ConfigError
from shardkit.loading import elastic
from shardkit.loading.elastic import Phase, RestOf
from shardkit.loading.options import MAX_WORLD, LoaderOptions
from shardkit.loading.position import Position, at_items
from shardkit.loading.turns import worker_items


@dataclass(frozen=True)
class Format:
    """A kind of state: its ``format`` name, the version written, the versions read, what it is
    called in an error, and whether it counts items a DataLoader yielded (else samples read)."""

    name: str
    version: int
    reads: tuple[int, ...]
    what: str
    items: bool = False


# version 2 adds "done", the phases read before a change of world size or batch size; a
# version 1 state (which has none) reads as a version 2 state with none
LOADER = Format("shardkit.loader", 2, (1, 2), "shardkit loader")
# version 2 adds "done" and each source's "start" (its stream position when the epoch began) and
# "wanted"; a version 1 state (taken before a blend could change split) reads as one with none
BLEND = Format("shardkit.blend", 2, (1, 2), "shardkit blend")
# version 2 adds "done", also after a change of the number of workers
TORCH = Format("shardkit.torch", 2, (1, 2), "shardkit.torch dataset", items=True)
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
MAX_EPOCH = 1 << 40  # plan.MOST_EPOCH + 1: the epoch after the last a loader reads
MAX_POSITION = 1 << 62


def bounded(name: str, value: Any, *, low: int, most: int, why: str, none: bool = False) -> Any:
    """``value`` checked as an integer >= ``low`` (or None, when ``none``) and at most ``most``."""
    found = check_int(name, value, low=low, none=none)  # type: ignore[call-overload]
    check_most(name, found, most, why)
    return found


def identity(options: LoaderOptions, dataset: str, samples: int) -> dict[str, Any]:
    """What a state records of the loader: the order and split options and the data's fingerprint and size."""
    found: dict[str, Any] = {name: getattr(options, name) for name in ORDER_OPTIONS + SPLIT_OPTIONS}
    found.update(dataset=dataset, samples=samples)
    return found


def pinned_generation(state: Any, where: str = "load_state_dict: generation") -> int | None:
    """The dataset generation a state (or a blend state's source, called ``where``) was taken on, or None when it names none."""
    generation = state.get("generation") if isinstance(state, dict) else None
    return None if generation is None else bounded(where, generation, low=0, most=MAX_EPOCH, why="generations")


def check_format(state: Any, fmt: Format) -> dict[str, Any]:
    """``state`` if it is a dict of format ``fmt`` in a version it reads, else a ConfigError."""
    if not isinstance(state, dict) or state.get("format") != fmt.name:
        raise ConfigError(f"load_state_dict: not a {fmt.what} state (expected 'format': {fmt.name!r})")
    if state.get("version") not in fmt.reads:
        read = " or ".join(map(str, fmt.reads))
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


def write(position: Position, fmt: Format, *, options: LoaderOptions, dataset: str, samples: int) -> dict[str, Any]:
    """The state of ``position`` in format ``fmt``, taken with ``options`` on the data ``dataset``
    (its fingerprint) of ``samples`` samples. A loader's position has one worker a rank."""
    state: dict[str, Any] = {"format": fmt.name, "version": fmt.version, "epoch": position.epoch}
    world, batch, workers = position.split
    if fmt.items:
        state.update(taken=position.taken, workers=workers)
    else:
        state["position"] = position.phase.read[0]
    state.update(identity(options, dataset, samples))
    state.update(world_size=world, batch_size=batch, done=[phase.to_dict() for phase in position.done])
    if position.generation is not None:
        state["generation"] = position.generation
    return state


def read(
    state: dict[str, Any],
    fmt: Format,
    *,
    options: LoaderOptions,
    dataset: str,
    samples: int,
    name: str,
    rest: RestOf,
    order_only: bool = False,
) -> Position:
    """The position ``state`` (of format ``fmt``, checked with :func:`check_format`) records, once
    checked against the data (``dataset`` fingerprint, ``samples``, called ``name``) and
    ``options``' order (only that, with ``order_only``); ``rest`` says what each phase splits.

    The position is on the state's own split: a reader settles (:func:`~shardkit.loading.position.settle`)
    it on its own, which ends its phase when they differ.

    Raises:
        ConfigError: the state is malformed, was taken on other data (fingerprint or sample
            count differ), with other order options (each is named), or points off its slice
            or off a batch boundary.
    """
    if order_only:
        check_order(state, options)
    else:
        check_identity(state, options=options, dataset=dataset, samples=samples, name=name)
    epoch = check_epoch(state)
    world, batch = check_split(state)
    drop_last = options.drop_last
    # sized and looped over below: 2**40 workers would take hours before any check could fail
    workers = (
        bounded("load_state_dict: workers", state.get("workers"), low=1, most=MAX_WORKERS, why="DataLoader workers of a rank")
        if fmt.items
        else 1
    )
    done, span = check_done(state, rest=rest, world=world, batch_size=batch, drop_last=drop_last)
    start = Position(epoch, Phase(world, batch, (0,) * workers), done, generation=pinned_generation(state))
    if fmt.items:
        length = sum(worker_items(span, world=world, batch_size=batch, workers=workers, drop_last=drop_last))
        taken = check_int("load_state_dict: taken", state.get("taken"), low=0, high=max(1, length) - 1)
        return at_items(start, taken, rest=rest, drop_last=drop_last)
    length = elastic.length(elastic.share(span, world=world, rank=0, drop_last=drop_last, batch_size=batch))
    position = check_int("load_state_dict: position", state.get("position"), low=0, high=length)
    if batch and position % batch and position != length:
        raise ConfigError(f"load_state_dict: position {position} is not on a batch boundary (batch_size={batch})")
    return Position(epoch, Phase(world, batch, (position,)), done, generation=start.generation)
