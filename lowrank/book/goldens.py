"""Golden verdicts: each notebook's verdicts at ci scale, measured over seeds and written by a stated
rule (`lowrank goldens measure`), and the verdict diff of a build against them (`lowrank diff`).

The file is `tests/golden_verdicts.yaml`: one block per notebook, one entry per verdict:

    name: {value: v0, abs: t, outcome: agrees, control: {value: c0, abs: tc}, spread: "...", measured: "..."}

`value` is the verdict of the default run (the notebook's own seeds); `abs` is TOLERANCE_RULE applied
to the runs with the seeds shifted by 1, 2, ... (a `seed` parameter moves by k, a `seeds` list by k
times its length, so the draws never overlap). The golden test (tests/test_notebooks.py) and the
diff judge a value with `within`.
"""

from __future__ import annotations

import datetime as dt
import math
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

from lowrank.book import notebooks

__all__ = ["GOLDEN", "TOLERANCE_RULE", "load", "seed_overrides", "parse_seeds", "measure", "entries_from_runs",
           "write_block", "within", "compare_spread", "verdict_diff", "diff_markdown"]

GOLDEN = notebooks.REPO_ROOT / "tests" / "golden_verdicts.yaml"
TOLERANCE_RULE = ("abs = 1.5 x the largest distance between the default run's value and another seed's, "
                  "and at least 1e-10 (round-off level)")
FLOOR = 1e-10
HEADER = f"""\
# Golden verdicts at ci scale, written by `lowrank goldens measure NAME --seeds 0-4` (lowrank/book/goldens.py).
# value: the verdict of the notebook's default run; outcome: its outcome; control: the first negative
# control's value (claims). Tolerance rule: {TOLERANCE_RULE}.
# `spread` is the observed range over the seeds; `measured` names the commit and seeds. Entries are never
# edited by hand and a tolerance is never widened to make a failing check pass: re-measure instead.
"""


def load(path: Path = GOLDEN) -> dict:
    """`{notebook: {verdict: entry}}` of the goldens file; a file that is not YAML, or not a mapping of
    mappings, is refused with one line (notebooks.InputError)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
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


def seed_overrides(name: str, k: int) -> dict:
    """Parameters that shift notebook `name`'s randomness by offset `k` (0: its defaults)."""
    defaults = notebooks.parameter_defaults(notebooks.read_notebook(name))
    if "seed" in defaults:
        return {"seed": defaults["seed"] + k}
    if "seeds" in defaults:
        seeds = list(defaults["seeds"])
        return {"seeds": [s + k * len(seeds) for s in seeds]}
    raise ValueError(f"{name} has neither a `seed` nor a `seeds` parameter: its spread cannot be measured")


def _execute(name: str, k: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="lowrank-goldens-") as tmp:
        notebooks.execute(name, Path(tmp) / "out.ipynb", parameters=seed_overrides(name, k), figure_dir=Path(tmp))
        import nbformat

        return notebooks.verdicts(nbformat.read(Path(tmp) / "out.ipynb", as_version=4))


def measure(name: str, seeds: list[int], jobs: int = 2) -> dict[int, dict]:
    """`{offset: {verdict name: record}}`: the notebook executed once per seed offset, `jobs` at a time."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the book build: one thread per kernel
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {k: pool.submit(_execute, name, k) for k in seeds}
        return {k: f.result() for k, f in futures.items()}


def _tolerance(values: list[float]) -> float:
    v0 = values[0]
    return max(1.5 * max(abs(v - v0) for v in values), FLOOR)


def _short(x: float) -> float:
    return float(f"{x:.6g}")


def entries_from_runs(runs: dict[int, dict], commit: str) -> dict:
    """Golden entries from `measure`'s output (offset 0 first) by TOLERANCE_RULE."""
    seeds = sorted(runs)
    first = runs[seeds[0]]
    out = {}
    for key, v0 in first.items():
        records = [runs[k][key] for k in seeds if key in runs[k]]
        values = [r["measured"] for r in records]
        outcomes = sorted({r["outcome"] for r in records})
        entry = {"value": _short(v0["measured"]), "abs": _short(_tolerance(values)), "outcome": v0["outcome"]}
        if v0.get("controls"):
            cvals = [r["controls"][0]["value"] for r in records]
            entry["control"] = {"value": _short(cvals[0]), "abs": _short(_tolerance(cvals))}
        spread = f"seed offsets {seeds[0]}-{seeds[-1]}: {min(values):.4g} to {max(values):.4g}"
        if len(outcomes) > 1:
            spread += f"; outcomes seen: {', '.join(outcomes)}"
        entry["spread"] = spread
        entry["measured"] = f"{commit}, {dt.date.today().isoformat()}, {len(records)} runs"
        out[key] = entry
    return out


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
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


def within(value: float, want: dict) -> bool:
    """`value` meets a golden entry: `value` with `abs` and/or `rel` tolerance, and/or `max` / `min`."""
    if not math.isfinite(value):
        return False
    ok = True
    if "max" in want:
        ok &= value <= want["max"]
    if "min" in want:
        ok &= value >= want["min"]
    if "value" in want:
        ok &= abs(value - want["value"]) <= want.get("abs", 0.0) + want.get("rel", 0.0) * abs(want["value"])
    return bool(ok)


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
        found = notebooks.verdicts(nbformat.read(path, as_version=4)) if Path(path).is_file() else {}
        want = golden.get(name, {})
        for key in list(want) + [k for k in found if k not in want]:
            g, v = want.get(key), found.get(key)
            row = {"notebook": name, "verdict": key, "golden": g, "new": v}
            if g is None or v is None:
                rows.append({**row, "within": False, "what": "new verdict" if g is None else "verdict missing"})
                continue
            moved = "value" in g and _moved(v["measured"], g["value"])
            ok = within(v["measured"], g) and v["outcome"] == g.get("outcome")
            control_moved = False
            if v.get("controls") and "control" in g:
                c = v["controls"][0]["value"]
                control_moved = _moved(c, g["control"]["value"])
                ok &= within(c, g["control"])
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
