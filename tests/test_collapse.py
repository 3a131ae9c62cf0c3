"""lowrank.square.collapse: neural-collapse metrics on constructed features, the streaming version, margins."""

import math

import numpy as np
import pytest
import torch

from lowrank.square import collapse


def simplex_etf(C: int, p: int, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    """C x p class means whose centred versions form a simplex ETF, plus a non-zero global mean."""
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(p, C + 1, generator=g, dtype=torch.float64))
    E = torch.eye(C, dtype=torch.float64) - 1.0 / C  # centred one-hot, rows sum to 0
    M = scale * E @ Q[:, :C].T  # C x p, rows mu_c - mu_G
    mu_G = 5.0 * Q[:, C]  # orthogonal to the span of the centred means
    return M + mu_G


def collapsed_features(C=4, p=12, n_per_class=7, noise=0.0, seed=0):
    means = simplex_etf(C, p, seed)
    y = torch.arange(C).repeat_interleave(n_per_class)
    g = torch.Generator().manual_seed(seed + 1)
    H = means[y] + noise * torch.randn(len(y), p, generator=g, dtype=torch.float64)
    W = means - means.mean(0)  # the classifier equals the centred means (NC3), orthogonal to mu_G
    return H, y, W


def test_simplex_etf_features_give_zero_metrics():
    H, y, W = collapsed_features()
    out = collapse.nc_metrics(H, y, W)
    for key in collapse.NC_KEYS:
        assert abs(out[key]) < 1e-10, (key, out[key])
    assert out["classifier_cos_mean"] == pytest.approx(-1 / 3, abs=1e-12)
    assert out["means_cos_mean"] == pytest.approx(-1 / 3, abs=1e-12)
    assert out["classifier_global_mean_cos"] < 1e-10
    assert out["classifier_global_mean_ratio"] < 1e-10
    assert out["num_classes"] == 4


def test_small_noise_gives_small_nc1_and_scaled_classifier_is_still_collapsed():
    H, y, W = collapsed_features(noise=1e-3)
    out = collapse.nc_metrics(H, y, 7.5 * W)
    assert 0 < out["nc1"] < 1e-5
    assert out["nc3"] < 1e-3 and out["nc4"] == 0


def test_random_features_are_far_from_collapse():
    g = torch.Generator().manual_seed(3)
    H = torch.randn(200, 10, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (200,), generator=g)
    W = torch.randn(5, 10, generator=g, dtype=torch.float64)
    out = collapse.nc_metrics(H, y, W)
    assert out["nc1"] > 1.0  # within-class scatter dominates
    assert out["nc3"] > 0.5
    assert out["nc2_equiangular_classifiers"] > 0.05
    assert out["nc4"] > 0.3
    assert out["nc1_no_c"] == pytest.approx(5 * out["nc1"])
    assert out["nc3_squared"] == pytest.approx(out["nc3"] ** 2)


def test_nc1_matches_the_direct_formula():
    g = torch.Generator().manual_seed(4)
    H = torch.randn(60, 6, generator=g, dtype=torch.float64)
    y = torch.arange(3).repeat(20)
    W = torch.randn(3, 6, generator=g, dtype=torch.float64)
    means = torch.stack([H[y == c].mean(0) for c in range(3)])
    mu_G = means.mean(0)
    Sw = sum((H[y == c] - means[c]).T @ (H[y == c] - means[c]) for c in range(3)) / 60
    Sb = (means - mu_G).T @ (means - mu_G) / 3
    expected = float(torch.trace(Sw @ torch.linalg.pinv(Sb, hermitian=True, rtol=1e-10))) / 3
    assert collapse.nc_metrics(H, y, W)["nc1"] == pytest.approx(expected, rel=1e-8)


