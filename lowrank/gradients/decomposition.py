"""The inner-layer gradient of the two-layer network and its decomposition (Prop. 2.1, Sec. 3).

With `X = X_B + zeta z q^T` and `sigma'(X W^T) = 1 mu^T + sigma'_perp`, the transposed gradient

    G = (gamma / n) X^T [(r a^T) o sigma'(X W^T)]                       (d x m)

splits exactly into

    S1  = (gamma / n) (X_B^T r) (a o mu)^T                       residue spike
    S12 = (gamma zeta / n) (z^T r) q (a o mu)^T                  interpolant
    S2  = (gamma zeta / n) q [z^T ((r a^T) o sigma'_perp)]       data spike
    E   = (gamma / n) X_B^T [(r a^T) o sigma'_perp]              error

for any choice of `mu` (S12 and the display form of G are reconstructed: see the book's notation
page, book/notation.md).

Also here (Sections 4-5 and Remark 1 of the low-rank-gradients paper):

- the regularised gradients: weight decay (`weight_decay_gradient`, `weight_decay_scales`), input
  noise (`add_input_noise`, `noisy_problem`) and the Jacobian penalty (`jacobian_penalty_gradient`,
  split into the data spike `S3` and the bulk `E2`);
- the residue alignment `residue_alignment` and its exponent `residue_alignment_beta` (Assumption 6,
  the one estimate of beta in the package) and, for real data,
  `estimate_nu_alpha`, `spike_split` and `real_problem`;
- a valid 1-D convolution as a weight-tied two-layer network (`conv1d_weight_matrix`,
  `conv1d_forward`, `conv1d_problem`) and the filter gradient folded from the untied gradient
  (`conv1d_filter_gradient`, `conv1d_filter_low_rank`);
- which spike dominates: measured (`dominant_spike`, `call_problem`) and predicted by the rule of
  thumb of Section 5 (`rule_of_thumb`, `rule_of_thumb_boundaries`).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np
import torch

from lowrank.core.validation import as_tensor, check_choice, check_positive
from lowrank.core.data import SpikedData, generator, spiked_gaussian, triple_index_target
from lowrank.core.nets import activation as get_activation
from lowrank.core.nets import gamma_m, outer_weights, sphere_rows, two_layer_forward, weight_structure
from lowrank.core.spectral import alignment, count_outliers, orthonormal_basis, top_singular, top_singular_of_product

__all__ = [
    "Loss",
    "LOSSES",
    "loss_function",
    "mu_sample",
    "mu_quadrature",
    "Decomposition",
    "rank_one_norm",
    "decompose",
    "SpikedProblem",
    "spiked_problem",
    "decompose_problem",
    "spike_summary",
    # Section 4: regularisers
    "weight_decay_gradient",
    "WeightDecayScales",
    "weight_decay_scales",
    "spikes_kept_share",
    "spikes_gone_share",
    "tau2_from_rho",
    "add_input_noise",
    "noisy_problem",
    "JacobianPenaltyGradient",
    "jacobian_penalty",
    "jacobian_penalty_gradient",
    "jacobian_penalty_problem",
    # residue alignment, spectrum estimates
    "residue_alignment",
    "residue_alignment_beta",
    "SpectrumFit",
    "estimate_nu_alpha",
    "spike_split",
    "real_problem",
    "REAL_DATASETS",
    "real_data_matrix",
    # Remark 1: convolution
    "conv1d_weight_matrix",
    "conv1d_forward",
    "conv1d_filter_gradient",
    "ConvProblem",
    "conv1d_problem",
    "FilterLowRank",
    "conv1d_filter_low_rank",
    "conv1d_measure",
    # which spike dominates
    "SPIKE_LABELS",
    "SpikeCall",
    "dominant_spike",
    "rule_of_thumb",
    "rule_of_thumb_boundaries",
    "call_problem",
]


class Loss(NamedTuple):
    name: str
    value: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # per-sample loss(yhat, y)
    residue: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # d loss / d yhat


def _check_pm1(y):
    if not torch.all((y == 1) | (y == -1)):
        raise ValueError("the logistic loss needs labels y in {-1, +1}")


_LOSSES = {
    # (yhat - y)^2 / 2, so that the residue is f(x) - y exactly.
    "mse": Loss("mse", lambda f, y: 0.5 * (f - y) ** 2, lambda f, y: f - y),
    # log(1 + exp(-y f)) for labels in {-1, +1}.
    "logistic": Loss(
        "logistic",
        lambda f, y: torch.nn.functional.softplus(-y * f),
        lambda f, y: -y * torch.sigmoid(-y * f),
    ),
}
LOSSES = frozenset(_LOSSES)


def loss_function(name: str) -> Loss:
    check_choice(name, "loss", LOSSES)
    return _LOSSES[name]


def mu_sample(X, W, activation: str) -> torch.Tensor:
    """`mu_j` as the column mean of `sigma'(X W^T)`.

    Parameters
    ----------
    X : n x d inputs. W : m x d inner weights. activation : a name of `lowrank.core.nets.ACTIVATIONS`.

    Returns
    -------
    `mu`, shape (m,): `mu_j = (1/n) sum_i sigma'(w_j^T x_i)` (dimensionless).
    """
    return get_activation(activation).df(X @ W.T).mean(0)


# Breakpoints of the composite Gauss-Legendre rule on g in [0, _QUAD_LIMIT]: where the Gaussian
# weight changes (fixed in g) and where sigma'(s g) changes (fixed in s g, so at c / s).
_QUAD_GAUSS_BREAKS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.5, 8.0, 10.0, 13.0)
_QUAD_ACT_BREAKS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
_QUAD_LIMIT = 13.0  # phi(13) / phi(0) = e^-84.5: the tail beyond is below float64 resolution


def _expected_derivative(s: torch.Tensor, activation: str, nodes: int) -> torch.Tensor:
    """`E[sigma'(s g)]`, g ~ N(0, 1), for each entry of `s >= 0`, by a composite Gauss-Legendre
    rule on `g in [0, 13]` of the even integrand `(sigma'(s g) + sigma'(-s g)) phi(g)`."""
    df = get_activation(activation).df
    x, w = np.polynomial.legendre.leggauss(nodes)
    x = torch.as_tensor(x, dtype=torch.float64)
    w = torch.as_tensor(w, dtype=torch.float64)
    fixed = torch.tensor((0.0,) + _QUAD_GAUSS_BREAKS, dtype=torch.float64)
    scaled = torch.tensor(_QUAD_ACT_BREAKS, dtype=torch.float64)[None, :] / s.clamp(min=1e-300)[:, None]
    breaks = torch.cat([fixed.expand(s.shape[0], -1), scaled.clamp(max=_QUAD_LIMIT)], 1).sort(1).values
    lo, hi = breaks[:, :-1], breaks[:, 1:]  # m x K intervals (repeats have zero length)
    g = (lo + hi)[..., None] / 2 + (hi - lo)[..., None] / 2 * x  # m x K x nodes
    weight = (hi - lo)[..., None] / 2 * w * torch.exp(-0.5 * g * g) / math.sqrt(2 * math.pi)
    sg = s[:, None, None] * g
    return ((df(sg) + df(-sg)) * weight).sum((1, 2))


def mu_quadrature(W, Sigma, activation: str, nodes: int = 16) -> torch.Tensor:
    """`mu_j = E[sigma'(w_j^T x)]` for `x ~ N(0, Sigma)`, by quadrature.

    `w_j^T x ~ N(0, s_j^2)` with `s_j^2 = w_j^T Sigma w_j`, so each `mu_j = E[sigma'(s_j g)]`,
    `g ~ N(0, 1)`, is a one-dimensional Gaussian integral. It is computed by a composite
    Gauss-Legendre rule whose sub-intervals follow both scales of the integrand (the Gaussian's,
    fixed in g, and the activation's, at `c / s_j`), with a breakpoint at the kink 0 (ReLU, ELU):
    relative error below 1e-8 for `s_j` from 1e-3 to 1e3 and every activation (tested against
    `scipy.integrate.quad`). A plain Gauss-Hermite rule is not: once `s_j` reaches about 10 its
    nodes miss the narrow peak of `tanh'(s_j g)` (errors of 30 to 100 %).

    Parameters
    ----------
    W : m x d inner weights. Sigma : d x d input covariance. activation : a name of
    `lowrank.core.nets.ACTIVATIONS`. nodes : Gauss-Legendre nodes per sub-interval.

    Returns
    -------
    `mu`, shape (m,), dimensionless.
    """
    W = as_tensor(W, "W", min_ndim=2)
    Sigma = as_tensor(Sigma, "Sigma", min_ndim=2)
    if Sigma.shape != (W.shape[1], W.shape[1]):
        raise ValueError(f"Sigma must be {W.shape[1]} x {W.shape[1]}, got {tuple(Sigma.shape)}")
    if not isinstance(nodes, int) or nodes < 2:
        raise ValueError(f"nodes must be an integer >= 2, got {nodes!r}")
    get_activation(activation)
    s = ((W @ Sigma) * W).sum(1).clamp(min=0).sqrt()
    return _expected_derivative(s, activation, nodes)


def rank_one_norm(u, v) -> float:
    """`||u v^T||_2 = ||u||_2 ||v||_2`: the spectral norm of a rank-one matrix from its factors
    (exact; equal to its Frobenius norm). The book's norm of every rank-one spike (S1, S12, S2, S3)."""
    return float(torch.linalg.vector_norm(as_tensor(u, "u")) * torch.linalg.vector_norm(as_tensor(v, "v")))


class Decomposition(NamedTuple):
    """`G` and its four terms, all d x m (the transposed orientation of the gradient in W).

    The dense matrices are None when `decompose(..., dense=False)` did not form them; the spikes'
    `factors` and the `products` always give their norms and leading singular vectors (`top`).
    """

    G: torch.Tensor | None  # d x m, autograd
    S1: torch.Tensor | None
    S12: torch.Tensor | None
    S2: torch.Tensor | None
    E: torch.Tensor | None
    r: torch.Tensor  # n, residue
    mu: torch.Tensor  # m
    factors: dict | None = None  # {"S1": (u, v), "S12": (u, v), "S2": (u, v)} with S = u v^T
    products: dict | None = None  # {"G": (A, B), "E": (A, B)} with the term = A^T B (A n x d, B n x m)

    def identity_residual(self) -> float:
        """`||G - (S1 + S12 + S2 + E)||_F / ||G||_F`: zero up to round-off."""
        if self.G is None:
            raise ValueError("this Decomposition was built with dense=False: no matrices to compare")
        return float((self.G - (self.S1 + self.S12 + self.S2 + self.E)).norm() / self.G.norm())

    def top(self, term: str, k: int = 1, *, v0=None):
        """The `k` leading singular triplets of `G` or `E` (a `spectral.TopSingular`), from their
        product form `A^T B` without forming the d x m matrix (`top_singular_of_product`)."""
        check_choice(term, "term", {"G", "E"})
        if self.products is None:
            raise ValueError("this Decomposition carries no products (build it with `decompose`)")
        return top_singular_of_product(*self.products[term], k, v0=v0)

    def spike_norms(self) -> dict:
        """`{"norm_S1", "norm_S12", "norm_S2"}`: spectral norms of the three rank-one spikes by their
        closed form `||u|| ||v||` (`rank_one_norm`), in the units of the gradient."""
        if self.factors is None:
            raise ValueError("this Decomposition carries no factors (build it with `decompose`)")
        return {f"norm_{k}": rank_one_norm(*self.factors[k]) for k in ("S1", "S12", "S2")}


def decompose(
    X_B,
    z,
    q,
    zeta: float,
    W,
    a,
    y,
    *,
    activation: str,
    gamma: float,
    loss: str = "mse",
    mu: str = "sample",
    Sigma_hat=None,
    quadrature_nodes: int = 16,
    dense: bool = True,
) -> Decomposition:
    """Gradient `G` (autograd) of the mean loss in W, transposed, and its four terms (closed form).

    Parameters
    ----------
    X_B : n x d bulk inputs; z : (n,) spike coefficients; q : (d,) unit spike direction; zeta : the
        spike's size (`n^nu`); the inputs are `X = X_B + zeta z q^T`.
    W : m x d inner weights; a : (m,) outer weights; y : (n,) targets.
    activation : a name of `lowrank.core.nets.ACTIVATIONS`. gamma : gamma_m, the output scale
        (`f(x) = gamma a^T sigma(W x)`). loss : "mse" (`(f - y)^2 / 2`, residue `f - y`) or
        "logistic" (`log(1 + exp(-y f))`, labels +-1).
    mu : "sample" (column means of `sigma'(X W^T)`) or "quadrature" (`E[sigma'(w_j^T x)]` under
        `N(0, Sigma_hat + zeta^2 q q^T)`, `mu_quadrature`; needs `Sigma_hat`, d x d).
    quadrature_nodes : Gauss-Legendre nodes per sub-interval of `mu_quadrature`.
    dense : form `G` (by autograd) and the four d x m terms. False skips them (a third of the
        work: one n x d x m product instead of three); norms and leading vectors then come from the
        factors and products (`spike_norms`, `top`), which are kept either way.

    Returns
    -------
    `Decomposition`: `G` is the gradient of the mean loss `(1/n) sum_i loss(f(x_i), y_i)` in W,
    transposed (d x m), and `G = S1 + S12 + S2 + E` to round-off, for either `mu`.
    """
    X_B, z, q, W, a = _two_layer_inputs(X_B, z, q, W, a)
    n = X_B.shape[0]
    y = as_tensor(y, "y", min_ndim=1)
    if tuple(y.shape) != (n,):
        raise ValueError(f"y must have shape ({n},) (from X_B), got {tuple(y.shape)}")
    act = get_activation(activation)
    lossf = loss_function(loss)
    check_choice(mu, "mu", {"sample", "quadrature"})
    if loss == "logistic":
        _check_pm1(y)

    X = X_B + zeta * torch.outer(z, q)
    if dense:
        W_leaf = W.clone().requires_grad_(True)
        Z = X @ W_leaf.T  # pre-activations, n x m: computed once, reused below
        f = gamma * act.f(Z) @ a
        (grad_W,) = torch.autograd.grad(lossf.value(f, y).mean(), W_leaf)
        G, Z, f = grad_W.T, Z.detach(), f.detach()
    else:
        Z = X @ W.T
        G, f = None, gamma * act.f(Z) @ a
    r = lossf.residue(f, y)
    dsig = act.df(Z)  # sigma'(X W^T), n x m
    if mu == "sample":
        mu_vec = dsig.mean(0)
    else:
        if Sigma_hat is None:
            raise ValueError('mu="quadrature" needs Sigma_hat (the bulk covariance)')
        Sigma = as_tensor(Sigma_hat, "Sigma_hat", min_ndim=2) + zeta**2 * torch.outer(q, q)
        mu_vec = mu_quadrature(W, Sigma, activation, quadrature_nodes)
    perp = dsig - mu_vec[None, :]
    amu = a * mu_vec
    ra_perp = r[:, None] * a[None, :] * perp  # (r a^T) o sigma'_perp, n x m
    c = gamma / n
    # S = u v^T: the factors give the spikes' norms in closed form; G = c X^T [(r a^T) o sigma'] and
    # E = c X_B^T [(r a^T) o sigma'_perp] give G's and E's leading singular pairs without forming them
    factors = {"S1": (c * X_B.T @ r, amu), "S12": (c * zeta * float(z @ r) * q, amu), "S2": (c * zeta * q, z @ ra_perp)}
    products = {"G": (c * X, r[:, None] * a[None, :] * dsig), "E": (c * X_B, ra_perp)}
    if not dense:
        return Decomposition(None, None, None, None, None, r, mu_vec, factors, products)
    S1, S12, S2 = (torch.outer(*factors[k]) for k in ("S1", "S12", "S2"))
    E = c * X_B.T @ ra_perp
    return Decomposition(G, S1, S12, S2, E, r, mu_vec, factors, products)


class SpikedProblem(NamedTuple):
    """Everything one gradient computation needs: spiked data, a target, and the network."""

    data: SpikedData
    y: torch.Tensor
    W: torch.Tensor
    a: torch.Tensor
    gamma: float
    activation: str
    loss: str


def spiked_problem(n: int, d: int, m: int, *, alpha: float, nu: float, activation: str, loss: str = "mse",
                   weights: str = "isotropic", scaling: str = "ntk", target_link: str = "tanh",
                   noise_std: float = 0.0, tilt: float = 1.0, seed: int = 0) -> SpikedProblem:
    """Spiked Gaussian data, a triple-index target and a two-layer network, all from one seed.

    Parameters
    ----------
    n, d, m : samples, input dimension, width. alpha : bulk decay (`lambda_k = k^-alpha`).
    nu : spike size exponent (`zeta = n^nu`). activation, loss : see `decompose`.
    weights : "isotropic", "tilted" or "orthogonal" (`lowrank.core.nets.weight_structure`).
    scaling : "ntk" (gamma_m = 1/sqrt(m)) or "mf" (1/m). target_link, noise_std : the triple-index
    target. tilt : multiplies the tilt `n^(-1/4)` of "tilted" weights (1: the paper's).

    Returns
    -------
    `SpikedProblem`. For the logistic loss the labels are the signs of the triple-index target.
    Sub-seeds: data `seed`, target `seed + 1`, W `seed + 3`, a `seed + 4`.
    """
    get_activation(activation)
    loss_function(loss)
    data = spiked_gaussian(n, d, alpha, nu, seed)
    y, _ = triple_index_target(data.X, link=target_link, noise_std=noise_std, seed=seed + 1)
    if loss == "logistic":
        y = torch.where(y >= 0, 1.0, -1.0).to(torch.float64)
    W = weight_structure(weights, m, data.q, n, seed + 3, tilt)
    a = outer_weights(m, seed + 4)
    return SpikedProblem(data, y, W, a, gamma_m(m, scaling), activation, loss)


def decompose_problem(p: SpikedProblem, *, mu: str = "sample", dense: bool = True) -> Decomposition:
    D = p.data
    return decompose(D.X_B, D.z, D.q, D.zeta, p.W, p.a, p.y, activation=p.activation, gamma=p.gamma,
                     loss=p.loss, mu=mu, Sigma_hat=D.Sigma_hat, dense=dense)


OUTLIER_SEARCH = 5  # leading singular values examined for outliers (`count_outliers`'s default)


def spike_summary(dec: Decomposition, data: SpikedData, *, outlier_gap: float = 1.5, top: int = 5) -> dict:
    """The numbers Fig. 1 and its verdict read off one gradient.

    Norms are spectral norms (the spikes' by their closed form, `Decomposition.spike_norms`).
    `align_u1_residue` is the alignment of G's leading left singular
    vector with `X_B^T r` (S1's left vector), `align_u1_q` with the spike q, and `q_in_top2` is
    `||U_2^T q||`, the part of q inside G's top-two left singular subspace. `align_right_S1_S2` is
    `|cos(a o mu, z^T((r a^T) o sigma'_perp))|`, the alignment of the right vectors of S1 (and S12)
    and of S2: near 1, `S1 + S12 + S2` is close to rank one whatever its left vectors.
    """
    U, s, _ = dec.top("G", max(top, OUTLIER_SEARCH + 1, 2))  # only the top is read: no full SVD
    U2 = U[:, :2]
    row = {
        "identity_residual": dec.identity_residual(),
        "outliers": count_outliers(s, max_outliers=OUTLIER_SEARCH, gap=outlier_gap),
        **dec.spike_norms(),
        "norm_E": float(dec.top("E").s[0]),
        "align_u1_residue": alignment(U2[:, 0], data.X_B.T @ dec.r),
        "align_u1_q": alignment(U2[:, 0], data.q),
        "q_in_top2": float((U2.T @ data.q).norm()),
        "align_right_S1_S2": alignment(dec.factors["S1"][1], dec.factors["S2"][1]),
    }
    row.update({f"s{i + 1}": float(v) for i, v in enumerate(s[:top])})
    return row


# --------------------------------------------------------------------------------------------
# Section 4: the regularised gradients (weight decay, input noise, Jacobian penalty)
# --------------------------------------------------------------------------------------------


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


def spikes_kept_share(rows, *, threshold: float) -> float:
    """Share of configurations (rows) that keep every spike present without weight decay.

    A spike is present when its direction has at least `threshold` of its norm in G's top-two left
    singular subspace: the residue direction `residue_in_top2` and the data spike `q_in_top2` at the
    row's lambda, `residue_0` and `q_0` at lambda = 0 (`dominant_spike`'s numbers). A spike absent at
    lambda = 0 cannot be lost.
    """
    _spike_columns(rows, ("residue_0", "q_0", "residue_in_top2", "q_in_top2"))
    kept = ((rows["residue_0"] < threshold) | (rows["residue_in_top2"] >= threshold)) & (
        (rows["q_0"] < threshold) | (rows["q_in_top2"] >= threshold))
    return float(kept.mean())


def spikes_gone_share(rows, *, threshold: float) -> float:
    """Share of configurations in which neither spike is present (both `residue_in_top2` and
    `q_in_top2` below `threshold`): weight decay has buried both."""
    _spike_columns(rows, ("residue_in_top2", "q_in_top2"))
    return float(((rows["residue_in_top2"] < threshold) & (rows["q_in_top2"] < threshold)).mean())


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


def _two_layer_inputs(X_B, z, q, W, a):
    X_B = as_tensor(X_B, "X_B", min_ndim=2)
    n, d = X_B.shape
    z = as_tensor(z, "z", min_ndim=1)
    q = as_tensor(q, "q", min_ndim=1)
    W = as_tensor(W, "W", min_ndim=2)
    a = as_tensor(a, "a", min_ndim=1)
    m = W.shape[0]
    for name, t, shape in (("z", z, (n,)), ("q", q, (d,)), ("W", W, (m, d)), ("a", a, (m,))):
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} (from X_B {n} x {d} and W {m} rows), got {tuple(t.shape)}")
    return X_B, z, q, W, a


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
    X_B, z, q, W, a = _two_layer_inputs(X_B, z, q, W, a)
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


