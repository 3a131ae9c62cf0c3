"""The science install (`pip install lowrank`, no extra) gives a working `lowrank` command: --help,
--version, `data fetch` (offline: one line naming the files and the user data folder) and `list`
(from a clone), with none of the book's stack installed. A fresh venv without the system's
site-packages, installed with pip's own configuration (index, find-links, cache) and the lock."""

import os
import shutil
import socket
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from lowrank.book import notebooks

ROOT = Path(__file__).resolve().parents[1]
BOOK_STACK = ("jupyter-book", "jupytext", "papermill", "matplotlib", "seaborn", "myst-nb", "ipykernel", "mnist1d",
              "ray", "pytest")
# pip's words when a package cannot be had (no network, no local copy): the test is skipped, not failed
UNREACHABLE = ("No matching distribution found", "Could not find a version", "Failed to establish a new connection",
               "Temporary failure in name resolution", "Network is unreachable", "ProxyError")


def test_the_light_reader_finds_the_code_cells_jupytext_finds():
    """Without jupytext (the science install) `read_notebook` reads the code cells itself: the same
    cells, sources (up to trailing blank lines) and metadata as jupytext, for every notebook."""
    import jupytext

    for name in notebooks.list_notebooks():
        path = notebooks.source_path(name)
        mine = notebooks.myst_code_cells(path.read_text(encoding="utf-8")).cells
        theirs = [c for c in jupytext.read(path).cells if c.cell_type == "code"]
        assert [(c.source.rstrip(), c.metadata) for c in mine] == \
            [(c.source.rstrip(), dict(c.metadata)) for c in theirs], name


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd, env, timeout=120):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.slow
def test_science_install_in_a_fresh_venv_runs_the_lowrank_command(tmp_path):
    try:
        venv.create(tmp_path / "venv", with_pip=True, system_site_packages=False)
    except (subprocess.CalledProcessError, OSError) as err:
        pytest.skip(f"no venv with pip could be made here ({err})")
    bin_ = tmp_path / "venv" / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON", "LOWRANK_"))}
    env.pop("XDG_DATA_HOME", None)  # the user data folder is then ~/.local/share/lowrank below HOME
    env.update(HOME=str(tmp_path / "home"), PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_CACHE_DIR=os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")))
    # a copy of the package's sources: building in place would leave build/ in the clone
    src = tmp_path / "src"
    shutil.copytree(ROOT / "lowrank", src / "lowrank", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    # --no-compile: no bytecode written for torch's thousands of modules (the checks below don't need it)
    out = _run([bin_ / "pip", "install", "--quiet", "--no-compile", "-c", ROOT / "requirements" / "lock.txt", src], env,
               timeout=1200)
    if out.returncode != 0:
        text = out.stdout + out.stderr
        if any(word in text for word in UNREACHABLE) and "ResolutionImpossible" not in text:
            pytest.skip(f"the science install cannot be fetched here (offline, no local wheels): {text.strip()[-300:]}")
        pytest.fail(f"pip install failed:\n{text[-3000:]}")
    installed = _run([bin_ / "pip", "list", "--format=freeze"], env).stdout.lower()
    assert not [p for p in BOOK_STACK if f"\n{p}==" in "\n" + installed.replace("_", "-")], installed

    lowrank = bin_ / "lowrank"
    out = _run([lowrank, "--help"], env)
    assert out.returncode == 0 and "data" in out.stdout and "list" in out.stdout, out.stderr
    out = _run([lowrank, "--version"], env)
    assert out.stdout.strip() == "lowrank 0.1.0"
    out = _run([lowrank, "data", "fetch", "--help"], env)
    assert out.returncode == 0 and "LOWRANK_DATA" in out.stdout

    # offline (a loopback port nobody listens on stands in for every mirror): one line that names the
    # files and the user data folder (an installed copy never writes into site-packages)
    env_offline = {**env, "LOWRANK_DATA_MIRRORS": f"http://127.0.0.1:{_closed_port()}/"}
    out = _run([lowrank, "data", "fetch", "mnist"], env_offline)
    err = out.stderr.strip()
    assert out.returncode == 2 and len(err.splitlines()) == 1 and err.startswith("lowrank: error: offline?"), err
    data = tmp_path / "home" / ".local" / "share" / "lowrank" / "MNIST" / "raw"
    assert "train-images-idx3-ubyte.gz" in err and str(data) in err
    out = _run([lowrank, "data", "fetch", "mnist"], {**env_offline, "LOWRANK_DATA": str(tmp_path / "d")})
    assert out.returncode == 2 and str(tmp_path / "d" / "MNIST" / "raw") in out.stderr

    # an installed copy holds no notebooks: `list` says where they are
    out = _run([lowrank, "list"], env)
    assert out.returncode == 2 and "clone" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    # the clone's package (editable, no dependency added): `list` reads the notebooks without jupytext
    out = _run([bin_ / "pip", "install", "--quiet", "--no-deps", "-e", ROOT], env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    out = _run([lowrank, "list", "gradients/decomposition"], env)
    assert out.returncode == 0 and out.stdout.startswith("gradients/decomposition") and "paper:" in out.stdout, out.stderr
    out = _run([lowrank, "list"], env)
    assert out.returncode == 0 and all(n in out.stdout for n in notebooks.list_notebooks())
