"""Remark 1 (a 1-D convolution as a weight-tied two-layer network), the spike classifier and the
rule of thumb of lowrank.gradients.convolution and lowrank.gradients.rule_of_thumb, against autograd of the conv net and hand-made cases."""

import math

import pytest
import torch
from torch.func import grad

from lowrank.core import data, nets, spectral
from lowrank.gradients import convolution, decomposition, rule_of_thumb


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


def _unit(v):
    return v / v.norm()


def test_dominant_spike_hand_made_cases():
    g = torch.Generator().manual_seed(0)
    d, m = 60, 80
    bulk = 0.02 * torch.randn(d, m, generator=g, dtype=torch.float64)
    x = _unit(torch.randn(d, generator=g, dtype=torch.float64))
    q = torch.randn(d, generator=g, dtype=torch.float64)
    q = _unit(q - (q @ x) * x)
    v1 = _unit(torch.randn(m, generator=g, dtype=torch.float64))
    v2 = _unit(torch.randn(m, generator=g, dtype=torch.float64))
    assert rule_of_thumb.dominant_spike(bulk, x, q).label == "none"
    call = rule_of_thumb.dominant_spike(bulk + 3 * torch.outer(x, v1), 7 * x, q)
    assert call.label == "residue" and call.outliers == 1 and call.align_residue > 0.99
    assert rule_of_thumb.dominant_spike(bulk + 3 * torch.outer(q, v1), x, q).label == "data"
    both = rule_of_thumb.dominant_spike(bulk + 3 * torch.outer(x, v1) + 1.5 * torch.outer(q, v2), x, q)
    assert both.label == "both" and both.outliers == 2 and both.q_in_top2 > 0.99
    # two outliers, but the second is neither direction: u1 decides
    other = _unit(torch.randn(d, generator=g, dtype=torch.float64))
    call = rule_of_thumb.dominant_spike(bulk + 3 * torch.outer(q, v1) + 1.5 * torch.outer(other, v2), x, q)
    assert call.label == "data" and call.outliers == 2
    with pytest.raises(ValueError, match="G's 60 rows"):
        rule_of_thumb.dominant_spike(bulk, x[:-1], q)


def test_dominant_spike_on_the_papers_regimes():
    # nu = 0: residue spike; nu = 3/4: the data spike q (as in Figs. 1 and 3)
    for nu, expected in ((0.0, "residue"), (0.75, "data")):
        p = decomposition.spiked_problem(150, 200, 250, alpha=0.0, nu=nu, activation="softplus", seed=0)
        dec = decomposition.decompose_problem(p)
        assert rule_of_thumb.dominant_spike_of_problem(dec, p.data).label == expected


def test_dominant_spike_reads_leading_triplets_computed_once():
    p = decomposition.spiked_problem(150, 300, 250, alpha=0.0, nu=0.75, activation="softplus", seed=1)
    dec = decomposition.decompose_problem(p, dense=False)
    alone = rule_of_thumb.dominant_spike_of_problem(dec, p.data)
    shared = rule_of_thumb.dominant_spike_of_problem(dec, p.data, top=dec.top("G", 8))
    assert shared.label == alone.label and shared.outliers == alone.outliers
    assert shared[1:] == pytest.approx(alone[1:], rel=1e-9, abs=1e-12)
    # too few triplets to count outliers: computed afresh, same answer
    short = rule_of_thumb.dominant_spike_of_problem(dec, p.data, top=dec.top("G", 3))
    assert short == alone
    # the triplets given are the ones read: those of another matrix change the numbers
    other = spectral.top_singular(torch.randn(300, 250, generator=torch.Generator().manual_seed(2),
                                              dtype=torch.float64), 8)
    assert rule_of_thumb.dominant_spike_of_problem(dec, p.data, top=other).align_q != pytest.approx(alone.align_q)


@pytest.mark.parametrize(
    "nu, alpha, beta, expected",
    [
        (0.0, 0.0, 1.0, "residue"),
        (0.2, 0.0, 1.0, "residue"),
        (0.2, 0.7, 1.0, "both"),  # 2 nu >= 1 - alpha
        (0.225, 0.1, 0.5, "both"),  # beta - alpha <= 2 nu <= beta: S1 and S12 comparable
        (0.2, 0.0, 0.3, "data"),  # 2 nu > beta, nu < 1/4: S12 (along q) dominates
        (0.3, 0.0, 1.0, "both"),  # nu in [1/4, 1/2)
        (0.75, 0.0, 1.0, "data"),
        (0.75, 0.0, 1.6, "both"),  # nu >= 1/2 but nu <= beta / 2
    ],
)
def test_rule_of_thumb(nu, alpha, beta, expected):
    assert rule_of_thumb.rule_of_thumb(nu, alpha, beta) == expected


