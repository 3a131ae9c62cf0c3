"""Which spike dominates the inner-layer gradient: measured and predicted (Sections 3 and 5).

- the residue alignment `residue_alignment` and its exponent `residue_alignment_beta` (Assumption 6,
  the one estimate of beta in the package);
- the measured dominant spike, read off G's spectrum and singular vectors (`dominant_spike`, `dominant_spike_of_problem`);
- the prediction of the rule of thumb of Section 5 (`rule_of_thumb`, `rule_of_thumb_boundaries`);
- both over a grid of (nu, alpha, seed) cells (`phase_grid`, the page gradients/phase_diagram).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import numpy as np

from lowrank.core.parallel import check_workers, map_tasks
from lowrank.core.validation import as_tensor
from lowrank.core.data import SpikedData
from lowrank.core.spectral import TopSingular, alignment, count_outliers, leading_spectrum, top_singular
from lowrank.gradients.decomposition import Decomposition, decompose_problem, spiked_problem

__all__ = [
    "residue_alignment",
    "residue_alignment_beta",
    "SPIKE_LABELS",
    "DominantSpike",
    "dominant_spike",
    "rule_of_thumb",
    "rule_of_thumb_boundaries",
    "dominant_spike_of_problem",
    "phase_grid",
    "small_nu_split",
]


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



SPIKE_LABELS = ("residue", "data", "both", "none")


class DominantSpike(NamedTuple):
    label: str  # one of SPIKE_LABELS
    outliers: int
    align_residue: float  # |cos(u1, X_B^T r)|
    align_q: float  # |cos(u1, q)|
    residue_in_top2: float  # ||U_2^T x|| with x = X_B^T r / ||X_B^T r||
    q_in_top2: float  # ||U_2^T q||
    second_ratio: float  # s_2 / s_1 of G


def dominant_spike(G, residue_direction, q, *, gap: float = 1.5, max_outliers: int = 5,
                   subspace_threshold: float = 0.5, min_ratio: float = 0.1,
                   top: TopSingular | None = None) -> DominantSpike:
    """Which spike dominates a gradient `G` (d x m), read off its spectrum and singular vectors.

    Parameters
    ----------
    G : d x m gradient, or a `Decomposition` (its product form, no matrix formed). residue_direction : (d,), `X_B^T r`. q : (d,) spike direction.
    gap : the ratio `s_k / s_{k+1}` that separates an outlier (`count_outliers`); max_outliers : how
    many leading values are examined; subspace_threshold : share of a direction in `U_2` that counts
    as "inside"; min_ratio : `s_2 / s_1` below which G counts as rank one. top : G's leading triplets
    already computed (e.g. for a spectrum of the same G), used when they number at least
    `max_outliers + 1`: one iterative SVD instead of two.

    Returns
    -------
    `DominantSpike` (label one of SPIKE_LABELS, and the numbers behind it, dimensionless).

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
        (rows, cols), leading = (A.shape[1], B.shape[1]), G.top
    else:
        G = as_tensor(G, "G", min_ndim=2)
        (rows, cols), leading = G.shape, lambda _, k: top_singular(G, k)
    if not 0 < subspace_threshold <= 1:
        raise ValueError(f"subspace_threshold must be in (0, 1], got {subspace_threshold}")
    if not 0 <= min_ratio <= 1:
        raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")
    x = as_tensor(residue_direction, "residue_direction", min_ndim=1)
    q = as_tensor(q, "q", min_ndim=1)
    if x.shape != (rows,) or q.shape != (rows,):
        raise ValueError(f"residue_direction and q must have G's {rows} rows, got "
                         f"{tuple(x.shape)} and {tuple(q.shape)}")
    needed = min(max(max_outliers + 1, 2), rows, cols)
    if top is not None and len(top.s) >= needed and top.U.shape[0] == rows:
        U, s = top.U[:, :needed], top.s[:needed]
    else:
        U, s, _ = leading("G", needed)
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
    return DominantSpike(label, k, float(a_res), float(a_q), x_in, q_in, ratio)


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