# --------------------------------------------------------------------------------------------
# Residue alignment (Assumption 6), spectrum estimates for real data
# --------------------------------------------------------------------------------------------


def residue_alignment(z, r) -> float:
    """`|z^T r| / (sqrt(n) ||r||_2)`, the statistic of Assumption 6 (`Theta(d^(-beta/2))`).

    Parameters
    ----------
    z : (n,) the spike's coefficients (`X = X_B + zeta z q^T`). r : (n,) the residue.

    Returns
    -------
    A number in [0, ||z|| / sqrt(n)] (about [0, 1]); dimensionless. Raises for a zero residue.
    """
    z = as_tensor(z, "z", min_ndim=1)
    r = as_tensor(r, "r", min_ndim=1)
    if z.shape != r.shape or z.ndim != 1:
        raise ValueError(f"z and r must be vectors of one length, got {tuple(z.shape)} and {tuple(r.shape)}")
    nr = float(r.norm())
    if nr == 0:
        raise ValueError("r is the zero vector: its alignment is undefined")
    return abs(float(z @ r)) / (math.sqrt(z.shape[0]) * nr)


def residue_alignment_beta(z, r, d: int) -> float:
    """Single-draw estimate `beta_hat = -2 log(residue_alignment(z, r)) / log d` of Assumption 6.

    The package's one estimate of beta. For `r` independent of `z`, `|z^T r| / ||r||` is about
    `|N(0, 1)|`, so `beta_hat` is about `log n / log d` (close to 1 in the proportional regime)
    with a spread of order `2 / log d` from a single draw; the slope of `residue_alignment` against
    d over several sizes (`beta = -2 slope`) is steadier.

    Parameters
    ----------
    z : (n,) spike coefficients. r : (n,) residue (non-zero). d : the input dimension (>= 2).

    Returns
    -------
    `beta_hat` (dimensionless). When `z^T r = 0` exactly the alignment is smaller than any power
    of d and the estimate is `math.inf` (the rule of thumb then reads "residue weakly aligned").
    """
    if not isinstance(d, int) or d < 2:
        raise ValueError(f"d must be an integer >= 2, got {d!r}")
    ratio = residue_alignment(z, r)
    return math.inf if ratio == 0 else -2 * math.log(ratio) / math.log(d)


