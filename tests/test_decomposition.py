"""lowrank.core.data, lowrank.core.nets (two-layer) and lowrank.gradients.decomposition.decompose against independent
computations: autograd, closed forms, explicit rank, scipy quadrature."""

import math

import numpy as np
import pytest
import scipy.integrate
import torch

from lowrank.core import data, nets, spectral
from lowrank.gradients import decomposition, regularization, rule_of_thumb


@pytest.fixture(scope="module")
def problem():
    D = data.spiked_gaussian(60, 40, alpha=0.5, nu=0.375, seed=3)
    y, _ = data.triple_index_target(D.X, seed=4)
    W = nets.sphere_rows(50, 40, seed=5)
    a = nets.outer_weights(50, seed=6)
    return D, y, W, a


def test_spiked_gaussian_structure():
    D = data.spiked_gaussian(500, 30, alpha=1.0, nu=0.5, seed=0)
    assert D.X.dtype == torch.float64 and D.X.shape == (500, 30)
    assert D.zeta == pytest.approx(500**0.5)
    assert D.q.norm().item() == pytest.approx(1.0)
    torch.testing.assert_close(D.X, D.X_B + D.zeta * torch.outer(D.z, D.q))
    np.testing.assert_allclose(torch.diagonal(D.Sigma_hat).numpy(), np.arange(1, 31) ** -1.0)
    # the bulk's sample covariance estimates Sigma_hat
    cov = (D.X_B.T @ D.X_B / 500).diagonal().numpy()
    np.testing.assert_allclose(cov, np.arange(1, 31) ** -1.0, rtol=0.25)
    again = data.spiked_gaussian(500, 30, alpha=1.0, nu=0.5, seed=0)
    assert torch.equal(D.X, again.X)


def test_targets():
    D = data.spiked_gaussian(100, 10, 0.0, 0.0, seed=1)
    y, betas = data.triple_index_target(D.X, seed=2)
    torch.testing.assert_close(betas.T @ betas, torch.eye(3, dtype=torch.float64))
    torch.testing.assert_close(y, torch.tanh(D.X @ betas).sum(1) / math.sqrt(3))
    omega = torch.ones(10, dtype=torch.float64) / math.sqrt(10)
    torch.testing.assert_close(data.single_index_target(D.X, omega), torch.sigmoid(D.X @ omega))


@pytest.mark.parametrize("name", sorted(nets.ACTIVATIONS))
def test_activation_derivatives_match_autograd(name):
    act = nets.activation(name)
    x = torch.linspace(-3, 3, 61, dtype=torch.float64).requires_grad_(True)
    x = x[x.abs() > 1e-3].detach().requires_grad_(True)  # skip ReLU's kink
    (d1,) = torch.autograd.grad(act.f(x).sum(), x, create_graph=True)
    torch.testing.assert_close(act.df(x), d1)
    if name != "relu":
        (d2,) = torch.autograd.grad(d1.sum(), x)
        torch.testing.assert_close(act.d2f(x), d2)


def test_weight_structures():
    q = torch.zeros(20, dtype=torch.float64)
    q[0] = 1.0
    for name in sorted(nets.WEIGHT_STRUCTURES):
        W = nets.weight_structure(name, 30, q, n=100, seed=0)
        torch.testing.assert_close(W.norm(dim=1), torch.ones(30, dtype=torch.float64))
    assert nets.weight_structure("orthogonal", 30, q, 100, 0)[:, 0].abs().max() < 1e-12
    tilted = nets.weight_structure("tilted", 30, q, 100, 0)
    assert (tilted[:, 0].mean() > nets.weight_structure("isotropic", 30, q, 100, 0)[:, 0].mean())
    assert nets.gamma_m(100, "ntk") == 0.1 and nets.gamma_m(100, "mf") == 0.01


