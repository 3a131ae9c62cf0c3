"""The laptop- and paper-scale builds: `python -m lowrank.book.build --scale laptop|paper` (`make laptop`,
`make paper`).

Laptop scale (`execute_laptop`): every notebook with a laptop file (`params/laptop/<part>/<name>.yaml`)
whose stored result in `results/laptop/` is missing or stale (its parameters or code changed:
`lowrank.book.paper_results.stored_result`) is executed on this machine, one at a time, into
`_build/laptop/executed/`, and its result stored with provenance; a current stored result is not run
again, so a fresh clone runs nothing. No separate HTML: the ci book's ledger and pages show the laptop
column from `results/laptop/`.

Every notebook of the book is executed with its paper file on the best device present, one at a
time, into `_build/paper/executed/<part>/<name>.ipynb` (keyed like the ci build, plus the hash of its
paper parameters, so an unchanged notebook is not executed again). A notebook whose data set is not
in its `data_root` is skipped with a one-line message; one without a paper file too. Each result is
stored with its provenance in `results/paper/` (lowrank.book.paper_results). The HTML is rendered
from `_build/paper/executed/` alone, with its own jupyter-cache, configuration and table of contents.
"""

from __future__ import annotations

import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import yaml

from lowrank.book import notebooks, pages, paper_results, rules, runs
from lowrank.book.keys import execution_key
from lowrank.book.paper_results import REAL_DATA, required_data  # noqa: F401 (re-exported)

__all__ = ["PAPER", "LAPTOP", "required_data", "missing_data", "execute_paper", "execute_laptop", "paper_toc", "main",
           "laptop_main"]

PAPER = pages.BUILD / "paper"
EXECUTED = PAPER / "executed"
FIGURES = PAPER / "figures"
LAPTOP = pages.BUILD / "laptop"
LAPTOP_CELL_TIMEOUT = 3600  # a laptop page is sized for at most 600 s (lowrank.book.laptop); a cell past an hour is a fault
CACHE = PAPER / ".jupyter_cache"
PAPER_CELL_TIMEOUT = 48 * 3600  # seconds per cell: a paper-scale training cell may run for hours
HEARTBEAT_S = 60.0  # how often a running notebook reports its elapsed time and cell


def executed_path(name: str, scale: str = "paper") -> Path:
    return (EXECUTED if scale == "paper" else LAPTOP / "executed") / f"{name}.ipynb"


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


def _key(name: str, params: dict) -> str:
    return execution_key(name) + runs.run_hash(name, params)


def _progress(name: str, scale: str = "paper") -> str:
    """`cell k of n` from papermill's partial output notebook (it is rewritten after every cell)."""
    import nbformat

    out = executed_path(name, scale)
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
    out = executed_path(name, scale)
    for leftover in out.parent.glob(f".{out.stem}.*"):  # a killed earlier run's
        shutil.rmtree(leftover, ignore_errors=True)
    figures = (FIGURES if scale == "paper" else LAPTOP / "figures") / name
    shutil.rmtree(figures, ignore_errors=True)  # a figure the notebook no longer draws must not be stored
    t0 = time.time()
    stop = threading.Event()
    threading.Thread(target=_heartbeat, args=(name, t0, stop, scale), daemon=True).start()
    try:
        found, provenance = runs.execute(name, params, out, figures, figure_url=f"../../figures/{name}",
                                         timeout=PAPER_CELL_TIMEOUT if scale == "paper" else LAPTOP_CELL_TIMEOUT)
    finally:
        stop.set()
    if scale == "laptop":
        found, provenance = _rerun_near_threshold(name, params, found, provenance)
    paper_results.store(name, params, found, {**provenance, "run_folder": None}, scale=scale, figure_dir=figures)
    return provenance["wall_s"]


def _rerun_near_threshold(name: str, params: dict, found: dict, provenance: dict) -> tuple[dict, dict]:
    """A laptop result whose claims lie within 10 % of their thresholds (`verdicts.near_threshold`) is
    run again at seed offset 1 (`goldens.seed_overrides`); each such claim whose outcome moves reads
    "unstable" (`verdicts.rerun_stability`). The rerun's time is added to the recorded wall time."""
    import tempfile

    from lowrank.book import goldens
    from lowrank.book.verdicts import near_threshold, rerun_stability

    near = sorted(k for k, v in found.items() if near_threshold(v))
    if not near:
        return found, {**provenance, "near_threshold_rerun": None}
    shifted = goldens.seed_overrides(name, 1, params)
    print(f"    {len(near)} claim(s) within 10 % of the threshold ({', '.join(near)}): again at seed offset 1 "
          f"({shifted})", flush=True)
    with tempfile.TemporaryDirectory(prefix="lowrank-rerun-") as tmp:
        again, second = runs.execute(name, {**params, **shifted}, Path(tmp) / "out.ipynb", Path(tmp) / "figures",
                                     timeout=LAPTOP_CELL_TIMEOUT)
    found = {**found, **{k: rerun_stability(found[k], again[k], f"seed offset 1 {shifted}") for k in near if k in again}}
    return found, {**provenance, "wall_s": provenance["wall_s"] + second["wall_s"],
                   "near_threshold_rerun": {"claims": near, "parameters": shifted, "wall_s": second["wall_s"]}}


def _execute_one(name: str, params: dict) -> float:
    """Execute `name` at paper scale and store its result; return the wall time in seconds."""
    key_path = EXECUTED / f"{name}.key"
    key_path.unlink(missing_ok=True)
    wall = _execute_and_store(name, params, "paper")
    key_path.write_text(_key(name, params))
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
            wall = _execute_one(name, params) if scale == "paper" else _execute_and_store(name, params, scale)
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
        key_path = EXECUTED / f"{name}.key"
        hit = executed_path(name).is_file() and key_path.is_file() and key_path.read_text() == _key(name, params)
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
    config["execute"]["cache"] = str(CACHE)
    root = notebooks.REPO_ROOT  # jupyter-book reads local extensions relative to the config file
    if (config.get("sphinx") or {}).get("local_extensions"):
        config["sphinx"]["local_extensions"] = {k: str(root / v) for k, v in config["sphinx"]["local_extensions"].items()}
    if config.get("bibtex_bibfiles"):
        config["bibtex_bibfiles"] = [str(root / f) for f in config["bibtex_bibfiles"]]
    toc = paper_toc(executed)
    PAPER.mkdir(parents=True, exist_ok=True)
    (PAPER / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    (PAPER / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False))
    pages.fill_jupyter_cache(executed, cache_dir=CACHE, executed_at=executed_path)
    ledger = notebooks.REPO_ROOT / "book" / "ledger.md"
    before = ledger.read_text() if ledger.is_file() else None
    try:  # the ledger page as the ci build writes it, linking only the pages this book has
        from lowrank.book.ledger import write_ledger

        toc_files = pages.toc_files() - {f"notebooks/{n}" for n in pages.book_notebooks() if n not in executed}
        write_ledger(ledger, {n: pages.executed_path(n) for n in pages.book_notebooks()}, toc_files)
        # not strict: prose pages link to notebooks a skipped data set left out of this book
        return pages.build_html(True, output=PAPER, strict=False, figures=FIGURES,
                                extra=("--config", str(PAPER / "_config.yml"), "--toc", str(PAPER / "_toc.yml")))
    finally:
        if before is not None:
            ledger.write_text(before)


def main(only=None, *, force: bool = False, html: bool = True) -> None:
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
