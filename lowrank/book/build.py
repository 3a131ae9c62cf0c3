"""Build the book: every notebook at ci scale (once, cached), then Jupyter Book; and the laptop and paper scales.

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

`--scale laptop` (`execute_laptop`) executes, one at a time, every notebook with a laptop file
(`params/laptop/`) whose stored result in `results/laptop/` is missing or stale (its parameters or code
changed: `lowrank.book.paper_results.stored_result`) into `_build/laptop/executed/`, stores each with its
provenance, and renders nothing: a fresh clone runs nothing, and the ci book's ledger and pages show the
laptop column from `results/laptop/`.

The paper-scale executions are keyed like the ci build's, plus the hash of their paper parameters, so an
unchanged notebook is not executed again; one without a paper file is skipped too. The paper-scale HTML
is rendered from `_build/paper/executed/` alone, with its own jupyter-cache, configuration and table of
contents.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import yaml

from lowrank.book import notebooks, pages, paper_results, rules, runs
from lowrank.book.keys import NotebookCode, execution_key, notebook_code
from lowrank.book.notebooks import REPO_ROOT, SCALES, execute, source_path
from lowrank.book.pages import book_notebooks, build_html, executed_path, fill_jupyter_cache, toc_files
from lowrank.book.paper_results import required_data

__all__ = ["is_current", "execute_all", "write_ledger", "PAPER", "LAPTOP", "missing_data", "execute_paper",
           "execute_laptop", "paper_toc", "render", "paper_main", "laptop_main", "main"]

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
        return _execute_ci_stale(names, jobs, force)


def _execute_ci_stale(names, jobs: int, force: bool) -> dict:
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


def write_ledger(names, out: Path | None = None, toc: set[str] | None = None) -> Path:
    """The ledger page (`out`, default book/ledger.md) from the ci-executed notebooks `names` and the stored
    results, with the cost of the claims beyond the laptop budget (`lowrank.book.sweeps.larger_scale_costs`)."""
    from lowrank.book import sweeps
    from lowrank.book.ledger import write_ledger as write

    return write(out or REPO_ROOT / "book" / "ledger.md", {n: executed_path(n) for n in names},
                 toc_files() if toc is None else toc, larger_scale=sweeps.larger_scale_costs(names))


PAPER = pages.BUILD / "paper"
PAPER_EXECUTED = PAPER / "executed"
PAPER_FIGURES = PAPER / "figures"
LAPTOP = pages.BUILD / "laptop"
LAPTOP_CELL_TIMEOUT = 3600  # a laptop page is sized for at most 600 s (lowrank.book.laptop); a cell past an hour is a fault
PAPER_CACHE = PAPER / ".jupyter_cache"
PAPER_CELL_TIMEOUT = 48 * 3600  # seconds per cell: a paper-scale training cell may run for hours
HEARTBEAT_S = 60.0  # how often a running notebook reports its elapsed time and cell


def scale_executed_path(name: str, scale: str = "paper") -> Path:
    """Where a laptop- or paper-scale build writes its executed notebook `name`."""
    return (PAPER_EXECUTED if scale == "paper" else LAPTOP / "executed") / f"{name}.ipynb"


def missing_data(name: str, params: dict) -> str | None:
    """None when every real data set `params` reads is in its `data_root`, else a one-line reason."""
    from lowrank.core import datasets

    for ds in required_data(params):
        root = datasets.resolve_root(params.get("data_root") or None)
        if not datasets.present(ds, root):
            return (f"{ds} is not in {root} (data_root: {params.get('data_root')!r}): run "
                    f"`lowrank data fetch {ds} --root {root}`, or fetch into the default data folder "
                    f"({datasets.default_data_root()}, `data_root: {datasets.DEFAULT_DATA_ROOT}`; $LOWRANK_DATA moves it)")
    return None


def _paper_key(name: str, params: dict) -> str:
    key = execution_key(name)  # a notebook's code key (`lowrank.book.keys.code_key`)
    return key + runs.run_hash(name, params, key)


def _progress(name: str, scale: str = "paper") -> str:
    """`cell k of n` from papermill's partial output notebook (it is rewritten after every cell)."""
    import nbformat

    out = scale_executed_path(name, scale)
    for partial in out.parent.glob(f".{out.stem}.*/output.ipynb"):
        try:
            nb = nbformat.read(partial, as_version=4)
        except Exception:  # being rewritten this instant
            return ""
        code = [c for c in nb.cells if c.cell_type == "code"]
        status = [c.metadata.get("papermill", {}).get("status") for c in code]
        running = status.index("running") + 1 if "running" in status else status.count("completed")
        return f", code cell {running} of {len(code)}"
    return ""


