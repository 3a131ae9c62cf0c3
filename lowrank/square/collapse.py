"""Margins and neural-collapse metrics (Papyan, Han, Donoho 2020; Xu et al. 2023, Section "Neural
Collapse").

Features `H` are N x p (one row per sample), labels are integers, the classifier `W` is C x p with
an optional bias b (C). For a binary classifier with one output (`W` of shape 1 x p, labels in
{-1, +1} or {0, 1}) the two-class classifier `[-w; w]` (bias `[-b, b]`) is used: it takes the same
decisions as `sign(w . h + b)`.

Definitions (Eq. 26-27 of the square-loss paper):

- class means `mu_c`, global mean `mu_G = (1/C) sum_c mu_c` (the mean of the class means; see
  `nc_metrics(convention=...)` for the other readings on unbalanced classes);
- `Sigma_W = (1/N) sum_n (h_n - mu_{y_n})(h_n - mu_{y_n})^T` over all N samples (for balanced
  classes this is the paper's `(1/C) sum_c (1/N_c) sum_n ...`);
- `Sigma_B = (1/C) sum_c (mu_c - mu_G)(mu_c - mu_G)^T`, `M = [mu_c - mu_G]` (p x C).

The metrics (all tend to 0 under neural collapse):

- `nc1 = Tr(Sigma_W Sigma_B^+) / C` (the paper's definition); `nc1_no_c` omits the `1/C`, as the
  original neural-collapse code does;
- `nc2_equinorm_means`, `nc2_equinorm_classifiers`: coefficient of variation (std with Bessel's
  correction, as the original code, over mean) of `||mu_c - mu_G||` and of `||W_c||`;
- `nc2_equiangular_means`, `nc2_equiangular_classifiers`: mean over pairs c != c' of
  `|cos(., .) + 1/(C-1)|`; `nc2_equiangular_means_fig9`, `nc2_equiangular_classifiers_fig9`: the
  paper's Fig. 9 measure, the std of the pairwise cosines over their average (absolute value; the
  population std over the C(C-1)/2 pairs, so 0 for C = 2 where there is one pair);
- `nc3 = || W^T/||W||_F - M/||M||_F ||_F`, and `nc3_squared` (what the original code reports);
- `nc4`: fraction of samples where `argmax_c (W h + b)_c` differs from `argmin_c ||h - mu_c||`.

Also returned: `classifier_cos_mean` and `means_cos_mean` (mean pairwise cosines, which tend to
`-1/(C-1)`), `classifier_global_mean_cos` (`max_c |cos(W_c, mu_G)|`) and
`classifier_global_mean_ratio` (`||W mu_G|| / mean_c ||W (mu_c - mu_G)||`: the output the global mean
produces against the class-specific part; both measure the paper's `V_L^c . mu_G -> 0`, the ratio is
not already small for random W as the cosine is in high dimension), `classifier_row_norm_dev`
(`max_c | ||W_c||^2 / ||W||_F^2 - 1/C |`, Eq. 43's `||V_L^c||^2 = 1/C` at unit `||V_L||_F`), `tr_sigma_w`, `tr_sigma_b`,
`num_classes`.

Centred targets and the classifier's row sum (`row_sum_excess`). With targets that sum to zero over
the outputs (`centred_one_hot`, and `(1, -1)` for C = 2), write the classifier `V` (C x p, unit
Frobenius norm) as its centred part `P V` (`P = I - 11^T/C`) plus its row sum `s = sum_c V_c`. The
loss splits exactly as

    (1/N) sum_n ||rho P V h_n - t_n||^2 + (rho^2 / C) (1/N) sum_n (s . h_n)^2 + lam rho^2,

so the labels act on `P V` only: the gradient in `s` is `2 rho^2 Sigma s` with the uncentred feature
moment `Sigma = (1/N) sum_n h_n h_n^T`, whatever the labels. A projected gradient step (no momentum)
moves `V` by `-lr (G - <G, V> V)` and puts it back on the unit sphere, so

    s_{t+1} = ((1 + lr <G, V>) s_t - 2 lr rho^2 Sigma s_t) / ||V - lr (G - <G, V> V)||,

and as long as `2 lr rho^2 ||Sigma|| <= 2 (1 + lr <G, V>)` (a stable step) `||s_{t+1}|| <= (1 + lr <G, V>)
||s_t||`: the row sum shrinks at least by the factor that rescales the whole of `V`, plus a label-free
contraction by `Sigma`. Summed over the run, `log(||s_T|| / ||s_0||) <= sum_t log(1 + lr_t <G_t, V_t>)`
(`training.SquareRun.history["classifier_log_scale"]`), for true labels, shuffled labels and any lam.
Where the labels enter is `<G, V> = -2 rho (mu - rho M)` (`= -2 lam rho^2` at the rho of Eq. 7): how far
`s` falls depends on how large rho stays, not on the labels directly. For C = 2 the classifier ETF
(`cos(V_1, V_2) = -1`) is `s = 0` and the row-norm deviation is `|(V_1 - V_2) . s| / 2`, so both are
consequences of this contraction; for C > 2 the mean pairwise inner product of the rows is
`(||s||^2 - 1) / (C (C - 1))`, which is `-1 / (C (C - 1))` (the simplex value at equal norms) only at `s = 0`.
"""

