"""Small helpers every layer shares: checked option values, human byte sizes, progress bars.

check_int("piles", 0, low=1)
# ConfigError: piles: expected an integer >= 1, got 0
parse_size("2GiB")        # 2147483648
format_size(1536)         # "1.5 KiB"
counted(1, "pile")        # "1 pile" (counted(8, "pile"): "8 piles")
"""

from __future__ import annotations

import contextlib
import importlib
import operator
import os
import re
import signal
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal, overload

from tqdm import tqdm

from shardkit.errors import ConfigError

# the version shardkit reports (the facade's __version__, the manifest's created_by)
VERSION = "0.1.0"

try:  # zlib-ng computes the same CRC-32 with carry-less multiplication (~12 GB/s here, zlib ~3.6), without the GIL
    from zlib_ng import zlib_ng as _zlib
except ImportError:  # pragma: no cover - a platform without zlib-ng wheels
    import zlib as _zlib  # type: ignore[no-redef]

crc32 = _zlib.crc32
# the CRC-32 of two byte strings joined, from theirs and the second's length; None where zlib-ng is missing
crc32_combine = getattr(_zlib, "crc32_combine", None)


def optional(module: str, extra: str, what: str) -> Any:
    """The module ``module`` of an optional package, imported; when it is not installed, a
    ConfigError saying that ``what`` needs it and which extra installs it."""
    package = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == package:
            raise ConfigError(f"{what} needs {package}, which is not installed: pip install 'shardkit[{extra}]'") from None
        raise ConfigError(f"{what} needs {package}, which is installed but does not import ({e}): reinstall it") from e


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


def check_most(name: str, value: int | None, most: int, why: str) -> None:
    """Refuse an integer (already checked) above ``most``: ``piles: at most 1000000 (each is a file), got 10**9``."""
    if value is not None and value > most:
        raise ConfigError(f"{name}: expected at most {most} ({why}), got {shown(value)}")


def _integer(value: Any) -> int | None:
    """``value`` as a plain int when it is an integer (numpy's included), not a bool; else None."""
    kind = type(value)  # numpy's bool too: older numpy takes it as an index
    if isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")):
        return None
    try:
        return operator.index(value)  # floats and strings refuse this
    except TypeError:
        return None


def check_path(name: str, value: Any) -> str:
    """``value`` as a path or URL: a non-empty string or an ``os.PathLike``; else a ConfigError naming ``name``."""
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{name}: expected a path or URL, got {shown(value)}")
    if "\0" in text:  # the OS refuses it, as a ValueError from deep inside
        raise ConfigError(f"{name}: a path or URL cannot hold a NUL character, got {shown(value)}")
    return text


def check_paths(name: str, value: Any) -> str | list[str]:
    """A path, URL or pattern (returned as a string), or a non-empty list of them (returned as a list).

    Raises:
        ConfigError: ``NAME: expected a path, URL or pattern, or a list of them, got 5``; an
            empty list; an item that is not a path (``NAME[2]: ...``).
    """
    if isinstance(value, (str, os.PathLike)):
        return check_path(name, value)
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise ConfigError(f"{name}: expected a path, URL or pattern, or a list of them, got {shown(value)}")
    items = list(value)
    if not items:
        raise ConfigError(f"{name}: expected at least one path, URL or pattern, got an empty list")
    return [check_path(f"{name}[{i}]", item) for i, item in enumerate(items)]


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is True or False; anything else (``"false"``, 0, None) is a ConfigError naming ``name``."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name}: expected True or False, got {shown(value)}")
    return value


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
# the largest size parse_size accepts (4 EiB): every byte count fits a signed 64-bit integer
MAX_SIZE = 1 << 62
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | float | str, *, what: str = "size") -> int:
    """Return ``value`` as a whole number of bytes.

    Accepts ints, floats (``3e9``) and strings like ``"64MiB"``, ``"2 GB"``, ``"1.5g"``.

    Raises:
        ConfigError: the value is not a positive size; the message names ``what``.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a size like 2GiB, got {value!r}")
    number: float
    if isinstance(value, int):
        number = value  # exact: a huge int would overflow a float
    elif isinstance(value, float):
        number = value
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
    if number > MAX_SIZE:  # sizes and offsets are 64-bit integers in numpy and in tar
        raise ConfigError(f"{what}: expected at most 2**62 bytes (4 EiB), got {shown(value)}")
    return int(number)


_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([smhdw])\s*$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# the longest duration taken: a thousand years, far inside what a datetime can add
MAX_DURATION = 1000 * 366 * 86400


def parse_duration(value: str | int | float, *, what: str) -> float:
    """Seconds in ``"90d"``, ``"1h"``, ``"30m"``, ``"45s"``, ``"2w"`` (or a number of seconds).
    A bare ``"0"`` is zero in any unit; any other number written without a unit is refused (on a
    command line, ``--grace 90`` meant as days would be 90 seconds).

    Raises:
        ConfigError: not a duration; the message names ``what``.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        seconds = float(value)
    elif isinstance(value, str) and value.strip() == "0":
        seconds = 0.0
    else:
        match = _DURATION.match(value) if isinstance(value, str) else None
        if match is None:
            raise ConfigError(f"{what}: expected a duration like 90d, 12h, 30m or 45s, got {shown(value)}")
        seconds = float(match.group(1)) * _SECONDS[match.group(2)]
    if not seconds <= MAX_DURATION:  # inf and overflow too
        raise ConfigError(f"{what}: expected a duration of at most 1000 years, got {shown(value)}")
    return seconds


def format_size(n: float) -> str:
    """Format a byte count for people: ``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def counted(n: int, noun: str, *, grouped: bool = False) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (``noun`` is a regular English noun, last in
    its phrase: ``"oversized pile"``); ``grouped`` writes ``n`` with thousands separators."""
    number = f"{n:,}" if grouped else str(n)
    return f"{number} {noun}" if n == 1 else f"{number} {noun}s"


def bar(*, total: int | None, desc: str, unit: str, quiet: bool = False, **kwargs: Any) -> tqdm:
    """A tqdm bar that is silent when ``quiet`` or when stderr is not a terminal."""
    disable = quiet or not sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, disable=disable, dynamic_ncols=True, file=sys.stderr, **kwargs)


@contextlib.contextmanager
def ctrl_c_deferred() -> Iterator[None]:
    """Hold Ctrl-C back until the block ends: for imports of libraries (torch, through webdataset)
    that turn a KeyboardInterrupt in the middle of their import into a RuntimeError or an abort.
    A Ctrl-C pressed meanwhile arrives as the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed: list[int] = []
    # a handler that only notes the key: the kernel may hand SIGINT to any thread, but Python runs
    # handlers in the main thread, between the library's own statements, where a note is harmless
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        raise KeyboardInterrupt
