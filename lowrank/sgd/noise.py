"""Part II, Section 4: with weight decay, SGD converges to zero or never converges (the SGD-noise
proposition). The per-run classification the page reads: collapsed, still moving, or neither.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


__all__ = ["log_slope", "page_runs", "moving_table", "in_regime", "collapse_or_moving_share", "gap_to_lambda0", "seed_pair_gap",
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


def page_runs(*, lr: float, weight_decays, momentum: float, seed: int, seed_pair: bool) -> list[dict]:
    """SGD noise's runs on one data set (`lowrank.core.train.train_ensemble`'s run dicts): one per lambda at `seed`,
    and with `seed_pair` a second lambda = 0 run at `seed + 1`, the control of `gap_to_lambda0` (`seed_pair_gap`)."""
    runs = [{"lr": lr, "weight_decay": wd, "momentum": momentum, "seed": seed} for wd in weight_decays]
    return runs + [{"lr": lr, "weight_decay": 0.0, "momentum": momentum, "seed": seed + 1}] * seed_pair


def gap_to_lambda0(moving: pd.DataFrame) -> float:
    """The "orders of magnitude" statistic: the smallest ratio, over the lambda > 0 runs of `moving` that did
    not collapse, of a run's d to the d of the lambda = 0 run with the same loss, at the last epoch
    (`moving["d_over_zero"]`). NaN when every lambda > 0 run collapsed."""
    alive = moving[(moving["weight_decay"] > 0) & ~moving["collapsed"]]
    return float(alive["d_over_zero"].min()) if len(alive) else float("nan")


def seed_pair_gap(avg: pd.DataFrame, pair: pd.DataFrame) -> float:
    """The control of `gap_to_lambda0`: how far apart two runs without weight decay end, the larger d over the
    smaller at the last epoch between each lambda = 0 run of `avg` and the run of `pair` with the same loss (another
    seed, lambda = 0), largest over the losses. Both runs lack the mechanism (weight decay keeping d up), so a ratio
    this large is what seeds alone give."""
    def last_d(t, what):
        zero = t[t["weight_decay"] == 0]
        last = zero[zero["epoch"] == zero.groupby("run")["epoch"].transform("max")]
        if last.empty or last["loss"].duplicated().any():
            raise ValueError(f"{what} needs one lambda = 0 run per loss")
        return last.set_index("loss")["dist"]

    a, b = last_d(avg, "avg"), last_d(pair, "pair")
    if set(a.index) != set(b.index):
        raise ValueError(f"avg's losses {sorted(a.index)} and pair's {sorted(b.index)} differ")
    ratio = a / b.reindex(a.index)
    return float(np.maximum(ratio, 1 / ratio).max())


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


def gap_clock(moving: pd.DataFrame, gap: float, threshold: float, *, last_epoch: int, horizon: int,
              window_start: float = 0.5) -> dict | None:
    """The second clock of `gap_to_lambda0`: whether a run as long as `horizon` epochs (the paper's) could
    still move the gap to the other side of `threshold`, at each ratio's trend over the window.

    Each live ratio's trend (`ratio_trends`, the log-slope fitted over [window_start t, t]) is read as a
    power of the epoch, r(T) = r(t) (T / t)^q with q = log(growth) / log(1 / window_start): the slower of
    the two simple readings (a log-linear trend in the epoch would run further). The projected gap at
    `horizon` is the smallest projected ratio (no projection when the run is already as long). At or above
    the threshold the agreement is final when the projected gap stays there (`value` = projected / threshold);
    below it the shortfall is final when it stays below (`value` = threshold / projected); `needed` 1 either
    way. Returns the Regime fields (`quantity`, `value`, `needed`, `origin`), `projected_gap`, and
    `exponents` (q per run); None when no lambda > 0 run is live (the gap measures nothing)."""
    if not 0 < window_start < 1:
        raise ValueError(f"window_start must be in (0, 1), got {window_start!r}")
    if not last_epoch > 0 or not horizon > 0:
        raise ValueError(f"last_epoch and horizon must be positive, got {last_epoch!r}, {horizon!r}")
    trends = ratio_trends(moving)
    if trends.empty:
        return None
    q = np.log(trends["growth"].to_numpy(float)) / math.log(1 / window_start)
    stretch = max(horizon / last_epoch, 1.0)
    projected = float(np.min(trends["d_over_zero"].to_numpy(float) * stretch ** q))
    at = gap >= threshold
    origin = (f"the gap is decided when, at each ratio's trend over the window read as a power of the epoch, a run of "
              f"the paper's {horizon} epochs would leave it on the same side of the threshold (the window and its fitted "
              "lines are moving_table's, fixed in advance)")
    quantity = (f"projected gap at epoch {horizon} over the threshold (an agreement stays)" if at else
                f"threshold over the projected gap at epoch {horizon} (a shortfall stays)")
    return {"quantity": quantity, "value": projected / threshold if at else threshold / max(projected, 1e-300), "needed": 1.0,
            "origin": origin, "projected_gap": projected,
            "exponents": {f"{r.loss}, {r.weight_decay:g}": round(float(e), 4) for r, e in zip(trends.itertuples(), q)}}
