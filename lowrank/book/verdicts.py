"""Verdicts: a measured number set against what a paper states, glued into the notebook.

Two kinds, kept apart in the ledger:

- a **check** must hold whatever the data (an identity, a closed form against autograd, a theorem's
  inequality). Outcome `holds` or `fails`; a failure is a bug. A check may carry negative controls of
  its own: the same statistic for a deliberately wrong version (a smaller budget, a wrong factor), which
  the check should reject. When a control holds too, the check is `loose`: it holds, but at these sizes
  it could catch only gross errors.
- a **claim** is an empirical statement of a paper that could come out either way. It is measured
  beside a negative control: the same statistic for a trivial predictor or null model (a constant
  predictor, shuffled labels, the untrained network, a wrong budget, the reversed ordering), judged
  by the same threshold. Outcomes:
  `agrees` (the claim meets the threshold, no control does), `disagrees` (the claim misses it),
  `uninformative` (the claim meets it but so does a control: not evidence) and `needs a larger scale`
  (the run cannot reach the regime the mechanism needs: a `Regime` computed from the parameters before
  training falls short, whatever the measured number).

A verdict of either kind is `unstable` when its outcome at ci scale depends on the seed or on the CPU's
rounding: `lowrank goldens measure` executes the page over seed offsets and over a second CPU code path
and records every outcome seen; when the ci book is built, a verdict whose recorded outcomes differ
reads "unstable (agrees in k of n)" and keeps this run's own outcome in its details
(`LOWRANK_STABILITY_FROM` names the record; a rerun with other parameters is judged on its own).

Every threshold carries its origin (a number the paper reports, an exponent it states, an effect
size fixed in advance), never the observed value. Runs left out of a statistic (diverged, not
fitted) are counted in the record.

A notebook calls `check(...)` or `claim(...)` once per verdict; each record is glued (myst-nb `glue`)
under its name (the measured value, for `{glue:text}` in prose), under `<name>.control` (a claim's
first control value) and under `verdict.<name>` (the whole record as JSON, read by the ledger and
the golden tests).
"""

from __future__ import annotations

import json
import math
import operator
from dataclasses import asdict, dataclass, field, replace

__all__ = ["Threshold", "Control", "NULL_ALPHA", "null_p_value", "glue", "Excluded", "Regime", "Verdict", "check", "claim", "show", "summary",
           "GLUE_PREFIX", "OUTCOMES", "CHECK_OUTCOMES", "CLAIM_OUTCOMES", "UNSTABLE", "LARGER_SCALE", "STABILITY_ENV",
           "stability_text", "within", "entry_mismatch", "near_threshold", "rerun_stability", "NEAR_SHARE"]

GLUE_PREFIX = "verdict."
UNSTABLE = "unstable"
LARGER_SCALE = "needs a larger scale"
CHECK_OUTCOMES = ("holds", "fails", "loose", UNSTABLE)
CLAIM_OUTCOMES = ("agrees", "disagrees", "uninformative", LARGER_SCALE, UNSTABLE)
OUTCOMES = tuple(dict.fromkeys(CHECK_OUTCOMES + CLAIM_OUTCOMES))
STABILITY_ENV = "LOWRANK_STABILITY_FROM"  # the golden file whose recorded outcomes mark unstable verdicts
_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