@pytest.mark.parametrize("activation", ["tanh", "softplus", "relu", "sigmoid"])
@pytest.mark.parametrize("loss", ["mse", "logistic"])
@pytest.mark.parametrize("mu", ["sample", "quadrature"])
def test_decomposition_identity_and_ranks(problem, activation, loss, mu):
    D, y, W, a = problem
    if loss == "logistic":
        y = torch.where(y >= 0, 1.0, -1.0).double()
    dec = decomposition.decompose(D.X_B, D.z, D.q, D.zeta, W, a, y, activation=activation, gamma=50**-0.5,
                              loss=loss, mu=mu, Sigma_hat=D.Sigma_hat)
    assert dec.G.shape == dec.S1.shape == dec.E.shape == (40, 50)
    assert dec.identity_residual() < 1e-13
    # G against an explicit formula, independent of autograd
    f = nets.two_layer_forward(D.X, W, a, activation=activation, gamma=50**-0.5)
    r = f - y if loss == "mse" else -y * torch.sigmoid(-y * f)
    dsig = nets.activation(activation).df(D.X @ W.T)
    G_explicit = 50**-0.5 / 60 * D.X.T @ ((r[:, None] * a[None, :]) * dsig)
    torch.testing.assert_close(dec.G, G_explicit)
    torch.testing.assert_close(dec.r, r)
    for term in (dec.S1, dec.S12, dec.S2):
        assert torch.linalg.matrix_rank(term).item() <= 1
    # S12 shares S1's right vector and S2's left vector: S1 + S12 and S12 + S2 are rank one
    assert torch.linalg.matrix_rank(dec.S1 + dec.S12).item() == 1
    assert torch.linalg.matrix_rank(dec.S12 + dec.S2).item() == 1


def test_residue_matches_autograd_of_loss():
    f = torch.linspace(-2, 2, 9, dtype=torch.float64).requires_grad_(True)
    y = torch.tensor([1.0, -1.0] * 4 + [1.0], dtype=torch.float64)
    for name in sorted(decomposition.LOSSES):
        L = decomposition.loss_function(name)
        (g,) = torch.autograd.grad(L.value(f, y).sum(), f)
        torch.testing.assert_close(L.residue(f.detach(), y), g)


def _mu_reference(activation, s):
    """E[sigma'(s g)], g ~ N(0, 1), by adaptive scipy quadrature, split where sigma'(s g) changes."""
    df = nets.activation(activation).df

    def f(t):
        return float(df(torch.tensor(s * t, dtype=torch.float64))) * math.exp(-t * t / 2) / math.sqrt(2 * math.pi)

    cuts = sorted({0.0, *(c / s for c in (1, 10, 40) if c / s < 40), 40.0})
    total = 0.0
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        for a, b in ((lo, hi), (-hi, -lo)):
            v, _ = scipy.integrate.quad(f, a, b, epsabs=0, epsrel=1e-12, limit=500)
            total += v
    return total


@pytest.mark.parametrize("activation", sorted(nets.ACTIVATIONS))
def test_mu_quadrature_accurate_over_six_decades_of_scale(activation):
    ss = np.geomspace(1e-3, 1e3, 13)
    W = torch.as_tensor(np.stack([ss, np.zeros_like(ss)], 1))  # w_j = (s_j, 0): s_j = ||Sigma^(1/2) w_j||
    mu = decomposition.mu_quadrature(W, torch.eye(2, dtype=torch.float64), activation).numpy()
    ref = np.array([_mu_reference(activation, s) for s in ss])
    np.testing.assert_allclose(mu, ref, rtol=1e-8, atol=0)


def test_mu_quadrature_closed_forms_and_sample_mean():
    rng = np.random.default_rng(0)
    d = 6
    A = rng.standard_normal((d, d))
    Sigma = torch.as_tensor(A @ A.T / d + np.eye(d))
    W = nets.sphere_rows(4, d, seed=1)
    # ReLU, softplus (sigma' = logistic), SiLU and GELU have sigma'(x) + sigma'(-x) = 1: mu = 1/2 exactly
    for act in ("relu", "softplus", "silu", "gelu"):
        np.testing.assert_allclose(decomposition.mu_quadrature(W, Sigma, act).numpy(), 0.5, rtol=1e-12)
    # the sample mean converges to it
    D = data.spiked_gaussian(20000, d, 0.0, 0.2, seed=2)
    Sig = D.Sigma_hat + D.zeta**2 * torch.outer(D.q, D.q)
    np.testing.assert_allclose(decomposition.mu_sample(D.X, W, "sigmoid").numpy(),
                               decomposition.mu_quadrature(W, Sig, "sigmoid").numpy(), atol=0.01)
    with pytest.raises(ValueError, match="Sigma must be"):
        decomposition.mu_quadrature(W, torch.eye(3), "tanh")