def test_binary_scalar_classifier_equals_two_row_classifier():
    g = torch.Generator().manual_seed(5)
    H = torch.randn(40, 8, generator=g, dtype=torch.float64)
    y_pm = torch.where(torch.arange(40) % 2 == 0, -1, 1)
    w = torch.randn(1, 8, generator=g, dtype=torch.float64)
    one = collapse.nc_metrics(H, y_pm, w, b=torch.tensor([0.3]))
    two = collapse.nc_metrics(H, (y_pm + 1) // 2, torch.cat([-w, w]), b=torch.tensor([-0.3, 0.3]))
    for key in one:
        assert one[key] == pytest.approx(two[key], rel=1e-12, abs=1e-14), key


def random_problem(seed=6, C=3, p=9, n=101):
    g = torch.Generator().manual_seed(seed)
    H = torch.randn(n, p, generator=g, dtype=torch.float64) + 4.0
    y = torch.randint(0, C, (n,), generator=g)
    W = torch.randn(C, p, generator=g, dtype=torch.float64)
    b = torch.randn(C, generator=g, dtype=torch.float64)
    return H, y, W, b


def test_streaming_equals_batch():
    H, y, W, b = random_problem()
    batch = collapse.nc_metrics(H, y, W, b)
    means = torch.stack([H[y == c].mean(0) for c in range(3)])
    sizes = [13, 1, 40, 25, 22]
    chunks = list(zip(torch.split(H, sizes), torch.split(y, sizes)))
    stream = collapse.nc_metrics_streaming(chunks, W, b, reference_means=means)
    for key in batch:
        assert stream[key] == pytest.approx(batch[key], rel=1e-9, abs=1e-12), key


def test_streaming_without_reference_means_has_nan_nc4_only():
    H, y, W, _ = random_problem(seed=7)
    batch = collapse.nc_metrics(H, y, W)
    stream = collapse.nc_metrics_streaming(zip(torch.split(H, 10), torch.split(y, 10)), W)
    assert math.isnan(stream["nc4"])
    for key in batch:
        if key != "nc4":
            assert stream[key] == pytest.approx(batch[key], rel=1e-9, abs=1e-12), key


def test_streaming_keeps_precision_near_collapse():
    H, y, W = collapsed_features(noise=1e-7, p=6)
    H = H + 1e4  # a large common offset: a naive sum of squares would lose the within-class scatter
    batch = collapse.nc_metrics(H, y, W)
    stream = collapse.nc_metrics_streaming(zip(torch.split(H, 5), torch.split(y, 5)), W)
    assert stream["nc1"] == pytest.approx(batch["nc1"], rel=1e-4)


def test_errors_name_the_problem():
    H, y, W, _ = random_problem()
    with pytest.raises(ValueError, match="C x p"):
        collapse.nc_metrics(H, y, W[:, :4])
    with pytest.raises(ValueError, match="labels must lie"):
        collapse.nc_metrics(H, y + 5, W)
    with pytest.raises(ValueError, match="no samples"):
        collapse.nc_metrics(H, torch.zeros_like(y), W)
    with pytest.raises(ValueError, match="labels"):
        collapse.nc_metrics(H, y[:-1], W)
    with pytest.raises(ValueError, match="NaN"):
        collapse.nc_metrics(H * float("nan"), y, W)


def test_centred_one_hot_and_margins():
    T = collapse.centred_one_hot(torch.tensor([0, 2, 1]), 3)
    assert torch.allclose(T.sum(1), torch.zeros(3, dtype=T.dtype))
    assert torch.all(T.max(1).values == 1) and T[0, 1] == -0.5
    f = torch.tensor([0.2, -0.1, 0.4])
    assert torch.allclose(collapse.margins(f, torch.tensor([1, -1, -1])), torch.tensor([0.2, 0.1, -0.4]))
    out = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
    assert torch.allclose(collapse.margins(out, torch.tensor([0, 2])), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="-1, \\+1"):
        collapse.margins(f, torch.tensor([0, 1, 1]))


def test_margin_stats_predictions_are_consistent():
    g = np.random.default_rng(0)
    fbar = g.uniform(0.01, 0.05, size=50)
    lam = 1e-3
    mu, M = fbar.mean(), (fbar**2).mean()
    rho_eq = mu / (M + lam)
    s = collapse.margin_stats(fbar, rho_eq, lam)
    assert s["rho_eq"] == pytest.approx(rho_eq)
    assert s["sigma2"] == pytest.approx(M - mu**2)
    # at rho = rho_eq the measured gap equals Eq. 8's prediction exactly
    assert s["gap_measured"] == pytest.approx(s["gap_predicted"], rel=1e-12)
    assert s["rho_over_rho_eq"] == pytest.approx(1.0)
    assert s["fraction_positive"] == 1.0


def test_fig9_equiangularity_and_eq43_against_numpy():
    """Fig. 9's std / mean of the pairwise cosines and Eq. 43's row norms, computed independently."""
    g = np.random.default_rng(3)
    H = torch.tensor(g.random((40, 9)))
    y = torch.arange(4).repeat_interleave(10)
    W = torch.tensor(g.standard_normal((4, 9)))
    out = collapse.nc_metrics(H, y, W)
    Wn = W.numpy() / np.linalg.norm(W.numpy(), axis=1, keepdims=True)
    cos = (Wn @ Wn.T)[np.triu_indices(4, 1)]
    assert out["nc2_equiangular_classifiers_fig9"] == pytest.approx(np.std(cos) / abs(np.mean(cos)), rel=1e-10)
    means = np.stack([H.numpy()[y.numpy() == c].mean(0) for c in range(4)])
    M = means - means.mean(0)
    Mn = M / np.linalg.norm(M, axis=1, keepdims=True)
    cos_m = (Mn @ Mn.T)[np.triu_indices(4, 1)]
    assert out["nc2_equiangular_means_fig9"] == pytest.approx(np.std(cos_m) / abs(np.mean(cos_m)), rel=1e-10)
    sq = (W.numpy() ** 2).sum(1)
    assert out["classifier_row_norm_dev"] == pytest.approx(np.abs(sq / sq.sum() - 0.25).max(), rel=1e-10)
    etf = collapse.nc_metrics(*collapsed_features())
    assert etf["nc2_equiangular_classifiers_fig9"] < 1e-10 and etf["classifier_row_norm_dev"] < 1e-12


def test_global_mean_conventions_on_unbalanced_classes():
    """papyan / zhu / paper agree on balanced classes and differ as documented on unbalanced ones."""
    H, y, W = collapsed_features(noise=0.3)
    base = collapse.nc_metrics(H, y, W)
    for conv in ("zhu", "paper"):
        other = collapse.nc_metrics(H, y, W, convention=conv)
        for key in collapse.NC_KEYS:
            assert other[key] == pytest.approx(base[key], rel=1e-10, abs=1e-14), (conv, key)
    keep = torch.cat([torch.arange(0, 7), torch.arange(7, 9), torch.arange(14, 21), torch.arange(21, 24)])
    Hu, yu = H[keep], y[keep]
    h, lab = Hu.numpy(), yu.numpy()
    means = np.stack([h[lab == c].mean(0) for c in range(4)])
    for conv, mu_G in (("papyan", means.mean(0)), ("zhu", h.mean(0)), ("paper", means.mean(0))):
        out = collapse.nc_metrics(Hu, yu, W, convention=conv)
        Sb = (means - mu_G).T @ (means - mu_G) / 4
        if conv == "paper":
            Sw = sum(np.cov(h[lab == c].T, bias=True) for c in range(4)) / 4
        else:
            d = h - means[lab]
            Sw = d.T @ d / len(h)
        assert out["nc1"] == pytest.approx(np.trace(Sw @ np.linalg.pinv(Sb, rcond=1e-10)) / 4, rel=1e-6), conv
        assert out["tr_sigma_b"] == pytest.approx(np.trace(Sb), rel=1e-10), conv
    assert collapse.nc_metrics(Hu, yu, W, convention="zhu")["tr_sigma_b"] != pytest.approx(
        collapse.nc_metrics(Hu, yu, W)["tr_sigma_b"], rel=1e-6)
    with pytest.raises(ValueError, match="convention"):
        collapse.nc_metrics(H, y, W, convention="mean")


def test_two_class_uncentred_nc2_is_impossible_for_relu_features():
    """Theorem 5's mu_+ = -mu_- with non-negative features forces both means to 0; the centred means of
    two classes are always opposite and equinorm (so NC2 of the means is void for C = 2)."""
    g = torch.Generator().manual_seed(0)
    H = torch.relu(torch.randn(30, 6, generator=g, dtype=torch.float64))
    y = torch.arange(2).repeat_interleave(15)
    out = collapse.nc_metrics(H, y, torch.randn(2, 6, generator=g, dtype=torch.float64))
    assert out["nc2_equinorm_means"] < 1e-12 and out["nc2_equiangular_means"] < 1e-12
    mp, mm = H[y == 1].mean(0), H[y == 0].mean(0)
    assert float(mp @ mm) >= 0  # cos(mu_+, mu_-) >= 0, never -1 unless a mean is 0


def test_uncentred_means_cosine():
    H = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0], [0.0, 4.0]], dtype=torch.float64)
    assert collapse.uncentred_means_cosine(H, torch.tensor([-1, -1, 1, 1])) == pytest.approx(0.0)
    assert collapse.uncentred_means_cosine(-H[[0, 1, 0, 1]] * torch.tensor([[1.0], [1.0], [-1.0], [-1.0]],
                                           dtype=torch.float64), torch.tensor([0, 0, 1, 1])) == pytest.approx(-1.0)


