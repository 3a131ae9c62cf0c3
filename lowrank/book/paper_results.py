"""Laptop- and paper-scale results kept in the repository, with their provenance.

A laptop- or paper-scale run's verdicts and provenance are stored in `results/<scale>/<part>/<name>/`
(`verdicts.json`, `provenance.json`, and `figures/*.csv`, the data of its figures, when it drew any):
the git commit and dirty flag, the package versions, the device, the wall time in seconds, the full
parameter set and its hash (`parameter_hash`), the code key of the run (`code`) and the digest of every
file of that code (`code_files`: the notebook and each `lowrank` module it imports). The ledger's
laptop and paper columns read them with `stored_result(name, scale=...)` (`paper_results(name)` for paper).

A stored result is *stale*, shown so and never silently reused, when
- the parameters a run of the notebook at its scale would use today (the parameter cell's defaults
  overlaid by `params/<scale>/<part>/<name>.yaml`) no longer hash to the stored hash, or
- the code changed since the run: a file of `code_files` changed (each is named), or, for a result
  stored before `code_files` was recorded, its code key differs from today's
  (`lowrank.book.keys.code_key`).

    lowrank results store RUN_FOLDER [RUN_FOLDER ...]   # a finished `lowrank run NAME --scale laptop|paper`
    lowrank results list                                 # every stored result, stale or current
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from pathlib import Path

from lowrank.book import notebooks, rules
from lowrank.core.io import digest, replace_folder

__all__ = ["RESULTS", "STORED_SCALES", "results_root", "result_dir", "scale_parameters", "paper_parameters", "parameter_hash",
           "code_changes", "store", "store_run", "stored_result", "paper_results", "stored_names", "cost_line",
           "write_cost_line", "timing_table"]

RESULTS = notebooks.REPO_ROOT / "results" / "paper"
STORED_SCALES = notebooks.SCALES[1:]  # the scales whose results are stored: laptop, paper


def results_root(scale: str = "paper") -> Path:
    """`results/<scale>/` (RESULTS for paper, looked up when called: tests point it elsewhere)."""
    if scale not in STORED_SCALES:
        raise ValueError(f"results are stored for {', '.join(STORED_SCALES)}, not {scale!r}")
    return RESULTS if scale == "paper" else RESULTS.parent / scale


REAL_DATA = ("mnist", "cifar10")


def required_data(params: dict) -> list[str]:
    """The real data sets (`mnist`, `cifar10`) a parameter set reads: the values of `dataset` and of
    any list parameter whose name starts with `dataset` (e.g. `datasets_used`)."""
    found = []
    for key, value in params.items():
        if not key.startswith("dataset"):
            continue
        for v in value if isinstance(value, list) else [value]:
            if v in REAL_DATA and v not in found:
                found.append(v)
    return found


def result_dir(name: str, root: Path | None = None, scale: str = "paper") -> Path:
    return (results_root(scale) if root is None else Path(root)) / name


def parameter_hash(name: str, params: dict) -> str:
    """`lowrank.core.io.digest` of the notebook's name and its full parameter set."""
    return digest(json.dumps({"notebook": name, "parameters": params}, sort_keys=True))


def scale_parameters(name: str, scale: str = "paper") -> dict:
    """The full parameter set of a run of `name` at `scale` as of now (raises ParameterError); not
    checked against this machine's memory: a stored result is current or stale whatever runs here."""
    return rules.resolve_parameters(name, scale=scale, memory=False)


def paper_parameters(name: str) -> dict:
    return scale_parameters(name, "paper")


CODE_KEY_DIFFERS = "the notebook or a module it imports (its code key differs; stored before per-file digests)"


def code_changes(name: str, provenance: dict) -> list[str]:
    """What changed in the code of `name` since the run `provenance` records: the files of its
    `code_files` that differ today, were removed or are new (the notebook, a `lowrank` module it
    imports); for a record without `code_files` (stored before they were recorded), [CODE_KEY_DIFFERS]
    when its `code` differs from today's `lowrank.book.keys.code_key(name)`. Empty when the code is the run's."""
    from lowrank.book import keys

    stored = provenance.get("code_files")
    if not isinstance(stored, dict):
        return [] if provenance.get("code") == keys.code_key(name) else [CODE_KEY_DIFFERS]
    now = keys.code_files(name)
    return sorted(f for f in set(stored) | set(now) if stored.get(f) != now.get(f))


