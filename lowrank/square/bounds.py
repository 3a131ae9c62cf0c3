"""Norm-based generalisation bounds of the square-loss paper (Xu et al. 2023, Section
"Generalization: Rademacher Complexity of Convolutional Layers"), with the constants as written.

- Eq. 12 / 15 (Theorem 3): for a network that fits the data, with probability >= 1 - delta,
  `err <= 2 (rho + 1) R_S(F) + 3 sqrt( log(2 (rho + 1)^2 / delta) / (2N) )`,
  where F is the class of networks with product norm <= 1 and rho the product of the layer norms.
- Eq. 16: with Golowich et al.'s `R_S(F) <= (sqrt(2 log(2) L) + 1) / sqrt(N)` (inputs in the unit
  ball). The journal text of Eq. 16 prints the confidence term with an extra "log" (flattened as
  `3 log 2 log rho + 1 2 / delta 2 N`); we use the form that Eq. 12 and Eq. 15 derive,
  `3 sqrt(log(2 (rho+1)^2 / delta) / (2N))`.
- Eq. 19 (Theorem 4, binary-tree CNN, d = 2^L): `R_X(H) <= 2^L rho sqrt(sum_i ||x_i||^2) / N`, rho the
  product of the kernel norms; the proof sketch (Eq. 22) gives `2^(L-1)`, also reported.
- Eq. 25 (the same network treated as dense, with Toeplitz norms):
  `2^L prod_{l=1}^L sqrt(2^l) rho sqrt(sum_i ||x_i||^2) / N = 2^(0.25 L^2 + 1.25 L) rho sqrt(...) / N`.

Eq. 19 and Eq. 25 bound the Rademacher complexity of the class with product norm <= rho; the
error bounds below put them into Eq. 12 at rho = 1 (the class F), as Theorem 3's proof does.

Every function returns a dict with each term. The bounds assume the network **fits** the training
set (`y f(x) >= 1`, zero ramp loss). A network trained with weight decay only quasi-interpolates
(`rho * f_bar_n = 1 - eps`); pass the unnormalised margins `y_n f(x_n)` as `margins` to get the
empirical ramp-loss term of Eq. 13 added (`bound_with_ramp`), or evaluate at
`margin_normalized_rho(f_bar)` = 1 / min_n f_bar_n, the scale at which the normalised network has
every margin >= 1 (same decisions, zero ramp loss).

The statistics of the two pages that read these bounds: `per_init_regression` (Fig. 5), `fitted_spearman` (a rank
correlation over the runs that fit, which Theorem 3 assumes) and `measured_controls` (a control whose runs do not
fit is left out and named).
"""

from __future__ import annotations

import math

import torch

from lowrank.core.validation import as_tensor, check_positive
from lowrank.square import collapse

__all__ = [
    "golowich_rademacher",
    "confidence_term",
    "ramp_loss",
    "margin_normalized_rho",
    "error_bound",
    "theorem3_bound",
    "tree_rademacher",
    "dense_tree_rademacher",
    "theorem4_bound",
    "dense_tree_bound",
    "toeplitz_exponent",
    "trained_network_bounds",
    "per_init_regression",
    "FEWEST_RANKED",
    "fitted_spearman",
    "measured_controls",
]


def _check_n(n):
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"N must be a positive integer, got {n!r}")


def _check_depth(L):
    if not isinstance(L, int) or isinstance(L, bool) or L < 1:
        raise ValueError(f"the depth L must be a positive integer, got {L!r}")


def _check_delta(delta):
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


def _check_rho(rho):
    if not (isinstance(rho, (int, float)) and math.isfinite(rho) and rho >= 0):
        raise ValueError(f"rho must be a finite non-negative number, got {rho!r}")


def golowich_rademacher(depth: int, n: int, radius: float = 1.0) -> float:
    """`(sqrt(2 log(2) L) + 1) * radius / sqrt(N)`: the paper's bound on R_S(F) (Theorem 1 of
    Golowich, Rakhlin and Shamir) for product norm <= 1 and inputs in the ball of `radius` (1 in
    the paper)."""
    _check_depth(depth)
    _check_n(n)
    check_positive(radius, "radius")
    return (math.sqrt(2 * math.log(2) * depth) + 1) * radius / math.sqrt(n)


