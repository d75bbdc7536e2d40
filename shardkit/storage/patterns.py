"""Input paths, URLs and patterns turned into file URLs: brace ranges, globs (local and remote),
and the check that no file is named twice.

    expand(["shards/train-{000..003}.tar", "extra/*.tar"])    # sorted matches, pattern by pattern
    expand(["shards/*.tar", "shards/a.tar"], once=True)       # ConfigError: a.tar named twice
"""

from __future__ import annotations

import glob as _glob
import os
import re
from collections.abc import Sequence
from typing import Any

from shardkit.errors import ConfigError, DatasetNotFoundError, ShardkitError
from shardkit.storage import remote
from shardkit.storage.conditional import forget_listings
from shardkit.storage.paths import guard, local_path
from shardkit.storage.stores import store_for

_GROUP = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(\d+)\.\.(\d+)")


def brace_expand(pattern: str) -> list[str]:
    """Expand ``{000..012}`` ranges (zero padding kept) and ``{a,b}`` alternatives.

    Groups expand left to right, as in the shell: ``{a,b}-{0..1}`` gives a-0, a-1, b-0, b-1.
    A group that is neither (``{x}``) stays as it is.
    """
    for match in _GROUP.finditer(pattern):
        body = match.group(1)
        numbers = _RANGE.fullmatch(body)
        if numbers:
            lo, hi = numbers.group(1), numbers.group(2)
            width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
            step = 1 if int(hi) >= int(lo) else -1
            alternatives = [f"{i:0{width}d}" for i in range(int(lo), int(hi) + step, step)]
        elif "," in body:
            alternatives = body.split(",")
        else:
            continue
        head, tail = pattern[: match.start()], pattern[match.end() :]
        return [e for alt in alternatives for e in brace_expand(head + alt + tail)]
    return [pattern]


def expand(sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, once: bool = False) -> list[str]:
    """Turn a URL, a brace pattern, a glob or a list of them into a list of file URLs.

    ``once``: a file named twice (by two patterns, one pattern and its name, or two names of one
    local file: a link) is refused (see :class:`NamedOnce`).

    Raises:
        DatasetNotFoundError: a pattern matches nothing or a named file does not exist.
        ConfigError: with ``once``, a file named twice.
    """
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    urls: list[str] = []
    named = NamedOnce()
    for item in items:
        found = _expand_one(os.fspath(item))
        if once:
            named.add(found, os.fspath(item))
        urls.extend(found)
    return urls


def _expand_one(item: str) -> list[str]:
    """The files one path, URL or pattern names, in order."""
    urls: list[str] = []
    for url in brace_expand(item):
        path = local_path(url)
        if _glob.has_magic(url):
            found = _glob_files(url)
            if not found:
                raise _matches_nothing(url)
            urls.extend(found)
        elif path is not None and not os.path.isfile(path):
            if os.path.isdir(path):  # inputs are files: said plainly, or the user looks for a typo
                raise DatasetNotFoundError(f"{url}: a directory, not a file: name the files in it (e.g. {url.rstrip('/')}/*)")
            raise DatasetNotFoundError(f"{url}: no such file")
        else:
            urls.append(url)
    return urls


class NamedOnce:
    """The input files named so far, each with the input (a path or pattern) that named it: a job
    that writes each input's samples once would write a file named twice twice, and stop on its
    repeated keys only once everything was read (or not at all, when the two names give its
    samples two key prefixes). One local file is one file under any name: a link, ``./a``, ``a``.

        named = NamedOnce()
        named.add(expand("shards/*.tar"), "shards/*.tar")
        named.add(expand("shards/a.tar"), "shards/a.tar")   # ConfigError: named twice
    """

    def __init__(self) -> None:
        self._named: dict[Any, str] = {}

    def add(self, files: Sequence[str], item: str) -> None:
        """Note ``files``, which ``item`` named; raises ConfigError, naming both inputs, for one named before."""
        for file in files:
            key = _same_file(file)
            if key in self._named:
                raise ConfigError(f"{file} is named twice (by {self._named[key]!r} and by {item!r}): each input is read once; name it once")
            self._named[key] = item


def _same_file(url: str) -> Any:
    """What two names of one file have in common: a local file's device and inode, else the URL
    (with ``s3a://`` and ``s3n://`` read as the ``s3://`` they stand for)."""
    path = local_path(url)
    if path is None:
        scheme, sep, rest = url.partition("://")
        return f"s3://{rest}" if sep and scheme in ("s3a", "s3n") else url
    try:
        found = os.stat(path)
    except OSError:
        return os.path.abspath(path)
    return found.st_dev, found.st_ino


def _matches_nothing(pattern: str) -> DatasetNotFoundError:
    """The error for a glob that matched no file: in a bucket that does not exist (where a remote
    glob finds nothing rather than fail), one that names the bucket."""
    if local_path(pattern) is None:
        try:
            store_for(remote.root(pattern)).list()
        except DatasetNotFoundError as e:
            bucket = getattr(e, "bucket", None)
            if bucket:
                return DatasetNotFoundError(f"{pattern}: the bucket {bucket} does not exist (a typo? create it first)")
        except ShardkitError:
            pass  # the bucket cannot be listed (denied, unreachable): the pattern's own words say enough
    return DatasetNotFoundError(f"{pattern}: pattern matches no file")


def _glob_files(pattern: str) -> list[str]:
    """Sorted URLs of the files matching a glob, local or remote (remote ones keep their scheme)."""
    path = local_path(pattern)
    if path is not None:
        return sorted(p for p in _glob.glob(path) if os.path.isfile(p))
    fs, p = remote.filesystem(pattern)
    with guard(pattern, "list the files matching"):
        found = remote.call(pattern, fs, lambda: fs.glob(p, detail=True))  # types come with the listing: no request per file
    forget_listings(fs, None)  # a glob lists every directory it walks
    return sorted(fs.unstrip_protocol(m) for m, info in found.items() if info.get("type") == "file")
