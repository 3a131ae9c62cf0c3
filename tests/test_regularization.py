"""The regularised gradients of Section 4 (weight decay, input noise, Jacobian penalty), the
residue-alignment exponent and the spectrum estimators of lowrank.gradients.decomposition, each against an
independent computation: autograd (torch.func), closed forms, or data with known parameters."""

import math

import numpy as np
import pytest
import torch
from torch.func import grad, jacrev

from lowrank.core import data, nets
from lowrank.gradients import decomposition, real_data, regularization, rule_of_thumb


@pytest.fixture(scope="module")
def small():
    D = data.spiked_gaussian(30, 20, alpha=0.5, nu=0.375, seed=11)
    y, _ = data.triple_index_target(D.X, seed=12)
    W = nets.sphere_rows(25, 20, seed=13)
    a = nets.outer_weights(25, seed=14)
    return D, y, W, a


def _mse_loss(X, W, a, y, activation, gamma):
    f = nets.two_layer_forward(X, W, a, activation=activation, gamma=gamma)
    return (0.5 * (f - y) ** 2).mean()


def test_weight_decay_gradient_matches_autograd(small):
    D, y, W, a = small
    lam, gamma = 0.37, 25**-0.5
    dec = decomposition.decompose(D.X_B, D.z, D.q, D.zeta, W, a, y, activation="tanh", gamma=gamma)
    G_wd = regularization.weight_decay_gradient(dec.G, W, lam)
    g = grad(lambda V: _mse_loss(D.X, V, a, y, "tanh", gamma) + lam / 2 * (V**2).sum())(W)
    torch.testing.assert_close(G_wd, g.T, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="d x m"):
        regularization.weight_decay_gradient(dec.G.T, W, lam)
    with pytest.raises(ValueError, match="lam must be non-negative"):
        regularization.weight_decay_gradient(dec.G, W, -1.0)


def test_weight_decay_scales():
    W = nets.sphere_rows(64, 32, seed=0)
    s = regularization.weight_decay_scales(W, gamma=1 / 8, n=100, nu=0.5)
    assert s.W_norm == pytest.approx(float(torch.linalg.matrix_norm(W, ord=2)))
    assert s.keeps_spikes_below == pytest.approx(8 * (1 / 8) / s.W_norm)
    assert s.suppresses_spikes_above == pytest.approx(s.keeps_spikes_below * 10.0)


def test_input_noise_joins_the_bulk_and_keeps_labels():
    p = decomposition.spiked_problem(40, 30, 35, alpha=0.5, nu=0.125, activation="relu", seed=2)
    tau2 = regularization.tau2_from_rho(40, -0.25)
    assert tau2 == pytest.approx(40**-0.25)
    noisy = regularization.noisy_problem(p, tau2, seed=9)
    assert torch.equal(noisy.y, p.y) and torch.equal(noisy.W, p.W) and torch.equal(noisy.a, p.a)
    N = noisy.data
    assert torch.equal(N.z, p.data.z) and torch.equal(N.q, p.data.q) and N.zeta == p.data.zeta
    xi = N.X - p.data.X
    torch.testing.assert_close(xi, N.X_B - p.data.X_B)
    torch.testing.assert_close(N.X, N.X_B + N.zeta * torch.outer(N.z, N.q))
    torch.testing.assert_close(N.Sigma_hat, p.data.Sigma_hat + tau2 * torch.eye(30, dtype=torch.float64))
    # the noisy-input gradient is the gradient of the loss on x + xi with the clean labels
    dec = decomposition.decompose_problem(noisy)
    g = grad(lambda V: _mse_loss(p.data.X + xi, V, p.a, p.y, "relu", p.gamma))(p.W)
    torch.testing.assert_close(dec.G, g.T, rtol=1e-12, atol=1e-14)
    assert dec.identity_residual() < 1e-13
    # and its residue direction is X'_B^T r'
    torch.testing.assert_close(dec.r, nets.two_layer_forward(N.X, p.W, p.a, activation="relu", gamma=p.gamma) - p.y)


def test_input_noise_variance():
    D = data.spiked_gaussian(4000, 5, alpha=0.0, nu=0.0, seed=0)
    N = regularization.add_input_noise(D, 4.0, seed=1)
    var = (N.X_B - D.X_B).var().item()
    assert var == pytest.approx(4.0, rel=0.03)
    assert torch.equal(regularization.add_input_noise(D, 0.0, seed=1).X, D.X)


