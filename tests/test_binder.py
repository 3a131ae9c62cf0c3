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


def _jupytext_config():
    from jupytext.config import load_jupytext_configuration_file

    return load_jupytext_configuration_file(str(ROOT / "jupytext.toml"))


def test_jupytext_toml_keeps_a_save_identical_to_the_myst_source():
    """What JupyterLab writes back (jupytext's writer with the clone's jupytext.toml) is each source as
    it is; without the configuration a save would stamp jupytext's version into every header."""
    import jupytext

    config, stamped = _jupytext_config(), 0
    for path in sorted((ROOT / "notebooks").glob("*/*.md")):
        text = path.read_text(encoding="utf-8")
        assert jupytext.writes(jupytext.reads(text, fmt="md:myst"), fmt="md:myst", config=config) == text, path
        stamped += "jupytext_version:" in jupytext.writes(jupytext.reads(text, fmt="md:myst"), fmt="md:myst")
    assert stamped == len(list((ROOT / "notebooks").glob("*/*.md")))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # starts a JupyterLab server (a few seconds)
def test_make_lab_serves_the_myst_sources_as_notebooks_and_saves_them_unchanged(tmp_path):
    """`make lab`'s JupyterLab, on a copy of the clone's jupytext.toml and one notebook: the settings API
    gives jupytext's notebook view as the default viewer of .md files (the override the Makefile puts in
    the venv's Jupyter configuration), jupytext's extension is loaded, the contents API opens the
    MyST source as a notebook, and saving that notebook leaves the file as it was."""
    pytest.importorskip("jupyterlab", reason="the lab extra (make env installs it)")
    import subprocess
    import time
    import urllib.request

    from jupyter_core.paths import jupyter_config_path

    make = (ROOT / "Makefile").read_text()
    assert re.search(r"^LAB_CONFIG := \$\(VENV\)/etc/jupyter/labconfig$", make, re.M)
    assert "\tcp binder/labconfig/default_setting_overrides.json $(LAB_CONFIG)/\n" in make
    assert str(Path(sys.prefix) / "etc" / "jupyter") in jupyter_config_path()  # where $(LAB_CONFIG) lies
    root, config = tmp_path / "clone", tmp_path / "config"
    (root / "notebooks" / "gradients").mkdir(parents=True)
    (root / "jupytext.toml").write_text((ROOT / "jupytext.toml").read_text())
    source = (ROOT / "notebooks" / "gradients" / "scaling.md").read_text(encoding="utf-8")
    (root / "notebooks" / "gradients" / "scaling.md").write_text(source, encoding="utf-8")
    (config / "labconfig").mkdir(parents=True)  # the first of jupyter_config_path, as $(LAB_CONFIG) is one of them
    (config / "labconfig" / "default_setting_overrides.json").write_text(
        (BINDER / "labconfig" / "default_setting_overrides.json").read_text())
    port, token = _free_port(), "lab-test-token"
    env = {**__import__("os").environ, "HOME": str(tmp_path / "home"), "JUPYTER_CONFIG_DIR": str(config),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    server = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", f"--ServerApp.port={port}",
                               "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1", "--allow-root",
                               f"--IdentityProvider.token={token}",
                               f"--ServerApp.root_dir={root}"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"

    def call(path, data=None, method="GET"):
        req = urllib.request.Request(f"{base}{path}", data=data, method=method,
                                     headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.read().decode()

    try:
        for _ in range(120):  # up to 60 s for the server to answer
            try:
                call("/api")
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail(f"JupyterLab did not start: {server.stderr.read()[-2000:]}")
                time.sleep(0.5)
        settings = json.loads(call("/lab/api/settings/@jupyterlab/docmanager-extension:plugin"))
        viewers = settings["schema"]["properties"]["defaultViewers"]["default"]
        assert viewers == {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}
        assert '"jupyterlab-jupytext"' in call("/lab")  # the page config names jupytext's lab extension
        model = json.loads(call("/api/contents/notebooks/gradients/scaling.md?type=notebook&content=1"))
        assert model["type"] == "notebook"
        code = [c for c in model["content"]["cells"] if c["cell_type"] == "code"]
        assert any("parameters" in c["metadata"].get("tags", []) for c in code)
        call("/api/contents/notebooks/gradients/scaling.md", method="PUT",
             data=json.dumps({"type": "notebook", "format": "json", "content": model["content"]}).encode())
        assert (root / "notebooks" / "gradients" / "scaling.md").read_text(encoding="utf-8") == source
    finally:
        server.terminate()
        server.wait(timeout=30)
