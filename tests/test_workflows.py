"""The GitHub Actions workflows: linted by actionlint, which runs shellcheck on every `run:` script
(both binaries come with the `test` extra), and doing what README, the Colab buttons and the
paper-scale build promise (book and tests on every push to the default branch and every pull request,
Pages and the Colab notebooks from the default branch only, the paper-scale build by hand on a
self-hosted GPU runner)."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest
import yaml

from lowrank.book import build, notebooks, pages

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
_PATH = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def _linter(name: str) -> str:
    found = shutil.which(name, path=_PATH)
    if not found:
        pytest.skip(f"{name} is missing: it comes with the test extra (pip install -e '.[test]')")
    return found


def _actionlint(*args, cwd=ROOT):
    """actionlint with shellcheck on its PATH (it then checks every `run:` script)."""
    _linter("shellcheck")
    return subprocess.run([_linter("actionlint"), "-no-color", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "PATH": _PATH})


def test_the_projects_shell_scripts_pass_shellcheck():
    scripts = [ROOT / "binder" / "postBuild", ROOT / "requirements" / "refresh-lock.sh"]
    out = subprocess.run([_linter("shellcheck"), *map(str, scripts)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _load(name: str) -> dict:
    # YAML 1.1 reads the key `on` as True
    return {("on" if k is True else k): v for k, v in yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text()).items()}


def _runs(job: dict) -> str:
    return "\n".join(s.get("run", "") for s in job["steps"])


def _uses(job: dict) -> list[str]:
    return [s["uses"].split("@")[0] for s in job["steps"] if "uses" in s]


def test_workflows_pass_actionlint_and_shellcheck():
    assert [w.name for w in WORKFLOWS] == ["book.yml", "paper.yml"]
    out = _actionlint(*WORKFLOWS)
    assert out.returncode == 0, out.stdout + out.stderr


def test_actionlint_and_shellcheck_reject_a_broken_workflow(tmp_path):
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text("on: push\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - run: echo ${{ github.nonexistent_context_key }}\n      - uses: actions/checkout@v5\n"
                   "        with: {no_such_input: 1}\n      - run: cp $SRC dest\n")
    out = _actionlint(bad, cwd=tmp_path)
    assert out.returncode == 1 and "no_such_input" in out.stdout
    assert "SC2086" in out.stdout, "shellcheck did not check the run: script"


DEFAULT_BRANCH_PUSH = "github.event_name == 'push' && github.ref == format('refs/heads/{0}', github.event.repository.default_branch)"


def _step(job: dict, uses: str, name: str | None = None) -> dict:
    return next(s for s in job["steps"] if s.get("uses", "").startswith(uses)
                and (name is None or s.get("with", {}).get("name") == name))


def test_book_workflow_builds_pushes_to_the_default_branch_only_and_pull_requests():
    """A pull request's branch is built once (as the pull request), not also for each push to it."""
    wf = _load("book.yml")
    default = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["branch"]
    assert wf["on"]["push"] == {"branches": [default]}
    assert "pull_request" in wf["on"] and not (wf["on"]["pull_request"] or {}).get("branches")


def test_book_workflow_and_ci_run_check_the_science_install_after_the_environment():
    """The fresh-venv check that `make test` leaves out (marker `install`) runs in both CIs, after `make env`."""
    command = ".venv/bin/python -m pytest -p no:cacheprovider -q -m install tests/test_install.py"
    steps = [s.get("run", "") for s in _load("book.yml")["jobs"]["test"]["steps"]]
    assert steps.index(command) == next(i for i, r in enumerate(steps) if r.startswith("make env")) + 1
    ci = (ROOT / ".ci" / "run").read_text()
    assert f'stage "science-install" {command}\n' in ci and ci.index('stage "install" make env') < ci.index(command)
    assert "install" in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]


def test_book_workflow_tests_pushes_and_pull_requests_and_deploys_only_the_default_branch():
    wf = _load("book.yml")
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"^(make test)\s", readme, re.M).group(1)  # README's test command
    test, deploy, publish = wf["jobs"]["test"], wf["jobs"]["deploy"], wf["jobs"]["notebooks"]
    assert re.search(rf"^{command}\b", _runs(test), re.M)
    upload = _step(test, "actions/upload-pages-artifact")
    assert upload["with"]["path"] == "_build/html"
    for gated in (upload, deploy, publish, _step(test, "actions/upload-artifact", "colab-notebooks")):
        assert gated["if"] == DEFAULT_BRANCH_PUSH  # never for a pull request
    assert deploy["needs"] == "test" and _uses(deploy) == ["actions/deploy-pages"]
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert wf["permissions"] == {"contents": "read"}


def test_book_workflow_never_cancels_a_deploy():
    wf = _load("book.yml")
    # only a pull request's older build is cancelled; pushes queue
    assert wf["concurrency"]["cancel-in-progress"] == "${{ github.event_name == 'pull_request' }}"
    for job in ("deploy", "notebooks"):
        assert wf["jobs"][job]["concurrency"]["cancel-in-progress"] is False


def test_book_workflow_caches_executed_notebooks_by_their_execution_keys_and_uploads_failure_reports():
    test = _load("book.yml")["jobs"]["test"]
    keys = next(s for s in test["steps"] if s.get("id") == "keys")
    assert "lowrank.book.build --keys" in keys["run"]
    caches = [s for s in test["steps"] if s.get("uses", "").startswith("actions/cache")]
    executed = next(c for c in caches if "_build/executed" in c["with"]["path"])
    assert "steps.keys.outputs.hash" in executed["with"]["key"]
    order = [s.get("id") or s.get("uses") or s.get("run") for s in test["steps"]]
    assert order.index("keys") < test["steps"].index(executed) < next(
        i for i, s in enumerate(test["steps"]) if s.get("run", "").startswith("make test"))
    report = _step(test, "actions/upload-artifact", "failure-reports")
    assert report["if"] == "failure()" and "_build/failed" in report["with"]["path"]
    assert notebooks.FAILED_ROOT.relative_to(ROOT).as_posix() == "_build/failed"


