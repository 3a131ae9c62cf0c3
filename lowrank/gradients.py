"""The inner-layer gradient of the two-layer network and its decomposition (Prop. 2.1, Sec. 3).

With `X = X_B + zeta z q^T` and `sigma'(X W^T) = 1 mu^T + sigma'_perp`, the transposed gradient

    G = (gamma / n) X^T [(r a^T) o sigma'(X W^T)]                       (d x m)

splits exactly into

    S1  = (gamma / n) (X_B^T r) (a o mu)^T                       residue spike
    S12 = (gamma zeta / n) (z^T r) q (a o mu)^T                  interpolant
    S2  = (gamma zeta / n) q [z^T ((r a^T) o sigma'_perp)]       data spike
    E   = (gamma / n) X_B^T [(r a^T) o sigma'_perp]              error

for any choice of `mu` (see papers/NOTATION.md: S12 and the display form of G are reconstructed).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import torch

from ._checks import as_tensor, check_choice
from .data import SpikedData, spiked_gaussian, triple_index_target
from .nets import activation as get_activation
from .nets import gamma_m, outer_weights, two_layer_forward, weight_structure
from .spectral import alignment, count_outliers, leading_left_vectors, singular_values

__all__ = [
    "Loss",
    "LOSSES",
    "loss_function",
    "mu_sample",
    "mu_quadrature",
    "Decomposition",
    "decompose",
    "SpikedProblem",
    "spiked_problem",
    "decompose_problem",
    "spike_summary",
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
    """`mu_j` as the column mean of `sigma'(X W^T)`."""
    return get_activation(activation).df(X @ W.T).mean(0)


def mu_quadrature(W, Sigma, activation: str, nodes: int = 80) -> torch.Tensor:
    """`mu_j = E[sigma'(w_j^T x)]` for `x ~ N(0, Sigma)` by Gauss-Hermite quadrature.

    `w_j^T x ~ N(0, s_j^2)` with `s_j^2 = w_j^T Sigma w_j`, so each `mu_j` is a one-dimensional
    Gaussian integral. An even number of nodes avoids evaluating a kink at 0 (ReLU).
    """
    W = as_tensor(W, "W", min_ndim=2)
    Sigma = as_tensor(Sigma, "Sigma", min_ndim=2)
    if Sigma.shape != (W.shape[1], W.shape[1]):
        raise ValueError(f"Sigma must be {W.shape[1]} x {W.shape[1]}, got {tuple(Sigma.shape)}")
    x, w = np.polynomial.hermite_e.hermegauss(nodes)  # weight exp(-x^2/2)
    x = torch.as_tensor(x, dtype=torch.float64)
    w = torch.as_tensor(w / np.sqrt(2 * np.pi), dtype=torch.float64)
    s = ((W @ Sigma) * W).sum(1).clamp(min=0).sqrt()
    return get_activation(activation).df(s[:, None] * x[None, :]) @ w


class Decomposition(NamedTuple):
    G: torch.Tensor  # d x m, autograd
    S1: torch.Tensor
    S12: torch.Tensor
    S2: torch.Tensor
    E: torch.Tensor
    r: torch.Tensor  # n, residue
    mu: torch.Tensor  # m

    def identity_residual(self) -> float:
        """`||G - (S1 + S12 + S2 + E)||_F / ||G||_F`: zero up to round-off."""
        return float((self.G - (self.S1 + self.S12 + self.S2 + self.E)).norm() / self.G.norm())


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
    quadrature_nodes: int = 80,
) -> Decomposition:
    """Gradient `G` (autograd) of the mean loss in W, transposed, and its four terms (closed form).

    mu="sample" uses the column means of `sigma'(X W^T)`; mu="quadrature" computes
    `E[sigma'(w_j^T x)]` under `N(0, Sigma_hat + zeta^2 q q^T)` and needs `Sigma_hat`.
    """
    X_B = as_tensor(X_B, "X_B", min_ndim=2)
    n, d = X_B.shape
    z = as_tensor(z, "z", min_ndim=1)
    q = as_tensor(q, "q", min_ndim=1)
    W = as_tensor(W, "W", min_ndim=2)
    a = as_tensor(a, "a", min_ndim=1)
    y = as_tensor(y, "y", min_ndim=1)
    m = W.shape[0]
    for name, t, shape in (("z", z, (n,)), ("q", q, (d,)), ("W", W, (m, d)), ("a", a, (m,)), ("y", y, (n,))):
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} (from X_B {n} x {d} and W {m} rows), got {tuple(t.shape)}")
    act = get_activation(activation)
    lossf = loss_function(loss)
    check_choice(mu, "mu", {"sample", "quadrature"})
    if loss == "logistic":
        _check_pm1(y)

    X = X_B + zeta * torch.outer(z, q)
    W_leaf = W.clone().requires_grad_(True)
    f = two_layer_forward(X, W_leaf, a, activation=activation, gamma=gamma)
    (grad_W,) = torch.autograd.grad(lossf.value(f, y).mean(), W_leaf)
    G = grad_W.T

    f = f.detach()
    r = lossf.residue(f, y)
    dsig = act.df(X @ W.T)  # n x m
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
    S1 = c * torch.outer(X_B.T @ r, amu)
    S12 = c * zeta * float(z @ r) * torch.outer(q, amu)
    S2 = c * zeta * torch.outer(q, z @ ra_perp)
    E = c * X_B.T @ ra_perp
    return Decomposition(G, S1, S12, S2, E, r, mu_vec)


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
                   noise_std: float = 0.0, seed: int = 0) -> SpikedProblem:
    """Spiked Gaussian data, a triple-index target and a two-layer network, all from one seed.

    For the logistic loss the labels are the signs of the triple-index target.
    Sub-seeds: data `seed`, target `seed + 1`, W `seed + 3`, a `seed + 4`.
    """
    get_activation(activation)
    loss_function(loss)
    data = spiked_gaussian(n, d, alpha, nu, seed)
    y, _ = triple_index_target(data.X, link=target_link, noise_std=noise_std, seed=seed + 1)
    if loss == "logistic":
        y = torch.where(y >= 0, 1.0, -1.0).to(torch.float64)
    W = weight_structure(weights, m, data.q, n, seed + 3)
    a = outer_weights(m, seed + 4)
    return SpikedProblem(data, y, W, a, gamma_m(m, scaling), activation, loss)


def decompose_problem(p: SpikedProblem, *, mu: str = "sample") -> Decomposition:
    D = p.data
    return decompose(D.X_B, D.z, D.q, D.zeta, p.W, p.a, p.y, activation=p.activation, gamma=p.gamma,
                     loss=p.loss, mu=mu, Sigma_hat=D.Sigma_hat)


def spike_summary(dec: Decomposition, data: SpikedData, *, outlier_gap: float = 1.5, top: int = 5) -> dict:
    """The numbers Fig. 1 and its verdict read off one gradient.

    Norms are spectral norms. `align_u1_residue` is the alignment of G's leading left singular
    vector with `X_B^T r` (S1's left vector), `align_u1_q` with the spike q, and `q_in_top2` is
    `||U_2^T q||`, the part of q inside G's top-two left singular subspace.
    """
    s = singular_values(dec.G)
    U2 = leading_left_vectors(dec.G, 2)
    row = {
        "identity_residual": dec.identity_residual(),
        "outliers": count_outliers(dec.G, gap=outlier_gap),
        "norm_S1": float(singular_values(dec.S1)[0]),
        "norm_S12": float(singular_values(dec.S12)[0]),
        "norm_S2": float(singular_values(dec.S2)[0]),
        "norm_E": float(singular_values(dec.E)[0]),
        "align_u1_residue": alignment(U2[:, 0], data.X_B.T @ dec.r),
        "align_u1_q": alignment(U2[:, 0], data.q),
        "q_in_top2": float((U2.T @ data.q).norm()),
    }
    row.update({f"s{i + 1}": float(v) for i, v in enumerate(s[:top])})
    return row