from __future__ import annotations

import math

import torch

from lowrank.core.validation import as_tensor, check_positive

__all__ = [
    "NC_KEYS",
    "GLOBAL_MEAN_CONVENTIONS",
    "nc_metrics",
    "NCAccumulator",
    "nc_metrics_streaming",
    "centred_one_hot",
    "margins",
    "margin_stats",
    "uncentred_means_cosine",
    "row_sum_excess",
]

NC_KEYS = (
    "nc1", "nc1_no_c", "nc2_equinorm_means", "nc2_equinorm_classifiers", "nc2_equiangular_means",
    "nc2_equiangular_classifiers", "nc3", "nc3_squared", "nc4",
)


def _classifier(W, b, p: int):
    """W as C x p float64 (a 1-row W becomes [-w; w]), b as C or None."""
    W = as_tensor(W, "W", min_ndim=2)
    if W.ndim != 2 or W.shape[1] != p:
        raise ValueError(f"W must be C x p with p={p} (the features' width), got shape {tuple(W.shape)}")
    if b is not None:
        b = as_tensor(b, "b", min_ndim=1).reshape(-1)
        if b.shape[0] != W.shape[0]:
            raise ValueError(f"b must have one entry per row of W ({W.shape[0]}), got {b.shape[0]}")
    if W.shape[0] == 1:
        W = torch.cat([-W, W])
        b = None if b is None else torch.cat([-b, b])
    if W.shape[0] < 2:
        raise ValueError("neural collapse needs at least two classes")
    return W, b


def _labels(y, n: int, C: int) -> torch.Tensor:
    """Integer labels as indices 0..C-1; ±1 labels are accepted for C = 2 (-1 -> 0, +1 -> 1)."""
    t = torch.as_tensor(y).detach().cpu().reshape(-1)
    if t.is_floating_point():
        if not torch.equal(t, t.round()):
            raise ValueError("labels must be integers")
        t = t.round()
    t = t.to(torch.int64)
    if t.shape[0] != n:
        raise ValueError(f"got {t.shape[0]} labels for {n} feature rows")
    if C == 2 and bool(((t == -1) | (t == 1)).all()):
        t = (t + 1) // 2
    if t.numel() and (t.min() < 0 or t.max() >= C):
        raise ValueError(f"labels must lie in [0, {C}) (or be ±1 for a binary classifier), got range "
                         f"[{int(t.min())}, {int(t.max())}]")
    return t


def _cv(x: torch.Tensor) -> float:
    return float(x.std() / x.mean())


