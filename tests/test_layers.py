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
    book build's own import reader (`lowrank.book.build._imports`)."""
    from lowrank.book.build import _imports

    is_package = path.name == "__init__.py"
    module = ".".join(path.relative_to(package_dir.parent).with_suffix("").parts).removesuffix(".__init__")
    return {n for n in _imports(path.read_text(), module, is_package) if n.startswith("lowrank.")}


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