def test_nc_falls_pooled_judges_the_seed_average():
    import pandas as pd

    from lowrank.square import summaries

    a = pd.DataFrame({"epoch": [0, 10], "nc1": [1.0, 0.3], "shuffled_nc1": [1.0, 0.9]})
    b = pd.DataFrame({"epoch": [0, 10], "nc1": [1.0, 0.8], "shuffled_nc1": [1.0, 1.0]})
    one = summaries.nc_falls_pooled([a], 2.0, keys=("nc1",))
    assert one.drop(columns="runs").equals(summaries.nc_falls(a, 2.0, keys=("nc1",)))
    both = summaries.nc_falls_pooled([a, b], 2.0, keys=("nc1",)).set_index("labels")
    # by hand: mean initial 1.0, mean final 0.55 -> does not fall 2x, though seed a alone does
    assert both.loc["true", "initial"] == 1.0 and both.loc["true", "final"] == pytest.approx(0.55)
    assert not both.loc["true", "falls"] and both.loc["true", "runs"] == 2
    assert both.loc["shuffled", "final"] == pytest.approx(0.95)
    with pytest.raises(ValueError):
        summaries.nc_falls_pooled([], 2.0)


def _projected_gd_on_classifier(H, T, rho, lam, lr, steps, seed=0, row_sum_scale=1.0):
    """Projected gradient descent on a unit-Frobenius C x p classifier V with rho updated by its own
    gradient, written out in numpy (no autograd): returns V_0, V_T and sum_t log(1 + lr <G_t, V_t>).
    `row_sum_scale` scales the initial row sum against the centred part."""
    rng = np.random.default_rng(seed)
    N, C = T.shape
    V = rng.standard_normal((C, H.shape[1]))
    V = V - V.mean(0) + row_sum_scale * V.mean(0)
    V /= np.linalg.norm(V)
    V0, log_scale = V.copy(), 0.0
    for _ in range(steps):
        R = rho * H @ V.T - T  # N x C residuals
        G = 2 * rho / N * R.T @ H  # dL/dV for a free matrix V
        g_rho = 2 / N * np.sum(R * (H @ V.T)) + 2 * lam * rho
        radial = np.sum(G * V)
        log_scale += math.log(1 + lr * radial)
        V = V - lr * (G - radial * V)
        V /= np.linalg.norm(V)
        rho -= lr * g_rho
    return V0, V, log_scale


