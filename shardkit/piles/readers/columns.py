"""Turn rows of named columns into sample dicts: which columns, under which extension, encoded how.

Every reader (Parquet, Arrow, Hugging Face, MDS, litdata, CSV) ends here, so one value gives the
same bytes whatever format held it. A column becomes the field of the same name (``fields``
renames it to another extension); its values are encoded by type unless ``encode`` names an
encoding for the column:

- ``bytes``: binary values as they are (a Hugging Face image ``{"bytes": ..., "path": ...}`` gives
  its bytes);
- ``text``: strings as UTF-8, integers in decimal, floats as Python's shortest ``repr``, booleans
  ``true``/``false``, dates and times in ISO 8601;
- ``json``: lists, dicts and scalars as compact JSON;
- ``npy``: anything numpy can make an array of, saved with ``numpy.save``;
- ``pickle``: any value (nested binary data, say), read back with ``pickle.loads``.

``auto`` (the default) picks ``bytes`` for binary values, ``text`` for scalars, ``npy`` for numpy
arrays, ``json`` for lists and dicts and PNG for a PIL image. A null value leaves the field out of
that sample. Columns whose names start with ``__`` are metadata and are not written.

    spec = ColumnSpec(fields={"image": "jpg"}, encode={"emb": "npy"}, key="id")
    for sample in spec.samples(names, columns, keys=None, where="a.parquet: row group 0"):
        ...
"""

from __future__ import annotations

import datetime
import decimal
import io
import json
import math
import pickle
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardkit._util import shown
from shardkit.errors import ConfigError, SampleError

ENCODINGS = ("auto", "bytes", "text", "json", "npy", "pickle")


def _text(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bool, np.bool_)):
        return b"true" if value else b"false"
    if isinstance(value, (int, np.integer)):
        return b"%d" % int(value)
    if isinstance(value, (float, np.floating)):
        return repr(float(value)).encode()
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat().encode()
    if isinstance(value, (decimal.Decimal, datetime.timedelta)):
        return str(value).encode()
    raise TypeError(f"expected a string, number, boolean, date or time for encoding 'text', got {type(value).__name__}")


def _bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, dict) and isinstance(value.get("bytes"), (bytes, bytearray)):
        return bytes(value["bytes"])  # a Hugging Face Image or Audio value
    raise TypeError(f"expected binary data for encoding 'bytes', got {type(value).__name__}")


def _plain(value: Any) -> Any:
    """JSON's ``default``: dates, decimals and numpy scalars as JSON values; binary data is refused."""
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, datetime.timedelta)):
        return str(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (bytes, bytearray)):
        raise TypeError("binary data inside a nested value has no JSON form (use encoding 'pickle', or 'bytes' for a binary column)")
    raise TypeError(f"a {type(value).__name__} has no JSON form")


def _json(value: Any) -> bytes:
    if isinstance(value, float) and not math.isfinite(value):
        raise TypeError(f"{value} has no JSON form")
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_plain, allow_nan=False).encode("utf-8")


def _npy(value: Any) -> bytes:
    array = np.asarray(value)
    if array.dtype == object:
        raise TypeError("expected numbers of one shape for encoding 'npy' (ragged or mixed values make no array)")
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def _pickle(value: Any) -> bytes:
    return pickle.dumps(value, protocol=4)


def _png(value: Any) -> bytes:
    out = io.BytesIO()
    value.save(out, format="PNG")
    return out.getvalue()


def _auto(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)) or (
        isinstance(value, dict) and isinstance(value.get("bytes"), (bytes, bytearray))
    ):
        return _bytes(value)
    if isinstance(value, np.ndarray):
        return _npy(value)
    if isinstance(value, (list, tuple, dict)):
        return _json(value)
    if hasattr(value, "save") and hasattr(value, "mode") and hasattr(value, "size"):  # a PIL image
        return _png(value)
    return _text(value)


_ENCODERS = {"auto": _auto, "bytes": _bytes, "text": _text, "json": _json, "npy": _npy, "pickle": _pickle}


# columns of one type, and only it or nulls, encode without looking at each value's type
_FAST: dict[tuple[str, type], Any] = {
    ("auto", bytes): lambda v: v,
    ("bytes", bytes): lambda v: v,
    ("auto", str): str.encode,
    ("text", str): str.encode,
    ("auto", int): lambda v: b"%d" % v,
    ("text", int): lambda v: b"%d" % v,
}


def encode_column(values: Sequence[Any], encoding: str, where: str, first: int = 0) -> list[bytes | None]:
    """Each value of a column encoded (None stays None); an error names ``where`` and the row."""
    kinds = {type(v) for v in values} - {type(None)}
    fast = _FAST.get((encoding, kinds.pop())) if len(kinds) == 1 else None
    if fast is not None:
        return [None if v is None else fast(v) for v in values]
    encoder = _ENCODERS[encoding]
    out: list[bytes | None] = []
    for row, value in enumerate(values):
        try:
            out.append(None if value is None else encoder(value))
        except (TypeError, ValueError, OverflowError) as e:
            raise SampleError(f"{where}: row {row + first}: {e}") from None
    return out


