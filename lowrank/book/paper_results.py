"""Paper-scale results kept in the repository, with their provenance.

A paper-scale run's verdicts and provenance are stored as two small JSON files in
`results/paper/<part>/<name>/` (`verdicts.json`, `provenance.json`): the git commit and dirty flag,
the package versions, the device, the wall time in seconds, the full parameter set and its hash
(`parameter_hash`), and the code key of the run (`lowrank.book.keys.code_key`, for reference). The ledger's paper column reads them with `paper_results(name)`.

A stored result is *stale* when the parameters a paper-scale run of the notebook would use today
(its parameter cell's defaults overlaid by `params/paper/<part>/<name>.yaml`) no longer hash to the
stored hash: the paper file or a default changed since the result was measured. (A change of code
alone does not make a result stale; `provenance["code"]` says which code measured it.)

    lowrank results store RUN_FOLDER [RUN_FOLDER ...]   # a finished `lowrank run NAME --scale paper`
    lowrank results list                                 # every stored result, stale or current
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from pathlib import Path

from lowrank.book import notebooks, rules, runs
from lowrank.core.io import digest, replace_folder

__all__ = ["RESULTS", "result_dir", "paper_parameters", "parameter_hash", "store", "store_run", "paper_results", "stored_names",
           "cost_line", "write_cost_line", "timing_table"]

RESULTS = notebooks.REPO_ROOT / "results" / "paper"


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


def result_dir(name: str, root: Path | None = None) -> Path:
    return (RESULTS if root is None else Path(root)) / name


def parameter_hash(name: str, params: dict) -> str:
    """`lowrank.core.io.digest` of the notebook's name and its full parameter set."""
    return digest(json.dumps({"notebook": name, "parameters": params}, sort_keys=True))


def paper_parameters(name: str) -> dict:
    """The full parameter set of a paper-scale run of `name` as of now (raises ParameterError); not
    checked against this machine's memory: a stored result is current or stale whatever runs here."""
    return rules.resolve_parameters(name, scale="paper", memory=False)


def store(name: str, params: dict, verdicts: dict, provenance: dict, root: Path | None = None) -> Path:
    """Write `name`'s paper-scale verdicts and provenance to `results/paper/<name>/`, atomically.

    Parameters
    ----------
    params : the full parameter set the run used; it must equal `paper_parameters(name)` (a run with
        other parameters is not the paper's configuration and is refused with ParameterError).
    verdicts : `{verdict name: record}` as glued by the notebook.
    provenance : the run's provenance (git, versions, device, wall_s, start, end); kept as given,
        with the parameter hash and the time of storing added.
    """
    expected = paper_parameters(name)
    if params != expected:
        diff = sorted(k for k in set(params) | set(expected) if params.get(k) != expected.get(k))
        raise rules.ParameterError(f"{name}: not a paper-scale run: parameters {diff} differ from "
                                  f"{notebooks.paper_params_path(name)} and the notebook's defaults")
    if not verdicts:
        raise rules.ParameterError(f"{name}: the run glued no verdicts; nothing to store")
    record = {**provenance, "notebook": name, "parameters": params, "parameter_hash": parameter_hash(name, params),
              "stored": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    final = result_dir(name, root)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    (tmp / "verdicts.json").write_text(json.dumps(verdicts, indent=2, sort_keys=True) + "\n")
    (tmp / "provenance.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return replace_folder(tmp, final)


def store_run(folder, root: Path | None = None) -> Path:
    """Store the result of a finished run folder (`lowrank run NAME --scale paper`)."""
    run = runs.load_run(folder)
    prov = run["provenance"]
    if "notebook" not in prov:  # a sweep's function run: no page, no verdicts to keep
        raise runs.RunFolderError(f"{folder} is a run of {prov.get('function', 'a function')} (a sweep's), not of a "
                                  f"notebook; `lowrank results store` keeps `lowrank run NAME --scale paper` folders")
    keep = {k: prov.get(k) for k in ("git", "versions", "device", "load_at_start", "load_at_end", "start", "end",
                                     "wall_s", "code")}
    keep["run_folder"] = Path(folder).name
    return store(prov["notebook"], prov["parameters"], run["verdicts"], keep, root)


def paper_results(name: str, root: Path | None = None) -> dict | None:
    """`{"verdicts", "provenance", "stale", "stale_reason"}` of `name`'s stored paper-scale result,
    None when there is none. `stale` is True when the parameters of a paper-scale run today differ
    from the stored ones (`stale_reason` says which), or the paper file is gone."""
    folder = result_dir(name, root)
    if not (folder / "provenance.json").is_file():
        return None
    prov = json.loads((folder / "provenance.json").read_text())
    verdicts = json.loads((folder / "verdicts.json").read_text())
    try:
        now = paper_parameters(name)
    except (rules.ParameterError, FileNotFoundError, ValueError) as err:
        return {"verdicts": verdicts, "provenance": prov, "stale": True, "stale_reason": str(err)}
    stored = prov.get("parameters", {})
    changed = sorted(k for k in set(now) | set(stored) if now.get(k) != stored.get(k))
    stale = parameter_hash(name, now) != prov.get("parameter_hash") or bool(changed)
    reason = f"parameters changed since the run: {', '.join(changed) or 'hash'}" if stale else None
    return {"verdicts": verdicts, "provenance": prov, "stale": stale, "stale_reason": reason}


def stored_names(root: Path | None = None) -> list[str]:
    """`part/name` of every stored result."""
    base = RESULTS if root is None else Path(root)
    return sorted(p.parent.relative_to(base).as_posix() for p in base.glob("*/*/provenance.json"))


COST_PREFIX = "# Cost"


def cost_line(name: str, root: Path | None = None) -> str:
    """The cost comment of `params/paper/<name>.yaml`: the wall time of the stored, current
    paper-scale result with the device and the machine's load, or "not measured". Written by
    `bench/run.py --only paper`, never by hand (a test compares every paper file with this)."""
    r = paper_results(name, root)
    if r is None or r["stale"]:
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
        if r["stale"]:
            continue
        p = r["provenance"]
        load = p.get("load_at_start") or {}
        lines.append(f"| {name} | {p['wall_s']:.0f} | {p['device']} | {load.get('cpus', '?')}, "
                     f"{load.get('load_average_1m', '?')} | {str(p.get('start', ''))[:10]} |")
    if len(lines) == 2:
        lines.append("| (no stored result yet) | | | | |")
    return "\n".join(lines)
