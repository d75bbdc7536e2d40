"""Find the fenced Python and shell blocks of a Markdown page, and turn a page's blocks into one script.

A block runs unless the line before its fence says otherwise:

    <!-- skip: why it must not run -->     never run; listed with the reason
    <!-- needs: s3 -->                     run against the suite's moto server (AWS_ENDPOINT_URL is set)
    <!-- needs: ray, torch -->             run only where these extras are installed (also plot, parquet, hf, mds, litdata)

The blocks of one page run in order in one process, in one folder: Python blocks share one
namespace, and a shell block sees the files earlier blocks wrote. Imported by tests only.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

RUN = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
KNOWN_NEEDS = frozenset({"s3", "ray", "torch", "plot", "parquet", "hf", "mds", "litdata"})
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
_MARK = re.compile(r"^\s*<!--\s*(?P<word>skip|needs)\s*(?::\s*(?P<text>.*?))?\s*-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language (``python`` or ``sh``), its code and its marks."""

    path: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    needs: frozenset[str] = frozenset()
    skip: str | None = None  # the reason, when marked skip

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def blocks(path: Path, name: str | None = None) -> list[Block]:
    """Every ``python``/``sh`` fenced block of the Markdown file ``path`` (other languages are text).

    Raises:
        ValueError: an unclosed fence, a ``skip`` mark without a reason, or a ``needs`` mark naming
            something unknown.
    """
    name = name or str(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, lang = m["indent"], m["ticks"], m["lang"].lower()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(ticks):
            end += 1
        if end == len(lines):
            raise ValueError(f"{name}:{i + 1}: the fence opened here is never closed")
        if lang in RUN:
            body = [line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines[i + 1 : end]]
            needs, skip = _marks(lines, i, name)
            found.append(Block(name, i + 1, RUN[lang], "\n".join(body) + "\n", needs, skip))
        i = end + 1
    return found


def _marks(lines: list[str], fence: int, name: str) -> tuple[frozenset[str], str | None]:
    """The ``skip``/``needs`` marks on the non-blank lines right above a fence."""
    needs: set[str] = set()
    skip = None
    j = fence - 1
    while j >= 0 and (m := _MARK.match(lines[j])):
        if m["word"] == "skip":
            if not m["text"]:
                raise ValueError(f"{name}:{j + 1}: skip: expected a reason, as in <!-- skip: why it must not run -->")
            skip = m["text"]
        else:
            names = {part.strip() for part in (m["text"] or "").split(",") if part.strip()}
            if not names or names - KNOWN_NEEDS:
                raise ValueError(f"{name}:{j + 1}: needs: expected some of {', '.join(sorted(KNOWN_NEEDS))}, got {m['text']!r}")
            needs |= names
        j -= 1
    return frozenset(needs), skip


def script(page: list[Block]) -> str:
    """A Python program that runs ``page``'s blocks in order and names the first one that fails."""
    parts = [
        "import subprocess, sys, time, traceback",
        "start = time.monotonic()",
        "namespace = globals()  # __main__'s: worker processes find the functions a block defines",
        "def shell(code, where):",
        "    if subprocess.run(['bash', '-euo', 'pipefail', '-c', code]).returncode:",
        "        sys.exit(f'{where}: this shell block failed')",
        "def python(code, where):",
        "    try:",
        "        exec(compile(code, where, 'exec'), namespace)",
        "    except BaseException:",
        "        traceback.print_exc()",
        "        sys.exit(f'{where}: this Python block failed')",
    ]
    for block in page:
        parts.append(f"print(f'--- {block.where} at {{time.monotonic() - start:.1f}}s', flush=True)")
        parts.append(f"{'python' if block.lang == 'python' else 'shell'}({block.code!r}, {block.where!r})")
    return "\n".join(parts) + "\n"
