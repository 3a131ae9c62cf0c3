"""How the two-layer gradient's spikes scale, and how its direction moves during training.

The helpers of Part I's pages beyond the decomposition itself (`lowrank.gradients.decomposition`):

- scaling (Prop. 4.1): `term_norms` (spectral norms of `S1, S12, S2, E, G`) and `loglog_slope`
  (least-squares exponent of a power law); Assumption 6's statistic and its beta live in
  `lowrank.gradients.rule_of_thumb` (`residue_alignment`, `residue_alignment_beta`);
- ReLU (Prop. 3.1): `sigma_perp` and `sigma_perp_norm`, the centred activation derivatives;
- training (Section 3.4): `gradient_matrix`, `train_weight_normalized` (gradient descent on
  weight-normalised rows with step `1/gamma_m`, recording the gradient's leading left singular
  vectors and their alignment with reference directions at every step; its settings are a
  `DescentConfig`), `scaling_run` (one scaling's run), `scaling_comparison`
  (MF and NTK from one initialisation, with the principal angles between their weights) and
  `initial_alignments` (Fig. 4's alignments of the initial gradient).

Every function works in float64 on the CPU tensors `lowrank.core.data` produces; Section 3.4's two
n x d x m products per step may be taken in float32 (`product_precision`), where a test shows the
page's verdicts unchanged (tests/test_dynamics_precision.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Mapping, NamedTuple

import numpy as np
import torch

from lowrank.core.parallel import check_workers, map_tasks
from lowrank.core.validation import as_tensor, check_choice, check_positive
from lowrank.core.data import generator, single_index_target, spiked_gaussian
from lowrank.gradients.decomposition import Decomposition, decompose_problem, loss_function, spiked_problem
from lowrank.gradients.rule_of_thumb import residue_alignment, residue_alignment_beta
from lowrank.core.nets import activation as get_activation
from lowrank.core.nets import gamma_m, normalize_rows, outer_weights, sphere_rows
from lowrank.core.spectral import (_top_singular_from, alignment, principal_angles, top_singular, top_singular_of_product,
                                   top_singular_value)

__all__ = [
    "SlopeFit",
    "loglog_slope",
    "exponent_fits",
    "term_norms",
    "size_sweep",
    "rank_one_statistics",
    "sigma_perp",
    "sigma_perp_norm",
    "relu_sign_structure",
    "GapInterval",
    "median_gap_interval",
    "gradient_matrix",
    "TrainingRun",
    "DescentConfig",
    "train_weight_normalized",
    "weight_angles",
    "scaling_comparison",
    "scaling_run",
    "initial_alignments",
    "initial_alignments_by_scaling",
    "snapshot_angles",
    "single_index_draw",
    "direction_switch",
    "initial_lead",
    "one_switch_from_residue",
    "random_alignment_quantile",
    "target_direction_share",
    "samples_for_target_share",
    "target_span_share",
    "margin_over_rest",
]


# ----------------------------------------------------------------------------- scaling (Prop. 4.1)


class SlopeFit(NamedTuple):
    """`log y = intercept + slope * log x` fitted by least squares (natural logs)."""

    slope: float
    intercept: float
    stderr: float  # standard error of the slope (nan with two distinct x values)
    points: int


def loglog_slope(x, y) -> SlopeFit:
    """Exponent `p` of `y ~ C x^p`: the least-squares slope of `log y` on `log x`.

    Every `(x_i, y_i)` is one point (repeats at one `x` are all used). Needs positive values and
    at least two distinct `x`.
    """
    x = as_tensor(np.array(x, dtype=float), "x", min_ndim=1).flatten()
    y = as_tensor(np.array(y, dtype=float), "y", min_ndim=1).flatten()
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same number of values, got {x.numel()} and {y.numel()}")
    if (x <= 0).any():
        raise ValueError("x must be positive for a log-log fit")
    if (y <= 0).any():
        raise ValueError("y must be positive for a log-log fit")
    lx, ly = torch.log(x).numpy(), torch.log(y).numpy()
    if np.unique(lx).size < 2:
        raise ValueError("x needs at least two distinct values to fit a slope")
    A = np.stack([lx, np.ones_like(lx)], axis=1)
    (slope, intercept), *_ = np.linalg.lstsq(A, ly, rcond=None)
    k = lx.size
    if k > 2:
        resid = ly - A @ np.array([slope, intercept])
        s2 = float(resid @ resid) / (k - 2)
        stderr = math.sqrt(s2 / float(((lx - lx.mean()) ** 2).sum()))
    else:
        stderr = float("nan")
    return SlopeFit(float(slope), float(intercept), stderr, int(k))


def exponent_fits(table, *, shift: float):
    """Prop. 4.1's fitted and predicted exponents of n, per (nu, activation) group of a size sweep.

    Parameters
    ----------
    table : a DataFrame with one row per (size, repeat) and columns `nu`, `activation`, `n`,
        `residue_alignment`, `r_rms` and `norm_S1`, `norm_S12`, `norm_S2`, `norm_E` (`term_norms`).
    shift : the exponent of `sqrt(m) gamma_m` in n (0 under NTK, -1/2 under MF with m proportional to n).

    Returns
    -------
    DataFrame, one row per (nu, activation, term) with term in S1, S12, S2, E, r: the fitted exponent
    (`loglog_slope` of the norm per unit residue `norm / r_rms`, or of `r_rms` itself for "r"), its
    standard error, Prop. 4.1's prediction (`shift`, `shift + nu - beta/2`, `shift + nu`, NaN for E, 0
    for r), beta fitted as -2 times the slope of `residue_alignment` (Assumption 6) and its standard
    error, the median single-run beta_hat where a `beta_hat` column exists, and the fit's intercept.
    """
    import pandas as pd

    needed = ["nu", "activation", "n", "residue_alignment", "r_rms", "norm_S1", "norm_S12", "norm_S2", "norm_E"]
    missing = [c for c in needed if c not in table]
    if missing:
        raise ValueError(f"table has no column(s) {missing}")
    fits = []
    for (nu, act), grp in table.groupby(["nu", "activation"]):
        beta_fit = loglog_slope(grp["n"], grp["residue_alignment"])
        beta = -2 * beta_fit.slope
        pred = {"S1": shift, "S12": shift + nu - beta / 2, "S2": shift + nu, "E": np.nan, "r": 0.0}
        for term in ["S1", "S12", "S2", "E", "r"]:
            # per unit residue: Prop. 4.1 is conditional on ||r|| = O(sqrt n), and the draw-to-draw scatter
            # of ||r|| / sqrt(n) (the network's random output at init) would otherwise enter every fit
            yv = grp["r_rms"] if term == "r" else grp[f"norm_{term}"] / grp["r_rms"]
            fit = loglog_slope(grp["n"], yv)
            fits.append({"nu": nu, "activation": act, "term": term, "fitted": fit.slope, "stderr": fit.stderr,
                         "predicted": pred[term], "beta_fit": beta, "beta_stderr": beta_fit.stderr,
                         "beta_hat_median": float(grp["beta_hat"].median()) if "beta_hat" in grp else np.nan,
                         "intercept": fit.intercept})
    return pd.DataFrame(fits)


def term_norms(dec: Decomposition, *, data=None) -> dict:
    """Spectral norms of `S1, S12, S2, E` and `G` of one decomposition.

    The three spikes are rank one, so their norms are products of vector norms (exact, no SVD:
    `Decomposition.spike_norms`); `E` and `G` come from their product form (`Decomposition.top`), so a
    decomposition built with `dense=False` does. `r_rms` is
    `||r|| / sqrt(n)`; `data` (a `SpikedData`) adds `residue_alignment` `|z^T r| / (sqrt(n) ||r||)`.
    """
    if not isinstance(dec, Decomposition):
        raise TypeError(f"dec must be a gradients.Decomposition, got {type(dec).__name__}")
    row = {
        **dec.spike_norms(),
        "norm_E": float(dec.top("E").s[0]),
        "norm_G": float(dec.top("G").s[0]),
        "r_rms": float(dec.r.norm()) / math.sqrt(dec.r.shape[0]),
    }
    if data is not None:
        row["residue_alignment"] = residue_alignment(data.z, dec.r)
    return row


SIZE_SEED_STRIDE = 10  # draw k of every size uses seed + 10 k: the same draw index at two sizes shares its seed


def size_sweep(ds, *, n_ratio: float, m_ratio: float, nus, activations, repeats: int, alpha: float = 0.0,
               loss: str = "mse", weights: str = "isotropic", scaling: str = "ntk", target_link: str = "tanh",
               control_nu: float | None = None, control_repeats: int = 0, seed: int = 0, workers: int = 1):
    """Prop. 4.1's size sweep (the page gradients/scaling): `term_norms` of one spiked problem per
    (nu, activation, d, draw), the problem grown in proportion (`n = round(n_ratio d)`, `m = round(m_ratio d)`).

    Parameters
    ----------
    ds : input dimensions. n_ratio, m_ratio : n / d and m / d. nus, activations : the spike sizes and
    activations swept; repeats : draws per (nu, activation, d). alpha, loss, weights, scaling,
    target_link : `decomposition.spiked_problem`'s. control_nu, control_repeats : the control sweep's
    spike size and draws per (activation, d) (none when `control_repeats` is 0). seed : draw k uses
    `seed + 10 k` (`SIZE_SEED_STRIDE`) at every size. workers : processes for the configurations
    (`lowrank.core.parallel.map_tasks`); each configuration is seeded by its own draw index, so the
    table does not depend on it.

    Returns
    -------
    DataFrame, one row per configuration in the order (control, nu, activation, d, repeat), the main
    sweep first: those five, `n`, `m`, the single-run `beta_hat` (`residue_alignment_beta`) and every
    column of `term_norms` (with `residue_alignment`).
    """
    import itertools

    import pandas as pd

    check_workers(workers)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if not isinstance(control_repeats, int) or isinstance(control_repeats, bool) or control_repeats < 0:
        raise ValueError(f"control_repeats must be a non-negative integer, got {control_repeats!r}")
    if control_repeats and control_nu is None:
        raise ValueError("control_nu must be given when control_repeats > 0")
    configs = [(False, *c) for c in itertools.product(nus, activations, ds, range(repeats))]
    configs += [(True, *c) for c in itertools.product([control_nu], activations, ds, range(control_repeats))]
    rows = map_tasks(functools.partial(_size_point, n_ratio=n_ratio, m_ratio=m_ratio, alpha=alpha, loss=loss,
                                       weights=weights, scaling=scaling, target_link=target_link, seed=seed),
                     configs, workers, desc="size sweep")
    return pd.DataFrame(rows)


def _size_point(config, *, n_ratio, m_ratio, alpha, loss, weights, scaling, target_link, seed) -> dict:
    control, nu, act, d, rep = config
    n, m = int(round(n_ratio * d)), int(round(m_ratio * d))
    problem = spiked_problem(n, d, m, alpha=alpha, nu=nu, activation=act, loss=loss, weights=weights,
                             scaling=scaling, target_link=target_link, seed=seed + SIZE_SEED_STRIDE * rep)
    dec = decompose_problem(problem, dense=False)  # norms only: no d x m matrix formed
    return {"control": control, "nu": nu, "activation": act, "d": d, "n": n, "m": m, "repeat": rep,
            "beta_hat": residue_alignment_beta(problem.data.z, dec.r, d), **term_norms(dec, data=problem.data)}


def rank_one_statistics(problem, *, spectrum: bool = False) -> tuple[torch.Tensor, dict]:
    """The statistics of Theorem 3.2's test on one problem's gradient (Fig. 3).

    Parameters
    ----------
    problem : a `SpikedProblem` (`lowrank.gradients.decomposition`).

    Returns
    -------
    `(s, row)`: the singular values of G (all of them with `spectrum=True`, else the top two), and `s2_over_s1` (the relative spectral error of G's best
    rank-one approximation), `align_u1_q` and `align_u1_residue` (|cos| of u1(G) with q and with
    X_B^T r), `EL_over_G` = ||G - S12 - S2||_2 / ||G||_2, `S1_over_G` = ||S1||_2 / ||G||_2, the median
    `mu_j`, `norm_S12_S2` = ||S12 + S2||_2 and `norm_S1` (all dimensionless ratios or gradient units).
    """
    dec = decompose_problem(problem)
    U, s, _ = dec.top("G", 2)
    u1 = U[:, 0]
    norm_S1 = dec.spike_norms()["norm_S1"]
    row = {"s2_over_s1": float(s[1] / s[0]), "align_u1_q": alignment(u1, problem.data.q),
           "align_u1_residue": alignment(u1, problem.data.X_B.T @ dec.r),
           "EL_over_G": top_singular_value(dec.G - dec.S12 - dec.S2) / float(s[0]),
           "S1_over_G": norm_S1 / float(s[0]), "mu_median": float(dec.mu.median()),
           "norm_S12_S2": top_singular_value(dec.S12 + dec.S2), "norm_S1": norm_S1}
    return (torch.linalg.svdvals(dec.G) if spectrum else s), row


# ----------------------------------------------------------------------------- ReLU (Prop. 3.1)


def sigma_perp(X, W, activation: str, mu=None) -> torch.Tensor:
    """`sigma'_perp(X W^T) = sigma'(X W^T) - 1 mu^T` (n x m); `mu` defaults to the column means."""
    X = as_tensor(X, "X", min_ndim=2)
    W = as_tensor(W, "W", min_ndim=2)
    if X.shape[1] != W.shape[1]:
        raise ValueError(f"X has {X.shape[1]} columns but W has {W.shape[1]}: they must agree")
    dsig = get_activation(activation).df(X @ W.T)
    if mu is None:
        mu = dsig.mean(0)
    else:
        mu = as_tensor(mu, "mu", min_ndim=1)
        if mu.shape != (W.shape[0],):
            raise ValueError(f"mu must have shape ({W.shape[0]},), got {tuple(mu.shape)}")
    return dsig - mu[None, :]


def sigma_perp_norm(X, W, activation: str, mu=None) -> float:
    """`||sigma'_perp(X W^T)||_2`; Prop. 3.1 makes it `Theta(n)` for ReLU, Theorem 3.1's proof `o(n)`
    for C^2 activations (when `nu < 1/2` and `||W||_2 = Theta(1)`)."""
    return top_singular_value(sigma_perp(X, W, activation, mu))


def relu_sign_structure(X, W, z, q) -> dict:
    """How close ReLU's `sigma'_perp(X W^T)` is to Prop. 3.1's `(1/2) sign(z) sign(W q)^T`.

    Parameters
    ----------
    X : n x d inputs (`X = X_B + zeta z q^T`); W : m x d weights; z : (n,) spike coefficients;
    q : (d,) spike direction.

    Returns
    -------
    dict: `align_left` = |cos(u1, sign(z))| and `align_right` = |cos(v1, sign(W q))| for the top
    singular pair of `sigma'_perp` (dimensionless, in [0, 1]), and `relative_error` =
    `||sigma'_perp - (1/2) sign(z) sign(Wq)^T||_2 / ||sigma'_perp||_2`.
    """
    sp = sigma_perp(X, W, "relu")
    z = as_tensor(z, "z", min_ndim=1)
    q = as_tensor(q, "q", min_ndim=1)
    if z.shape != (sp.shape[0],) or q.shape != (W.shape[1],):
        raise ValueError(f"z must have {sp.shape[0]} entries and q {W.shape[1]}, got {tuple(z.shape)}, {tuple(q.shape)}")
    sz, sw = torch.sign(z), torch.sign(as_tensor(W, "W") @ q)
    U, s, Vh = top_singular(sp, 1)
    model = 0.5 * torch.outer(sz, sw)
    return {"align_left": alignment(U[:, 0], sz), "align_right": alignment(Vh[0], sw),
            "relative_error": top_singular_value(sp - model) / float(s[0])}


class GapInterval(NamedTuple):
    """`gap = median(target) - min_k median(others_k)` and its percentile bootstrap interval."""

    gap: float
    low: float
    high: float
    draws: int  # bootstrap resamples


def median_gap_interval(groups: Mapping[str, object], target: str, *, level: float = 0.95, draws: int = 2000,
                        seed: int = 0) -> GapInterval:
    """How far the median of group `target` lies below the smallest median of the other groups.

    Parameters
    ----------
    groups : name -> 1-D values (e.g. a statistic over independent draws, one group per activation).
    target : the group compared with the others (at least one other group).
    level : coverage of the percentile bootstrap interval. draws : resamples. seed : of the resampling.

    Returns
    -------
    `GapInterval`: the gap `median(target) - min_{k != target} median(k)` (in the units of the values),
    and the percentile interval of the gap when every group is resampled with replacement
    independently. An interval wholly below 0 says the target's median is the smallest, resolved at
    that level.
    """
    if target not in groups or len(groups) < 2:
        raise ValueError(f"groups must hold {target!r} and at least one other group")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if not isinstance(draws, int) or draws < 10:
        raise ValueError(f"draws must be an integer >= 10, got {draws!r}")
    vals = {k: np.asarray(v, dtype=float).ravel() for k, v in groups.items()}
    if any(v.size == 0 or not np.isfinite(v).all() for v in vals.values()):
        raise ValueError("every group needs at least one finite value")
    others = [k for k in vals if k != target]

    def gap(sample):
        return float(np.median(sample[target]) - min(np.median(sample[k]) for k in others))

    rng = np.random.default_rng(seed)
    boot = [gap({k: v[rng.integers(0, v.size, v.size)] for k, v in vals.items()}) for _ in range(draws)]
    low, high = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return GapInterval(gap(vals), float(low), float(high), draws)


# ----------------------------------------------------------------------------- training (Sec. 3.4)


PRODUCT_PRECISIONS = {"float64": torch.float64, "float32": torch.float32}


def _product(P, Q, precision: str):
    """`P @ Q` computed in `precision` ("float64" or "float32") and returned in float64; an operand
    already in `precision` (`_fixed_operands`) is taken as it is."""
    dtype = PRODUCT_PRECISIONS[precision]
    return (P.to(dtype) @ Q.to(dtype)).to(torch.float64)


def _fixed_operands(X, gamma, precision: str):
    """What the gradient's products take from X at every step: `(X, A, A)` in the products' precision,
    in float64 and in the products' precision again, with `A = (gamma/n) X`; made once per run."""
    dtype = PRODUCT_PRECISIONS[precision]
    A = (gamma / X.shape[0]) * X
    return X.to(dtype), A, A.to(dtype)