def _equiangularity(V: torch.Tensor) -> tuple[float, float, float]:
    """Of the rows of V: (mean over pairs of |cos + 1/(C-1)|, mean pairwise cosine, Fig. 9's
    std / |mean| of the pairwise cosines over the C(C-1)/2 pairs, population std: 0 for C = 2)."""
    C = V.shape[0]
    U = V / V.norm(dim=1, keepdim=True)
    G = U @ U.T
    off = ~torch.eye(C, dtype=torch.bool)
    pairs = G[torch.triu(torch.ones(C, C, dtype=torch.bool), diagonal=1)]
    mean = pairs.mean()
    fig9 = float(pairs.std(correction=0) / mean.abs()) if mean != 0 else float("inf")
    return float((G[off] + 1 / (C - 1)).abs().mean()), float(G[off].mean()), fig9


def _metrics_from_stats(means, counts, Sigma_W, W, b, nc4: float, mu_G=None) -> dict:
    C, p = means.shape
    if (counts == 0).any():
        missing = torch.nonzero(counts == 0).flatten().tolist()
        raise ValueError(f"classes {missing} have no samples: every class of the classifier needs samples")
    mu_G = means.mean(0) if mu_G is None else mu_G
    M = (means - mu_G).T  # p x C
    Sigma_B = M @ M.T / C
    # Sigma_B^+ from the SVD of M / sqrt(C): rank <= C - 1.
    U, s, _ = torch.linalg.svd(M / math.sqrt(C), full_matrices=False)
    U, s = U[:, : C - 1], s[: C - 1]  # the centred means sum to zero: rank <= C - 1
    keep = s > s.max() * max(p, C) * torch.finfo(s.dtype).eps
    if not keep.any():
        raise ValueError("all class means coincide: Sigma_B is zero and NC1 is undefined")
    U, s = U[:, keep], s[keep]
    tr_w_binv = float(torch.einsum("pk,pq,qk->k", U, Sigma_W, U).div(s**2).sum())
    mean_norms = M.norm(dim=0)
    W_norms = W.norm(dim=1)
    eq_means, cos_means, fig9_means = _equiangularity(M.T)
    eq_w, cos_w, fig9_w = _equiangularity(W)
    diff = W.T / W.norm() - M / M.norm()
    nc3 = float(diff.norm())
    g_norm = mu_G.norm()
    w_g = float(((W @ mu_G).abs() / (W_norms * g_norm)).max()) if g_norm > 0 else 0.0
    class_part = (W @ M).norm(dim=0).mean()  # mean_c ||W (mu_c - mu_G)||
    w_g_ratio = float((W @ mu_G).norm() / class_part) if class_part > 0 else float("inf")
    return {
        "nc1": tr_w_binv / C,
        "nc1_no_c": tr_w_binv,
        "nc2_equinorm_means": _cv(mean_norms),
        "nc2_equinorm_classifiers": _cv(W_norms),
        "nc2_equiangular_means": eq_means,
        "nc2_equiangular_classifiers": eq_w,
        "nc2_equiangular_means_fig9": fig9_means,
        "nc2_equiangular_classifiers_fig9": fig9_w,
        "nc3": nc3,
        "nc3_squared": nc3**2,
        "nc4": nc4,
        "classifier_cos_mean": cos_w,
        "means_cos_mean": cos_means,
        "classifier_global_mean_cos": w_g,
        "classifier_global_mean_ratio": w_g_ratio,
        "classifier_row_norm_dev": float(((W_norms**2 / (W_norms**2).sum()) - 1 / C).abs().max()),
        "tr_sigma_w": float(torch.trace(Sigma_W)),
        "tr_sigma_b": float(torch.trace(Sigma_B)),
        "num_classes": C,
    }


def _nearest_mean_disagreements(H, means, W, b) -> int:
    logits = H @ W.T + (0 if b is None else b)
    dist = (means**2).sum(1) - 2 * H @ means.T  # ||h - mu_c||^2 - ||h||^2
    return int((logits.argmax(1) != dist.argmin(1)).sum())