class SpectrumFit(NamedTuple):
    """`nu` and `alpha` read off the eigenvalues of a data matrix's second-moment matrix."""

    nu: float  # log(zeta2) / (2 log n), 0 when there is no excess
    alpha: float  # minus the log-log slope of the bulk eigenvalues over `fit_range`
    zeta2: float  # excess of the top eigenvalue over the fitted bulk's first eigenvalue, in bulk units
    bulk_scale: float  # exp(intercept): the fitted bulk's first eigenvalue
    fit_range: tuple  # (j_lo, j_hi): bulk indices, 1-based and inclusive (bulk j = eigenvalue j + 1)
    r2: float  # R^2 of the log-log fit
    eigenvalues: torch.Tensor  # all eigenvalues, descending
    q: torch.Tensor  # the top eigenvector (the spike direction)
    n: int
    nu_absolute: float  # log(ell_1) / (2 log n): the top eigenvalue itself read as zeta^2 (unit-dependent)


def estimate_nu_alpha(X, *, fit_range=(1, None), center: bool = False) -> SpectrumFit:
    """Estimate the spike exponent `nu` and the bulk decay `alpha` of Assumption 2 from data.

    Method (the paper's own estimator is in its appendix, which the book does not have):

    1. `ell_1 >= ell_2 >= ...` are the eigenvalues of `X^T X / n` (the second-moment matrix of the
       inputs as the network sees them; `center=True` subtracts the column means first).
    2. The top eigenvalue is the spike; the bulk's j-th eigenvalue is `ell_{j+1}` (a rank-one spike
       shifts the bulk's indices by one, by interlacing). The bulk is fitted as
       `ell_{j+1} = b j^(-alpha)` by least squares of `log ell_{j+1}` on `log j` over
       `j_lo <= j <= j_hi` (default `j_lo = 1`, `j_hi = floor(min(n, d) / 2)`, leaving out the
       tail that finite samples and a noise floor distort).
    3. In the model `Sigma = Sigma_hat + zeta^2 q q^T` with `lambda_1(Sigma_hat) = 1`, the top
       eigenvalue is about `1 + zeta^2` in bulk units, so `zeta^2 = max(ell_1 / b - 1, 0)` and
       `nu = log(zeta^2) / (2 log n)` (0 when `zeta^2 <= 1`). `nu_absolute = log(ell_1) / (2 log n)`
       reads the top eigenvalue itself as `zeta^2`; it agrees with `nu` for the model's units
       (`lambda_1(Sigma_hat) = 1`, large spike) but depends on the units of the data.

    Known bias: a finite sample spreads the eigenvalues (Marchenko-Pastur), which adds an apparent
    decay of order `sqrt(d / n)` to `alpha` (about +0.04 at n/d = 200 for alpha = 0).
    """
    X = as_tensor(X, "X", min_ndim=2)
    if X.ndim != 2:
        raise ValueError(f"X must be a matrix (n x d), got shape {tuple(X.shape)}")
    n, d = X.shape
    if center:
        X = X - X.mean(0, keepdim=True)
    M = X.T @ X / n
    evals, evecs = torch.linalg.eigh(M)
    evals, evecs = evals.flip(0).clamp(min=0), evecs.flip(1)
    rank = min(n, d)
    lo, hi = fit_range
    hi = rank // 2 if hi is None else hi
    if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo and lo + 2 <= hi <= rank - 1):
        raise ValueError(f"fit_range must be bulk indices 1 <= j_lo, j_lo + 2 <= j_hi <= min(n, d) - 1 = "
                         f"{rank - 1}; got ({lo}, {hi})")
    js = torch.arange(lo, hi + 1, dtype=torch.float64)
    ev = evals[lo: hi + 1]  # bulk eigenvalue j is ell_{j+1}, i.e. evals[j]
    if (ev <= 0).any():
        raise ValueError(f"eigenvalues in the fit range {fit_range} are not all positive: shorten the range")
    x, y = js.log(), ev.log()
    A = torch.stack([torch.ones_like(x), x], 1)
    coef = torch.linalg.lstsq(A, y[:, None]).solution[:, 0]
    resid = y - A @ coef
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float((resid**2).sum()) / ss if ss > 0 else 1.0
    b = float(coef[0].exp())
    zeta2 = max(float(evals[0]) / b - 1, 0.0)
    nu = math.log(zeta2) / (2 * math.log(n)) if zeta2 > 1 else 0.0
    l1 = float(evals[0])
    nu_abs = math.log(l1) / (2 * math.log(n)) if l1 > 1 else 0.0
    return SpectrumFit(nu, float(-coef[1]), zeta2, b, (lo, hi), r2, evals, evecs[:, 0], n, nu_abs)