def test_rule_of_thumb_flags_and_boundaries():
    assert rule_of_thumb.rule_of_thumb(0.75, 0.0, 0.0, large_input_noise=True) == "residue"
    assert rule_of_thumb.rule_of_thumb(0.0, 0.0, 1.0, large_jacobian_penalty=True) == "data"
    with pytest.raises(ValueError, match="together"):
        rule_of_thumb.rule_of_thumb(0.1, 0.0, 1.0, large_input_noise=True, large_jacobian_penalty=True)
    with pytest.raises(ValueError, match="beta must be a number"):
        rule_of_thumb.rule_of_thumb(0.1, 0.0, math.nan)
    lines = rule_of_thumb.rule_of_thumb_boundaries(1.0)
    assert lines["nu = (1 - alpha)/2"](0.5) == pytest.approx(0.25)
    assert lines["nu = beta/2"](0.3) == pytest.approx(0.5)
    # just below every residue line the rule says residue, just above the lowest it does not
    for al in (0.0, 0.3, 0.6):
        low = min(f(al) for name, f in lines.items() if name in ("nu = 1/4", "nu = (beta - alpha)/2",
                                                                    "nu = (1 - alpha)/2"))
        assert rule_of_thumb.rule_of_thumb(low - 1e-3, al, 1.0) == "residue"
        assert rule_of_thumb.rule_of_thumb(low + 1e-3, al, 1.0) != "residue"


def test_conv1d_measure_row():
    row, dec, r2, w = convolution.conv1d_measure(40, 30, 5, nu=0.75, activation="tanh", scaling="ntk", seed=2)
    assert row["fold_vs_autograd"] < 1e-12  # the fold is the chain rule
    assert row["eps2_subspace"] <= row["eps1"] + 1e-12  # s1 c1 lies in span(c1, c2): the projection is closer
    assert row["eps2_plus_w"] <= row["eps2_subspace"] + 1e-12  # a larger span is closer
    assert 0 <= row["residual_along_w"] <= 1 and 0 <= row["residual_along_random"] <= 1
    torch.testing.assert_close(r2.g, convolution.conv1d_filter_gradient(dec.G, 5))
    assert w.shape == (5,)


def test_small_nu_split_by_hand():
    import pandas as pd

    grid = pd.DataFrame({"nu": [0.1, 0.1, 0.2, 0.3], "alpha": [0.2, 0.2, 0.1, 0.0],
                         "beta_hat": [0.5, 0.1, 0.45, 0.9], "norm_S1": [2.0, 1.0, 1.0, 5.0],
                         "norm_S12": [1.0, 3.0, 1.0, 1.0]})
    split = rule_of_thumb.small_nu_split(grid)
    # cell 0: 0.5 > 2(0.1) + 0.2 = 0.4 -> S1; cell 1: 0.1 < 0.2 -> S12; cell 2: 0.4 <= 0.45 <= 0.5 -> neither
    assert split["predicted"].tolist() == ["S1", "S12", "neither"]  # nu = 0.3 is left out
    assert split["larger"].tolist() == ["S1", "S12", "S1"]  # a tie counts for S1


def test_phase_grid_cells_against_their_own_problem_and_the_number_of_workers():
    """Each row is its cell's problem (seeded by the cell's seed): the call, the rule at the cell's
    beta_hat and the spectrum by a full SVD of the dense G; the table is the same for one and two workers."""
    import numpy as np
    import pandas as pd

    n, d, m = 18, 24, 30
    settings = dict(nus=[0.0, 0.75], alphas=[0.0, 0.5], seeds=[4, 9], activation="softplus", spectrum_top=6)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one, two = (rule_of_thumb.phase_grid(n, d, m, workers=w, **settings) for w in (1, 2))
    finally:
        torch.set_num_threads(threads)
    pd.testing.assert_frame_equal(one, two, check_exact=True)
    assert list(zip(one["nu"], one["alpha"], one["seed"])) == [(nu, al, s) for nu in (0.0, 0.75) for al in (0.0, 0.5)
                                                               for s in (4, 9)]
    assert "label" not in one and (one["agree"] == (one["measured"] == one["rule"])).all()
    row = one.iloc[-3]  # nu = 0.75, alpha = 0, seed = 9
    p = decomposition.spiked_problem(n, d, m, alpha=0.0, nu=0.75, activation="softplus", seed=9)
    dense = decomposition.decompose_problem(p, dense=True)
    s = np.linalg.svd(dense.G.numpy(), compute_uv=False)
    np.testing.assert_allclose(row[[f"sv_{k}" for k in range(1, 7)]].to_numpy(float), s[:6], rtol=1e-8)
    call = rule_of_thumb.dominant_spike_of_problem(dense, p.data)
    beta = rule_of_thumb.residue_alignment_beta(p.data.z, dense.r, d)
    assert row["measured"] == call.label and row["beta_hat"] == pytest.approx(beta, rel=1e-12)
    assert row["rule"] == rule_of_thumb.rule_of_thumb(0.75, 0.0, beta)
    for term in ("S1", "S12", "S2"):
        assert row[f"norm_{term}"] == pytest.approx(np.linalg.norm(getattr(dense, term).numpy(), 2), rel=1e-8)
    with pytest.raises(ValueError, match="workers"):
        rule_of_thumb.phase_grid(n, d, m, workers=1.5, **settings)


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
