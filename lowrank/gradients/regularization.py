"""The regularised gradients of Section 4 of the low-rank-gradients paper.

Weight decay (`weight_decay_gradient`, `weight_decay_scales`, Prop. 4.1), isotropic input noise
(`add_input_noise`, `noisy_problem`) and the Jacobian penalty (`jacobian_penalty_gradient`, split into
the data spike `S3` and the bulk `E2`), with the shares and alignments the regularisation page reads
off them. The unregularised gradient and its terms are `lowrank.gradients.decomposition`'s.

The regularisation page's experiments are here too, each returning a table: the closed forms
against autograd (`autograd_errors`), the weight-decay sweep (`weight_decay_sweep`) and where each
spike leaves (`threshold_crossings`), the input-noise sweep (`input_noise_sweep`) and the Jacobian
penalty (`jacobian_penalty_sweep`, `jacobian_residue_shares`). The sweeps take `workers`: their
independent (nu, seed), (seed, tau2) and seed tasks, each seeded by its own seed, run in that many
processes (`lowrank.core.parallel.map_tasks`), and the tables do not depend on it.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch

from lowrank.core.parallel import map_tasks
from lowrank.core.validation import as_tensor, check_positive
from lowrank.core.data import SpikedData, generator
from lowrank.core.nets import activation as get_activation
from lowrank.core.spectral import top_singular
from lowrank.gradients.decomposition import SpikedProblem, check_two_layer_inputs, rank_one_norm
from lowrank.gradients.rule_of_thumb import dominant_spike

__all__ = [
    "weight_decay_gradient",
    "WeightDecayScales",
    "weight_decay_scales",
    "outlying_share",
    "bulk_gap",
    "spikes_kept_share",
    "spikes_gone_share",
    "spike_probes",
    "spikes_kept_at_fraction",
    "tau2_from_rho",
    "add_input_noise",
    "noisy_problem",
    "JacobianPenaltyGradient",
    "jacobian_penalty",
    "jacobian_penalty_gradient",
    "jacobian_penalty_problem",
    "jacobian_balance_lambda",
    "jacobian_balance_alignments",
    "misalignment_closed",
    "autograd_errors",
    "weight_decay_sweep",
    "threshold_crossings",
    "input_noise_sweep",
    "jacobian_penalty_sweep",
    "jacobian_residue_shares",
]


def weight_decay_gradient(G, W, lam: float) -> torch.Tensor:
    """`G(lambda) = G(0) + lambda W^T` (d x m): the gradient of `L + (lam/2) ||W||_F^2`.

    Parameters
    ----------
    G : d x m, the transposed gradient of the unregularised mean loss L. W : m x d weights.
    lam : the paper's lambda, the weight-decay strength of the penalty `(lam/2) ||W||_F^2` (>= 0).

    Returns
    -------
    d x m tensor, in the units of G.
    """
    G = as_tensor(G, "G", min_ndim=2)
    W = as_tensor(W, "W", min_ndim=2)
    check_positive(lam, "lam", strict=False)
    if tuple(G.shape) != tuple(W.T.shape):
        raise ValueError(f"G must be d x m = {tuple(W.T.shape)} (the transpose of W), got {tuple(G.shape)}")
    return G + lam * W.T


class WeightDecayScales(NamedTuple):
    """The two weight-decay scales of Section 4 (Prop. 4.1 with its constants set to 1)."""

    keeps_spikes_below: float  # lambda ||W||_2 = o(sqrt(m) gamma): S1 and S2 survive
    suppresses_spikes_above: float  # lambda ||W||_2 = omega(sqrt(m) gamma n^nu): both are suppressed
    W_norm: float  # ||W||_2


def weight_decay_scales(W, *, gamma: float, n: int, nu: float) -> WeightDecayScales:
    """`sqrt(m) gamma / ||W||_2` and `sqrt(m) gamma n^nu / ||W||_2` (gamma = gamma_m).

    Parameters
    ----------
    W : m x d weights. gamma : gamma_m. n : samples. nu : spike exponent.

    Returns
    -------
    `WeightDecayScales`: two values of lambda (the weight decay of `(lam/2) ||W||_F^2`) and ||W||_2.

    Prop. 4.1 bounds `||S1||_2 <= O(sqrt(m) gamma)` and `||S2||_2 <= O(sqrt(m) gamma n^nu)`; weight
    decay adds `lambda W^T`, whose spectral norm is `lambda ||W||_2`. The constants of the O(.) are
    not given, so these are scales, not sharp thresholds.
    """
    W = as_tensor(W, "W", min_ndim=2)
    check_positive(gamma, "gamma")
    check_positive(nu, "nu", strict=False)
    wn = float(torch.linalg.matrix_norm(W, ord=2))
    base = math.sqrt(W.shape[0]) * gamma / wn
    return WeightDecayScales(base, base * float(n) ** float(nu), wn)


def _spike_columns(rows, columns) -> None:
    missing = [c for c in columns if c not in rows]
    if missing:
        raise ValueError(f"rows has no column(s) {missing}")
    if len(rows) == 0:
        raise ValueError("rows is empty")


def outlying_share(outliers, align_u1, in_top2):
    """The part of a direction inside the span of G's *outlying* left singular vectors (at most two):
    0 with no outlier, `|cos(u1, x)|` (`align_u1`) with one, `||U_2^T x||` (`in_top2`) with two or more.

    With one outlier only u1 stands out of the bulk, so a direction that reaches the top-two
    subspace through u2, a bulk vector, is not a spike of G. Arrays (or scalars) of `dominant_spike`'s
    `outliers`, `align_residue` / `align_q`, `residue_in_top2` / `q_in_top2`; returns a float array.
    """
    outliers = np.asarray(outliers)
    return np.where(outliers >= 2, np.asarray(in_top2, float), np.where(outliers == 1, np.asarray(align_u1, float), 0.0))


def bulk_gap(singular_values, outliers: int) -> float:
    """The outlying set's gap to the bulk: `s_k / s_{k+1}` with `k = outliers` (nan with no outlier).

    `count_outliers` calls the leading `k` singular values outliers when this ratio is at least its
    `gap` (1.5 by default), so a spike whose set sits just above that ratio is barely out of the bulk
    and can drop into it under a small perturbation. singular_values : the leading values, descending
    (at least `outliers + 1` of them).
    """
    s = np.asarray(singular_values, dtype=float)
    k = int(outliers)
    if k < 0:
        raise ValueError(f"outliers must be >= 0, got {outliers!r}")
    if k == 0:
        return float("nan")
    if s.ndim != 1 or len(s) <= k:
        raise ValueError(f"need at least {k + 1} singular values for {k} outliers, got {s.shape}")
    return float(s[k - 1] / s[k]) if s[k] > 0 else float("inf")


def spike_present_at_zero(rows, *, threshold: float):
    """Boolean array: does the configuration (row) have at least one spike present at lambda = 0
    (`residue_outlying_0` or `q_outlying_0` at least `threshold`, `outlying_share`)?"""
    _spike_columns(rows, ("residue_outlying_0", "q_outlying_0"))
    return np.asarray((rows["residue_outlying_0"] >= threshold) | (rows["q_outlying_0"] >= threshold))


def rows_without_spike(rows, *, threshold: float) -> int:
    """Number of configurations with no spike present at lambda = 0: they cannot keep or lose one,
    so `spikes_kept_share` leaves them out and the page reports how many there are."""
    return int((~spike_present_at_zero(rows, threshold=threshold)).sum())


def spikes_kept_share(rows, *, threshold: float) -> float:
    """Share of the configurations (rows) *with a spike present at lambda = 0* that keep every such spike.

    A spike is present when its direction has at least `threshold` of its norm in the span of G's
    outlying left singular vectors (`outlying_share`): the residue direction `residue_outlying` and the
    data spike `q_outlying` at the row's lambda, `residue_outlying_0` and `q_outlying_0` at lambda = 0.
    A configuration with no spike at lambda = 0 can neither keep nor lose one: it is left out of the
    share (count it with `rows_without_spike`); with no such configuration at all the share is nan.
    """
    _spike_columns(rows, ("residue_outlying_0", "q_outlying_0", "residue_outlying", "q_outlying"))
    present = spike_present_at_zero(rows, threshold=threshold)
    if not present.any():
        return float("nan")
    kept = ((rows["residue_outlying_0"] < threshold) | (rows["residue_outlying"] >= threshold)) & (
        (rows["q_outlying_0"] < threshold) | (rows["q_outlying"] >= threshold))
    return float(np.asarray(kept)[present].mean())


def spike_probes(rows, problems, *, threshold: float) -> pd.DataFrame:
    """Each spike present at lambda = 0, probed at its own size: the rows of `weight_decay_sweep`
    with `probe == "fraction"` (`lambda ||W||_2 = fraction * ||S||_2`, S the spike's own measured norm).

    Returns one row per (nu, seed, spike, fraction) whose spike is present at lambda = 0 (its
    `outlying_share` at least `threshold`): `lam`, `share_0` and `share` (the spike direction's
    `outlying_share` at lambda = 0 and at the probe; `residue_outlying` for S1, `q_outlying` for S2)
    and `kept` (`share >= threshold`). Spikes absent at lambda = 0 can neither be kept nor lost and
    have no row; `problems` gives `residue_outlying_0` / `q_outlying_0`. Where the tables carry them
    (`weight_decay_sweep`'s do), also the outlier counts and the outlying set's gap to the bulk
    (`bulk_gap`) at lambda = 0 and at the probe: `outliers_0`, `gap_0`, `outliers`, `gap` (nan otherwise).
    """
    if not 0 <= threshold <= 1:
        raise ValueError(f"threshold must be a share in [0, 1], got {threshold}")
    _spike_columns(rows, ("probe", "spike", "fraction", "residue_outlying", "q_outlying"))
    _spike_columns(problems, ("nu", "seed", "residue_outlying_0", "q_outlying_0"))
    extra = [c for c in ("outliers_0", "gap_0") if c in problems]
    probes = rows[rows["probe"] == "fraction"].merge(
        problems[["nu", "seed", "residue_outlying_0", "q_outlying_0", *extra]], on=["nu", "seed"])
    own = {"S1": ("residue_outlying", "residue_outlying_0"), "S2": ("q_outlying", "q_outlying_0")}
    nan = float("nan")
    out = []
    for r in probes.itertuples():
        at, at_zero = own[r.spike]
        if getattr(r, at_zero) < threshold:
            continue
        share = float(getattr(r, at))
        out.append({"nu": r.nu, "seed": r.seed, "spike": r.spike, "fraction": float(r.fraction), "lam": r.lam,
                    "share_0": float(getattr(r, at_zero)), "share": share, "kept": share >= threshold,
                    **{c: float(getattr(r, c, nan)) for c in ("outliers_0", "gap_0", "outliers", "gap")}})
    return pd.DataFrame(out, columns=["nu", "seed", "spike", "fraction", "lam", "share_0", "share", "kept",
                                      "outliers_0", "gap_0", "outliers", "gap"])


def spikes_kept_at_fraction(probes: pd.DataFrame, fraction: float) -> tuple[float, pd.DataFrame]:
    """Share of the present spikes kept at `lambda ||W||_2 = fraction * ||S||_2` (`spike_probes`' table),
    and the rows of the spikes lost there (nu, seed, spike). nan with no present spike probed there."""
    at = probes[np.isclose(probes["fraction"], fraction)]
    if not len(at):
        return float("nan"), at
    return float(at["kept"].mean()), at[~at["kept"]]


def spikes_gone_share(rows, *, threshold: float) -> float:
    """Share of configurations in which neither spike is present (both `residue_outlying` and
    `q_outlying` below `threshold`, `outlying_share`): weight decay has buried both."""
    _spike_columns(rows, ("residue_outlying", "q_outlying"))
    return float(((rows["residue_outlying"] < threshold) & (rows["q_outlying"] < threshold)).mean())


def tau2_from_rho(n: int, rho: float) -> float:
    """The input-noise variance `tau^2 = n^rho` of Prop. 4.2."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    return float(n) ** float(rho)


def add_input_noise(data: SpikedData, tau2: float, seed: int) -> SpikedData:
    """`x'_i = x_i + xi_i` with `xi_i ~ N(0, tau2 I)` drawn from `seed` (Section 4).

    Parameters
    ----------
    data : the clean `SpikedData`. tau2 : the noise variance tau^2 per coordinate (>= 0), in squared
    input units. seed : of the noise.

    Returns
    -------
    `SpikedData` of the noisy inputs (one realisation).

    The noise joins the bulk: `X'_B = X_B + Xi`, `Sigma_hat' = Sigma_hat + tau2 I`, while `z`, `q`
    and `zeta` are unchanged, so `X' = X'_B + zeta z q^T` and `decompose` applied to the returned
    data gives the primed terms `S1', S12', S2', E'` of Prop. 4.2.
    """
    check_positive(tau2, "tau2", strict=False)
    g = generator(seed)
    n, d = data.X_B.shape
    xi = math.sqrt(tau2) * torch.randn(n, d, generator=g, dtype=torch.float64)
    X_B = data.X_B + xi
    X = X_B + data.zeta * torch.outer(data.z, data.q)
    Sigma_hat = data.Sigma_hat + tau2 * torch.eye(d, dtype=torch.float64)
    return SpikedData(X, X_B, data.z, data.q, data.zeta, Sigma_hat)


def noisy_problem(p: SpikedProblem, tau2: float, seed: int) -> SpikedProblem:
    """The same problem with isotropic input noise of variance `tau2`: the labels `y`, `W`, `a`
    are kept (the labels are those of the clean inputs, as in Section 4)."""
    return p._replace(data=add_input_noise(p.data, tau2, seed))


class JacobianPenaltyGradient(NamedTuple):
    G_reg: torch.Tensor  # d x m, the gradient of L_reg (transposed, like G)
    S3: torch.Tensor  # d x m, the data-aligned rank-one spike (left vector q)
    E2: torch.Tensor  # d x m, the bulk part
    S3_factors: tuple | None = None  # (u, v) with S3 = u v^T

    def norm_S3(self) -> float:
        """`||S3||_2` by its closed form `||u|| ||v||` (`rank_one_norm`)."""
        if self.S3_factors is None:
            raise ValueError("this JacobianPenaltyGradient carries no factors")
        return rank_one_norm(*self.S3_factors)

    def identity_residual(self) -> float:
        """`||G_reg - (S3 + E2)||_F / ||G_reg||_F`: zero up to round-off."""
        return float((self.G_reg - self.S3 - self.E2).norm() / self.G_reg.norm())


def jacobian_penalty(X, W, a, *, activation: str, gamma: float, lam: float) -> torch.Tensor:
    """`L_reg = lambda/(2n) sum_i ||d f(x_i)/dW||_F^2` in closed form (differentiable in W).

    `d f(x)/dW = gamma (a o sigma'(W x)) x^T` is rank one, so
    `||d f(x)/dW||_F^2 = gamma^2 ||x||^2 sum_j a_j^2 sigma'(w_j^T x)^2`.
    """
    check_positive(lam, "lam", strict=False)
    act = get_activation(activation)
    sq = (X * X).sum(1)  # ||x_i||^2
    return lam * gamma**2 / (2 * X.shape[0]) * (sq[:, None] * act.df(X @ W.T) ** 2 * (a * a)[None, :]).sum()


def jacobian_penalty_gradient(X_B, z, q, zeta: float, W, a, *, activation: str, gamma: float,
                              lam: float) -> JacobianPenaltyGradient:
    """Gradient of the Jacobian penalty (Prop. 4.3) and its split into `S3 + E2`.

    With `D = Diag(||x_i||^2)` (squared Euclidean norms of the full inputs `x_i = x_B,i + zeta z_i q`)
    and `P = sigma'(X W^T) o sigma''(X W^T)` (n x m),

        G_reg = (lambda gamma^2 / n) X^T D P Diag(a o a)                (d x m)
        S3    = (lambda gamma^2 zeta / n) q (z^T D P) Diag(a o a)       data-aligned, rank one
        E2    = (lambda gamma^2 / n) X_B^T D P Diag(a o a)

    With `a_j in {-1, +1}` the factor `Diag(a o a)` is the identity and these are the formulas of
    the book's notation page (book/notation.md); the identity `G_reg = S3 + E2` is exact (`X = X_B + zeta z q^T`). The factor
    2 from differentiating `sigma'^2` cancels the 1/2 of the penalty. For ReLU, `sigma'' = 0` almost
    everywhere and the gradient vanishes.
    """
    X_B, z, q, W, a = check_two_layer_inputs(X_B, z, q, W, a)
    check_positive(lam, "lam", strict=False)
    act = get_activation(activation)
    n = X_B.shape[0]
    X = X_B + zeta * torch.outer(z, q)
    pre = X @ W.T
    DP = (X * X).sum(1)[:, None] * act.df(pre) * act.d2f(pre) * (a * a)[None, :]  # D P Diag(a^2)
    c = lam * gamma**2 / n
    S3 = c * zeta * torch.outer(q, z @ DP)
    E2 = c * X_B.T @ DP
    return JacobianPenaltyGradient(c * X.T @ DP, S3, E2, (c * zeta * q, z @ DP))


def jacobian_penalty_problem(p: SpikedProblem, lam: float) -> JacobianPenaltyGradient:
    D = p.data
    return jacobian_penalty_gradient(D.X_B, D.z, D.q, D.zeta, p.W, p.a, activation=p.activation,
                                     gamma=p.gamma, lam=lam)


def jacobian_balance_lambda(G, penalty_at_one: JacobianPenaltyGradient) -> float:
    """The penalty strength at which the penalty's data spike is as large as the unregularised gradient.

    Parameters
    ----------
    G : d x m, the unregularised gradient G(0). penalty_at_one : the Jacobian penalty's gradient at
    lambda = 1 (`jacobian_penalty_problem(p, 1.0)`, with its S3 factors).

    Returns
    -------
    `lambda_x = ||G(0)||_2 / ||S3(1)||_2`. S3 is linear in lambda (Prop. 4.3), so at lambda_x
    `||lambda S3(1)||_2 = ||G(0)||_2`: neither the penalty's spike nor the loss's gradient outweighs the
    other by construction, which is where the penalty's effect on G's leading direction is a question
    (at lambda >> lambda_x, `G ~ lambda G_reg` and its direction is G_reg's own).
    """
    G = as_tensor(G, "G", min_ndim=2)
    s3 = penalty_at_one.norm_S3()
    if not s3 > 0:
        raise ValueError("penalty_at_one has ||S3||_2 = 0 (sigma'' = 0, e.g. ReLU): no balance point")
    return float(torch.linalg.matrix_norm(G, ord=2)) / s3


def jacobian_balance_alignments(G, penalty_at_one: JacobianPenaltyGradient, residue_direction, q) -> dict:
    """|cos(u1, q)| of G(0), of G(0) + lambda_x G_reg and of G(0) + lambda_x E2 (the penalty without its
    spike S3), at the balance point `lambda_x = jacobian_balance_lambda(G, penalty_at_one)`.

    Returns a dict with `lam_x`, `align_q_0`, `align_q_with_S3`, `align_q_without_S3` (`dominant_spike`'s
    `align_q` of each matrix; `residue_direction` is `X_B^T r`).
    """
    lam_x = jacobian_balance_lambda(G, penalty_at_one)
    aligns = [dominant_spike(M, residue_direction, q).align_q
              for M in (G, G + lam_x * penalty_at_one.G_reg, G + lam_x * penalty_at_one.E2)]
    return {"lam_x": lam_x, **dict(zip(("align_q_0", "align_q_with_S3", "align_q_without_S3"), aligns))}


def misalignment_closed(before, after):
    """Share of a misalignment removed: `(after - before) / (1 - before)` for alignments `|cos|` in [0, 1].

    1 means `after` is perfectly aligned, 0 no change, negative a loss of alignment. Arrays work
    elementwise; a `before` of 1 (nothing to close) raises.
    """
    b = np.asarray(before, dtype=float)
    a = np.asarray(after, dtype=float)
    for name, x in (("before", b), ("after", a)):
        if not np.all(np.isfinite(x)) or np.any(x < 0) or np.any(x > 1 + 1e-12):
            raise ValueError(f"{name} must hold alignments in [0, 1], got {x}")
    if np.any(b >= 1):
        raise ValueError("before must be below 1: a perfect alignment leaves nothing to close")
    out = (a - b) / (1 - b)
    return float(out) if out.ndim == 0 else out


# The regularisation page's experiments, each a table (one row per configuration and strength).


def autograd_errors(*, scaling: str, activations=("sigmoid", "tanh", "softplus", "relu"), n: int = 30, d: int = 20,
                    m: int = 25, seed: int = 7) -> pd.DataFrame:
    """The three closed-form regularised gradients against `torch.func` derivatives of the penalised
    losses, on one small spiked problem per activation (alpha = 1/2, nu = 3/8).

    - weight decay: `S1 + S12 + S2 + E + lambda W^T` (lambda = 0.3) against autograd of
      `(1/n) sum_i loss + (lambda/2) ||W||_F^2`;
    - input noise: `S1' + S12' + S2' + E'` (tau^2 = 0.5) against autograd of the loss on the noisy
      inputs with the clean labels;
    - Jacobian penalty (not for ReLU, whose sigma'' is 0): `G_reg` (lambda = 2) against autograd of
      `lambda/(2n) sum_i ||d f(x_i)/dW||_F^2` with per-sample Jacobians from `jacrev`, and the
      residual of its split `S3 + E2`.

    Returns one row per regulariser and activation: `regulariser`, `activation`, `rel_error`
    (`||closed - autograd||_F / ||autograd||_F`) and, for the Jacobian penalty, `split_residual`.
    """
    from torch.func import grad, jacrev

    from lowrank.core.nets import two_layer_forward
    from lowrank.gradients.decomposition import decompose_problem, spiked_problem

    rows = []
    for act in activations:
        p = spiked_problem(n, d, m, alpha=0.5, nu=0.375, activation=act, scaling=scaling, seed=seed)
        D, W, a, y, g = p.data, p.W, p.a, p.y, p.gamma

        def mse(X, V, act=act, a=a, y=y, g=g):
            return (0.5 * (two_layer_forward(X, V, a, activation=act, gamma=g) - y) ** 2).mean()

        dec = decompose_problem(p)
        closed = dec.S1 + dec.S12 + dec.S2 + dec.E  # G(0) from the closed-form terms, not from autograd
        G_wd = weight_decay_gradient(closed, W, 0.3)
        ref = grad(lambda V: mse(D.X, V) + 0.15 * (V**2).sum())(W).T
        rows.append({"regulariser": "weight decay", "activation": act, "rel_error": float((G_wd - ref).norm() / ref.norm())})
        noisy = noisy_problem(p, 0.5, seed=seed + 1)
        dn = decompose_problem(noisy)
        ref = grad(lambda V: mse(noisy.data.X, V))(W).T  # loss on x + xi with the clean labels
        rows.append({"regulariser": "input noise", "activation": act,
                     "rel_error": float((dn.S1 + dn.S12 + dn.S2 + dn.E - ref).norm() / ref.norm())})
        if act == "relu":  # sigma'' = 0 for ReLU: nothing to check
            continue
        lam = 2.0

        def penalty(V, act=act, a=a, g=g):
            J = jacrev(lambda U: two_layer_forward(D.X, U, a, activation=act, gamma=g))(V)  # n x m x d
            return lam / (2 * D.X.shape[0]) * (J**2).sum()

        jp = jacobian_penalty_problem(p, lam)
        ref = grad(penalty)(W).T
        rows.append({"regulariser": "Jacobian penalty", "activation": act,
                     "rel_error": float((jp.G_reg - ref).norm() / ref.norm()), "split_residual": jp.identity_residual()})
    return pd.DataFrame(rows)


def weight_decay_sweep(n: int, d: int, m: int, *, nus, seeds, alpha: float, activation: str, scaling: str, lambdas,
                       fractions=(), workers: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Which spikes survive weight decay: `dominant_spike` of `G(lambda) = G(0) + lambda W^T` for every
    spike exponent nu, seed and lambda.

    Returns `(rows, problems)`. `rows`: one per (nu, seed, lambda) with `probe` "grid" for the values
    of `lambdas`, "low" at a tenth of the lower scale of Prop. 4.1 (`0.1 sqrt(m) gamma / ||W||_2`)
    and "high" at ten times the upper one (`10 sqrt(m) gamma n^nu / ||W||_2`), and `label`,
    `residue_in_top2`, `q_in_top2`, `outliers` and `gap` (the outlying set's gap to the bulk,
    `bulk_gap`). `problems`: one per (nu, seed) with the spikes'
    norms `norm_S1`, `norm_S2`, `W_norm`, the two scales (`keeps_below`, `suppresses_above`) and the
    call at lambda = 0 (`label_0`, `residue_0`, `q_0`, `outliers_0`, `gap_0`, and `residue_outlying_0`, `q_outlying_0`; rows carry
    `residue_outlying`, `q_outlying`: `outlying_share`). fractions : for each spike S (S1 along X_B^T r,
    S2 along q) and each f, a row with `probe` "fraction", `spike` and `fraction` f at
    `lambda = f ||S||_2 / ||W||_2`, the strength in units of that spike's own measured norm
    (`spike_probes` reads them). workers : processes for the (nu, seed)
    problems (`lowrank.core.parallel.map_tasks`); each is seeded by its own seed, so the tables do not
    depend on it.
    """
    done = map_tasks(functools.partial(_weight_decay_problem, n=n, d=d, m=m, alpha=alpha, activation=activation,
                                       scaling=scaling, lambdas=list(lambdas), fractions=list(fractions)),
                     list(itertools.product(nus, seeds)), workers, desc="weight-decay problems")
    return pd.DataFrame([row for rows, _ in done for row in rows]), pd.DataFrame([problem for _, problem in done])


def _weight_decay_problem(task, *, n, d, m, alpha, activation, scaling, lambdas, fractions=()) -> tuple[list, dict]:
    from lowrank.gradients.decomposition import decompose_problem, spiked_problem

    nu, seed = task
    p = spiked_problem(n, d, m, alpha=alpha, nu=nu, activation=activation, scaling=scaling, seed=seed)
    dec = decompose_problem(p)
    sc = weight_decay_scales(p.W, gamma=p.gamma, n=n, nu=nu)
    x_res = p.data.X_B.T @ dec.r
    leading = min(6, *dec.G.shape)  # dominant_spike's max_outliers + 1: one SVD gives its call and the gap

    def call(G):
        top = top_singular(G, leading)
        c = dominant_spike(G, x_res, p.data.q, top=top)
        return c, bulk_gap(top.s.numpy(), c.outliers)

    base, gap_0 = call(dec.G)
    spikes = dec.spike_norms()
    problem = {"nu": nu, "seed": seed, "norm_S1": spikes["norm_S1"], "norm_S2": spikes["norm_S2"],
               "W_norm": sc.W_norm, "keeps_below": sc.keeps_spikes_below,
               "suppresses_above": sc.suppresses_spikes_above,
               "label_0": base.label, "residue_0": base.residue_in_top2, "q_0": base.q_in_top2,
               "outliers_0": base.outliers, "gap_0": gap_0,
               "residue_outlying_0": float(outlying_share(base.outliers, base.align_residue, base.residue_in_top2)),
               "q_outlying_0": float(outlying_share(base.outliers, base.align_q, base.q_in_top2))}
    probe = {"low": 0.1 * sc.keeps_spikes_below, "high": 10 * sc.suppresses_spikes_above}
    probes = [("grid", lam, None, None) for lam in lambdas] + [(tag, lam, None, None) for tag, lam in probe.items()]
    probes += [("fraction", f * spikes[norm] / sc.W_norm, spike, float(f))
               for spike, _, _, norm in SPIKE_SHARES for f in fractions]
    rows = []
    for tag, lam, spike, fraction in probes:
        c, gap = call(weight_decay_gradient(dec.G, p.W, lam))
        rows.append({"nu": nu, "seed": seed, "lam": lam, "probe": tag, "spike": spike, "fraction": fraction,
                     "label": c.label,
                     "residue_in_top2": c.residue_in_top2, "q_in_top2": c.q_in_top2, "outliers": c.outliers,
                     "gap": gap,
                     "residue_outlying": float(outlying_share(c.outliers, c.align_residue, c.residue_in_top2)),
                     "q_outlying": float(outlying_share(c.outliers, c.align_q, c.q_in_top2))})
    return rows, problem


SPIKE_SHARES = (("S1", "residue_in_top2", "residue_0", "norm_S1"), ("S2", "q_in_top2", "q_0", "norm_S2"))


def threshold_crossings(rows: pd.DataFrame, problems: pd.DataFrame, *, threshold: float) -> pd.DataFrame:
    """Where each spike leaves the top-two subspace as weight decay grows.

    For each problem (`weight_decay_sweep`'s tables) and each spike present at lambda = 0 (its share
    `residue_0` / `q_0` at least `threshold`), the first lambda of the grid at which its share drops
    below `threshold`, interpolated linearly in log lambda between that grid point and the one
    before: `lam_c`. A spike already below `threshold` at the grid's first lambda, or never below
    it, has no crossing (no row).

    Returns one row per crossing: `nu`, `seed`, `spike` ("S1" or "S2"), `lam_c` and `ratio =
    lam_c ||W||_2 / ||S||_2` (the strength in units of the spike's own norm).
    """
    if not 0 <= threshold <= 1:
        raise ValueError(f"threshold must be a share in [0, 1], got {threshold}")
    out = []
    for meta in problems.itertuples():
        grid = rows[(rows.nu == meta.nu) & (rows.seed == meta.seed) & (rows.probe == "grid")].sort_values("lam")
        for spike, col, at_zero, norm in SPIKE_SHARES:
            if getattr(meta, at_zero) < threshold:
                continue
            below = np.nonzero(grid[col].to_numpy() < threshold)[0]
            if not len(below) or below[0] == 0:
                continue
            i = below[0]
            l0, l1 = grid["lam"].iloc[i - 1], grid["lam"].iloc[i]
            v0, v1 = grid[col].iloc[i - 1], grid[col].iloc[i]
            lam_c = float(np.exp(np.interp(threshold, [v1, v0], [np.log(l1), np.log(l0)])))
            out.append({"nu": meta.nu, "seed": meta.seed, "spike": spike, "lam_c": lam_c,
                        "ratio": lam_c * meta.W_norm / getattr(meta, norm)})
    return pd.DataFrame(out, columns=["nu", "seed", "spike", "lam_c", "ratio"])


def input_noise_sweep(n: int, d: int, m: int, *, nu: float, alpha: float, activation: str, scaling: str, seeds,
                      tau2s, workers: int = 1) -> tuple[pd.DataFrame, dict]:
    """The noisy-input gradient `G'` for every seed and noise variance `tau2` (the noise of seed s is
    drawn with seed s + 100).

    Returns `(rows, spectra)`. `rows`: one per (seed, tau2) with `dominant_spike`'s `label`,
    `outliers`, `align_u1_residue`, `align_u1_q`; the spectral norms `norm_S1`, `norm_S12`, `norm_S2`,
    `norm_E` of the primed terms and the ratios `S1_over_E`, `S2_over_E`, `S2_over_S1`. `spectra`:
    `{tau2: (singular values of G', the norms)}` for the first seed. workers : processes for the
    (seed, tau2) problems (`lowrank.core.parallel.map_tasks`); each is seeded by its own seed, so the
    tables do not depend on it.
    """
    seeds = list(seeds)
    tasks = [(seed, tau2, seed == seeds[0]) for seed, tau2 in itertools.product(seeds, sorted(tau2s))]
    done = map_tasks(functools.partial(_noise_problem, n=n, d=d, m=m, nu=nu, alpha=alpha, activation=activation,
                                       scaling=scaling), tasks, workers, desc="input-noise problems")
    spectra = {tau2: kept for (_, tau2, _), (_, kept) in zip(tasks, done) if kept is not None}
    return pd.DataFrame([row for row, _ in done]), spectra


def _noise_problem(task, *, n, d, m, nu, alpha, activation, scaling) -> tuple[dict, tuple | None]:
    from lowrank.core.spectral import singular_values, top_singular_value
    from lowrank.gradients.decomposition import decompose_problem, spiked_problem
    from lowrank.gradients.rule_of_thumb import dominant_spike_of_problem

    seed, tau2, keep_spectrum = task
    p = spiked_problem(n, d, m, alpha=alpha, nu=nu, activation=activation, scaling=scaling, seed=seed)
    pn = noisy_problem(p, tau2, seed=seed + 100)
    dec = decompose_problem(pn)
    c = dominant_spike_of_problem(dec, pn.data)
    norms = {k[5:]: v for k, v in dec.spike_norms().items()} | {"E": top_singular_value(dec.E)}
    row = {"seed": seed, "tau2": tau2, "label": c.label, "outliers": c.outliers,
           "align_u1_residue": c.align_residue, "align_u1_q": c.align_q,
           **{f"norm_{k}": v for k, v in norms.items()},
           "S1_over_E": norms["S1"] / norms["E"], "S2_over_E": norms["S2"] / norms["E"],
           "S2_over_S1": norms["S2"] / norms["S1"]}
    return row, ((singular_values(dec.G).numpy(), norms) if keep_spectrum else None)


def jacobian_penalty_sweep(n: int, d: int, m: int, *, nu: float, alpha: float, activation: str, scaling: str, seeds,
                           lambdas, workers: int = 1) -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    """The total gradient `G(0) + G_reg(lambda)` under the Jacobian penalty, for every seed and lambda.

    Returns `(rows, spectra, balance)`. `rows`: one per (seed, lambda) with `dominant_spike`'s
    `label`, `outliers`, `align_u1_residue`, `align_u1_q`, `residue_in_top2`, `q_in_top2`, the norms
    `norm_S1`, `norm_S2` of G(0), `norm_S3` and `norm_E2` of the penalty's terms. `spectra`:
    `{lambda: singular values of the total gradient}` for the first seed. `balance`: one row per seed,
    `jacobian_balance_alignments` at the balance point `lambda_x` (fixed before any alignment is
    read) with `closed_with_S3` and `closed_without_S3`, the share of `1 - |cos(u1, q)|` removed by
    the penalty and by the penalty without its spike S3 (`misalignment_closed`). workers : processes
    for the seeds (`lowrank.core.parallel.map_tasks`); the tables do not depend on it.
    """
    seeds = list(seeds)
    done = map_tasks(functools.partial(_jacobian_seed, n=n, d=d, m=m, nu=nu, alpha=alpha, activation=activation,
                                       scaling=scaling, lambdas=list(lambdas)),
                     [(seed, seed == seeds[0]) for seed in seeds], workers, desc="Jacobian-penalty seeds")
    rows = [row for seed_rows, _, _ in done for row in seed_rows]
    spectra = next((kept for _, kept, _ in done if kept is not None), {})
    balance = pd.DataFrame([at_balance for _, _, at_balance in done])
    balance["closed_with_S3"] = misalignment_closed(balance["align_q_0"], balance["align_q_with_S3"])
    balance["closed_without_S3"] = misalignment_closed(balance["align_q_0"], balance["align_q_without_S3"])
    return pd.DataFrame(rows), spectra, balance


def _jacobian_seed(task, *, n, d, m, nu, alpha, activation, scaling, lambdas) -> tuple[list, dict | None, dict]:
    from lowrank.core.spectral import singular_values, top_singular_value
    from lowrank.gradients.decomposition import decompose_problem, spiked_problem

    seed, keep_spectra = task
    p = spiked_problem(n, d, m, alpha=alpha, nu=nu, activation=activation, scaling=scaling, seed=seed)
    dec = decompose_problem(p)
    x_res = p.data.X_B.T @ dec.r
    rows, spectra = [], {}
    for lam in lambdas:
        jp = jacobian_penalty_problem(p, lam)
        G = dec.G + jp.G_reg
        c = dominant_spike(G, x_res, p.data.q)
        rows.append({"seed": seed, "lam": lam, "label": c.label, "outliers": c.outliers,
                     "align_u1_residue": c.align_residue, "align_u1_q": c.align_q,
                     "residue_in_top2": c.residue_in_top2, "q_in_top2": c.q_in_top2,
                     **{k: v for k, v in dec.spike_norms().items() if k != "norm_S12"},
                     "norm_S3": jp.norm_S3(), "norm_E2": top_singular_value(jp.E2) if lam > 0 else 0.0})
        if keep_spectra:
            spectra[lam] = singular_values(G).numpy()
    # G_reg is linear in lambda: the penalty at lambda = 1 fixes the balance point
    at_balance = {"seed": seed, **jacobian_balance_alignments(dec.G, jacobian_penalty_problem(p, 1.0), x_res,
                                                               p.data.q)}
    return rows, (spectra if keep_spectra else None), at_balance


def jacobian_residue_shares(n: int, d: int, m: int, *, nu: float, alpha: float, activation: str, scaling: str, seeds,
                            lambdas, workers: int = 1) -> pd.DataFrame:
    """The residue spike's share `residue_in_top2` (and `label`) of `G(0) + lambda G_reg(1)` for every
    seed and lambda (`G_reg` is linear in lambda): Prop. 4.4's case nu > 1/2 + alpha/2. workers :
    processes for the seeds (`lowrank.core.parallel.map_tasks`); the table does not depend on it."""
    done = map_tasks(functools.partial(_residue_shares_seed, n=n, d=d, m=m, nu=nu, alpha=alpha,
                                       activation=activation, scaling=scaling, lambdas=list(lambdas)),
                     list(seeds), workers, desc="residue-share seeds")
    return pd.DataFrame([row for rows in done for row in rows])


def _residue_shares_seed(seed, *, n, d, m, nu, alpha, activation, scaling, lambdas) -> list:
    from lowrank.gradients.decomposition import decompose_problem, spiked_problem

    p = spiked_problem(n, d, m, alpha=alpha, nu=nu, activation=activation, scaling=scaling, seed=seed)
    dec = decompose_problem(p)
    G_reg_1 = jacobian_penalty_problem(p, 1.0).G_reg
    rows = []
    for lam in lambdas:
        c = dominant_spike(dec.G + lam * G_reg_1, p.data.X_B.T @ dec.r, p.data.q)
        rows.append({"seed": seed, "lam": lam, "residue_in_top2": c.residue_in_top2, "label": c.label})
    return rows