GLOBAL_MEAN_CONVENTIONS = ("papyan", "zhu", "paper")


def nc_metrics(H, y, W, b=None, convention: str = "papyan") -> dict:
    """Neural-collapse metrics of features `H` (N x p), integer labels `y` and classifier `W`
    (C x p, or 1 x p for a binary classifier), optional bias `b`. See the module docstring.

    Parameters
    ----------
    convention : how unbalanced classes are averaged (all three agree on balanced classes):
        "papyan": `mu_G` = mean of the class means, `Sigma_W` = (1/N) sum over all samples (Papyan, Han
        and Donoho's code); "zhu": `mu_G` = mean of all samples (Zhu et al. 2021), `Sigma_W` as papyan;
        "paper": Eqs. 26-27 of the square-loss paper read for unbalanced classes, `mu_G` = mean of the
        class means and `Sigma_W` = mean over classes of the class covariances `(1/N_c) sum_n ...`.

    Returns
    -------
    dict of the metrics (dimensionless; see the module docstring).
    """
    if convention not in GLOBAL_MEAN_CONVENTIONS:
        raise ValueError(f"convention must be one of {GLOBAL_MEAN_CONVENTIONS}, got {convention!r}")
    H = as_tensor(H, "H", min_ndim=2)
    if H.ndim != 2:
        raise ValueError(f"H must be N x p, got shape {tuple(H.shape)}")
    W, b = _classifier(W, b, H.shape[1])
    C = W.shape[0]
    idx = _labels(y, H.shape[0], C)
    counts = torch.bincount(idx, minlength=C).to(H.dtype)
    sums = torch.zeros(C, H.shape[1], dtype=H.dtype).index_add_(0, idx, H)
    means = sums / counts.clamp(min=1).unsqueeze(1)
    centred = H - means[idx]
    if convention == "paper":
        weights = (1.0 / (C * counts.clamp(min=1)))[idx]  # (1/C) (1/N_c) per sample
        Sigma_W = (centred * weights.unsqueeze(1)).T @ centred
    else:
        Sigma_W = centred.T @ centred / H.shape[0]
    nc4 = _nearest_mean_disagreements(H, means, W, b) / H.shape[0]
    mu_G = H.mean(0) if convention == "zhu" else None
    return _metrics_from_stats(means, counts, Sigma_W, W, b, nc4, mu_G=mu_G)


class NCAccumulator:
    """The statistics of `nc_metrics`, accumulated in one pass over batches of (features, labels).

    Per class it keeps a count and a sum, shifted by that class's mean in the first batch where it
    appears (so that near collapse the within-class scatter is not lost to cancellation), and one
    p x p matrix of shifted second moments. NC4 needs the class means before it can decide which is
    nearest; pass `reference_means` (C x p, e.g. from a previous pass) to count it in the same pass,
    otherwise `nc4` is NaN.
    """

    def __init__(self, W, b=None, reference_means=None):
        W = as_tensor(W, "W", min_ndim=2)
        self.W, self.b = _classifier(W, b, W.shape[1])
        self.C, self.p = self.W.shape
        self.reference_means = None
        if reference_means is not None:
            ref = as_tensor(reference_means, "reference_means", min_ndim=2)
            if tuple(ref.shape) != (self.C, self.p):
                raise ValueError(f"reference_means must be {self.C} x {self.p}, got {tuple(ref.shape)}")
            self.reference_means = ref
        self.n = 0
        self.counts = torch.zeros(self.C, dtype=torch.float64)
        self.shift = torch.zeros(self.C, self.p, dtype=torch.float64)
        self.seen = torch.zeros(self.C, dtype=torch.bool)
        self.sums = torch.zeros(self.C, self.p, dtype=torch.float64)
        self.second = torch.zeros(self.p, self.p, dtype=torch.float64)
        self.disagreements = 0

    def update(self, H, y) -> "NCAccumulator":
        H = as_tensor(H, "H", min_ndim=2)
        if H.ndim != 2 or H.shape[1] != self.p:
            raise ValueError(f"H must be N x {self.p}, got shape {tuple(H.shape)}")
        idx = _labels(y, H.shape[0], self.C)
        counts = torch.bincount(idx, minlength=self.C).to(torch.float64)
        new = (counts > 0) & ~self.seen
        if new.any():
            batch_sums = torch.zeros(self.C, self.p, dtype=torch.float64).index_add_(0, idx, H)
            self.shift[new] = batch_sums[new] / counts[new].unsqueeze(1)
            self.seen |= new
        shifted = H - self.shift[idx]
        self.sums.index_add_(0, idx, shifted)
        self.second += shifted.T @ shifted
        self.counts += counts
        self.n += H.shape[0]
        if self.reference_means is not None:
            self.disagreements += _nearest_mean_disagreements(H, self.reference_means, self.W, self.b)
        return self

    def class_means(self) -> torch.Tensor:
        return self.shift + self.sums / self.counts.clamp(min=1).unsqueeze(1)

    def result(self) -> dict:
        if self.n == 0:
            raise ValueError("no batches were accumulated")
        d = self.sums / self.counts.clamp(min=1).unsqueeze(1)  # mu_c - shift_c
        Sigma_W = (self.second - (d * self.counts.unsqueeze(1)).T @ d) / self.n
        nc4 = self.disagreements / self.n if self.reference_means is not None else float("nan")
        return _metrics_from_stats(self.class_means(), self.counts, Sigma_W, self.W, self.b, nc4)


