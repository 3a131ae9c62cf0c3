"""Part II's experiment tables: average rank over layers, final values, and the rank-versus-
hyperparameter trend that the batch-size, learning-rate and weight-decay pages share.

Rank normalisations (`norm`, as in `core.spectral.numerical_rank`): "frobenius" counts the singular values of `M/||M||_F` above `eps`,
which is the paper's definition (its `||.||_2` is the Frobenius norm, l.1034; the rank is counted on
`M/||M||_2` at l.1291) and the authors' code (`matrix_rank(M / ||M||_F, tol=eps)`); "spectral"
counts those of `M/||M||_2` with the spectral norm, an alternative that counts more values.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from lowrank.core.validation import check_choice

__all__ = ["check_table", "RANK_COLUMNS", "average_rank", "final_values", "rank_tables",
           "accumulated_weight_decay", "regime_from_bound", "per_step_decay", "epochs_to_regime", "experiment_grid", "regime_table",
           "RankExperiment",
           "rank_experiment", "PooledTrend", "pooled_trend", "batch_effect_ratio",
           "authors_layers", "RankSweep", "summarise", "rank_sweep", "rank_bound",
           "spearman_with_permutation_null", "fitting_correlation", "room_to_move", "spearman_null_p", "full_rank"]

# the per-layer monitor columns of `lowrank.core.train` (averaged or dropped when layers are averaged)
_LAYER_COLUMNS = ("layer", "layer_index", "classifier", "shape", "rank_spectral", "rank_frobenius", "stable_rank",
                  "weight_norm", "spectral_norm", "dist", "dist_rel")
RANK_COLUMNS = {"spectral": "rank_spectral", "frobenius": "rank_frobenius"}


def average_rank(table: pd.DataFrame, *, norm: str = "spectral", include_classifier: bool = True,
                 by=("run", "epoch"), layers=None) -> pd.DataFrame:
    """Average over layers of the numerical rank, one row per `by` (default run and epoch).

    Parameters
    ----------
    table : the monitor table of `lowrank.core.train.train_ensemble` (one row per run, epoch, layer).
    norm : "spectral" (column `rank`) or "frobenius" (`rank_frobenius`, the paper's and the
        authors' code's).
    include_classifier : whether the final classifier enters the average (the authors' code leaves it out).
    by : the grouping columns.
    layers : optional predicate on a layer name; only the layers it accepts are averaged.

    Returns
    -------
    One row per group with `avg_rank` (mean rank), the means of `stable_rank`, `dist`, `dist_rel`,
    `weight_norm`, `avg_rank@<eps>` (the mean of each `rank_frobenius@<eps>` column of
    `TrainConfig.extra_eps`, whatever `norm`), and the run's other columns (first value).
    """
    check_choice(norm, "norm", set(RANK_COLUMNS))
    col = RANK_COLUMNS[norm]
    t = table if include_classifier else table[~table["classifier"]]
    if layers is not None:
        t = t[t["layer"].map(layers).astype(bool)]
    if t.empty:
        raise ValueError("no layer left to average (the table is empty or has only the classifier)")
    by = list(by)
    keep = [c for c in t.columns if c not in by and c not in _LAYER_COLUMNS]
    agg = {c: "first" for c in keep}
    agg |= {col: "mean", "stable_rank": "mean", "dist": "mean", "dist_rel": "mean", "weight_norm": "mean"}
    extra = [c for c in t.columns if c.startswith("rank_frobenius@")]  # TrainConfig.extra_eps: Frobenius-normalised
    agg |= {c: "mean" for c in extra}
    out = t.groupby(by, sort=True).agg(agg).reset_index().rename(columns={col: "avg_rank"})
    return out.rename(columns={c: "avg_rank@" + c.split("@")[1] for c in extra})


def final_values(table: pd.DataFrame, **kwargs) -> pd.DataFrame:
    """`average_rank` at each run's last measured epoch (keyword arguments as `average_rank`)."""
    avg = average_rank(table, **kwargs)
    return avg.loc[avg.groupby("run")["epoch"].idxmax()].reset_index(drop=True)


def rank_tables(table: pd.DataFrame, *, by=("run", "epoch"), layers=None) -> pd.DataFrame:
    """Both averages side by side: `avg_rank` (Frobenius-normalised, all layers the authors count but
    the classifier, as their code) and `avg_rank_spectral` (spectral-normalised, every layer)."""
    avg = average_rank(table, norm="frobenius", include_classifier=False, by=by, layers=layers)
    alt = average_rank(table, norm="spectral", by=by, layers=layers)
    return avg.merge(alt[list(by) + ["avg_rank"]].rename(columns={"avg_rank": "avg_rank_spectral"}), on=list(by))


def full_rank(table: pd.DataFrame, *, layers=None) -> pd.Series:
    """Per run: the largest value `rank_tables`' `avg_rank` can take, the mean over the averaged weight
    matrices (the classifier left out; `layers` as `average_rank`) of `min(rows, columns)` read from the
    monitor table's `shape` column ("rows x columns")."""
    t = table[~table["classifier"]]
    if layers is not None:
        t = t[t["layer"].map(layers).astype(bool)]
    if t.empty:
        raise ValueError("no layer left to count (the table is empty or has only the classifier)")
    t = t.drop_duplicates(["run", "layer"])
    sides = t["shape"].astype(str).str.split("x", expand=True).astype(int)
    return t.assign(full=sides.min(axis=1)).groupby("run")["full"].mean().rename("full_rank")


def authors_layers(name: str) -> bool:
    """Whether the authors' average counts the layer `name`: every weight matrix but ResNet-18's 1x1
    shortcut convolutions (their ResNet code averages the 3x3 convolutions and linear layers)."""
    return "shortcut" not in name


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
               vit_dim: int = 512, vit_depth: int = 6, augment: bool = False, rotation: str = "uniform", layers=None,
               **train_options) -> RankSweep:
    """Train `grid` (dicts with `batch_size`, `lr`, `weight_decay`, `momentum`, `seed`) of the network
    named `model` on `dataset` (`lowrank.core.train.sweep`, one ensemble per batch size) and summarise it.

    Parameters
    ----------
    model : a paper name ("MLP-BN-10-100", "ResNet-18", ...; `lowrank.core.nets.zoo.for_data`).
    dataset : "digits", "mnist1d", or "mnist" / "cifar10" read from `data_root`
        (default `lowrank.core.datasets.DEFAULT_DATA_ROOT`).
    cnn_width, vit_dim, vit_depth : the sizes of the image networks (`lowrank.core.nets.zoo.for_data`).
    augment : the paper's training augmentation (`lowrank.core.train.augment_images`), image data only.
    rotation : its rotation: "uniform" within +-15 degrees (the authors' code), "multiples" of 15
        degrees (a literal reading of the paper's text, l.1290) or "none".
    train_options : `lowrank.core.train.TrainConfig` fields (milestones, lr_decay, eps, loss, ...).
    """
    from lowrank.core import datasets, train
    from lowrank.core.nets import zoo

    root = datasets.DEFAULT_DATA_ROOT if data_root is None else data_root
    data = datasets.load(dataset, root=root) if dataset in ("mnist", "cifar10") else datasets.load(dataset)
    make, data = zoo.for_data(model, data, cnn_width=cnn_width, vit_dim=vit_dim, vit_depth=vit_depth)  # digits become 1x8x8 images for conv nets
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
    rho, null = _spearman_null(x, y, seed=seed, permutations=permutations)
    return rho, float(np.nanpercentile(null, 5))


