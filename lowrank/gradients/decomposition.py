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

The other topics of Part I's pages have modules of their own: the regularised gradients
(`lowrank.gradients.regularization`), the residue alignment and which spike dominates
(`lowrank.gradients.rule_of_thumb`), spectrum estimates for real data (`lowrank.gradients.real_data`)
and the 1-D convolution (`lowrank.gradients.convolution`).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np
import torch

from lowrank.core.validation import as_tensor, check_choice
from lowrank.core.data import SpikedData, spiked_gaussian, triple_index_target
from lowrank.core.nets import activation as get_activation
from lowrank.core.nets import gamma_m, outer_weights, weight_structure
from lowrank.core.spectral import alignment, count_outliers, singular_values, top_singular_of_product

__all__ = [
    "Loss",
    "check_pm1_labels",
    "LOSSES",
    "loss_function",
    "mu_sample",
    "mu_quadrature",
    "rank_one_norm",
    "Decomposition",
    "decompose",
    "SpikedProblem",
    "spiked_problem",
    "decompose_problem",
    "OUTLIER_SEARCH",
    "spike_summary",
    "tilt_scan",
    "check_two_layer_inputs",
]


class Loss(NamedTuple):
    name: str
    value: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # per-sample loss(yhat, y)
    residue: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # d loss / d yhat


def check_pm1_labels(y):
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
    X_B, z, q, W, a = check_two_layer_inputs(X_B, z, q, W, a)
    n = X_B.shape[0]
    y = as_tensor(y, "y", min_ndim=1)
    if tuple(y.shape) != (n,):
        raise ValueError(f"y must have shape ({n},) (from X_B), got {tuple(y.shape)}")
    act = get_activation(activation)
    lossf = loss_function(loss)
    check_choice(mu, "mu", {"sample", "quadrature"})
    if loss == "logistic":
        check_pm1_labels(y)

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
    `||U_2^T q||`, the part of q inside G's top-two left singular subspace, `residue_in_top2` the same
    for `X_B^T r / ||X_B^T r||` and `align_residue_q` is `|cos(X_B^T r, q)|` (near 1 the two directions
    are one and "both in U_2" says nothing about a second). `align_right_S1_S2` is
    `|cos(a o mu, z^T((r a^T) o sigma'_perp))|`, the alignment of the right vectors of S1 (and S12)
    and of S2: near 1, `S1 + S12 + S2` is close to rank one whatever its left vectors.
    """
    U, s, _ = dec.top("G", max(top, OUTLIER_SEARCH + 1, 2))  # only the top is read: no full SVD
    U2 = U[:, :2]
    x = data.X_B.T @ dec.r
    row = {
        "identity_residual": dec.identity_residual(),
        "outliers": count_outliers(s, max_outliers=OUTLIER_SEARCH, gap=outlier_gap),
        **dec.spike_norms(),
        "norm_E": float(dec.top("E").s[0]),
        "align_u1_residue": alignment(U2[:, 0], data.X_B.T @ dec.r),
        "align_u1_q": alignment(U2[:, 0], data.q),
        "q_in_top2": float((U2.T @ data.q).norm()),
        "residue_in_top2": float((U2.T @ (x / x.norm())).norm()),
        "align_residue_q": alignment(x, data.q),
        "align_right_S1_S2": alignment(dec.factors["S1"][1], dec.factors["S2"][1]),
    }
    row.update({f"s{i + 1}": float(v) for i, v in enumerate(s[:top])})
    return row



def is_rank_two(outliers, residue_in_top2, q_in_top2, *, threshold: float):
    """Theorem 3.1's rank-two structure, read off G: exactly two singular values out of the bulk AND both
    the residue direction `X_B^T r` and the spike `q` inside G's top-two left singular subspace (each
    `||U_2^T x|| / ||x|| >= threshold`). Arrays (or scalars) of `spike_summary`'s `outliers`,
    `residue_in_top2`, `q_in_top2`; returns a boolean array of their shape.

    A gradient that is rank one along q (Theorem 3.2's alternative, nu > 1/2) meets the subspace part
    for q, but not the second outlier; one along `X_B^T r` (nu < 1/4) fails both for q.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    outliers = np.asarray(outliers)
    return (outliers == 2) & (np.asarray(residue_in_top2) >= threshold) & (np.asarray(q_in_top2) >= threshold)


def tilt_scan(n: int, d: int, m: int, *, nu: float, activations, tilts, alpha: float = 0.0, scaling: str = "ntk",
              target_link: str = "tanh", mu: str = "sample", outlier_gap: float = 1.5, seed: int = 0):
    """`spike_summary` of tilted weights (`weights="tilted"`) at each multiple `tilts` of the paper's tilt.

    One problem per (activation, tilt), MSE loss, all from `seed` (the same data and `W_S` at every
    tilt). Returns a DataFrame with `activation`, `tilt`, `W_norm` (`||W||_2`), `mean_wq` (the mean of
    `w_j^T q`, the coherent component the tilt adds to every row) and `spike_summary`'s columns.
    """
    import itertools

    import pandas as pd

    rows = []
    for act, tilt in itertools.product(activations, tilts):
        problem = spiked_problem(n, d, m, alpha=alpha, nu=nu, activation=act, loss="mse", weights="tilted",
                                 tilt=tilt, scaling=scaling, target_link=target_link, seed=seed)
        dec = decompose_problem(problem, mu=mu)
        rows.append({"activation": act, "tilt": tilt, "W_norm": singular_values(problem.W)[0].item(),
                     "mean_wq": float((problem.W @ problem.data.q).mean()),
                     **spike_summary(dec, problem.data, outlier_gap=outlier_gap)})
    return pd.DataFrame(rows)

def check_two_layer_inputs(X_B, z, q, W, a):
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