def nc_metrics_streaming(batches, W, b=None, reference_means=None) -> dict:
    """`nc_metrics` over an iterable of `(H_batch, y_batch)` in one pass (see `NCAccumulator`)."""
    acc = NCAccumulator(W, b, reference_means)
    for H, y in batches:
        acc.update(H, y)
    return acc.result()


# -- margins ---------------------------------------------------------------------------------

def centred_one_hot(y, num_classes: int) -> torch.Tensor:
    """The paper's multiclass targets `e~_c`: 1 at coordinate c, `-1/(C-1)` elsewhere (N x C)."""
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    y = torch.as_tensor(y).reshape(-1).to(torch.int64)
    if y.numel() and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    T = torch.full((y.shape[0], num_classes), -1.0 / (num_classes - 1), dtype=torch.float64)
    T[torch.arange(y.shape[0]), y] = 1.0
    return T


def margins(outputs, y) -> torch.Tensor:
    """The margins `f_bar_n`: `y_n f_n` for scalar outputs and ±1 labels; `f(x_n) . e~_{y_n}` for
    C outputs and labels 0..C-1 (the multiclass first-order statistic of Lemma 7)."""
    f = torch.as_tensor(outputs).detach()
    y = torch.as_tensor(y).detach().to(f.device)
    if f.ndim == 1 or (f.ndim == 2 and f.shape[1] == 1):
        f = f.reshape(-1)
        if not bool(((y == 1) | (y == -1)).all()):
            raise ValueError("a scalar output needs labels in {-1, +1}")
        return y.to(f.dtype) * f
    if f.ndim != 2:
        raise ValueError(f"outputs must be N or N x C, got shape {tuple(f.shape)}")
    T = centred_one_hot(y.cpu(), f.shape[1]).to(device=f.device, dtype=f.dtype)
    return (f * T).sum(1)