def confidence_term(rho: float, n: int, delta: float) -> float:
    """`3 sqrt( log(2 (rho + 1)^2 / delta) / (2N) )` (Eq. 12, 15)."""
    _check_rho(rho)
    _check_n(n)
    _check_delta(delta)
    return 3 * math.sqrt(math.log(2 * (rho + 1) ** 2 / delta) / (2 * n))


def ramp_loss(values) -> float:
    """Mean ramp loss of unnormalised margins `v_n = y_n f(x_n)`: 1 for v <= 0, 1 - v on [0, 1], 0 above."""
    v = as_tensor(values, "margins", min_ndim=1).reshape(-1)
    return float((1 - v).clamp(0, 1).mean())


def margin_normalized_rho(fbar) -> float:
    """`1 / min_n f_bar_n`: the rho at which `rho f_V` has every training margin >= 1 (inf if some
    margin is <= 0, i.e. the training set is not separated)."""
    f = as_tensor(fbar, "fbar", min_ndim=1).reshape(-1)
    m = float(f.min())
    return 1 / m if m > 0 else math.inf


def error_bound(rademacher_unit: float, rho: float, n: int, delta: float = 0.05, margins=None) -> dict:
    """Eq. 12: `2 (rho + 1) R(F) + 3 sqrt(log(2 (rho+1)^2 / delta) / (2N))`, each term reported.

    `rademacher_unit` is the Rademacher complexity bound of the class with product norm <= 1.
    """
    _check_rho(rho)
    check_positive(rademacher_unit, "rademacher_unit", strict=False)
    complexity = 2 * (rho + 1) * rademacher_unit
    confidence = confidence_term(rho, n, delta)
    out = {
        "rho": rho, "N": n, "delta": delta, "rademacher_unit": rademacher_unit,
        "complexity_term": complexity, "confidence_term": confidence, "bound": complexity + confidence,
    }
    if margins is not None:
        ramp = ramp_loss(margins)
        out.update(ramp_term=ramp, bound_with_ramp=ramp + complexity + confidence)
    return out


def theorem3_bound(rho: float, n: int, depth: int, delta: float = 0.05, radius: float = 1.0, margins=None) -> dict:
    """Eq. 16 (Theorem 3 with Golowich et al.'s complexity): the dense-network bound."""
    r = golowich_rademacher(depth, n, radius)
    return {"equation": "16", "L": depth, "radius": radius, **error_bound(r, rho, n, delta, margins)}


def _sqrt_sum_sq_norms(X) -> tuple[float, int]:
    X = as_tensor(X, "X", min_ndim=2)
    X = X.reshape(X.shape[0], -1)
    return float((X**2).sum().sqrt()), X.shape[0]


def tree_rademacher(rho: float, X, depth: int, constant: str = "eq19") -> float:
    """Theorem 4: `2^L rho sqrt(sum_i ||x_i||^2) / N` (Eq. 19); `constant="eq22"` uses the proof
    sketch's `2^(L-1)`."""
    _check_rho(rho)
    _check_depth(depth)
    if constant not in ("eq19", "eq22"):
        raise ValueError(f"constant must be 'eq19' or 'eq22', got {constant!r}")
    root, n = _sqrt_sum_sq_norms(X)
    power = depth if constant == "eq19" else depth - 1
    return 2.0**power * rho * root / n


def dense_tree_rademacher(rho: float, X, depth: int) -> float:
    """Eq. 25: `2^L prod_{l=1}^L sqrt(2^l) rho sqrt(sum_i ||x_i||^2) / N`, the tree network bounded
    as a dense one (Toeplitz norms), `= 2^(0.25 L^2 + 1.25 L) rho sqrt(...) / N`."""
    _check_rho(rho)
    _check_depth(depth)
    root, n = _sqrt_sum_sq_norms(X)
    factor = 2.0**depth * math.prod(math.sqrt(2.0**l) for l in range(1, depth + 1))
    return factor * rho * root / n