@pytest.mark.parametrize("activation", ["sigmoid", "tanh", "softplus", "silu"])
@pytest.mark.parametrize("scale_a", [False, True])
def test_jacobian_penalty_gradient_matches_autograd(small, activation, scale_a):
    D, _, W, a = small
    if scale_a:  # the closed form keeps the a_j^2 factor for general outer weights
        a = a * torch.linspace(0.5, 1.5, a.shape[0], dtype=torch.float64)
    lam, gamma, n = 2.5, 25**-0.5, D.X.shape[0]

    def L_reg(V):  # lambda/(2n) sum_i ||d f(x_i)/dW||_F^2 with per-sample Jacobians from autograd
        J = jacrev(lambda U: nets.two_layer_forward(D.X, U, a, activation=activation, gamma=gamma))(V)
        return lam / (2 * n) * (J**2).sum()

    jp = regularization.jacobian_penalty_gradient(D.X_B, D.z, D.q, D.zeta, W, a, activation=activation,
                                             gamma=gamma, lam=lam)
    g = grad(L_reg)(W)
    torch.testing.assert_close(jp.G_reg, g.T, rtol=1e-11, atol=1e-14)
    # the closed-form penalty value and its autograd gradient agree too
    torch.testing.assert_close(
        regularization.jacobian_penalty(D.X, W, a, activation=activation, gamma=gamma, lam=lam), L_reg(W))
    assert jp.identity_residual() < 1e-13
    assert torch.linalg.matrix_rank(jp.S3).item() == 1
    # S3's left singular vector is q
    u = torch.linalg.svd(jp.S3).U[:, 0]
    assert abs(float(u @ D.q)) == pytest.approx(1.0, abs=1e-12)


def test_jacobian_penalty_vanishes_for_relu_and_lambda_zero(small):
    D, _, W, a = small
    jp = regularization.jacobian_penalty_gradient(D.X_B, D.z, D.q, D.zeta, W, a, activation="relu", gamma=0.2, lam=3.0)
    assert float(jp.G_reg.abs().max()) == 0.0
    jp0 = regularization.jacobian_penalty_gradient(D.X_B, D.z, D.q, D.zeta, W, a, activation="tanh", gamma=0.2, lam=0.0)
    assert float(jp0.G_reg.abs().max()) == 0.0
    with pytest.raises(ValueError, match="W must have shape"):
        regularization.jacobian_penalty_gradient(D.X_B, D.z, D.q, D.zeta, W[:, :-1], a, activation="tanh",
                                            gamma=0.2, lam=1.0)


def test_jacobian_penalty_problem_wrapper():
    p = decomposition.spiked_problem(20, 15, 18, alpha=0.0, nu=0.375, activation="sigmoid", seed=1)
    jp = regularization.jacobian_penalty_problem(p, 10.0)
    D = p.data
    ref = regularization.jacobian_penalty_gradient(D.X_B, D.z, D.q, D.zeta, p.W, p.a, activation="sigmoid",
                                              gamma=p.gamma, lam=10.0)
    torch.testing.assert_close(jp.G_reg, ref.G_reg)


def test_residue_alignment_beta_closed_form():
    n, d = 100, 400
    z = torch.ones(n, dtype=torch.float64)
    r = torch.zeros(n, dtype=torch.float64)
    r[0] = 2.0  # |z^T r| / (sqrt(n) ||r||) = 1/10 = d^(-beta/2) with d^(beta/2) = 10
    assert rule_of_thumb.residue_alignment_beta(z, r, d) == pytest.approx(2 * math.log(10) / math.log(400))
    assert rule_of_thumb.residue_alignment_beta(z, z, d) == pytest.approx(0.0, abs=1e-12)  # fully aligned
    r2 = torch.zeros(n, dtype=torch.float64)
    r2[0], r2[1] = 1.0, -1.0
    assert rule_of_thumb.residue_alignment_beta(z, r2, d) == math.inf
    with pytest.raises(ValueError, match="zero vector"):
        rule_of_thumb.residue_alignment_beta(z, torch.zeros(n, dtype=torch.float64), d)


