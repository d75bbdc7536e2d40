"""Read a job file's YAML: plain data only, no key written twice in one mapping, and each key's line.

data = load_yaml(open("job.yaml").read(), "job.yaml")   # ConfigError naming the file and the line
message = located(message, "job.yaml", key_lines(text))  # "job.yaml: line 5: output.piles: ..."
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from shardkit.errors import ConfigError


def _repeated_key(text: str) -> yaml.MarkedYAMLError | None:
    """The error for the first key written twice in one mapping of ``text``, or None.

    YAML keeps the last value of a repeated key and drops the first unsaid (a second ``inputs:``
    would lose the first's files). The keys are compared as written, in the document as composed
    (before merge keys are applied, whose ``<<: *base`` may be overridden; an aliased mapping is
    looked at once, where it is written).
    """
    nodes: list[yaml.Node | None] = [yaml.compose(text, Loader=yaml.SafeLoader)]
    looked: set[int] = set()
    while nodes:
        node = nodes.pop()
        if node is None or id(node) in looked:
            continue
        looked.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], yaml.Node] = {}
            for key, value in node.value:
                nodes += [key, value]
                if key.tag == "tag:yaml.org,2002:merge" or not isinstance(key, yaml.ScalarNode):
                    continue
                earlier = first.setdefault((key.tag, key.value), key)
                if earlier is not key:
                    line = earlier.start_mark.line + 1
                    return yaml.MarkedYAMLError(problem=f"key {key.value!r} given twice, first on line {line}", problem_mark=key.start_mark)
        elif isinstance(node, yaml.SequenceNode):
            nodes += node.value
    return None


def load_yaml(text: str, source: str) -> Any:
    """The plain data of the job file ``source`` whose text is ``text``.

    Raises:
        ConfigError: naming ``source`` and the line: not valid YAML, a tag that builds a Python
            object, or a key written twice in one mapping.
    """
    try:
        found = yaml.safe_load(text)
        repeated = _repeated_key(text)
        if repeated is not None:
            raise repeated
        return found
    except yaml.constructor.ConstructorError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise ConfigError(
            f"{source}: {where}YAML tags that build Python objects are not allowed ({e.problem}); use plain mappings, lists, strings and numbers"
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        if getattr(e, "context", None) == "expected a single document in the stream":  # YAML says only "but found another document"
            raise ConfigError(
                f"{source}: {where}a job file holds one job, and a second YAML document ('---') starts here; "
                "put each job in a file of its own and run each"
            ) from None
        why = " ".join(str(getattr(e, "problem", None) or e).split())  # one line: YAML's own spans several
        line = text.splitlines()[mark.line] if mark is not None and mark.line < len(text.splitlines()) else ""
        raise ConfigError(f"{source}: {where}not valid YAML ({why}){_quote_hint(e, line)}") from None


# a flow mapping closed and followed by more of the value on its line: a brace pattern (``{a,b}.tar``)
_BRACES_THEN_MORE = re.compile(r"(?:^|[:\[,-])\s*\{[^{}]*\}[^\s,\]}#]")


def _quote_hint(error: yaml.YAMLError, line: str) -> str:
    """What to do when YAML read a glob (``inputs: *.tar``) as an alias, or a brace pattern with
    a suffix (``inputs: {a,b}.tar``, on ``line``) as a mapping it cannot end: its own words do not say."""
    said = f"{getattr(error, 'context', None)} {getattr(error, 'problem', None)}"
    if "scanning an alias" in said or "undefined alias" in said:
        return "; a value that starts with * is a YAML alias: quote a glob (inputs: '*.tar')"
    if _BRACES_THEN_MORE.search(line):
        return "; a value that starts with { is a YAML mapping: quote a brace pattern (inputs: '{a,b}.tar')"
    if "${" in line:
        return "; inside { } (a flow mapping) a ${NAME} path must be quoted: {path: '${NAME}/piles'}"
    return ""


def key_lines(text: str) -> dict[str, int]:
    """The line (1-based) of each key and list item of a job file that loads, by its field path
    as errors name it (``output.piles``, ``inputs[1]``).

    Keys brought in by a merge key (``<<: *base``) are not listed: their line is elsewhere.
    """
    lines: dict[str, int] = {}
    nodes: list[tuple[str, yaml.Node | None]] = [("", yaml.compose(text, Loader=yaml.SafeLoader))]
    while nodes:
        path, node = nodes.pop()
        if isinstance(node, yaml.MappingNode) and len(lines) < 100_000:  # an alias bomb is not walked for ever
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    name = f"{path}.{key.value}" if path else key.value
                    lines.setdefault(name, key.start_mark.line + 1)
                    nodes.append((name, value))
        elif isinstance(node, yaml.SequenceNode) and len(lines) < 100_000:
            for i, item in enumerate(node.value):
                lines.setdefault(f"{path}[{i}]", item.start_mark.line + 1)
                nodes.append((f"{path}[{i}]", item))
    return lines


def located(message: str, source: str, lines: dict[str, int]) -> str:
    """``message`` (``SOURCE: FIELD.PATH: ...``) with the line of the field it names after the file.

    A field the file does not hold (a required one missing) is placed at the nearest mapping
    that holds it; a message that names no field of the file is left as it is.
    """
    head, sep, rest = message.partition(": ")
    if head != source or not sep or rest.startswith("line "):
        return message
    path = rest.partition(": ")[0]
    while path and path not in lines:
        path = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", path) if re.search(r"[.\[]", path) else ""
    return f"{source}: line {lines[path]}: {rest}" if path else message
