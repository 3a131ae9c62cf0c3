"""environment.yml lists exactly the pins of pyproject.toml; importing the package is cheap."""


import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_environment_yml_matches_pyproject():
    pins = {d.split("#")[0].strip() for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert set(pip) - {"-e ."} == pins
    assert all("==" in p for p in pins), "every dependency is pinned"


def test_import_is_deterministic_without_loading_the_compiler():
    """`import lowrank` turns on deterministic kernels without importing torch._inductor (0.9 s of
    every notebook kernel's start), and without deterministic mode's NaN fill of every new tensor."""
    code = ("import sys, torch, lowrank.train, lowrank.gradients, lowrank.plotting; "
            "print(torch.are_deterministic_algorithms_enabled(), 'torch._inductor' in sys.modules, "
            "torch.utils.deterministic.fill_uninitialized_memory)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False", "False"]