def test_residue_alignment_beta_for_independent_residue():
    # r independent of z: |z^T r| / ||r|| ~ |N(0,1)|, so the median of beta_hat over draws is
    # -2 log(0.6745 / sqrt n) / log d (sd of the median over 2000 draws: ~0.006)
    g = torch.Generator().manual_seed(0)
    n, d = 200, 400
    vals = [rule_of_thumb.residue_alignment_beta(torch.randn(n, generator=g, dtype=torch.float64),
                                             torch.randn(n, generator=g, dtype=torch.float64), d)
            for _ in range(200)]
    median_abs_normal = 0.6745
    expected = -2 * math.log(median_abs_normal / math.sqrt(n)) / math.log(d)
    assert np.median(vals) == pytest.approx(expected, abs=0.03)


@pytest.mark.parametrize("nu, alpha", [(0.3, 0.0), (0.4, 0.5), (0.6, 0.8), (0.0, 0.8)])
def test_estimate_nu_alpha_recovers_synthetic_parameters(nu, alpha):
    D = data.spiked_gaussian(20000, 100, alpha=alpha, nu=nu, seed=5)
    fit = real_data.estimate_nu_alpha(D.X)
    # Marchenko-Pastur spreading biases alpha up by about sqrt(d/n) ~ 0.05 at alpha = 0
    assert fit.alpha == pytest.approx(alpha, abs=0.06)
    # top eigenvalue ~ zeta^2 + q^T Sigma_hat q: nu within ~log(2) / (2 log n) ~ 0.035
    assert fit.nu == pytest.approx(nu, abs=0.04)
    if nu > 0:
        assert abs(float(fit.q @ D.q)) > 0.99
    if nu >= 0.4:  # in the model's units the top eigenvalue itself is about zeta^2
        assert fit.nu_absolute == pytest.approx(nu, abs=0.04)
    assert fit.nu_absolute == pytest.approx(math.log(float(fit.eigenvalues[0])) / (2 * math.log(20000)))
    assert fit.fit_range == (1, 50) and fit.n == 20000


def test_estimate_nu_alpha_options_and_errors():
    D = data.spiked_gaussian(3000, 80, alpha=0.0, nu=0.0, seed=1)
    fit = real_data.estimate_nu_alpha(D.X, fit_range=(1, 30))
    assert fit.nu == 0.0 and fit.fit_range == (1, 30)
    assert abs(fit.alpha) < 0.15
    # the fit is log ell_{j+1} = log b - alpha log j: check it on the returned eigenvalues
    j = np.arange(1, 31)
    slope, icpt = np.polyfit(np.log(j), np.log(fit.eigenvalues[1:31].numpy()), 1)
    assert fit.alpha == pytest.approx(-slope) and fit.bulk_scale == pytest.approx(np.exp(icpt))
    assert fit.zeta2 == pytest.approx(max(float(fit.eigenvalues[0]) / fit.bulk_scale - 1, 0.0))
    with pytest.raises(ValueError, match="fit_range"):
        real_data.estimate_nu_alpha(D.X, fit_range=(2, 3))
    with pytest.raises(ValueError, match="fit_range"):
        real_data.estimate_nu_alpha(D.X, fit_range=(1, 80))
    centred = real_data.estimate_nu_alpha(D.X + 5.0, center=True)
    assert centred.nu == pytest.approx(0.0, abs=0.05)
    assert real_data.estimate_nu_alpha(D.X + 5.0).nu > 0.3  # the mean is a spike when not centred


def test_spike_split_is_exact():
    D = data.spiked_gaussian(200, 30, alpha=0.3, nu=0.6, seed=2)
    S = real_data.spike_split(D.X)
    torch.testing.assert_close(S.X, S.X_B + S.zeta * torch.outer(S.z, S.q))
    assert float(S.z @ S.z) == pytest.approx(200.0)
    assert float((S.X_B @ S.q).abs().max()) < 1e-10
    assert abs(float(S.q @ D.q)) > 0.99
    # the gradient decomposition holds for the split
    W, a = nets.sphere_rows(25, 30, seed=3), nets.outer_weights(25, seed=4)
    y = torch.sign(D.X[:, 0])
    dec = decomposition.decompose(S.X_B, S.z, S.q, S.zeta, W, a, y, activation="tanh", gamma=0.2)
    assert dec.identity_residual() < 1e-13
    with pytest.raises(ValueError, match="q must have shape"):
        real_data.spike_split(D.X, q=torch.ones(3))


