"""Golden verdicts: each notebook's verdicts at ci scale, measured over seeds and written by a stated
rule (`lowrank goldens measure`), and the verdict diff of a build against them (`lowrank diff`).

The file is `tests/golden_verdicts.yaml`: one block per notebook, one entry per verdict:

    name: {value: v0, abs: t, outcome: agrees, control: {value: c0, abs: tc}, spread: "...", measured: "..."}

`value` is the verdict of the default run (the notebook's own seeds); `abs` is TOLERANCE_RULE applied
to every run: the seeds shifted by 1, 2, ... (a `seed` parameter moves by k, a `seeds` list by k times
its length, so the draws never overlap) and the default run again under the other CPU code paths torch
can take on a machine of this kind (`ATEN_CPU_CAPABILITY=default`, its portable kernels, and `avx2`;
the native run is AVX-512 where the CPU has it): rounding differs between machines, and these paths
reproduce such differences on one machine. `outcomes` counts the outcomes seen over those runs; an
entry with more than one is `unstable`, and the ci book shows that verdict as unstable
(lowrank.book.verdicts). A stable entry's outcome must be met exactly. When the tolerance covers the
statistic's whole range (a verdict that records `statistic_range`), the entry says so
(`tolerance_covers_range`): its value cannot fail, and only the outcome is compared.
`entry_mismatch` is the one rule the golden test, `lowrank diff` and `lowrank goldens check` apply.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

from lowrank.book import notebooks
from lowrank.core import io
from lowrank.book.verdicts import GLUE_PREFIX, STABILITY_ENV, UNSTABLE, entry_mismatch, within

__all__ = ["GOLDEN", "TOLERANCE_RULE", "CPU_PATH_ENV", "glued_verdicts", "notebook_verdicts", "load", "seed_overrides", "parse_seeds", "measure",
           "entries_from_runs", "write_block", "within", "entry_mismatch", "block_mismatches", "recorded_block",
           "check_cpu_path", "compare_spread", "verdict_diff", "diff_markdown"]

GOLDEN = notebooks.REPO_ROOT / "tests" / "golden_verdicts.yaml"
CPU_PATH_ENV = "ATEN_CPU_CAPABILITY"  # "default": torch's portable CPU kernels (no AVX2/AVX-512)
SECOND_PATH = "default"
OTHER_PATHS = (SECOND_PATH, "avx2")  # each measured at seed offset 0 beside the native path
TOLERANCE_RULE = ("abs = 1.5 x the range of the values over every run (seed offsets and the second CPU path), "
                  "and at least 1e-10 (round-off level) and twice the shortening of the value to 6 significant digits")
FLOOR = 1e-10
HEADER = f"""\
# Golden verdicts at ci scale, written by `lowrank goldens measure NAME --seeds 0-4` (lowrank/book/goldens.py).
# value: the verdict of the notebook's default run; outcome: its outcome; control: the first negative
# control's value (claims). Tolerance rule: {TOLERANCE_RULE}.
# `outcomes`: the outcomes seen over the runs (seed offsets, and offset 0 under {CPU_PATH_ENV}={" and ".join(OTHER_PATHS)});
# more than one makes the entry unstable. `spread` is the observed range; `measured` names the commit and runs. Entries are never
# edited by hand and a tolerance is never widened to make a failing check pass: re-measure instead.
"""



def glued_verdicts(values: dict) -> dict:
    """`{verdict name: record dict}` among a notebook's glued values (`lowrank.book.notebooks.glued_values`): those
    glued by `lowrank.book.verdicts.check` and `claim`."""
    return {k[len(GLUE_PREFIX):]: v for k, v in values.items() if k.startswith(GLUE_PREFIX)}


def notebook_verdicts(nb) -> dict:
    """`glued_verdicts` of an executed notebook `nb`."""
    return glued_verdicts(notebooks.glued_values(nb))

def load(path: Path = GOLDEN) -> dict:
    """`{notebook: {verdict: entry}}` of the goldens file; a file that is not YAML, or not a mapping of
    mappings, is refused with one line (notebooks.InputError)."""
    path = Path(path)
    try:
        data = io.parse_once(yaml.safe_load, path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        where = getattr(err, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise notebooks.InputError(f"golden file {path} is unreadable{at}: {type(err).__name__}; "
                                   f"restore it from git or re-measure with `lowrank goldens measure`") from None
    bad = (type(data).__name__ if not isinstance(data, dict) else
           next((f"the block of {k!r} is a {type(v).__name__}" for k, v in data.items() if not isinstance(v, dict)), None))
    if bad:
        raise notebooks.InputError(f"golden file {path} must map notebook names to mappings of verdicts, got {bad}; "
                                   f"restore it from git or re-measure with `lowrank goldens measure`")
    return data


MAX_SEED_OFFSETS = 100  # executions of one notebook; bounded before a range is expanded


def parse_seeds(text: str) -> list[int]:
    """"0-4" -> [0, 1, 2, 3, 4]; "0,2,5" -> [0, 2, 5]. The first is the default run (offset 0)."""
    out = []
    text = str(text)
    if len(text) > 1000:
        raise ValueError(f"seeds {text[:60]!r}...: more than 1000 characters")
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isascii() or not lo.isdigit() or (hi and not (hi.isascii() and hi.isdigit())):
            raise ValueError(f"seeds must look like 0-4 or 0,1,2, got {text[:60]!r}")
        lo, hi = int(lo), int(hi) if hi else int(lo)
        if hi < lo or hi >= MAX_SEED_OFFSETS or len(out) + hi - lo + 1 > MAX_SEED_OFFSETS:
            raise ValueError(f"seeds {text[:60]!r}: offsets must be ascending ranges below {MAX_SEED_OFFSETS}, "
                             f"at most {MAX_SEED_OFFSETS} in all (each is a full execution)")
        out += list(range(lo, hi + 1))
    if len(out) < 2 or out[0] != 0 or len(set(out)) != len(out):
        raise ValueError(f"seeds must start at 0 (the default run) and name at least two distinct offsets, got {text!r}")
    return out


def seed_overrides(name: str, k: int, params: dict | None = None) -> dict:
    """Parameters that shift notebook `name`'s randomness by offset `k` from `params` (None: its defaults)."""
    defaults = params if params is not None else notebooks.parameter_defaults(notebooks.read_notebook(name))
    if "seed" in defaults:  # a page pooling `seeds` consecutive seeds from `seed` moves past all of them
        step = defaults["seeds"] if isinstance(defaults.get("seeds"), int) and defaults["seeds"] > 0 else 1
        return {"seed": defaults["seed"] + k * step}
    if "seeds" in defaults:
        seeds = list(defaults["seeds"])
        return {"seeds": [s + k * len(seeds) for s in seeds]}
    raise ValueError(f"{name} has neither a `seed` nor a `seeds` parameter: its spread cannot be measured")


