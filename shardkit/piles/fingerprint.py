"""A pass-1 job's fingerprint: what a resumed job must share with the one that left the parts, and how two differ.

A job run again with ``resume=True`` takes up the parts of the interrupted one only when the
two are the same job: the shardkit version, the input units (their number and a hash of each, in
order), ``fn`` (its qualified name and a hash of its code) and the options that change the bytes.

    job = fingerprint(units, fn, {"piles": 64, "seed": 0})
    differences(before, job)     # ["seed was 0, is 1"]
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import pickle
import struct
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shardkit._util import VERSION


def _code_digest(code: types.CodeType, h: Any) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_digest(const, h)
        else:
            h.update(repr(const).encode())


def describe_fn(fn: Callable[..., Any]) -> dict[str, str]:
    """``fn``'s qualified name and a hash of its code (its bytecode and constants, or its source);
    ``code`` is ``""`` when there is no code to hash (a builtin, a callable object's C method)."""
    inner = fn
    bound = ""
    while isinstance(inner, functools.partial):
        bound += repr((inner.args, sorted(inner.keywords.items())))
        inner = inner.func
    if inspect.isroutine(inner) or inspect.isclass(inner):
        target, func = inner, inspect.unwrap(inner)
    else:  # a callable object: its class's __call__, and what it holds when its repr shows it
        target, func = type(inner), type(inner).__call__
        shown = repr(inner)
        bound += "" if " at 0x" in shown else shown
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
    code = getattr(func, "__code__", None)
    if code is None:
        return {"name": name, "code": ""}
    h = hashlib.sha256(bound.encode())
    _code_digest(code, h)
    return {"name": name, "code": h.hexdigest()[:16]}


def _unit_bytes(unit: Any) -> bytes:
    if isinstance(unit, (str, os.PathLike)):
        return os.fspath(unit).encode("utf-8", "surrogateescape")
    try:
        return pickle.dumps(unit, protocol=4)
    except Exception:
        return repr(unit).encode("utf-8", "backslashreplace")


def fingerprint(units: Sequence[Any], fn: Callable[..., Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """What a resumed job must share with the one that left the parts: the shardkit version, the
    input units (their number and a hash of each in order), ``fn`` (by :func:`describe_fn`) and
    ``options`` (those that change the bytes written: M, seed, max_pile_bytes, codecs...)."""
    h = hashlib.sha256()
    for unit in units:
        data = _unit_bytes(unit)
        h.update(struct.pack("<Q", len(data)))
        h.update(data)
    return {
        "shardkit": VERSION,
        "units": len(units),
        "inputs": h.hexdigest()[:32],
        "fn": describe_fn(fn),
        **{k: options[k] for k in sorted(options)},
    }


def _shown(value: Any) -> str:
    """An option's value in a message: a function (a :func:`describe_fn` record) by its name."""
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        return value["name"]
    return repr(value)


def differences(then: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What differs between the fingerprint ``then`` and ``now``, one phrase each (the start time aside)."""
    said = []
    for key in sorted(set(then) | set(now)):
        a, b = then.get(key), now.get(key)
        if a == b or key == "started":
            continue
        if key == "inputs" and then.get("units") == now.get("units"):
            said.append(f"the input units differ (the same number, {b and now.get('units')}, but other values or order)")
        elif key == "fn" and isinstance(a, dict) and isinstance(b, dict) and a.get("name") == b.get("name"):
            said.append(f"fn {b.get('name')} has other code than it had")
        elif key == "fn" and isinstance(a, dict) and isinstance(b, dict):
            said.append(f"fn was {a.get('name')}, is {b.get('name')}")
        elif key != "inputs":
            said.append(f"{key} was {_shown(a)}, is {_shown(b)}")
    return said
