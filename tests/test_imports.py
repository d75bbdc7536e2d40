"""The package's import rules (ARCHITECTURE.md), read from the source with ``ast``.

- ``tar/`` and ``storage`` import nothing of ``piles/``, ``loading/``, ``tools/``, ``cli/``;
- ``dataset/`` sits above ``storage/`` and ``tar/`` (they never import it) and below ``piles/``,
  ``loading/``, ``tools/`` and ``cli/`` (it never imports them);
- ``piles/`` and ``loading/`` never import each other (what both need lives below them);
- only the facade (``shardkit/__init__.py``) and ``__main__`` import ``cli/``;
- no module imports the package root, or another module's ``_underscored`` names;
- no module shares its name with a public name of the facade (importing it would replace that name);
- no import cycles;
- no module over 450 lines;
- ``loading/``, ``manifest/`` and the listed ``tools/`` modules reach a dataset's files only
  through ``storage`` (no ``open``, no file calls of ``os``, no ``is_remote``/``local_path``).
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "shardkit"
UPPER = ("shardkit.piles", "shardkit.loading", "shardkit.tools", "shardkit.cli")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module imported from
    name: str | None  # the name taken from it (None: the module itself)
    line: int
    typing_only: bool


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, path: pathlib.Path) -> list[Import]:
    tree = ast.parse(path.read_text(), str(path))
    typing_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            typing_lines |= {n.lineno for child in node.body for n in ast.walk(child) if hasattr(n, "lineno")}
    found = []
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        typing = getattr(node, "lineno", 0) in typing_lines
        if isinstance(node, ast.Import):
            found += [Import(module, a.name, None, node.lineno, typing) for a in node.names if a.name.split(".")[0] == "shardkit"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "shardkit":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in MODULES:  # a submodule, imported whole
                    found.append(Import(module, sub, None, node.lineno, typing))
                else:
                    found.append(Import(module, base, alias.name, node.lineno, typing))
    return found


IMPORTS = [imp for module, path in MODULES.items() for imp in _imports(module, path)]


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _broken(rule) -> list[str]:
    return [f"{i.source} (line {i.line}) imports {i.target}{'.' + i.name if i.name else ''}" for i in IMPORTS if rule(i)]


def test_the_package_is_read():
    assert {"shardkit.tar.walk", "shardkit.piles.router", "shardkit.loading.plan", "shardkit.cli.main"} <= set(MODULES)
    assert len(IMPORTS) > 100


def test_tar_and_storage_know_nothing_above_them():
    low = ("shardkit.tar", "shardkit.storage")
    assert _broken(lambda i: any(_within(i.source, p) for p in low) and any(_within(i.target, u) for u in UPPER)) == []


def test_the_dataset_sits_between_storage_and_the_passes():
    low = ("shardkit.tar", "shardkit.storage")
    assert _broken(lambda i: any(_within(i.source, p) for p in low) and _within(i.target, "shardkit.dataset")) == []
    assert _broken(lambda i: _within(i.source, "shardkit.dataset") and any(_within(i.target, u) for u in UPPER)) == []
    assert any(_within(i.source, "shardkit.piles") and _within(i.target, "shardkit.dataset") for i in IMPORTS)


@pytest.mark.parametrize(("a", "b"), [("shardkit.piles", "shardkit.loading"), ("shardkit.loading", "shardkit.piles")])
def test_the_two_passes_never_import_each_other(a, b):
    assert _broken(lambda i: _within(i.source, a) and _within(i.target, b)) == []


def test_only_the_facade_and_main_import_the_cli():
    allowed = ("shardkit", "shardkit.__main__")
    assert _broken(lambda i: _within(i.target, "shardkit.cli") and not _within(i.source, "shardkit.cli") and i.source not in allowed) == []


def test_no_module_imports_the_package_root():
    assert _broken(lambda i: i.source != "shardkit" and i.target == "shardkit") == []


def test_no_module_imports_another_modules_private_names():
    assert _broken(lambda i: i.name is not None and i.name.startswith("_") and i.target != i.source) == []


def test_no_import_cycles():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in IMPORTS:
        if not i.typing_only and i.target in graph and i.target != i.source:
            graph[i.source].add(i.target)
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def _facade_names() -> dict[str, str]:
    """The facade's public names, each with the module it is taken from (its ``_WHERE``)."""
    init = PACKAGE / "__init__.py"
    for node in ast.walk(ast.parse(init.read_text(), str(init))):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_WHERE" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("shardkit/__init__.py: no _WHERE")


def _children(package: pathlib.Path) -> set[str]:
    return {p.stem for p in package.glob("*.py") if p.stem != "__init__"} | {p.parent.name for p in package.glob("*/__init__.py")}


