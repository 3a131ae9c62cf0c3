"""lowrank.gradients.dynamics against independent computations: closed forms, autograd, scipy,
planted structures, and bad inputs."""

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from lowrank.gradients import dynamics as gd
from lowrank.gradients import decomposition, rule_of_thumb
from lowrank.core.data import spiked_gaussian
from lowrank.core.nets import ACTIVATIONS, activation, gamma_m, normalize_rows, sphere_rows, two_layer_forward


def small_problem(seed=0, n=40, d=30, m=50, nu=0.25, activation="tanh"):
    return decomposition.spiked_problem(n, d, m, alpha=0.0, nu=nu, activation=activation, seed=seed)


# --------------------------------------------------------------------------- slopes, beta


def test_loglog_slope_recovers_planted_power_law():
    x = np.array([10.0, 20, 40, 80, 160])
    fit = gd.loglog_slope(x, 3.0 * x**-0.37)
    assert fit.slope == pytest.approx(-0.37, abs=1e-12)
    assert math.exp(fit.intercept) == pytest.approx(3.0, rel=1e-12)
    assert fit.stderr == pytest.approx(0.0, abs=1e-10)
    assert fit.points == 5


def test_loglog_slope_repeats_and_noise_match_numpy_polyfit():
    rng = np.random.default_rng(0)
    x = np.repeat([5.0, 10, 20, 40], 3)
    y = 2 * x**0.5 * np.exp(0.1 * rng.standard_normal(x.size))
    fit = gd.loglog_slope(x, y)
    slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
    assert fit.slope == pytest.approx(slope, rel=1e-10)
    assert fit.intercept == pytest.approx(intercept, rel=1e-10)
    assert fit.stderr > 0


@pytest.mark.parametrize("x, y, match", [
    ([1, 2, 3], [1, 2], "same number"),
    ([0, 1, 2], [1, 2, 3], "x must be positive"),
    ([1, 2, 3], [1, -2, 3], "y must be positive"),
    ([2, 2, 2], [1, 2, 3], "two distinct"),
])
def test_loglog_slope_rejects_bad_input(x, y, match):
    with pytest.raises(ValueError, match=match):
        gd.loglog_slope(x, y)


def test_residue_alignment_and_its_beta_closed_form():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(100, generator=g, dtype=torch.float64)
    r = torch.randn(100, generator=g, dtype=torch.float64)
    c = abs(float(z @ r)) / (10 * float(r.norm()))
    assert rule_of_thumb.residue_alignment(z, r) == pytest.approx(c)
    assert rule_of_thumb.residue_alignment_beta(z, r, 400) == pytest.approx(-2 * math.log(c) / math.log(400))
    # r = z: the alignment is ||z|| / sqrt(n), close to 1
    assert rule_of_thumb.residue_alignment(z, z) == pytest.approx(float(z.norm()) / 10)
    assert gd.residue_alignment is rule_of_thumb.residue_alignment  # one implementation
    assert not hasattr(gd, "beta_hat")


def test_residue_alignment_bad_inputs():
    with pytest.raises(ValueError, match="one length"):
        rule_of_thumb.residue_alignment(torch.ones(3), torch.ones(4))
    with pytest.raises(ValueError, match="zero vector"):
        rule_of_thumb.residue_alignment(torch.ones(3), torch.zeros(3))
    with pytest.raises(ValueError, match="d must be"):
        rule_of_thumb.residue_alignment_beta(torch.ones(3), torch.ones(3), 1)
    # z^T r = 0: smaller than any power of d, beta = inf (documented)
    assert rule_of_thumb.residue_alignment_beta(torch.tensor([1.0, -1.0]), torch.tensor([1.0, 1.0]), 10) == math.inf


# --------------------------------------------------------------------------- norms


def test_term_norms_match_full_svd():
    p = small_problem()
    dec = decomposition.decompose_problem(p)
    row = gd.term_norms(dec, data=p.data)
    for key, M in [("norm_S1", dec.S1), ("norm_S12", dec.S12), ("norm_S2", dec.S2), ("norm_E", dec.E),
                   ("norm_G", dec.G)]:
        assert row[key] == pytest.approx(float(torch.linalg.svdvals(M)[0]), rel=1e-10), key
    assert row["r_rms"] == pytest.approx(float(dec.r.norm()) / math.sqrt(len(dec.r)))
    assert row["residue_alignment"] == pytest.approx(rule_of_thumb.residue_alignment(p.data.z, dec.r))
    with pytest.raises(TypeError, match="Decomposition"):
        gd.term_norms((1, 2))