def gradient_matrix(X, W, a, y, *, activation: str, gamma: float, loss: str = "mse",
                    product_precision: str = "float64"):
    """`(G, r)`: the transposed gradient `G = (gamma/n) X^T [(r a^T) o sigma'(X W^T)]` (d x m) of
    the mean loss in W, in closed form (Prop. 2.1, lambda = 0), and the residue `r`. Its two n x d x m
    products `X W^T` and `X^T [...]` are taken in `product_precision` ("float64" or "float32"), the
    rest in float64."""
    X = as_tensor(X, "X", min_ndim=2)
    W = as_tensor(W, "W", min_ndim=2)
    a = as_tensor(a, "a", min_ndim=1)
    y = as_tensor(y, "y", min_ndim=1)
    n, d = X.shape
    m = W.shape[0]
    for name, t, shape in (("W", W, (m, d)), ("a", a, (m,)), ("y", y, (n,))):
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} (from X {n} x {d} and W {m} rows), got {tuple(t.shape)}")
    check_positive(gamma, "gamma")
    check_choice(product_precision, "product_precision", PRODUCT_PRECISIONS)
    G, r, _ = _gradient(X, W, a, y, activation, gamma, loss, product_precision)
    return G, r


def _gradient_factors(X, W, a, y, activation, gamma, loss, precision="float64", Z=None, fixed=None):
    """`(A, B, r, f)` with the transposed gradient `G = A^T B`: `A = (gamma/n) X`, `B = (r a^T) o sigma'(X W^T)`.
    `Z`: the pre-activations `X W^T` when already computed (they do not depend on gamma); `fixed`: the
    run's `_fixed_operands(X, gamma, precision)`."""
    X_p, A, _ = _fixed_operands(X, gamma, precision) if fixed is None else fixed
    Z = _product(X_p, W.T, precision) if Z is None else Z
    value, slope = _values_and_slopes(activation, Z)
    f = gamma * value @ a
    r = loss_function(loss).residue(f, y)
    return A, r[:, None] * a[None, :] * slope, r, f


