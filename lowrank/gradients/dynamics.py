"""How the two-layer gradient's spikes scale, and how its direction moves during training.

The helpers of Part I's pages beyond the decomposition itself (`lowrank.gradients.decomposition`):

- scaling (Prop. 4.1): `term_norms` (spectral norms of `S1, S12, S2, E, G`), `loglog_slope`
  (least-squares exponent of a power law), `residue_alignment` and `beta_hat` (Assumption 6);
- ReLU (Prop. 3.1): `sigma_perp` and `sigma_perp_norm`, the centred activation derivatives;
- training (Section 3.4): `gradient_matrix`, `train_weight_normalized` (gradient descent on
  weight-normalised rows with step `1/gamma_m`, recording the gradient's leading left singular
  vectors and their alignment with reference directions at every step), `scaling_comparison`
  (MF and NTK from one initialisation, with the principal angles between their weights) and
  `initial_alignments` (Fig. 4's alignments of the initial gradient).

Every function works in float64 on the CPU tensors `lowrank.core.data` produces.
"""

from __future__ import annotations

import math
from typing import Mapping, NamedTuple

import numpy as np
import torch

from lowrank.core.validation import as_tensor, check_choice, check_positive
from lowrank.core.data import generator, single_index_target, spiked_gaussian
from lowrank.gradients.decomposition import Decomposition, loss_function
from lowrank.core.nets import activation as get_activation
from lowrank.core.nets import gamma_m, normalize_rows, outer_weights, sphere_rows, two_layer_forward
from lowrank.core.spectral import alignment, principal_angles

__all__ = [
    "SlopeFit",
    "loglog_slope",
    "top_singular_value",
    "residue_alignment",
    "beta_hat",
    "term_norms",
    "sigma_perp",
    "sigma_perp_norm",
    "gradient_matrix",
    "TrainingRun",
    "train_weight_normalized",
    "weight_angles",
    "scaling_comparison",
    "initial_alignments",
]


# ----------------------------------------------------------------------------- scaling (Prop. 4.1)


def top_singular_value(M) -> float:
    """`||M||_2` of one matrix: a full `svdvals` for small matrices, ARPACK (`scipy svds`, k = 1,
    deterministic start vector, tolerance 1e-12) beyond 200 rows and columns."""
    M = as_tensor(M, "M", min_ndim=2)
    if M.ndim != 2:
        raise ValueError(f"M must be a matrix, got shape {tuple(M.shape)}")
    if min(M.shape) <= 200:
        return float(torch.linalg.svdvals(M)[0])
    from scipy.sparse.linalg import svds

    A = M.numpy()
    v0 = np.ones(min(A.shape)) / math.sqrt(min(A.shape))
    return float(svds(A, k=1, tol=1e-12, v0=v0, return_singular_vectors=False)[0])


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


def residue_alignment(z, r) -> float:
    """`|z^T r| / (sqrt(n) ||r||_2)`, the statistic of Assumption 6 (`Theta(d^(-beta/2))`)."""
    z = as_tensor(z, "z", min_ndim=1)
    r = as_tensor(r, "r", min_ndim=1)
    if z.shape != r.shape or z.ndim != 1:
        raise ValueError(f"z and r must be vectors of one length, got {tuple(z.shape)} and {tuple(r.shape)}")
    nr = float(r.norm())
    if nr == 0:
        raise ValueError("r is the zero vector: its alignment is undefined")
    return abs(float(z @ r)) / (math.sqrt(z.shape[0]) * nr)


def beta_hat(z, r, d: int) -> float:
    """Single-sample estimate `-2 log(|z^T r| / (sqrt(n) ||r||)) / log d` of Assumption 6's beta.

    It is noisy: for a residue independent of z, `z^T r / ||r||` is standard normal, so the
    estimate scatters by about `2 / log d` around 1. Fitting the slope of `residue_alignment`
    against `d` over several sizes (`loglog_slope`, beta = -2 slope) is the steadier estimate.
    """
    if not isinstance(d, int) or d < 2:
        raise ValueError(f"d must be an integer >= 2, got {d!r}")
    c = residue_alignment(z, r)
    if c == 0:
        raise ValueError("z^T r = 0: beta_hat is infinite")
    return -2 * math.log(c) / math.log(d)


