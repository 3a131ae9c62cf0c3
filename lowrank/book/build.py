"""Build the book: execute every notebook at ci scale (once, cached), then Jupyter Book.

    python -m lowrank.book.build [--jobs N] [--no-html] [--force]
    python -m lowrank.book.build --scale paper [--only PART/NAME ...] [--no-html] [--force]   (`make paper`)

Each notebook is executed by papermill into `_build/executed/<part>/<name>.ipynb`, keyed by a
hash of its source *and of every module of `lowrank/` it imports, directly or not*: jupyter-cache
alone does not notice a change in imported code, so a change in the package re-executes exactly
the notebooks that use the changed module. The executed
outputs are then handed to jupyter-cache, so that Jupyter Book renders them without executing
anything again; the tests read the same executed notebooks.

`--scale paper` executes every notebook with its paper file (`params/paper/<part>/<name>.yaml`) on the
best device present (CUDA when available) into `_build/paper/executed/`, one at a time, skipping with
a one-line message each notebook whose data set is not in its `data_root` (`lowrank data fetch`);
stores each result with its provenance in `results/paper/<part>/<name>/`; and renders the
paper-scale book from that folder alone into `_build/paper/_build/html/` (its own jupyter-cache and
table of contents: the executed notebooks and the prose pages).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from lowrank.book.notebooks import REPO_ROOT, execute, source_path

BUILD = REPO_ROOT / "_build"
EXECUTED = BUILD / "executed"
FIGURES = BUILD / "figures"
CACHE = BUILD / ".jupyter_cache"
PACKAGE = Path(__file__).resolve().parents[1]  # lowrank/


def _module_file(module: str) -> Path | None:
    """`lowrank.a.b` -> its source file (module or package __init__), None if it is not ours."""
    parts = module.split(".")
    if parts[0] != "lowrank":
        return None
    base = PACKAGE.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(source: str, module: str, is_package: bool) -> set[str]:
    """Absolute names of the modules `source` imports (relative imports resolved against `module`)."""
    import ast

    found = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                root = ".".join(base + ([node.module] if node.module else []))
            else:
                root = node.module or ""
            found.add(root)
            found.update(f"{root}.{a.name}" for a in node.names)  # `from lowrank import spectral`
    return found


def lowrank_sources(code: str) -> list[Path]:
    """The files of `lowrank/` that `code` uses, directly or through other modules (with the
    `__init__.py` of every package on the way), so a change in any of them changes the key."""
    todo = [m for m in _imports(code, "__main__", False) if _module_file(m)]
    seen: dict[str, Path] = {}
    while todo:
        mod = todo.pop()
        path = _module_file(mod)
        if path is None or mod in seen:
            continue
        seen[mod] = path
        parents = [".".join(mod.split(".")[:i]) for i in range(1, len(mod.split(".")))]
        todo += parents
        todo += [m for m in _imports(path.read_text(), mod, path.name == "__init__.py") if _module_file(m)]
    return sorted(set(seen.values()))


def execution_key(name: str) -> str:
    """Hash of the notebook's source, of every `lowrank` file it uses, and of its verdicts' recorded
    outcomes (an unstable one reads "unstable" in the ci book)."""
    import jupytext

    from lowrank.book import goldens

    src = source_path(name)
    code = "\n".join(c.source for c in jupytext.read(src).cells if c.cell_type == "code")
    h = hashlib.sha256(src.read_bytes())
    for p in lowrank_sources(code):
        h.update(p.relative_to(PACKAGE).as_posix().encode())
        h.update(p.read_bytes())
    h.update(json.dumps(goldens.recorded_block(name), sort_keys=True, default=str).encode())
    return h.hexdigest()


def executed_path(name: str) -> Path:
    return EXECUTED / f"{name}.ipynb"


def _key_path(name: str) -> Path:
    return EXECUTED / f"{name}.key"


def is_current(name: str) -> bool:
    kp = _key_path(name)
    return executed_path(name).is_file() and kp.is_file() and kp.read_text() == execution_key(name)


def _execute_one(name: str, key: str, threads: int) -> tuple[str, float]:
    from lowrank.book import goldens, verdicts

    os.environ["OMP_NUM_THREADS"] = str(threads)  # inherited by the kernel
    if goldens.GOLDEN.is_file():  # the ci book reports the recorded instability
        os.environ[verdicts.STABILITY_ENV] = str(goldens.GOLDEN)
    start = time.time()
    _key_path(name).unlink(missing_ok=True)
    shutil.rmtree(FIGURES / name, ignore_errors=True)  # a figure the notebook no longer draws must not linger
    # pages are notebooks/<part>/<name>.html; figures are published in figures/<part>/<name>/
    execute(name, executed_path(name), figure_dir=FIGURES / name, figure_url=f"../../figures/{name}")
    _key_path(name).write_text(key)
    return name, time.time() - start


def execute_all(names, jobs: int, force: bool = False) -> dict:
    """Execute the notebooks whose key changed; return `{name: seconds}` of those executed. One process
    at a time (a lock file): test workers that need the book wait for the first one's execution."""
    import fcntl

    EXECUTED.mkdir(parents=True, exist_ok=True)
    with open(EXECUTED / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _execute_stale(names, jobs, force)


def _execute_stale(names, jobs: int, force: bool) -> dict:
    todo = [n for n in names if force or not is_current(n)]
    done = {}
    if not todo:
        print(f"all {len(names)} notebooks are current (cache hit)")
        return done
    jobs = max(1, min(jobs, len(todo)))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    print(f"executing {len(todo)} of {len(names)} notebooks, {jobs} at a time", flush=True)
    failures = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(_execute_one, n, execution_key(n), threads): n for n in todo}
        for i, fut in enumerate(as_completed(futures), 1):
            name = futures[fut]
            try:
                _, secs = fut.result()
                done[name] = secs
                print(f"  [{i}/{len(todo)}] {name}: {secs:.1f} s", flush=True)
            except Exception as err:  # report every failure, then stop the build
                failures[name] = err
                print(f"  [{i}/{len(todo)}] {name}: FAILED ({type(err).__name__}: {str(err)[-2000:]})", flush=True)
    if failures:
        raise SystemExit(f"{len(failures)} notebook(s) failed: {', '.join(sorted(failures))}")
    return done


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


