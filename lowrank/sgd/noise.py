"""Part II, Section 4: with weight decay, SGD converges to zero or never converges (the SGD-noise
proposition). The per-run classification the page reads: collapsed, still moving, or neither.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lowrank.core.regimes import furthest_from_done

__all__ = ["log_slope", "moving_table", "in_regime", "collapse_or_moving_share", "gap_to_lambda0", "lambda0_retained",
           "ratio_growing", "gap_regime"]


def log_slope(epochs, values) -> float:
    """Least-squares slope of `log(values)` against `epochs` (per epoch); NaN if a value is not positive."""
    v = np.asarray(values, float)
    e = np.asarray(epochs, float)
    if len(v) < 2 or not (v > 0).all():
        return float("nan")
    return float(np.polyfit(e, np.log(v), 1)[0])


def moving_table(avg: pd.DataFrame, *, collapse_tol: float, settle_factor: float, window_start: float = 0.5) -> pd.DataFrame:
    """One row per run at its last epoch, classified.

    Parameters
    ----------
    avg : per run and epoch (`lowrank.sgd.ranks.average_rank`): `run`, `epoch`, `loss`, `weight_decay`,
        `dist` (d(W_{t+1}, W_t), averaged over layers), `weight_norm`.
    window_start : the slopes of log d and log ||W|| are fitted over the epochs in
        [window_start * t, t], t the run's last epoch (default the second half, [t/2, t]): a window that
        scales with the run, so that a d falling as a power of t falls by the same factor over it at
        any run length (a fixed window of the last few epochs makes a lambda = 0 run "moving" once the
        run is long enough, by construction).
    collapse_tol : a run collapsed when its final weight norm is below this times its initial one.
    settle_factor : a run that did not collapse keeps moving when its d, by the least-squares line
        through log d over the window, falls by less than this factor across it
        (`d_fall`); the same criterion for every run, with or without weight decay, so that a
        lambda = 0 run that has not settled either counts as moving.

    Returns
    -------
    Columns of `avg` at the last epoch plus `window` (its first and last epochs), `norm_ratio`, `log_d_slope`, `log_norm_slope`,
    `d_fall` (the fitted factor by which d fell over the window), `d_over_zero` (final d over the
    lambda = 0 run's with the same loss), `collapsed`, `moving`.
    """
    if not 0 <= window_start < 1:
        raise ValueError(f"window_start must be in [0, 1), got {window_start!r}")
    if not settle_factor > 1:
        raise ValueError(f"settle_factor must be above 1, got {settle_factor}")
    rows = []
    for run, r in avg.sort_values("epoch").groupby("run"):
        tail = r[r["epoch"] >= window_start * r["epoch"].max()]
        if tail["epoch"].nunique() < 2:
            raise ValueError(f"run {run}: fewer than two epochs in the window [{window_start:g} t, t]")
        last = r.iloc[-1].to_dict()
        last["window"] = f"{int(tail['epoch'].min())}-{int(tail['epoch'].max())}"
        last["norm_ratio"] = last["weight_norm"] / r["weight_norm"].iloc[0]
        last["log_d_slope"] = log_slope(tail["epoch"], tail["dist"])
        last["log_norm_slope"] = log_slope(tail["epoch"], tail["weight_norm"])
        last["d_fall"] = float(np.exp(-last["log_d_slope"] * (tail["epoch"].max() - tail["epoch"].min())))
        rows.append(last)
    out = pd.DataFrame(rows)
    zero = out[out["weight_decay"] == 0].set_index("loss")
    if zero.index.duplicated().any() or not set(out["loss"]) <= set(zero.index):
        raise ValueError("moving_table needs exactly one lambda = 0 run per loss")
    out["d_over_zero"] = out["dist"] / out["loss"].map(zero["dist"])
    out["collapsed"] = out["norm_ratio"] < collapse_tol
    out["moving"] = ~out["collapsed"] & (out["d_fall"] < settle_factor)
    return out


def in_regime(moving: pd.DataFrame, *, needed: float) -> tuple[pd.DataFrame, int]:
    """The runs of `moving` that enter the SGD-noise statistics, judged run by run: every lambda = 0 run
    (the control) and the lambda > 0 runs whose accumulated weight decay `A` (a column) reaches
    `needed`; a lambda > 0 run below it has not yet felt its weight decay and is left out. Returns the
    kept rows and the number of lambda > 0 runs left out."""
    for c in ("weight_decay", "A"):
        if c not in moving.columns:
            raise ValueError(f"moving has no column {c!r}")
    keep = (moving["weight_decay"] == 0) | (moving["A"] >= needed)
    return moving[keep], int((~keep).sum())


def collapse_or_moving_share(moving: pd.DataFrame) -> tuple[float, float]:
    """The SGD-noise proposition's statistic on a `moving_table`: the share of lambda > 0 runs that
    collapsed or keep moving, and the same share among the lambda = 0 runs (the negative control)."""
    for c in ("weight_decay", "collapsed", "moving"):
        if c not in moving.columns:
            raise ValueError(f"moving has no column {c!r}")
    pos, zero = moving[moving["weight_decay"] > 0], moving[moving["weight_decay"] == 0]
    if pos.empty or zero.empty:
        raise ValueError("moving needs runs with lambda > 0 and with lambda = 0")
    return float((pos["collapsed"] | pos["moving"]).mean()), float((zero["collapsed"] | zero["moving"]).mean())


def gap_to_lambda0(moving: pd.DataFrame, avg: pd.DataFrame) -> tuple[float, float]:
    """The "orders of magnitude" statistic and its control.

    The smallest ratio, over the lambda > 0 runs of `moving` that did not collapse, of a run's d to
    the d of the lambda = 0 run with the same loss: at the last epoch (`moving["d_over_zero"]`) and
    after the first epoch (read from `avg`, per run and epoch). NaN for both when every lambda > 0
    run collapsed.
    """
    alive = moving[(moving["weight_decay"] > 0) & ~moving["collapsed"]]
    if alive.empty:
        return float("nan"), float("nan")
    first = avg[avg["epoch"] == 1].set_index("run")
    zero_first = first[first["weight_decay"] == 0].set_index("loss")["dist"]
    ratio_first = first.loc[alive["run"], "dist"] / first.loc[alive["run"], "loss"].map(zero_first)
    return float(alive["d_over_zero"].min()), float(ratio_first.min())


def lambda0_retained(moving: pd.DataFrame) -> tuple[float, str]:
    """The regime of the ratio `gap_to_lambda0` reads on its denominator: whether the lambda = 0 run's d
    has settled at its floor (the paper's "almost convergence", l.545), so that the ratio no longer
    grows with the run's length.

    For each lambda = 0 run that is a denominator of the statistic (its loss has a lambda > 0 run that
    did not collapse; every lambda = 0 run when none has), the share of its d kept over the window of
    `moving_table`, d(t) / d(window_start t) by the fitted line: 1 / `d_fall`. Returns the smallest
    share and the loss of that run. It is at least 1 / settle_factor exactly when the run's d fell by
    at most `settle_factor` over the window: the criterion by which `moving_table` calls a run moving
    rather than settling, here asking that the denominator has stopped falling.
    """
    for c in ("weight_decay", "collapsed", "d_fall", "loss"):
        if c not in moving.columns:
            raise ValueError(f"moving has no column {c!r}")
    zero = moving[moving["weight_decay"] == 0]
    if zero.empty:
        raise ValueError("moving needs a lambda = 0 run")
    live = set(moving.loc[(moving["weight_decay"] > 0) & ~moving["collapsed"], "loss"])
    denominators = zero[zero["loss"].isin(live)] if live else zero
    kept = 1.0 / denominators["d_fall"].astype(float)
    i = kept.idxmin()
    return float(kept[i]), str(denominators.loc[i, "loss"])


def ratio_growing(moving: pd.DataFrame) -> bool:
    """Whether every ratio `gap_to_lambda0` takes grew over the window: each live (not collapsed) lambda > 0
    run's d fell by less than the d of the lambda = 0 run with the same loss (`d_fall`, by the fitted line).
    Then a gap that already reaches its threshold stays there while the lambda = 0 run keeps falling, so
    a denominator that has not levelled off blocks only a shortfall ("disagrees"), not an agreement."""
    zero = moving[moving["weight_decay"] == 0].set_index("loss")["d_fall"]
    live = moving[(moving["weight_decay"] > 0) & ~moving["collapsed"]]
    return bool(len(live)) and bool((live["d_fall"].to_numpy() < live["loss"].map(zero).to_numpy()).all())


def gap_regime(moving: pd.DataFrame, gap: float, threshold: float, decay_regime, lambda0_regime):
    """The regime `gap_to_lambda0` is judged by: the lambda > 0 runs' `decay_regime` alone when the gap
    reaches `threshold` and is still growing (`ratio_growing`: longer runs only widen it); otherwise the
    clock furthest from done of it and `lambda0_regime` (`lambda0_retained`'s), since a shortfall says
    "disagrees" only once the denominator has levelled off."""
    if gap >= threshold and ratio_growing(moving):
        return decay_regime
    return furthest_from_done([decay_regime, lambda0_regime])