def term_norms(dec: Decomposition, *, data=None) -> dict:
    """Spectral norms of `S1, S12, S2, E` and `G` of one decomposition.

    The three spikes are rank one, so their norms are products of vector norms (exact, no SVD);
    `E` and `G` take one `svdvals` each. `data` (a `SpikedData`) adds the residue alignment
    `|z^T r| / (sqrt(n) ||r||)` and `||r|| / sqrt(n)`.
    """
    if not isinstance(dec, Decomposition):
        raise TypeError(f"dec must be a gradients.Decomposition, got {type(dec).__name__}")

    def rank_one(M):
        # M = u v^T: ||M||_2 = ||M||_F
        return float(torch.linalg.matrix_norm(M, "fro"))

    row = {
        "norm_S1": rank_one(dec.S1),
        "norm_S12": rank_one(dec.S12),
        "norm_S2": rank_one(dec.S2),
        "norm_E": top_singular_value(dec.E),
        "norm_G": top_singular_value(dec.G),
        "r_rms": float(dec.r.norm()) / math.sqrt(dec.r.shape[0]),
    }
    if data is not None:
        row["residue_alignment"] = residue_alignment(data.z, dec.r)
    return row


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


# ----------------------------------------------------------------------------- training (Sec. 3.4)


def gradient_matrix(X, W, a, y, *, activation: str, gamma: float, loss: str = "mse"):
    """`(G, r)`: the transposed gradient `G = (gamma/n) X^T [(r a^T) o sigma'(X W^T)]` (d x m) of
    the mean loss in W, in closed form (Prop. 2.1, lambda = 0), and the residue `r`."""
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
    G, r, _ = _gradient(X, W, a, y, activation, gamma, loss)
    return G, r


def _gradient(X, W, a, y, activation, gamma, loss):
    act = get_activation(activation)
    lossf = loss_function(loss)
    f = two_layer_forward(X, W, a, activation=activation, gamma=gamma)
    r = lossf.residue(f, y)
    G = (gamma / X.shape[0]) * X.T @ (r[:, None] * a[None, :] * act.df(X @ W.T))
    return G, r, f


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


