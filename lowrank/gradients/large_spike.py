"""Theorem 3.2's experiment (the page gradients/large_spike): is the gradient rank one along the spike q
for every activation and every weight matrix, including weights trained on the data?

- `train_on_the_data`: `W_S` followed by a few steps of weight-normalised gradient descent on the
  problem's own `(X, y)` (`train_weight_normalized`), with the step `lr_factor / (gamma_m zeta^2)`
  (Section 3.4's `1 / gamma_m` diverges for a large spike), and whether the run went wrong
  (`loss_diverged`, rows collapsed onto `+-q`);
- `rank_one_draws`: `rank_one_statistics` (Theorem 3.2's statistics of G) for every activation, weight
  matrix and draw, one row each, with the leading spectra and the training losses;
- `configuration_medians`: the median per configuration over the draws kept, with the rank-one and
  Assumption 4 flags.

Draw `k` uses `spiked_problem(..., seed=seed + DRAW_SEED_STRIDE * k)`, so every activation and weight
matrix sees the same data at one draw. `rank_one_draws` runs its independent (activation, weights, draw)
configurations in `workers` processes (`lowrank.core.parallel.map_tasks`); the tables do not depend on it.
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple, Sequence

import numpy as np

from lowrank.core.parallel import map_tasks
from lowrank.core.validation import check_positive
from lowrank.gradients.decomposition import SpikedProblem, spiked_problem
from lowrank.gradients.dynamics import rank_one_statistics, train_weight_normalized, weight_angles

__all__ = [
    "DRAW_SEED_STRIDE",
    "TRAINED",
    "loss_diverged",
    "TrainedWeights",
    "train_on_the_data",
    "RankOneDraws",
    "rank_one_draws",
    "configuration_medians",
]

DRAW_SEED_STRIDE = 10  # draw k uses seed + 10 k (spiked_problem's sub-seeds are seed .. seed + 4)
TRAINED = "trained"  # the weight matrix W_S trained on the data (`train_on_the_data`)


def loss_diverged(losses, *, growth: float = 10.0) -> bool:
    """True when a loss path stops being finite or exceeds `growth` times its first value."""
    losses = np.asarray(losses, dtype=float)
    if losses.ndim != 1 or losses.size == 0:
        raise ValueError("losses must be a non-empty 1-D sequence")
    return bool(not np.isfinite(losses).all() or losses.max() > growth * losses[0])


class TrainedWeights(NamedTuple):
    """What `train_on_the_data` returned."""

    problem: SpikedProblem  # the problem with W replaced by the trained W
    losses: np.ndarray  # the mean loss at steps 0..steps
    angle_deg: float  # mean angle between corresponding rows of W_S and the trained W (degrees)
    diverged: bool  # `loss_diverged(losses)`
    collapsed: bool  # median |w_j^T q| above the collapse threshold: the rows sit on +-q


def train_on_the_data(problem: SpikedProblem, *, steps: int, lr_factor: float,
                      collapse_threshold: float) -> TrainedWeights:
    """Train the problem's W for `steps` full-batch steps on its own data (weight normalisation).

    The step is `lr_factor / (gamma_m zeta^2)`: the curvature along q grows like `gamma_m zeta^2`, so
    Section 3.4's `1 / gamma_m` diverges at a large spike. Rows whose median `|w_j^T q|` exceeds
    `collapse_threshold` (in [0, 1]) count as collapsed onto `+-q`.
    """
    check_positive(lr_factor, "lr_factor")
    if not 0 <= collapse_threshold <= 1:
        raise ValueError(f"collapse_threshold must lie in [0, 1], got {collapse_threshold}")
    D = problem.data
    run = train_weight_normalized(D.X, problem.y, problem.W, problem.a, activation=problem.activation,
                                  gamma=problem.gamma, steps=steps, lr=lr_factor / (problem.gamma * D.zeta**2),
                                  loss=problem.loss, snapshot_steps=[steps], top_k=1)
    W_t = run.W[steps]
    losses = run.trace["loss"].to_numpy()
    return TrainedWeights(problem._replace(W=W_t), losses, weight_angles(problem.W, W_t)["mean_neuron_angle"],
                          loss_diverged(losses), float((W_t @ D.q).abs().median()) > collapse_threshold)


class RankOneDraws(NamedTuple):
    """What `rank_one_draws` recorded."""

    draws: object  # DataFrame: one row per (activation, weights, repeat)
    spectra: dict  # (activation, weights) -> every singular value of G at draw 0 (numpy)
    losses: object  # DataFrame: the loss paths of the trained W, per (activation, repeat, step)


def rank_one_draws(n: int, d: int, m: int, *, alpha: float, nu: float, activations: Sequence[str],
                   weights: Sequence[str], repeats: int, scaling: str = "ntk", loss: str = "mse",
                   target_link: str = "tanh", trained_steps: int = 0, trained_lr_factor: float = 0.25,
                   collapse_threshold: float = 0.9, seed: int = 0, workers: int = 1) -> RankOneDraws:
    """Theorem 3.2's statistics of G for every activation, weight matrix and draw.

    Parameters
    ----------
    n, d, m, alpha, nu, scaling, loss, target_link : of `spiked_problem`. activations : names of
    `ACTIVATIONS`. weights : "isotropic", "orthogonal", "tilted" (`weight_structure`) or "trained"
    (`TRAINED`: isotropic rows trained by `train_on_the_data` with `trained_steps`,
    `trained_lr_factor` and `collapse_threshold`). repeats : draws. seed : of draw 0. workers :
    processes for the (activation, weights, draw) configurations (`lowrank.core.parallel.map_tasks`);
    each is seeded by its draw's seed, so the tables do not depend on it.

    Returns
    -------
    `RankOneDraws`: `draws`, with `activation`, `weights`, `repeat`, `rank_one_statistics`' columns
    (`s2_over_s1`, `align_u1_q`, `align_u1_residue`, `EL_over_G`, `S1_over_G`, `mu_median`, ...), and
    `trained_angle_deg`, `diverged`, `collapsed` (0 and False for untrained W); `spectra`, the singular
    values of G at draw 0; `losses`, the training loss paths.
    """
    import pandas as pd

    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    configs = list(itertools.product(activations, weights, range(repeats)))
    done = map_tasks(functools.partial(_draw, n=n, d=d, m=m, alpha=alpha, nu=nu, scaling=scaling, loss=loss,
                                       target_link=target_link, trained_steps=trained_steps,
                                       trained_lr_factor=trained_lr_factor, collapse_threshold=collapse_threshold,
                                       seed=seed), configs, workers, desc="rank-one draws")
    spectra = {(act, w): s for (act, w, _), (_, s, _) in zip(configs, done) if s is not None}
    return RankOneDraws(pd.DataFrame([row for row, _, _ in done]), spectra,
                        pd.DataFrame([step for _, _, steps in done for step in steps],
                                     columns=["activation", "repeat", "step", "loss"]))


def _draw(config, *, n, d, m, alpha, nu, scaling, loss, target_link, trained_steps, trained_lr_factor,
          collapse_threshold, seed) -> tuple[dict, np.ndarray | None, list]:
    act, w, k = config
    problem = spiked_problem(n, d, m, alpha=alpha, nu=nu, activation=act, loss=loss,
                             weights="isotropic" if w == TRAINED else w, scaling=scaling,
                             target_link=target_link, seed=seed + DRAW_SEED_STRIDE * k)
    extra, losses = {"trained_angle_deg": 0.0, "diverged": False, "collapsed": False}, []
    if w == TRAINED:
        trained = train_on_the_data(problem, steps=trained_steps, lr_factor=trained_lr_factor,
                                    collapse_threshold=collapse_threshold)
        losses = [{"activation": act, "repeat": k, "step": t, "loss": v} for t, v in enumerate(trained.losses)]
        extra = {"trained_angle_deg": trained.angle_deg, "diverged": trained.diverged,
                 "collapsed": trained.collapsed}
        problem = trained.problem
    s, stats = rank_one_statistics(problem, spectrum=k == 0)
    return {"activation": act, "weights": w, "repeat": k, **stats, **extra}, (s.numpy() if k == 0 else None), losses


def configuration_medians(draws, *, rank_one_threshold: float, mu_min: float,
                          by: Sequence[str] = ("activation", "weights")):
    """The median per configuration over the draws kept, with Theorem 3.2's flags.

    draws : `RankOneDraws.draws`. Draws whose training diverged or collapsed are left out.
    Returns one row per configuration (in order of first appearance) with the medians of the numeric
    columns, `rank_one` (median `s2/s1 <= rank_one_threshold`) and `assumption4` (median `mu_j >= mu_min`).
    """
    bad = draws["diverged"] | draws["collapsed"]
    table = (draws[~bad].groupby(list(by), sort=False).median(numeric_only=True)
             .drop(columns=["repeat", "diverged", "collapsed"]).reset_index())
    table["assumption4"] = table["mu_median"] >= mu_min
    table["rank_one"] = table["s2_over_s1"] <= rank_one_threshold
    return table
