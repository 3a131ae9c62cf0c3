"""Prop. 3.1's tables (lowrank.gradients.relu) against an independent computation: autograd gradients
and full SVDs, numpy's polyfit, and the sign model built by hand."""

import numpy as np
import pandas as pd
import pytest
import torch

from lowrank.gradients import relu
from lowrank.gradients.decomposition import spiked_problem


def test_residue_share_draws_against_autograd_and_a_full_svd():
    n, d, m = 20, 12, 16
    out = relu.residue_share_draws(n, d, m, alpha=0.5, nu=0.25, activations=["relu", "tanh"], repeats=2, seed=3)
    assert list(zip(out.table["repeat"], out.table["activation"])) == [(0, "relu"), (0, "tanh"), (1, "relu"),
                                                                      (1, "tanh")]
    p = spiked_problem(n, d, m, alpha=0.5, nu=0.25, activation="tanh", seed=13)  # draw 1: seed 3 + 10
    W = p.W.clone().requires_grad_(True)
    f = p.gamma * torch.tanh(p.data.X @ W.T) @ p.a
    (g,) = torch.autograd.grad(0.5 * ((f - p.y) ** 2).mean(), W)
    G, r = g.T.numpy(), (f - p.y).detach().numpy()
    U, s, _ = np.linalg.svd(G, full_matrices=False)
    # S1 = (gamma/n) X_B^T r (a o mu)^T, rank one: its norm is a product of vector norms
    mu = (1 - torch.tanh(p.data.X @ p.W.T) ** 2).mean(0).numpy()
    norm_S1 = p.gamma / n * np.linalg.norm(p.data.X_B.numpy().T @ r) * np.linalg.norm(p.a.numpy() * mu)
    row = out.table.query("activation == 'tanh' and repeat == 1").iloc[0]
    assert row["norm_G"] == pytest.approx(s[0], rel=1e-9)
    assert row["share_top"] == pytest.approx(norm_S1 / s[0], rel=1e-8)
    assert row["share_energy"] == pytest.approx(norm_S1**2 / (s**2).sum(), rel=1e-8)
    assert row["s1_over_s2"] == pytest.approx(s[0] / s[1], rel=1e-9)
    res = p.data.X_B.numpy().T @ r
    assert row["align_u1_residue"] == pytest.approx(abs(U[:, 0] @ res) / np.linalg.norm(res), abs=1e-9)
    assert set(out.spectra) == {"relu", "tanh"}


def test_sigma_perp_growth_by_hand_and_its_slopes_against_polyfit():
    growth = relu.sigma_perp_growth(12, 16, 20, alpha=0.0, nus=[0.25], activations=["relu", "tanh"], ds=[8, 16],
                                    repeats=2, seed=1)
    assert list(growth["n"].unique()) == [6, 12]  # n / d = 12 / 16 of each d
    # one row by hand: sigma'(X W^T) centred by its column means, spectral norm over n
    p = spiked_problem(6, 8, 10, alpha=0.0, nu=0.25, activation="tanh", seed=1 + 100 + 10)
    D = 1 - np.tanh(p.data.X.numpy() @ p.W.numpy().T) ** 2
    expected = np.linalg.norm(D - D.mean(0), 2) / 6
    row = growth.query("activation == 'tanh' and d == 8 and repeat == 1").iloc[0]
    assert row["sigma_perp_over_n"] == pytest.approx(expected, rel=1e-9)
    slopes = relu.growth_slopes(growth)
    assert list(slopes["activation"]) == ["relu", "tanh"]
    for act, fit in slopes.set_index("activation").iterrows():
        grp = growth[growth["activation"] == act]
        slope, intercept = np.polyfit(np.log(grp["n"]), np.log(grp["sigma_perp_over_n"]), 1)
        assert fit["slope"] == pytest.approx(slope, rel=1e-9)
        assert fit["intercept"] == pytest.approx(intercept, rel=1e-9)


def test_sign_structure_table_against_the_sign_model_by_hand():
    table = relu.sign_structure_table(30, 10, 14, alpha=0.0, nus=[1.0, 0.0], seed=2)
    assert list(table.index) == [1.0, 0.0]
    p = spiked_problem(30, 10, 14, alpha=0.0, nu=1.0, activation="relu", seed=2)
    D = (p.data.X.numpy() @ p.W.numpy().T > 0).astype(float)
    P = D - D.mean(0)
    U, s, Vt = np.linalg.svd(P)
    sz, sw = np.sign(p.data.z.numpy()), np.sign(p.W.numpy() @ p.data.q.numpy())
    row = table.loc[1.0]
    assert row["align_left"] == pytest.approx(abs(U[:, 0] @ sz) / np.linalg.norm(sz), abs=1e-9)
    assert row["align_right"] == pytest.approx(abs(Vt[0] @ sw) / np.linalg.norm(sw), abs=1e-9)
    assert row["relative_error"] == pytest.approx(np.linalg.norm(P - 0.5 * np.outer(sz, sw), 2) / s[0], rel=1e-9)
    assert isinstance(table, pd.DataFrame)


def test_spike_variance_share_against_sampled_pre_activations():
    import torch

    from lowrank.core import data

    n, d, nu, alpha = 400, 300, 0.375, 5 / 9
    D = data.spiked_gaussian(n, d, alpha, nu, seed=0)
    g = torch.Generator().manual_seed(1)
    W = torch.randn(2000, d, generator=g, dtype=torch.float64)
    W = W / W.norm(dim=1, keepdim=True)
    spike = (D.zeta * torch.outer(D.z, W @ D.q)).pow(2).mean()
    bulk = (D.X_B @ W.T).pow(2).mean()
    assert relu.spike_variance_share(n, d, nu=nu, alpha=alpha) == pytest.approx(float(spike / bulk), rel=0.15)
    # the condition 2 nu > 1 - alpha is that it grows with n (d in proportion)
    grow = [relu.spike_variance_share(k, k, nu=nu, alpha=alpha) for k in (100, 1000, 10000)]
    assert grow[0] < grow[1] < grow[2]
    shrink = [relu.spike_variance_share(k, k, nu=0.125, alpha=alpha) for k in (100, 1000, 10000)]
    assert shrink[0] > shrink[1] > shrink[2]
    with pytest.raises(ValueError):
        relu.spike_variance_share(0, 3, nu=0.1, alpha=0.0)