def test_spike_norms_closed_form_against_svd():
    p = decomposition.spiked_problem(40, 30, 50, alpha=0.3, nu=0.375, activation="tanh", seed=3)
    dec = decomposition.decompose_problem(p)
    norms = dec.spike_norms()
    for k in ("S1", "S12", "S2"):
        assert norms[f"norm_{k}"] == pytest.approx(float(torch.linalg.svdvals(getattr(dec, k))[0]), rel=1e-12)
        u, v = dec.factors[k]
        torch.testing.assert_close(torch.outer(u, v), getattr(dec, k))
    jp = regularization.jacobian_penalty_problem(p, 2.0)
    assert jp.norm_S3() == pytest.approx(float(torch.linalg.svdvals(jp.S3)[0]), rel=1e-12)


def test_spike_summary_on_a_small_problem():
    p = decomposition.spiked_problem(80, 60, 70, alpha=0.0, nu=0.0, activation="tanh", seed=0)
    row = decomposition.spike_summary(decomposition.decompose_problem(p), p.data)
    assert row["identity_residual"] < 1e-13
    assert row["s1"] == pytest.approx(spectral.singular_values(decomposition.decompose_problem(p).G)[0].item())
    assert 0 <= row["align_u1_q"] <= 1 and 0 <= row["q_in_top2"] <= 1
    # the residue's part in U_2, against numpy's full SVD of the dense G
    dec = decomposition.decompose_problem(p)
    U = np.linalg.svd(dec.G.numpy())[0][:, :2]
    x = (p.data.X_B.T @ dec.r).numpy()
    assert row["residue_in_top2"] == pytest.approx(np.linalg.norm(U.T @ x) / np.linalg.norm(x), rel=1e-6)
    assert row["align_residue_q"] == pytest.approx(abs(x @ p.data.q.numpy()) / np.linalg.norm(x), rel=1e-9)


def _planted(strengths, d=120, m=90, seed=0):
    """G = sum_k s_k u_k v_k^T + a small bulk, u_1 = x (the residue direction), u_2 = q, orthonormal."""
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((d, 2)))[0]
    V = np.linalg.qr(rng.standard_normal((m, 2)))[0]
    G = sum(s * np.outer(Q[:, k], V[:, k]) for k, s in enumerate(strengths)) + 0.01 * rng.standard_normal((d, m))
    return G, Q[:, 0], Q[:, 1]


@pytest.mark.parametrize("strengths, want", [((10.0, 6.0), True),   # rank two along x and q
                                              ((10.0, 0.0), False),  # rank one along x: q is not in U_2
                                              ((0.0, 10.0), False)])  # rank one along q: one outlier only
def test_is_rank_two_on_planted_gradients(strengths, want):
    G, x, q = _planted(strengths)
    U, s, _ = np.linalg.svd(G)
    outliers = spectral.count_outliers(torch.as_tensor(s[:6]), max_outliers=5, gap=1.5)
    got = decomposition.is_rank_two(outliers, np.linalg.norm(U[:, :2].T @ x), np.linalg.norm(U[:, :2].T @ q),
                                    threshold=0.9)
    assert bool(got) is want
    # the statistic it replaces (q in U_2 alone) is met by the rank-one gradient along q too
    if strengths == (0.0, 10.0):
        assert np.linalg.norm(U[:, :2].T @ q) > 0.99


def test_is_rank_two_is_elementwise_and_refuses_a_bad_threshold():
    got = decomposition.is_rank_two([2, 2, 1, 3], [0.95, 0.5, 0.95, 0.95], [0.95, 0.95, 0.95, 0.95], threshold=0.9)
    assert got.tolist() == [True, False, False, False]
    with pytest.raises(ValueError, match="threshold"):
        decomposition.is_rank_two(2, 1.0, 1.0, threshold=0.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(activation="swish"), "activation='swish' is not allowed"),
        (dict(loss="hinge"), "loss='hinge'"),
        (dict(mu="median"), "mu='median'"),
        (dict(mu="quadrature"), "needs Sigma_hat"),
    ],
)
def test_decompose_rejects_bad_options(problem, kwargs, message):
    D, y, W, a = problem
    opts = dict(activation="tanh", gamma=0.1) | kwargs
    with pytest.raises(ValueError, match=message):
        decomposition.decompose(D.X_B, D.z, D.q, D.zeta, W, a, y, **opts)