def margin_stats(fbar, rho: float, weight_decay: float, second_moment=None, target_sq: float = 1.0) -> dict:
    """Statistics of the margins `f_bar_n` of the normalised network and the paper's predictions.

    `mu = mean f_bar`, `M = mean f_bar^2` (or `second_moment`, e.g. `mean ||f_V(x)||^2` in the
    multiclass case), `sigma2 = mean f_bar^2 - mu^2` (the spread of the margins); the equilibrium
    `rho_eq = mu / (M + lambda)` (Eq. 7).

    The gap to interpolation is measured relative to the targets' norm `c = target_sq = mean ||t_n||^2`
    (1 for ±1 targets, C/(C-1) for centred one-hot): interpolation `rho f_V(x_n) = t_n` means `rho mu = c`,
    so `gap_measured = 1 - rho mu / c`. Eq. 8 is written for unit targets; for `c != 1` it holds for the
    margins of the unit targets `t_n / sqrt(c)`: with `mu1 = mu / sqrt(c)` and `s2 = M - mu1^2` (the
    second moment of `f_V` not along the unit target, spread and off-target parts together),
    `gap_predicted = (s2 + lambda) / (mu1^2 + s2 + lambda)`, equal to `1 - rho_eq mu / c`. For one output
    with ±1 labels `s2 = sigma2` and this is the paper's Eq. 8 as printed. `gap_sigma2` is that `s2`.
    """
    f = as_tensor(fbar, "fbar", min_ndim=1).reshape(-1)
    check_positive(weight_decay, "weight_decay", strict=False)
    check_positive(target_sq, "target_sq")
    lam, c = float(weight_decay), float(target_sq)
    mu = float(f.mean())
    M = float((f**2).mean()) if second_moment is None else float(second_moment)
    sigma2 = max(float((f**2).mean()) - mu**2, 0.0)
    mu1_sq = mu**2 / c
    s2 = max(M - mu1_sq, 0.0)
    rho = float(rho)
    denom = M + lam
    rho_eq = mu / denom if denom > 0 else float("nan")
    return {
        "rho": rho,
        "mu": mu,
        "M": M,
        "sigma2": sigma2,
        "sigma": math.sqrt(sigma2),
        "gap_sigma2": s2,
        "rho_eq": rho_eq,
        "rho_over_rho_eq": rho / rho_eq if rho_eq != 0 and math.isfinite(rho_eq) else float("nan"),
        "gap_measured": 1 - rho * mu / c,
        "gap_predicted": (s2 + lam) / (mu1_sq + s2 + lam) if (mu1_sq + s2 + lam) > 0 else float("nan"),
        "margin_min": float(f.min()),
        "margin_max": float(f.max()),
        "fraction_positive": float((f > 0).to(torch.float64).mean()),
    }


def uncentred_means_cosine(H, y) -> float:
    """`cos(mu_a, mu_b)` of the two class means of features `H` (N x p) with two classes (labels ±1 or
    0/1), not centred. Theorem 5 (binary) has `mu_+ = -mu_-`, i.e. cosine -1; for ReLU features
    (non-negative) the cosine is >= 0, so that reading can hold only if a mean is 0."""
    H = as_tensor(H, "H", min_ndim=2)
    idx = _labels(y, H.shape[0], 2)
    a, b = H[idx == 0].mean(0), H[idx == 1].mean(0)
    denom = a.norm() * b.norm()
    return float(a @ b / denom) if denom > 0 else float("nan")


def row_sum_excess(W_initial, W_final, log_scale: float, rows=None) -> float:
    """`log(||s_T|| / ||s_0||) - log_scale`, with `s = sum_c W_c / ||W||_F` the classifier's row sum of
    `W_initial` (C x p, before training) and `W_final` (after), and `log_scale` the run's
    `sum_t log(1 + lr_t <G_t, V_t>)` (see the module docstring). With centred targets this is <= 0 up to
    round-off for any labels; it is 0 when the label-free contraction by the feature moment is negligible.
    `rows` (a list of row indices) replaces the row sum by the norm of those rows, which do feel the
    labels (the bound's negative control)."""
    norms = []
    for W in (W_initial, W_final):
        W = as_tensor(W, "W", min_ndim=2).to(torch.float64)
        W = W / W.norm()
        norms.append(float(W.sum(0).norm() if rows is None else W[list(rows)].norm()))
    if not all(n > 0 for n in norms):
        raise ValueError("the row sum (or the rows) of W_initial and W_final must be non-zero")
    return math.log(norms[1] / norms[0]) - float(log_scale)
