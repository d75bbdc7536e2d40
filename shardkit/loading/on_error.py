"""A loader's error policy (``on_error``): raise what fails, or skip it, count it and go on.

stats = LoaderStats()
policy = Policy("skip", stats)
sample = policy.sample(pile, 17)   # None (counted in stats) when the sample is malformed
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from shardkit.errors import ShardkitError
from shardkit.tar.shard import Shard

log = logging.getLogger("shardkit.loader")


@dataclass
class LoaderStats:
    """What a loader skipped under ``on_error="skip"``/``"warn"`` since it was created: piles
    that could not be read, samples not yielded (those of skipped piles included), and the
    first 100 error messages."""

    skipped_piles: int = 0
    skipped_samples: int = 0
    errors: list[str] = field(default_factory=list)

    def note(self, message: str, warn: bool) -> None:
        if len(self.errors) < 100:
            self.errors.append(message)
        if warn:
            log.warning("skipped: %s", message)


class Policy:
    """Apply ``on_error`` (``"raise"``, ``"skip"`` or ``"warn"``) and count skips in ``stats``.

    Only data errors are skipped (a :class:`~shardkit.ShardkitError` or an ``OSError`` while
    reading a pile); anything else is a bug and is raised whatever the policy.

    Example:
        policy = Policy("warn", LoaderStats())
        policy.pile(CorruptShardError("pile-000003.tar: truncated"), "pile-000003.tar")
    """

    def __init__(self, on_error: str, stats: LoaderStats) -> None:
        self.raises, self.warns, self.stats = on_error == "raise", on_error == "warn", stats

    def pile(self, error: BaseException, url: str) -> None:
        """Raise ``error``, or count the pile at ``url`` as skipped."""
        if self.raises or not isinstance(error, (ShardkitError, OSError)):
            raise error
        self.stats.skipped_piles += 1
        message = str(error)
        self.stats.note(message if message.startswith(url) else f"{url}: {message}", self.warns)

    def sample(self, pile: Shard | None, index: int) -> dict[str, Any] | None:
        """Raw sample ``index`` of ``pile``; None (counted) when the pile was skipped or the
        sample is malformed and the policy skips it."""
        if pile is None:
            self.stats.skipped_samples += 1
            return None
        try:
            return pile.sample(index)
        except ShardkitError as e:
            if self.raises:
                raise
            self.stats.skipped_samples += 1
            self.stats.note(str(e), self.warns)
            return None

    def failed(self, messages: list[str]) -> None:
        """Count samples that failed to decode or map (the worker already applied the policy)."""
        for message in messages:
            self.stats.skipped_samples += 1
            self.stats.note(message, self.warns)
