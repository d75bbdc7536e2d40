"""The subcommands of ``shardkit``, in ``--help`` order: each a :class:`~shardkit.cli.command.Command`.

Declared by what they do: :mod:`~shardkit.cli.commands.writing` writes a dataset (``pile``,
``plan``, ``shuffle``, ``repile``, ``run``, ``demo``), :mod:`~shardkit.cli.commands.dataset`
looks after one where it is (``info``, ``verify``, ``gc``), :mod:`~shardkit.cli.commands.order`
says what a loader reads (``trace``, ``quality``, ``export``). Each handler calls the public
Python API and returns an exit code; a :class:`~shardkit.ShardkitError` it raises is reported by
:func:`shardkit.cli.guarded`.
"""

from __future__ import annotations

from shardkit.cli.command import Command
from shardkit.cli.commands.dataset import GC, INFO, VERIFY
from shardkit.cli.commands.order import EXPORT, QUALITY, TRACE
from shardkit.cli.commands.writing import DEMO, PILE, PLAN, REPILE, RUN, SHUFFLE

COMMANDS: tuple[Command, ...] = (PILE, PLAN, INFO, VERIFY, GC, SHUFFLE, RUN, DEMO, TRACE, QUALITY, REPILE, EXPORT)

__all__ = ["COMMANDS"]
