"""Binder builds binder/ (not the root environment.yml): the locked stack with torch's CPU build,
jupytext, and JupyterLab told to open .md files (the book's MyST notebooks) with jupytext's notebook
view, so that the launch button's `lab/tree/notebooks/<part>/<name>.md` opens a runnable notebook."""

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"


def _jupytext_labextension() -> str:
    folder = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "jupyterlab-jupytext" / "static"
    text = "".join(p.read_text(errors="replace") for p in folder.glob("*.js")) if folder.is_dir() else ""
    if "FACTORY=" not in text:
        pytest.skip("jupytext's JupyterLab extension is not installed here (it comes with jupytext)")
    return text


def test_binder_installs_the_locked_stack_with_cpu_torch_and_jupytext():
    lines = [ln.strip() for ln in (BINDER / "requirements.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    assert "-c ../requirements/lock.txt" in lines and "-e .[book]" in lines and "jupytext" in lines
    assert (BINDER / "runtime.txt").read_text().strip() == "python-3.11"
    assert not (BINDER / "environment.yml").exists(), "repo2docker would take it instead of requirements.txt"


def test_jupyterlab_opens_markdown_and_myst_with_jupytexts_notebook_view():
    """The override names the factory and file types that jupytext's lab extension registers."""
    ext = _jupytext_labextension()
    factory = re.search(r'FACTORY="([^"]+)"', ext).group(1)
    file_types = re.search(r"FILE_TYPES=\[([^\]]*)\]", ext).group(1)
    overrides = json.loads((BINDER / "labconfig" / "default_setting_overrides.json").read_text())
    viewers = overrides["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]
    assert viewers == {"markdown": factory, "myst": factory}
    assert all(f'"{t}"' in file_types for t in viewers)
    post = (BINDER / "postBuild").read_text()
    assert 'cp binder/labconfig/default_setting_overrides.json "${HOME}/.jupyter/labconfig/"' in post
    assert (BINDER / "postBuild").stat().st_mode & 0o111, "postBuild must be executable"


def test_the_launch_buttons_open_jupyterlab_on_the_page_source():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["launch_buttons"]["notebook_interface"] == "jupyterlab"
    assert config["launch_buttons"]["binderhub_url"].startswith("https://mybinder.org")
    # the pages are MyST sources whose header tells jupytext the format (and the kernel)
    page = next((ROOT / "notebooks").glob("*/*.md")).read_text()
    header = yaml.safe_load(page.split("---")[1])
    assert header["jupytext"]["text_representation"]["format_name"] == "myst"
    assert header["kernelspec"]["name"] == "python3"
