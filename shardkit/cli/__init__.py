"""The ``shardkit`` command and YAML batch jobs: thin clients of the public Python functions.

:mod:`~shardkit.cli.main` parses the command line and applies the exit-code conventions,
:mod:`~shardkit.cli.commands` declares each subcommand as data (a
:class:`~shardkit.cli.command.Command`: name, texts, arguments, handler), :mod:`~shardkit.cli.jobs` reads
and runs YAML jobs, :mod:`~shardkit.cli.schema` checks YAML values with errors naming file and
field, :mod:`~shardkit.cli.parsing` gives every parser the command line's conventions. Every option object they build is the one a Python user builds.
"""

from __future__ import annotations

from shardkit.cli.flags import add_pile_args, pile_kwargs
from shardkit.cli.jobs import load_job, run_job
from shardkit.cli.main import guarded, main
from shardkit.cli.parsing import ArgumentParser, add_version_flag

__all__ = ["ArgumentParser", "add_pile_args", "add_version_flag", "guarded", "load_job", "main", "pile_kwargs", "run_job"]