def spike_split(X, q=None) -> SpikedData:
    """Write a data matrix as `X = X_B + zeta z q^T` (exactly), for real data.

    `q` defaults to the top eigenvector of `X^T X / n`; `zeta z = X q` with `zeta = ||X q|| / sqrt(n)`
    (so `||z||^2 = n`, like a standard Gaussian vector), `X_B = X - X q q^T`, and `Sigma_hat` is the
    sample second-moment matrix of `X_B`. The gradient decomposition is exact for any such split.
    """
    X = as_tensor(X, "X", min_ndim=2)
    n, d = X.shape
    if q is None:
        q = torch.linalg.eigh(X.T @ X / n).eigenvectors[:, -1]
    q = as_tensor(q, "q", min_ndim=1)
    if q.shape != (d,):
        raise ValueError(f"q must have shape ({d},), got {tuple(q.shape)}")
    q = q / q.norm()
    proj = X @ q
    zeta = float(proj.norm()) / math.sqrt(n)
    if zeta == 0:
        raise ValueError("X has no component along q")
    X_B = X - torch.outer(proj, q)
    return SpikedData(X, X_B, proj / zeta, q, zeta, X_B.T @ X_B / n)


def real_problem(X, y, *, width: int, activation: str, scaling: str = "ntk", loss: str = "mse",
                 seed: int = 0) -> SpikedProblem:
    """A two-layer network on a real data matrix `X` (n x d) with targets `y`: the data are split as
    `X = X_B + zeta z q^T` by `spike_split` (q the top eigenvector), `W` has rows uniform on the
    sphere (sub-seed `seed + 3`) and `a_j = +-1` (sub-seed `seed + 4`), as in `spiked_problem`."""
    get_activation(activation)
    loss_function(loss)
    X = as_tensor(X, "X", min_ndim=2)
    y = as_tensor(y, "y", min_ndim=1)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise ValueError(f"X must be n x d and y of length n, got {tuple(X.shape)} and {tuple(y.shape)}")
    if loss == "logistic":
        _check_pm1(y)
    if not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be a positive integer, got {width!r}")
    data = spike_split(X)
    W = sphere_rows(width, X.shape[1], seed + 3)
    a = outer_weights(width, seed + 4)
    return SpikedProblem(data, y, W, a, gamma_m(width, scaling), activation, loss)


