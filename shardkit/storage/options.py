"""Check storage options by type before fsspec sees them, naming the option and never its value.

check_storage_options({"anon": True, "client_kwargs": {"region_name": "eu-west-1"}})
check_storage_options({"client_kwargs": "notadict"})
# ConfigError: storage_options: client_kwargs: expected a mapping of options, got a str
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardkit.errors import ConfigError

# the options of s3fs, gcsfs and adlfs whose type is fixed; any other name goes to fsspec unchecked
_MAPPINGS = frozenset({"client_kwargs", "config_kwargs", "s3_additional_kwargs", "storage_options", "session_kwargs"})
_BOOLS = frozenset({"anon", "use_ssl", "requester_pays", "version_aware", "skip_instance_cache", "use_listings_cache", "cache_regions"})
_TEXTS = frozenset(
    {"key", "secret", "token", "username", "password", "endpoint_url", "profile", "region_name", "account_name", "account_key", "sas_token"}
)
_COUNTS = frozenset({"default_block_size", "max_concurrency", "retries", "max_attempts"})
_NUMBERS = frozenset({"listings_expiry_time", "connect_timeout", "read_timeout", "max_paths"})
# names whose type depends on the group they are in: s3fs's ``retries`` is a count, botocore's
# (``config_kwargs={"retries": {"max_attempts": 5, "mode": "standard"}}``) a mapping
_MAPPINGS_IN = {"config_kwargs": frozenset({"retries"})}
# deeper than any real configuration: a mapping nested further is a mistake (or a fuzzer)
_DEPTH = 4


def check_storage_options(options: Any, *, what: str = "storage_options") -> None:
    """Refuse ``options`` that are not None or a mapping with string keys, or that give a known
    option a value of the wrong type (``client_kwargs`` not a mapping, ``anon`` not a bool...).

    Raises:
        ConfigError: naming the option (``storage_options: client_kwargs: ...``) and the type
            found, never the value: it may be a secret.
    """
    if options is None:
        return
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise ConfigError(f"{what}: expected a mapping of option names to values (given to fsspec), got {type(options).__name__}")
    _check(options, what, depth=1)


def _check(options: Mapping[str, Any], where: str, *, depth: int, group: str = "") -> None:
    if depth > _DEPTH:
        raise ConfigError(f"{where}: options nested more than {_DEPTH} deep")
    for name, value in options.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: expected option names as non-empty strings, got a {type(name).__name__}")
        expected = _expected(name, value, group)
        if expected is not None:
            raise ConfigError(f"{where}: {name}: expected {expected}, got a {type(value).__name__}")
        if isinstance(value, Mapping):
            _check(value, f"{where}.{name}", depth=depth + 1, group=name)


def _expected(name: str, value: Any, group: str) -> str | None:
    """What ``name`` (in the options of ``group``, "" at the top) should hold when ``value`` is not that, else None."""
    if name in _MAPPINGS_IN.get(group, ()):
        return None if isinstance(value, Mapping) else "a mapping of options"
    if name in _MAPPINGS and not isinstance(value, Mapping):
        return "a mapping of options"
    if name in _BOOLS and not isinstance(value, bool):
        return "true or false"
    if name in _TEXTS and value is not None and not isinstance(value, str):
        return "a string"
    if name in _COUNTS and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        return "a whole number >= 0"
    if name in _NUMBERS and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
        return "a number >= 0"
    return None