def write_ledger(names) -> Path:
    from lowrank.book.ledger import write_ledger as write

    return write(REPO_ROOT / "book" / "ledger.md", {n: executed_path(n) for n in names}, toc_files())


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


SETUP_SOURCE = """# On Colab or Binder: install the book's package when it is missing (a clone with `make book` has it).
import importlib.util, subprocess, sys
if importlib.util.find_spec("lowrank") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "lowrank[book] @ git+{url}"], check=True)"""


def publish_notebooks(names, html: Path = BUILD / "html") -> list[Path]:
    """Publish each executed notebook for download and Colab, as `_sources/notebooks/<name>.ipynb`
    (where the page's download button points), with a first cell that installs the package."""
    import nbformat

    url = repository_url()
    written = []
    for name in names:
        nb = nbformat.read(executed_path(name), as_version=4)
        setup = nbformat.v4.new_code_cell(SETUP_SOURCE.format(url=url), metadata={"tags": ["colab-setup"]})
        nb.cells.insert(0, setup)
        nb.metadata.get("lowrank", {})["published_from"] = "executed at ci scale by `make book`"
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2, help="notebooks executed at once (default 2)")
    ap.add_argument("--force", action="store_true", help="execute every notebook even if current")
    ap.add_argument("--no-html", action="store_true", help="execute only; skip Jupyter Book")
    ap.add_argument("--only", nargs="+", metavar="PART/NAME", help="execute just these notebooks (always), nothing else")
    ap.add_argument("--list-executed", action="store_true", help="print the executed notebooks of the book and exit")
    ap.add_argument("--scale", choices=["ci", "paper"], default="ci",
                    help="paper: every notebook with its paper file on the best device, into _build/paper/")
    args = ap.parse_args(argv)
    if args.scale == "paper":
        from lowrank.book import paper_build

        paper_build.main(args.only, force=args.force, html=not args.no_html)
        return
    if args.list_executed:
        print(" ".join(str(executed_path(n).relative_to(REPO_ROOT)) for n in book_notebooks()))
        return
    start = time.time()
    if args.only:
        for name in args.only:
            source_path(name)  # a clear error for a wrong name
        execute_all(args.only, args.jobs, force=True)
        return
    names = book_notebooks()
    if not names:
        raise SystemExit("no notebooks in _toc.yml")
    executed = execute_all(names, args.jobs, args.force)
    fill_jupyter_cache(names)
    write_ledger(names)
    if not args.no_html:
        index = build_html(rebuild_all=bool(executed))
        print(f"\nThe book is at {index} (built in {time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