def _set_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def _execute(name: str, k: int, cpu_path: str | None = None, stability: Path | None = None) -> dict:
    """Notebook `name`'s verdicts at seed offset `k`, its kernel on CPU path `cpu_path` (None: torch's
    own choice) and judged with (or without) the recorded stability."""
    before = {key: os.environ.get(key) for key in (CPU_PATH_ENV, STABILITY_ENV)}
    _set_env(CPU_PATH_ENV, cpu_path)  # the kernel is a new process: it inherits these
    _set_env(STABILITY_ENV, str(stability) if stability else None)
    try:
        with tempfile.TemporaryDirectory(prefix="lowrank-goldens-") as tmp:
            notebooks.execute(name, Path(tmp) / "out.ipynb", parameters=seed_overrides(name, k), figure_dir=Path(tmp))
            import nbformat

            return notebook_verdicts(nbformat.read(Path(tmp) / "out.ipynb", as_version=4))
    finally:  # called in this process too (tests): later kernels and workers must not inherit them
        for key, value in before.items():
            _set_env(key, value)


def _label(k: int, cpu_path: str | None) -> str:
    return f"seed offset {k}" + (f", {CPU_PATH_ENV}={cpu_path}" if cpu_path else "")


def measure(name: str, seeds: list[int], jobs: int = 2, cpu_paths=OTHER_PATHS) -> dict[str, dict]:
    """`{run label: {verdict name: record}}`, the default run first: the notebook executed once per seed
    offset, and at offset 0 once per CPU path of `cpu_paths`, `jobs` at a time. Outcomes are the runs'
    own (no recorded stability applies)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the book build: one thread per kernel
    plan = [(k, None) for k in seeds] + [(0, path) for path in cpu_paths]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {_label(k, path): pool.submit(_execute, name, k, path) for k, path in plan}
        return {label: f.result() for label, f in futures.items()}


def _tolerance(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]  # an undecided claim measures NaN when no run is left
    return max(1.5 * (max(values) - min(values)), FLOOR) if values else FLOOR


def _short(x: float) -> float:
    return float(f"{x:.6g}")


def _recorded(value: float, tol: float) -> tuple[float, float]:
    """(value kept to 6 significant digits, a tolerance that also covers that shortening): a value with no spread
    over the runs must still meet its own recorded entry."""
    short = _short(value)
    return short, _short(max(tol, 2 * abs(value - short)) if math.isfinite(value) else tol)


def entries_from_runs(runs: dict[str, dict], commit: str) -> dict:
    """Golden entries from `measure`'s output (the default run first) by TOLERANCE_RULE."""
    labels = list(runs)
    first = runs[labels[0]]
    out = {}
    for key, v0 in first.items():
        records = [runs[k][key] for k in labels if key in runs[k]]
        values = [r["measured"] for r in records]
        counts: dict[str, int] = {}
        for r in records:
            counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        tol = _tolerance(values)
        value, value_abs = _recorded(v0["measured"], tol)
        entry = {"value": value, "abs": value_abs,
                 "outcome": v0["outcome"] if len(counts) == 1 else UNSTABLE,
                 "outcomes": dict(sorted(counts.items()))}
        lo_hi = (v0.get("details") or {}).get("statistic_range")
        if lo_hi and 2 * tol >= lo_hi[1] - lo_hi[0]:
            entry["tolerance_covers_range"] = True
        if v0.get("controls"):  # a run can leave a control out (none of its runs fits): the same control, by name
            first = v0["controls"][0]["name"]
            cvals = [c["value"] for r in records for c in r.get("controls") or [] if c["name"] == first]
            cvalue, cabs = _recorded(cvals[0], _tolerance(cvals))
            entry["control"] = {"value": cvalue, "abs": cabs}
        entry["spread"] = f"{len(records)} runs: {min(values):.4g} to {max(values):.4g}"
        others = ", ".join(label.split("=")[-1] for label in labels if CPU_PATH_ENV in label)
        entry["measured"] = (f"{commit}, {dt.date.today().isoformat()}, {len(labels)} runs"
                             + (f" (offset 0 also on CPU paths {others})" if others else ""))
        out[key] = entry
    return out