def _values_and_slopes(activation: str, Z):
    """`(sigma(Z), sigma'(Z))` as the activation's `f` and `df` compute them, value for value; tanh's and
    the sigmoid's derivatives are written in their values (`1 - tanh^2`, `s (1 - s)`), which are then
    computed once instead of two or three times (tested equal to `df`)."""
    act = get_activation(activation)
    value = act.f(Z)
    if activation == "tanh":
        return value, 1 - value**2
    if activation == "sigmoid":
        return value, value * (1 - value)
    return value, act.df(Z)


def _gradient(X, W, a, y, activation, gamma, loss, precision="float64", fixed=None):
    """`(G, r, f)`; G (d x m) is the transpose of the contiguous m x d `B^T A`, the layout of W, so that
    the step on W (`_normalized_step`) reads it in order. `fixed` as in `_gradient_factors`."""
    fixed = _fixed_operands(X, gamma, precision) if fixed is None else fixed
    _, B, r, f = _gradient_factors(X, W, a, y, activation, gamma, loss, precision, fixed=fixed)
    return _product(B.T, fixed[2], precision).T, r, f


class TrainingRun(NamedTuple):
    """What `train_weight_normalized` recorded.

    `trace` is a DataFrame with one row per step t = 0..steps: `loss` (mean loss at W_t),
    `s1..s{top_k}` (leading singular values of G_t), `align_<name>` (|cos| between u1(G_t) and
    each reference direction), `align_residue` (with `X_B^T r_t`, when `X_B` was given) and
    `align_initial` (with u1(G_0)). `U` holds the leading left singular vectors, shape
    (steps + 1, d, top_k); `W` maps each snapshot step to W_t (unit-norm rows).
    """

    trace: object  # pandas.DataFrame
    U: torch.Tensor
    W: dict