@dataclass(frozen=True)
class Threshold:
    """`measured <op> value` (or `low <= measured <= high` for op "between"), and where it comes from.

    origin: e.g. "paper l.83: rank two for nu in [1/4, 1/2)", "Prop. 4.1 exponent",
    "effect size fixed in advance: a 20 % narrowing", "identity (float64 round-off)".
    """

    op: str
    value: float | tuple[float, float]
    origin: str

    def __post_init__(self):
        if self.op not in (*_OPS, "between"):
            raise ValueError(f"op must be one of {sorted(_OPS) + ['between']}, got {self.op!r}")
        if self.op == "between":
            low, high = self.value
            if not (math.isfinite(low) and math.isfinite(high) and low <= high):
                raise ValueError(f"a 'between' threshold needs finite low <= high, got {self.value}")
            object.__setattr__(self, "value", (float(low), float(high)))
        elif not math.isfinite(self.value):
            raise ValueError(f"threshold value must be finite, got {self.value}")
        else:
            object.__setattr__(self, "value", float(self.value))
        if not str(self.origin).strip():
            raise ValueError("a threshold needs its origin (a paper's number, an exponent, an effect size fixed in advance)")

    def met(self, x: float) -> bool:
        """Whether `x` meets the threshold; NaN never does."""
        x = float(x)
        if math.isnan(x):
            return False
        if self.op == "between":
            return self.value[0] <= x <= self.value[1]
        return bool(_OPS[self.op](x, self.value))

    def text(self) -> str:
        if self.op == "between":
            return f"in [{self.value[0]:.4g}, {self.value[1]:.4g}]"
        return f"{self.op} {self.value:.4g}"


@dataclass(frozen=True)
class Control:
    """A negative control: `value` is the claim's statistic for a trivial predictor or null model.

    p_value: for a null distribution (shuffled labels, a permutation, random directions), the share of it
    at least as extreme as the observed score (`null_p_value`). Such a control is judged against the
    observed score, not the threshold: it explains the claim (passes) when `p_value > NULL_ALPHA`, and
    `value` is what is shown for it (e.g. its 95th percentile). Without a p-value the control passes
    when its value meets the claim's threshold.
    """

    name: str
    value: float
    p_value: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "value", float(self.value))
        if self.p_value is not None:
            p = float(self.p_value)
            if not 0 < p <= 1:
                raise ValueError(f"control {self.name}: p_value must be in (0, 1], got {p}")
            object.__setattr__(self, "p_value", p)


NULL_ALPHA = 0.05  # fixed in advance (the conventional level): a null explains a score unless p <= 0.05


def null_p_value(observed: float, null, *, greater: bool = True) -> float:
    """The permutation p-value of `observed` under the draws `null`: (1 + #{null >= observed}) / (1 + n),
    or with <= when `greater` is False (the +1 counts the observed labelling itself, so p > 0)."""
    import numpy as np

    draws = np.asarray(null, float).ravel()
    if draws.size == 0 or not np.all(np.isfinite(draws)):
        raise ValueError("null_p_value needs a non-empty null of finite scores")
    observed = float(observed)
    if math.isnan(observed):
        raise ValueError("null_p_value: the observed score is NaN")
    extreme = draws >= observed if greater else draws <= observed
    return float((1 + int(extreme.sum())) / (1 + draws.size))


@dataclass(frozen=True)
class Excluded:
    """Runs left out of the statistic: `count` of `total`, and why (e.g. "diverged", "train acc at chance")."""

    count: int
    total: int
    reason: str

    def __post_init__(self):
        if not 0 <= self.count <= self.total:
            raise ValueError(f"excluded count must be in [0, total], got {self.count} of {self.total}")


@dataclass(frozen=True)
class Regime:
    """The quantity a claim's mechanism needs, computed from the parameters before any training.

    quantity: what it is, in words (e.g. "accumulated weight decay A = Σₜ μₜ λ / (1 − β)", printed as it is: no ASCII formulas);
    value: its value for this run; needed: the least value at which the mechanism acts; origin: where
    `needed` comes from (a paper's line, a measured onset fixed in advance). A claim whose regime is not
    reached reads "needs a larger scale", whatever it measures.
    """

    quantity: str
    value: float
    needed: float
    origin: str

    def __post_init__(self):
        for attr in ("value", "needed"):
            x = float(getattr(self, attr))
            if not math.isfinite(x):
                raise ValueError(f"regime {attr} must be finite, got {x}")
            object.__setattr__(self, attr, x)
        if not str(self.quantity).strip() or not str(self.origin).strip():
            raise ValueError("a regime needs the quantity in words and the origin of the value it needs")

    @property
    def reached(self) -> bool:
        return self.value >= self.needed

    def text(self) -> str:
        state = "reached" if self.reached else "NOT reached: what it decides needs a larger scale"
        return f"{self.quantity} = {self.value:.4g} (needs at least {self.needed:.4g}; {self.origin}): {state}"


