"""environment.yml lists exactly the pins of pyproject.toml; importing the package is cheap."""


import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    pins = {d.split("#")[0].strip() for d in listed}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert set(pip) - {"-e .[book,sweep,test]"} == pins
    assert all("==" in p for p in pins), "every dependency is pinned"


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