REAL_DATASETS = frozenset({"digits", "mnist1d", "mnist"})


def real_data_matrix(name: str, *, data_root=None, max_samples: int = 4000, standardize: bool = False,
                     positive_classes=(5, 6, 7, 8, 9)):
    """Training inputs of a real data set as an n x d float64 matrix and +-1 targets (Fig. 8's inputs).

    Parameters
    ----------
    name : "digits" (scikit-learn), "mnist1d" (generated) or "mnist" (the four IDX files read from
        `data_root`; nothing is downloaded). data_root : folder of the MNIST files, default
        `lowrank.core.datasets.DEFAULT_DATA_ROOT`. max_samples : at most this many training inputs.
    standardize : False keeps the raw inputs (pixel values in [0, 1], MNIST-1D as generated); True
        z-scores every feature. positive_classes : labels mapped to y = +1, the others to -1.

    Returns
    -------
    `(X, y)`: X of shape n x d (flattened inputs), y of shape (n,) in {-1, +1}. Raises
    FileNotFoundError when the MNIST files are not in `data_root`.
    """
    from pathlib import Path

    from lowrank.core import datasets

    check_choice(name, "dataset", REAL_DATASETS)
    if not isinstance(max_samples, int) or max_samples < 1:
        raise ValueError(f"max_samples must be a positive integer, got {max_samples!r}")
    if name == "digits":
        ds = datasets.digits(standardize=False)
    elif name == "mnist1d":
        ds = datasets.mnist1d(standardize=False)
    else:
        root = datasets.DEFAULT_DATA_ROOT if data_root in (None, "") else data_root
        ds = datasets.mnist(Path(root).expanduser(), normalize=False)
    k = min(max_samples, len(ds.x_train))
    X = torch.as_tensor(ds.x_train[:k]).reshape(k, -1).to(torch.float64)
    if standardize:
        std = X.std(0)
        X = (X - X.mean(0)) / torch.where(std > 0, std, torch.ones_like(std))
    labels = torch.as_tensor(ds.y_train[:k])
    y = torch.where(torch.isin(labels, torch.as_tensor(list(positive_classes))), 1.0, -1.0).to(torch.float64)
    return X, y


