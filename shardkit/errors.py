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
    └── WorkerError(RuntimeError)                  a loader worker process died (names it and its exit code)

Messages say where, what was expected and what was found, e.g.
``pile-000012.tar: member 4711 ('abc.jpg') at offset 1048576: size runs past the end of the file``.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "CorruptShardError",
    "DatasetExistsError",
    "DatasetNotFoundError",
    "DecodeError",
    "InputError",
    "ManifestError",
    "PileTooLargeError",
    "SampleError",
    "ShardkitError",
    "WorkerError",
]


class ShardkitError(Exception):
    """Root of every error shardkit raises on purpose."""


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


class WorkerError(ShardkitError, RuntimeError):
    """A worker process died (killed, out of memory, a crash in native code) with work in hand."""