def test_real_problem_on_digits():
    from lowrank.core import datasets

    ds = datasets.digits(standardize=False)
    X = ds.x_train[:300].double()
    y = torch.where(ds.y_train[:300] >= 5, 1.0, -1.0).double()
    p = real_data.real_problem(X, y, width=80, activation="softplus", seed=2)
    assert p.W.shape == (80, 64) and p.gamma == pytest.approx(80**-0.5)
    torch.testing.assert_close(p.data.X, X)
    dec = decomposition.decompose_problem(p)
    assert dec.identity_residual() < 1e-13
    with pytest.raises(ValueError, match="y of length n"):
        real_data.real_problem(X, y[:-1], width=10, activation="tanh")
    with pytest.raises(ValueError, match="labels y in"):
        real_data.real_problem(X, y * 2, width=10, activation="tanh", loss="logistic")


def test_real_data_matrix_on_digits():
    from lowrank.core import datasets

    X, y = real_data.real_data_matrix("digits", max_samples=100)
    ds = datasets.digits(standardize=False)
    assert X.shape == (100, 64) and X.dtype == torch.float64
    torch.testing.assert_close(X, torch.as_tensor(ds.x_train[:100]).reshape(100, -1).double())
    want = torch.where(torch.as_tensor(ds.y_train[:100]) >= 5, 1.0, -1.0).double()
    torch.testing.assert_close(y, want)
    Xs, _ = real_data.real_data_matrix("digits", max_samples=100, standardize=True)
    assert float(Xs.mean(0).abs().max()) < 1e-12
    with pytest.raises(ValueError, match="dataset"):
        real_data.real_data_matrix("cifar10")
    with pytest.raises(FileNotFoundError):
        real_data.real_data_matrix("mnist", data_root="/nonexistent/folder")


def test_spike_shares_on_hand_counted_configurations():
    import pandas as pd

    rows = pd.DataFrame({  # threshold 0.5; each row one configuration
        "residue_outlying_0": [0.9, 0.9, 0.2, 0.9], "q_outlying_0": [0.8, 0.1, 0.1, 0.9],
        "residue_outlying": [0.7, 0.3, 0.1, 0.6], "q_outlying": [0.6, 0.9, 0.2, 0.4]})
    # row 2 has no spike at lambda = 0: left out and counted; of rows 0, 1, 3 only row 0 keeps both
    # (row 1 loses the residue, row 3 loses q)
    assert regularization.rows_without_spike(rows, threshold=0.5) == 1
    assert regularization.spikes_kept_share(rows, threshold=0.5) == pytest.approx(1 / 3)
    assert math.isnan(regularization.spikes_kept_share(rows.iloc[[2]], threshold=0.5))
    # gone: only row 2 has both below 0.5
    assert regularization.spikes_gone_share(rows, threshold=0.5) == 0.25
    with pytest.raises(ValueError, match="no column"):
        regularization.spikes_kept_share(rows.drop(columns="q_outlying_0"), threshold=0.5)


def test_spike_probes_judge_each_present_spike_by_its_own_share():
    import pandas as pd

    problems = pd.DataFrame({"nu": [0.0, 0.5], "seed": [0, 0], "residue_outlying_0": [0.9, 0.8],
                             "q_outlying_0": [0.1, 0.7]})
    rows = pd.DataFrame({  # a grid row (ignored) and fraction rows; S2 at nu = 0 is absent at lambda = 0
        "nu": [0.0, 0.0, 0.0, 0.5, 0.5, 0.5], "seed": [0] * 6, "lam": [1.0, 0.1, 0.2, 0.1, 0.2, 0.3],
        "probe": ["grid", "fraction", "fraction", "fraction", "fraction", "fraction"],
        "spike": [None, "S1", "S2", "S1", "S2", "S1"], "fraction": [None, 0.1, 0.1, 0.1, 0.1, 1.0],
        "residue_outlying": [0.0, 0.8, 0.9, 0.3, 0.9, 0.6], "q_outlying": [0.0, 0.9, 0.9, 0.9, 0.2, 0.1]})
    got = regularization.spike_probes(rows, problems, threshold=0.5)
    # nu = 0: S1 kept (0.8); S2 absent at 0, no row. nu = 0.5, f = 0.1: S1 lost (0.3); S2 lost by its own q share
    # (0.2; the residue share 0.9 of that row does not count); f = 1: S1 kept (0.6)
    assert got[["nu", "spike", "fraction", "kept"]].values.tolist() == [
        [0.0, "S1", 0.1, True], [0.5, "S1", 0.1, False], [0.5, "S2", 0.1, False], [0.5, "S1", 1.0, True]]
    share, lost = regularization.spikes_kept_at_fraction(got, 0.1)
    assert share == pytest.approx(1 / 3) and lost["spike"].tolist() == ["S1", "S2"]
    assert regularization.spikes_kept_at_fraction(got, 1.0)[0] == 1.0
    assert math.isnan(regularization.spikes_kept_at_fraction(got, 0.3)[0])


