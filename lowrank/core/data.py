"""Data generators: the spiked covariance model and index-model targets (nothing downloads).

Every generator takes a `seed` and draws from its own `torch.Generator`, so results never depend
on global random state.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from lowrank.core.validation import as_tensor, check_choice, check_positive
from lowrank.core.nets import ACTIVATIONS, activation

__all__ = ["SpikedData", "spiked_gaussian", "single_index_target", "triple_index_target", "generator"]


def generator(seed: int) -> torch.Generator:
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return torch.Generator().manual_seed(seed)


class SpikedData(NamedTuple):
    """`X = X_B + zeta z q^T` with rows of `X_B ~ N(0, Sigma_hat)`, `z ~ N(0, I_n)`, `|q| = 1`."""

    X: torch.Tensor  # n x d
    X_B: torch.Tensor  # n x d, the bulk
    z: torch.Tensor  # n, the spike's coefficients
    q: torch.Tensor  # d, the spike direction
    zeta: float  # n ** nu
    Sigma_hat: torch.Tensor  # d x d bulk covariance, diag(k ** -alpha)


def spiked_gaussian(n: int, d: int, alpha: float, nu: float, seed: int) -> SpikedData:
    """Draw `n` points of `N(0, Sigma_hat + zeta^2 q q^T)` (Assumption 2 of the low-rank-gradients paper).

    Choices the paper leaves open: the bulk's eigenbasis is the standard basis
    (`Sigma_hat = diag(k^-alpha)`), and `q` is uniform on the unit sphere, drawn from the same seed.
    """
    for name, v in (("n", n), ("d", d)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    check_positive(alpha, "alpha", strict=False)
    check_positive(nu, "nu", strict=False)
    g = generator(seed)
    eig = torch.arange(1, d + 1, dtype=torch.float64) ** (-float(alpha))
    X_B = torch.randn(n, d, generator=g, dtype=torch.float64) * eig.sqrt()
    z = torch.randn(n, generator=g, dtype=torch.float64)
    q = torch.randn(d, generator=g, dtype=torch.float64)
    q = q / q.norm()
    zeta = float(n) ** float(nu)
    X = X_B + zeta * torch.outer(z, q)
    return SpikedData(X, X_B, z, q, zeta, torch.diag(eig))


def single_index_target(X, omega, *, noise_std: float = 0.0, seed: int = 0, link: str = "sigmoid"):
    """`y = link(X omega) + noise` (the single-index model of the paper's Fig. 4)."""
    X = as_tensor(X, "X", min_ndim=2)
    omega = as_tensor(omega, "omega", min_ndim=1)
    if omega.shape != (X.shape[1],):
        raise ValueError(f"omega must have shape ({X.shape[1]},), got {tuple(omega.shape)}")
    check_positive(noise_std, "noise_std", strict=False)
    check_choice(link, "link", ACTIVATIONS)
    y = activation(link).f(X @ omega)
    return y + noise_std * torch.randn(X.shape[0], generator=generator(seed), dtype=torch.float64)


def triple_index_target(X, *, link: str = "tanh", noise_std: float = 0.0, seed: int = 0):
    """`y = (1/sqrt 3) sum_k link(beta_k^T x) + eps` (Appendix C of the paper; not in its text).

    The book's choice: `beta_1, beta_2, beta_3` are orthonormal directions drawn uniformly (QR of a
    Gaussian d x 3 matrix) from `seed`, `link = tanh`, `eps ~ N(0, noise_std^2)` from `seed + 1`.
    Returns `(y, betas)` with `betas` of shape d x 3.
    """
    X = as_tensor(X, "X", min_ndim=2)
    check_positive(noise_std, "noise_std", strict=False)
    check_choice(link, "link", ACTIVATIONS)
    d = X.shape[1]
    if d < 3:
        raise ValueError(f"a triple-index target needs d >= 3, got d={d}")
    betas, _ = torch.linalg.qr(torch.randn(d, 3, generator=generator(seed), dtype=torch.float64))
    y = activation(link).f(X @ betas).sum(1) / 3**0.5
    y = y + noise_std * torch.randn(X.shape[0], generator=generator(seed + 1), dtype=torch.float64)
    return y, betas