NORMALIZATIONS = frozenset({"wn", "projected"})
TRACKED_EXTRA = 4  # singular pairs tracked beyond top_k, so that the block iteration converges in a few steps


@dataclass(frozen=True)
class DescentConfig:
    """The settings of `train_weight_normalized`: full-batch gradient descent on unit-norm rows.

    Parameters
    ----------
    activation : a name of ACTIVATIONS. gamma : gamma_m, the output scale.
    steps : number of gradient steps (>= 0). lr : step size, default `1 / gamma` (the paper's large step).
    loss : "mse" or "logistic". top_k : singular pairs of G_t recorded at every step.
    snapshot_steps : steps whose W_t is kept (default every step).
    normalization : "wn" (weight normalisation, V takes the step) or "projected" (a step in W, then
        the rows renormalised).
    product_precision : "float64" or "float32", of the step's two n x d x m products (`gradient_matrix`).
    """

    activation: str
    gamma: float
    steps: int
    lr: float | None = None
    loss: str = "mse"
    top_k: int = 2
    snapshot_steps: tuple | None = None
    normalization: str = "wn"
    product_precision: str = "float64"

    def __post_init__(self):
        if not isinstance(self.steps, int) or self.steps < 0:
            raise ValueError(f"steps must be a non-negative integer, got {self.steps!r}")
        check_positive(self.gamma, "gamma")
        object.__setattr__(self, "lr", 1.0 / self.gamma if self.lr is None else self.lr)
        check_positive(self.lr, "lr")
        check_choice(self.normalization, "normalization", NORMALIZATIONS)
        check_choice(self.product_precision, "product_precision", PRODUCT_PRECISIONS)
        get_activation(self.activation)
        loss_function(self.loss)
        if not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"top_k must be a positive integer, got {self.top_k!r}")
        if self.snapshot_steps is not None:
            steps = tuple(sorted({int(t) for t in self.snapshot_steps}))
            if any(t < 0 or t > self.steps for t in steps):
                raise ValueError(f"snapshot_steps must lie in [0, {self.steps}], got {list(steps)}")
            object.__setattr__(self, "snapshot_steps", steps)

    def snapshots(self) -> set:
        return set(range(self.steps + 1)) if self.snapshot_steps is None else set(self.snapshot_steps)