def _heartbeat(name: str, t0: float, stop: threading.Event, scale: str = "paper") -> None:
    while not stop.wait(HEARTBEAT_S):
        print(f"      {name}: {time.time() - t0:.0f} s elapsed{_progress(name, scale)}", flush=True)


def _execute_and_store(name: str, params: dict, scale: str) -> float:
    """Execute `name` at `scale` (`lowrank.book.runs.execute`, the run folders' own execution), store its
    result with its figures' data; return the wall time in seconds."""
    notebook = notebook_code(name)  # its code key read before the run, as `lowrank run` reads it
    out = scale_executed_path(name, scale)
    for leftover in out.parent.glob(f".{out.stem}.*"):  # a killed earlier run's
        shutil.rmtree(leftover, ignore_errors=True)
    figures = (PAPER_FIGURES if scale == "paper" else LAPTOP / "figures") / name
    shutil.rmtree(figures, ignore_errors=True)  # a figure the notebook no longer draws must not be stored
    t0 = time.time()
    stop = threading.Event()
    threading.Thread(target=_heartbeat, args=(name, t0, stop, scale), daemon=True).start()
    try:
        found, provenance = runs.execute(notebook, params, out, figures, figure_url=f"../../figures/{name}",
                                         timeout=PAPER_CELL_TIMEOUT if scale == "paper" else LAPTOP_CELL_TIMEOUT)
    finally:
        stop.set()
    if scale == "laptop":
        found, provenance = _rerun_near_threshold(notebook, params, found, provenance)
    paper_results.store(name, params, found, {**provenance, "run_folder": None}, scale=scale, figure_dir=figures)
    return provenance["wall_s"]


def _rerun_near_threshold(notebook: NotebookCode, params: dict, found: dict, provenance: dict) -> tuple[dict, dict]:
    """A laptop result of `notebook` whose claims lie within 10 % of their thresholds (`verdicts.near_threshold`) is
    run again at seed offset 1 (`goldens.seed_overrides`); each such claim whose outcome moves reads
    "unstable" (`verdicts.rerun_stability`). The rerun's time is added to the recorded wall time."""
    import tempfile

    from lowrank.book import goldens
    from lowrank.book.verdicts import near_threshold, rerun_stability

    near = sorted(k for k, v in found.items() if near_threshold(v))
    if not near:
        return found, {**provenance, "near_threshold_rerun": None}
    shifted = goldens.seed_overrides(notebook.name, 1, params)
    print(f"    {len(near)} claim(s) within 10 % of the threshold ({', '.join(near)}): again at seed offset 1 "
          f"({shifted})", flush=True)
    with tempfile.TemporaryDirectory(prefix="lowrank-rerun-") as tmp:
        again, second = runs.execute(notebook, {**params, **shifted}, Path(tmp) / "out.ipynb", Path(tmp) / "figures",
                                     timeout=LAPTOP_CELL_TIMEOUT)
    found = {**found, **{k: rerun_stability(found[k], again[k], f"seed offset 1 {shifted}") for k in near if k in again}}
    return found, {**provenance, "wall_s": provenance["wall_s"] + second["wall_s"],
                   "near_threshold_rerun": {"claims": near, "parameters": shifted, "wall_s": second["wall_s"]}}


def _execute_paper_one(name: str, params: dict) -> float:
    """Execute `name` at paper scale and store its result; return the wall time in seconds."""
    key_path = PAPER_EXECUTED / f"{name}.key"
    key_path.unlink(missing_ok=True)
    wall = _execute_and_store(name, params, "paper")
    key_path.write_text(_paper_key(name, params))
    return wall


