"""Part II's rank-trend verdicts, shared by the batch-size, learning-rate and weight-decay pages: the
regime (the accumulated weight decay: planned before training by `decay_regime`, judged per slice
over the fitted runs by `slice_regime`) and the pooled trend claim, in order (Spearman) and in size (the
mean rank's fall within each slice as a share of full rank), with its two negative controls: the same grid
without weight decay, judged by the same criterion, and shuffled hyperparameter labels, judged by the
permutation p-value of the observed score (`verdicts.null_p_value`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lowrank.book import verdicts
from lowrank.sgd import ranks

__all__ = ["decay_regime", "fitted_decay_regime", "slice_regime", "pooled_trend_claim", "untrained_trend_claim", "combined_score"]


def decay_regime(regime: pd.DataFrame, *, needed: float, origin: str, what: str = "") -> verdicts.Regime:
    """The planned `Regime` of a rank grid, before training: the largest accumulated weight decay `A`
    over the runs of `regime` (`lowrank.sgd.ranks.regime_table`) with weight decay, i.e. the grid point
    where the paper predicts the lowest rank; 0 when no run has weight decay. What a page can reach at
    best; a verdict's own regime is `slice_regime`, over the runs that enter its statistic."""
    positive = regime[regime["weight_decay"] > 0]
    value = float(positive["A"].max()) if len(positive) else 0.0
    return verdicts.Regime(f"largest accumulated weight decay A = Σₜ μₜ λ / (1 − β){what}", value, needed, origin)


def fitted_decay_regime(fitted: pd.DataFrame, planned: pd.DataFrame, *, needed: float, origin: str,
                        what: str = "") -> verdicts.Regime:
    """The `Regime` of a claim over the runs that enter its statistic: `decay_regime` over `fitted` (the
    runs left after exclusions, with `weight_decay` and `A`), so that an excluded run cannot put the claim
    in its regime. When no run is left, `decay_regime` over `planned` (the whole grid), said in the
    quantity: whether longer runs could have reached the regime."""
    if len(fitted):
        return decay_regime(fitted, needed=needed, origin=origin, what=f"{what}, over the fitted runs")
    return decay_regime(planned, needed=needed, origin=origin, what=f"{what}, planned: no run fits")


def slice_regime(per_slice: pd.DataFrame, *, needed: float, origin: str, what: str = "") -> tuple[verdicts.Regime, list]:
    """The `Regime` of a pooled trend over the runs that enter it: `per_slice` is
    `lowrank.sgd.ranks.pooled_trend`'s (one row per used slice, `A_max` the largest accumulated weight
    decay over the slice's fitted runs with weight decay). Its value is the smallest `A_max` over the
    slices (every slice averaged into the statistic must reach the regime); 0 when no slice is used.
    Returns the regime and the per-slice record (slice values and `A_max`, for the verdict's details)."""
    if len(per_slice) and "A_max" not in per_slice.columns:
        raise ValueError("per_slice has no A_max (the final table needs the regime's A column)")
    keys = [c for c in per_slice.columns if c not in ("rho", "runs", "x_low", "x_high", "A_max")]
    record = [{**{k: (v.item() if hasattr(v, "item") else v) for k, v in r[keys].items()}, "A_max": round(float(r["A_max"]), 4),
               "runs": int(r["runs"])} for _, r in per_slice.iterrows()]
    value = float(per_slice["A_max"].min()) if len(per_slice) else 0.0
    return verdicts.Regime(f"smallest over the slices of the largest accumulated weight decay A = Σₜ μₜ λ / (1 − β) "
                           f"of a fitted run{what}", value, needed, origin), record


def combined_score(rho, drop_fraction, *, min_trend: float, min_drop_fraction: float):
    """The trend claims' statistic: `min(rho / min_trend, drop_fraction / min_drop_fraction)`, at least 1
    exactly when the ordering (mean signed Spearman rho) and the size (the mean rank's fall across the
    grid as a share of full rank) both reach their thresholds. Arrays are scored elementwise."""
    if not min_trend > 0 or not min_drop_fraction > 0:
        raise ValueError(f"min_trend and min_drop_fraction must be positive, got {min_trend}, {min_drop_fraction}")
    return np.minimum(np.asarray(rho, float) / min_trend, np.asarray(drop_fraction, float) / min_drop_fraction)


