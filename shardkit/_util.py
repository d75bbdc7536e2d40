"""Check integer arguments, with one message style for every option, job field and call.

check_int("piles", 0, low=1)
# ConfigError: piles: expected an integer >= 1, got 0
quality = check_int("quality", 90, low=1, high=100)
"""

from __future__ import annotations

import operator
from typing import Any, Literal, overload

from shardkit.errors import ConfigError


def shown(value: Any) -> str:
    """How a wrong value is shown in a message: a short repr, or the type of a container."""
    if isinstance(value, (dict, list)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def expected_int(low: int | None = None, high: int | None = None, *, none: bool = False) -> str:
    """What an integer check asks for, in words: ``"an integer between 1 and 100"``."""
    if low is not None and high is not None:
        what = f"an integer between {low} and {high}"
    elif low is not None:
        what = f"an integer >= {low}"
    elif high is not None:
        what = f"an integer <= {high}"
    else:
        what = "an integer"
    return what + (" or None" if none else "")


@overload
def check_int(
    name: str | None,
    value: Any,
    *,
    low: int | None = ...,
    high: int | None = ...,
    none: Literal[False] = ...,
    error: type[Exception] = ...,
) -> int: ...


@overload
def check_int(
    name: str | None,
    value: Any,
    *,
    low: int | None = ...,
    high: int | None = ...,
    none: Literal[True],
    error: type[Exception] = ...,
) -> int | None: ...


def check_int(
    name: str | None,
    value: Any,
    *,
    low: int | None = None,
    high: int | None = None,
    none: bool = False,
    error: type[Exception] = ConfigError,
) -> int | None:
    """Return ``value`` if it is an int in ``[low, high]`` (or None, when ``none``); else raise.

    ``True``/``False`` are refused although bool subclasses int (``piles=True`` is a mistake,
    not 1), and so are floats (even ``2.0``) and numeric strings. Numpy integers are accepted
    and returned as ``int`` (sizes often come out of array arithmetic).

    Args:
        name: the argument, as the caller knows it; None when the caller prefixes the place
            itself (a YAML field gets ``FILE: path.to.key: `` from :mod:`shardkit._schema`).
        value: what was given.
        low, high: inclusive bounds; None for no bound.
        none: None is allowed (and returned).
        error: the exception class to raise (the caller's documented one).

    Raises:
        error: ``NAME: expected an integer >= LOW, got VALUE``.
    """
    if value is None and none:
        return None
    number = _integer(value)
    if number is None or (low is not None and number < low) or (high is not None and number > high):
        prefix = f"{name}: " if name else ""
        raise error(f"{prefix}expected {expected_int(low, high, none=none)}, got {shown(value)}")
    return number


def _integer(value: Any) -> int | None:
    """``value`` as a plain int when it is an integer (numpy's included), not a bool; else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # numpy's bool refuses this, floats and strings too
    except TypeError:
        return None
