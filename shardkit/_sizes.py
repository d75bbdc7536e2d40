"""Parse and format human byte sizes such as ``"2GiB"`` or ``"500MB"``."""

from __future__ import annotations

import re

from shardkit.errors import ConfigError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | float | str, *, what: str = "size") -> int:
    """Return ``value`` as a whole number of bytes.

    Accepts ints, floats (``3e9``) and strings like ``"64MiB"``, ``"2 GB"``, ``"1.5g"``.

    Raises:
        ConfigError: the value is not a positive size; the message names ``what``.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a size like 2GiB, got {value!r}")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        match = _SIZE.match(value)
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _UNITS:
            raise ConfigError(f"{what}: expected a size like 2GiB or 500MB, got {value!r}")
        number = float(match.group(1)) * _UNITS[unit]
    else:
        raise ConfigError(f"{what}: expected a size like 2GiB, got {type(value).__name__}")
    if not number >= 1:
        raise ConfigError(f"{what}: expected a positive size, got {value!r}")
    return int(number)


def format_size(n: float) -> str:
    """Format a byte count for people: ``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