def test_outlying_share_counts_only_directions_out_of_the_bulk():
    # one outlier: a direction in U_2 through the bulk vector u2 (in_top2 0.6) but not along u1 is absent
    got = regularization.outlying_share([0, 1, 1, 2, 3], [0.9, 0.2, 0.95, 0.1, 0.1], [0.9, 0.6, 0.96, 0.8, 0.7])
    assert got.tolist() == [0.0, 0.2, 0.95, 0.8, 0.7]
    # on a planted gradient: one strong spike along e0, a bulk; e1 reaches U_2 only through the bulk's top vector
    rng = np.random.default_rng(0)
    d, m = 60, 50
    G = 10 * np.outer(np.eye(d)[0], np.eye(m)[0]) + 0.05 * rng.standard_normal((d, m))
    G += 0.6 * np.outer(np.eye(d)[1], np.eye(m)[1])  # tops the bulk a little: u2 is near e1, but not an outlier
    call = rule_of_thumb.dominant_spike(torch.as_tensor(G), torch.as_tensor(np.eye(d)[0]), torch.as_tensor(np.eye(d)[1]))
    assert call.outliers == 1 and call.q_in_top2 > 0.5
    assert regularization.outlying_share(call.outliers, call.align_q, call.q_in_top2) < 0.5
    assert regularization.outlying_share(call.outliers, call.align_residue, call.residue_in_top2) > 0.99


def test_jacobian_balance_lambda_equalises_the_spike_and_the_gradient():
    p = decomposition.spiked_problem(40, 30, 35, alpha=0.0, nu=0.375, activation="sigmoid", seed=4)
    dec = decomposition.decompose_problem(p)
    lam_x = regularization.jacobian_balance_lambda(dec.G, regularization.jacobian_penalty_problem(p, 1.0))
    # independently: S3 formed at lambda_x by the penalty itself, its norm by a full SVD
    S3 = regularization.jacobian_penalty_problem(p, lam_x).S3
    assert float(torch.linalg.svdvals(S3)[0]) == pytest.approx(float(torch.linalg.svdvals(dec.G)[0]), rel=1e-10)
    relu = decomposition.spiked_problem(40, 30, 35, alpha=0.0, nu=0.375, activation="relu", seed=4)
    with pytest.raises(ValueError, match="no balance point"):
        regularization.jacobian_balance_lambda(dec.G, regularization.jacobian_penalty_problem(relu, 1.0))


def test_misalignment_closed():
    assert regularization.misalignment_closed(0.8, 0.9) == pytest.approx(0.5)  # 0.1 of the remaining 0.2
    assert regularization.misalignment_closed(0.0, 1.0) == pytest.approx(1.0)
    assert regularization.misalignment_closed(0.5, 0.25) == pytest.approx(-0.5)
    np.testing.assert_allclose(regularization.misalignment_closed(np.array([0.2, 0.6]), np.array([0.6, 0.6])), [0.5, 0.0])
    with pytest.raises(ValueError, match="below 1"):
        regularization.misalignment_closed(1.0, 1.0)
    with pytest.raises(ValueError, match="before must hold"):
        regularization.misalignment_closed(-0.1, 0.5)


def test_jacobian_balance_alignments_by_hand():
    p = decomposition.spiked_problem(40, 30, 35, alpha=0.0, nu=0.375, activation="sigmoid", seed=5)
    dec = decomposition.decompose_problem(p)
    unit = regularization.jacobian_penalty_problem(p, 1.0)
    x = p.data.X_B.T @ dec.r
    out = regularization.jacobian_balance_alignments(dec.G, unit, x, p.data.q)
    lam_x = out["lam_x"]
    # independently: the penalty recomputed at lambda_x, u1 from a full SVD
    at = regularization.jacobian_penalty_problem(p, lam_x)

    def align_q(M):
        u1 = torch.linalg.svd(M, full_matrices=False)[0][:, 0]
        return abs(float(u1 @ p.data.q)) / float(p.data.q.norm())

    assert out["align_q_0"] == pytest.approx(align_q(dec.G), abs=1e-9)
    assert out["align_q_with_S3"] == pytest.approx(align_q(dec.G + at.G_reg), abs=1e-9)
    assert out["align_q_without_S3"] == pytest.approx(align_q(dec.G + at.E2), abs=1e-9)


