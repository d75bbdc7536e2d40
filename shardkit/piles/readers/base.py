"""What every reader shares: keys derived from file names and rows, and the errors for bad files.

A reader's derived keys are ``PREFIX/ROW``: PREFIX is the input's path relative to the folder
all inputs share, without its format suffix and with dots made ``_`` (a key ends at its first
dot), and ROW the row's number in that file, nine digits or more. They are unique as long as
the inputs' paths are, which :func:`key_prefixes` checks.

    prefixes = key_prefixes(["d/en/a.parquet", "d/fr/a.parquet"], (".parquet",))   # ["en/a", "fr/a"]
    row_key("en/a", 17)                                                            # "en/a/000000017"
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from shardkit import storage
from shardkit.errors import ConfigError, CorruptShardError


def _bare(path: str, suffixes: Sequence[str]) -> str:
    for suffix in (".gz", ".zst", ".bz2", ".xz"):
        if path.lower().endswith(suffix) and any(path.lower()[: -len(suffix)].endswith(s) for s in suffixes):
            path = path[: -len(suffix)]
    for suffix in suffixes:
        if path.lower().endswith(suffix):
            return path[: -len(suffix)]
    return path


def key_prefixes(urls: Sequence[str], suffixes: Sequence[str]) -> list[str]:
    """The key prefix of each input (see the module's docstring), unique.

    Raises:
        ConfigError: two inputs would get the same prefix (``a.b.parquet`` and ``a_b.parquet``).
    """
    parts = [u.rstrip("/").split("/") for u in urls]
    common = 0
    if len(parts) > 1:
        while all(len(p) > common + 1 and p[common] == parts[0][common] for p in parts):
            common += 1
    else:
        common = len(parts[0]) - 1 if parts else 0
    prefixes = []
    seen: dict[str, str] = {}
    for url, p in zip(urls, parts, strict=True):
        relative = "/".join(_bare(part, suffixes) if i == len(p) - common - 1 else part for i, part in enumerate(p[common:]))
        prefix = "/".join(c.replace(".", "_") or "_" for c in relative.split("/"))
        if prefix in seen:
            raise ConfigError(
                f"{seen[prefix]} and {url} would give their rows the same key prefix {prefix!r}: rename one, or name a key column"
            )
        seen[prefix] = url
        prefixes.append(prefix)
    return prefixes


def row_key(prefix: str, row: int) -> str:
    """The key of row ``row`` of the input whose prefix is ``prefix`` (no prefix: the row alone)."""
    return f"{prefix}/{row:09d}" if prefix else f"{row:09d}"


def stamp(path: str) -> tuple[int, int, int]:
    """The inode, modification time and size of the file ``path``: a cache of what was read from a
    folder is keyed by its index file's stamp too, so a folder written again is read again."""
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, st.st_size


def unreadable(url: str, what: str, error: BaseException) -> CorruptShardError:
    """The error for an input that is not the file it claims to be, naming it and where."""
    return CorruptShardError(f"{url}: {what}: {type(error).__name__}: {error}")


def local_folders(inputs: Sequence[Any], what: str) -> list[str]:
    """The inputs as absolute local folder paths (``file://`` URLs too).

    Raises:
        ConfigError: an input is a remote URL: these folders are read where they lie.
    """
    folders = []
    for item in inputs:
        path = storage.store_for(item).local_file()
        if path is None:
            raise ConfigError(f"{os.fspath(item)}: {what} folders are read from local disk: copy it here first")
        folders.append(os.path.abspath(path))
    return folders
