"""ReLU against its smooth relatives over activations, draws and sizes (the page gradients/relu, Prop. 3.1).

The single-matrix helpers live in `lowrank.gradients.dynamics` (`sigma_perp_norm`,
`relu_sign_structure`, `term_norms`, `loglog_slope`); these functions repeat them over activations,
draws and sizes:

- `residue_share_draws` (Fig. 2): the residue spike's share of the gradient, `||S1||_F^2 / ||G||_F^2`
  and `||S1||_2 / ||G||_2`, per draw and activation, and the spectra of the first draw;
- `sigma_perp_growth` and `growth_slopes`: `||sigma'_perp(X W^T)||_2 / n` as the sizes grow in
  proportion, and its log-log exponent in n (Prop. 3.1: order one for ReLU where `2 nu > 1 - alpha`;
  Theorem 3.1's proof: shrinking for C^2 activations);
- `sign_structure_table`: how close ReLU's `sigma'_perp` is to `(1/2) sign(z) sign(W q)^T`;
- `spike_variance_share`: Prop. 3.1's regime, the spike's share `n^(2 nu) / d^(1 - alpha)` of a
  pre-activation's variance (it grows without bound exactly when `2 nu > 1 - alpha`).

Draw `k` uses `spiked_problem(..., seed=seed + 10 k)` (`seed + 100 + 10 k` for the growth sizes).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple, Sequence

from lowrank.core import spectral
from lowrank.gradients.decomposition import decompose_problem, spiked_problem
from lowrank.gradients.dynamics import loglog_slope, relu_sign_structure, sigma_perp_norm, term_norms

__all__ = ["ResidueShares", "residue_share_draws", "sigma_perp_growth", "growth_slopes", "sign_structure_table",
           "spike_variance_share"]

DRAW_SEED_STRIDE = 10
GROWTH_SEED_OFFSET = 100  # the growth sizes draw from seed + 100 + 10 k: apart from the spectra's draws


class ResidueShares(NamedTuple):
    """What `residue_share_draws` recorded."""

    table: object  # DataFrame: one row per (repeat, activation)
    spectra: dict  # activation -> every singular value of G at draw 0 (numpy)


def residue_share_draws(n: int, d: int, m: int, *, alpha: float, nu: float, activations: Sequence[str],
                        repeats: int, scaling: str = "ntk", loss: str = "mse", target_link: str = "tanh",
                        seed: int = 0) -> ResidueShares:
    """The residue spike's share of G for every draw and activation (Fig. 2).

    Returns
    -------
    `ResidueShares`: `table` with `activation`, `repeat`, `term_norms`' columns (`norm_S1`, `norm_S12`,
    `norm_S2`, `norm_E`, `norm_G`, `r_rms`, `residue_alignment`), `share_top` = `||S1||_2 / ||G||_2`,
    `share_energy` = `||S1||_F^2 / ||G||_F^2` (S1 is rank one, so its Frobenius and spectral norms
    agree), `s1_over_s2` of G and `align_u1_residue` = |cos(u1(G), X_B^T r)|; rows in the order
    (draw, activation); and `spectra`, every singular value of G at draw 0 per activation.
    """
    import pandas as pd

    rows, spectra = [], {}
    for k, act in itertools.product(range(repeats), activations):
        problem = spiked_problem(n, d, m, alpha=alpha, nu=nu, activation=act, loss=loss, scaling=scaling,
                                 target_link=target_link, seed=seed + DRAW_SEED_STRIDE * k)
        dec = decompose_problem(problem)
        top = spectral.top_singular(dec.G, 2)
        norms = term_norms(dec, data=problem.data)
        rows.append({"activation": act, "repeat": k, **norms,
                     "share_top": norms["norm_S1"] / norms["norm_G"],
                     "share_energy": norms["norm_S1"] ** 2 / float((dec.G**2).sum()),  # ||G||_F^2 = sum of s^2
                     "s1_over_s2": float(top.s[0] / top.s[1]),
                     "align_u1_residue": spectral.alignment(top.U[:, 0], problem.data.X_B.T @ dec.r)})
        if k == 0:
            spectra[act] = spectral.singular_values(dec.G).numpy()
    return ResidueShares(pd.DataFrame(rows), spectra)


def sigma_perp_growth(n: int, d: int, m: int, *, alpha: float, nus: Sequence[float], activations: Sequence[str],
                      ds: Sequence[int], repeats: int, scaling: str = "ntk", target_link: str = "tanh",
                      seed: int = 0):
    """`||sigma'_perp(X W^T)||_2 / n` at input dimensions `ds`, with n and m in the proportions of (n, d, m).

    Returns a DataFrame, one row per (nu, activation, d, repeat): `n`, `d` and `sigma_perp_over_n`
    (`sigma_perp_norm / n`, dimensionless).
    """
    import pandas as pd

    rows = []
    for nu, act, dg, k in itertools.product(nus, activations, ds, range(repeats)):
        ng, mg = int(round(n / d * dg)), int(round(m / d * dg))
        problem = spiked_problem(ng, dg, mg, alpha=alpha, nu=nu, activation=act, scaling=scaling,
                                 target_link=target_link, seed=seed + GROWTH_SEED_OFFSET + DRAW_SEED_STRIDE * k)
        rows.append({"nu": nu, "activation": act, "d": dg, "n": ng, "repeat": k,
                     "sigma_perp_over_n": sigma_perp_norm(problem.data.X, problem.W, act) / ng})
    return pd.DataFrame(rows)


def growth_slopes(growth):
    """The log-log exponent of `sigma_perp_over_n` in `n` per (nu, activation) of a `sigma_perp_growth` table.

    Returns a DataFrame with `nu`, `activation`, `slope`, `stderr` and `intercept` (`loglog_slope`).
    """
    import pandas as pd

    rows = []
    for (nu, act), grp in growth.groupby(["nu", "activation"], sort=False):
        fit = loglog_slope(grp["n"], grp["sigma_perp_over_n"])
        rows.append({"nu": nu, "activation": act, "slope": fit.slope, "stderr": fit.stderr,
                     "intercept": fit.intercept})
    return pd.DataFrame(rows)


def sign_structure_table(n: int, d: int, m: int, *, alpha: float, nus: Sequence[float], scaling: str = "ntk",
                         target_link: str = "tanh", seed: int = 0):
    """`relu_sign_structure` of ReLU's `sigma'_perp` at each spike size (one draw each, seed `seed`).

    Returns a DataFrame indexed by `nu` with `align_left`, `align_right` and `relative_error`.
    """
    import pandas as pd

    rows = []
    for nu in nus:
        p = spiked_problem(n, d, m, alpha=alpha, nu=nu, activation="relu", scaling=scaling,
                           target_link=target_link, seed=seed)
        rows.append({"nu": nu, **relu_sign_structure(p.data.X, p.W, p.data.z, p.data.q)})
    return pd.DataFrame(rows).set_index("nu")


def spike_variance_share(n: int, d: int, *, nu: float, alpha: float) -> float:
    """The spike's part of a pre-activation's variance over the bulk's, for a unit row `w` uniform on the
    sphere: `E (zeta z_i w^T q)^2 = n^(2 nu) / d` against `E w^T Sigma_hat w = sum_k k^(-alpha) / d`, so
    `n^(2 nu) / sum_{k <= d} k^(-alpha)` (about `(1 - alpha) n^(2 nu) / d^(1 - alpha)` for alpha < 1).

    Prop. 3.1's condition `2 nu > 1 - alpha` is that this grows with n; "the spike's part beats the
    bulk's" at the run's own sizes is that it is above one.
    """
    import math

    if n < 1 or d < 1:
        raise ValueError(f"n and d must be positive, got {n}, {d}")
    if nu < 0 or alpha < 0:
        raise ValueError(f"nu and alpha must be >= 0, got {nu}, {alpha}")
    return float(n) ** (2 * nu) / math.fsum(k ** (-alpha) for k in range(1, d + 1))