# ---- the regularisation page's tables ------------------------------------------------------------

def _crossing_tables():
    import pandas as pd

    problems = pd.DataFrame([{"nu": 0.0, "seed": 0, "W_norm": 2.0, "norm_S1": 4.0, "norm_S2": 1.0,
                              "residue_0": 0.9, "q_0": 0.2},      # S1 present, S2 absent at lambda = 0
                             {"nu": 0.5, "seed": 0, "W_norm": 1.0, "norm_S1": 1.0, "norm_S2": 1.0,
                              "residue_0": 0.9, "q_0": 0.9}])     # both present; S1 below from the start
    grid = [0.1, 1.0, 10.0]
    rows = [{"nu": 0.0, "seed": 0, "lam": lam, "probe": "grid", "residue_in_top2": r, "q_in_top2": 0.1}
            for lam, r in zip(grid, (0.9, 0.7, 0.3))]
    rows += [{"nu": 0.0, "seed": 0, "lam": 1e3, "probe": "high", "residue_in_top2": 0.0, "q_in_top2": 0.0}]
    rows += [{"nu": 0.5, "seed": 0, "lam": lam, "probe": "grid", "residue_in_top2": 0.4, "q_in_top2": q}
             for lam, q in zip(grid, (0.9, 0.8, 0.7))]            # S2 never drops below one half
    return pd.DataFrame(rows), problems


def test_threshold_crossing_interpolates_in_log_lambda():
    rows, problems = _crossing_tables()
    cross = regularization.threshold_crossings(rows, problems, threshold=0.5)
    # 0.5 lies half way from 0.7 (lambda = 1) to 0.3 (lambda = 10): lambda_c = 10^(1/2)
    assert cross[["nu", "spike"]].values.tolist() == [[0.0, "S1"]]
    assert cross["lam_c"].iloc[0] == pytest.approx(math.sqrt(10), rel=1e-12)
    assert cross["ratio"].iloc[0] == pytest.approx(math.sqrt(10) * 2.0 / 4.0, rel=1e-12)
    assert regularization.threshold_crossings(rows, problems, threshold=0.95).empty  # nothing present
    with pytest.raises(ValueError, match="threshold"):
        regularization.threshold_crossings(rows, problems, threshold=1.5)


def test_weight_decay_sweep_rows_are_the_spike_calls_of_g_plus_lambda_w():
    kw = dict(alpha=0.0, activation="tanh", scaling="ntk")
    rows, problems = regularization.weight_decay_sweep(40, 30, 35, nus=[0.0, 0.375], seeds=[3], lambdas=[0.0, 1.0],
                                                       **kw)
    assert len(rows) == 2 * (2 + 2) and len(problems) == 2
    p = decomposition.spiked_problem(40, 30, 35, nu=0.375, seed=3, **kw)
    dec = decomposition.decompose_problem(p)
    scales = regularization.weight_decay_scales(p.W, gamma=p.gamma, n=40, nu=0.375)
    mine = rows[(rows.nu == 0.375)].set_index("probe")
    assert mine.loc["high", "lam"] == pytest.approx(10 * scales.suppresses_spikes_above)
    assert mine.loc["low", "lam"] == pytest.approx(0.1 * scales.keeps_spikes_below)
    one = mine[mine.lam == 1.0].iloc[0]
    call = rule_of_thumb.dominant_spike(dec.G + 1.0 * p.W.T, p.data.X_B.T @ dec.r, p.data.q)
    assert (one.label, one.residue_in_top2, one.q_in_top2) == (call.label, call.residue_in_top2, call.q_in_top2)
    at_zero = problems[problems.nu == 0.375].iloc[0]
    assert at_zero.residue_0 == mine[mine.lam == 0.0].iloc[0].residue_in_top2
    assert one.q_outlying == pytest.approx(float(regularization.outlying_share(call.outliers, call.align_q, call.q_in_top2)))
    assert at_zero.residue_outlying_0 == mine[mine.lam == 0.0].iloc[0].residue_outlying
    # each spike probed at a fraction of its own norm: lambda = f ||S||_2 / ||W||_2, the call of G + lambda W^T
    rows, problems = regularization.weight_decay_sweep(40, 30, 35, nus=[0.375], seeds=[3], lambdas=[1.0],
                                                       fractions=[0.5], **kw)
    frac = rows[rows.probe == "fraction"].set_index("spike")
    norms = dec.spike_norms()
    assert frac.loc["S2", "lam"] == pytest.approx(0.5 * norms["norm_S2"] / scales.W_norm)
    assert frac.loc["S1", "lam"] == pytest.approx(0.5 * norms["norm_S1"] / scales.W_norm)
    call = rule_of_thumb.dominant_spike(dec.G + frac.loc["S1", "lam"] * p.W.T, p.data.X_B.T @ dec.r, p.data.q)
    assert frac.loc["S1", "residue_outlying"] == pytest.approx(
        float(regularization.outlying_share(call.outliers, call.align_residue, call.residue_in_top2)))


