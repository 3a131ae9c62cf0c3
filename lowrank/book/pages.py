"""The book's pages: the table of contents, executed notebooks handed to jupyter-cache, the HTML.

Shared by the ci build and the laptop- and paper-scale builds (`lowrank.book.build`):
where executed notebooks and figures live (`_build/`), which notebooks the book contains
(`book_notebooks`, in `_toc.yml`'s order), `fill_jupyter_cache` (the executed outputs under the hash
Jupyter Book looks up, so it renders without executing), `build_html` (Jupyter Book with warnings as
errors) and the published notebooks and figures beside the HTML.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

from lowrank.book.notebooks import REPO_ROOT, SOURCE_ROOT, source_path

__all__ = ["BUILD", "EXECUTED", "FIGURES", "CACHE", "executed_path", "toc_files", "book_notebooks",
           "fill_jupyter_cache", "build_html", "repository_url", "publish_notebooks", "publish_figures"]

BUILD = REPO_ROOT / "_build"
EXECUTED = BUILD / "executed"
FIGURES = BUILD / "figures"
CACHE = BUILD / ".jupyter_cache"
# each ci page's execution seconds in the last fresh-clone `.ci/run` (bench/run.py --only ci writes it)
PAGE_SECONDS = SOURCE_ROOT / "bench" / "ci_page_seconds.csv"


def executed_path(name: str) -> Path:
    return EXECUTED / f"{name}.ipynb"


def executed_seconds(name: str) -> float | None:
    """The seconds this checkout's last execution of `name` took (None if it has none)."""
    path = executed_path(name)
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))["metadata"].get("lowrank", {}).get("wall_s")


def recorded_page_seconds(recorded: Path = PAGE_SECONDS) -> dict:
    """`{page: seconds}` of each ci page's execution in the last measured `.ci/run` (empty if none)."""
    if not recorded.is_file():
        return {}
    with recorded.open(newline="", encoding="utf-8") as f:
        return {row["page"]: float(row["seconds"]) for row in csv.DictReader(f)}


def longest_first(names, recorded: Path = PAGE_SECONDS) -> list[str]:
    """`names` ordered by expected execution time, longest first (so that two workers finish together
    rather than one waiting on a long page started last): this checkout's last execution, else the
    seconds recorded by the last `.ci/run`, else first of all (unknown cost)."""
    known = recorded_page_seconds(recorded)
    expected = {n: executed_seconds(n) for n in names}
    return sorted(names, key=lambda n: -(expected[n] if expected[n] is not None else known.get(n, float("inf"))))


def fill_jupyter_cache(names, cache_dir: Path = CACHE, executed_at=None) -> None:
    """Put the executed outputs into jupyter-cache under the hash Jupyter Book will look up.

    The notebook is read exactly as myst-nb reads it (so the code-cell hash matches), and the
    outputs are copied over cell by cell from the papermill run (`executed_at(name)`, default
    `executed_path`). A cell papermill injected with the run's parameters (the paper scale) has no
    counterpart in the source: its text is shown as the output of the parameters cell instead.
    """
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    from myst_nb.core.read import read_myst_markdown_notebook

    cache = get_cache(str(cache_dir))
    cache.clear_cache()
    for name in names:
        src = source_path(name)
        nb = read_myst_markdown_notebook(src.read_text("utf8"), add_source_map=True, path=str(src))
        executed = nbformat.read((executed_at or executed_path)(name), as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        done, injected = [], None
        for c in executed.cells:
            if c.cell_type == "code" and "injected-parameters" in c.metadata.get("tags", []):
                injected = c.source
            elif c.cell_type == "code":
                done.append(c)
        if len(code) != len(done):
            raise RuntimeError(f"{name}: {len(code)} code cells in the source, {len(done)} executed")
        for i, (c, e) in enumerate(zip(code, done), 1):
            c.outputs = e.outputs
            if injected is not None and "parameters" in c.metadata.get("tags", []):
                c.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"{injected}\n")] + list(e.outputs)
            c.execution_count = i
        cache.cache_notebook_bundle(CacheBundleIn(nb, str(src), data={"execution_seconds":
                                    executed.metadata.get("lowrank", {}).get("wall_s")}),
                                    check_validity=False, overwrite=True)


def toc_files() -> set[str]:
    import yaml

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                yield node["file"]
            for v in node.values():
                yield from walk(v)
        elif isinstance(node, list):
            for v in node:
                yield from walk(v)

    toc = yaml.safe_load((REPO_ROOT / "_toc.yml").read_text())
    return {toc["root"], *walk(toc)}