def _check_map(name: str, value: Any, values: Sequence[str] | None = None) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name}: expected a mapping of column name to {'encoding' if values else 'extension'}, got {value!r}")
    for column, target in value.items():
        if not isinstance(column, str) or not isinstance(target, str) or not target:
            raise ConfigError(f"{name}: expected column names mapped to non-empty strings, got {column!r}: {target!r}")
        if values is not None and target not in values:
            raise ConfigError(f"{name}: column {column!r}: expected one of {', '.join(values)}, got {target!r}")
        if values is None and ("/" in target or target.startswith("__")):
            raise ConfigError(f"{name}: column {column!r}: {target!r} is not a valid field extension (no '/', no leading '__')")
    return dict(value)


@dataclass(frozen=True, kw_only=True)
class ColumnSpec:
    """Which columns become fields, named and encoded how, and which column (if any) is the key.

    Args:
        columns: the columns to write (all when None); naming a column the data lacks is an error.
        fields: column -> field extension (``{"image": "jpg"}``); others keep their name.
        encode: column -> one of :data:`ENCODINGS`; others are ``auto``.
        key: a column whose values (strings or integers, unique) are the sample keys; it is
            written as a field too. None derives keys from the position of each row.
    """

    columns: tuple[str, ...] | None = None
    fields: Mapping[str, str] = field(default_factory=dict)
    encode: Mapping[str, str] = field(default_factory=dict)
    key: str | None = None

    def __post_init__(self) -> None:
        if self.columns is not None:
            if isinstance(self.columns, str) or not all(isinstance(c, str) and c for c in self.columns):
                raise ConfigError(f"columns: expected a list of column names or None, got {self.columns!r}")
            object.__setattr__(self, "columns", tuple(self.columns))
        object.__setattr__(self, "fields", _check_map("fields", self.fields))
        object.__setattr__(self, "encode", _check_map("encode", self.encode, ENCODINGS))
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise ConfigError(f"key: expected a column name or None, got {self.key!r}")

    def chosen(self, names: Sequence[str], where: str) -> list[str]:
        """The columns of ``names`` to write, in order; every column the spec names must be there.

        Raises:
            SampleError: a column named in ``columns``, ``fields``, ``encode`` or ``key`` is missing.
        """
        present = set(names)
        wanted = list(self.columns) if self.columns is not None else [n for n in names if not n.startswith("__")]
        for option, named in (
            ("columns", wanted),
            ("fields", self.fields),
            ("encode", self.encode),
            ("key", [self.key] if self.key else []),
        ):
            missing = [c for c in named if c not in present]
            if missing:
                raise SampleError(f"{where}: {option} names column {missing[0]!r}, which is not there (columns: {_listed(names)})")
        exts: dict[str, str] = {}
        for name in wanted:
            ext = self.fields.get(name, name)
            if "/" in ext or not ext or ext.startswith("__"):
                # fields= values are checked on creation, so ext is the column's own name here (a '__' one named in columns)
                why = "it holds '/'" if "/" in ext else "'__' marks metadata, which is not written" if ext else "it is empty"
                raise SampleError(
                    f"{where}: column {shown(name)} is no valid field extension ({why}): rename it with fields={{{shown(name)}: 'ext'}}"
                )
            if ext in exts:
                raise SampleError(
                    f"{where}: columns {shown(exts[ext])} and {shown(name)} would both be the field {shown(ext)}: rename one with fields="
                )
            exts[ext] = name
        return wanted

    def samples(
        self, names: Sequence[str], columns: Sequence[Sequence[Any]], keys: Sequence[str] | None, where: str, first: int = 0
    ) -> Iterator[dict[str, Any]]:
        """One sample dict per row of ``columns`` (one list of values per name in ``names``).

        ``keys`` are the derived keys, used unless the spec has a key column; ``first`` is the
        number of the first row, for messages. Errors name ``where``, the column and the row.
        """
        chosen = self.chosen(names, where)
        index = {name: i for i, name in enumerate(names)}
        key_values = columns[index[self.key]] if self.key is not None else keys
        if key_values is None:
            raise SampleError(f"{where}: no key column given and no key to derive")
        # a whole column at a time: a bad value fails the unit before any of its samples is written
        plan = [
            (self.fields.get(n, n), encode_column(columns[index[n]], self.encode.get(n, "auto"), f"{where}: column {n!r}", first))
            for n in chosen
        ]
        for row in range(len(key_values)):
            sample: dict[str, Any] = {"__key__": self._key(key_values[row], where, row + first)}
            for ext, values in plan:
                if values[row] is not None:
                    sample[ext] = values[row]
            yield sample

    def _key(self, value: Any, where: str, row: int) -> str:
        if self.key is None:
            return value
        if isinstance(value, str) and value:
            return value
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return str(int(value))
        raise SampleError(f"{where}: key column {self.key!r}: row {row}: expected a non-empty string or an integer, got {value!r}")


def _listed(names: Sequence[str], most: int = 20) -> str:
    """Column names for a message, each shortened and at most ``most`` of them: a file that is not
    the format it was read as (a tar read as CSV) has a header row of binary data."""
    shortened = [name if len(name) <= 60 and name.isprintable() else shown(name) for name in names[:most]]
    return ", ".join(shortened) + (f", ... ({len(names)} in all)" if len(names) > most else "")