# --------------------------------------------------------------------------------------------
# Remark 1: a 1-D convolution as a weight-tied two-layer network
# --------------------------------------------------------------------------------------------


def _conv_index(m: int, k: int) -> torch.Tensor:
    return torch.arange(m)[:, None] + torch.arange(k)[None, :]  # W[j, j + i] = w[i]


def conv1d_weight_matrix(w, d: int) -> torch.Tensor:
    """The m x d weight-tied matrix of a valid 1-D convolution (stride 1) with filter `w` (length
    k): `W[j, j + i] = w[i]`, zero elsewhere, `m = d - k + 1` (Remark 1). Row norms equal `||w||`."""
    w = as_tensor(w, "w", min_ndim=1)
    if w.ndim != 1:
        raise ValueError(f"w must be a vector, got shape {tuple(w.shape)}")
    k = w.shape[0]
    if not isinstance(d, int) or d < k:
        raise ValueError(f"d must be an integer >= the filter length {k}, got {d!r}")
    m = d - k + 1
    W = torch.zeros(m, d, dtype=torch.float64)
    W[torch.arange(m)[:, None], _conv_index(m, k)] = w
    return W


def conv1d_forward(X, w, a, *, activation: str, gamma: float) -> torch.Tensor:
    """`f(x) = gamma a^T sigma(conv(x, w))` with `torch.nn.functional.conv1d` (a cross-correlation,
    valid, stride 1): the convolutional network itself, differentiable in the filter `w`."""
    act = get_activation(activation)
    if X.ndim != 2 or w.ndim != 1 or a.shape != (X.shape[1] - w.shape[0] + 1,):
        raise ValueError(f"shapes do not fit: X {tuple(X.shape)}, w {tuple(w.shape)}, a {tuple(a.shape)} "
                         f"(a needs d - k + 1 entries)")
    pre = torch.nn.functional.conv1d(X[:, None, :], w[None, None, :])[:, 0, :]  # n x m
    return gamma * act.f(pre) @ a


def conv1d_filter_gradient(G, k: int) -> torch.Tensor:
    """The filter gradient from the untied gradient: `g_i = sum_j G[j + i, j]` (i = 0..k-1).

    `G` is the book's transposed d x m gradient (`G = (dL/dW)^T`); in the m x d orientation of
    Remark 1 this is the sum of the i-th superdiagonal, `g_i = sum_j (dL/dW)[j, j + i]`, because
    every entry `W[j, j + i]` is the same parameter `w_i` (chain rule for tied weights).
    """
    G = as_tensor(G, "G", min_ndim=2)
    if G.ndim != 2:
        raise ValueError(f"G must be a matrix, got shape {tuple(G.shape)}")
    d, m = G.shape
    if not isinstance(k, int) or k < 1 or m != d - k + 1:
        raise ValueError(f"G is {d} x {m}, which needs a filter of length k = d - m + 1 = {d - m + 1}, got {k!r}")
    return G.T[torch.arange(m)[:, None], _conv_index(m, k)].sum(0)


class ConvProblem(NamedTuple):
    problem: SpikedProblem  # its W is the weight-tied m x d matrix of the filter
    w: torch.Tensor  # the filter, length k, unit norm


def conv1d_problem(n: int, d: int, k: int, *, alpha: float, nu: float, activation: str, loss: str = "mse",
                   scaling: str = "ntk", target_link: str = "tanh", outer: str = "random",
                   seed: int = 0) -> ConvProblem:
    """Spiked data, a triple-index target and a valid 1-D convolution with one unit-norm filter
    (uniform on the sphere S^{k-1}), written as the weight-tied two-layer network of Remark 1.

    `outer="random"`: `a_j` uniform on {-1, +1} (Assumption 3); `outer="ones"`: `a_j = 1` (a sum
    over positions, i.e. global pooling). Sub-seeds as in `spiked_problem`: data `seed`, target
    `seed + 1`, filter `seed + 3`, a `seed + 4`.
    """
    check_choice(outer, "outer", {"random", "ones"})
    if not isinstance(k, int) or not 1 <= k <= d:
        raise ValueError(f"k must be an integer in [1, d], got {k!r}")
    get_activation(activation)
    loss_function(loss)
    data = spiked_gaussian(n, d, alpha, nu, seed)
    y, _ = triple_index_target(data.X, link=target_link, seed=seed + 1)
    if loss == "logistic":
        y = torch.where(y >= 0, 1.0, -1.0).to(torch.float64)
    w = torch.randn(k, generator=generator(seed + 3), dtype=torch.float64)
    w = w / w.norm()
    m = d - k + 1
    a = outer_weights(m, seed + 4) if outer == "random" else torch.ones(m, dtype=torch.float64)
    W = conv1d_weight_matrix(w, d)
    return ConvProblem(SpikedProblem(data, y, W, a, gamma_m(m, scaling), activation, loss), w)


