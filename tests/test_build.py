"""The execution cache: a change in a `lowrank` module re-executes exactly the notebooks that use it."""

import shutil

from lowrank import build

NB = "gradients/decomposition"


def test_sources_follow_imports_transitively():
    used = {p.relative_to(build.PACKAGE).as_posix() for p in build.lowrank_sources(
        "from lowrank import gradients, plotting")}
    assert {"gradients.py", "data.py", "spectral.py", "nets/two_layer.py", "_checks.py", "plotting.py",
            "__init__.py", "nets/__init__.py"} <= used
    assert not used & {"ledger.py", "runs.py", "cli.py", "build.py", "verdicts.py"}


def test_key_changes_with_used_code_only(tmp_path, monkeypatch):
    pkg = tmp_path / "lowrank"
    shutil.copytree(build.PACKAGE, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(build, "PACKAGE", pkg)
    before = build.execution_key(NB)
    (pkg / "ledger.py").write_text((pkg / "ledger.py").read_text() + "\n# unrelated change\n")
    assert build.execution_key(NB) == before
    (pkg / "spectral.py").write_text((pkg / "spectral.py").read_text() + "\n# used change\n")
    assert build.execution_key(NB) != before
