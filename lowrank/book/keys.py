"""The keys of executed code: which `lowrank` files a notebook uses, and the hash that names them.

A notebook's execution key (`execution_key`) covers its source, every module of `lowrank/` it
imports directly or not (`lowrank_sources`, read from the imports alone, nothing is run) and its
verdicts' recorded outcomes; a change in any of them executes the notebook again. The ci build
(`lowrank.book.build`), run folders (`lowrank.book.runs`), sweeps and the paper-scale build all key
their results by it (`code_key` for a notebook or a function `module:callable`). A notebook that
is run is resolved once (`notebook_code`): its name checked and its key computed, handed on together.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from lowrank.book.notebooks import read_notebook, source_path
from lowrank.core.io import digest

__all__ = ["PACKAGE", "module_file", "imported_modules", "lowrank_sources", "execution_key", "code_key", "code_files",
           "NotebookCode", "notebook_code"]

PACKAGE = Path(__file__).resolve().parents[1]  # lowrank/


def module_file(module: str) -> Path | None:
    """`lowrank.a.b` -> its source file (module or package __init__), None if it is not ours."""
    parts = module.split(".")
    if parts[0] != "lowrank":
        return None
    base = PACKAGE.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(source: str, module: str, is_package: bool) -> set[str]:
    """Absolute names of the modules `source` imports (relative imports resolved against `module`)."""
    return set(_imported_modules(source, module, is_package))


@functools.lru_cache(maxsize=1024)  # a build asks for every module of lowrank/ once per notebook
def _imported_modules(source: str, module: str, is_package: bool) -> frozenset[str]:
    found = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                root = ".".join(base + ([node.module] if node.module else []))
            else:
                root = node.module or ""
            found.add(root)
            found.update(f"{root}.{a.name}" for a in node.names)  # `from lowrank import spectral`
    return frozenset(found)


def lowrank_sources(code: str) -> list[Path]:
    """The files of `lowrank/` that `code` uses, directly or through other modules (with the
    `__init__.py` of every package on the way), so a change in any of them changes the key."""
    todo = [m for m in imported_modules(code, "__main__", False) if module_file(m)]
    seen: dict[str, Path] = {}
    while todo:
        mod = todo.pop()
        path = module_file(mod)
        if path is None or mod in seen:
            continue
        seen[mod] = path
        parents = [".".join(mod.split(".")[:i]) for i in range(1, len(mod.split(".")))]
        todo += parents
        todo += [m for m in imported_modules(path.read_text(), mod, path.name == "__init__.py") if module_file(m)]
    return sorted(set(seen.values()))


def execution_key(name: str) -> str:
    """Hash of the notebook's source, of every `lowrank` file it uses, and of its verdicts' recorded
    outcomes (an unstable one reads "unstable" in the ci book)."""
    from lowrank.book import goldens

    src = source_path(name)
    code = "\n".join(c.source for c in read_notebook(name).cells if c.cell_type == "code")
    used = [part for p in lowrank_sources(code) for part in (p.relative_to(PACKAGE).as_posix(), p)]
    return digest(src, *used, json.dumps(goldens.recorded_block(name), sort_keys=True, default=str))


def code_files(name: str) -> dict[str, str]:
    """`{path relative to the repository: file digest}` of notebook `name`'s source and of every
    `lowrank` file it uses (`lowrank_sources`): stored with a result, so that a later edit can be
    named file by file (`lowrank.book.paper_results.code_changes`). Unlike `execution_key` it leaves
    out the golden entries, which change only how the ci book reports a verdict."""
    src = source_path(name)
    code = "\n".join(c.source for c in read_notebook(name).cells if c.cell_type == "code")
    root = PACKAGE.parent
    return {p.relative_to(root).as_posix(): digest(p) for p in [src, *lowrank_sources(code)]}


def code_key(target: str) -> str:
    """Hash of the code that makes a result of `target`: a notebook's source and every `lowrank`
    file it imports (`execution_key`, the book build's own key), or for a
    function `module:callable` its module's file and every `lowrank` file that module imports."""
    if ":" not in target:
        return execution_key(target)
    module = target.partition(":")[0]
    files = lowrank_sources(f"import {module}")
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.origin and Path(spec.origin).is_file():
        files = sorted(set(files) | {Path(spec.origin)})
    return digest(module, *[part for f in files for part in (f.name, f)])


@dataclass(frozen=True)
class NotebookCode:
    """A notebook to run, resolved once (`notebook_code`): its name, checked, and its code key
    (`execution_key`), so that what runs it and what records it never look either up again."""

    name: str
    key: str


def notebook_code(name: str) -> NotebookCode:
    """Notebook `name` with its code key; InputError or FileNotFoundError (`notebooks.source_path`,
    which `execution_key` asks first) for a name that is not a notebook's."""
    return NotebookCode(name, execution_key(name))
