"""Read CSV and TSV files as pass-1 input, optionally fetching the image each row names.

The files are parsed once, in the calling process (a header row names the columns; every value
is a string), and cut into units of ``rows_per_unit`` rows that carry their rows with them. With
``image``, the named column holds a path (relative to the CSV file's folder), a ``file://`` or
``s3://`` URL or an ``http(s)://`` URL: each unit fetches its images and stores each under its
format's extension (``jpg``, ``png`` ...), as it is or, with ``image_size``, resized and
re-encoded as JPEG. Keys are ``FILE/ROW`` (ROW counts data rows from 0) unless ``key`` names a
column.

    reader = Csv(image="path", fields={"label": "cls"})
    shardkit.pile("train.csv", "piles/", piles=64, format=reader)
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shardkit import storage
from shardkit._util import check_bool, check_int
from shardkit.errors import ConfigError, CorruptShardError, SampleError
from shardkit.piles.readers.base import key_prefixes, row_key
from shardkit.piles.readers.columns import ColumnSpec

SUFFIXES = (".csv", ".tsv")
# how long one image download may take
_FETCH_SECONDS = 60


@dataclass(frozen=True)
class CsvRows:
    """Rows ``first..first+len(rows)`` of the CSV file ``url`` (data rows, from 0), carried whole."""

    url: str
    prefix: str
    first: int
    names: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def __repr__(self) -> str:
        return f"{self.url} rows {self.first}..{self.first + len(self.rows)}"


def _text(url: str) -> str:
    data = storage.read_bytes(url)
    if url.lower().endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise CorruptShardError(f"{url}: not a readable gzip file ({e})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise CorruptShardError(f"{url}: byte {e.start}: not UTF-8 text") from None


def _fetch(where: str, base: str, target: str) -> bytes:
    """The bytes of the image ``target`` names, relative paths against the folder ``base``."""
    if target.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(target, timeout=_FETCH_SECONDS) as response:
                return bytes(response.read())
        except OSError as e:
            raise SampleError(f"{where}: cannot fetch {target} ({e})") from None
    url = target if "://" in target or os.path.isabs(target) else f"{base}/{target}" if base else target
    try:
        return storage.read_bytes(url)
    except FileNotFoundError:
        raise SampleError(f"{where}: image {target!r} not found ({url})") from None


def _image_ext(data: bytes) -> str | None:
    signatures = ((b"\xff\xd8\xff", "jpg"), (b"\x89PNG", "png"), (b"GIF8", "gif"), (b"BM", "bmp"), (b"II*\x00", "tif"), (b"MM\x00*", "tif"))
    for magic, ext in signatures:
        if data.startswith(magic):
            return ext
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


@dataclass(frozen=True, kw_only=True)
class Csv(ColumnSpec):
    """CSV/TSV files -> samples, each column a text field (see :class:`ColumnSpec`).

    Args:
        delimiter: the field separator; None: tab for ``.tsv`` files, comma otherwise.
        quotes: a ``"`` opens and closes a quoted value, as CSV writers mean it; False reads every
            quote as text, as most TSV writers mean it (``"Hello" she said`` stays as it is).
        image: a column of image paths or URLs to fetch into an image field.
        image_size: with ``image``, resize each image's short side to this many pixels and
            re-encode it as JPEG (``jpg``); 0 stores the fetched bytes as they are.
        image_quality: the JPEG quality of re-encoded images.
        rows_per_unit: rows per input unit (with images: what a failing image drops under
            ``on_error="skip"``).
    """

    delimiter: str | None = None
    quotes: bool = True
    image: str | None = None
    image_size: int = 0
    image_quality: int = 90
    rows_per_unit: int = 1000

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.delimiter is not None and (not isinstance(self.delimiter, str) or len(self.delimiter) != 1):
            raise ConfigError(f"delimiter: expected one character or None, got {self.delimiter!r}")
        if self.image is not None and (not isinstance(self.image, str) or not self.image):
            raise ConfigError(f"image: expected a column name or None, got {self.image!r}")
        check_bool("quotes", self.quotes)
        check_int("image_size", self.image_size, low=0)
        check_int("image_quality", self.image_quality, low=1, high=100)
        check_int("rows_per_unit", self.rows_per_unit, low=1)

    def prepare(self, inputs: Sequence[str]) -> tuple[list[CsvRows], dict[str, Any]]:
        """Every file parsed here and cut into units; a ragged row is an error naming its line."""
        urls = storage.expand(list(inputs), once=True)
        units: list[CsvRows] = []
        for url, prefix in zip(urls, key_prefixes(urls, SUFFIXES), strict=True):
            names, rows = self._parse(url)
            step = self.rows_per_unit
            units += [CsvRows(url, prefix, s, names, tuple(rows[s : s + step])) for s in range(0, len(rows), step)]
        return units, {}

    def units(self, inputs: Sequence[str]) -> list[CsvRows]:
        return self.prepare(inputs)[0]

    def _parse(self, url: str) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
        tab = url.lower().removesuffix(".gz").endswith(".tsv")
        delimiter = self.delimiter or ("\t" if tab else ",")
        # strict: a quote never closed is an error, not a last value that holds the rest of the file
        quoting = csv.QUOTE_MINIMAL if self.quotes else csv.QUOTE_NONE
        reader = csv.reader(io.StringIO(_text(url), newline=""), delimiter=delimiter, strict=True, quoting=quoting)
        try:
            names = tuple(next(reader))
        except StopIteration:
            raise CorruptShardError(f"{url}: empty file, expected a header row naming the columns") from None
        except csv.Error as e:
            raise CorruptShardError(f"{url}: line 1: {e}") from None
        if len(set(names)) != len(names) or not all(names):
            raise CorruptShardError(f"{url}: line 1: the header names each column once, got {list(names)}")
        if self.image is not None and self.image not in names:
            raise SampleError(f"{url}: image column {self.image!r} is not there (columns: {', '.join(names)})")
        self.chosen(names, url)
        rows = []
        start = reader.line_num + 1  # the line the row being read starts on (a quoted value may span lines)
        try:
            for row in reader:
                if row and len(row) != len(names):
                    raise CorruptShardError(f"{url}: line {reader.line_num}: {len(row)} values, expected {len(names)} ({', '.join(names)})")
                if row:
                    rows.append(tuple(row))
                start = reader.line_num + 1
        except csv.Error as e:
            hint = "; if quotes are part of the text, read with quotes=False (--reader-arg quotes=false)" if self.quotes else ""
            raise CorruptShardError(f"{url}: line {start}: {e}{hint}") from None
        return names, rows

    def __call__(self, unit: CsvRows) -> Iterator[dict[str, Any]]:
        where = repr(unit)
        columns = [list(c) for c in zip(*unit.rows, strict=True)] if unit.rows else [[] for _ in unit.names]
        keys = [row_key(unit.prefix, unit.first + i) for i in range(len(unit.rows))]
        base = unit.url.rsplit("/", 1)[0] if "/" in unit.url else ""
        at = unit.names.index(self.image) if self.image is not None else -1
        for i, sample in enumerate(self.samples(unit.names, columns, keys, where, first=unit.first)):
            if at >= 0 and unit.rows[i][at]:
                ext, data = self._image(f"{unit.url}: row {unit.first + i}", base, unit.rows[i][at])
                if ext in sample:
                    raise SampleError(f"{unit.url}: row {unit.first + i}: the image field {ext!r} is also a column: rename it with fields=")
                sample[ext] = data
            yield sample

    def _image(self, where: str, base: str, target: str) -> tuple[str, bytes]:
        data = _fetch(where, base, target)
        if self.image_size:
            from shardkit.piles.transforms import encode_image

            try:
                return "jpg", encode_image(io.BytesIO(data), size=self.image_size, quality=self.image_quality)  # type: ignore[arg-type]
            except (OSError, ValueError, SyntaxError) as e:
                raise SampleError(f"{where}: {target}: cannot read the image ({e})") from None
        ext = _image_ext(data)
        if ext is None:
            raise SampleError(f"{where}: {target}: not an image shardkit knows (JPEG, PNG, GIF, BMP, TIFF, WebP)")
        return ext, data