def recorded_block(name: str, golden: dict | None = None) -> dict:
    """Notebook `name`'s golden block: what the ci build's verdicts (recorded outcomes) and its nbval
    summary (within the recorded tolerance or not) depend on."""
    if golden is None:
        golden = load() if GOLDEN.is_file() else {}  # a book without goldens (a probe book) records none
    return {k: e for k, e in sorted((golden.get(name) or {}).items()) if isinstance(e, dict)}


def _commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=notebooks.REPO_ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "lowrank", "notebooks"], cwd=notebooks.REPO_ROOT,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_block(name: str, entries: dict, path: Path = GOLDEN, order: list[str] | None = None) -> None:
    """Replace notebook `name`'s block in the golden file (atomically, under a lock so that two
    measuring commands never lose each other's blocks), keeping the other blocks."""
    import fcntl

    with open(Path(path).with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _write_block(name, entries, Path(path), order)


def _write_block(name: str, entries: dict, path: Path, order: list[str] | None) -> None:
    golden = load(path) if Path(path).is_file() else {}
    golden[name] = entries
    names = [n for n in (order or []) if n in golden] + sorted(n for n in golden if n not in (order or []))
    lines = [HEADER.rstrip("\n")]
    for n in names:
        lines.append(f"{n}:")
        for key, entry in golden[n].items():
            lines.append(f"  {key}: " + yaml.safe_dump(entry, default_flow_style=True, width=10**6, sort_keys=False).strip())
    io.write_atomically(path, "\n".join(lines) + "\n")


def block_mismatches(found: dict, block: dict) -> list[str]:
    """Every way notebook verdicts `found` ({name: record}) miss their golden `block`."""
    out = [f"verdict {k} has no golden entry" for k in sorted(set(found) - set(block))]
    out += [f"verdict {k} is missing" for k in sorted(set(block) - set(found))]
    for key in sorted(set(found) & set(block)):
        why = entry_mismatch(found[key], block[key])
        if why:
            out.append(f"{key}: {why}")
    return out


def check_cpu_path(names, cpu_path: str = SECOND_PATH, jobs: int = 2, golden: dict | None = None) -> dict[str, list]:
    """Execute each notebook once (seed offset 0) with its kernel on CPU path `cpu_path`, judged as the ci
    book judges it (recorded stability applies), and compare with the goldens: `{name: mismatches}`."""
    golden = load() if golden is None else golden
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {n: pool.submit(_execute, n, 0, cpu_path, GOLDEN) for n in names}
        return {n: block_mismatches(f.result(), golden.get(n, {})) for n, f in futures.items()}


def compare_spread(recorded: dict, fresh: dict) -> list[dict]:
    """Entries whose recorded value or tolerance no longer matches a fresh measurement: the fresh default
    value outside the recorded tolerance, or a fresh tolerance over 1.5 times (or under a third of) the
    recorded one."""
    rows = []
    for key in sorted(set(recorded) | set(fresh)):
        old, new = recorded.get(key), fresh.get(key)
        if old is None or new is None:
            rows.append({"verdict": key, "recorded": old, "fresh": new, "stale": True, "why": "added or removed"})
            continue
        why = []
        if not within(new["value"], old):
            why.append("value outside the recorded tolerance")
        if old.get("outcome") != new["outcome"]:
            why.append("outcome changed")
        if "abs" in old and not (old["abs"] / 3 <= new["abs"] <= 1.5 * old["abs"]):
            why.append(f"tolerance {old['abs']:.3g} -> {new['abs']:.3g}")
        rows.append({"verdict": key, "recorded": old, "fresh": new, "stale": bool(why), "why": "; ".join(why)})
    return rows


def _moved(a: float, b: float) -> bool:
    return abs(a - b) > 1e-5 * max(abs(a), abs(b), FLOOR)  # goldens keep 6 significant digits


def verdict_diff(executed: dict[str, Path], golden: dict | None = None) -> list[dict]:
    """Every verdict of the executed notebooks whose value, control or outcome differs from its golden
    entry (also within tolerance, so drift is seen before it fails), and verdicts added or removed."""
    import nbformat

    golden = load() if golden is None else golden
    rows = []
    for name, path in executed.items():
        found = notebook_verdicts(nbformat.read(path, as_version=4)) if Path(path).is_file() else {}
        want = golden.get(name, {})
        for key in list(want) + [k for k in found if k not in want]:
            g, v = want.get(key), found.get(key)
            row = {"notebook": name, "verdict": key, "golden": g, "new": v}
            if g is None or v is None:
                rows.append({**row, "within": False, "what": "new verdict" if g is None else "verdict missing"})
                continue
            moved = "value" in g and _moved(v["measured"], g["value"])
            ok = not entry_mismatch(v, g)
            control_moved = bool(v.get("controls") and "control" in g
                                 and _moved(v["controls"][0]["value"], g["control"]["value"]))
            if moved or control_moved or not ok:
                what = "outside tolerance" if not ok else "moved within tolerance"
                rows.append({**row, "within": ok, "what": what})
    return rows


def _fmt_golden(g: dict | None) -> str:
    if g is None:
        return "—"
    if "value" in g:
        return f"{g['value']:.4g} ± {g.get('abs', 0) + g.get('rel', 0) * abs(g['value']):.2g}"
    return " and ".join(f"{k} {g[k]:.3g}" for k in ("min", "max") if k in g)


def diff_markdown(rows: list[dict]) -> str:
    if not rows:
        return "# Verdict diff\n\nEvery verdict equals its golden value (to 6 digits) and outcome.\n"
    bad = sum(not r["within"] for r in rows)
    lines = ["# Verdict diff", "", f"{len(rows)} verdict(s) differ from tests/golden_verdicts.yaml; "
             f"{bad} outside tolerance or with another outcome.", "",
             "| notebook | verdict | golden value ± tol | new value | control golden → new | outcome golden → new | |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        g, v = r["golden"], r["new"]
        new = f"{v['measured']:.4g}" if v else "—"
        gc = g.get("control", {}).get("value") if g else None
        nc = v["controls"][0]["value"] if v and v.get("controls") else None
        control = f"{'—' if gc is None else f'{gc:.4g}'} → {'—' if nc is None else f'{nc:.4g}'}"
        outcome = f"{g.get('outcome', '—') if g else '—'} → {v['outcome'] if v else '—'}"
        lines.append(f"| {r['notebook']} | {r['verdict']} | {_fmt_golden(g)} | {new} | {control} | {outcome} | "
                     f"{r['what']} |")
    return "\n".join(lines) + "\n"