def theorem4_bound(rho: float, X, depth: int, delta: float = 0.05, margins=None, constant: str = "eq19") -> dict:
    """Eq. 19 put into Eq. 12: the binary-tree CNN's error bound, rho = product of kernel norms."""
    r = tree_rademacher(1.0, X, depth, constant)
    n = as_tensor(X, "X", min_ndim=2).shape[0]
    return {"equation": "19" if constant == "eq19" else "22", "L": depth, **error_bound(r, rho, n, delta, margins)}


def dense_tree_bound(rho: float, X, depth: int, delta: float = 0.05, margins=None) -> dict:
    """Eq. 25 put into Eq. 12: the same tree network's bound when it is treated as dense."""
    r = dense_tree_rademacher(1.0, X, depth)
    n = as_tensor(X, "X", min_ndim=2).shape[0]
    return {"equation": "25", "L": depth, **error_bound(r, rho, n, delta, margins)}


def toeplitz_exponent(model) -> float:
    """`log2(prod_l sqrt(P_l))` over the conv layers of `model` (P_l its output positions,
    `NormalizedNet.num_patches`): without padding, the product of the Toeplitz-matrix Frobenius norms
    is `2^exponent` times the product of the filter norms. For the 1-D tree with kernel 2 and depth L,
    `P_l = 2^(L-l)` and the exponent is `L(L-1)/4` (Eq. 25 as printed uses `prod_{l=1}^L sqrt(2^l)`,
    i.e. `L(L+1)/4`)."""
    return 0.5 * sum(math.log2(p) for p in model.num_patches())


def trained_network_bounds(model, x_train, y_train, delta: float = 0.05, tree: bool | None = None) -> dict:
    """Every bound of the page for one trained `NormalizedNet` on its training set.

    Parameters
    ----------
    model : NormalizedNet (rho f_V); its product norm is taken with filter norms and with Toeplitz norms.
    x_train, y_train : the training inputs (norm <= 1) and ±1 labels.
    delta : confidence parameter.
    tree : whether the network is Theorem 4's tree CNN (default: its name starts with "tree_cnn").

    Returns
    -------
    dict: N, L, rho (filter norms), rho_toeplitz, radius_term `sqrt(sum ||x||^2) / N`, ramp (Eq. 13's
    empirical ramp loss of `y_n f(x_n)`), and for a tree `eq19`, `eq19_complexity`, `eq19_confidence`,
    `eq25`, `eq16_toeplitz`; for a dense network `eq16`, `eq16_complexity`, `eq16_confidence`. Bounds are
    on the error probability (dimensionless).
    """
    X = torch.as_tensor(x_train).double()
    p = next(model.parameters())
    with torch.no_grad():
        out = model.f_V(X.to(p.device, p.dtype)).double().cpu()
    rho, n, L = model.product_norm(), X.shape[0], model.depth
    row = {"N": n, "L": L, "rho": rho, "rho_toeplitz": model.product_norm("toeplitz"),
           "radius_term": float(X.flatten(1).pow(2).sum().sqrt()) / n,
           "ramp": ramp_loss(rho * collapse.margins(out, y_train))}
    if model.name.startswith("tree_cnn") if tree is None else tree:
        b19, b25 = theorem4_bound(rho, X, L, delta), dense_tree_bound(rho, X, L, delta)
        row.update(eq19=b19["bound"], eq19_complexity=b19["complexity_term"], eq19_confidence=b19["confidence_term"],
                   eq25=b25["bound"], eq16_toeplitz=theorem3_bound(row["rho_toeplitz"], n, L, delta)["bound"])
    else:
        b16 = theorem3_bound(rho, n, L, delta)
        row.update(eq16=b16["bound"], eq16_complexity=b16["complexity_term"], eq16_confidence=b16["confidence_term"])
    return row