def dominant_spike_of_problem(dec: Decomposition, data: SpikedData, **kwargs) -> DominantSpike:
    """`dominant_spike` of a decomposed spiked problem: residue direction `X_B^T r`, spike `q`."""
    return dominant_spike(dec, data.X_B.T @ dec.r, data.q, **kwargs)


def phase_grid(n: int, d: int, m: int, *, nus, alphas, seeds, activation: str, scaling: str = "ntk",
               gap: float = 1.5, min_ratio: float = 0.1, spectrum_top: int = 8, workers: int = 1):
    """The measured dominant spike beside the rule of thumb's, one spiked problem per (nu, alpha, seed) cell.

    Parameters
    ----------
    n, d, m : samples, input dimension, width. nus, alphas, seeds : the grid; a cell's problem is
    `decomposition.spiked_problem(..., seed=seed)` with its own seed. activation, scaling : the
    network's. gap, min_ratio : `dominant_spike`'s. spectrum_top : leading singular values of G kept
    per cell (from 6 on, `dominant_spike`'s `max_outliers + 1`, the call reuses them: one SVD per cell).
    workers : processes for the cells (`lowrank.core.parallel.map_tasks`); each cell is seeded by its
    own seed, so the table does not depend on it.

    Returns
    -------
    DataFrame, one row per cell in the order (nu, alpha, seed): those three, `measured` (the label
    of `dominant_spike_of_problem`), `rule` (`rule_of_thumb` at the cell's own `beta_hat`), `beta_hat`
    (`residue_alignment_beta`), `agree`, the other fields of `DominantSpike`, the spike norms
    (`Decomposition.spike_norms`) and `sv_1` .. `sv_{spectrum_top}` (`leading_spectrum`).
    """
    import pandas as pd

    check_workers(workers)
    if not isinstance(spectrum_top, int) or isinstance(spectrum_top, bool) or spectrum_top < 1:
        raise ValueError(f"spectrum_top must be a positive integer, got {spectrum_top!r}")
    cells = list(itertools.product(nus, alphas, seeds))
    rows = map_tasks(functools.partial(_phase_cell, n=n, d=d, m=m, activation=activation, scaling=scaling, gap=gap,
                                       min_ratio=min_ratio, spectrum_top=spectrum_top), cells, workers, desc="phase cells")
    return pd.DataFrame(rows).drop(columns="label")


def _phase_cell(cell, *, n, d, m, activation, scaling, gap, min_ratio, spectrum_top) -> dict:
    nu, alpha, seed = cell
    p = spiked_problem(n, d, m, alpha=alpha, nu=nu, activation=activation, scaling=scaling, seed=seed)
    dec = decompose_problem(p, dense=False)  # only G's leading pairs are read
    top = dec.top("G", spectrum_top)  # G's leading pairs in product form, shared by the call and the spectrum
    call = dominant_spike_of_problem(dec, p.data, gap=gap, min_ratio=min_ratio, top=top)
    beta = residue_alignment_beta(p.data.z, dec.r, d)
    rule = rule_of_thumb(nu, alpha, beta)
    return {"nu": nu, "alpha": alpha, "seed": seed, "measured": call.label, "rule": rule, "beta_hat": beta,
            "agree": call.label == rule, **call._asdict(), **dec.spike_norms(), **leading_spectrum(top)}


def small_nu_split(grid):
    """Theorem 3.1's split for nu < 1/4, cell by cell: which of ||S1||, ||S12|| beta predicts larger.

    `grid` has one row per cell with `nu`, `alpha`, `beta_hat`, `norm_S1`, `norm_S12`. Returns its rows
    with nu < 1/4 and two more columns: `predicted` ("S1" when beta_hat > 2 nu + alpha, "S12" when
    beta_hat < 2 nu, else "neither") and `larger` ("S1" when ||S1|| >= ||S12||, else "S12").
    """
    return grid[grid["nu"] < 0.25].assign(
        predicted=lambda g: np.where(g["beta_hat"] > 2 * g["nu"] + g["alpha"], "S1",
                                     np.where(g["beta_hat"] < 2 * g["nu"], "S12", "neither")),
        larger=lambda g: np.where(g["norm_S1"] >= g["norm_S12"], "S1", "S12"))