def book_notebooks() -> list[str]:
    """The notebooks the book contains: those in `_toc.yml`, in toc order."""
    prefix = "notebooks/"
    return [f[len(prefix):] for f in sorted(toc_files()) if f.startswith(prefix)]


def build_html(rebuild_all: bool = False, *, output: Path = REPO_ROOT, extra: tuple = (), strict: bool = True,
               figures: Path = FIGURES) -> Path:
    """Jupyter Book with warnings as errors (`strict`). Sphinx re-reads only pages whose *source* changed,
    so when a notebook was re-executed (new outputs, same source) every page is rebuilt (`--all`).
    The HTML goes to `output/_build/html`; `extra` adds options (the paper build's --config, --toc)."""
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb), "build", str(REPO_ROOT), "--path-output", str(output), *extra, "-n", "--keep-going"]
    if strict:
        cmd.append("-W")
    if rebuild_all:
        cmd.append("--all")
    print("building HTML:", " ".join(cmd[1:]), flush=True)
    result = subprocess.run(cmd, cwd=REPO_ROOT)
    if result.returncode != 0:
        raise SystemExit(f"jupyter-book failed (exit {result.returncode}); see the warnings above")
    html = Path(output) / "_build" / "html"
    publish_figures(figures, html / "figures")
    if figures == FIGURES:  # the ci book: its executed notebooks, for download and Colab
        publish_notebooks(book_notebooks(), html)
    return html / "index.html"


def repository_url() -> str:
    """`repository.url` of _config.yml: the one place the book names its repository."""
    import yaml

    return yaml.safe_load((REPO_ROOT / "_config.yml").read_text()).get("repository", {}).get("url", "").rstrip("/")


# Colab opens the published notebooks from this branch of the repository, which book.yml's `notebooks`
# job fills from `_build/html/_sources/notebooks/` (publish_notebooks) on every push to the default branch.
COLAB_BRANCH = "notebooks"


def colab_path(name: str) -> str:
    """The path of notebook `name`'s published .ipynb on COLAB_BRANCH (`_sources/` of the HTML dropped)."""
    return f"notebooks/{name}.ipynb"


def colab_url(repo_url: str, name: str) -> str:
    """The Colab address that opens notebook `name` as published on COLAB_BRANCH of `repo_url`."""
    owner_repo = repo_url.rstrip("/").split("github.com/", 1)[-1]
    return f"https://colab.research.google.com/github/{owner_repo}/blob/{COLAB_BRANCH}/{colab_path(name)}"


# The notebook extra only: what the notebooks import beyond the science. Its ranges keep Colab's own torch,
# numpy, pandas and matplotlib (no runtime restart); the `book` extra would bring Jupyter Book and pins.
# `{ref}` pins the package to the commit the book was built from (the code that executed the page).
SETUP_SOURCE = """# On Colab or Binder: install the book's package when it is missing (a clone with `make book` has it),
# at the commit that executed this notebook.
import importlib.util, subprocess, sys
if importlib.util.find_spec("lowrank") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "lowrank[notebook] @ git+{url}{ref}"], check=True)"""


def publish_notebooks(names, html: Path = BUILD / "html") -> list[Path]:
    """Publish each executed notebook for download and Colab, as `_sources/notebooks/<name>.ipynb`
    (where the page's download button points), with a first cell that installs the package."""
    import nbformat

    from lowrank.core.io import git_state

    url = repository_url()
    state = git_state(REPO_ROOT)
    if state["commit"] is None:
        print("publishing notebooks outside a git checkout: their setup cell installs the default branch", flush=True)
    elif state["dirty"]:
        print(f"publishing notebooks from uncommitted changes: their setup cell installs {state['commit'][:10]}, "
              "without them", flush=True)
    ref = f"@{state['commit']}" if state["commit"] else ""
    written = []
    for name in names:
        nb = nbformat.read(executed_path(name), as_version=4)
        setup = nbformat.v4.new_code_cell(SETUP_SOURCE.format(url=url, ref=ref), metadata={"tags": ["colab-setup"]})
        nb.cells.insert(0, setup)
        nb.metadata.get("lowrank", {})["published_from"] = \
            f"executed at ci scale by `make book` at commit {state['commit'] or 'unknown'}"
        out = html / "_sources" / "notebooks" / f"{name}.ipynb"
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out)
        written.append(out)
    return written


def publish_figures(source: Path = FIGURES, target: Path = BUILD / "html" / "figures") -> None:
    """Copy every figure's files (PNG, SVG, CSV) next to the HTML, where the pages link to them."""
    shutil.rmtree(target, ignore_errors=True)
    if source.is_dir():
        shutil.copytree(source, target)
