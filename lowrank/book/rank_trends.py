"""Part II's rank-trend verdicts, shared by the batch-size, learning-rate and weight-decay pages: the
regime (the accumulated weight decay, computed before training) and the pooled trend claim with its
two negative controls (the same grid without weight decay; shuffled hyperparameter labels).
"""

from __future__ import annotations

import math

import pandas as pd

from lowrank.book import verdicts
from lowrank.sgd import ranks

__all__ = ["decay_regime", "pooled_trend_claim"]


def decay_regime(regime: pd.DataFrame, *, needed: float, origin: str, what: str = "") -> verdicts.Regime:
    """The `Regime` of a rank trend: the largest accumulated weight decay `A` over the runs of
    `regime` (`lowrank.sgd.ranks.regime_table`, computed before training) with weight decay, i.e. the
    grid point where the paper predicts the lowest rank; 0 when no run has weight decay."""
    positive = regime[regime["weight_decay"] > 0]
    value = float(positive["A"].max()) if len(positive) else 0.0
    return verdicts.Regime(f"largest accumulated weight decay A = sum_t mu_t lambda / (1 - beta){what}", value, needed, origin)


def pooled_trend_claim(name: str, *, claim: str, scale: str, final: pd.DataFrame, x: str, slices, sign: int,
                       column: str, min_trend: float, regime: verdicts.Regime, paper: str, description: str,
                       min_train_acc: float, control: pd.DataFrame | None = None, control_name: str = "",
                       permutations: int = 2000, seed: int = 0, details: dict | None = None,
                       latex: str = "") -> verdicts.Verdict:
    """A claim that the final rank (`column`) moves with the hyperparameter `x` in the paper's
    direction (`sign`), measured by `lowrank.sgd.ranks.pooled_trend` over `final` (slices `slices`).

    Controls, judged by the same threshold `min_trend` (an effect size fixed in advance): the same
    statistic on `control` (the same grid trained without weight decay, which removes the
    mechanism; named `control_name`), then the 95th percentile of the statistic under shuffled
    labels. `regime`: `decay_regime`, recorded, and below its need the outcome is "needs a larger scale".
    """
    kw = dict(column=column, slices=slices, sign=sign, permutations=permutations, seed=seed)
    main = ranks.pooled_trend(final, x, **kw)
    controls, extra = [], {}
    if control is not None:
        ctrl = ranks.pooled_trend(control, x, **kw)
        controls.append(verdicts.Control(control_name, ctrl["statistic"] if math.isfinite(ctrl["statistic"]) else -1.0))
        extra = {"control_excluded": ctrl["excluded"], "control_runs": ctrl["total"]}
    controls.append(verdicts.Control("shuffled hyperparameter labels (95th percentile of the same mean)",
                                     main["null_95"] if math.isfinite(main["null_95"]) else -1.0))
    finite = math.isfinite(main["statistic"])
    per_slice = main["per_slice"]
    return verdicts.claim(
        name, claim=claim, scale=scale, measured=main["statistic"] if finite else -1.0,
        threshold=verdicts.Threshold(">=", min_trend, f"effect size fixed in advance: mean signed Spearman rho >= "
                                     f"{min_trend:g} (half-way from no trend to a perfect ordering); paper {paper}"),
        controls=controls, regime=regime,
        expected=f"mean over {main['slices']} slices (seeds x panels) of the signed Spearman rho >= {min_trend:g}",
        excluded=verdicts.Excluded(main["excluded"], main["total"], f"diverged or train accuracy < {min_train_acc:g}"),
        description=description, latex=latex, note="" if finite else "no slice with enough fitted runs: recorded as -1 (no evidence)",
        details={"statistic_range": [-1.0, 1.0], "slices": main["slices"], "dropped_slices": main["dropped_slices"],
                 "p_value": round(main["p_value"], 4) if finite else None,
                 "slice_rho_range": [round(float(per_slice["rho"].min()), 3), round(float(per_slice["rho"].max()), 3)] if len(per_slice) else None,
                 "largest_per_step_decay": round(float(final["per_step"].max()), 6), **extra, **(details or {})})