def train_weight_normalized(
    X,
    y,
    W0,
    a,
    *,
    activation: str,
    gamma: float,
    steps: int,
    lr: float | None = None,
    loss: str = "mse",
    X_B=None,
    references: Mapping[str, object] | None = None,
    top_k: int = 2,
    snapshot_steps=None,
    normalization: str = "wn",
) -> TrainingRun:
    """Full-batch gradient descent on the inner weights with weight normalisation (Section 3.4).

    The rows of W are kept on the unit sphere (Assumption 3): with normalization="wn" W is
    parametrised as `w_j = v_j / ||v_j||` (Salimans and Kingma's weight normalisation with the
    gain fixed to 1) and V takes the gradient steps; with "projected" each step is taken in W and
    the rows are renormalised. The step size defaults to `1/gamma` (the paper's large step).
    At every step the gradient `G_t` with respect to W (the matrix the decomposition is about) is
    recorded through its leading left singular vectors.
    """
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
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    check_positive(gamma, "gamma")
    lr = 1.0 / gamma if lr is None else lr
    check_positive(lr, "lr")
    check_choice(normalization, "normalization", NORMALIZATIONS)
    get_activation(activation)
    lossf = loss_function(loss)
    if not isinstance(top_k, int) or not 1 <= top_k <= min(d, m):
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
    snapshots = set(range(steps + 1)) if snapshot_steps is None else {int(s) for s in snapshot_steps}
    if any(s < 0 or s > steps for s in snapshots):
        raise ValueError(f"snapshot_steps must lie in [0, {steps}], got {sorted(snapshots)}")

    import pandas as pd

    V = W0.clone()
    rows, Us, Ws = [], [], {}
    u_init = None
    for t in range(steps + 1):
        W = normalize_rows(V)
        G, r, fx = _gradient(X, W, a, y, activation, gamma, loss)
        U, s, _ = torch.linalg.svd(G, full_matrices=False)
        u1 = U[:, 0]
        if u_init is None:
            u_init = u1
        row = {"step": t, "loss": float(lossf.value(fx, y).mean())}
        row.update({f"s{i + 1}": float(s[i]) for i in range(top_k)})
        for name, v in refs.items():
            row[f"align_{name}"] = alignment(u1, v)
        if X_B is not None:
            res = X_B.T @ r
            row["align_residue"] = alignment(u1, res) if float(res.norm()) > 0 else float("nan")
        row["align_initial"] = alignment(u1, u_init)
        rows.append(row)
        Us.append(U[:, :top_k].clone())
        if t in snapshots:
            Ws[t] = W.clone()
        if t == steps:
            break
        grad_W = G.T  # m x d
        if normalization == "wn":
            norms = V.norm(dim=1, keepdim=True)
            radial = (grad_W * W).sum(1, keepdim=True) * W
            V = V - lr * (grad_W - radial) / norms
        else:
            V = normalize_rows(W - lr * grad_W)
        if not torch.isfinite(V).all():
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
    runs = {}
    for sc in scalings:
        gamma = gamma_m(W0.shape[0], sc)
        runs[sc] = train_weight_normalized(X, y, W0, a, activation=activation, gamma=gamma, lr=lr_factor / gamma,
                                           steps=steps, snapshot_steps=snapshot_steps, **kwargs)
    rows = []
    if len(scalings) >= 2:
        A, B = runs[scalings[0]].W, runs[scalings[1]].W
        for t in sorted(set(A) & set(B)):
            if t == 0 and torch.equal(A[t], B[t]):
                rows.append({"step": 0, "mean_principal_angle": 0.0, "max_principal_angle": 0.0,
                             "mean_neuron_angle": 0.0})
                continue
            rows.append({"step": t, **weight_angles(A[t], B[t])})
    return runs, pd.DataFrame(rows)


def initial_alignments(n: int, d: int, m: int, *, scaling: str, activation: str = "relu", loss: str = "mse",
                       noise_std: float = 0.1, link: str = "sigmoid", seed: int = 0) -> dict:
    """Fig. 4 for one draw: alignment of the initial gradient's u1 with `X^T y`, `X^T r` and omega.

    Isotropic data (`X = X_B`, rows N(0, I_d), no spike), `y = link(omega^T x) + noise` with omega
    uniform on the unit sphere, W_S and random signs a, `gamma_m` by `scaling`.
    Sub-seeds: X `seed`, omega `seed + 1`, noise `seed + 2`, W `seed + 3`, a `seed + 4`.
    """
    check_choice(scaling, "scaling", {"mf", "ntk"})
    data = spiked_gaussian(n, d, 0.0, 0.0, seed)
    X = data.X_B
    omega = torch.randn(d, generator=generator(seed + 1), dtype=torch.float64)
    omega = omega / omega.norm()
    y = single_index_target(X, omega, noise_std=noise_std, seed=seed + 2, link=link)
    W = sphere_rows(m, d, seed + 3)
    a = outer_weights(m, seed + 4)
    G, r = gradient_matrix(X, W, a, y, activation=activation, gamma=gamma_m(m, scaling), loss=loss)
    U, s, _ = torch.linalg.svd(G, full_matrices=False)
    u1 = U[:, 0]
    return {"align_Xy": alignment(u1, X.T @ y), "align_Xr": alignment(u1, X.T @ r),
            "align_omega": alignment(u1, omega), "s1_over_s2": float(s[0] / s[1]),
            "r_y_corr": float(torch.nn.functional.cosine_similarity(r, -y, dim=0))}