def _execute_stale(names, scale: str, force: bool, skip, current) -> tuple[list[str], dict[str, str]]:
    """Execute at `scale`, one at a time, each of `names` that `skip(name, params)` (a reason, or None)
    does not skip and `current(name, params)` (`(is_current, why)`) does not find current, unless
    `force`; store each result. A failing notebook stops nothing: it is reported, and the build exits
    non-zero at the end. Returns (the notebooks with a current result, `{skipped name: reason}`)."""
    from lowrank.core.device import describe_device

    print(f"{scale} scale on {describe_device()}", flush=True)
    ready, skipped, failed = [], {}, {}
    for i, name in enumerate(names, 1):
        tag = f"  [{i}/{len(names)}] {name}"
        try:
            params = rules.resolve_parameters(name, scale=scale)
        except rules.ParameterError as err:
            skipped[name] = str(err)
            print(f"{tag}: skipped: {err}", flush=True)
            continue
        reason = skip(name, params)
        if reason:
            skipped[name] = reason
            print(f"{tag}: skipped: {reason}", flush=True)
            continue
        is_current, why = current(name, params)
        if is_current and not force:
            ready.append(name)
            print(f"{tag}: {why}", flush=True)
            continue
        print(f"{tag}: executing at {scale} scale ({'forced' if is_current else why}; started "
              f"{time.strftime('%H:%M:%S')})", flush=True)
        try:
            wall = _execute_paper_one(name, params) if scale == "paper" else _execute_and_store(name, params, scale)
        except Exception as err:  # report, go on with the next notebook
            failed[name] = err
            print(f"{tag}: FAILED ({type(err).__name__}: {str(err)[-2000:]})", flush=True)
            continue
        ready.append(name)
        print(f"{tag}: {wall:.1f} s, result stored in results/{scale}/{name}/", flush=True)
    if failed:
        raise SystemExit(f"{len(failed)} notebook(s) failed at {scale} scale: {', '.join(sorted(failed))}")
    return ready, skipped


def execute_paper(names, force: bool = False) -> tuple[list[str], dict[str, str]]:
    """Execute `names` at paper scale (those not current, or all with `force`), one at a time.

    Returns (the notebooks with a current executed paper-scale notebook, `{skipped name: reason}`):
    skipped are those whose data set is absent or whose paper file is missing or rejected.
    """
    def current(name, params):
        key_path = PAPER_EXECUTED / f"{name}.key"
        hit = scale_executed_path(name).is_file() and key_path.is_file() and key_path.read_text() == _paper_key(name, params)
        return hit, "current (cache hit)" if hit else "not executed with this code and these parameters"

    return _execute_stale(names, "paper", force, missing_data, current)


def execute_laptop(names, force: bool = False) -> tuple[list[str], dict[str, str]]:
    """Execute at laptop scale each of `names` with a laptop file whose stored result (results/laptop/)
    is missing or stale, or all with `force`, one at a time, storing each result.

    Returns (the notebooks with a current stored laptop result, `{skipped name: reason}`: "no laptop
    file", or why its laptop file is rejected).
    """
    names = list(names)
    without = {n: "no laptop file" for n in names if not notebooks.scale_params_path(n, "laptop").is_file()}

    def current(name, params):
        stored = paper_results.stored_result(name, scale="laptop")
        if stored is None:
            return False, "no stored result"
        if stored["stale"]:
            return False, f"stale: {stored['stale_reason']}"
        return True, f"current (stored {stored['provenance'].get('stored', '')[:10]})"

    ready, skipped = _execute_stale([n for n in names if n not in without], "laptop", force, lambda n, p: None, current)
    return ready, {**without, **skipped}


def _start(only) -> list[str]:
    """The notebooks to build (`only`, else the book's), each name checked; SIGTERM made an exit."""
    # `timeout`, a cancelled CI job: unwind (temporary files removed, kernel shut down) instead of dying
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    names = list(only) if only else pages.book_notebooks()
    for name in names:
        notebooks.source_path(name)  # a clear error for a wrong name
    return names