def test_no_module_hides_a_name_of_the_facade():
    # importing a submodule sets the package's attribute of that name: a module shardkit/shuffle.py would be
    # what shardkit.shuffle is once anything imports it, and shardkit/tools/gc.py would replace the function gc
    names = _facade_names()
    hidden = [f"shardkit.{name}" for name in sorted(set(names) & _children(PACKAGE))]
    for name, where in sorted(names.items()):
        folder = PACKAGE.parent.joinpath(*where.split("."))
        if (folder / "__init__.py").exists() and name in _children(folder):
            hidden.append(f"{where}.{name}")
    assert hidden == []
    assert {"shuffle", "gc"} <= set(names)


def test_every_module_fits_in_a_head():
    lines = {p.relative_to(PACKAGE.parent).as_posix(): len(p.read_text().splitlines()) for p in MODULES.values()}
    assert {name: n for name, n in lines.items() if n > 450} == {}


# modules that reach a dataset's files only through a Store (shardkit.storage): no builtin open,
# no file system calls of os, no io/fcntl/mmap/shutil, no asking whether a URL is local. Every
# module of these folders (the readers and the writers), and these modules
THROUGH_THE_STORE_FOLDERS = ("shardkit/loading/", "shardkit/manifest/", "shardkit/piles/", "shardkit/dataset/", "shardkit/tools/")
THROUGH_THE_STORE = {"shardkit/eager_shuffle.py", "shardkit/shard_roller.py"}
# in those folders, but not about a dataset's files
NOT_DATASET_FILES = {
    "shardkit/loading/ring.py": "shared memory that hands batches from DataLoader workers over",
    "shardkit/piles/readers/": "a user's inputs in other formats (Arrow, MDS, litdata, Hugging Face folders, CSV), read where they lie",
    "shardkit/piles/transforms.py": "a user's input folders of files and images, walked where they lie",
    "shardkit/tools/demo.py": "the demo's own scratch files and /proc for its memory figures",
}
# writers that still touch local files past the store, and why; the list only shrinks
PAST_THE_STORE = {
    "shardkit/dataset/staging.py": "makes, checks and removes private staging directories without following a link (O_NOFOLLOW, dir_fd)",
    "shardkit/dataset/owned.py": "deletes a staging directory (lstat, a walk following no link) and a failed job's empty output (rmdir)",
    "shardkit/dataset/leftovers.py": "probes the flock of other jobs' stagings in TMPDIR without creating the lock file",
    "shardkit/piles/resume.py": "renames a finished pass 1's staging aside before removing it, and sums what it holds for the log",
}
_EXEMPT = (*NOT_DATASET_FILES, *PAST_THE_STORE)
THROUGH_THE_STORE |= {
    p.relative_to(PACKAGE.parent).as_posix()
    for p in MODULES.values()
    if p.relative_to(PACKAGE.parent).as_posix().startswith(THROUGH_THE_STORE_FOLDERS)
}
THROUGH_THE_STORE = {m for m in THROUGH_THE_STORE if not m.startswith(_EXEMPT)}
_FILE_MODULES = {"io", "fcntl", "mmap", "shutil"}
_OS_CALLS = {
    "open", "stat", "lstat", "listdir", "scandir", "walk", "remove", "unlink", "rename", "replace", "makedirs",
    "mkdir", "rmdir", "link", "symlink", "fsync", "pread", "read", "write", "truncate", "exists", "lexists",
    "isfile", "isdir", "islink", "getsize", "getmtime",
}  # fmt: skip
_URL_KIND = {"is_remote", "local_path"}


def _file_access(path: pathlib.Path) -> list[str]:
    """Where the module at ``path`` touches files past the store: ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{node.lineno}: import {n}" for n in names if n.split(".")[0] in _FILE_MODULES]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
            found.append(f"{node.lineno}: open(")
        elif isinstance(node, ast.Attribute):
            owner = ast.unparse(node.value)
            if owner in ("os", "os.path") and node.attr in _OS_CALLS:
                found.append(f"{node.lineno}: {owner}.{node.attr}")
            elif owner == "storage" and node.attr in _URL_KIND:
                found.append(f"{node.lineno}: storage.{node.attr}")
    return found


@pytest.mark.parametrize("module", sorted(THROUGH_THE_STORE))
def test_these_modules_reach_files_only_through_the_store(module):
    assert _file_access(PACKAGE.parent / module) == []


@pytest.mark.parametrize("module", sorted(PAST_THE_STORE))
def test_a_writer_past_the_store_leaves_the_list_once_it_moves_onto_the_store(module):
    assert _file_access(PACKAGE.parent / module) != [], f"{module} reaches files only through the store now: take it off PAST_THE_STORE"


def test_the_file_access_rule_sees_what_it_forbids(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text("import io\nimport os\nopen('x')\nos.path.isfile('x')\nstorage.is_remote('x')\nos.path.join('a', 'b')\n")
    assert _file_access(sample) == ["1: import io", "3: open(", "4: os.path.isfile", "5: storage.is_remote"]
