"""The two-layer network of the low-rank-gradients paper,

    f(x) = gamma_m * a^T sigma(W x),   W in R^{m x d} with unit-norm rows, a_j in {-1, +1} fixed,

with its activations (and their first two derivatives in closed form), the NTK / mean-field
scalings and the weight structures used in the paper's figures.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from lowrank.core.validation import as_tensor, check_choice

__all__ = [
    "Activation",
    "ACTIVATIONS",
    "activation",
    "gamma_m",
    "outer_weights",
    "normalize_rows",
    "sphere_rows",
    "tilted_rows",
    "sphere_rows_orthogonal_to",
    "two_layer_forward",
    "WEIGHT_STRUCTURES",
    "weight_structure",
]


class Activation(NamedTuple):
    name: str
    f: Callable[[torch.Tensor], torch.Tensor]
    df: Callable[[torch.Tensor], torch.Tensor]  # sigma'
    d2f: Callable[[torch.Tensor], torch.Tensor]  # sigma'' (0 where it is a Dirac mass, ReLU)


def _sig(x):
    return torch.sigmoid(x)


def _normal_pdf(x):
    return torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _normal_cdf(x):
    return 0.5 * (1 + torch.erf(x / math.sqrt(2)))


_ACTS = {
    "tanh": Activation(
        "tanh", torch.tanh, lambda x: 1 - torch.tanh(x) ** 2, lambda x: -2 * torch.tanh(x) * (1 - torch.tanh(x) ** 2)
    ),
    "sigmoid": Activation(
        "sigmoid", _sig, lambda x: _sig(x) * (1 - _sig(x)), lambda x: _sig(x) * (1 - _sig(x)) * (1 - 2 * _sig(x))
    ),
    "softplus": Activation("softplus", F.softplus, _sig, lambda x: _sig(x) * (1 - _sig(x))),
    "elu": Activation(
        "elu",
        F.elu,
        lambda x: torch.where(x > 0, torch.ones_like(x), torch.exp(torch.clamp(x, max=0))),
        lambda x: torch.where(x > 0, torch.zeros_like(x), torch.exp(torch.clamp(x, max=0))),
    ),
    "silu": Activation(
        "silu",
        F.silu,
        lambda x: _sig(x) * (1 + x * (1 - _sig(x))),
        lambda x: _sig(x) * (1 - _sig(x)) * (2 + x * (1 - 2 * _sig(x))),
    ),
    "relu": Activation("relu", F.relu, lambda x: (x > 0).to(x.dtype), torch.zeros_like),
    "gelu": Activation(
        "gelu",
        lambda x: x * _normal_cdf(x),
        lambda x: _normal_cdf(x) + x * _normal_pdf(x),
        lambda x: _normal_pdf(x) * (2 - x * x),
    ),
}
ACTIVATIONS = frozenset(_ACTS)


def activation(name: str) -> Activation:
    """The activation called `name` (one of ACTIVATIONS; `silu` is Swish)."""
    check_choice(name, "activation", ACTIVATIONS)
    return _ACTS[name]


def gamma_m(m: int, scaling: str) -> float:
    """`1/sqrt(m)` for NTK scaling, `1/m` for mean-field (MF) scaling."""
    check_choice(scaling, "scaling", {"ntk", "mf"})
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"m must be a positive integer, got {m!r}")
    return 1 / math.sqrt(m) if scaling == "ntk" else 1 / m


def outer_weights(m: int, seed: int) -> torch.Tensor:
    """`a_j` i.i.d. uniform on {-1, +1}."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (m,), generator=g).to(torch.float64) * 2 - 1


def normalize_rows(W) -> torch.Tensor:
    W = as_tensor(W, "W", min_ndim=2)
    norms = W.norm(dim=-1, keepdim=True)
    if (norms == 0).any():
        raise ValueError("W has a zero row, which cannot be normalised")
    return W / norms


def sphere_rows(m: int, d: int, seed: int) -> torch.Tensor:
    """`W_S`: rows i.i.d. uniform on the unit sphere S^{d-1}."""
    g = torch.Generator().manual_seed(seed)
    return normalize_rows(torch.randn(m, d, generator=g, dtype=torch.float64))


def tilted_rows(W_S, q, n: int, tilt: float = 1.0) -> torch.Tensor:
    """`normalize_rows(W_S + tilt n^(-1/4) 1 q^T)`: rows tilted towards the spike q (Fig. 1b, c).

    Parameters
    ----------
    W_S : m x d rows on the unit sphere. q : (d,) the spike direction. n : the sample size.
    tilt : multiplies the paper's tilt `n^(-1/4)` (1: the paper's; 0: no tilt, W_S itself).

    Returns
    -------
    m x d weights with unit-norm rows. The tilt adds the same vector to every row, a rank-one
    matrix of spectral norm `tilt n^(-1/4) sqrt(m)` before normalisation.
    """
    W_S = as_tensor(W_S, "W_S", min_ndim=2)
    q = as_tensor(q, "q", min_ndim=1)
    if not isinstance(tilt, (int, float)) or not math.isfinite(tilt) or tilt < 0:
        raise ValueError(f"tilt must be a finite number >= 0, got {tilt!r}")
    return normalize_rows(W_S + tilt * n ** (-0.25) * q.unsqueeze(0))


def sphere_rows_orthogonal_to(q, m: int, seed: int) -> torch.Tensor:
    """`W_{S perp q}`: rows uniform on the unit sphere of the complement of q."""
    q = as_tensor(q, "q", min_ndim=1)
    q = q / q.norm()
    W = sphere_rows(m, q.shape[0], seed)
    return normalize_rows(W - torch.outer(W @ q, q))


def two_layer_forward(X, W, a, *, activation: str, gamma: float) -> torch.Tensor:
    """`f(X) = gamma * sigma(X W^T) a` for the rows of X; differentiable in W."""
    check_choice(activation, "activation", ACTIVATIONS)
    act = _ACTS[activation]
    if X.shape[-1] != W.shape[1] or W.shape[0] != a.shape[0]:
        raise ValueError(f"shapes do not fit: X {tuple(X.shape)}, W {tuple(W.shape)}, a {tuple(a.shape)}")
    return gamma * act.f(X @ W.T) @ a


WEIGHT_STRUCTURES = frozenset({"isotropic", "tilted", "orthogonal"})


def weight_structure(name: str, m: int, q, n: int, seed: int, tilt: float = 1.0) -> torch.Tensor:
    """The paper's inner weights by name: "isotropic" (`W_S`), "tilted" (towards q, with
    `tilt n^(-1/4)`, `tilted_rows`) or "orthogonal" (`W_{S perp q}`); `d` is taken from q."""
    check_choice(name, "weights", WEIGHT_STRUCTURES)
    q = as_tensor(q, "q", min_ndim=1)
    if name == "orthogonal":
        return sphere_rows_orthogonal_to(q, m, seed)
    W_S = sphere_rows(m, q.shape[0], seed)
    return W_S if name == "isotropic" else tilted_rows(W_S, q, n, tilt)