# --------------------------------------------------------------------------- sigma'_perp


def test_sigma_perp_is_centred_and_its_norm_is_the_spectral_norm():
    p = small_problem(activation="softplus")
    P = gd.sigma_perp(p.data.X, p.W, "softplus")
    assert torch.allclose(P.mean(0), torch.zeros(P.shape[1], dtype=torch.float64), atol=1e-14)
    assert gd.sigma_perp_norm(p.data.X, p.W, "softplus") == pytest.approx(float(torch.linalg.svdvals(P)[0]))
    mu = torch.full((p.W.shape[0],), 0.5, dtype=torch.float64)
    P2 = gd.sigma_perp(p.data.X, p.W, "softplus", mu)
    assert torch.allclose(P2, torch.sigmoid(p.data.X @ p.W.T) - 0.5)


def test_relu_sigma_perp_is_the_sign_outer_product_for_a_large_spike():
    """Prop. 3.1, planted: with 2 nu > 1 - alpha by a wide margin every pre-activation takes the sign
    of z_i w_j^T q, so sigma'_perp = (1/2) sign(z) sign(Wq)^T up to the few small products."""
    n, d, m = 200, 100, 80
    data = spiked_gaussian(n, d, 0.0, 1.5, 0)
    W = sphere_rows(m, d, 1)
    P = gd.sigma_perp(data.X, W, "relu", mu=torch.full((m,), 0.5, dtype=torch.float64))
    planted = 0.5 * torch.outer(torch.sign(data.z), torch.sign(W @ data.q))
    assert float((P == planted).double().mean()) > 0.98
    assert gd.sigma_perp_norm(data.X, W, "relu", torch.full((m,), 0.5, dtype=torch.float64)) / n > 0.3


def test_sigma_perp_bad_inputs():
    with pytest.raises(ValueError, match="columns"):
        gd.sigma_perp(torch.ones(4, 3), torch.ones(2, 5), "relu")
    with pytest.raises(ValueError, match="mu must have shape"):
        gd.sigma_perp(torch.ones(4, 3), torch.ones(2, 3), "relu", mu=torch.ones(3))
    with pytest.raises(ValueError, match="activation"):
        gd.sigma_perp(torch.ones(4, 3), torch.ones(2, 3), "swish")


# --------------------------------------------------------------------------- gradient and training


@pytest.mark.parametrize("activation", ["relu", "sigmoid", "tanh"])
def test_gradient_matrix_matches_autograd(activation):
    p = small_problem(activation=activation)
    G, r = gd.gradient_matrix(p.data.X, p.W, p.a, p.y, activation=activation, gamma=p.gamma)
    W = p.W.clone().requires_grad_(True)
    f = two_layer_forward(p.data.X, W, p.a, activation=activation, gamma=p.gamma)
    (grad,) = torch.autograd.grad((0.5 * (f - p.y) ** 2).mean(), W)
    assert torch.allclose(G, grad.T, rtol=1e-10, atol=1e-14)
    assert torch.allclose(r, f.detach() - p.y)


def test_gradient_matrix_bad_inputs():
    p = small_problem()
    with pytest.raises(ValueError, match="W must have shape"):
        gd.gradient_matrix(p.data.X, p.W[:, :-1], p.a, p.y, activation="tanh", gamma=p.gamma)
    with pytest.raises(ValueError, match="y must have shape"):
        gd.gradient_matrix(p.data.X, p.W, p.a, p.y[:-1], activation="tanh", gamma=p.gamma)
    with pytest.raises(ValueError, match="gamma"):
        gd.gradient_matrix(p.data.X, p.W, p.a, p.y, activation="tanh", gamma=0.0)
    with pytest.raises(ValueError, match="loss"):
        gd.gradient_matrix(p.data.X, p.W, p.a, p.y, activation="tanh", gamma=p.gamma, loss="hinge")


def _autograd_wn_step(X, y, V, a, activation, gamma, lr):
    V = V.clone().requires_grad_(True)
    W = V / V.norm(dim=1, keepdim=True)
    f = two_layer_forward(X, W, a, activation=activation, gamma=gamma)
    (g,) = torch.autograd.grad((0.5 * (f - y) ** 2).mean(), V)
    return (V - lr * g).detach()