def test_decompose_rejects_bad_shapes_and_values(problem):
    D, y, W, a = problem
    with pytest.raises(ValueError, match="W must have shape"):
        decomposition.decompose(D.X_B, D.z, D.q, D.zeta, W[:, :-1], a, y, activation="tanh", gamma=0.1)
    bad = y.clone()
    bad[0] = float("nan")
    with pytest.raises(ValueError, match="y contains NaN"):
        decomposition.decompose(D.X_B, D.z, D.q, D.zeta, W, a, bad, activation="tanh", gamma=0.1)
    with pytest.raises(ValueError, match="labels y in"):
        decomposition.decompose(D.X_B, D.z, D.q, D.zeta, W, a, y, activation="tanh", gamma=0.1, loss="logistic")
    with pytest.raises(ValueError, match="nu must be non-negative"):
        data.spiked_gaussian(10, 5, 0.0, -0.1, seed=0)
    with pytest.raises(ValueError, match="seed"):
        data.spiked_gaussian(10, 5, 0.0, 0.1, seed=-1)
    with pytest.raises(ValueError, match="zero row"):
        nets.normalize_rows(torch.zeros(2, 3))


def test_device_is_cpu_here_and_overridable(monkeypatch):
    from lowrank.core import device

    monkeypatch.delenv("LOWRANK_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert device.get_device().type == expected
    monkeypatch.setenv("LOWRANK_DEVICE", "cpu")
    assert device.get_device().type == "cpu"


@pytest.mark.parametrize("loss", ["mse", "logistic"])
def test_product_form_without_dense_matrices_matches_the_full_svd(loss):
    """`dense=False` forms neither G nor E; their leading pairs from the product form agree with a
    full SVD of the dense (autograd) gradient, and the summaries built on them do not change."""
    p = decomposition.spiked_problem(240, 260, 300, alpha=0.0, nu=0.375, activation="tanh", loss=loss, seed=2)
    dense = decomposition.decompose_problem(p)
    lazy = decomposition.decompose_problem(p, dense=False)
    assert lazy.G is None and lazy.E is None
    with pytest.raises(ValueError, match="dense=False"):
        lazy.identity_residual()
    for term in ("G", "E"):
        U, s, _ = np.linalg.svd(getattr(dense, term).numpy(), full_matrices=False)
        top = lazy.top(term, 3)
        np.testing.assert_allclose(top.s.numpy(), s[:3], rtol=0, atol=1e-11 * s[0])
        np.testing.assert_allclose(np.abs(np.sum(top.U.numpy() * U[:, :3], axis=0)), 1.0, atol=1e-7)
    assert lazy.spike_norms() == pytest.approx(dense.spike_norms(), rel=1e-12)
    x = p.data.X_B.T @ dense.r
    call, ref = rule_of_thumb.dominant_spike(lazy, x, p.data.q), rule_of_thumb.dominant_spike(dense.G, x, p.data.q)
    assert call.label == ref.label and call.outliers == ref.outliers
    assert call[2:] == pytest.approx(ref[2:], rel=1e-8)


def test_tilt_scan_against_hand_tilted_rows_and_an_autograd_gradient():
    n, d, m = 24, 10, 14
    scan = decomposition.tilt_scan(n, d, m, nu=0.375, activations=["tanh", "elu"], tilts=[0.0, 2.0], seed=5)
    assert list(zip(scan["activation"], scan["tilt"])) == [("tanh", 0.0), ("tanh", 2.0), ("elu", 0.0), ("elu", 2.0)]
    p = decomposition.spiked_problem(n, d, m, alpha=0.0, nu=0.375, activation="tanh", seed=5)  # untilted W_S
    q = p.data.q.numpy()
    for tilt in (0.0, 2.0):
        W = p.W.numpy() + tilt * n ** -0.25 * q[None, :]  # the paper's tilt, rows renormalised
        W /= np.linalg.norm(W, axis=1, keepdims=True)
        Wt = torch.tensor(W, requires_grad=True)
        f = p.gamma * torch.tanh(p.data.X @ Wt.T) @ p.a
        (g,) = torch.autograd.grad(0.5 * ((f - p.y) ** 2).mean(), Wt)
        s = np.linalg.svd(g.numpy(), compute_uv=False)
        row = scan[(scan["activation"] == "tanh") & (scan["tilt"] == tilt)].iloc[0]
        assert row["W_norm"] == pytest.approx(np.linalg.norm(W, 2), rel=1e-10)
        assert row["mean_wq"] == pytest.approx(float((W @ q).mean()), abs=1e-12)
        assert row["s1"] == pytest.approx(s[0], rel=1e-9)
        assert row["s2"] == pytest.approx(s[1], rel=1e-9)
    assert scan.loc[1, "mean_wq"] > scan.loc[0, "mean_wq"]