class FilterLowRank(NamedTuple):
    g: torch.Tensor  # k, the true filter gradient
    g_low: torch.Tensor  # k, the filter gradient of G's best rank-`rank` approximation
    components: torch.Tensor  # k x rank: the filter gradients of u_l v_l^T (no singular value)
    error: float  # ||g - g_low|| / ||g||: what the rank-`rank` part of G leaves out
    subspace_error: float  # ||g - P g|| / ||g||, P the projection on span(components, extra)


def conv1d_filter_low_rank(G, k: int, rank: int = 2, extra=None) -> FilterLowRank:
    """How far the filter gradient is from the span of the filter images of G's top singular pairs.

    With `G = sum_l s_l u_l v_l^T` (d x m), each rank-one term maps to the filter vector
    `c_l[i] = sum_j u_l[j + i] v_l[j]` (a correlation of the two singular vectors, Remark 1), and
    `g = sum_l s_l c_l` exactly. `error` measures the tail `l > rank`; `subspace_error` the distance
    of `g` from `span(c_1..c_rank)`, optionally with `extra` directions (k x p) added.
    """
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be a positive integer, got {rank!r}")
    g = conv1d_filter_gradient(G, k)
    G = as_tensor(G, "G")
    U, s, Vh = top_singular(G, min(rank, min(G.shape)))
    rank = s.shape[0]
    comps = torch.stack([conv1d_filter_gradient(torch.outer(U[:, l], Vh[l]), k) for l in range(rank)], 1)
    g_low = comps @ s[:rank]
    basis = comps
    if extra is not None:
        extra = as_tensor(extra, "extra", min_ndim=1)
        extra = extra[:, None] if extra.ndim == 1 else extra
        if extra.shape[0] != k:
            raise ValueError(f"extra must have {k} rows, got {tuple(extra.shape)}")
        basis = torch.cat([comps, extra], 1)
    Q = orthonormal_basis(basis, "the filter images")
    gn = float(g.norm())
    if gn == 0:
        raise ValueError("the filter gradient is zero")
    return FilterLowRank(g, g_low, comps, float((g - g_low).norm()) / gn,
                         float((g - Q @ (Q.T @ g)).norm()) / gn)


def conv1d_measure(n: int, d: int, k: int, *, nu: float, activation: str, scaling: str, alpha: float = 0.0,
                   outer: str = "random", seed: int = 0) -> tuple[dict, Decomposition, FilterLowRank, torch.Tensor]:
    """One convolution problem (`conv1d_problem`, MSE loss) measured for Remark 1.

    Parameters
    ----------
    n, d, k : samples, signal length, filter length (m = d - k + 1 positions). nu, alpha : the spiked
    data. activation, scaling, outer, seed : as in `conv1d_problem`.

    Returns
    -------
    `(row, dec, r2, w)`: `row` holds `fold_vs_autograd` (relative error of the fold of G against
    autograd of `conv1d_forward`, never building W), `eps1`, `eps2` (errors of the rank-one and
    rank-two folds, relative to ||g||), `eps2_subspace`, `eps2_plus_w` (with the filter w added to the
    span), `residual_along_w` and `residual_along_random` (|cos| of g - fold(G_2) with w and with a
    random direction drawn from `seed + 7`), `g_along_w`, G's outlier count and `s2/s1`, `s3/s1`,
    and `fold_<term>` (the fold of each term over ||g||); `dec`, `r2` (`FilterLowRank`, rank 2) and
    the filter `w`.
    """
    cp = conv1d_problem(n, d, k, alpha=alpha, nu=nu, activation=activation, scaling=scaling, outer=outer, seed=seed)
    p, w = cp.problem, cp.w
    dec = decompose_problem(p)
    w_leaf = w.clone().requires_grad_(True)
    f = conv1d_forward(p.data.X, w_leaf, p.a, activation=activation, gamma=p.gamma)
    (g_conv,) = torch.autograd.grad(loss_function("mse").value(f, p.y).mean(), w_leaf)
    r1 = conv1d_filter_low_rank(dec.G, k, rank=1)
    r2 = conv1d_filter_low_rank(dec.G, k, rank=2)
    r2w = conv1d_filter_low_rank(dec.G, k, rank=2, extra=w)
    resid = r2.g - r2.g_low
    g_norm = float(r2.g.norm())
    s = top_singular(dec.G, min(OUTLIER_SEARCH + 1, min(dec.G.shape))).s
    random_dir = torch.randn(k, generator=generator(seed + 7), dtype=torch.float64)
    has_resid = float(resid.norm()) > 0
    row = {"n": n, "d": d, "nu": nu, "activation": activation, "scaling": scaling, "seed": seed,
           "fold_vs_autograd": float((r2.g - g_conv).norm() / g_conv.norm()),
           "eps1": r1.error, "eps2": r2.error, "eps2_subspace": r2.subspace_error, "eps2_plus_w": r2w.subspace_error,
           "residual_along_w": alignment(resid, w) if has_resid else 0.0,
           "residual_along_random": alignment(resid, random_dir) if has_resid else 0.0,
           "g_along_w": float(abs(r2.g @ w) / g_norm), "outliers": count_outliers(s, max_outliers=OUTLIER_SEARCH),
           "s2_over_s1": float(s[1] / s[0]), "s3_over_s1": float(s[2] / s[0])}
    for term in ("S1", "S12", "S2", "E"):
        row[f"fold_{term}"] = float(conv1d_filter_gradient(getattr(dec, term), k).norm()) / g_norm
    return row, dec, r2, w


# --------------------------------------------------------------------------------------------
# Which spike dominates: measured (from G) and predicted (Section 5's rule of thumb)
# --------------------------------------------------------------------------------------------

SPIKE_LABELS = ("residue", "data", "both", "none")


class SpikeCall(NamedTuple):
    label: str  # one of SPIKE_LABELS
    outliers: int
    align_residue: float  # |cos(u1, X_B^T r)|
    align_q: float  # |cos(u1, q)|
    residue_in_top2: float  # ||U_2^T x|| with x = X_B^T r / ||X_B^T r||
    q_in_top2: float  # ||U_2^T q||
    second_ratio: float  # s_2 / s_1 of G