@dataclass(frozen=True)
class Verdict:
    name: str  # identifier, e.g. "identity_residual"
    claim_id: str  # claims-table id (book/claims.yaml), e.g. "I-1"
    kind: str  # "check" or "claim"
    measured: float
    expected: str  # the statement and its threshold, in words
    threshold: dict  # Threshold as a dict: op, value, origin
    outcome: str  # one of OUTCOMES
    scale: str  # "ci" or "paper"
    controls: list = field(default_factory=list)  # [{name, value, passes}]
    excluded: dict | None = None  # {count, total, reason}
    description: str = ""  # plain text (terminal, nbval summary)
    note: str = ""
    details: dict = field(default_factory=dict)
    latex: str = ""  # the description with inline LaTeX ($\\lambda \\|W\\|$), rendered by the book's tables

    @property
    def agrees(self) -> bool:
        """Counted as agreement: a check that holds or a claim that agrees."""
        return self.outcome in ("holds", "agrees")

    def as_dict(self) -> dict:
        return asdict(self)

    def rounded(self, digits: int = 3) -> str:
        """The verdict as one line, stable across reruns: values at round-off level (|m| < 1e-10)
        print as such, since their digits depend on the summation order (thread count)."""
        parts = [f"{self.claim_id} {self.kind} {self.name}: {_round(self.measured, digits)}"]
        parts += [f"control {c['name']}: {_round(c['value'], digits)}" + (f" (p = {c['p_value']:.2g})" if "p_value" in c else "")
                  for c in self.controls]
        return "; ".join(parts) + f" ({self.outcome})"


def _round(x: float, digits: int) -> str:
    if not math.isfinite(x):
        return str(x)
    return "round-off (< 1e-10)" if abs(x) < 1e-10 else f"{x:.{digits}g}"


def _finite(name: str, measured) -> float:
    m = float(measured)
    if not math.isfinite(m):
        raise ValueError(f"verdict {name}: measured value is {m}; a verdict needs a number (too few runs left?)")
    return m


def _controls(name, controls, threshold: Threshold) -> list[dict]:
    controls = [controls] if isinstance(controls, Control) else list(controls or [])
    if not all(isinstance(c, Control) for c in controls):
        raise ValueError(f"verdict {name}: controls must be Control objects")
    return [{"name": c.name, "value": c.value, "passes": threshold.met(c.value)} if c.p_value is None else
            {"name": c.name, "value": c.value, "p_value": c.p_value, "passes": c.p_value > NULL_ALPHA} for c in controls]


def check(name, *, claim_id, measured, threshold: Threshold, expected, scale, controls=(), description="", note="",
          details=None, latex="") -> Verdict:
    """A statement that must hold whatever the data; `threshold.origin` says which identity or theorem.

    controls: optional Control(s), the statistic for a deliberately wrong version the check should
    reject; if the check holds and a control holds too, the outcome is "loose".
    """
    m = _finite(name, measured)
    recorded = _controls(name, controls, threshold)
    outcome = "fails" if not threshold.met(m) else "loose" if any(c["passes"] for c in recorded) else "holds"
    v = Verdict(name, claim_id, "check", m, expected, asdict(threshold), outcome, scale, recorded, None,
                description, note, dict(details or {}), latex)
    return _glue(v)