def _spearman_null(x, y, *, seed: int, permutations: int) -> tuple[float, np.ndarray]:
    """Spearman's rho of `x` and `y` and its values with `x` shuffled `permutations` times."""
    rng = np.random.default_rng(seed)
    null = np.array([spearmanr(rng.permutation(x), y).statistic for _ in range(permutations)], float)
    return float(spearmanr(x, y).statistic), null


def spearman_null_p(x, y, *, seed: int = 0, permutations: int = 1000) -> float:
    """The one-sided permutation p-value of a negative Spearman rho of `x` and `y`: the share
    `(1 + #{null <= rho}) / (1 + permutations)` of the shuffled-`x` null (the same shuffles as
    `spearman_with_permutation_null`) at or below the observed rho. Fewer than 3 points or a constant
    input: 1 (no evidence)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.unique(x).size < 2 or np.unique(y).size < 2:
        return 1.0
    rho, null = _spearman_null(x, y, seed=seed, permutations=permutations)
    return float((1 + np.sum(null <= rho + 1e-12)) / (1 + len(null)))


def fitting_correlation(final: pd.DataFrame, *, fit_threshold: float, column: str = "avg_rank", seed: int = 0,
                        diverged=()) -> dict:
    """The generalisation hypothesis's statistic (figures gen_1, gen_2): over the runs that fit the
    training set (final `train_acc` >= `fit_threshold`, not in `diverged`), Spearman's rho of
    `column` (the final average rank) and `test_acc`, with the 5th percentile of its permutation null
    (`spearman_with_permutation_null`) and the observed rho's p-value in that null (`spearman_null_p`).

    Returns a dict: `rho`, `null_5`, `null_p`, `rho_all` (every run not diverged), `fitting` and `runs` (counts,
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
    null_p = spearman_null_p(fit[column], fit["test_acc"], seed=seed)
    rho_all = spearman_with_permutation_null(kept[column], kept["test_acc"], seed=seed)[0]
    return {"rho": rho, "null_5": null_5, "null_p": null_p, "rho_all": rho_all, "fitting": int(len(fit)),
            "runs": int(len(final) + len(set(diverged) - set(final["run"]))),
            "test_acc_range": [float(fit["test_acc"].min()), float(fit["test_acc"].max())] if len(fit) else None}


def room_to_move(fit: pd.DataFrame, *, by: str, columns=("avg_rank", "test_acc")) -> dict:
    """Whether a correlation over the runs `fit` has room to move (issue 44): for each of `columns`, the
    spread the hyperparameter `by` makes (`between`: the range of the per-`by` means) against the spread
    the seeds make at one setting (`within`: the mean over the `by` values with at least two runs of
    their range). A column whose `between` is not larger than `within` moves no more across the grid
    than across seeds, so its rank order is seed noise. Returns {column: {"between", "within"}}, `room`
    (True when every column has `between > within`) and `reason` (None, or why not, in words); fewer
    than two `by` values, or no `by` value with two runs (no seed spread to compare with), has no room."""
    for c in (by, *columns):
        if c not in fit.columns:
            raise ValueError(f"fit has no column {c!r}")
    out, reasons = {}, []
    groups = fit.groupby(by)
    if groups.ngroups < 2:
        return {"room": False, "reason": f"fewer than two values of {by} among the runs"}
    for c in columns:
        means = groups[c].mean()
        ranges = [float(g.max() - g.min()) for _, g in groups[c] if len(g) >= 2]
        between = float(means.max() - means.min())
        within = float(np.mean(ranges)) if ranges else float("nan")
        out[c] = {"between": round(between, 6), "within": None if not ranges else round(within, 6)}
        if not ranges:
            reasons.append(f"no value of {by} has two runs: no seed spread of {c} to compare with")
        elif not between > within:
            reasons.append(f"{c} spans {between:.4g} across {by} (range of its means), no more than the seeds' "
                           f"{within:.4g} at one {by} (mean range)")
    return {**out, "room": not reasons, "reason": "; ".join(reasons) or None}


# --- the rank-versus-hyperparameter experiment shared by the batch-size, learning-rate and weight-decay pages


def accumulated_weight_decay(*, lr: float, weight_decay: float, momentum: float, batch_size: int, n_train: int,
                             epochs: int, milestones=(), lr_decay: float = 0.1) -> float:
    """The accumulated weight decay of a run, `A = sum over steps t of mu_t lambda / (1 - beta)`, computed
    from its settings before training.

    `lambda` is PyTorch's coupled `weight_decay` (each plain step multiplies W by `1 - mu lambda`, the
    paper's `1 - 2 mu lambda` with its `lambda = weight_decay / 2`); with momentum `beta` the decay term
    accumulates in the buffer, so a steady step shrinks W by `mu lambda / (1 - beta)`. `mu_t` follows
    `lowrank.core.train.lr_at` (milestones), with `floor(n_train / batch_size)` steps per epoch (the
    last incomplete batch is dropped). `exp(-A)` is the share of the initial weights still left
    after training when the gradients are ignored: A of a few units erases the initialisation.
    """
    from lowrank.core.train import lr_at

    for name, v in (("batch_size", batch_size), ("n_train", n_train), ("epochs", epochs)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not lr > 0 or not weight_decay >= 0 or not 0 <= momentum < 1:
        raise ValueError(f"need lr > 0, weight_decay >= 0 and momentum in [0, 1), got {lr}, {weight_decay}, {momentum}")
    if batch_size > n_train:
        raise ValueError(f"batch_size {batch_size} exceeds n_train {n_train}")
    steps = n_train // batch_size
    lr_sum = sum(steps * lr_at(lr, e, milestones, lr_decay) for e in range(1, epochs + 1))
    return float(lr_sum * weight_decay / (1 - momentum))


def regime_from_bound(eps: float) -> float:
    """The accumulated weight decay at which Theorem 3.2's bound reaches the rank threshold `eps`:
    `A = ln(1/eps)`. The bound (paper l.1143-1144) puts W within `(1 - 2 mu lambda)^k` of a matrix of
    rank at most `N B k`, so the rank counted at `eps` is bounded once `(1 - 2 mu lambda)^k <= eps`,
    i.e. after `k = ln(1/eps) / (2 mu lambda)` steps (its `N B log(1/eps) / (2 mu lambda)`): an
    accumulated `2 mu lambda k` (`A` in PyTorch's coupled `weight_decay = 2 lambda`) of `ln(1/eps)`,
    6.9 at eps = 1e-3 and 4.6 at 1e-2. A regime from the theorem, not from a measured onset."""
    if not 0 < eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {eps}")
    return float(np.log(1.0 / eps))


def epochs_to_regime(grid, *, n_train: int, target: float, slices, milestones=(), lr_decay: float = 0.1,
                     max_epochs: int = 1_000_000) -> pd.DataFrame:
    """The run length each slice of a rank page needs to reach its regime, computed before training.

    A slice is a group of the run dicts of `grid` (`experiment_grid`) with equal `slices` values (e.g.
    `["momentum", "batch_size"]`: one verdict's statistic within one batch size); it reaches the regime
    when the largest accumulated weight decay (`accumulated_weight_decay`) over its runs with weight
    decay, the grid point where the paper predicts the lowest rank, is at least `target`.

    Returns one row per slice (sorted by `slices`): its `slices` values, `epochs` (the smallest run
    length reaching `target`; 0 when no run of the slice has weight decay, which no length can
    reach: `reachable` is False) and `A` (the accumulated weight decay at that length). `A` grows
    with the run length, so the search is a closed form past the last milestone (a constant rate).
    A slice that needs more than `max_epochs` raises ValueError.
    """
    if not target > 0:
        raise ValueError(f"target must be positive, got {target}")
    slices = [slices] if isinstance(slices, str) else list(slices)
    grid = list(grid)
    if not grid:
        raise ValueError("grid is empty")
    for key in slices + ["batch_size", "lr", "weight_decay", "momentum"]:
        missing = [g for g in grid if key not in g]
        if missing:
            raise ValueError(f"a run of grid has no {key!r}: {missing[0]}")
    last = max(milestones, default=0)

    def accumulated(kw: dict, epochs: int) -> float:
        """A after `epochs`: summed up to the last milestone, a constant amount per epoch after it."""
        head = accumulated_weight_decay(**kw, epochs=min(epochs, last)) if last else 0.0
        if epochs <= last:
            return head
        per_epoch = accumulated_weight_decay(**kw, epochs=last + 1) - (accumulated_weight_decay(**kw, epochs=last) if last else 0.0)
        return head + (epochs - last) * per_epoch

    rows = []
    for key, runs in pd.DataFrame(grid).groupby(slices, sort=True):
        decayed = [dict(lr=g["lr"], weight_decay=g["weight_decay"], momentum=g["momentum"], batch_size=int(g["batch_size"]),
                        n_train=n_train, milestones=milestones, lr_decay=lr_decay)
                   for g in runs[runs["weight_decay"] > 0].to_dict("records")]
        named = dict(zip(slices, key if isinstance(key, tuple) else (key,)))
        best = None
        for kw in decayed:
            if last and accumulated(kw, last) >= target:  # reached before the last milestone: the first epoch that does
                epochs = next(e for e in range(1, last + 1) if accumulated(kw, e) >= target)
            else:  # each epoch after the last milestone adds the same amount
                per_epoch = accumulated(kw, last + 1) - accumulated(kw, last)
                epochs = last + max(1, int(np.ceil((target - accumulated(kw, last)) / per_epoch - 1e-12)))
                if epochs > max_epochs:
                    raise ValueError(f"slice {named} needs {epochs} epochs to reach A = {target:g}, more than "
                                     f"max_epochs = {max_epochs}")
                while accumulated(kw, epochs) < target:  # rounding of the closed form
                    epochs += 1
            best = epochs if best is None else min(best, epochs)
        A = max(accumulated(kw, best) for kw in decayed) if best is not None else 0.0
        rows.append({**named, "epochs": best or 0, "A": A, "reachable": best is not None})
    return pd.DataFrame(rows)


def per_step_decay(*, lr: float, weight_decay: float, momentum: float) -> float:
    """`mu lambda / (1 - beta)`: the share of W that weight decay removes per steady step, which sets
    the level the rank settles at (the accumulated `A` says whether it gets there)."""
    if not lr > 0 or not weight_decay >= 0 or not 0 <= momentum < 1:
        raise ValueError(f"need lr > 0, weight_decay >= 0 and momentum in [0, 1), got {lr}, {weight_decay}, {momentum}")
    return float(lr * weight_decay / (1 - momentum))


def experiment_grid(*, batch_sizes, lrs, weight_decays, momenta, seeds) -> list[dict]:
    """Every combination of the five lists, as run dicts (`batch_size`, `lr`, `weight_decay`,
    `momentum`, `seed`) for `rank_experiment`, in that nesting order."""
    import itertools

    lists = {"batch_size": batch_sizes, "lr": lrs, "weight_decay": weight_decays, "momentum": momenta, "seed": seeds}
    for name, v in lists.items():
        if len(list(v)) == 0:
            raise ValueError(f"{name} is empty")
    return [dict(zip(lists, combo)) for combo in itertools.product(*(list(v) for v in lists.values()))]


def regime_table(grid, *, n_train: int, epochs: int, milestones=(), lr_decay: float = 0.1) -> pd.DataFrame:
    """One row per run dict of `grid` (with `batch_size`, `lr`, `weight_decay`, `momentum`): its settings,
    `A` (`accumulated_weight_decay`) and `per_step` (`per_step_decay`). Computed before training."""
    rows = []
    for g in grid:
        kw = dict(lr=g["lr"], weight_decay=g["weight_decay"], momentum=g["momentum"])
        rows.append({**g, "A": accumulated_weight_decay(**kw, batch_size=g["batch_size"], n_train=n_train,
                                                         epochs=epochs, milestones=milestones, lr_decay=lr_decay),
                     "per_step": per_step_decay(**kw)})
    return pd.DataFrame(rows)


class RankExperiment(dict):
    """`rank_experiment`'s result: `table` (monitor table), `avg` (`rank_tables` per run and epoch, with
    `avg_rank@<coarse_eps>`), `final` (each run's last epoch, with `A`, `per_step`, `fitted` and `full_rank`, the
    largest value `avg_rank` can take),
    `diverged` ({run: where and why}), `regime` (`regime_table` of the grid, before training),
    `coarse_column` (the name of the coarse-threshold rank column)."""


def _same(a, b) -> bool:
    """Equal settings: numbers to 9 digits (a CSV's 0.1 is the page's 0.1), lists element by element."""
    import json
    import math

    if isinstance(a, str) and a.startswith("["):
        try:
            a = json.loads(a)
        except ValueError:
            pass
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        a, b = list(a) if isinstance(a, (list, tuple)) else [a], list(b) if isinstance(b, (list, tuple)) else [b]
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (bool, np.bool_)) or isinstance(b, bool):
        return str(a).lower() == str(b).lower()
    if isinstance(a, (int, float, np.number)) and isinstance(b, (int, float, np.number)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return str(a) == str(b)


def check_table(table: pd.DataFrame, *, grid, **settings) -> None:
    """Refuse a monitor table trained elsewhere (`rank_experiment(table=...)`, a sweep's
    `collected.csv`) that does not hold the runs the page's parameters describe: each setting in
    `settings` (model, dataset, epochs, eps, milestones, ...) must be a column of the table holding the
    page's value (a setting it does not record is refused: it cannot be shown to be the page's), each
    run must end at epoch `epochs`, each of its runs must be a point of the page's `grid` (batch size,
    learning rate, weight decay, momentum, and seed where the grid has one), none twice, and each grid
    point a run of the table. ValueError names the first mismatches."""
    if "run" not in table.columns or "epoch" not in table.columns:
        raise ValueError("sweep table: no run and epoch columns; give the collected.csv of a train_point sweep")
    bad = []
    for key, want in settings.items():
        if key not in table.columns:  # a setting the table does not record cannot be shown to be the page's
            bad.append(f"the table records no {key} (the page has {want!r})")
            continue
        have = table[key].dropna().unique()
        wrong = [v for v in have if not _same(v, want)]
        if wrong:
            shown = wrong[0].item() if isinstance(wrong[0], np.generic) else wrong[0]
            bad.append(f"{key} is {shown!r} in the table, {want!r} on the page")
    if "epochs" in settings:
        ends = table.groupby("run")["epoch"].max()
        short = ends[ends != int(settings["epochs"])]
        if len(short):
            bad.append(f"the table's runs end at epoch {int(short.iloc[0])}, the page asks for "
                       f"epochs={settings['epochs']}")
    keys = ["batch_size", "lr", "weight_decay", "momentum"]
    # the configured rate: lr0 where the table has it (its lr is the epoch's, after milestones)
    runs = table.drop(columns=["lr"]).rename(columns={"lr0": "lr"}) if "lr0" in table.columns else table
    asked = [dict(g) for g in grid]
    if asked and all("seed" in g for g in asked):
        keys = keys + ["seed"]
    if set(keys) <= set(runs.columns):
        points = runs.groupby("run")[keys].first().to_dict("records")
        asked = [{k: g[k] for k in keys} for g in asked]

        def found(p, among):
            return any(all(_same(p[k], a[k]) for k in keys) for a in among)

        if "seed" in keys:  # a point (seed included) twice: two sweeps' tables concatenated, twice the runs averaged
            twice = [p for i, p in enumerate(points) if found(p, points[:i])]
            if twice:
                shown = ", ".join(f"{k} {twice[0][k]:g}" for k in keys)
                bad.append(f"{len(twice)} of its {len(points)} runs hold a grid point more than once (first: {shown})")
        extra = [p for p in points if not found(p, asked)]
        if extra:
            shown = ", ".join(f"{k} {extra[0][k]:g}" for k in keys)
            bad.append(f"{len(extra)} of its {len(points)} runs are no point of the page's grid (first: {shown})")
        missing = [a for a in asked if not found(a, points)]
        if missing:
            shown = ", ".join(f"{k} {missing[0][k]:g}" for k in keys)
            bad.append(f"{len(missing)} of the page's {len(asked)} grid points are not in the table (first: {shown})")
    else:
        bad.append(f"no {', '.join(k for k in keys if k not in runs.columns)} column")
    if bad:
        raise ValueError(f"sweep table does not match the page's parameters: {'; '.join(bad[:4])}; give the "
                         f"page the sweep's parameters (-p ...) or the table of a sweep with the page's")


def rank_experiment(*, model: str, dataset: str, grid, epochs: int, eps: float, coarse_eps: float,
                    min_train_acc: float, milestones=(), lr_decay: float = 0.1, data_root=None,
                    cnn_width: float = 1.0, vit_dim: int = 512, vit_depth: int = 6, augment: bool = False,
                    rotation: str = "uniform", table: pd.DataFrame | None = None,
                    regime_only: bool = False, eval_every: int = 1, eval_initial: bool = True) -> RankExperiment:
    """Train every run of `grid` (`experiment_grid`: batch size, lr, weight decay, momentum, seed), one
    batched ensemble per batch size (seeds, learning rates, weight decays and momenta trained
    together), and return the tables the rank-versus-hyperparameter pages read.

    Parameters
    ----------
    eps, coarse_eps : rank thresholds (Frobenius-normalised); `avg_rank` is at `eps`, the column named
        `coarse_column` at `coarse_eps`.
    min_train_acc : a run is `fitted` when it did not diverge and its final train accuracy is at least
        this (fixed in advance; the collapse to the zero function at large mu lambda fails it).
    table : a monitor table trained elsewhere (a sweep's `collected.csv`): read, not trained, after
        `check_table` (its settings are the page's, its runs points of `grid`); the grid is read from it
        (a table without the coarse-threshold ranks gets NaN there).
    regime_only : return only `regime` and `coarse_column`, before (without) any training.
    eval_every, eval_initial : train / test loss and accuracy every `eval_every` epochs, after the last,
        and at initialisation unless `eval_initial` is False (`lowrank.core.train.TrainConfig`); NaN in
        the other epochs' rows. Evaluation reads the networks and changes nothing in training: a page
        that reads only `final` may pass `eval_every=epochs, eval_initial=False`.
    Other arguments as `rank_sweep`.
    """
    from lowrank.core import datasets

    if not 0 < eps < 1 or not 0 < coarse_eps < 1 or coarse_eps == eps:
        raise ValueError(f"eps and coarse_eps must be two different thresholds in (0, 1), got {eps}, {coarse_eps}")
    if not 0 <= min_train_acc <= 1:
        raise ValueError(f"min_train_acc must be in [0, 1], got {min_train_acc}")
    if table is not None:
        check_table(table, grid=grid, model=model, dataset=dataset, epochs=epochs, eps=eps, milestones=list(milestones),
                    lr_decay=lr_decay, augment=augment, rotation=rotation)
        grid = (table.rename(columns={"lr0": "lr"}).groupby("run")[["batch_size", "lr", "weight_decay", "momentum", "seed"]]
                .first().reset_index().to_dict("records"))
    grid = list(grid)
    root = datasets.DEFAULT_DATA_ROOT if data_root is None else data_root
    data = datasets.load(dataset, root=root) if dataset in ("mnist", "cifar10") else datasets.load(dataset)
    regime = regime_table(grid, n_train=int(data.x_train.shape[0]), epochs=epochs, milestones=milestones, lr_decay=lr_decay)
    coarse = f"avg_rank@{coarse_eps:g}"
    if regime_only:
        return RankExperiment(regime=regime, coarse_column=coarse)
    if table is not None:
        result = summarise(table, layers=authors_layers)
        regime.index = [g["run"] for g in grid]
    else:
        result = rank_sweep(model=model, dataset=dataset, data_root=data_root, grid=grid, epochs=epochs, cnn_width=cnn_width,
                            vit_dim=vit_dim, vit_depth=vit_depth, augment=augment, rotation=rotation, milestones=milestones, lr_decay=lr_decay, eps=eps,
                            extra_eps=(coarse_eps,), loss="ce", layers=authors_layers, progress=False, eval_every=eval_every,
                            eval_initial=eval_initial)
    from lowrank.core.train import check_some_run_finite

    check_some_run_finite(result["table"], runs=len(grid))  # "every run diverged", not an empty figure later
    for frame in (result["avg"], result["final"]):
        if coarse not in frame.columns:
            frame[coarse] = np.nan
    final = result["final"].merge(regime[["A", "per_step"]], left_on="run", right_index=True)
    final = final.merge(full_rank(result["table"], layers=authors_layers), left_on="run", right_index=True)
    final["fitted"] = ~final["run"].isin(list(result["diverged"])) & (final["train_acc"] >= min_train_acc)
    return RankExperiment(table=result["table"], avg=result["avg"], final=final, diverged=result["diverged"],
                          regime=regime, coarse_column=coarse)


class PooledTrend(dict):
    """`pooled_trend`'s result: `statistic` (mean over slices of the signed Spearman rho), `null_95`
    (its 95th percentile under shuffled hyperparameter labels), `p_value`, `null` (the mean rho of every
    shuffle), `drop` (the signed fall of the mean rank across the grid) and `null_drop` (the same under
    every shuffle), `per_slice` (DataFrame), `slices` (used), `dropped_slices` (too few fitted runs),
    `excluded` and `total` (runs)."""


def _average_ranks(v: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(v, method="average")


def pooled_trend(final: pd.DataFrame, x: str, *, column: str, slices, sign: int, permutations: int = 2000,
                 seed: int = 0, min_points: int = 3) -> PooledTrend:
    """The rank trend of the three pages, pooled over seeds: Spearman's rho of `column` against the
    hyperparameter `x` within each slice (a group of `slices` columns, e.g. one learning rate and one
    seed), signed by `sign` (+1: the paper says the rank grows with x), averaged over slices. Runs
    with `fitted` False are left out and counted; slices with fewer than `min_points` fitted runs or
    a single value of x are dropped and counted. A slice whose ranks are all equal has rho 0.

    The size beside the order: `drop` is, within each used slice, the mean of `column` at the slice's
    own end of x where the paper predicts the higher rank minus its mean at the slice's other end (its
    smallest and largest fitted x; `sign` +1: mean at the largest x minus mean at the smallest),
    averaged over the slices, in the units of `column`: positive when the rank falls the paper's way.
    A slice that lost its extreme run to exclusion is measured between the ends it kept, never between
    one of its ends and another slice's.

    The regime of each slice: where `final` has the accumulated weight decay `A` (`regime_table`),
    `per_slice["A_max"]` is the largest `A` over the slice's fitted runs with weight decay (0 when none),
    i.e. over the runs that enter the statistic, after exclusions.

    The null: x shuffled within every slice (`permutations` times, generator `seed`), the same mean rho
    and the same drop recomputed for each shuffle (`null`, `null_drop`); `null_95` is the 95th
    percentile of `null` (what shuffled labels reach one time in twenty) and `p_value` the share of
    shuffles at least as large as the statistic (with the statistic counted).
    """
    if sign not in (1, -1):
        raise ValueError(f"sign must be +1 or -1, got {sign!r}")
    if not isinstance(permutations, int) or permutations < 1:
        raise ValueError(f"permutations must be a positive integer, got {permutations!r}")
    slices = [slices] if isinstance(slices, str) else list(slices)
    for c in [x, column, "fitted", *slices]:
        if c not in final.columns:
            raise ValueError(f"final has no column {c!r}")
    kept = final[final["fitted"].astype(bool)]
    rng = np.random.default_rng(seed)
    rows, nulls, used = [], [], []
    for key, g in kept.groupby(slices, sort=True):
        if len(g) < min_points or g[x].nunique() < 2:
            continue
        xs, ys = g[x].to_numpy(float), g[column].to_numpy(float)
        rx, ry = _average_ranks(xs), _average_ranks(ys)
        ry = ry - ry.mean()
        order = rng.permuted(np.tile(np.arange(len(g)), (permutations, 1)), axis=1)  # one shuffle of x per row
        if not np.any(ry):  # every run at the same rank: no trend, under any labels
            rho, null = 0.0, np.zeros(permutations)
        else:
            rho = sign * _pearson(rx, ry)
            null = sign * _pearson(rx[order], ry)
        row = {**dict(zip(slices, key if isinstance(key, tuple) else (key,))), "rho": float(rho), "runs": len(g),
               "x_low": float(xs.min()), "x_high": float(xs.max())}
        if "A" in g.columns:
            decayed = g[g["weight_decay"] > 0] if "weight_decay" in g.columns else g
            row["A_max"] = float(decayed["A"].max()) if len(decayed) else 0.0
        rows.append(row)
        nulls.append(null)
        used.append((xs, ys, order))
    dropped = kept.groupby(slices, sort=True).ngroups - len(rows)
    statistic = float(np.mean([r["rho"] for r in rows])) if rows else float("nan")
    null_mean = np.mean(nulls, axis=0) if nulls else np.full(permutations, np.nan)
    drop, null_drop = _end_to_end_drop(used, sign, permutations)
    return PooledTrend(statistic=statistic, null_95=float(np.percentile(null_mean, 95)) if rows else float("nan"),
                       p_value=float((1 + np.sum(null_mean >= statistic - 1e-12)) / (permutations + 1)) if rows else float("nan"),
                       null=null_mean, drop=drop, null_drop=null_drop,
                       per_slice=pd.DataFrame(rows), slices=len(rows), dropped_slices=dropped,
                       excluded=int((~final["fitted"].astype(bool)).sum()), total=int(len(final)))


def _end_to_end_drop(used, sign: int, permutations: int) -> tuple[float, np.ndarray]:
    """`pooled_trend`'s `drop` over the used slices [(x, y, shuffles)], and the same for each shuffle
    (x permuted within the slice): per slice, the mean of y at the slice's own largest x minus its mean
    at the slice's own smallest x (signed by `sign`), then the mean over slices."""
    if not used:
        return float("nan"), np.full(permutations, np.nan)
    drops, null_drops = [], []
    for xs, ys, order in used:
        low, high = xs.min(), xs.max()
        at_high, at_low = (xs == high).astype(float), (xs == low).astype(float)
        drops.append(at_high @ ys / at_high.sum() - at_low @ ys / at_low.sum())
        shuffled = xs[order]  # (permutations, runs): the slice's x values in shuffled order
        null_drops.append((shuffled == high).astype(float) @ ys / at_high.sum() - (shuffled == low).astype(float) @ ys / at_low.sum())
    return float(sign * np.mean(drops)), sign * np.mean(null_drops, axis=0)


def _pearson(a: np.ndarray, centred_b: np.ndarray) -> np.ndarray | float:
    """Pearson's r of each row of `a` with `centred_b` (already centred); 0 where a row is constant."""
    a = np.asarray(a, float)
    ac = a - a.mean(axis=-1, keepdims=True)
    denom = np.sqrt((ac**2).sum(-1) * (centred_b**2).sum())
    r = (ac * centred_b).sum(-1) / np.where(denom > 0, denom, 1.0)
    return np.where(denom > 0, r, 0.0) if r.ndim else float(r if denom > 0 else 0.0)


def batch_effect_ratio(final: pd.DataFrame, *, column: str = "avg_rank", regime_needed: float | None = None) -> dict:
    """The "little batch-size effect without weight decay" statistic: over the `fitted` runs, the mean
    of `column` per weight decay and batch size (over seeds), its range over the batch sizes per weight
    decay, and `ratio` = the range at weight decay 0 over the largest range at weight decay > 0. A
    weight decay without a fitted run at every batch size gives no range. Needs weight decay 0 and a
    positive one.

    The control puts a positive weight decay in place of 0: the smallest one whose fitted runs all
    reach `regime_needed` (their smallest accumulated weight decay `A`, a column of `final`, at least
    it), so that the control is inside the regime where the paper predicts a batch-size effect; without
    `regime_needed`, or when no positive weight decay reaches it, the smallest positive one. Returned:
    `control_ratio`, `control_weight_decay`, `control_A` (the smallest `A` of its fitted runs; NaN
    without an `A` column), `control_in_regime`, `range_at_zero`, `largest_range`, `smallest_positive`.
    """
    for c in ("weight_decay", "batch_size", "fitted", column):
        if c not in final.columns:
            raise ValueError(f"final has no column {c!r}")
    n_batch = final["batch_size"].nunique()
    fitted = final[final["fitted"].astype(bool)]
    means = fitted.groupby(["weight_decay", "batch_size"])[column].mean()
    spread = means.groupby(level="weight_decay").agg(lambda r: r.max() - r.min() if len(r) == n_batch else np.nan)
    positive = spread[spread.index > 0].dropna()
    if 0.0 not in spread.index or not np.isfinite(spread.get(0.0, np.nan)) or positive.empty:
        raise ValueError("batch_effect_ratio needs fitted runs at weight decay 0 and at a positive one, at every batch size")
    largest = float(positive.max())
    ratio = float(spread[0.0]) / largest if largest > 0 else float("nan")
    least_A = fitted.groupby("weight_decay")["A"].min() if "A" in fitted.columns else pd.Series(np.nan, index=positive.index)
    chosen = positive.index[0]
    in_regime = False
    if regime_needed is not None and "A" in fitted.columns:
        reaching = [wd for wd in positive.index if least_A.get(wd, -np.inf) >= regime_needed]
        if reaching:
            chosen, in_regime = reaching[0], True
    control = float(positive[chosen]) / largest if largest > 0 else float("nan")
    return {"ratio": ratio, "control_ratio": control, "range_at_zero": float(spread[0.0]), "largest_range": largest,
            "smallest_positive": float(positive.index[0]), "control_weight_decay": float(chosen),
            "control_A": float(least_A.get(chosen, np.nan)), "control_in_regime": bool(in_regime)}
