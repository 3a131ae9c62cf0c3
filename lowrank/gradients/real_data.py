"""Spectrum estimates for real data (Section 5 of the low-rank-gradients paper).

`estimate_nu_alpha` reads the spike exponent nu and the bulk exponent alpha off a data matrix's
second-moment eigenvalues, `spike_split` writes `X = X_B + zeta z q^T` with q the top eigenvector,
`real_problem` puts a two-layer network on it, and `real_data_matrix` loads the page's data sets.
Fig. 8's comparison reads one problem's gradient three ways (`gradient_cases`: plain, with input
noise, with a Jacobian penalty) and scores each against the rule of thumb (`rule_call`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import torch

from lowrank.core.validation import as_tensor, check_choice
from lowrank.core.data import SpikedData
from lowrank.core.nets import activation as get_activation
from lowrank.core.nets import gamma_m, outer_weights, sphere_rows
from lowrank.gradients.decomposition import SpikedProblem, check_pm1_labels, decompose_problem, loss_function
from lowrank.gradients.regularization import jacobian_penalty_problem, noisy_problem
from lowrank.gradients.rule_of_thumb import dominant_spike, residue_alignment_beta, rule_of_thumb

__all__ = [
    "SpectrumFit",
    "estimate_nu_alpha",
    "spike_split",
    "real_problem",
    "REAL_DATASETS",
    "real_data_matrix",
    "GradientCase",
    "gradient_cases",
    "rule_call",
]


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
        check_pm1_labels(y)
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


class GradientCase(NamedTuple):
    """One gradient of Fig. 8 and what the rule of thumb is given for it."""

    G: torch.Tensor  # d x m: the gradient (with the penalty's gradient added under a Jacobian penalty)
    residue_direction: torch.Tensor  # (d,) X_B^T r of the inputs this gradient sees
    fit: SpectrumFit  # (nu_hat, alpha_hat) of the inputs this gradient sees
    beta: float  # beta_hat (Assumption 6) of those inputs and their residue
    case_rule: str  # the rule's constant for the case: its own label when plain, "residue" or "data" otherwise
    norms: dict  # spectral norms of the spikes marked in Fig. 8: S1 and S2 (or S3 under the penalty)


def gradient_cases(problem: SpikedProblem, fit: SpectrumFit, *, noise_tau2: float | None = None,
                   noise_seed: int = 0, jacobian_lambda: float | None = None,
                   fit_range=(1, None)) -> dict[str, GradientCase]:
    """The gradient of a real-data problem plain, with input noise and with a Jacobian penalty (Fig. 8).

    Parameters
    ----------
    problem : `real_problem`. fit : `estimate_nu_alpha` of its inputs.
    noise_tau2 : the input-noise variance, or None for no "input noise" case; noise_seed : its seed.
    jacobian_lambda : the Jacobian-penalty strength, or None for no "Jacobian penalty" case.
    fit_range : the bulk index range of the alpha fit of the noisy inputs.

    Returns
    -------
    `{case: GradientCase}` for "plain" and the cases asked for. Under input noise everything the rule
    reads (nu_hat, alpha_hat, beta_hat, the residue direction) comes from the noisy inputs and their
    residue; the penalty keeps the clean inputs' and adds `G_reg` to G. The per-case constants are
    `rule_of_thumb(..., large_input_noise=True)` and `(..., large_jacobian_penalty=True)` at the clean
    estimates.
    """
    d = problem.data.X.shape[1]
    dec = decompose_problem(problem)
    beta = residue_alignment_beta(problem.data.z, dec.r, d)
    x_res = problem.data.X_B.T @ dec.r
    norms = dec.spike_norms()
    cases = {"plain": GradientCase(dec.G, x_res, fit, beta, rule_of_thumb(fit.nu, fit.alpha, beta),
                                   {"S1": norms["norm_S1"], "S2": norms["norm_S2"]})}
    if noise_tau2 is not None:
        noisy = noisy_problem(problem, noise_tau2, seed=noise_seed)
        dec_noise = decompose_problem(noisy)
        noisy_norms = dec_noise.spike_norms()
        cases["input noise"] = GradientCase(
            dec_noise.G, noisy.data.X_B.T @ dec_noise.r, estimate_nu_alpha(noisy.data.X, fit_range=fit_range),
            residue_alignment_beta(noisy.data.z, dec_noise.r, d),
            rule_of_thumb(fit.nu, fit.alpha, beta, large_input_noise=True),
            {"S1": noisy_norms["norm_S1"], "S2": noisy_norms["norm_S2"]})
    if jacobian_lambda is not None:
        jp = jacobian_penalty_problem(problem, jacobian_lambda)
        cases["Jacobian penalty"] = GradientCase(
            dec.G + jp.G_reg, x_res, fit, beta, rule_of_thumb(fit.nu, fit.alpha, beta, large_jacobian_penalty=True),
            {"S1": norms["norm_S1"], "S3": jp.norm_S3()})
    return cases


def rule_call(case: GradientCase, q) -> dict:
    """The measured dominant spike of one case's gradient against the rule of thumb at its estimates.

    q : (d,) the data's spike direction. Returns `measured` (`dominant_spike`'s label), `rule`
    (`rule_of_thumb(nu_hat, alpha_hat, beta_hat)`), `agree`, `case_rule`, the estimates and the numbers
    behind the measured label (`outliers`, `align_u1_residue`, `align_u1_q`, `s2_over_s1`).
    """
    call = dominant_spike(case.G, case.residue_direction, q)
    rule = rule_of_thumb(case.fit.nu, case.fit.alpha, case.beta)
    return {"measured": call.label, "rule": rule, "agree": call.label == rule, "case_rule": case.case_rule,
            "nu_hat": case.fit.nu, "alpha_hat": case.fit.alpha, "beta_hat": case.beta, "outliers": call.outliers,
            "align_u1_residue": call.align_residue, "align_u1_q": call.align_q, "s2_over_s1": call.second_ratio}