def test_weight_normalised_steps_match_autograd_on_v():
    p = small_problem(activation="sigmoid")
    lr = 0.7 / p.gamma
    run = gd.train_weight_normalized(p.data.X, p.y, p.W, p.a, activation="sigmoid", gamma=p.gamma, steps=3, lr=lr)
    V = p.W.clone()
    for _ in range(3):
        V = _autograd_wn_step(p.data.X, p.y, V, p.a, "sigmoid", p.gamma, lr)
    assert torch.allclose(run.W[3], normalize_rows(V), atol=1e-12)
    for t, W in run.W.items():
        assert torch.allclose(W.norm(dim=1), torch.ones(W.shape[0], dtype=torch.float64)), t


def test_training_trace_records_alignments_and_a_falling_loss():
    p = small_problem(activation="tanh")
    D = p.data
    run = gd.train_weight_normalized(D.X, p.y, p.W, p.a, activation="tanh", gamma=p.gamma, steps=15,
                                     lr=0.5 / p.gamma, X_B=D.X_B, references={"q": D.q}, top_k=2,
                                     snapshot_steps=[0, 15])
    tr = run.trace
    assert list(tr["step"]) == list(range(16))
    assert set(run.W) == {0, 15}
    assert torch.allclose(run.W[0], p.W, atol=1e-15)
    assert run.U.shape == (16, D.X.shape[1], 2)
    assert tr["align_initial"].iloc[0] == pytest.approx(1.0)
    assert tr["loss"].iloc[-1] < tr["loss"].iloc[0]
    # step 0 agrees with the decomposition's gradient
    dec = decomposition.decompose_problem(p)
    U = torch.linalg.svd(dec.G, full_matrices=False)[0]
    assert tr["s1"].iloc[0] == pytest.approx(float(torch.linalg.svdvals(dec.G)[0]))
    assert tr["align_q"].iloc[0] == pytest.approx(abs(float(U[:, 0] @ D.q)), abs=1e-10)
    res = D.X_B.T @ dec.r
    assert tr["align_residue"].iloc[0] == pytest.approx(abs(float(U[:, 0] @ res)) / float(res.norm()), abs=1e-10)


def test_tracked_singular_pairs_equal_each_step_s_svd():
    """The leading pairs are tracked from step to step (top_singular_from): every step's s1, s2 and
    u1 alignment equal those of an SVD of that step's gradient, rebuilt from the stored W_t."""
    p = small_problem(activation="tanh")
    D = p.data
    run = gd.train_weight_normalized(D.X, p.y, p.W, p.a, activation="tanh", gamma=p.gamma, steps=12,
                                     lr=1.0 / p.gamma, X_B=D.X_B, references={"q": D.q}, top_k=2)
    for t, W in run.W.items():
        G, _ = gd.gradient_matrix(D.X, W, p.a, p.y, activation="tanh", gamma=p.gamma)
        U, s, _ = torch.linalg.svd(G, full_matrices=False)
        row = run.trace.iloc[t]
        assert row["s1"] == pytest.approx(float(s[0]), rel=1e-10), t
        assert row["s2"] == pytest.approx(float(s[1]), rel=0, abs=2e-9 * float(s[0])), t  # value_tol * s1
        assert row["align_q"] == pytest.approx(abs(float(U[:, 0] @ D.q)), abs=1e-9), t


def test_projected_normalisation_keeps_unit_rows():
    p = small_problem()
    run = gd.train_weight_normalized(p.data.X, p.y, p.W, p.a, activation="tanh", gamma=p.gamma, steps=2,
                                     normalization="projected")
    G, _ = gd.gradient_matrix(p.data.X, p.W, p.a, p.y, activation="tanh", gamma=p.gamma)
    assert torch.allclose(run.W[1], normalize_rows(p.W - G.T / p.gamma))


