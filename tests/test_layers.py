"""The package's layers: imports run one way only (book -> parts -> core), parts never import each
other, and the science imports without the book, sweep or test stacks."""

import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lowrank"
PARTS = ("gradients", "sgd", "square")
LAYER = {"core": 0, **{p: 1 for p in PARTS}, "book": 2}


def imported_lowrank_modules(path: Path, package_dir: Path = PACKAGE) -> set[str]:
    """Absolute `lowrank.<sub>...` names imported by the file (relative imports resolved), by the
    book build's own import reader (`lowrank.book.keys.imported_modules`)."""
    from lowrank.book.keys import imported_modules

    is_package = path.name == "__init__.py"
    module = ".".join(path.relative_to(package_dir.parent).with_suffix("").parts).removesuffix(".__init__")
    return {n for n in imported_modules(path.read_text(), module, is_package) if n.startswith("lowrank.")}


def subpackage(module_or_path) -> str:
    parts = module_or_path.relative_to(PACKAGE).parts if isinstance(module_or_path, Path) else module_or_path.split(".")[1:]
    return parts[0]


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE)


def test_every_module_lives_in_a_layer():
    assert {subpackage(p) for p in MODULES} == set(LAYER)
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py"]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_run_one_way(path):
    own = subpackage(path)
    for name in imported_lowrank_modules(path):
        other = subpackage(name)
        assert LAYER[other] <= LAYER[own], f"{path.relative_to(PACKAGE)} imports {name}: {own} may not import {other}"
        if own in PARTS and other in PARTS:
            assert other == own, f"{path.relative_to(PACKAGE)} imports {name}: a part never imports another part"


def test_the_checker_sees_a_wrong_direction(tmp_path):
    """The rule would catch a core module importing the book machinery."""
    fake = tmp_path / "lowrank" / "core" / "probe.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from lowrank.book import verdicts\nfrom ..gradients import dynamics\n")
    found = imported_lowrank_modules(fake, tmp_path / "lowrank")
    assert {subpackage(n) for n in found} == {"book", "gradients"}
    assert all(LAYER[subpackage(n)] > LAYER["core"] for n in found)


@pytest.mark.slow
def test_science_imports_without_the_book_sweep_and_test_stacks():
    code = ("import sys; import lowrank.core.spectral, lowrank.core.train, lowrank.gradients.dynamics, "
            "lowrank.sgd.theory, lowrank.square.training, lowrank.square.bounds; "
            "print(sorted(m for m in ('ray', 'playwright', 'jupyter_book', 'myst_nb', 'papermill', 'yaml', "
            "'matplotlib', 'pytest') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def _module_name(path: Path, package_dir: Path = PACKAGE) -> str:
    return ".".join(path.relative_to(package_dir.parent).with_suffix("").parts).removesuffix(".__init__")


def import_graph(paths, package_dir: Path = PACKAGE) -> dict[str, list[str]]:
    """`{module: [the modules of paths it imports]}` (imports inside functions included; a module's own packages,
    whose `__init__` runs first, are not arrows)."""
    names = {_module_name(p, package_dir): p for p in paths}

    def own_packages(m):  # importing a module runs its packages' __init__ first: not an arrow back
        return {m.rsplit(".", k)[0] for k in range(1, m.count(".") + 1)}

    return {m: sorted({n for n in imported_lowrank_modules(p, package_dir) if n in names and n != m} - own_packages(m))
            for m, p in names.items()}


def floors(graph: dict[str, list[str]]) -> dict[str, int]:
    """Each module's floor: 1 for one that imports none of the graph's modules, else one above the highest it
    imports (the graph has no circle: `test_no_module_imports_itself_back`)."""
    found = {}

    def floor(m):
        if m not in found:
            found[m] = 1 + max((floor(n) for n in graph[m]), default=0)
        return found[m]

    return {m: floor(m) for m in graph}


def import_cycles(paths, package_dir: Path = PACKAGE) -> list[list[str]]:
    """Every import circle among the modules `paths` (imports inside functions included): the
    strongly connected components of more than one module, by Tarjan's algorithm."""
    graph = import_graph(paths, package_dir)
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("sub", list(LAYER))
def test_no_module_imports_itself_back(sub):
    """No import circle (imports inside functions included): inside `lowrank/book`, the build, the
    run folders and the ledger meet in modules they all import (`keys`, `pages`, `rules`), never in
    each other. (Between layers, `test_imports_run_one_way` forbids them.)"""
    assert import_cycles([p for p in MODULES if subpackage(p) == sub]) == []


def test_the_circle_checker_sees_a_circle(tmp_path):
    book = tmp_path / "lowrank" / "book"
    book.mkdir(parents=True)
    (book / "a.py").write_text("from lowrank.book import b\n")
    (book / "b.py").write_text("def f():\n    from lowrank.book.c import g\n")
    (book / "c.py").write_text("import lowrank.book.a\n")
    (book / "d.py").write_text("from lowrank.book import a\n")
    paths = sorted(book.glob("*.py"))
    assert import_cycles(paths, tmp_path / "lowrank") == [["lowrank.book.a", "lowrank.book.b", "lowrank.book.c"]]


def test_the_book_machinery_stands_on_at_most_six_floors():
    """Issue 49: `lowrank/book` is at most six floors high (a module's floor is one above the highest it imports),
    so that following a notebook through the build does not climb a tower; README's layout row lists them."""
    graph = import_graph([p for p in MODULES if subpackage(p) == "book"])
    height = floors(graph)
    assert max(height.values()) <= 6, sorted(height.items(), key=lambda kv: -kv[1])[:8]


def test_the_floor_counter_counts_a_chain(tmp_path):
    book = tmp_path / "lowrank" / "book"
    book.mkdir(parents=True)
    for k in range(7):  # m0 <- m1 <- ... <- m6, the last import inside a function
        (book / f"m{k}.py").write_text("" if k == 0 else
                                       (f"def f():\n    from lowrank.book import m{k - 1}\n" if k == 6 else f"from lowrank.book import m{k - 1}\n"))
    height = floors(import_graph(sorted(book.glob("*.py")), tmp_path / "lowrank"))
    assert height == {f"lowrank.book.m{k}": k + 1 for k in range(7)}