def claim(name, *, claim_id, measured, threshold: Threshold, controls, expected, scale, excluded: Excluded | None = None,
          regime: Regime | None = None, degenerate: str | None = None, description="", note="", details=None,
          latex="") -> Verdict:
    """An empirical statement of a paper, judged beside its negative control(s) by the same threshold.

    controls: a Control or a list of them (at least one). regime: the quantity the mechanism needs,
    computed before training; when it is not reached the outcome is "needs a larger scale" whatever
    the number (recorded in `details["regime"]` either way; for a claim with no run left, pass the
    planned regime: runs too short to fit are a matter of scale). A claim inside its regime whose
    `excluded` leaves no run (collapsed or diverged), or whose statistic is `degenerate` (the reason, e.g. "no run fitted a slope"; kept in
    `details["degenerate"]`), is "uninformative" whatever the number. Only such an undecided claim may
    go without a control or measure NaN (no run left to measure): the number decides nothing.
    """
    if regime is not None and not isinstance(regime, Regime):
        raise ValueError(f"claim {name}: regime must be a Regime")
    if degenerate is not None and not str(degenerate).strip():
        raise ValueError(f"claim {name}: a degenerate statistic needs its reason")
    details = dict(details or {})
    if regime is not None:
        details["regime"] = {**asdict(regime), "reached": regime.reached}
    if degenerate is not None:
        details["degenerate"] = str(degenerate)
    collapsed = excluded is not None and excluded.count == excluded.total
    if regime is not None and not regime.reached:  # runs too short may also be left out as underfit
        undecided = LARGER_SCALE
    elif collapsed:  # every run left out inside the regime: a longer run would not mend it
        undecided = "uninformative"
    elif degenerate is not None:
        undecided = "uninformative"  # a statistic with no room to move: it measures nothing
    else:
        undecided = None
    m = float(measured) if undecided and math.isnan(float(measured)) else _finite(name, measured)
    recorded = _controls(name, controls, threshold)
    if not recorded and undecided is None:
        raise ValueError(f"claim {name} needs at least one Control (a trivial predictor or null model)")
    if undecided is not None:
        outcome = undecided
    elif not threshold.met(m):
        outcome = "disagrees"
    elif any(c["passes"] for c in recorded):
        outcome = "uninformative"
    else:
        outcome = "agrees"
    v = Verdict(name, claim_id, "claim", m, expected, asdict(threshold), outcome, scale, recorded,
                asdict(excluded) if excluded else None, description, note, details, latex)
    return _glue(v)


def _recorded_outcomes(name: str) -> dict | None:
    """The outcomes `lowrank goldens measure` recorded for verdict `name` ({outcome: runs}), when the ci
    book is being built (STABILITY_ENV names the golden file)."""
    entry = _golden_entry(name)
    return entry.get("outcomes") if entry else None


def _golden_entry(name: str) -> dict | None:
    """Verdict `name`'s golden entry when STABILITY_ENV names the golden file (verdict names are unique
    across notebooks)."""
    import os

    path = os.environ.get(STABILITY_ENV)
    if not path:
        return None
    for block in _golden_blocks(path).values():
        if isinstance(block, dict) and isinstance(block.get(name), dict):
            return block[name]
    return None


_GOLDEN_CACHE: dict = {}


def _golden_blocks(path: str) -> dict:
    """The golden file's blocks, parsed once per (path, mtime): a page records many verdicts."""
    import os

    import yaml

    try:
        key = (path, os.stat(path).st_mtime_ns)
        if key not in _GOLDEN_CACHE:
            _GOLDEN_CACHE.clear()
            _GOLDEN_CACHE[key] = yaml.safe_load(open(path)) or {}
    except (OSError, yaml.YAMLError) as err:
        raise RuntimeError(f"{STABILITY_ENV}={path}: cannot read the recorded outcomes ({err})") from None
    return _GOLDEN_CACHE[key]


def stability_text(outcomes: dict) -> str:
    """"agrees in 2 of 6" (the outcome most often seen first, then the others)."""
    n = sum(outcomes.values())
    return ", ".join(f"{o} in {k} of {n}" for o, k in sorted(outcomes.items(), key=lambda kv: (-kv[1], kv[0])))


