"""Summaries of `train_square` histories that the Part III verdicts are computed from.

Each function reads the tidy tables of a `SquareRun` (`history`, one row per logged epoch; `layers`,
one row per logged epoch and layer) and returns plain numbers or a small table.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["NC_CORE", "NC_MEANS", "fitted_runs", "final_mean", "nc_falls", "nc_falls_pooled", "hidden_rank_ratio",
           "rank_update_correlation", "update_norm_decay_exponent"]

NC_CORE = ("nc1", "nc2_equinorm_classifiers", "nc2_equiangular_classifiers", "nc3", "nc4")
NC_MEANS = ("nc2_equinorm_means", "nc2_equiangular_means")


def fitted_runs(histories, fit_error: float) -> list:
    """The histories whose last logged train error is at most `fit_error` (Lemma 7 and Theorem 6 assume a fitted
    training set, l.609), in order; a history without a `train_error` column is not fitted."""
    return [h for h in histories if "train_error" in h.columns and float(h.iloc[-1].train_error) <= fit_error]


def final_mean(histories, column: str) -> float:
    """The mean of `column`'s last logged value over the histories that have the column; NaN when none has it
    (e.g. no run of an arm fits: nothing to measure, never a fallback to other runs)."""
    values = [float(h.iloc[-1][column]) for h in histories if column in h.columns]
    return float(np.mean(values)) if values else math.nan


def nc_falls(history: pd.DataFrame, factor: float, keys=NC_CORE, prefixes=("", "shuffled_")) -> pd.DataFrame:
    """Whether each NC metric falls by `factor` from its first logged value (the initialisation) to its last.

    Parameters
    ----------
    history : one run's history (rows in epoch order), with the metric columns `prefix + key`.
    factor : the fall required, final <= initial / factor (no floor: a metric that starts low must fall too).
    keys : the metric names; prefixes : "" for the true labels, "shuffled_" for the null model.

    Returns
    -------
    DataFrame with one row per (metric, labels): metric, labels ("true" or "shuffled"), initial, final, falls.
    A missing column gives NaN values and `falls = False`.
    """
    first, last = history.iloc[0], history.iloc[-1]
    rows = []
    for key in keys:
        for prefix in prefixes:
            a, b = first.get(prefix + key, np.nan), last.get(prefix + key, np.nan)
            rows.append({"metric": key, "labels": "shuffled" if prefix else "true", "initial": a, "final": b,
                         "falls": bool(b <= a / factor)})
    return pd.DataFrame(rows)


def nc_falls_pooled(histories, factor: float, keys=NC_CORE, prefixes=("", "shuffled_")) -> pd.DataFrame:
    """`nc_falls` on the seed-average: each metric's first and last values are averaged over the runs in
    `histories` (one history per seed, rows in epoch order) before the fall by `factor` is judged, so
    that one seed's metric near the threshold does not decide the outcome."""
    histories = list(histories)
    if not histories:
        raise ValueError("histories must hold at least one run")
    firsts = pd.DataFrame([h.iloc[0] for h in histories])
    lasts = pd.DataFrame([h.iloc[-1] for h in histories])
    numeric = [c for c in firsts.columns if any(c == p + k for k in keys for p in prefixes)]
    pooled = pd.DataFrame([firsts[numeric].astype(float).mean(), lasts[numeric].astype(float).mean()])
    return nc_falls(pooled, factor, keys, prefixes).assign(runs=len(histories))


def _hidden(layers: pd.DataFrame) -> pd.DataFrame:
    return layers[~layers.classifier.astype(bool)]


def hidden_rank_ratio(layers: pd.DataFrame) -> float:
    """Mean over the hidden layers (the classifier left out) of final / initial numerical rank, for one
    run's `layers` table (rows in epoch order)."""
    grp = _hidden(layers).groupby("layer")["rank_spectral"]
    return float((grp.last() / grp.first()).mean())


def rank_update_correlation(layers: pd.DataFrame, reverse: bool = False) -> float:
    """Mean over the hidden layers of the Spearman correlation, over the logged epochs, between the
    numerical rank of `V_k` and its update norm (Eq. 53 relates the two). Layers whose rank never
    changes are skipped (their correlation is undefined); NaN when none is left.

    reverse : pair the ranks with the update norms in reversed time order (the negative control).
    """
    from scipy import stats

    out = []
    for _, g in _hidden(layers).dropna(subset=["update_norm"]).groupby("layer"):
        norms = g.update_norm.to_numpy()[::-1] if reverse else g.update_norm.to_numpy()
        if g["rank_spectral"].nunique() > 1:
            out.append(stats.spearmanr(g["rank_spectral"], norms).statistic)
    return float(np.mean(out)) if out else math.nan


def update_norm_decay_exponent(layers: pd.DataFrame, tail_fraction: float) -> float:
    """How fast one run's summed update norm (over its layers) still falls near convergence: the exponent `a` of
    a power law `t^-a` fitted by least squares to log(summed update norm) against log(epoch) over the logged
    epochs of the last `tail_fraction` of training (`progress >= 1 - tail_fraction`). 0: level; 0.3: still
    falling like t^-0.3. NaN with fewer than three logged epochs there."""
    tail = layers[(layers.progress >= 1 - tail_fraction) & layers.update_norm.notna()]
    summed = tail.groupby("epoch").update_norm.sum().sort_index()
    if len(summed) < 3:
        return math.nan
    slope = np.polyfit(np.log(summed.index.to_numpy(float)), np.log(summed.to_numpy(float)), 1)[0]
    return float(-slope)
