"""Write the command-line, YAML and options reference in Markdown from the declarations themselves.

Nothing here is written by hand: the commands and flags come from the argparse parser the CLI
runs, the YAML keys from the option fields' ``yaml`` places and the job kinds, the transform
arguments from their dataclass fields and docstrings. Anything without a description is an
:class:`UndocumentedError`, so a new option cannot reach users undocumented.

    text = reference()                 # the whole page, Markdown
    Path("docs/reference.md").write_text(text)
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from shardkit.option_fields import Spec, field_docs, specs

# the keys of a YAML job that are not options of its function, said once here
JOB_KEYS = {
    "job": "which job: `preprocess`, `pile`, `shuffle` or `demo`",
    "inputs": "a path, glob or brace pattern (`{000..099}`), or a list of them; relative to the job file",
    "transform": "a built-in transform (see below); or give `fn`",
    "fn": "your own `module:function`, called as `fn(unit, **args)` and yielding sample dicts",
    "args": "keyword arguments of the transform, `fn` or reader (`format`)",
    "format": "the inputs' format: a reader's name (see the Inputs page) or tar shards; left out, it is told from the file names",
    "output": "a mapping: `path` (the dataset, relative to the job file) and the options placed under `output`",
    "samples": "images the demo makes (default 50000)",
    "executor": "`local` or `ray`; or a mapping `{kind: ray, address: auto}`",
}


class UndocumentedError(ValueError):
    """A flag, option or YAML key that has no description."""


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(value: Any) -> str:
    if value is None or value is argparse.SUPPRESS:
        return ""
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


# --- the command line ----------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name) or "", sub


def _flag_rows(parser: argparse.ArgumentParser, where: str) -> list[str]:
    rows = ["| argument | value | default | what it does |", "|---|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        if not action.help:
            raise UndocumentedError(f"{where}: {'/'.join(action.option_strings) or action.dest} has no help text")
        name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
        if action.choices is not None and not isinstance(action.choices, dict):
            value = " \\| ".join(f"`{c}`" for c in action.choices)
        elif action.nargs == 0:
            value = ""
        else:
            value = f"`{_cell(action.metavar or action.dest.upper())}`"
        if action.required or not action.option_strings:
            value += " (required)" if action.nargs not in ("*", "?") else ""
        default = "" if action.nargs == 0 and action.default in (False, None) else _default(action.default)
        rows.append(f"| {name} | {value} | {default} | {_cell(action.help)} |")
    return rows


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """Every ``shardkit`` subcommand with its usage, description and a table of its arguments."""
    if parser is None:
        from shardkit.cli.main import build_parser

        parser = build_parser()
    lines = ["## The `shardkit` command", "", _cell(parser.description or ""), "", "Options before the subcommand:", ""]
    lines += [*_flag_rows(parser, "shardkit"), ""]
    for name, summary, sub in _subcommands(parser):
        if not summary:
            raise UndocumentedError(f"shardkit {name}: the subcommand has no help text")
        lines += [f"### `shardkit {name}`", "", _cell(summary[0].upper() + summary[1:]) + ".", ""]
        lines += _parser_body(sub, f"shardkit {name}")
    return "\n".join(lines)


def _parser_body(parser: argparse.ArgumentParser, where: str) -> list[str]:
    """A parser's description, usage line, table of arguments and epilog."""
    lines = [" ".join(parser.description.split()), ""] if parser.description else []
    usage = " ".join(parser.format_usage().split())
    lines += ["```text", usage.removeprefix("usage: "), "```", ""]
    lines += [*_flag_rows(parser, where), ""]
    if parser.epilog:
        lines += ["```text", parser.epilog.strip(), "```", ""]
    return lines


def scripts_reference(scripts: Mapping[str, argparse.ArgumentParser]) -> str:
    """The preprocessing scripts' flags: ``{"python scripts/x.py": its parser}``, each under its command line."""
    lines = ["## Preprocessing scripts", "", "Each takes the pass-1 flags of `shardkit.add_pile_args` besides its own.", ""]
    for command, parser in scripts.items():
        parser.prog = command
        lines += [f"### `{command}`", "", *_parser_body(parser, command)]
    return "\n".join(lines)


# --- YAML jobs and the options classes --------------------------------------------------------------


def _spec_help(cls: type, spec: Spec) -> str:
    if not spec.help:
        raise UndocumentedError(f"{cls.__name__}.{spec.name} has no help text")
    return spec.help