def _with_stability(v: Verdict) -> Verdict:
    """At ci scale, a verdict whose recorded outcomes differ over seeds and CPU paths is "unstable"."""
    outcomes = _recorded_outcomes(v.name) if v.scale == "ci" else None
    if not outcomes or len(outcomes) < 2:
        return v
    runs = sum(outcomes.values())
    note = (f"unstable at ci scale: {stability_text(outcomes)} runs (seed offsets and CPU code paths, "
            f"tests/golden_verdicts.yaml); this run: {v.outcome}")
    return replace(v, outcome=UNSTABLE, note=f"{v.note}; {note}" if v.note else note,
                   details={**v.details, "stability": {"outcomes": dict(outcomes), "runs": runs, "this_run": v.outcome}})


NEAR_SHARE = 0.1  # "within 10 % of its threshold" (fixed in advance): such an outcome is rerun with other seeds


def near_threshold(record: dict, share: float = NEAR_SHARE) -> bool:
    """Whether a glued claim's outcome could turn on its seeds: the measured value, or a control that
    decides it, lies within `share` of the threshold (of |value|, or 1 when the threshold is 0; of the
    width for a "between" threshold), or a null's p-value within `share` of NULL_ALPHA. A check, or a
    claim whose regime is not reached (decided before training), never is."""
    thr = record.get("threshold")
    if record.get("kind") != "claim" or record.get("outcome") in (LARGER_SCALE, UNSTABLE) or not thr:
        return False

    def near(x: float) -> bool:
        if not math.isfinite(x):
            return False
        if thr["op"] == "between":
            low, high = thr["value"]
            return min(abs(x - low), abs(x - high)) <= share * (high - low)
        return abs(x - thr["value"]) <= share * (abs(thr["value"]) or 1.0)

    controls = record.get("controls") or []
    return near(float(record["measured"])) or any(
        abs(c["p_value"] - NULL_ALPHA) <= share * NULL_ALPHA if "p_value" in c else near(float(c["value"])) for c in controls)


def rerun_stability(first: dict, again: dict, label: str) -> dict:
    """`first` (a glued record) judged beside the same verdict of a rerun with other seeds (`again`,
    described by `label`): "unstable" when the two outcomes differ, with both in `details["stability"]`
    as the golden measurement records them (the first run's outcome is `this_run`)."""
    outcomes = {first["outcome"]: 1}
    outcomes[again["outcome"]] = outcomes.get(again["outcome"], 0) + 1
    details = {**first.get("details", {}), "rerun": {"label": label, "outcome": again["outcome"], "measured": again["measured"]}}
    if len(outcomes) == 1:
        return {**first, "details": details}
    note = f"unstable: {stability_text(outcomes)} runs (this run and {label})"
    return {**first, "outcome": UNSTABLE, "note": f"{first['note']}; {note}" if first.get("note") else note,
            "details": {**details, "stability": {"outcomes": outcomes, "runs": 2, "this_run": first["outcome"]}}}


def _glue(v: Verdict) -> Verdict:
    v = _with_stability(v)
    text = _JsonText(json.dumps(v.as_dict()))  # fails now, not in the ledger, if details are not JSON-able
    glue(v.name, v.measured, display=False)
    if v.controls:
        glue(f"{v.name}.control", v.controls[0]["value"], display=False)
    glue(GLUE_PREFIX + v.name, text, display=False)
    return v


GLUE_MIME_PREFIX = "application/papermill.record/"  # what myst-nb's {glue} roles read from a cell's outputs