def _training_data(X, y, W0, a, X_B, references, top_k: int):
    """Validate `train_weight_normalized`'s data against each other (one-line errors before any work)."""
    X = as_tensor(X, "X", min_ndim=2)
    n, d = X.shape
    y = as_tensor(y, "y", min_ndim=1)
    W0 = as_tensor(W0, "W0", min_ndim=2)
    a = as_tensor(a, "a", min_ndim=1)
    m = W0.shape[0]
    if y.shape != (n,):
        raise ValueError(f"y must have shape ({n},), got {tuple(y.shape)}")
    if W0.shape != (m, d):
        raise ValueError(f"W0 must have {d} columns (from X), got shape {tuple(W0.shape)}")
    if a.shape != (m,):
        raise ValueError(f"a must have shape ({m},) (from W0), got {tuple(a.shape)}")
    if top_k > min(d, m):
        raise ValueError(f"top_k must be an integer between 1 and {min(d, m)}, got {top_k!r}")
    if X_B is not None:
        X_B = as_tensor(X_B, "X_B", min_ndim=2)
        if X_B.shape != X.shape:
            raise ValueError(f"X_B must have the shape of X {tuple(X.shape)}, got {tuple(X_B.shape)}")
    refs = {}
    for name, v in (references or {}).items():
        v = as_tensor(v, f"references[{name!r}]", min_ndim=1)
        if v.shape != (d,):
            raise ValueError(f"references[{name!r}] must have shape ({d},), got {tuple(v.shape)}")
        refs[name] = v
    return X, y, W0, a, X_B, refs


def _trace_row(t, loss, s, u1, u_init, refs, X_B, r, top_k) -> dict:
    """One row of a training trace: the loss, the top singular values and u1's alignments."""
    row = {"step": t, "loss": loss}
    row.update({f"s{i + 1}": float(s[i]) for i in range(top_k)})
    for name, v in refs.items():
        row[f"align_{name}"] = alignment(u1, v)
    if X_B is not None:
        res = X_B.T @ r
        row["align_residue"] = alignment(u1, res) if float(res.norm()) > 0 else float("nan")
    row["align_initial"] = alignment(u1, u_init)
    return row


def _normalized_step(V, W, grad_W, lr, normalization, norms):
    """One step on the unit-norm rows: weight normalisation (`w_j = v_j / ||v_j||`, V takes the
    step, the gradient's radial part removed) or a step in W followed by renormalisation. `norms`:
    V's row norms. Updates V in place: `V - lr * (grad_W - radial) / norms`, operation for operation."""
    if normalization == "wn":
        step = (grad_W * W).sum(1, keepdim=True) * W  # the radial part
        torch.sub(grad_W, step, out=step)
        return V.sub_(step.mul_(lr).div_(norms))
    return normalize_rows(W - lr * grad_W)


def train_weight_normalized(X, y, W0, a, config: DescentConfig | None = None, *, X_B=None,
                            references: Mapping[str, object] | None = None, **settings) -> TrainingRun:
    """Full-batch gradient descent on the inner weights with weight normalisation (Section 3.4).

    The rows of W are kept on the unit sphere (Assumption 3): with normalization="wn" W is
    parametrised as `w_j = v_j / ||v_j||` (Salimans and Kingma's weight normalisation with the
    gain fixed to 1) and V takes the gradient steps; with "projected" each step is taken in W and
    the rows are renormalised. At every step the gradient `G_t` with respect to W (the matrix the
    decomposition is about) is recorded through its leading left singular vectors, tracked from step
    to step (`top_singular_from` on `top_k + TRACKED_EXTRA` pairs; `top_singular` at the first step
    and whenever tracking does not converge).

    Parameters
    ----------
    X : n x d inputs; y : (n,) targets; W0 : m x d initial weights (rows normalised); a : (m,)
        fixed outer weights.
    config : a `DescentConfig` (activation, gamma, steps, lr, loss, top_k, snapshot_steps,
        normalization); or its fields as keyword `settings` (`activation="tanh", gamma=..., steps=...`).
    X_B : n x d bulk inputs, to record `align_residue`.
    references : name -> (d,) directions whose alignment with u1(G_t) is recorded.

    Returns
    -------
    `TrainingRun`. Raises FloatingPointError when the weights stop being finite.
    """
    unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(DescentConfig)})
    if unknown:
        raise ValueError(f"unknown training settings {unknown}; DescentConfig takes "
                         f"{[f.name for f in dataclasses.fields(DescentConfig)]}")
    cfg = dataclasses.replace(config, **settings) if config is not None else DescentConfig(**settings)
    X, y, W0, a, X_B, refs = _training_data(X, y, W0, a, X_B, references, cfg.top_k)
    activation, gamma, steps, lr, loss, top_k = cfg.activation, cfg.gamma, cfg.steps, cfg.lr, cfg.loss, cfg.top_k
    normalization, snapshots = cfg.normalization, cfg.snapshots()
    lossf = loss_function(loss)
    import pandas as pd

    V = W0.clone()
    rows, Us, Ws = [], [], {}
    u_init, block = None, None
    small = min(X.shape[1], W0.shape[0])
    width = top_k + TRACKED_EXTRA if top_k + TRACKED_EXTRA < small else top_k  # tracked pairs: top_k and a margin
    fixed = _fixed_operands(X, gamma, cfg.product_precision)
    norms = V.norm(dim=1, keepdim=True)
    for t in range(steps + 1):
        W = V / norms  # `normalize_rows`, without checking V again (below)
        G, r, fx = _gradient(X, W, a, y, activation, gamma, loss, cfg.product_precision, fixed)
        top = _top_singular_from(G, top_k, block) if block is not None else None  # G moves little per step
        if top is not None and not bool(torch.isfinite(top.s).all()):
            raise FloatingPointError(f"the gradient stopped being finite at step {t} (lr={lr:g})")
        if top is None:
            top = top_singular(G, width)
        block = top.U if width > top_k else None
        U, s = top.U, top.s
        u_init = U[:, 0] if u_init is None else u_init
        rows.append(_trace_row(t, float(lossf.value(fx, y).mean()), s, U[:, 0], u_init, refs, X_B, r, top_k))
        Us.append(U[:, :top_k].clone())
        if t in snapshots:
            Ws[t] = W.clone()
        if t == steps:
            break
        V = _normalized_step(V, W, G.T, lr, normalization, norms)
        norms = V.norm(dim=1, keepdim=True)
        if not torch.isfinite(norms).all() or not bool((norms > 0).all()):  # a row not finite, or vanished
            raise FloatingPointError(f"training diverged at step {t + 1} (lr={lr:g})")
    return TrainingRun(pd.DataFrame(rows), torch.stack(Us), Ws)