def test_build_keys_prints_one_execution_key_per_notebook(capsys):
    build.main(["--keys"])
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == build.book_notebooks()
    name, key = lines[0].split()
    assert key == build.execution_key(name)


def test_every_colab_link_opens_a_notebook_the_workflow_publishes(tmp_path, monkeypatch):
    """The Colab button's path on COLAB_BRANCH is where book.yml's `notebooks` job puts the file that
    publish_notebooks wrote below `_build/html/_sources/notebooks`."""
    wf = _load("book.yml")
    test, publish = wf["jobs"]["test"], wf["jobs"]["notebooks"]
    uploaded = Path(_step(test, "actions/upload-artifact", "colab-notebooks")["with"]["path"])
    downloaded = Path(_step(publish, "actions/download-artifact", "colab-notebooks")["with"]["path"])
    assert f"git switch --orphan {pages.COLAB_BRANCH}" in _runs(publish)
    assert re.search(rf"git push --force origin {pages.COLAB_BRANCH}$", _runs(publish), re.M)
    # publish_notebooks into a scratch HTML folder, from a small executed notebook
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])
    monkeypatch.setattr(pages, "executed_path", lambda name: tmp_path / "nb.ipynb")
    nbformat.write(nb, tmp_path / "nb.ipynb")
    html = tmp_path / "_build" / "html"
    names = build.book_notebooks()
    written = pages.publish_notebooks(names, html)
    on_branch = {(downloaded / p.relative_to(tmp_path / uploaded)).as_posix() for p in written}
    repo = pages.repository_url()
    for name in names:
        url = pages.colab_url(repo, name)
        prefix = f"https://colab.research.google.com/github/{repo.split('github.com/')[1]}/blob/{pages.COLAB_BRANCH}/"
        assert url.startswith(prefix) and url[len(prefix):] in on_branch, url
    assert len(on_branch) == len(names)


def test_the_published_notebooks_install_the_package_at_the_commit_that_built_them(tmp_path, monkeypatch):
    from packaging.requirements import Requirement

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])
    nbformat.write(nb, tmp_path / "nb.ipynb")
    monkeypatch.setattr(pages, "executed_path", lambda name: tmp_path / "nb.ipynb")
    written = pages.publish_notebooks(["gradients/scaling"], tmp_path / "html")
    setup = nbformat.read(written[0], as_version=4).cells[0]
    assert setup.metadata["tags"] == ["colab-setup"]
    spec = re.search(r'"(lowrank\[notebook\] @ [^"]+)"', setup.source).group(1)
    req = Requirement(spec)  # a PEP 508 direct reference that pip installs
    assert req.extras == {"notebook"} and req.url == f"git+{pages.repository_url()}@{head.stdout.strip()}"
    exec(compile(setup.source, "setup", "exec"), {})  # valid Python; `lowrank` is importable here, so it installs nothing


def test_colab_setup_cell_installs_the_notebook_extra_with_ranges_that_keep_colabs_torch():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "lowrank[notebook] @ git+" in pages.SETUP_SOURCE
    notebook = project["optional-dependencies"]["notebook"]
    assert not any(d.split("[")[0].split(">")[0].split("=")[0].strip() in ("jupyter-book", "torch") for d in notebook)
    torch = next(d for d in project["dependencies"] if d.startswith("torch"))
    assert "==" not in torch and ">=2.2" in torch  # Colab's torch is kept, not replaced by a pin


def test_paper_workflow_checks_the_gpu_before_the_data_and_commits_results_in_a_short_job():
    wf = _load("paper.yml")
    assert list(wf["on"]) == ["workflow_dispatch"]
    job = wf["jobs"]["paper"]
    assert {"self-hosted", "gpu"} <= set(job["runs-on"])
    runs = _runs(job)
    assert "make paper" in runs and "--scale paper" in runs
    assert runs.index("nvidia-smi") < runs.index("torch.cuda.is_available()") < runs.index("lowrank data fetch mnist")
    assert "lowrank data fetch cifar10" in runs
    env_step = next(s for s in job["steps"] if s.get("run", "").startswith("make env"))
    assert env_step["env"]["PIP_EXTRA_INDEX_URL"].startswith("https://download.pytorch.org/whl/${{ inputs.torch_index")
    uploads = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    assert [s["with"]["path"] for s in uploads][:2] == ["results/paper", "_build/paper/_build/html"]
    assert all(s.get("if") in ("always()", "failure()") for s in uploads)
    # the long job cannot push; a follow-up job with a fresh token commits the results
    assert wf["permissions"] == {"contents": "read"} and "git push" not in runs
    follow = wf["jobs"]["commit-results"]
    assert follow["needs"] == "paper" and follow["permissions"] == {"contents": "write"}
    assert follow["timeout-minutes"] <= 30 and "git push" in _runs(follow)
    assert _step(follow, "actions/download-artifact")["with"]["name"] == uploads[0]["with"]["name"]
    labels = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())["self-hosted-runner"]["labels"]
    assert set(job["runs-on"]) - {"self-hosted", "linux"} <= set(labels)


@pytest.mark.parametrize("target", ["test", "paper"])
def test_the_make_targets_the_workflows_call_exist(target):
    assert re.search(rf"^{target}:", (ROOT / "Makefile").read_text(), re.M)
