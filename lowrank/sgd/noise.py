"""Part II, Section 4: with weight decay, SGD converges to zero or never converges (the SGD-noise
proposition). The per-run classification the page reads: collapsed, still moving, or neither.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


__all__ = ["log_slope", "moving_table", "in_regime", "collapse_or_moving_share", "gap_to_lambda0",
           "ratio_trends", "gap_clock"]


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


def ratio_trends(moving: pd.DataFrame) -> pd.DataFrame:
    """How each ratio `gap_to_lambda0` takes moved over the window of `moving_table`: one row per live
    (not collapsed) lambda > 0 run with its `loss`, `weight_decay`, `d_over_zero`, `growth` (the factor by
    which its ratio to the lambda = 0 run of the same loss grew over the window, by the fitted lines:
    that run's `d_fall` over its own) and `log_ratio_slope` (the ratio's log-slope per epoch)."""
    for c in ("weight_decay", "collapsed", "d_fall", "loss", "log_d_slope", "d_over_zero"):
        if c not in moving.columns:
            raise ValueError(f"moving has no column {c!r}")
    zero = moving[moving["weight_decay"] == 0].set_index("loss")
    live = moving[(moving["weight_decay"] > 0) & ~moving["collapsed"]]
    if zero.empty or zero.index.duplicated().any() or not live["loss"].isin(zero.index).all():
        raise ValueError("every live lambda > 0 run needs one lambda = 0 run with its loss")
    return live[["loss", "weight_decay", "d_over_zero"]].assign(
        growth=live["loss"].map(zero["d_fall"]).to_numpy() / live["d_fall"].to_numpy(),
        log_ratio_slope=live["log_d_slope"].to_numpy() - live["loss"].map(zero["log_d_slope"]).to_numpy())


def gap_clock(moving: pd.DataFrame, gap: float, threshold: float) -> dict:
    """The second clock of `gap_to_lambda0`: whether the ratio's trend over the window still runs towards
    the other side of `threshold`, so that a longer run could change the outcome.

    At or above the threshold the agreement is final when no live ratio shrank over the window (`value`
    the smallest `growth`, needing 1); below it the shortfall is final when the ratio of the run that
    sets the gap did not grow (`value` one over its `growth`, needing 1). Otherwise the outcome waits for
    a longer run, and `epochs_to_threshold` says how many more epochs the window's log-linear trend
    takes to reach the threshold (None when it does not run that way). Returns the Regime fields
    (`quantity`, `value`, `needed`, `origin`) and `epochs_to_threshold`; every live run collapsed: ValueError."""
    trends = ratio_trends(moving)
    if trends.empty:
        raise ValueError("no live lambda > 0 run: the gap measures nothing")
    origin = ("a ratio is decided once its trend over the window no longer runs towards the other side of the "
              "threshold (the window and its fitted lines are moving_table's, fixed in advance)")
    setter = trends.loc[trends["d_over_zero"].idxmin()]
    if gap >= threshold:
        slowest = trends.loc[trends["growth"].idxmin()]
        value, quantity, towards = float(slowest["growth"]), (
            "smallest factor by which a live λ > 0 run's ratio to λ = 0 grew over the window (a gap at the "
            "threshold that does not shrink stays there)"), slowest
    else:
        value, quantity, towards = 1.0 / float(setter["growth"]), (
            "factor by which the ratio of the run that sets the gap shrank over the window (a shortfall that "
            "does not grow stays one)"), setter
    slope, target = float(towards["log_ratio_slope"]), math.log(threshold / float(towards["d_over_zero"]))
    runs_towards = slope != 0 and target / slope > 0
    return {"quantity": quantity, "value": value, "needed": 1.0, "origin": origin,
            "epochs_to_threshold": math.ceil(target / slope) if value < 1.0 and runs_towards else None}