def store(name: str, params: dict, verdicts: dict, provenance: dict, root: Path | None = None, *,
          scale: str = "paper", figure_dir: Path | None = None) -> Path:
    """Write `name`'s verdicts and provenance at `scale` to `results/<scale>/<name>/`, atomically.

    Parameters
    ----------
    params : the full parameter set the run used; it must equal `scale_parameters(name, scale)` (a run
        with other parameters is not that scale's configuration and is refused with ParameterError).
    verdicts : `{verdict name: record}` as glued by the notebook.
    provenance : the run's provenance (git, versions, device, wall_s, start, end, code); kept as
        given, with the parameter hash, the digests of the code (`code_files`, as of now: store right
        after the run) and the time of storing added.
    figure_dir : the run's figures; the CSV of each (the figure's data) is stored in `figures/`.
    """
    from lowrank.book import keys

    expected = scale_parameters(name, scale)
    if params != expected:
        diff = sorted(k for k in set(params) | set(expected) if params.get(k) != expected.get(k))
        raise rules.ParameterError(f"{name}: not a {scale}-scale run: parameters {diff} differ from "
                                  f"{notebooks.scale_params_path(name, scale)} and the notebook's defaults")
    if not verdicts:
        raise rules.ParameterError(f"{name}: the run glued no verdicts; nothing to store")
    record = {**provenance, "notebook": name, "scale": scale, "parameters": params,
              "parameter_hash": parameter_hash(name, params), "code_files": keys.code_files(name),
              "stored": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    final = result_dir(name, root, scale)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        (tmp / "verdicts.json").write_text(json.dumps(verdicts, indent=2, sort_keys=True) + "\n")
        (tmp / "provenance.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        csvs = sorted(Path(figure_dir).glob("*.csv")) if figure_dir is not None else []
        if csvs:
            (tmp / "figures").mkdir()
            for f in csvs:
                shutil.copyfile(f, tmp / "figures" / f.name)
        return replace_folder(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def store_run(run: dict, root: Path | None = None) -> Path:
    """Store the result of a finished run folder (`lowrank run NAME --scale laptop|paper`) as
    `lowrank.book.runs.load_run` read it, its scale read from its parameters."""
    folder, prov = run["folder"], run["provenance"]
    if "notebook" not in prov:  # a sweep's function run: no page, no verdicts to keep
        raise notebooks.InputError(f"{folder} is a run of {prov.get('function', 'a function')} (a sweep's), not of a "
                                   f"notebook; `lowrank results store` keeps `lowrank run NAME --scale paper` folders")
    scale = (prov.get("parameters") or {}).get("scale")
    if scale not in STORED_SCALES:
        raise rules.ParameterError(f"{folder}: a {scale}-scale run; only {' and '.join(STORED_SCALES)}-scale runs are "
                                   f"stored (`lowrank run NAME --scale laptop|paper`)")
    keep = {k: prov.get(k) for k in ("git", "versions", "device", "load_at_start", "load_at_end", "start", "end",
                                     "wall_s", "code")}
    keep["run_folder"] = Path(folder).name
    return store(prov["notebook"], prov["parameters"], run["verdicts"], keep, root, scale=scale,
                 figure_dir=Path(folder) / "figures")


def stored_result(name: str, root: Path | None = None, scale: str = "paper") -> dict | None:
    """`{"verdicts", "provenance", "stale", "stale_reason", "parameters_stale"}` of `name`'s stored
    result at `scale`, None when there is none. `stale` is True when the parameters of a run at that
    scale today differ from the stored ones, or its parameter file is gone (`parameters_stale`), or its
    code changed (`code_changes`); `stale_reason` says which."""
    folder = result_dir(name, root, scale)
    if not (folder / "provenance.json").is_file():
        return None
    prov = json.loads((folder / "provenance.json").read_text())
    verdicts = json.loads((folder / "verdicts.json").read_text())
    try:
        now = scale_parameters(name, scale)
    except (rules.ParameterError, FileNotFoundError, ValueError) as err:
        return {"verdicts": verdicts, "provenance": prov, "stale": True, "stale_reason": str(err),
                "parameters_stale": True}
    stored = prov.get("parameters", {})
    changed = sorted(k for k in set(now) | set(stored) if now.get(k) != stored.get(k))
    reasons = []
    parameters_stale = parameter_hash(name, now) != prov.get("parameter_hash") or bool(changed)
    if parameters_stale:
        reasons.append(f"parameters changed since the run: {', '.join(changed) or 'hash'}")
    try:
        code = code_changes(name, prov)
    except (FileNotFoundError, ValueError) as err:  # the notebook is gone
        code = [str(err)]
    if code:
        reasons.append(f"code changed since the run: {', '.join(code)}")
    return {"verdicts": verdicts, "provenance": prov, "stale": bool(reasons), "stale_reason": "; ".join(reasons) or None,
            "parameters_stale": parameters_stale}


def paper_results(name: str, root: Path | None = None) -> dict | None:
    """`stored_result(name, root, "paper")`."""
    return stored_result(name, root, "paper")


def stored_names(root: Path | None = None, scale: str = "paper") -> list[str]:
    """`part/name` of every stored result at `scale`."""
    base = results_root(scale) if root is None else Path(root)
    return sorted(p.parent.relative_to(base).as_posix() for p in base.glob("*/*/provenance.json"))


COST_PREFIX = "# Cost"


def cost_line(name: str, root: Path | None = None) -> str:
    """The cost comment of `params/paper/<name>.yaml`: the wall time of the stored paper-scale result
    measured with today's parameters (its code may have changed since) with the device and the machine's load, or "not measured". Written by
    `bench/run.py --only paper`, never by hand (a test compares every paper file with this)."""
    r = paper_results(name, root)
    if r is None or r["parameters_stale"]:  # a code change leaves the wall time a measurement of these sizes
        return (f"{COST_PREFIX}: not measured (no current result in results/paper/{name}; `make paper` measures it and "
                f"`python bench/run.py --only paper` writes this line).")
    p = r["provenance"]
    load = (p.get("load_at_start") or {}).get("load_average_1m")
    cpus = (p.get("load_at_start") or {}).get("cpus")
    machine = f", {cpus} CPUs at load {load:g}" if cpus and load is not None else ""
    return (f"{COST_PREFIX} (measured by `make paper`, written by bench/run.py): {p['wall_s']:.0f} s on "
            f"{p['device']}{machine}, {str(p.get('start', ''))[:10]}.")


def write_cost_line(name: str, root: Path | None = None) -> bool:
    """Put `cost_line(name)` into the paper file: it replaces the old cost line, or follows the
    leading comments. Returns whether the file changed."""
    path = notebooks.paper_params_path(name)
    lines = path.read_text().splitlines()
    new = cost_line(name, root)
    at = next((i for i, line in enumerate(lines) if line.startswith(COST_PREFIX)), None)
    if at is None:
        at = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
        lines.insert(at, new)
    elif lines[at] == new:
        return False
    else:
        lines[at] = new
    path.write_text("\n".join(lines) + "\n")
    return True


def timing_table(root: Path | None = None) -> str:
    """Markdown table of the stored, current paper-scale results' wall times (what README's paper-scale
    section shows; `bench/run.py --only paper` writes it there)."""
    lines = ["| notebook | seconds | device | CPUs, load at start | measured |", "|---|---|---|---|---|"]
    for name in stored_names(root):
        r = paper_results(name, root)
        if r["parameters_stale"]:
            continue
        p = r["provenance"]
        load = p.get("load_at_start") or {}
        lines.append(f"| {name} | {p['wall_s']:.0f} | {p['device']} | {load.get('cpus', '?')}, "
                     f"{load.get('load_average_1m', '?')} | {str(p.get('start', ''))[:10]} |")
    if len(lines) == 2:
        lines.append("| (no stored result yet) | | | | |")
    return "\n".join(lines)