@pytest.mark.parametrize("kwargs, match", [
    ({"steps": -1}, "steps"),
    ({"lr": -1.0}, "lr"),
    ({"normalization": "batch"}, "normalization"),
    ({"top_k": 0}, "top_k"),
    ({"references": {"q": torch.ones(3)}}, "references"),
    ({"snapshot_steps": [99]}, "snapshot_steps"),
    ({"X_B": torch.ones(2, 2)}, "X_B"),
])
def test_training_rejects_bad_inputs(kwargs, match):
    p = small_problem()
    args = dict(activation="tanh", gamma=p.gamma, steps=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        gd.train_weight_normalized(p.data.X, p.y, p.W, p.a, **args)


def test_training_rejects_bad_shapes():
    p = small_problem()
    with pytest.raises(ValueError, match="y must have shape"):
        gd.train_weight_normalized(p.data.X, p.y[:-1], p.W, p.a, activation="tanh", gamma=p.gamma, steps=1)
    with pytest.raises(ValueError, match="a must have shape"):
        gd.train_weight_normalized(p.data.X, p.y, p.W, p.a[:-1], activation="tanh", gamma=p.gamma, steps=1)
    with pytest.raises(ValueError, match="W0 must have"):
        gd.train_weight_normalized(p.data.X, p.y, p.W[:, :-1], p.a, activation="tanh", gamma=p.gamma, steps=1)


# --------------------------------------------------------------------------- angles, comparison


def test_weight_angles_against_scipy_and_a_planted_rotation():
    W1 = sphere_rows(12, 8, 0)
    W2 = sphere_rows(12, 8, 1)
    ang = gd.weight_angles(W1, W2)
    ref = np.degrees(scipy.linalg.subspace_angles(W1.numpy(), W2.numpy()))
    assert ang["mean_principal_angle"] == pytest.approx(ref.mean(), abs=1e-6)
    assert ang["max_principal_angle"] == pytest.approx(ref.max(), abs=1e-6)
    # rotate the first neuron by 30 degrees in the plane of e1, e2 and leave the rest alone
    W = torch.zeros(4, 3, dtype=torch.float64)
    W[:, 0] = 1
    R = W.clone()
    R[0] = torch.tensor([math.cos(math.pi / 6), math.sin(math.pi / 6), 0.0], dtype=torch.float64)
    assert gd.weight_angles(W, R)["mean_neuron_angle"] == pytest.approx(30 / 4, abs=1e-6)
    assert gd.weight_angles(W1, W1)["mean_neuron_angle"] == pytest.approx(0.0, abs=1e-5)
    with pytest.raises(ValueError, match="one shape"):
        gd.weight_angles(W1, W2[:, :-1])


def test_scaling_comparison_uses_one_initialisation_and_each_step():
    p = small_problem()
    runs, angles = gd.scaling_comparison(p.data.X, p.y, p.W, p.a, activation="tanh", steps=2,
                                         snapshot_steps=[0, 2])
    assert set(runs) == {"mf", "ntk"}
    m = p.W.shape[0]
    single = gd.train_weight_normalized(p.data.X, p.y, p.W, p.a, activation="tanh", gamma=gamma_m(m, "ntk"),
                                        steps=2, snapshot_steps=[2])
    assert torch.allclose(runs["ntk"].W[2], single.W[2])
    assert list(angles["step"]) == [0, 2]
    assert angles["mean_principal_angle"].iloc[0] == 0.0
    assert angles["mean_neuron_angle"].iloc[1] > 0
    with pytest.raises(ValueError, match="lr_factor"):
        gd.scaling_comparison(p.data.X, p.y, p.W, p.a, activation="tanh", steps=1, lr=1.0)


def test_initial_alignments_mf_residue_is_minus_target():
    out = gd.initial_alignments(60, 80, 100, scaling="mf", seed=3)
    assert set(out) == {"align_Xy", "align_Xr", "align_omega", "align_omega_span", "omega_span_norm", "align_random",
                        "s1_over_s2", "r_y_corr"}
    assert out["r_y_corr"] > 0.95
    assert out["align_Xr"] > 0.9
    assert out == gd.initial_alignments(60, 80, 100, scaling="mf", seed=3)
    # the unrelated direction: |cos| with u1 of the size of a uniform direction's in R^80 (median about
    # 0.674 / sqrt(80) = 0.075), far below the residue direction's
    randoms = [gd.initial_alignments(60, 80, 100, scaling="ntk", seed=s)["align_random"] for s in range(12)]
    assert 0.01 < float(np.median(randoms)) < 0.25
    with pytest.raises(ValueError, match="scaling"):
        gd.initial_alignments(60, 80, 100, scaling="lazy")


def test_median_gap_interval_resolves_a_clear_gap_and_not_a_null():
    rng = np.random.default_rng(0)
    groups = {"relu": rng.normal(0.2, 0.05, 30), "elu": rng.normal(0.5, 0.05, 30), "silu": rng.normal(0.6, 0.05, 30)}
    g = gd.median_gap_interval(groups, "relu", seed=1)
    assert g.gap == pytest.approx(np.median(groups["relu"]) - np.median(groups["elu"]))
    assert g.low <= g.gap <= g.high < 0
    same = {"a": rng.normal(0, 1, 8), "b": rng.normal(0, 1, 8)}
    n = gd.median_gap_interval(same, "a", seed=1)
    assert n.low < 0 < n.high  # no difference: not resolved
    assert gd.median_gap_interval(same, "a", seed=1) == n  # deterministic
    with pytest.raises(ValueError, match="at least one other"):
        gd.median_gap_interval({"a": [1.0]}, "a")


def test_direction_switch_on_a_planted_trace():
    import pandas as pd

    lead = [-0.5, -0.4, -0.1, 0.3, 0.6, 0.7, 0.8, 0.8]
    loss = [1.0, 0.9, 0.8, 2.4, 0.5, 0.4, 0.3, 0.2]
    trace = pd.DataFrame({"step": range(8), "loss": loss, "align_q": [0.5 + v / 2 for v in lead],
                          "align_residue": [0.5 - v / 2 for v in lead]})
    out = gd.direction_switch(trace)
    assert out["switched"] and out["switch_step"] == 3
    assert out["loss_jump"] == pytest.approx(3.0) and out["loss_after"] == 0.5
    back = gd.direction_switch(trace, source="align_q", target="align_residue")
    assert not back["switched"] and back["switch_step"] is None
    with pytest.raises(ValueError, match="consecutive"):
        gd.direction_switch(trace.iloc[[0, 2, 3]])


def test_relu_sign_structure_for_a_huge_spike_and_a_planted_case():
    # a spike that dominates every pre-activation: sigma'(x_i^T w_j) = 1[z_i (w_j^T q) > 0] exactly,
    # whose centred form is 1/2 sign(z) sign(Wq)^T up to the column means
    g = torch.Generator().manual_seed(0)
    n, d, m = 200, 20, 30
    z = torch.randn(n, generator=g, dtype=torch.float64)
    q = torch.zeros(d, dtype=torch.float64)
    q[0] = 1.0
    W = normalize_rows(torch.randn(m, d, generator=g, dtype=torch.float64))
    X = 1e-6 * torch.randn(n, d, generator=g, dtype=torch.float64) + 1e3 * torch.outer(z, q)
    out = gd.relu_sign_structure(X, W, z, q)
    assert out["align_left"] > 0.99 and out["align_right"] > 0.99 and out["relative_error"] < 0.2
    with pytest.raises(ValueError, match="z must have"):
        gd.relu_sign_structure(X, W, z[:-1], q)


def test_single_index_draw_is_seeded_and_shaped():
    data, omega, y, W, a = gd.single_index_draw(30, 20, 25, nu=0.25, seed=3)
    again = gd.single_index_draw(30, 20, 25, nu=0.25, seed=3)
    torch.testing.assert_close(y, again[2])
    assert data.X.shape == (30, 20) and W.shape == (25, 20) and a.shape == (25,)
    assert float(omega.norm()) == pytest.approx(1.0)
    torch.testing.assert_close(W.norm(dim=1), torch.ones(25, dtype=torch.float64))
    assert data.zeta == pytest.approx(30**0.25)


def test_rank_one_statistics_against_svd():
    p = small_problem(nu=0.75)
    s, row = gd.rank_one_statistics(p)
    full, row_full = gd.rank_one_statistics(p, spectrum=True)
    dec = decomposition.decompose_problem(p)
    sv = torch.linalg.svdvals(dec.G)
    torch.testing.assert_close(full, sv)
    torch.testing.assert_close(s, sv[:2])
    assert row == row_full
    assert row["s2_over_s1"] == pytest.approx(float(sv[1] / sv[0]))
    assert row["S1_over_G"] == pytest.approx(float(torch.linalg.svdvals(dec.S1)[0] / sv[0]), rel=1e-10)
    assert row["norm_S12_S2"] == pytest.approx(float(torch.linalg.svdvals(dec.S12 + dec.S2)[0]), rel=1e-10)
    assert 0 <= row["align_u1_q"] <= 1 and row["mu_median"] == pytest.approx(float(dec.mu.median()))


def test_random_alignment_quantile_against_monte_carlo():
    rng = np.random.default_rng(0)
    d = 50
    v = rng.standard_normal((200_000, d))
    cos = np.abs(v[:, 0]) / np.linalg.norm(v, axis=1)  # |cos| with the first basis vector
    assert gd.random_alignment_quantile(d, 0.95) == pytest.approx(np.quantile(cos, 0.95), rel=0.01)
    assert gd.random_alignment_quantile(d, 0.5) == pytest.approx(np.quantile(cos, 0.5), rel=0.01)
    assert gd.random_alignment_quantile(10_000, 0.95) == pytest.approx(1.96 / 100, rel=0.01)
    with pytest.raises(ValueError, match="d must be"):
        gd.random_alignment_quantile(1)
    with pytest.raises(ValueError, match="level"):
        gd.random_alignment_quantile(10, 1.0)


def test_one_switch_from_residue():
    assert gd.one_switch_from_residue([-0.5, -0.1, 0.2, 0.9]) == 1.0
    assert gd.one_switch_from_residue([0.5, -0.1, 0.2]) == 0.0  # starts on q
    assert gd.one_switch_from_residue([-0.5, 0.1, -0.2, 0.3]) == 0.0  # three changes of side
    assert gd.one_switch_from_residue([-0.5, -0.4, -0.3]) == 0.0  # never switches
    assert gd.one_switch_from_residue([-0.5, 0.0]) == 1.0  # zero counts as the q side
    with pytest.raises(ValueError, match="at least two"):
        gd.one_switch_from_residue([-0.5])


def test_initial_lead_matches_an_explicit_svd():
    data, omega, y, W, a = gd.single_index_draw(30, 20, 25, nu=0.5, seed=3)
    gamma = 1 / 25
    lead = gd.initial_lead(data.X, y, W, a, activation="tanh", gamma=gamma, X_B=data.X_B, q=data.q)
    # independently: autograd gradient of the MSE loss, full SVD
    V = W.clone().requires_grad_(True)
    f = gamma * torch.tanh(data.X @ V.T) @ a
    (0.5 * ((f - y) ** 2).mean()).backward()
    U = torch.linalg.svd(V.grad.T, full_matrices=False)[0]
    r = (f - y).detach()
    res = data.X_B.T @ r
    expected = abs(float(U[:, 0] @ data.q)) / float(data.q.norm()) - abs(float(U[:, 0] @ res)) / float(res.norm())
    assert lead == pytest.approx(expected, abs=1e-10)


def test_margin_over_rest():
    assert gd.margin_over_rest({"relu": 0.0, "elu": -0.2, "silu": -0.1}, "relu", ["relu", "elu", "silu"]) == pytest.approx(0.1)
    assert gd.margin_over_rest({"relu": 0.0, "elu": -0.2}, "elu", ["relu", "elu"]) == pytest.approx(-0.2)
    with pytest.raises(ValueError, match="at least one"):
        gd.margin_over_rest({"relu": 0.0}, "relu", ["relu"])


def test_exponent_fits_recover_planted_power_laws():
    import pandas as pd

    ns = np.array([50, 100, 200, 400, 800] * 2, dtype=float)
    nu, shift = 0.25, 0.0
    beta = 0.8
    table = pd.DataFrame({"nu": nu, "activation": "tanh", "n": ns, "r_rms": 2.0,
                          "residue_alignment": 3 * ns ** (-beta / 2),
                          "norm_S1": 2.0 * 5 * ns ** 0.0, "norm_S12": 2.0 * ns ** (nu - beta / 2),
                          "norm_S2": 2.0 * ns ** 0.1, "norm_E": 2.0 * 7 * ns ** -0.4})
    fits = gd.exponent_fits(table, shift=shift).set_index("term")
    assert fits.loc["S1", "fitted"] == pytest.approx(0.0, abs=1e-12)
    assert fits.loc["S12", "fitted"] == pytest.approx(nu - beta / 2)
    assert fits.loc["S12", "predicted"] == pytest.approx(nu - beta / 2)  # beta recovered from residue_alignment
    assert fits.loc["S2", "predicted"] == pytest.approx(nu) and fits.loc["S2", "fitted"] == pytest.approx(0.1)
    assert fits.loc["E", "fitted"] == pytest.approx(-0.4) and np.isnan(fits.loc["E", "predicted"])
    assert fits.loc["r", "fitted"] == pytest.approx(0.0, abs=1e-12)
    mf = gd.exponent_fits(table, shift=-0.5).set_index("term")
    assert mf.loc["S1", "predicted"] == -0.5
    with pytest.raises(ValueError, match="no column"):
        gd.exponent_fits(table.drop(columns="norm_E"), shift=0.0)


def test_a_descent_config_gives_the_run_its_keywords_give():
    p = small_problem()
    cfg = gd.DescentConfig(activation="tanh", gamma=p.gamma, steps=2, top_k=1)
    by_config = gd.train_weight_normalized(p.data.X, p.y, p.W, p.a, cfg)
    by_keywords = gd.train_weight_normalized(p.data.X, p.y, p.W, p.a, activation="tanh", gamma=p.gamma, steps=2, top_k=1)
    assert by_config.trace.equals(by_keywords.trace) and cfg.lr == 1 / p.gamma
    longer = gd.train_weight_normalized(p.data.X, p.y, p.W, p.a, cfg, steps=3)
    assert len(longer.trace) == 4
    with pytest.raises(ValueError, match="unknown training settings"):
        gd.train_weight_normalized(p.data.X, p.y, p.W, p.a, cfg, step=3)
    with pytest.raises(ValueError, match="loss"):
        gd.DescentConfig(activation="tanh", gamma=1.0, steps=1, loss="hinge")


def test_training_stops_when_the_weights_stop_being_finite():
    data, omega, y, W, a = gd.single_index_draw(20, 6, 8, nu=0.0, seed=1)
    with pytest.raises(FloatingPointError, match="diverged at step 1"):
        gd.train_weight_normalized(data.X, y, W, a, activation="tanh", gamma=1.0, lr=1e308, steps=3)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_values_and_slopes_are_the_activations_own_value_for_value(name):
    Z = torch.randn(40, 30, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 3
    value, slope = gd._values_and_slopes(name, Z)
    assert torch.equal(value, activation(name).f(Z)) and torch.equal(slope, activation(name).df(Z))


def test_size_sweep_rows_against_dense_matrices_and_their_own_seeds():
    """Each row is its own configuration's problem (seed + 10 * draw, n and m from the ratios), its
    norms those of the dense terms by a full SVD; the table is the same for one and two workers."""
    settings = dict(n_ratio=0.75, m_ratio=1.25, nus=[0.0, 0.375], activations=["tanh", "elu"], repeats=2, alpha=0.2,
                    control_nu=1.0, control_repeats=1, seed=3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one, two = (gd.size_sweep([16, 24], workers=w, **settings) for w in (1, 2))
    finally:
        torch.set_num_threads(threads)
    import pandas as pd

    pd.testing.assert_frame_equal(one, two, check_exact=True)
    assert len(one) == 2 * 2 * 2 * 2 + 2 * 2 * 1 and one["control"].sum() == 4
    assert list(one.iloc[0][["control", "nu", "activation", "d", "repeat"]]) == [False, 0.0, "tanh", 16, 0]
    assert list(one.iloc[-1][["control", "nu", "activation", "d", "repeat"]]) == [True, 1.0, "elu", 24, 0]
    row = one.query("nu == 0.375 and activation == 'elu' and d == 24 and repeat == 1").iloc[0]
    assert (row["n"], row["m"]) == (18, 30)
    problem = decomposition.spiked_problem(18, 24, 30, alpha=0.2, nu=0.375, activation="elu", seed=3 + 10 * 1)
    dense = decomposition.decompose_problem(problem, dense=True)
    for term in ("S1", "S12", "S2", "E", "G"):
        assert row[f"norm_{term}"] == pytest.approx(np.linalg.norm(getattr(dense, term).numpy(), 2), rel=1e-8)
    r, z = dense.r.numpy(), problem.data.z.numpy()
    assert row["r_rms"] == pytest.approx(np.linalg.norm(r) / math.sqrt(18), rel=1e-12)
    assert row["residue_alignment"] == pytest.approx(abs(z @ r) / (math.sqrt(18) * np.linalg.norm(r)), rel=1e-10)
    assert row["beta_hat"] == pytest.approx(-2 * math.log(row["residue_alignment"]) / math.log(24), rel=1e-10)
    for bad in (dict(repeats=0), dict(control_repeats=-1), dict(workers=0), dict(control_nu=None)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            gd.size_sweep([16], **{**settings, **bad})
