"""pyproject.toml holds ranges, requirements/lock.txt the exact versions inside them; environment.yml,
binder/ and the Makefile install with the lock; importing the package is cheap."""


import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements() -> list[Requirement]:
    project = _project()
    listed = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    return [Requirement(d.split("#")[0].strip()) for d in listed]


def _lock() -> dict:
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"lock line {line!r} is not NAME==VERSION"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_pyproject_has_ranges_and_the_lock_pins_each_within_its_range():
    pins = _lock()
    for req in _requirements():
        if canonicalize_name(req.name) == "lowrank":  # an extra naming another extra
            continue
        assert not any(s.operator in ("==", "===") for s in req.specifier), f"{req}: a range, not a pin"
        assert req.specifier, f"{req}: give a lower bound"
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in requirements/lock.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"lock {req.name}=={pins[name]} is outside {req}"


def test_the_lock_pins_torch_by_its_public_version():
    """`torch==X` with no local label: the local `+cpu` wheel or PyTorch's CPU index (book.yml,
    binder/, environment.yml) resolve it to the CPU build, PyTorch's CUDA index to a CUDA build."""
    torch = _lock()["torch"]
    assert torch.local is None and torch.release >= (2, 2)
    assert re.search(r"^torch==\d+\.\d+\.\d+$", LOCK.read_text(), re.M)


def test_the_lock_matches_the_environment_it_was_frozen_from():
    """Every package of this venv that the lock names has the locked version (the lock was frozen
    from `make env`'s venv; a drift means the lock or the venv is stale)."""
    from importlib.metadata import distributions

    pins = _lock()
    installed = {canonicalize_name(d.metadata["Name"]): Version(d.version) for d in distributions()}
    drift = {n: (str(v), str(installed[n])) for n, v in pins.items()
             if n in installed and installed[n].public != v.public}
    assert not drift, f"locked vs installed: {drift} (refresh the lock or run `make env`)"


def test_environment_yml_and_binder_install_with_the_lock_and_the_cpu_index():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-c requirements/lock.txt" in pip and "-e .[book,sweep,test,lab]" in pip
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in pip
    binder = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    assert "-c ../requirements/lock.txt" in binder and "--extra-index-url https://download.pytorch.org/whl/cpu" in binder
    assert (ROOT / "binder" / "requirements.txt").parent.joinpath("../requirements/lock.txt").resolve() == LOCK
    stamp_rule = re.search(r"^\$\(STAMP\):.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert "requirements/lock.txt" in stamp_rule.group(0).splitlines()[0]
    assert "-c requirements/lock.txt" in stamp_rule.group(1)


@pytest.mark.slow
def test_import_changes_no_global_state_and_reproducible_skips_the_compiler():
    """`import lowrank...` leaves torch's flags alone; `device.reproducible()` turns on deterministic
    kernels without importing torch._inductor (0.9 s of every kernel's start) and without
    deterministic mode's NaN fill of every new tensor."""
    flags = ("print(torch.are_deterministic_algorithms_enabled(), 'torch._inductor' in sys.modules, "
             "torch.utils.deterministic.fill_uninitialized_memory)")
    code = ("import sys, torch, lowrank.core.train, lowrank.gradients.decomposition, lowrank.book.plotting; "
            + flags + "; from lowrank.core import device; device.reproducible(); " + flags)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False", "True", "True", "False", "False"]


def _imported_modules(source: str) -> set[str]:
    import ast

    tree = ast.parse(source)
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return {n.split(".")[0] for n in names | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}}


def test_seaborn_is_only_the_tests_dependency_and_no_page_or_module_imports_it():
    """README: plotting.use_style sets seaborn's theme as matplotlib settings; only tests/test_figures.py
    imports seaborn (to compare), so it is in the test extra alone."""
    from lowrank.book import notebooks

    extras = _project()["optional-dependencies"]
    with_seaborn = {e for e, deps in extras.items() if any(canonicalize_name(Requirement(d.split("#")[0]).name) == "seaborn"
                                                            for d in deps)}
    assert with_seaborn == {"test"} and not any(d.startswith("seaborn") for d in _project()["dependencies"])
    importers = [p for p in (ROOT / "lowrank").rglob("*.py") if "seaborn" in _imported_modules(p.read_text())]
    for name in notebooks.list_notebooks():
        cells = notebooks.myst_code_cells(notebooks.source_path(name).read_text(encoding="utf-8")).cells
        code = "\n".join(ln for c in cells for ln in c.source.splitlines() if not ln.lstrip().startswith(("%", "!")))
        importers += [name] if "seaborn" in _imported_modules(code) else []
    assert not importers
    assert "seaborn" in _imported_modules((ROOT / "tests" / "test_figures.py").read_text())


def test_requires_python_is_the_oldest_python_every_locked_package_supports_and_the_one_ci_tests():
    """The lower bound of `requires-python` is the oldest Python 3.x that all locked packages (as
    installed here, by their own Requires-Python) accept, and the Python of book.yml, binder and
    environment.yml."""
    from importlib.metadata import distributions

    from packaging.specifiers import SpecifierSet

    pins = _lock()
    needs = {canonicalize_name(d.metadata["Name"]): SpecifierSet(d.metadata.get("Requires-Python") or "")
             for d in distributions() if canonicalize_name(d.metadata["Name"]) in pins}
    assert len(needs) > len(pins) // 2, "too few locked packages installed here to tell"
    # a minor version counts by its latest patch release (soupsieve asks for 3.11.5)
    oldest = next(f"3.{minor}" for minor in range(6, 20)
                  if all(s.contains(Version(f"3.{minor}.99")) for s in needs.values()))
    assert _project()["requires-python"] == f">={oldest}"
    book = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    assert book["jobs"]["test"]["container"] == f"python:{oldest}-bookworm"
    assert (ROOT / "binder" / "runtime.txt").read_text().strip() == f"python-{oldest}"
    conda = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    assert f"python={oldest}" in conda
