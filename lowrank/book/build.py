"""Build the book: execute every notebook at ci scale (once, cached), then Jupyter Book.

    python -m lowrank.book.build [--jobs N] [--no-html] [--force]
    python -m lowrank.book.build --scale laptop [--only PART/NAME ...] [--force]   (`make laptop`)
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

`--scale laptop` executes, one at a time, every notebook with a laptop file (`params/laptop/`) whose
stored result in `results/laptop/` is missing or stale (parameters or code changed), stores each
with its provenance, and renders nothing: the ci book shows the laptop column
(`lowrank.book.paper_build.execute_laptop`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from lowrank.book import pages
from lowrank.book.keys import execution_key
from lowrank.book.notebooks import REPO_ROOT, SCALES, execute, source_path
from lowrank.book.pages import book_notebooks, build_html, executed_path, fill_jupyter_cache, toc_files

def _key_path(name: str) -> Path:
    return pages.EXECUTED / f"{name}.key"


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
    shutil.rmtree(pages.FIGURES / name, ignore_errors=True)  # a figure the notebook no longer draws must not linger
    # pages are notebooks/<part>/<name>.html; figures are published in figures/<part>/<name>/
    execute(name, executed_path(name), figure_dir=pages.FIGURES / name, figure_url=f"../../figures/{name}")
    _key_path(name).write_text(key)
    return name, time.time() - start


def execute_all(names, jobs: int, force: bool = False) -> dict:
    """Execute the notebooks whose key changed; return `{name: seconds}` of those executed. One process
    at a time (a lock file): test workers that need the book wait for the first one's execution."""
    import fcntl

    pages.EXECUTED.mkdir(parents=True, exist_ok=True)
    with open(pages.EXECUTED / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _execute_stale(names, jobs, force)


def _execute_stale(names, jobs: int, force: bool) -> dict:
    todo = pages.longest_first([n for n in names if force or not is_current(n)])
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


def write_ledger(names) -> Path:
    from lowrank.book.ledger import write_ledger as write

    return write(REPO_ROOT / "book" / "ledger.md", {n: executed_path(n) for n in names}, toc_files())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2, help="notebooks executed at once (default 2)")
    ap.add_argument("--force", action="store_true", help="execute every notebook even if current")
    ap.add_argument("--no-html", action="store_true", help="execute only; skip Jupyter Book")
    ap.add_argument("--only", nargs="+", metavar="PART/NAME", help="execute just these notebooks (always), nothing else")
    ap.add_argument("--list-executed", action="store_true", help="print the executed notebooks of the book, longest first, and exit")
    ap.add_argument("--keys", action="store_true", help="print each notebook's execution key and exit (book.yml "
                    "keys its cache of executed notebooks by them)")
    ap.add_argument("--scale", choices=list(SCALES), default="ci",
                    help="laptop: the stale laptop results, stored in results/laptop/; paper: every notebook with its "
                         "paper file on the best device, into _build/paper/")
    args = ap.parse_args(argv)
    if args.scale == "laptop":
        from lowrank.book import paper_build

        paper_build.laptop_main(args.only, force=args.force)
        return
    if args.scale == "paper":
        from lowrank.book import paper_build

        paper_build.main(args.only, force=args.force, html=not args.no_html)
        return
    if args.list_executed:
        # longest first: nbval's two workers take the files in this order
        print(" ".join(str(executed_path(n).relative_to(REPO_ROOT)) for n in pages.longest_first(book_notebooks())))
        return
    if args.keys:
        print("\n".join(f"{n} {execution_key(n)}" for n in book_notebooks()))
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