BOUND_ORIGIN = ("Theorem 3.2's bound (paper l.1143-1144): the rank counted at ε is bounded once (1 − 2μλ)ᵏ ≤ ε, "
                "i.e. A ≥ ln(1/ε); the onset measured on MLP-BN-4-64 / digits (A ≈ 5, issue 26) is shown on the page, not used")


def _scored(trend: ranks.PooledTrend, full: float, min_trend: float, min_drop_fraction: float) -> dict:
    score = float(combined_score(trend["statistic"], trend["drop"] / full, min_trend=min_trend, min_drop_fraction=min_drop_fraction))
    null = combined_score(trend["null"], trend["null_drop"] / full, min_trend=min_trend, min_drop_fraction=min_drop_fraction)
    finite = math.isfinite(score) and bool(np.all(np.isfinite(null)))
    return {"score": score,
            "null_95": float(np.percentile(null, 95)) if finite else -1.0,
            "null_p": verdicts.null_p_value(score, null) if finite else None,
            "spearman": trend["statistic"], "spearman_null_95": trend["null_95"], "drop_fraction": trend["drop"] / full}


def pooled_trend_claim(name: str, *, claim_id: str, scale: str, final: pd.DataFrame, x: str, slices, sign: int,
                       column: str, eps: float, min_trend: float, min_drop_fraction: float, paper: str,
                       description: str, min_train_acc: float, control: pd.DataFrame | None = None,
                       control_name: str = "", permutations: int = 2000, seed: int = 0, details: dict | None = None,
                       latex: str = "", what: str = "", regime_needed: float | None = None,
                       regime_origin: str = BOUND_ORIGIN) -> verdicts.Verdict:
    """A claim that the final rank (`column`, counted at threshold `eps`) moves with the hyperparameter
    `x` in the paper's direction (`sign`), in order and in size, measured by
    `lowrank.sgd.ranks.pooled_trend` over `final` (slices `slices`; `final` needs `full_rank`, the
    largest value `column` can take, and `A`, each run's accumulated weight decay).

    The statistic is `combined_score`: at least 1 when the mean signed Spearman rho reaches `min_trend`
    AND the mean rank falls within the slices by at least `min_drop_fraction` of full rank (both effect
    sizes fixed in advance). Controls: `control` (the same grid trained without weight decay, which
    removes the mechanism; named `control_name`), judged by the same threshold; and the shuffled
    hyperparameter labels, judged by the permutation p-value of the observed score (it explains the
    claim when p > `verdicts.NULL_ALPHA`), shown by its 95th percentile.

    The regime: `slice_regime` over the slices and runs that enter the statistic (after exclusions),
    needing `regime_needed` (default `lowrank.sgd.ranks.regime_from_bound(eps)`, ln(1/eps)); below it
    the outcome is "needs a larger scale". Per-slice values are in the details (`slice_regime`). The
    Spearman-only numbers stay in the details and are glued as `<name>.spearman`, `<name>.drop_fraction`,
    `<name>.control_spearman`, `<name>.control_drop_fraction`, with `<name>.null_p` and `<name>.A`.
    """
    if "full_rank" not in final.columns:
        raise ValueError("final has no column 'full_rank' (lowrank.sgd.ranks.rank_experiment adds it)")
    if "A" not in final.columns:
        raise ValueError("final has no column 'A' (lowrank.sgd.ranks.rank_experiment adds it)")
    kw = dict(column=column, slices=slices, sign=sign, permutations=permutations, seed=seed)
    full = float(final["full_rank"].mean())
    main = ranks.pooled_trend(final, x, **kw)
    scored = _scored(main, full, min_trend, min_drop_fraction)
    needed = ranks.regime_from_bound(eps) if regime_needed is None else float(regime_needed)
    regime, per_slice_regime = slice_regime(main["per_slice"], needed=needed, origin=regime_origin, what=what)
    if not len(main["per_slice"]):  # no run fitted: the planned regime says whether longer runs could mend it
        regime = decay_regime(final, needed=needed, origin=regime_origin, what=f"{what}, planned: no slice has fitted runs")
    controls, extra = [], {}
    if control is not None:
        ctrl = _scored(ranks.pooled_trend(control, x, **kw), full, min_trend, min_drop_fraction)
        if math.isfinite(ctrl["score"]):  # a control with no slice left measures nothing: not recorded as failing
            controls.append(verdicts.Control(control_name, ctrl["score"]))
        extra = {"control_spearman": _round(ctrl["spearman"]), "control_drop_fraction": _round(ctrl["drop_fraction"]),
                 "control_excluded": int((~control["fitted"].astype(bool)).sum()), "control_runs": int(len(control))}
    if scored["null_p"] is not None:
        controls.append(verdicts.Control("shuffled hyperparameter labels (95th percentile of the same score; judged by "
                                         "the p-value of the observed score)", scored["null_95"], p_value=scored["null_p"]))
    finite = math.isfinite(main["statistic"])
    per_slice = main["per_slice"]
    bound = min(1 / min_trend, 1 / min_drop_fraction)  # the score's largest value; its smallest is -max(...)
    record = {"spearman": _round(scored["spearman"]), "spearman_null_95": _round(scored["spearman_null_95"]),
              "drop_fraction": _round(scored["drop_fraction"]), "full_rank": round(full, 3),
              "null_p": None if scored["null_p"] is None else round(scored["null_p"], 5), "A": round(regime.value, 4), **extra}
    _glue_numbers(name, record)
    return verdicts.claim(
        name, claim_id=claim_id, scale=scale, measured=scored["score"],
        threshold=_trend_threshold(min_trend, min_drop_fraction, paper), controls=controls, regime=regime,
        expected=_trend_expected(min_trend, min_drop_fraction, main["slices"]),
        excluded=verdicts.Excluded(main["excluded"], main["total"], f"diverged or train accuracy below {min_train_acc:g}"),
        description=description, latex=latex,
        note="" if finite else "no slice with enough fitted runs: nothing measured (NaN), the claim is undecided",
        details={"statistic_range": [-max(1 / min_trend, 1 / min_drop_fraction), bound], **record,
                 "slices": main["slices"], "dropped_slices": main["dropped_slices"],
                 "p_value_spearman": round(main["p_value"], 4) if finite else None,
                 "slice_regime": per_slice_regime, "regime_needed": round(needed, 4),
                 "slice_rho_range": [round(float(per_slice["rho"].min()), 3), round(float(per_slice["rho"].max()), 3)] if len(per_slice) else None,
                 "largest_per_step_decay": round(float(final["per_step"].max()), 6), **(details or {})})