def weight_angles(W1, W2) -> dict:
    """Two ways to say how far apart two weight matrices (m x d, unit-norm rows) are, in degrees.

    `mean_principal_angle`: the mean of the principal angles between their column spaces (as
    `scipy.linalg.subspace_angles(W1, W2)` computes them); `mean_neuron_angle`: the mean over
    neurons of the angle between `w_j` in the two matrices.
    """
    W1 = as_tensor(W1, "W1", min_ndim=2)
    W2 = as_tensor(W2, "W2", min_ndim=2)
    if W1.shape != W2.shape:
        raise ValueError(f"W1 and W2 must have one shape, got {tuple(W1.shape)} and {tuple(W2.shape)}")
    ang = principal_angles(W1, W2)
    cos = (normalize_rows(W1) * normalize_rows(W2)).sum(1).clamp(-1, 1)
    return {"mean_principal_angle": float(torch.rad2deg(ang).mean()),
            "max_principal_angle": float(torch.rad2deg(ang).max()),
            "mean_neuron_angle": float(torch.rad2deg(torch.arccos(cos)).mean())}


def scaling_comparison(X, y, W0, a, *, activation: str, steps: int, snapshot_steps=None,
                       scalings=("mf", "ntk"), lr_factor: float = 1.0, **kwargs) -> tuple[dict, object]:
    """Train one initialisation under each scaling (`gamma_m`, step `lr_factor / gamma_m`) on the same data.

    Returns `(runs, angles)`: the `TrainingRun` of each scaling, and a DataFrame of
    `weight_angles` between the first two scalings' W at every common snapshot step.
    Extra keyword arguments (not `gamma` or `lr`) go to `train_weight_normalized`.
    """
    import pandas as pd

    W0 = as_tensor(W0, "W0", min_ndim=2)
    if len(scalings) < 1:
        raise ValueError("scalings must name at least one scaling")
    for key in ("gamma", "lr"):
        if key in kwargs:
            raise ValueError(f"{key} is set per scaling; use lr_factor to scale the step 1/gamma_m")
    check_positive(lr_factor, "lr_factor")
    runs = {sc: scaling_run(X, y, W0, a, scaling=sc, activation=activation, steps=steps, lr_factor=lr_factor,
                            snapshot_steps=snapshot_steps, **kwargs) for sc in scalings}
    angles = snapshot_angles(runs[scalings[0]].W, runs[scalings[1]].W) if len(scalings) >= 2 else pd.DataFrame()
    return runs, angles


def scaling_run(X, y, W0, a, *, scaling: str, activation: str, steps: int, lr_factor: float = 1.0, **kwargs):
    """`train_weight_normalized` under one scaling: `gamma_m(m, scaling)`, step `lr_factor / gamma_m`
    (one of `scaling_comparison`'s runs). Extra keyword arguments go to `train_weight_normalized`."""
    gamma = gamma_m(as_tensor(W0, "W0", min_ndim=2).shape[0], scaling)
    return train_weight_normalized(X, y, W0, a, activation=activation, gamma=gamma, lr=lr_factor / gamma, steps=steps,
                                   **kwargs)


def snapshot_angles(A: Mapping[int, torch.Tensor], B: Mapping[int, torch.Tensor]):
    """`weight_angles` between two runs' weights at every step both kept (`TrainingRun.W` of each):
    a DataFrame with `step` and the three angles, in degrees (all 0 at a step where they are equal)."""
    import pandas as pd

    rows = []
    for t in sorted(set(A) & set(B)):
        if torch.equal(A[t], B[t]):
            rows.append({"step": t, "mean_principal_angle": 0.0, "max_principal_angle": 0.0, "mean_neuron_angle": 0.0})
            continue
        rows.append({"step": t, **weight_angles(A[t], B[t])})
    return pd.DataFrame(rows)


def single_index_draw(n: int, d: int, m: int, *, nu: float, seed: int, noise_std: float = 0.1,
                      link: str = "sigmoid"):
    """Spiked data (alpha = 0), a single-index target, `W_S` and signs `a`, all from one seed (Figs. 5, 6).

    Parameters
    ----------
    n, d, m : samples, input dimension, width. nu : spike exponent (`zeta = n^nu`). seed : sub-seeds
    data `seed`, omega `seed + 1`, label noise `seed + 2`, W `seed + 3`, a `seed + 4`.
    noise_std, link : of the target `y = link(omega^T x) + noise`.

    Returns
    -------
    `(data, omega, y, W, a)`: `SpikedData`, the unit index direction (d,), targets (n,), m x d
    unit-norm rows, (m,) signs.
    """
    data = spiked_gaussian(n, d, 0.0, nu, seed)
    omega = torch.randn(d, generator=generator(seed + 1), dtype=torch.float64)
    omega = omega / omega.norm()
    y = single_index_target(data.X, omega, noise_std=noise_std, seed=seed + 2, link=link)
    return data, omega, y, sphere_rows(m, d, seed + 3), outer_weights(m, seed + 4)


