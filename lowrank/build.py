"""Build the book: execute every notebook at ci scale (once, cached), then Jupyter Book.

    python -m lowrank.build [--jobs N] [--no-html] [--force]

Each notebook is executed by papermill into `_build/executed/<part>/<name>.ipynb`, keyed by a
hash of its source *and of every module of `lowrank/`*: jupyter-cache alone does not notice a
change in imported code, so a change in the package re-executes every notebook. The executed
outputs are then handed to jupyter-cache, so that Jupyter Book renders them without executing
anything again; the tests read the same executed notebooks.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from .notebooks import NOTEBOOK_ROOT, REPO_ROOT, execute, list_notebooks, source_path

BUILD = REPO_ROOT / "_build"
EXECUTED = BUILD / "executed"
FIGURES = BUILD / "figures"
CACHE = BUILD / ".jupyter_cache"
PACKAGE = Path(__file__).resolve().parent


def package_hash() -> str:
    h = hashlib.sha256()
    for p in sorted(PACKAGE.rglob("*.py")):
        h.update(p.relative_to(PACKAGE).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def execution_key(name: str, pkg_hash: str) -> str:
    return hashlib.sha256(source_path(name).read_bytes() + pkg_hash.encode()).hexdigest()


def executed_path(name: str) -> Path:
    return EXECUTED / f"{name}.ipynb"


def _key_path(name: str) -> Path:
    return EXECUTED / f"{name}.key"


def is_current(name: str, pkg_hash: str) -> bool:
    kp = _key_path(name)
    return executed_path(name).is_file() and kp.is_file() and kp.read_text() == execution_key(name, pkg_hash)


def _execute_one(name: str, key: str, threads: int) -> tuple[str, float]:
    os.environ["OMP_NUM_THREADS"] = str(threads)  # inherited by the kernel
    start = time.time()
    _key_path(name).unlink(missing_ok=True)
    execute(name, executed_path(name), figure_dir=FIGURES / name)
    _key_path(name).write_text(key)
    return name, time.time() - start


def execute_all(names, jobs: int, force: bool = False) -> dict:
    """Execute the notebooks whose key changed; return `{name: seconds}` of those executed."""
    pkg = package_hash()
    todo = [n for n in names if force or not is_current(n, pkg)]
    done = {}
    if not todo:
        print(f"all {len(names)} notebooks are current (cache hit)")
        return done
    jobs = max(1, min(jobs, len(todo)))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    print(f"executing {len(todo)} of {len(names)} notebooks, {jobs} at a time", flush=True)
    failures = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(_execute_one, n, execution_key(n, pkg), threads): n for n in todo}
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


def fill_jupyter_cache(names) -> None:
    """Put the executed outputs into jupyter-cache under the hash Jupyter Book will look up.

    The notebook is read exactly as myst-nb reads it (so the code-cell hash matches), and the
    outputs are copied over cell by cell from the papermill run.
    """
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    from myst_nb.core.read import read_myst_markdown_notebook

    cache = get_cache(str(CACHE))
    cache.clear_cache()
    for name in names:
        src = source_path(name)
        nb = read_myst_markdown_notebook(src.read_text("utf8"), add_source_map=True, path=str(src))
        executed = nbformat.read(executed_path(name), as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        done = [c for c in executed.cells if c.cell_type == "code"]
        if len(code) != len(done):
            raise RuntimeError(f"{name}: {len(code)} code cells in the source, {len(done)} executed")
        for i, (c, e) in enumerate(zip(code, done), 1):
            c.outputs = e.outputs
            c.execution_count = i
        cache.cache_notebook_bundle(CacheBundleIn(nb, str(src), data={"execution_seconds":
                                    executed.metadata.get("lowrank", {}).get("wall_s")}),
                                    check_validity=False, overwrite=True)


def build_html() -> Path:
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb), "build", str(REPO_ROOT), "--path-output", str(REPO_ROOT), "-W", "-n", "--keep-going"]
    print("building HTML:", " ".join(cmd[1:]), flush=True)
    result = subprocess.run(cmd, cwd=REPO_ROOT)
    if result.returncode != 0:
        raise SystemExit(f"jupyter-book failed (exit {result.returncode}); see the warnings above")
    return BUILD / "html" / "index.html"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2, help="notebooks executed at once (default 2)")
    ap.add_argument("--force", action="store_true", help="execute every notebook even if current")
    ap.add_argument("--no-html", action="store_true", help="execute only; skip Jupyter Book")
    ap.add_argument("--only", nargs="+", metavar="PART/NAME", help="execute just these notebooks (always), nothing else")
    args = ap.parse_args(argv)
    start = time.time()
    if args.only:
        for name in args.only:
            source_path(name)  # a clear error for a wrong name
        execute_all(args.only, args.jobs, force=True)
        return
    names = list_notebooks()
    if not names:
        raise SystemExit(f"no notebooks under {NOTEBOOK_ROOT}")
    execute_all(names, args.jobs, args.force)
    fill_jupyter_cache(names)
    if not args.no_html:
        index = build_html()
        print(f"\nThe book is at {index} (built in {time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
