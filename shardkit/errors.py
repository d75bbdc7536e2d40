"""The shardkit error tree: every error a caller can expect, and the builtin it also is.

::

    ShardkitError                                  root: catch this to catch them all
    ├── ConfigError(ValueError)                    an option, a size string or a YAML job is wrong
    ├── SampleError(ValueError)                    a sample cannot be written (key, field, type)
    ├── InputError(RuntimeError)                   the user's preprocessing fn failed on an input unit
    ├── DatasetExistsError(FileExistsError)        the output already holds a dataset
    ├── DatasetNotFoundError(FileNotFoundError)    an input, pile or manifest is missing
    ├── ManifestError(ValueError)                  shardkit.json is unreadable or inconsistent
    ├── CorruptShardError(ValueError)              a tar's bytes are not what they should be
    ├── PileTooLargeError(ValueError)              a pile exceeds a memory limit (refused unread)
    ├── DecodeError(ValueError)                    a field could not be decoded (names pile and key)
    ├── StorageError(OSError)                      a file or URL cannot be read or written (full, read-only, unreachable...)
    └── WorkerError(RuntimeError)                  a loader worker process died (names it and its exit code)

Messages say where, what was expected and what was found, e.g.
``pile-000012.tar: member 4711 ('abc.jpg') at offset 1048576: size runs past the end of the file``.

An error raised in a background thread or a worker process travels to the code that handles it
as a :class:`Failure`: one type for the loader's prefetch thread, its decode workers and pass 1's
worker processes.
"""

from __future__ import annotations

import pickle
import traceback as _traceback
from dataclasses import dataclass, field, replace

from shardkit.redact import mask

__all__ = [
    "ConfigError",
    "CorruptShardError",
    "DatasetExistsError",
    "DatasetNotFoundError",
    "DecodeError",
    "Failure",
    "InputError",
    "ManifestError",
    "PileTooLargeError",
    "RemoteTraceback",
    "SampleError",
    "ShardkitError",
    "StorageError",
    "WorkerError",
]


def prefixed(error: BaseException, prefix: str) -> None:
    """Put ``prefix`` before ``error``'s message (its type and attributes kept), for a caller that
    knows which of several things it was about and re-raises it (a bare ``raise``)."""
    if error.args:
        error.args = (f"{prefix}{error.args[0]}", *error.args[1:])


class ShardkitError(Exception):
    """Root of every error shardkit raises on purpose.

    Its message never shows a secret: credentials that reached it (a storage option's value, the
    password of an endpoint URL, a signed header quoted from a client's error) read ``***``.
    """

    def __str__(self) -> str:
        return mask(super().__str__())


class ConfigError(ShardkitError, ValueError):
    """An option value, a size string or a job file is invalid."""


class SampleError(ShardkitError, ValueError):
    """A sample cannot be written: bad key, duplicate field or a value with no encoder."""


class InputError(ShardkitError, RuntimeError):
    """The preprocessing function raised on an input unit; the unit is named."""


class DatasetExistsError(ShardkitError, FileExistsError):
    """The output location already holds a dataset and overwriting was not asked for."""


class DatasetNotFoundError(ShardkitError, FileNotFoundError):
    """An input, a pile or a manifest does not exist."""


class ManifestError(ShardkitError, ValueError):
    """The manifest (``shardkit.json``) is malformed or disagrees with the piles."""


class CorruptShardError(ShardkitError, ValueError):
    """A tar shard is truncated, has a bad header, an unsafe member or a wrong checksum."""


class PileTooLargeError(ShardkitError, ValueError):
    """A pile is larger than the memory limit it must fit in."""


class DecodeError(ShardkitError, ValueError):
    """A field's bytes could not be decoded; the message names the pile and the key."""


class StorageError(ShardkitError, OSError):
    """A file or URL cannot be read or written, for a reason outside shardkit and the data.

    A full disk (the message says how many bytes were needed and how many are free), a
    read-only file system, a permission, a path through a file, an object store that cannot be
    reached or finds no credentials. The message names the path or URL, what was being done and,
    where there is one, the fix. ``url`` is that path or URL; ``errno`` the operating system's
    error number when there is one (``errno.ENOSPC``...).

    Example:
        try:
            shardkit.preprocess(units, fn, "out/", piles=64)
        except shardkit.StorageError as e:
            print(e.url, e.errno)
    """

    def __init__(self, message: str, *, url: str = "", errno: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.errno = errno

    def __reduce__(self) -> tuple[object, ...]:
        # keeps url and errno across processes (OSError's own pickling drops errno)
        return (type(self), (str(self),), {"url": self.url, "errno": self.errno})


class WorkerError(ShardkitError, RuntimeError):
    """A worker process died (killed, out of memory, a crash in native code) with work in hand.

    ``worker`` is its index in its pool (-1: not known) and ``how`` how it ended
    (``"exit code 3"``, ``"killed by signal 9"``).
    """

    def __init__(self, message: str, *, worker: int = -1, how: str = "") -> None:
        super().__init__(message)
        self.worker, self.how = worker, how


class RemoteTraceback(Exception):
    """The formatted traceback of an exception raised elsewhere (chained as its ``__cause__``)."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0])


@dataclass(frozen=True)
class Failure:
    """An exception caught where it happened (a thread, a worker process), carried to where it is handled.

    Attributes:
        index: the item that failed (a pile, an input unit), or -1.
        kind: the exception's class name; ``own``: it is one of shardkit's errors.
        message, traceback: its text and its formatted traceback.
        error: the exception itself while it can travel; :meth:`portable` drops it when it
            cannot be pickled, and :meth:`exception` then rebuilds one from the text.

    Example:
        failure = Failure.capture(error, index=3)     # in the thread or the worker
        raise failure.exception()                     # where it is handled
    """

    index: int
    kind: str
    message: str
    traceback: str
    own: bool
    error: BaseException | None = field(default=None, compare=False, repr=False)

    @classmethod
    def capture(cls, error: BaseException, *, index: int = -1) -> Failure:
        text = "".join(_traceback.format_exception(type(error), error, error.__traceback__))
        return cls(index, type(error).__name__, str(error), text, isinstance(error, ShardkitError), error)

    def portable(self) -> Failure:
        """This failure as it can be sent to another process: without the exception when it
        does not survive pickling (an exception holding a lock, a lambda, an open file)."""
        try:
            pickle.loads(pickle.dumps(self.error))
            return self
        except Exception:
            return replace(self, error=None)

    def exception(self) -> BaseException:
        """The exception to raise: the original (its traceback chained when it came from another
        process), else a :class:`ShardkitError` of the same class, else a RuntimeError with the text."""
        if self.error is not None:
            if self.error.__traceback__ is None and self.error.__cause__ is None:
                self.error.__cause__ = RemoteTraceback(self.traceback)
            return self.error
        kind = globals().get(self.kind) if self.own else None
        error = (
            kind(self.message)
            if isinstance(kind, type) and issubclass(kind, ShardkitError)
            else RuntimeError(f"{self.kind}: {self.message}")
        )
        error.__cause__ = RemoteTraceback(self.traceback)
        return error