def initial_alignments(n: int, d: int, m: int, *, scaling: str, activation: str = "relu", loss: str = "mse",
                       noise_std: float = 0.1, link: str = "sigmoid", seed: int = 0,
                       product_precision: str = "float64") -> dict:
    """Fig. 4 for one draw: alignment of the initial gradient's u1 with `X^T y`, `X^T r` and omega.

    Isotropic data (`X = X_B`, rows N(0, I_d), no spike), `y = link(omega^T x) + noise` with omega
    uniform on the unit sphere, W_S and random signs a, `gamma_m` by `scaling`.
    Sub-seeds: X `seed`, omega `seed + 1`, noise `seed + 2`, W `seed + 3`, a `seed + 4`, and a uniform
    random direction of R^d, unrelated to the data and the network, `seed + 5` (`align_random`: what an
    unrelated direction's |cos| with u1 is). `align_omega_span` is the |cos| with omega's projection onto the
    span of the n inputs, and `omega_span_norm` that projection's norm: u1 lies in the span (the gradient is
    `X^T B`), so `align_omega = align_omega_span * omega_span_norm`, at most about sqrt(n/d) when n < d.
    product_precision : of the n x d x m product `X W^T` (`gradient_matrix`).
    """
    return initial_alignments_by_scaling(n, d, m, scalings=(scaling,), activation=activation, loss=loss,
                                         noise_std=noise_std, link=link, seed=seed,
                                         product_precision=product_precision)[scaling]


def initial_alignments_by_scaling(n: int, d: int, m: int, *, scalings=("mf", "ntk"), activation: str = "relu",
                                  loss: str = "mse", noise_std: float = 0.1, link: str = "sigmoid", seed: int = 0,
                                  product_precision: str = "float64") -> dict:
    """`initial_alignments` of one draw under each scaling: `{scaling: row}`. The draw (X, omega, y, W,
    a) and the pre-activations `X W^T` are made once and shared, as `initial_alignments` would make the
    same ones for each scaling; only gamma_m, and with it the output and the residue, differs."""
    for sc in scalings:
        check_choice(sc, "scaling", {"mf", "ntk"})
    check_choice(product_precision, "product_precision", PRODUCT_PRECISIONS)
    data = spiked_gaussian(n, d, 0.0, 0.0, seed)
    X = data.X_B
    omega = torch.randn(d, generator=generator(seed + 1), dtype=torch.float64)
    omega = omega / omega.norm()
    y = single_index_target(X, omega, noise_std=noise_std, seed=seed + 2, link=link)
    unrelated = torch.randn(d, generator=generator(seed + 5), dtype=torch.float64)
    # u1 lies in the span of the n inputs (G = X^T B), so |cos(u1, omega)| <= ||P_X omega||, about sqrt(n/d)
    # when n < d: omega's part in that span is what u1 can align with at most
    Q = torch.linalg.qr(X.T, mode="reduced")[0]
    omega_span = Q @ (Q.T @ omega)
    W = sphere_rows(m, d, seed + 3)
    a = outer_weights(m, seed + 4)
    Z = _product(X, W.T, product_precision)
    rows = {}
    for sc in scalings:
        A, B, r, _ = _gradient_factors(X, W, a, y, activation, gamma_m(m, sc), loss, product_precision, Z=Z)
        U, s, _ = top_singular_of_product(A, B, 2)  # G = A^T B is never formed
        u1 = U[:, 0]
        rows[sc] = {"align_Xy": alignment(u1, X.T @ y), "align_Xr": alignment(u1, X.T @ r),
                    "align_omega": alignment(u1, omega), "align_omega_span": alignment(u1, omega_span),
                    "omega_span_norm": float(omega_span.norm()), "align_random": alignment(u1, unrelated),
                    "s1_over_s2": float(s[0] / s[1]),
                    "r_y_corr": float(torch.nn.functional.cosine_similarity(r, -y, dim=0))}
    return rows


def initial_lead(X, y, W, a, *, activation: str, gamma: float, X_B, q, loss: str = "mse",
                 product_precision: str = "float64") -> float:
    """`|cos(u1, q)| - |cos(u1, X_B^T r)|` for the initial gradient on inputs `X` (> 0: u1 nearer the spike).

    X : n x d inputs the network sees (with the spike, or `X_B` alone for a spike-free control). X_B :
    the bulk part, which defines the residue direction `X_B^T r`. q : (d,) spike direction. The rest as
    in `gradient_matrix`.
    """
    G, r = gradient_matrix(X, W, a, y, activation=activation, gamma=gamma, loss=loss,
                           product_precision=product_precision)
    X_B = as_tensor(X_B, "X_B", min_ndim=2)
    u1 = top_singular(G, 1)[0][:, 0]
    return alignment(u1, as_tensor(q, "q", min_ndim=1)) - alignment(u1, X_B.T @ r)


def one_switch_from_residue(leads) -> float:
    """1.0 if the sequence of leads (ordered by spike size; lead = align_q - align_residue) changes sign
    exactly once and starts on the residue side (first lead < 0), else 0.0 (Theorems 3.1-3.2: residue
    for small spikes, q for large ones). A lead of exactly 0 counts as the q side."""
    signs = np.sign(np.asarray(leads, dtype=float))
    if signs.size < 2 or not np.all(np.isfinite(signs)):
        raise ValueError(f"leads must hold at least two finite values, got {leads}")
    signs[signs == 0] = 1
    return float(int((signs[1:] != signs[:-1]).sum()) == 1 and signs[0] < 0)