def untrained_trend_claim(name: str, *, claim_id: str, scale: str, planned: verdicts.Regime, min_trend: float,
                          min_drop_fraction: float, paper: str, description: str, latex: str = "",
                          details: dict | None = None) -> verdicts.Verdict:
    """`pooled_trend_claim`'s verdict for a grid left untrained because its `planned` regime (`decay_regime`,
    before training) is not reached: "needs a larger scale", nothing measured (NaN), no control, the same
    threshold. Raises ValueError when `planned` is reached (such a grid must be trained and judged)."""
    if planned.reached:
        raise ValueError(f"claim {name}: its planned regime is reached ({planned.text()}); train it and use pooled_trend_claim")
    return verdicts.claim(
        name, claim_id=claim_id, scale=scale, measured=float("nan"), threshold=_trend_threshold(min_trend, min_drop_fraction, paper),
        controls=[], regime=planned, expected=_trend_expected(min_trend, min_drop_fraction, None),
        description=description, latex=latex, note="not trained: its planned regime is out of reach at this scale",
        details={"trained": False, "regime_needed": round(planned.needed, 4), **(details or {})})


def _trend_threshold(min_trend: float, min_drop_fraction: float, paper: str) -> verdicts.Threshold:
    return verdicts.Threshold(">=", 1.0, rf"effect sizes fixed in advance: mean signed Spearman $\rho \geq {min_trend:g}$ "
                              f"(half-way from no trend to a perfect ordering) and a fall of the mean rank within the "
                              f"slices of at least {min_drop_fraction:g} of full rank (a round size; the size was added after the "
                              f"Spearman-only criterion was seen to be unstable); paper {paper}")


def _trend_expected(min_trend: float, min_drop_fraction: float, slices: int | None) -> str:
    over = "the slices" if slices is None else f"{slices} slices"
    return (rf"$\min(\rho / {min_trend:g},\ \mathrm{{fall}} / ({min_drop_fraction:g} \times \text{{full rank}})) \geq 1$, "
            rf"$\rho$ the mean over {over} of the signed Spearman $\rho$")


def _round(v) -> float | None:
    return round(float(v), 4) if math.isfinite(float(v)) else None


def _glue_numbers(name: str, record: dict) -> None:
    for key in ("spearman", "drop_fraction", "control_spearman", "control_drop_fraction", "null_p", "A"):
        if key in record:
            verdicts.glue(f"{name}.{key}", float("nan") if record[key] is None else record[key], display=False)
