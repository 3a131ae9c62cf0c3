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

__all__ = ["RANK_COLUMNS", "average_rank", "final_values", "rank_tables", "rank_trend", "TrendResult",
           "spearman_critical", "authors_layers", "RankSweep", "summarise", "rank_sweep", "rank_bound",
           "spearman_with_permutation_null", "fitting_correlation"]

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


def spearman_critical(n: int, alpha: float = 0.05) -> float:
    """The smallest Spearman rho whose one-sided exact p-value (the share of the n! orderings with a
    rho at least as large) is at most `alpha`; +inf when even a perfect ordering is not that rare
    (n <= 3 at 5 %). Exact enumeration, for n <= 9."""
    import itertools
    import math

    if not isinstance(n, int) or not 2 <= n <= 9:
        raise ValueError(f"n must be an integer in [2, 9], got {n!r}")
    d = np.arange(n)
    rhos = np.sort([1 - 6 * np.sum((d - np.array(p)) ** 2) / (n * (n * n - 1)) for p in itertools.permutations(d)])[::-1]
    total = math.factorial(n)
    for i, r in enumerate(rhos):
        if np.sum(rhos >= r - 1e-12) / total > alpha:
            return float(rhos[i - 1]) if i else float("inf")
    return float(rhos[-1])


def authors_layers(name: str) -> bool:
    """Whether the authors' average counts the layer `name`: every weight matrix but ResNet-18's 1x1
    shortcut convolutions (their ResNet code averages the 3x3 convolutions and linear layers)."""
    return "shortcut" not in name


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
        if len(g) < min_points or g[x].nunique() < 2:
            per_group[key] = float("nan")
        elif g[column].nunique() < 2:
            per_group[key] = 0.0  # the same rank for every x: no trend
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
    from lowrank.core.train import diverged_runs  # attrs of a table trained here, or its status column

    return RankSweep(table=table, avg=avg, final=final, diverged=diverged_runs(table))


def rank_sweep(*, model: str, dataset: str, grid, epochs: int, data_root=None, cnn_width: float = 1.0,
               augment: bool = False, rotation: str = "uniform", layers=None, **train_options) -> RankSweep:
    """Train `grid` (dicts with `batch_size`, `lr`, `weight_decay`, `momentum`, `seed`) of the network
    named `model` on `dataset` (`lowrank.core.train.sweep`, one ensemble per batch size) and summarise it.

    Parameters
    ----------
    model : a paper name ("MLP-BN-10-100", "ResNet-18", ...; `lowrank.core.nets.zoo.for_data`).
    dataset : "digits", "mnist1d", or "mnist" / "cifar10" read from `data_root`
        (default `lowrank.core.datasets.DEFAULT_DATA_ROOT`).
    augment : the paper's training augmentation (`lowrank.core.train.augment_images`), image data only.
    rotation : its rotation: "uniform" within +-15 degrees (the authors' code), "multiples" of 15
        degrees (a literal reading of the paper's text, l.1290) or "none".
    train_options : `lowrank.core.train.TrainConfig` fields (milestones, lr_decay, eps, loss, ...).
    """
    from lowrank.core import datasets, train
    from lowrank.core.nets import zoo

    root = datasets.DEFAULT_DATA_ROOT if data_root is None else data_root
    data = datasets.load(dataset, root=root) if dataset in ("mnist", "cifar10") else datasets.load(dataset)
    make, data = zoo.for_data(model, data, cnn_width=cnn_width)  # digits become 1x8x8 images for conv nets
    check_choice(rotation, "rotation", train.ROTATIONS)
    augmenter = (lambda x, g: train.augment_images(x, g, rotation=rotation)) if augment else None
    table = train.sweep(make, data, list(grid), epochs=epochs, augment=augmenter, **train_options)
    return summarise(table, layers=layers)


def rank_bound(final: pd.DataFrame, *, eps: float, patches: int = 1, column_lr: str = "lr0") -> pd.DataFrame:
    """Theorem 3.2's bound on the rank of a weight matrix at the end of training (l.1143),
    `N B log(1/eps) / (2 mu lambda)`, for each run of `final` (columns `batch_size`, `lr0`, `weight_decay`).

    The paper's lambda is the coefficient of `lambda ||W||^2`; a run's `weight_decay` (PyTorch's
    coupled decay, the gradient of `weight_decay/2 ||W||^2`) is `2 lambda`, so `2 mu lambda` is
    `lr0 * weight_decay`. Runs without weight decay get an infinite bound. `patches`: N (1 for a
    fully-connected layer). Returns `final` with a column `bound`.
    """
    if not 0 < eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {eps}")
    if not isinstance(patches, int) or patches < 1:
        raise ValueError(f"patches must be a positive integer, got {patches!r}")
    out = final.copy()
    rate = out[column_lr].to_numpy(float) * out["weight_decay"].to_numpy(float)
    with np.errstate(divide="ignore"):
        out["bound"] = np.where(rate > 0, patches * out["batch_size"].to_numpy(float) * np.log(1 / eps) / rate, np.inf)
    return out


def spearman_with_permutation_null(x, y, *, seed: int = 0, permutations: int = 1000) -> tuple[float, float]:
    """Spearman's rho of `x` and `y`, and the 5th percentile of rho when `x` is shuffled (a null model
    for a negative correlation: a trivial predictor reaches this value one time in twenty).
    Fewer than 3 points or a constant input: rho 0 (no trend) and null 0."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.unique(x).size < 2 or np.unique(y).size < 2:
        return 0.0, 0.0
    rng = np.random.default_rng(seed)
    null = [spearmanr(rng.permutation(x), y).statistic for _ in range(permutations)]
    return float(spearmanr(x, y).statistic), float(np.nanpercentile(null, 5))


def fitting_correlation(final: pd.DataFrame, *, fit_threshold: float, column: str = "avg_rank", seed: int = 0,
                        diverged=()) -> dict:
    """The generalisation hypothesis's statistic (figures gen_1, gen_2): over the runs that fit the
    training set (final `train_acc` >= `fit_threshold`, not in `diverged`), Spearman's rho of
    `column` (the final average rank) and `test_acc`, with the 5th percentile of its permutation null
    (`spearman_with_permutation_null`).

    Returns a dict: `rho`, `null_5`, `rho_all` (every run not diverged), `fitting` and `runs` (counts,
    diverged runs included in `runs`), `test_acc_range` ([min, max] over the fitting runs, or None).
    """
    if not 0 <= fit_threshold <= 1:
        raise ValueError(f"fit_threshold must be in [0, 1], got {fit_threshold}")
    for c in (column, "test_acc", "train_acc", "run"):
        if c not in final.columns:
            raise ValueError(f"final has no column {c!r}")
    kept = final[~final["run"].isin(list(diverged))]
    fit = kept[kept["train_acc"] >= fit_threshold]
    rho, null_5 = spearman_with_permutation_null(fit[column], fit["test_acc"], seed=seed)
    rho_all = spearman_with_permutation_null(kept[column], kept["test_acc"], seed=seed)[0]
    return {"rho": rho, "null_5": null_5, "rho_all": rho_all, "fitting": int(len(fit)),
            "runs": int(len(final) + len(set(diverged) - set(final["run"]))),
            "test_acc_range": [float(fit["test_acc"].min()), float(fit["test_acc"].max())] if len(fit) else None}