def _value(spec: Spec) -> str:
    if spec.choices is not None:
        return " \\| ".join(f"`{c}`" for c in spec.choices)
    text = getattr(spec.kind, "__name__", None) or str(spec.kind)
    # collections.abc.Mapping[str, typing.Any] -> Mapping[str, Any]: the module paths say nothing to a reader
    return _cell(re.sub(r"\b(?:[a-z_]+\.)+(?=[A-Za-z_])", "", text).replace("NoneType", "None"))


def yaml_reference() -> str:
    """Every key of every YAML job kind: where it goes, its values, its default and what it does."""
    from shardkit.cli import jobs

    lines = [
        "## YAML jobs",
        "",
        "`shardkit run JOB.yaml` runs one; `--check` only validates it. Relative paths are relative to the job file.",
        "",
    ]
    for kind in jobs.JOBS:
        own, cls = jobs.job_fields(kind)
        lines += [f"### `job: {kind}`", "", "| key | place | value | default | what it does |", "|---|---|---|---|---|"]
        for key in own:
            if key not in JOB_KEYS:
                raise UndocumentedError(f"YAML job {kind}: the key {key!r} has no description in shardkit.cli.reference.JOB_KEYS")
            lines.append(f"| `{key}` | top | | | {JOB_KEYS[key]} |")
        if kind == "demo":
            lines.append("| `path` | output | text | a temporary directory | where the demo keeps its data |")
        if cls is not None:
            lines += _yaml_option_rows(cls)
        lines.append("")
    lines += [*_transforms(), ""]
    return "\n".join(lines)


def _yaml_option_rows(cls: type) -> list[str]:
    """The options of ``cls`` a YAML job holds: those at the top first, then those under ``output``."""
    rows = []
    for place, where in (("job", "top"), ("output", "output")):
        for spec in specs(cls).values():
            if spec.yaml == place:
                default = "(required)" if spec.required else _default(spec.default)
                rows.append(f"| `{spec.name}` | {where} | {_value(spec)} | {default} | {_cell(_spec_help(cls, spec))} |")
    return rows


def _transforms() -> list[str]:
    from shardkit.piles.transforms import TRANSFORMS

    lines = ["### Built-in transforms (`transform:`)", ""]
    for name, cls in TRANSFORMS.items():
        summary = (inspect.getdoc(cls) or "").split("\n\n")[0]
        lines += [f"`{name}` (`shardkit.transforms.{cls.__name__}`): {' '.join(summary.split())}", ""]
        docs = field_docs(cls)
        fields = dataclasses.fields(cls)
        if not fields:
            continue
        lines += ["| `args:` key | default | what it does |", "|---|---|---|"]
        for f in fields:
            if f.name not in docs:
                raise UndocumentedError(f"transform {name}: the argument {f.name!r} is not described in {cls.__name__}'s docstring")
            lines.append(f"| `{f.name}` | {_default(f.default)} | {_cell(docs[f.name])} |")
        lines.append("")
    return lines


def options_reference() -> str:
    """The fields of the options classes a Python user passes (``PileOptions``, ``ShuffleOptions``, ``LoaderOptions``)."""
    from shardkit.eager_shuffle import ShuffleOptions
    from shardkit.loading.options import LoaderOptions
    from shardkit.piles.options import PileOptions

    lines = ["## Python options", "", "Each entry point takes these as keywords, or one options object (`options=`).", ""]
    for cls in (PileOptions, ShuffleOptions, LoaderOptions):
        lines += [f"### `shardkit.{cls.__name__}`", "", "| field | group | value | default | what it does |", "|---|---|---|---|---|"]
        for spec in sorted(specs(cls).values(), key=_by_group(cls)):
            default = "(required)" if spec.required else "" if spec.default is None else f"`{spec.default!r}`"
            lines.append(f"| `{spec.name}` | {spec.group or ''} | {_value(spec)} | {default} | {_cell(_spec_help(cls, spec))} |")
        lines.append("")
    return "\n".join(lines)


def _by_group(cls: type) -> Callable[[Spec], int]:
    """The sort key that lists the fields of ``cls`` group by group, each group where its first field is."""
    order = list(dict.fromkeys(spec.group for spec in specs(cls).values()))
    return lambda spec: order.index(spec.group)


def reference(scripts: Mapping[str, argparse.ArgumentParser] | None = None) -> str:
    """The whole reference page; ``scripts`` adds the parsers of scripts that are not installed with the package."""
    head = [
        "# CLI, YAML and options reference",
        "",
        "This page is generated from the declarations the code runs (the argparse parsers and the option",
        "fields), each time the site is built; `shardkit COMMAND --help` prints the same.",
        "",
    ]
    parts = [*head, cli_reference(), *([scripts_reference(scripts)] if scripts else []), yaml_reference(), options_reference()]
    return "\n".join(parts)