def test_autograd_errors_are_round_off_for_every_regulariser():
    table = regularization.autograd_errors(scaling="ntk", activations=("tanh", "relu"))
    assert table[["regulariser", "activation"]].values.tolist() == [
        ["weight decay", "tanh"], ["input noise", "tanh"], ["Jacobian penalty", "tanh"],
        ["weight decay", "relu"], ["input noise", "relu"]]
    assert table["rel_error"].max() < 1e-10
    assert table["split_residual"].dropna().max() < 1e-10


def test_noise_and_penalty_sweeps_reduce_to_the_plain_gradient_at_zero():
    kw = dict(alpha=0.5, activation="tanh", scaling="ntk", seeds=[1])
    noise, spectra = regularization.input_noise_sweep(40, 30, 35, nu=0.25, tau2s=[0.0, 0.3], **kw)
    p = decomposition.spiked_problem(40, 30, 35, nu=0.25, alpha=0.5, activation="tanh", scaling="ntk", seed=1)
    dec = decomposition.decompose_problem(p)
    call = rule_of_thumb.dominant_spike_of_problem(dec, p.data)
    clean = noise[noise.tau2 == 0.0].iloc[0]
    assert clean.align_u1_residue == pytest.approx(call.align_residue, abs=1e-12)
    assert set(spectra) == {0.0, 0.3} and len(noise) == 2
    jac, jac_spectra, balance = regularization.jacobian_penalty_sweep(40, 30, 35, nu=0.25, lambdas=[0.0, 2.0], **kw)
    at_zero = jac[jac.lam == 0.0].iloc[0]
    assert at_zero.norm_S3 == 0.0 and at_zero.norm_E2 == 0.0
    assert at_zero.align_u1_q == pytest.approx(call.align_q, abs=1e-12)
    assert balance["closed_with_S3"].iloc[0] == pytest.approx(regularization.misalignment_closed(
        balance["align_q_0"].iloc[0], balance["align_q_with_S3"].iloc[0]))


