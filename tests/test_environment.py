"""environment.yml lists exactly the pins of pyproject.toml."""


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