@pytest.mark.parametrize("shuffle", [False, True])
def test_row_sum_shrinks_at_least_as_the_classifier_is_rescaled_for_any_labels(shuffle):
    rng = np.random.default_rng(3)
    C, p, N = 4, 10, 60
    y = np.arange(N) % C
    means = rng.standard_normal((C, p))
    H = np.abs(means[y] + 0.3 * rng.standard_normal((N, p)))  # non-negative, like ReLU features
    labels = rng.permutation(y) if shuffle else y
    T = collapse.centred_one_hot(torch.as_tensor(labels), C).numpy()
    V0, V, log_scale = _projected_gd_on_classifier(H, T, rho=0.3, lam=1e-2, lr=0.05, steps=300)
    excess = collapse.row_sum_excess(torch.as_tensor(V0), torch.as_tensor(V), log_scale)
    direct = math.log(np.linalg.norm(V.sum(0)) / np.linalg.norm(V0.sum(0))) - log_scale
    assert excess == pytest.approx(direct, abs=1e-12)
    assert excess <= 1e-12  # the label-free contraction by the feature moment only adds to the shrinking
    if not shuffle:  # the fit grows rho, and the steps shrink the classifier as a whole
        assert log_scale < -0.5
        # one row feels the labels: the same bound fails for it
        assert collapse.row_sum_excess(torch.as_tensor(V0), torch.as_tensor(V), log_scale, rows=[0]) > 0.1
    # with vanishing features the contraction is nil and the bound is an equality
    V0, V, log_scale = _projected_gd_on_classifier(1e-4 * H, T, rho=0.3, lam=1e-2, lr=0.05, steps=300)
    assert collapse.row_sum_excess(torch.as_tensor(V0), torch.as_tensor(V), log_scale) == pytest.approx(0, abs=1e-6)


