"""Remark 1 of the low-rank-gradients paper: a valid 1-D convolution as a weight-tied two-layer network.

`conv1d_weight_matrix` builds the untied matrix of a filter, `conv1d_forward` the network,
`conv1d_problem` the spiked problem, and the filter gradient is folded from the untied gradient
(`conv1d_filter_gradient`, `conv1d_filter_low_rank`); `conv1d_measure` gives one row of the page.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from lowrank.core.parallel import check_workers, map_tasks
from lowrank.core.validation import as_tensor, check_choice
from lowrank.core.data import generator, spiked_gaussian, triple_index_target
from lowrank.core.nets import activation as get_activation
from lowrank.core.nets import gamma_m, outer_weights
from lowrank.core.spectral import alignment, count_outliers, orthonormal_basis, singular_values, top_singular
from lowrank.gradients.decomposition import OUTLIER_SEARCH, Decomposition, SpikedProblem, decompose_problem, loss_function

__all__ = [
    "conv1d_weight_matrix",
    "conv1d_forward",
    "conv1d_filter_gradient",
    "ConvProblem",
    "conv1d_problem",
    "FilterLowRank",
    "conv1d_filter_low_rank",
    "conv1d_measure",
    "conv1d_sweep",
]


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


def conv1d_sweep(configs, k: int, *, alpha: float = 0.0, outer: str = "random", examples=(), workers: int = 1):
    """`conv1d_measure` over configurations (the page gradients/convolution), as one table.

    Parameters
    ----------
    configs : `(n, d, nu, activation, scaling, seed)` tuples, each measured by `conv1d_measure(n, d, k,
    ...)` with its own seed. k, alpha, outer : as in `conv1d_measure`, shared. examples : the
    configurations (among `configs`) whose G spectrum, rank-two fold and filter are returned too.
    workers : processes for the configurations (`lowrank.core.parallel.map_tasks`); each is seeded by
    its own seed, so the results do not depend on it.

    Returns
    -------
    `(table, shown)`: a DataFrame of the rows of `conv1d_measure`, in the order of `configs`, and a
    dict from each configuration of `examples` to `(s, r2, w)`: every singular value of its G
    (descending, NumPy), its `FilterLowRank` of rank 2 and its filter `w`.
    """
    import pandas as pd

    check_workers(workers)
    configs = [tuple(c) for c in configs]
    if any(len(c) != 6 for c in configs):
        raise ValueError("configs must be (n, d, nu, activation, scaling, seed) tuples")
    shown = {tuple(c) for c in examples}
    if shown - set(configs):
        raise ValueError(f"examples {sorted(shown - set(configs))} are not among configs")
    done = map_tasks(functools.partial(_sweep_point, k=k, alpha=alpha, outer=outer),
                     [(c, c in shown) for c in configs], workers, desc="conv1d sweep")
    table = pd.DataFrame([row for row, _ in done])
    return table, {c: kept for c, (_, kept) in zip(configs, done) if kept is not None}


def _sweep_point(task, *, k, alpha, outer):
    (n, d, nu, act, scaling, seed), keep = task
    row, dec, r2, w = conv1d_measure(n, d, k, nu=nu, activation=act, scaling=scaling, alpha=alpha, outer=outer,
                                     seed=seed)
    return row, ((singular_values(dec.G).numpy(), r2, w) if keep else None)
