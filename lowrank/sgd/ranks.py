"""Part II's experiment tables: average rank over layers, final values, and the rank-versus-
hyperparameter trend that the batch-size, learning-rate and weight-decay pages share.

Rank conventions (`convention`): "frobenius" counts the singular values of `M/||M||_F` above `eps`,
which is the paper's definition (its `||.||_2` is the Frobenius norm, l.1034; the rank is counted on
`M/||M||_2` at l.1291) and the authors' code (`matrix_rank(M / ||M||_F, tol=eps)`); "spectral"
counts those of `M/||M||_2` with the spectral norm, an alternative that counts more values.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from lowrank.core.validation import check_choice

__all__ = ["RANK_COLUMNS", "average_rank", "final_values", "rank_tables", "rank_trend", "TrendResult"]

# the per-layer monitor columns of `lowrank.core.train` (averaged or dropped when layers are averaged)
_LAYER_COLUMNS = ("layer", "layer_index", "classifier", "shape", "rank", "rank_frobenius", "stable_rank",
                  "weight_norm", "spectral_norm", "dist", "dist_rel")
RANK_COLUMNS = {"spectral": "rank", "frobenius": "rank_frobenius"}


def average_rank(table: pd.DataFrame, *, convention: str = "spectral", include_classifier: bool = True,
                 by=("run", "epoch"), layers=None) -> pd.DataFrame:
    """Average over layers of the numerical rank, one row per `by` (default run and epoch).

    Parameters
    ----------
    table : the monitor table of `lowrank.core.train.train_ensemble` (one row per run, epoch, layer).
    convention : "spectral" (column `rank`) or "frobenius" (`rank_frobenius`, the paper's and the
        authors' code's).
    include_classifier : whether the final classifier enters the average (the authors' code leaves it out).
    by : the grouping columns.
    layers : optional predicate on a layer name; only the layers it accepts are averaged.

    Returns
    -------
    One row per group with `avg_rank` (mean rank), the means of `stable_rank`, `dist`, `dist_rel`,
    `weight_norm`, and the run's other columns (first value).
    """
    check_choice(convention, "convention", set(RANK_COLUMNS))
    col = RANK_COLUMNS[convention]
    t = table if include_classifier else table[~table["classifier"]]
    if layers is not None:
        t = t[t["layer"].map(layers).astype(bool)]
    if t.empty:
        raise ValueError("no layer left to average (the table is empty or has only the classifier)")
    by = list(by)
    keep = [c for c in t.columns if c not in by and c not in _LAYER_COLUMNS]
    agg = {c: "first" for c in keep}
    agg |= {col: "mean", "stable_rank": "mean", "dist": "mean", "dist_rel": "mean", "weight_norm": "mean"}
    return t.groupby(by, sort=True).agg(agg).reset_index().rename(columns={col: "avg_rank"})


def final_values(table: pd.DataFrame, **kwargs) -> pd.DataFrame:
    """`average_rank` at each run's last measured epoch (keyword arguments as `average_rank`)."""
    avg = average_rank(table, **kwargs)
    return avg.loc[avg.groupby("run")["epoch"].idxmax()].reset_index(drop=True)


def rank_tables(table: pd.DataFrame, *, by=("run", "epoch"), layers=None) -> pd.DataFrame:
    """Both averages side by side: `avg_rank` (Frobenius-normalised, all layers the authors count but
    the classifier, as their code) and `avg_rank_spectral` (spectral-normalised, every layer)."""
    avg = average_rank(table, convention="frobenius", include_classifier=False, by=by, layers=layers)
    alt = average_rank(table, convention="spectral", by=by, layers=layers)
    return avg.merge(alt[list(by) + ["avg_rank"]].rename(columns={"avg_rank": "avg_rank_spectral"}), on=list(by))


class TrendResult(dict):
    """`rank_trend`'s result: `worst` (the least favourable per-group correlation, signed so that the
    paper's direction is positive), `per_group`, `excluded`, `total`, `final` (the runs used)."""


def rank_trend(final: pd.DataFrame, x: str, *, by: str, sign: int, column: str = "avg_rank",
               diverged=(), min_train_acc: float | None = None, min_points: int = 3) -> TrendResult:
    """Spearman correlation of `column` with the hyperparameter `x` within each group of `by`,
    signed by `sign` (+1: the paper says the rank grows with x; -1: it falls), after leaving out the
    runs that diverged (`diverged`: run ids) or whose final train accuracy is below `min_train_acc`.

    Parameters
    ----------
    final : one row per run (e.g. `final_values`), with columns `run`, `x`, `by`, `column`, `train_acc`.
    min_points : groups with fewer runs left give NaN (and do not enter `worst`).

    Returns
    -------
    TrendResult with `worst` = min over groups of `sign * rho` (NaN if no group has enough runs),
    `per_group` {group: signed rho}, `excluded` and `total` run counts, and `final` (the runs kept).
    """
    if sign not in (1, -1):
        raise ValueError(f"sign must be +1 or -1, got {sign!r}")
    bad = final["run"].isin(list(diverged))
    if min_train_acc is not None:
        bad |= ~(final["train_acc"] >= min_train_acc)
    kept = final[~bad]
    per_group = {}
    for key, g in kept.groupby(by):
        if len(g) < min_points or g[column].nunique() < 2 or g[x].nunique() < 2:
            per_group[key] = float("nan")
        else:
            per_group[key] = float(sign * spearmanr(g[x], g[column]).statistic)
    finite = [v for v in per_group.values() if np.isfinite(v)]
    return TrendResult(worst=min(finite) if finite else float("nan"), per_group=per_group,
                       excluded=int(bad.sum()), total=int(len(final)), final=kept)


class RankSweep(dict):
    """`rank_sweep`'s result: `table` (the monitor table), `avg` (`rank_tables` per run and epoch),
    `final` (each run's last epoch), `diverged` ({run: where and why})."""


def summarise(table: pd.DataFrame, *, layers=None) -> RankSweep:
    """`RankSweep` of a monitor table trained here or read from a sweep's `collected.csv`."""
    avg = rank_tables(table, layers=layers)
    final = avg.loc[avg.groupby("run")["epoch"].idxmax()].reset_index(drop=True)
    return RankSweep(table=table, avg=avg, final=final, diverged=dict(table.attrs.get("diverged") or {}))


def rank_sweep(*, model: str, dataset: str, grid, epochs: int, data_root=None, cnn_width: float = 1.0,
               augment: bool = False, layers=None, **train_options) -> RankSweep:
    """Train `grid` (dicts with `batch_size`, `lr`, `weight_decay`, `momentum`, `seed`) of the network
    named `model` on `dataset` (`lowrank.core.train.sweep`, one ensemble per batch size) and summarise it.

    Parameters
    ----------
    model : a paper name ("MLP-BN-10-100", "ResNet-18", ...; `lowrank.core.nets.zoo.for_data`).
    dataset : "digits", "mnist1d", or "mnist" / "cifar10" read from `data_root`
        (default `lowrank.core.datasets.DEFAULT_DATA_ROOT`).
    augment : the paper's training augmentation (`lowrank.core.train.augment_images`), image data only.
    train_options : `lowrank.core.train.TrainConfig` fields (milestones, lr_decay, eps, loss, ...).
    """
    from lowrank.core import datasets, train
    from lowrank.core.nets import zoo

    root = datasets.DEFAULT_DATA_ROOT if data_root is None else data_root
    data = datasets.load(dataset, root=root) if dataset in ("mnist", "cifar10") else datasets.load(dataset)
    make, data = zoo.for_data(model, data, cnn_width=cnn_width)  # digits become 1x8x8 images for conv nets
    augmenter = (lambda x, g: train.augment_images(x, g)) if augment else None
    table = train.sweep(make, data, list(grid), epochs=epochs, augment=augmenter, **train_options)
    return summarise(table, layers=layers)
