"""Loader state dicts: small and JSON-able, and refused with the reason when they do not fit.

state = make_state(epoch=2, position=512, options=opts, dataset="3539d8ee", samples=10_000)
epoch, position = check_state(state, options=opts, dataset="3539d8ee", samples=10_000,
                              name="data/", length=5_000)
"""

from __future__ import annotations

from typing import Any

from shardkit._util import check_int
from shardkit.errors import ConfigError
from shardkit.loading.options import LoaderOptions

FORMAT = "shardkit.loader"
VERSION = 1
# options that change the order or the slicing: a state taken with other values cannot resume
ORDER_OPTIONS = ("seed", "shuffle", "mix", "batch_size", "drop_last", "world_size")


def identity(options: LoaderOptions, dataset: str, samples: int) -> dict[str, Any]:
    """What a state must match to resume: the order options and the data's fingerprint and size."""
    found: dict[str, Any] = {name: getattr(options, name) for name in ORDER_OPTIONS}
    found.update(dataset=dataset, samples=samples)
    return found


def make_state(
    *, epoch: int, position: int, options: LoaderOptions, dataset: str, samples: int, generation: int | None = None
) -> dict[str, Any]:
    """The state of a rank at ``position`` (samples read) of ``epoch``; ``generation`` pins the
    dataset's generation it was taken on (None: plain shards, which have none)."""
    state: dict[str, Any] = {"format": FORMAT, "version": VERSION, "epoch": epoch, "position": position}
    state.update(identity(options, dataset, samples))
    if generation is not None:
        state["generation"] = generation
    return state


def pinned_generation(state: Any) -> int | None:
    """The dataset generation a state was taken on, or None when it names none."""
    generation = state.get("generation") if isinstance(state, dict) else None
    return None if generation is None else check_int("load_state_dict: generation", generation, low=0)


def check_format(state: Any, fmt: str, version: int, what: str) -> dict[str, Any]:
    """``state`` if it is a dict of format ``fmt`` and version ``version``, else a ConfigError."""
    if not isinstance(state, dict) or state.get("format") != fmt:
        raise ConfigError(f"load_state_dict: not a {what} state (expected 'format': {fmt!r})")
    if state.get("version") != version:
        raise ConfigError(f"load_state_dict: state version {state.get('version')!r}, this shardkit reads version {version}")
    return state


def check_identity(state: dict[str, Any], *, options: LoaderOptions, dataset: str, samples: int, name: str) -> None:
    """Refuse a state taken on other data or with other order options (each difference named)."""
    if state.get("dataset") != dataset or state.get("samples") != samples:
        raise ConfigError(
            f"load_state_dict: the state was taken on a different dataset (fingerprint {state.get('dataset')}, "
            f"{state.get('samples')} samples); this loader reads {name} (fingerprint {dataset}, {samples} samples). "
            "Resuming would not continue the same order."
        )
    for option in ORDER_OPTIONS:
        if state.get(option) != getattr(options, option):
            raise ConfigError(
                f"load_state_dict: the state was taken with {option}={state.get(option)!r}, this loader has {option}={getattr(options, option)!r}"
            )


def check_state(state: Any, *, options: LoaderOptions, dataset: str, samples: int, name: str, length: int) -> tuple[int, int]:
    """``(epoch, position)`` of a state taken on the same data with the same order options.

    Raises:
        ConfigError: the state is malformed, was taken on other data (fingerprint or sample
            count differ), with other order options (each is named), or points off the epoch
            or off a batch boundary.
    """
    state = check_format(state, FORMAT, VERSION, "shardkit loader")
    check_identity(state, options=options, dataset=dataset, samples=samples, name=name)
    epoch = check_int("load_state_dict: epoch", state.get("epoch"), low=0)
    position = check_int("load_state_dict: position", state.get("position"), low=0, high=length)
    if options.batch_size and position % options.batch_size and position != length:
        raise ConfigError(f"load_state_dict: position {position} is not on a batch boundary (batch_size={options.batch_size})")
    return epoch, position