def dominant_spike(G, residue_direction, q, *, gap: float = 1.5, max_outliers: int = 5,
                   subspace_threshold: float = 0.5, min_ratio: float = 0.1) -> SpikeCall:
    """Which spike dominates a gradient `G` (d x m), read off its spectrum and singular vectors.

    Parameters
    ----------
    G : d x m gradient, or a `Decomposition` (its product form, no matrix formed). residue_direction : (d,), `X_B^T r`. q : (d,) spike direction.
    gap : the ratio `s_k / s_{k+1}` that separates an outlier (`count_outliers`); max_outliers : how
    many leading values are examined; subspace_threshold : share of a direction in `U_2` that counts
    as "inside"; min_ratio : `s_2 / s_1` below which G counts as rank one.

    Returns
    -------
    `SpikeCall` (label one of SPIKE_LABELS, and the numbers behind it, dimensionless).

    Criterion, in order:

    - `"none"`: no singular value is separated from the bulk (`count_outliers(G, max_outliers,
      gap) == 0`, i.e. no ratio `s_k / s_{k+1} >= gap` among the top `max_outliers + 1`);
    - `"both"` (rank two): at least two outliers, a second singular value of at least
      `min_ratio` times the first (otherwise G is rank one up to a relative error below
      `min_ratio`), and the top-two left singular subspace `U_2` holds at least
      `subspace_threshold` of both the residue direction `x = X_B^T r` (`||U_2^T x|| / ||x||`)
      and the data spike `q` (`||U_2^T q||`);
    - otherwise the leading left singular vector `u1` decides: `"residue"` when
      `|cos(u1, X_B^T r)| >= |cos(u1, q)|`, else `"data"`.

    `residue_direction` is `X_B^T r` (or `X'_B^T r'` under input noise).
    """
    if isinstance(G, Decomposition):  # its product form: no d x m matrix is formed
        A, B = G.products["G"]
        (rows, cols), top = (A.shape[1], B.shape[1]), G.top
    else:
        G = as_tensor(G, "G", min_ndim=2)
        (rows, cols), top = G.shape, lambda _, k: top_singular(G, k)
    if not 0 < subspace_threshold <= 1:
        raise ValueError(f"subspace_threshold must be in (0, 1], got {subspace_threshold}")
    if not 0 <= min_ratio <= 1:
        raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")
    x = as_tensor(residue_direction, "residue_direction", min_ndim=1)
    q = as_tensor(q, "q", min_ndim=1)
    if x.shape != (rows,) or q.shape != (rows,):
        raise ValueError(f"residue_direction and q must have G's {rows} rows, got "
                         f"{tuple(x.shape)} and {tuple(q.shape)}")
    U, s, _ = top("G", min(max(max_outliers + 1, 2), rows, cols))
    k = count_outliers(s, max_outliers=max_outliers, gap=gap)
    U2 = U[:, :2]
    a_res, a_q = alignment(U2[:, 0], x), alignment(U2[:, 0], q)
    x_in = float((U2.T @ (x / x.norm())).norm())
    q_in = float((U2.T @ (q / q.norm())).norm())
    ratio = float(s[1] / s[0]) if s.numel() > 1 and s[0] > 0 else 0.0
    if k == 0:
        label = "none"
    elif k >= 2 and ratio >= min_ratio and x_in >= subspace_threshold and q_in >= subspace_threshold:
        label = "both"
    else:
        label = "residue" if a_res >= a_q else "data"
    return SpikeCall(label, k, float(a_res), float(a_q), x_in, q_in, ratio)


def rule_of_thumb(nu: float, alpha: float, beta: float, *, large_input_noise: bool = False,
                  large_jacobian_penalty: bool = False) -> str:
    """Section 5's rule of thumb: which spike dominates the gradient at initialisation.

    Parameters
    ----------
    nu, alpha : the spike and bulk exponents; beta : Assumption 6's exponent (`math.inf` allowed).
    large_input_noise, large_jacobian_penalty : the rule's two regulariser cases (flags).

    Returns
    -------
    One of "residue", "data", "both":

    - `"residue"` (S1) iff `2 nu < min{1/2, beta - alpha, 1 - alpha}`, or under large isotropic
      input noise (stated in the paper);
    - `"data"` (q) iff `2 nu > beta` and either `nu >= 1/2` (Theorem 3.2: rank one along
      `S12 + S2`) or `nu < 1/4` (Theorem 3.1: `S12`, along q, dominates `S1 + S12`), or under a
      large Jacobian penalty. The paper's formula for this case is lost from its text; this is the
      book's reconstruction from Theorems 3.1 and 3.2 (the book's notation page, book/notation.md);
    - `"both"` otherwise: both spikes remain and the gradient is typically rank two.
    """
    for name, v in (("nu", nu), ("alpha", alpha), ("beta", beta)):
        if not isinstance(v, (int, float)) or math.isnan(v):
            raise ValueError(f"{name} must be a number, got {v!r}")
    if large_input_noise and large_jacobian_penalty:
        raise ValueError("the rule of thumb has no case for large input noise and a large Jacobian penalty together")
    if large_input_noise:
        return "residue"
    if large_jacobian_penalty:
        return "data"
    if 2 * nu < min(0.5, beta - alpha, 1 - alpha):
        return "residue"
    if 2 * nu > beta and (nu >= 0.5 or nu < 0.25):
        return "data"
    return "both"


def rule_of_thumb_boundaries(beta: float) -> dict:
    """The lines of the rule in the (alpha, nu) plane for a given `beta`, as functions of alpha:
    `nu = 1/4`, `nu = (beta - alpha)/2`, `nu = (1 - alpha)/2` (residue region below all three),
    `nu = 1/2` and `nu = beta/2` (data region above both)."""
    return {
        "nu = 1/4": lambda al: 0.25 + 0 * al,
        "nu = (beta - alpha)/2": lambda al: (beta - al) / 2,
        "nu = (1 - alpha)/2": lambda al: (1 - al) / 2,
        "nu = 1/2": lambda al: 0.5 + 0 * al,
        "nu = beta/2": lambda al: beta / 2 + 0 * al,
    }


def call_problem(dec: Decomposition, data: SpikedData, **kwargs) -> SpikeCall:
    """`dominant_spike` for a decomposed problem: residue direction `X_B^T r`, spike `q`."""
    return dominant_spike(dec, data.X_B.T @ dec.r, data.q, **kwargs)