def glue(name: str, value, display: bool = False) -> None:
    """Store `value`'s display data in the running notebook's outputs under `name`, as `myst_nb.glue`
    does (the same output: a raw display of its mimebundle, prefixed when not displayed, with
    `scrapbook` metadata), so the book's `{glue:text}` roles paste it. Outside a kernel it does
    nothing. Written here so that an executed notebook needs IPython, not myst-nb and Sphinx."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return
    from IPython.display import display as ipy_display

    mimebundle, metadata = shell.display_formatter.format(value)
    prefix = "" if display else GLUE_MIME_PREFIX
    metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
    ipy_display({prefix + k: v for k, v in mimebundle.items()}, raw=True, metadata=metadata)


class _JsonText(str):
    """Glued as its text/plain repr, which is the JSON itself (nbformat keeps prefixed mimetypes as text)."""

    def __repr__(self):
        return str(self)


def summary(verdicts, digits: int = 3) -> str:
    """One line per verdict, for nbval to compare between the book's run and a fresh kernel.

    Where the golden record is named (STABILITY_ENV: the ci book, `make reproduce`) and holds the
    verdict, the line says whether the verdict meets its golden entry (outcome, and value within the
    tolerance measured over seeds and CPU paths), so a rerun on another CPU path compares equal exactly
    when it reproduces the record; otherwise the rounded value and outcome (equal on reruns of one path)."""
    lines = []
    for v in verdicts:
        want = _golden_entry(v.name) if v.scale == "ci" else None
        if want is None:
            lines.append(v.rounded(digits))
            continue
        why = entry_mismatch(v.as_dict(), want)
        lines.append(f"{v.claim_id} {v.kind} {v.name}: " + (f"differs from its golden entry: {why}" if why else
                                                          f"{v.outcome}, within its golden tolerance"))
    return "\n".join(lines)


def within(value: float, want: dict) -> bool:
    """`value` meets a golden entry: `value` with `abs` and/or `rel` tolerance, and/or `max` / `min`."""
    if math.isnan(value):  # an undecided claim with no run left: it reproduces when the entry has no number either
        return "value" in want and math.isnan(want["value"]) and "max" not in want and "min" not in want
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


def entry_mismatch(got: dict, want: dict) -> str:
    """Why verdict record `got` does not meet golden entry `want` ("" when it does): the outcome must be
    the recorded one (a stable outcome exactly; an unstable entry's verdict reads "unstable" in the ci
    book), the value within its tolerance unless that tolerance covers the statistic's whole range, and
    the first control within its own."""
    why = []
    if got["outcome"] != want.get("outcome"):
        why.append(f"outcome {got['outcome']}, golden {want.get('outcome')}")
    if not want.get("tolerance_covers_range") and not within(got["measured"], want):
        why.append(f"value {got['measured']:.6g} outside {want.get('value')} +- {want.get('abs', 0)}")
    if got.get("controls"):
        if "control" not in want:
            why.append("the golden entry does not record the first control")
        elif not within(got["controls"][0]["value"], want["control"]):
            why.append(f"control {got['controls'][0]['value']:.6g} outside {want['control']}")
    return "; ".join(why)




def _cell(text) -> str:
    """Table-safe text: a pipe would split a Markdown table cell."""
    return str(text).replace("|", "\\|")


def _outcome_cell(v: Verdict) -> str:
    if v.outcome == UNSTABLE:
        return f"**unstable** ({stability_text(v.details['stability']['outcomes'])})"
    return v.outcome if v.agrees else f"**{v.outcome}**"


def show(verdicts):
    """Display the verdict table that ends every notebook: claims first, then checks."""
    from IPython.display import Markdown, display

    rows = ["| | kind | verdict | measured | control | expects (origin) | outcome |", "|---|---|---|---|---|---|---|"]
    for v in sorted(verdicts, key=lambda v: v.kind != "claim"):
        control = "; ".join(f"{c['name']}: {c['value']:.4g}" + (f" (p = {c['p_value']:.2g})" if "p_value" in c else "")
                            for c in v.controls) or "—"
        thr = v.threshold
        rows.append(f"| {v.claim_id} | {v.kind} | {_cell(v.description or v.name)} | {v.measured:.4g} | {_cell(control)} | "
                    f"{_cell(v.expected)} ({_cell(thr['origin'])}) | {_outcome_cell(v)} |")
    notes = [f"- *{v.name}*: {v.note}" for v in verdicts if v.note]
    notes += [f"- *{v.name}*: {v.excluded['count']} of {v.excluded['total']} runs left out ({v.excluded['reason']})"
              for v in verdicts if v.excluded and v.excluded["count"]]
    scale = ", ".join(sorted({v.scale for v in verdicts}))
    text = f"**Verdict** (scale: {scale})\n\n" + "\n".join(rows) + ("\n\n" + "\n".join(notes) if notes else "")
    display(Markdown(text))
