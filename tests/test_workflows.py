"""The GitHub Actions workflows: linted by actionlint (pinned in the `test` extra), and doing what
README and the paper-scale build promise (book and tests on every push, Pages from the default branch,
the paper-scale build by hand on a self-hosted GPU runner)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _actionlint() -> str:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("actionlint", path=path)
    assert found, "actionlint is missing: it comes with the test extra (pip install -e '.[test]')"
    return found


def _load(name: str) -> dict:
    # YAML 1.1 reads the key `on` as True
    return {("on" if k is True else k): v for k, v in yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text()).items()}


def _runs(job: dict) -> str:
    return "\n".join(s.get("run", "") for s in job["steps"])


def _uses(job: dict) -> list[str]:
    return [s["uses"].split("@")[0] for s in job["steps"] if "uses" in s]


def test_workflows_pass_actionlint():
    assert [w.name for w in WORKFLOWS] == ["book.yml", "paper.yml"]
    out = subprocess.run([_actionlint(), "-no-color", *map(str, WORKFLOWS)], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_actionlint_rejects_a_broken_workflow(tmp_path):
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text("on: push\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - run: echo ${{ github.nonexistent_context_key }}\n      - uses: actions/checkout@v5\n"
                   "        with: {no_such_input: 1}\n")
    out = subprocess.run([_actionlint(), "-no-color", str(bad)], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 1 and "no_such_input" in out.stdout


def test_book_workflow_tests_on_every_push_and_deploys_pages_from_the_default_branch():
    wf = _load("book.yml")
    assert "push" in wf["on"] and not (wf["on"]["push"] or {}).get("branches")
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"^(make test)\s", readme, re.M).group(1)  # README's test command
    test, deploy = wf["jobs"]["test"], wf["jobs"]["deploy"]
    assert re.search(rf"^{command}\b", _runs(test), re.M)
    upload = next(s for s in test["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == "_build/html"
    assert "default_branch" in upload["if"] and "default_branch" in deploy["if"]
    assert deploy["needs"] == "test" and _uses(deploy) == ["actions/deploy-pages"]
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}


def test_paper_workflow_is_manual_on_a_self_hosted_gpu_runner_and_publishes_results():
    wf = _load("paper.yml")
    assert list(wf["on"]) == ["workflow_dispatch"]
    job = wf["jobs"]["paper"]
    assert {"self-hosted", "gpu"} <= set(job["runs-on"])
    runs = _runs(job)
    assert "make paper" in runs and "--scale paper" in runs
    assert "lowrank data fetch mnist" in runs and "lowrank data fetch cifar10" in runs
    paths = [s["with"]["path"] for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    assert paths == ["results/paper", "_build/paper/_build/html"]
    labels = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())["self-hosted-runner"]["labels"]
    assert set(job["runs-on"]) - {"self-hosted", "linux"} <= set(labels)


@pytest.mark.parametrize("target", ["test", "paper"])
def test_the_make_targets_the_workflows_call_exist(target):
    assert re.search(rf"^{target}:", (ROOT / "Makefile").read_text(), re.M)