def random_alignment_quantile(d: int, level: float = 0.95) -> float:
    """The `level` quantile of `|cos(u, v)|` for `v` uniform on the unit sphere of R^d and any fixed `u`.

    `cos^2` is Beta(1/2, (d-1)/2) distributed, so the quantile is `sqrt(Beta.ppf(level))`; about
    `1.96 / sqrt(d)` for large d at level 0.95. An alignment above it is more than an unrelated direction
    reaches with probability `1 - level`.
    """
    from scipy.stats import beta

    if not isinstance(d, (int, np.integer)) or d < 2:
        raise ValueError(f"d must be an integer >= 2, got {d!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return float(np.sqrt(beta.ppf(level, 0.5, (d - 1) / 2)))


def target_direction_share(n: int, d: int, *, noise_std: float = 0.0, link: str = "sigmoid",
                           nodes: int = 101) -> float:
    """The |cos| between `X^T y` and omega that a single-index target leaves, to leading order.

    For rows of X i.i.d. N(0, I_d), omega a unit vector and `y = link(omega^T x) + N(0, noise_std^2)`,
    write `g = omega^T x`. The part of `X^T y` along omega is `sum_i g_i y_i`, of second moment
    `n^2 c^2 + n Var(g y)` with `c = E[g y] = E[link'(g)]` (Stein's lemma); the part orthogonal to omega
    is `sum_i y_i x_perp,i` with `x_perp` independent of y, of squared norm about `(d - 1) n E[y^2]`.
    The share returned is `sqrt(A / (A + B))` with `A = n c^2 + Var(g y)` and `B = (d - 1) E[y^2]`: what
    |cos(u1, omega)| is at most near when u1 lies along `X^T y` (the MF gradient at initialisation,
    where r ~ -y). It tends to 1 only when n/d grows; with n/d fixed it stays below 1, and a link whose
    mean is not 0 (the sigmoid's 1/2) lowers it through E[y^2]. The Gaussian moments are taken by
    Gauss-Hermite quadrature with `nodes` nodes (for a smooth link).
    """
    for value, label, low in ((n, "n", 1), (d, "d", 2)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
            raise ValueError(f"{label} must be an integer >= {low}, got {value!r}")
    check_positive(noise_std, "noise_std", strict=False)
    check_choice(link, "link", {"sigmoid", "tanh", "softplus", "elu", "silu", "gelu"})  # smooth: the rule converges
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()  # E over g ~ N(0, 1)
    s = get_activation(link).f(torch.as_tensor(x, dtype=torch.float64)).numpy()
    c = float(w @ (x * s))  # E[g link(g)] = E[link'(g)]
    e_y2 = float(w @ s**2) + noise_std**2
    var_gy = float(w @ (x**2 * s**2)) + noise_std**2 - c**2
    A = n * c**2 + var_gy
    B = (d - 1) * e_y2
    return float(math.sqrt(A / (A + B)))


def target_span_share(n: int, d: int, *, noise_std: float = 0.0, link: str = "sigmoid") -> float:
    """The |cos| between `X^T y` and `P_X omega` (omega's projection onto the span of the n inputs), to
    leading order: what the alternative "u1 along X^T y" can reach on the statistic judged with `P_X omega`.

    `X^T y` lies in that span, so `cos(X^T y, P_X omega) = cos(X^T y, omega) / ||P_X omega||` exactly;
    for isotropic Gaussian rows `||P_X omega||^2` is Beta(n/2, (d-n)/2) when n < d, about `n/d`, and 1 when
    n >= d. The share returned is `target_direction_share(n, d) * sqrt(d / min(n, d))`, capped at 1 (a
    single input spans one direction, which both vectors share). It equals `target_direction_share`
    from n = d on; below d it is the ratio of the typical sizes (slightly above the root mean square over
    draws, by about 0.01 at n/d = 0.75).
    """
    share = target_direction_share(n, d, noise_std=noise_std, link=link)
    return float(min(1.0, share * math.sqrt(d / min(n, d))))


def samples_for_target_share(d: int, level: float, *, noise_std: float = 0.0, link: str = "sigmoid") -> int:
    """The fewest samples n at which `target_direction_share(n, d)` reaches `level` (in (0, 1)): how much
    data `X^T y` needs before it is aligned with omega at that level. The share grows with n."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    share = functools.partial(target_direction_share, d=d, noise_std=noise_std, link=link)
    hi = 1
    while share(hi) < level:
        hi *= 2
    lo = hi // 2  # share(lo) < level <= share(hi), or hi = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if share(mid) < level else (lo, mid)
    return int(hi)


def margin_over_rest(values: Mapping, target, others) -> float:
    """`values[target] - max(values[o] for o in others if o != target)`: how far one entry exceeds the
    largest of the others (e.g. ReLU's exponent over the smooth activations')."""
    rest = [float(values[o]) for o in others if o != target]
    if not rest:
        raise ValueError("others must name at least one entry besides target")
    return float(values[target]) - max(rest)


def direction_switch(trace, *, source: str = "align_residue", target: str = "align_q", late_from: int | None = None,
                     ) -> dict:
    """When, if ever, the gradient's leading direction moves from `source` to `target` in one run.

    Parameters
    ----------
    trace : a `TrainingRun.trace` (one row per step, columns `step`, `loss`, `source`, `target`).
    source, target : alignment columns (|cos| of u1(G_t) with two reference directions).
    late_from : first step of the "late" window (default: half the last step).

    Returns
    -------
    dict with `starts_on_source` (lead = target - source < 0 at step 0), `ends_on_target` (median lead
    over the late window > 0), `switched` (both), `switch_step` (first step t >= 1 with lead > 0, for a
    run that switched; else None), and the loss at `switch_step - 1`, at it and at the step after
    (`loss_before`, `loss_at`, `loss_after`; NaN where absent), `loss_jump` = loss_at / loss_before.
    """
    steps = trace["step"].to_numpy()
    if steps.size < 2 or steps[0] != 0 or not (np.diff(steps) == 1).all():
        raise ValueError("trace must hold consecutive steps 0, 1, 2, ...")
    for col in (source, target, "loss"):
        if col not in trace:
            raise ValueError(f"trace has no column {col!r}")
    lead = trace[target].to_numpy() - trace[source].to_numpy()
    loss = trace["loss"].to_numpy()
    late_from = steps[-1] // 2 if late_from is None else late_from
    starts = bool(lead[0] < 0)
    ends = bool(np.median(lead[steps >= late_from]) > 0)
    out = {"starts_on_source": starts, "ends_on_target": ends, "switched": starts and ends, "switch_step": None,
           "loss_before": float("nan"), "loss_at": float("nan"), "loss_after": float("nan"),
           "loss_jump": float("nan")}
    if starts and ends:
        t = int(np.nonzero(lead[1:] > 0)[0][0]) + 1
        out.update(switch_step=t, loss_before=float(loss[t - 1]), loss_at=float(loss[t]),
                   loss_after=float(loss[t + 1]) if t + 1 < loss.size else float("nan"),
                   loss_jump=float(loss[t] / loss[t - 1]))
    return out
