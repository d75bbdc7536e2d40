"""Check plain YAML values field by field, with errors that name the file and the field path.

fields = Fields(doc, source="job.yaml", path="output", allowed=("path", "piles"))
piles = fields.take("piles", positive_int, required=True)
# ConfigError: job.yaml: output.piles: expected an integer >= 1, got 'sixty'
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from shardkit._util import check_int, shown
from shardkit.errors import ConfigError

T = TypeVar("T")


def positive_int(value: Any) -> int:
    return check_int(None, value, low=1)


def count(most: int, why: str) -> Callable[[Any], int]:
    """An integer from 1 to ``most``; ``why`` says what the bound protects."""

    def check(value: Any) -> int:
        found = positive_int(value)
        if found > most:
            raise ConfigError(f"expected at most {most} ({why}), got {shown(value)}")
        return found

    return check


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"expected true or false, got {shown(value)}")
    return value


def string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"expected a non-empty string, got {shown(value)}")
    return value


def path(value: Any) -> str:
    """A path, URL or pattern: a non-empty string the OS can take (no NUL character)."""
    text = string(value)
    if "\0" in text:
        raise ConfigError(f"expected a path, got {shown(value)} (a NUL character cannot be in a path)")
    return text


def anything(value: T) -> T:
    return value


def mapping(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"expected a mapping of names to values, got {shown(value)}")
    return value


def choice(*options: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in options:
            raise ConfigError(f"expected one of {', '.join(options)}, got {shown(value)}")
        return value

    return check


def strings(value: Any) -> tuple[str, ...]:
    """One string or a non-empty list of them."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        # an unquoted {a,b}.tar is a YAML mapping of keys without values: say what to write instead
        braces = isinstance(value, dict) and value and all(v is None for v in value.values())
        hint = " (a value that starts with { is a YAML mapping: quote a brace pattern, inputs: '{a,b}.tar')" if braces else ""
        raise ConfigError(f"expected a path or a non-empty list of paths, got {shown(value)}{hint}")
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item or "\0" in item:
            raise ConfigError(f"[{i}]: expected a path, got {shown(item)}")
    return tuple(items)


class Fields:
    """One mapping of a document, checked against the names it may hold.

    Unknown names are refused on creation; :meth:`take` checks one value and prefixes any
    ConfigError with ``SOURCE: PATH.NAME: ``.
    """

    def __init__(self, value: Any, *, source: str, path: str, allowed: Sequence[str]) -> None:
        self.source = source
        self.path = path
        if not isinstance(value, dict):
            where = f"{path}: " if path else ""
            raise ConfigError(f"{source}: {where}expected a mapping of options, got {shown(value) if value is not None else 'nothing'}")
        self._data = value
        for name in value:
            if name not in allowed:
                raise ConfigError(f"{source}: {self.where(str(name))}: unknown field (expected one of: {', '.join(allowed)})")

    def where(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def names(self) -> list[str]:
        return [name for name, value in self._data.items() if value is not None]

    def has(self, name: str) -> bool:
        return self._data.get(name) is not None

    def take(self, name: str, check: Callable[[Any], T], *, required: bool = False, default: Any = None) -> T:
        """The checked value of ``name``; ``default`` when absent or null (an error if required)."""
        if self._data.get(name) is None:
            if required:
                raise ConfigError(f"{self.source}: {self.where(name)}: missing (required)")
            return default
        with self.errors(name):
            return check(self._data[name])

    def sub(self, name: str, allowed: Sequence[str], *, required: bool = True) -> Fields:
        """The nested mapping ``name`` (an empty one when optional and absent)."""
        if self._data.get(name) is None and not required:
            return Fields({}, source=self.source, path=self.where(name), allowed=allowed)
        if name not in self._data:
            raise ConfigError(f"{self.source}: {self.where(name)}: missing (required)")
        return Fields(self._data[name], source=self.source, path=self.where(name), allowed=allowed)

    @contextlib.contextmanager
    def errors(self, name: str | None = None) -> Iterator[None]:
        """Prefix ConfigErrors raised inside with the file and this field's path.

        A message that starts with a field name (``piles: ...`` from an options class, or
        ``[2]: ...`` from a list check) is joined onto the path.
        """
        base = self.where(name) if name else self.path
        try:
            yield
        except ConfigError as e:
            text = str(e)
            joiner = "" if text.startswith("[") else ("." if base and _starts_with_field(text) else ": ")
            prefix = f"{base}{joiner}" if base else ""
            raise ConfigError(f"{self.source}: {prefix}{text}") from None


def _starts_with_field(text: str) -> bool:
    head, sep, _ = text.partition(": ")
    return bool(sep) and head.replace("_", "").isalnum()


def reader_args(items: list[str]) -> dict[str, Any]:
    """``["key=id", "fields={image: jpg}"]`` -> ``{"key": "id", "fields": {"image": "jpg"}}``, values read as YAML."""
    import yaml

    found: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--reader-arg: expected NAME=VALUE, got {item!r}")
        try:
            found[name.replace("-", "_")] = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"--reader-arg {name}: the value is not valid YAML ({e})") from None
    return found