def per_init_regression(runs, x: str = "inv_rho", y: str = "test_accuracy", by: str = "rho_init") -> dict:
    """Fig. 5's regression: the mean of `x` and of `y` per group `by` (one point per initialisation
    scale, averaged over its runs), then least squares of `y` on `x`.

    Parameters
    ----------
    runs : pandas DataFrame, one row per run, with columns `x`, `y` and `by`.

    Returns
    -------
    dict: slope (units of y per unit of x), intercept, r2, p (two-sided, the slope's t-test with
    `points - 2` degrees of freedom), p_negative (one-sided, for a negative slope: p/2 when the slope is
    negative, 1 - p/2 otherwise), points, the per-group means `x_means`, `y_means`, and
    `x_resolution`: the range of the group means of `x` over their standard error (the pooled
    within-group standard deviation over the square root of the runs per group; NaN with one run per
    group). Below about 2 the groups do not separate `x`, and the slope divides noise by near-ties.
    """
    from scipy import stats

    groups = runs.groupby(by)[x]
    means = runs.groupby(by)[[x, y]].mean()
    within = float((groups.var(ddof=1) * (groups.count() - 1)).sum() / max(1, int((groups.count() - 1).sum())))
    per_group = float(groups.count().mean()) if len(means) else float("nan")
    spread = float(means[x].max() - means[x].min()) if len(means) else float("nan")
    resolution = spread / (within**0.5 / per_group**0.5) if within > 0 else float("nan")
    common = {"points": len(means), "x_means": means[x].tolist(), "y_means": means[y].tolist(),
              "x_resolution": resolution}
    if len(means) < 3 or means[x].nunique() < 2:
        nan = float("nan")
        return {"slope": nan, "intercept": nan, "r2": nan, "p": nan, "p_negative": nan, **common}
    fit = stats.linregress(means[x], means[y])
    p = float(fit.pvalue)
    return {"slope": float(fit.slope), "intercept": float(fit.intercept), "r2": float(fit.rvalue**2), "p": p,
            "p_negative": p / 2 if fit.slope < 0 else 1 - p / 2, **common}


FEWEST_RANKED = 3  # a rank correlation of two points is +-1 whatever the data: it measures nothing


def fitted_spearman(x, y, fitted, what: str = "runs fit") -> dict:
    """The Spearman correlation of `x` and `y` over the runs that fit (`fitted` True); the others are left out.
    `what` names the entries in the reason ("2 of 4 runs fit: ..."), e.g. "fractions have a run that fits".

    Returns
    -------
    dict: rho (NaN when it measures nothing), fitted (the runs that enter), total (all runs), degenerate
    (None, or why rho is NaN: fewer than FEWEST_RANKED runs fit, or `x` or `y` is constant over them).
    """
    import numpy as np
    from scipy import stats

    x, y, fitted = np.asarray(x, float), np.asarray(y, float), np.asarray(fitted, bool)
    if x.ndim != 1 or x.shape != y.shape or x.shape != fitted.shape:
        raise ValueError(f"fitted_spearman: x, y and fitted must be 1-D of one length, got {x.shape}, {y.shape}, {fitted.shape}")
    xs, ys = x[fitted], y[fitted]
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        raise ValueError("fitted_spearman: a run that fits has a non-finite value")
    k, n = int(fitted.sum()), int(fitted.size)
    out = {"rho": float("nan"), "fitted": k, "total": n, "degenerate": None}
    if k < FEWEST_RANKED:
        out["degenerate"] = f"{k} of {n} {what}: a Spearman correlation needs at least {FEWEST_RANKED}"
    elif np.ptp(xs) == 0 or np.ptp(ys) == 0:
        out["degenerate"] = f"{'x' if np.ptp(xs) == 0 else 'y'} is constant over the {k} that enter: no ranking"
    else:
        out["rho"] = float(stats.spearmanr(xs, ys).statistic)
    return out


def measured_controls(candidates) -> tuple[list, dict[str, str], str | None]:
    """A claim's controls (`lowrank.book.verdicts.Control`), less those that measure nothing.

    candidates: (Control, reason) pairs, reason None for a control whose runs are usable, else why it is
    left out (its runs did not fit, too few were left); a control whose value is NaN is left out too.
    Returns the kept controls, {name: reason} of those left out (for the claim's details), and, when
    controls were given but none is kept, the reason for the claim's `degenerate`: a claim without its
    negative control decides nothing.
    """
    kept, left_out = [], {}
    for control, reason in candidates:
        if reason is None and math.isnan(control.value):
            reason = "its statistic is NaN"
        if reason is None:
            kept.append(control)
        else:
            left_out[control.name] = str(reason)
    none_left = ("no negative control left: " + "; ".join(f"{name}: {why}" for name, why in left_out.items())
                 if left_out and not kept else None)
    return kept, left_out, none_left
