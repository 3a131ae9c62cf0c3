"""Remark 1 (a 1-D convolution as a weight-tied two-layer network) of lowrank.gradients.convolution,
against autograd of the conv net."""

import pytest
import torch
from torch.func import grad

from lowrank.core import data, nets
from lowrank.gradients import convolution, decomposition


def test_conv_weight_matrix_is_the_convolution():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(5, generator=g, dtype=torch.float64)
    W = convolution.conv1d_weight_matrix(w, 12)
    assert W.shape == (8, 12)
    X = torch.randn(7, 12, generator=g, dtype=torch.float64)
    conv = torch.nn.functional.conv1d(X[:, None, :], w[None, None, :])[:, 0, :]
    torch.testing.assert_close(X @ W.T, conv)
    torch.testing.assert_close(W.norm(dim=1), torch.full((8,), float(w.norm()), dtype=torch.float64))
    assert int((W != 0).sum()) == 8 * 5
    with pytest.raises(ValueError, match="d must be an integer"):
        convolution.conv1d_weight_matrix(w, 4)


@pytest.mark.parametrize("activation", ["tanh", "softplus", "relu"])
def test_filter_gradient_from_untied_matches_conv_autograd(activation):
    n, d, k = 40, 30, 6
    m = d - k + 1
    D = data.spiked_gaussian(n, d, alpha=0.0, nu=0.375, seed=1)
    y, _ = data.triple_index_target(D.X, seed=2)
    w = torch.randn(k, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    w = w / w.norm()
    a = nets.outer_weights(m, seed=4)
    gamma = m**-0.5
    W = convolution.conv1d_weight_matrix(w, d)
    dec = decomposition.decompose(D.X_B, D.z, D.q, D.zeta, W, a, y, activation=activation, gamma=gamma)
    g_fold = convolution.conv1d_filter_gradient(dec.G, k)
    # autograd of the conv net (torch conv1d), never building W
    g_conv = grad(lambda v: (0.5 * (convolution.conv1d_forward(D.X, v, a, activation=activation, gamma=gamma)
                                    - y) ** 2).mean())(w)
    torch.testing.assert_close(g_fold, g_conv, rtol=1e-11, atol=1e-14)
    torch.testing.assert_close(convolution.conv1d_forward(D.X, w, a, activation=activation, gamma=gamma),
                               nets.two_layer_forward(D.X, W, a, activation=activation, gamma=gamma))


def test_filter_gradient_is_the_sum_of_superdiagonals():
    d, k = 9, 3
    G = torch.arange(d * (d - k + 1), dtype=torch.float64).reshape(d, d - k + 1)  # d x m
    g = convolution.conv1d_filter_gradient(G, k)
    Gmd = G.T
    ref = torch.tensor([sum(Gmd[j, j + i] for j in range(d - k + 1)) for i in range(k)], dtype=torch.float64)
    torch.testing.assert_close(g, ref)
    with pytest.raises(ValueError, match="k = d - m \\+ 1"):
        convolution.conv1d_filter_gradient(G, 4)


def test_filter_low_rank_exact_for_low_rank_G():
    g = torch.Generator().manual_seed(5)
    d, k = 20, 4
    m = d - k + 1
    U = torch.randn(d, 2, generator=g, dtype=torch.float64)
    V = torch.randn(m, 2, generator=g, dtype=torch.float64)
    G = U @ V.T  # exactly rank two
    res = convolution.conv1d_filter_low_rank(G, k, rank=2)
    assert res.error < 1e-12 and res.subspace_error < 1e-12
    torch.testing.assert_close(res.g, convolution.conv1d_filter_gradient(G, k))
    # the components are correlations of the singular vectors: c[i] = sum_j u[j + i] v[j]
    Us, s, Vh = torch.linalg.svd(G, full_matrices=False)
    c0 = torch.tensor([float(Us[i:i + m, 0] @ Vh[0]) for i in range(k)], dtype=torch.float64)
    torch.testing.assert_close(res.components[:, 0], c0)
    # sum over all singular pairs reconstructs g
    full = convolution.conv1d_filter_low_rank(G + 1e-3 * torch.randn(d, m, generator=g, dtype=torch.float64), k,
                                            rank=min(d, m))
    assert full.error < 1e-12
    # an extra direction equal to g closes the subspace error
    noisy = G + torch.randn(d, m, generator=g, dtype=torch.float64)
    r2 = convolution.conv1d_filter_low_rank(noisy, k, rank=2)
    r2x = convolution.conv1d_filter_low_rank(noisy, k, rank=2, extra=r2.g)
    assert r2.subspace_error <= r2.error + 1e-12 and r2x.subspace_error < 1e-12


def test_conv1d_measure_row():
    row, dec, r2, w = convolution.conv1d_measure(40, 30, 5, nu=0.75, activation="tanh", scaling="ntk", seed=2)
    assert row["fold_vs_autograd"] < 1e-12  # the fold is the chain rule
    assert row["eps2_subspace"] <= row["eps1"] + 1e-12  # s1 c1 lies in span(c1, c2): the projection is closer
    assert row["eps2_plus_w"] <= row["eps2_subspace"] + 1e-12  # a larger span is closer
    assert 0 <= row["residual_along_w"] <= 1 and 0 <= row["residual_along_random"] <= 1
    torch.testing.assert_close(r2.g, convolution.conv1d_filter_gradient(dec.G, 5))
    assert w.shape == (5,)


def test_conv1d_sweep_is_conv1d_measure_per_configuration_for_any_number_of_workers():
    import numpy as np
    import pandas as pd

    configs = [(20, 30, nu, act, sc, s) for nu in (0.0, 0.75) for act in ("tanh", "relu") for sc in ("ntk", "mf")
               for s in (1, 5)]
    shown = [configs[0], configs[-1]]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        (one, kept_one), (two, kept_two) = (convolution.conv1d_sweep(configs, 4, alpha=0.3, examples=shown, workers=w)
                                            for w in (1, 2))
    finally:
        torch.set_num_threads(threads)
    pd.testing.assert_frame_equal(one, two, check_exact=True)
    assert list(zip(one["nu"], one["activation"], one["scaling"], one["seed"])) == [c[2:] for c in configs]
    assert set(kept_one) == set(kept_two) == set(shown)
    row, dec, r2, w = convolution.conv1d_measure(20, 30, 4, nu=0.75, activation="relu", scaling="mf", alpha=0.3, seed=5)
    assert one.iloc[-1].to_dict() == pytest.approx(row)
    s, r2_kept, w_kept = kept_two[configs[-1]]
    np.testing.assert_allclose(s, np.linalg.svd(dec.G.numpy(), compute_uv=False), rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(r2_kept.g_low, r2.g_low)
    torch.testing.assert_close(w_kept, w)
    with pytest.raises(ValueError, match="examples"):
        convolution.conv1d_sweep(configs[:1], 4, examples=[configs[1]])
    with pytest.raises(ValueError, match="workers"):
        convolution.conv1d_sweep(configs[:1], 4, workers=0)