def test_row_sum_bound_needs_centred_targets():
    """With one-hot targets (rows sum to 1) the row sum is pulled away from 0 and the bound fails."""
    rng = np.random.default_rng(4)
    C, p, N = 3, 8, 45
    y = np.arange(N) % C
    H = np.abs(rng.standard_normal((C, p))[y] + 0.2 * rng.standard_normal((N, p)))
    T = np.eye(C)[y]
    V0, V, log_scale = _projected_gd_on_classifier(H, T, rho=0.3, lam=1e-2, lr=0.05, steps=300, row_sum_scale=1e-3)
    assert collapse.row_sum_excess(torch.as_tensor(V0), torch.as_tensor(V), log_scale) > 0.1


def test_row_sum_excess_rejects_a_zero_row_sum():
    W = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    with pytest.raises(ValueError, match="non-zero"):
        collapse.row_sum_excess(W, W, 0.0)


@pytest.mark.parametrize("num_classes", [2, 3])
def test_margin_stats_eq8_holds_at_several_outputs_against_the_minimised_loss(num_classes):
    # Independent of mu, M and sigma: the loss (1/N) sum ||rho f_n - t_n||^2 + lam rho^2 minimised over rho
    # numerically; at the minimiser the relative gap to interpolation is loss_min / c (c = mean ||t_n||^2).
    from scipy.optimize import minimize_scalar

    g = torch.Generator().manual_seed(3)
    n, lam = 40, 1e-2
    y = torch.arange(n) % num_classes
    f = 0.05 * torch.randn(n, num_classes, generator=g, dtype=torch.float64)
    f = f + 0.03 * collapse.centred_one_hot(y, num_classes).double()  # some fit, some off-target part
    t = collapse.centred_one_hot(y, num_classes).double().numpy()
    fn = f.numpy()
    c = float((t**2).sum(1).mean())
    assert c == pytest.approx(num_classes / (num_classes - 1))
    res = minimize_scalar(lambda r: ((r * fn - t) ** 2).sum(1).mean() + lam * r**2, bounds=(0, 1e4),
                          method="bounded", options={"xatol": 1e-10})
    s = collapse.margin_stats(collapse.margins(f, y), res.x, lam, second_moment=float((f**2).sum(1).mean()),
                              target_sq=c)
    assert s["rho_eq"] == pytest.approx(res.x, rel=1e-6)
    assert s["gap_predicted"] == pytest.approx(res.fun / c, rel=1e-8)
    assert s["gap_measured"] == pytest.approx(res.fun / c, rel=1e-6)
    # the one-output form with the margins' spread alone does not hold here (the off-target part counts)
    one_output = (s["sigma2"] + lam) / (s["mu"] ** 2 + s["sigma2"] + lam)
    assert abs(one_output - res.fun / c) > 1e-3


def test_fitted_runs_and_final_mean_read_only_the_runs_that_fit():
    import pandas as pd

    from lowrank.square import summaries

    fits = pd.DataFrame({"train_error": [0.5, 0.0], "nc1": [1.0, 0.2]})
    misses = pd.DataFrame({"train_error": [0.5, 0.01], "nc1": [1.0, 0.9]})
    fits_too = pd.DataFrame({"train_error": [0.4, 0.0], "nc1": [1.0, 0.4]})
    kept = summaries.fitted_runs([fits, misses, fits_too], 0.0)
    assert len(kept) == 2 and kept[0] is fits and kept[1] is fits_too
    assert len(summaries.fitted_runs([misses], 0.0)) == 0 and len(summaries.fitted_runs([misses], 0.01)) == 1
    assert summaries.fitted_runs([pd.DataFrame({"nc1": [1.0]})], 1.0) == []
    # by hand: the last nc1 of the two fitted runs, (0.2 + 0.4) / 2
    assert summaries.final_mean(summaries.fitted_runs([fits, misses, fits_too], 0.0), "nc1") == pytest.approx(0.3)
    assert math.isnan(summaries.final_mean(summaries.fitted_runs([misses], 0.0), "nc1"))  # no fallback to misses
    assert math.isnan(summaries.final_mean([fits], "nc3"))