def laptop_main(only=None, *, force: bool = False) -> None:
    """`python -m lowrank.book.build --scale laptop [--only ...] [--force]` (`make laptop`)."""
    names = _start(only)
    start = time.time()
    ready, skipped = execute_laptop(names, force=force)
    without = sorted(n for n, why in skipped.items() if why == "no laptop file")
    print(f"{len(ready)} notebook(s) with a current laptop result ({time.time() - start:.0f} s)"
          + (f"; {len(without)} without a laptop file: {', '.join(without)}" if without else ""))
    rejected = {n: why for n, why in skipped.items() if why != "no laptop file"}
    if rejected:
        raise SystemExit(f"{len(rejected)} laptop file(s) rejected: {', '.join(sorted(rejected))}")


def paper_toc(executed: list[str]) -> dict:
    """The book's table of contents without the notebooks that have no paper-scale execution."""
    keep = {f"notebooks/{n}" for n in executed}

    def prune(node):
        if isinstance(node, list):
            return [p for p in (prune(x) for x in node) if p is not None]
        if not isinstance(node, dict):
            return node
        if str(node.get("file", "")).startswith("notebooks/") and node["file"] not in keep:
            return None
        out = {k: prune(v) for k, v in node.items()}
        for k in ("sections", "chapters", "parts"):
            if k in out and not out[k]:
                del out[k]
        if "caption" in out and "chapters" not in out:
            return None
        return out

    return prune(yaml.safe_load((notebooks.REPO_ROOT / "_toc.yml").read_text()))


def render(executed: list[str]) -> Path:
    """The paper-scale HTML from `_build/paper/executed/` alone; returns its index page."""
    config = yaml.safe_load((notebooks.REPO_ROOT / "_config.yml").read_text())
    config["title"] = f"{config['title']} (paper scale)"
    config["execute"]["cache"] = str(PAPER_CACHE)
    root = notebooks.REPO_ROOT  # jupyter-book reads local extensions relative to the config file
    if (config.get("sphinx") or {}).get("local_extensions"):
        config["sphinx"]["local_extensions"] = {k: str(root / v) for k, v in config["sphinx"]["local_extensions"].items()}
    if config.get("bibtex_bibfiles"):
        config["bibtex_bibfiles"] = [str(root / f) for f in config["bibtex_bibfiles"]]
    toc = paper_toc(executed)
    PAPER.mkdir(parents=True, exist_ok=True)
    (PAPER / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    (PAPER / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False))
    pages.fill_jupyter_cache(executed, cache_dir=PAPER_CACHE, executed_at=scale_executed_path)
    ledger = notebooks.REPO_ROOT / "book" / "ledger.md"
    before = ledger.read_text() if ledger.is_file() else None
    try:  # the ledger page as the ci build writes it, linking only the pages this book has
        toc_files = pages.toc_files() - {f"notebooks/{n}" for n in pages.book_notebooks() if n not in executed}
        write_ledger(pages.book_notebooks(), ledger, toc_files)
        # not strict: prose pages link to notebooks a skipped data set left out of this book
        return pages.build_html(True, output=PAPER, strict=False, figures=PAPER_FIGURES,
                                extra=("--config", str(PAPER / "_config.yml"), "--toc", str(PAPER / "_toc.yml")))
    finally:
        if before is not None:
            ledger.write_text(before)


def paper_main(only=None, *, force: bool = False, html: bool = True) -> None:
    """`python -m lowrank.book.build --scale paper [--only ...] [--no-html] [--force]` (`make paper`)."""
    names = _start(only)
    start = time.time()
    ready, skipped = execute_paper(names, force=force)
    if skipped:
        print(f"{len(skipped)} notebook(s) skipped at paper scale: {', '.join(sorted(skipped))}")
    if html and ready:
        index = render([n for n in pages.book_notebooks() if n in ready])
        print(f"\nThe paper-scale book is at {index} ({len(ready)} notebooks; {time.time() - start:.0f} s)")
    elif html:
        print("no notebook executed at paper scale: no paper-scale book rendered")


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
        laptop_main(args.only, force=args.force)
        return
    if args.scale == "paper":
        paper_main(args.only, force=args.force, html=not args.no_html)
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