def test_the_sweeps_are_the_same_for_one_and_two_workers_and_rows_are_their_own_problems():
    """Each sweep's tables, spectra included, are those of one process (tasks seeded by their own seed);
    one row of each against its problem computed here (dense terms, full SVDs)."""
    import pandas as pd

    kw = dict(alpha=0.5, activation="tanh", scaling="ntk")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runs = [[
            regularization.weight_decay_sweep(24, 18, 20, nus=[0.0, 0.375], seeds=[3, 4], lambdas=[0.0, 1.0], workers=w,
                                              **kw),
            regularization.input_noise_sweep(24, 18, 20, nu=0.25, seeds=[1, 2], tau2s=[0.3, 0.0], workers=w, **kw),
            regularization.jacobian_penalty_sweep(24, 18, 20, nu=0.25, seeds=[1, 2], lambdas=[0.0, 2.0], workers=w,
                                                  **kw),
            regularization.jacobian_residue_shares(24, 18, 20, nu=0.75, seeds=[1, 2], lambdas=[0.0, 2.0], workers=w,
                                                   **kw)] for w in (1, 2)]
    finally:
        torch.set_num_threads(threads)
    wd, noise, jac, shares = zip(*runs)  # each: (one worker, two workers)
    for one, two in zip([*wd[0], noise[0][0], jac[0][0], jac[0][2], shares[0]],
                        [*wd[1], noise[1][0], jac[1][0], jac[1][2], shares[1]]):
        pd.testing.assert_frame_equal(one, two, check_exact=True)
    assert list(zip(wd[0][1]["nu"], wd[0][1]["seed"])) == [(0.0, 3), (0.0, 4), (0.375, 3), (0.375, 4)]
    assert list(zip(noise[0][0]["seed"], noise[0][0]["tau2"])) == [(1, 0.0), (1, 0.3), (2, 0.0), (2, 0.3)]
    for spectra in (noise, jac):
        assert spectra[0][1].keys() == spectra[1][1].keys()
        for key in spectra[0][1]:
            s_one, s_two = (spectra[i][1][key] for i in (0, 1))
            np.testing.assert_array_equal(s_one[0] if isinstance(s_one, tuple) else s_one,
                                          s_two[0] if isinstance(s_two, tuple) else s_two)
    # the second seed's noisy problem, by hand: noise drawn with seed 2 + 100, G' by dense terms, a full SVD
    p = decomposition.spiked_problem(24, 18, 20, nu=0.25, seed=2, **kw)
    dec = decomposition.decompose_problem(regularization.noisy_problem(p, 0.3, seed=102))
    row = noise[1][0].query("seed == 2 and tau2 == 0.3").iloc[0]
    assert row["norm_E"] == pytest.approx(np.linalg.norm(dec.E.numpy(), 2), rel=1e-10)
    assert row["norm_S1"] == pytest.approx(np.linalg.norm(dec.S1.numpy(), 2), rel=1e-10)
    # the first seed keeps the spectrum of G(0) + G_reg at every lambda
    p = decomposition.spiked_problem(24, 18, 20, nu=0.25, seed=1, **kw)
    total = decomposition.decompose_problem(p).G + regularization.jacobian_penalty_problem(p, 2.0).G_reg
    np.testing.assert_allclose(jac[1][1][2.0], np.linalg.svd(total.numpy(), compute_uv=False), rtol=1e-10)
    with pytest.raises(ValueError, match="workers"):
        regularization.weight_decay_sweep(24, 18, 20, nus=[0.0], seeds=[1], lambdas=[0.0], workers=0, **kw)
    for sweep in (regularization.input_noise_sweep, regularization.jacobian_residue_shares):
        with pytest.raises(ValueError, match="workers"):
            sweep(24, 18, 20, nu=0.0, seeds=[1], **{"tau2s" if sweep is regularization.input_noise_sweep
                                                    else "lambdas": [0.0]}, workers=1.5, **kw)
    with pytest.raises(ValueError, match="workers"):
        regularization.jacobian_penalty_sweep(24, 18, 20, nu=0.0, seeds=[1], lambdas=[0.0], workers=True, **kw)


def test_bulk_gap_is_the_ratio_at_the_outlier_edge():
    s = [10.0, 4.0, 1.0, 0.9, 0.8, 0.7]
    assert regularization.bulk_gap(s, 2) == pytest.approx(4.0)  # s_2 / s_3
    assert regularization.bulk_gap(s, 1) == pytest.approx(2.5)  # s_1 / s_2
    assert math.isnan(regularization.bulk_gap(s, 0))
    assert regularization.bulk_gap([1.0, 0.0], 1) == math.inf
    with pytest.raises(ValueError):
        regularization.bulk_gap([1.0, 0.5], 2)
    with pytest.raises(ValueError):
        regularization.bulk_gap(s, -1)


def test_weight_decay_sweep_records_the_gap_to_the_bulk():
    kw = dict(alpha=0.0, activation="tanh", scaling="ntk")
    rows, problems = regularization.weight_decay_sweep(40, 30, 35, nus=[0.375], seeds=[3], lambdas=[0.0, 1.0],
                                                       fractions=[0.1], **kw)
    p = decomposition.spiked_problem(40, 30, 35, nu=0.375, seed=3, **kw)
    dec = decomposition.decompose_problem(p)
    for lam, row in ((0.0, problems.iloc[0]), (1.0, rows[rows.lam == 1.0].iloc[0])):
        s = torch.linalg.svdvals(dec.G + lam * p.W.T).numpy()  # full SVD: independent of the sweep's top_singular
        k = int(row["outliers_0" if lam == 0 else "outliers"])
        gap = row["gap_0" if lam == 0 else "gap"]
        if k == 0:
            assert math.isnan(gap)
        else:
            assert gap == pytest.approx(s[k - 1] / s[k], rel=1e-8) and gap >= 1.5
    probes = regularization.spike_probes(rows, problems, threshold=0.5)
    assert {"gap_0", "gap", "outliers_0", "outliers"} <= set(probes.columns)
    if len(probes):
        assert (probes["gap_0"] == problems.iloc[0]["gap_0"]).all()
