"""README's layout table and CONTRIBUTING's page -> module -> test map against the tree: a module
added, moved or removed without its line there fails here, so the two maps cannot go stale."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lowrank"

# test files that check behaviour across modules (the build, the book, the CLI, the stack) rather than
# one module of lowrank/: their names say what they check
CROSS_CUTTING = {"bad_input", "bad_input_two", "binder", "environment", "explorer", "explorer_html", "fetch",
                 "figures", "html", "install", "layers", "maps", "reader", "sweep_dry_run", "workflows",
                 "conv_vit", "dynamics_precision", "bench", "hostile_input"}


def _modules(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}


def _layout_rows() -> dict[str, set[str]]:
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        m = re.match(r"\| `(lowrank/[\w/]+)/` \| (.*) \|$", line)
        if m:  # the module names are the backticked words of the row (sub-folders end in /)
            rows[m.group(1)] = {w for w in re.findall(r"`(\w+)`", m.group(2))}
    return rows


def test_readme_layout_names_every_module_of_every_package_and_nothing_else():
    rows = _layout_rows()
    packages = {str(p.parent.relative_to(ROOT)) for p in PACKAGE.rglob("__init__.py")} - {"lowrank"}
    assert set(rows) == packages, "README's layout table: one row per package of lowrank/"
    for package, named in rows.items():
        assert named == _modules(ROOT / package), f"README's row for {package}/ lists {sorted(named)}"


def test_contributing_map_names_files_that_exist():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    modules = set(re.findall(r"`((?:core|gradients|sgd|square|book)/[\w/]+\.py)`", text))
    tests = set(re.findall(r"`(test_\w+\.py)`", text))
    assert modules and tests
    assert [m for m in sorted(modules) if not ((PACKAGE / m).is_file() or (ROOT / m).is_file())] == []
    assert [t for t in sorted(tests) if not (ROOT / "tests" / t).is_file()] == []


def test_test_files_are_named_after_the_modules_they_test():
    names = {p.stem for p in PACKAGE.rglob("*.py")}
    unnamed = [p.name for p in sorted((ROOT / "tests").glob("test_*.py"))
               if p.stem[len("test_"):] not in names | CROSS_CUTTING]
    assert unnamed == []
