"""Theorem 3.2's experiment (lowrank.gradients.large_spike) against an independent computation:
autograd gradients and hand-built weight-normalised descent, full SVDs, hand-worked tables."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from lowrank.gradients import large_spike
from lowrank.gradients.decomposition import spiked_problem
from lowrank.gradients.dynamics import rank_one_statistics


def _autograd_gradient(X, y, W, a, gamma, act):
    W = W.clone().requires_grad_(True)
    f = gamma * act(X @ W.T) @ a
    (g,) = torch.autograd.grad(0.5 * ((f - y) ** 2).mean(), W)
    return g.T.numpy()


def test_loss_diverged_on_hand_worked_paths():
    assert not large_spike.loss_diverged([1.0, 0.5, 9.9])
    assert large_spike.loss_diverged([1.0, 0.5, 10.1])
    assert large_spike.loss_diverged([1.0, float("nan")])
    assert large_spike.loss_diverged([1.0, 2.5], growth=2.0)
    with pytest.raises(ValueError, match="non-empty"):
        large_spike.loss_diverged([])


def test_train_on_the_data_against_autograd_descent():
    p = spiked_problem(20, 8, 12, alpha=0.0, nu=0.75, activation="tanh", seed=2)
    out = large_spike.train_on_the_data(p, steps=3, lr_factor=0.25, collapse_threshold=0.9)
    lr = 0.25 / (p.gamma * 20 ** 1.5)  # lr_factor / (gamma_m zeta^2), zeta = n^nu
    V, losses = p.W.clone(), []
    for _ in range(4):
        V = V.detach().requires_grad_(True)
        W = V / V.norm(dim=1, keepdim=True)
        loss = 0.5 * ((p.gamma * torch.tanh(p.data.X @ W.T) @ p.a - p.y) ** 2).mean()
        (g,) = torch.autograd.grad(loss, V)
        losses.append(float(loss.detach()))
        W_end, V = W.detach(), V - lr * g
    np.testing.assert_allclose(out.losses, losses, rtol=1e-10)
    assert torch.allclose(out.problem.W, W_end, atol=1e-12)
    assert torch.equal(out.problem.data.X, p.data.X) and torch.equal(out.problem.y, p.y)
    cos = (p.W * W_end).sum(1).clamp(-1, 1)
    assert out.angle_deg == pytest.approx(math.degrees(1) * float(torch.arccos(cos).mean()), abs=1e-9)
    median_q = float((W_end @ p.data.q).abs().median())
    assert out.collapsed == (median_q > 0.9)
    assert large_spike.train_on_the_data(p, steps=1, lr_factor=0.25, collapse_threshold=0.0).collapsed
    with pytest.raises(ValueError, match="collapse_threshold"):
        large_spike.train_on_the_data(p, steps=1, lr_factor=0.25, collapse_threshold=1.5)


def test_rank_one_draws_against_an_autograd_gradient_and_a_full_svd():
    n, d, m = 18, 10, 14
    out = large_spike.rank_one_draws(n, d, m, alpha=0.0, nu=0.75, activations=["tanh", "relu"],
                                     weights=["orthogonal", "trained"], repeats=2, trained_steps=2, seed=4)
    assert len(out.draws) == 2 * 2 * 2
    assert set(out.spectra) == {(a, w) for a in ("tanh", "relu") for w in ("orthogonal", "trained")}
    assert len(out.losses) == 2 * 2 * 3  # two activations, two draws, steps 0..2
    assert (out.draws.query("weights == 'orthogonal'")["trained_angle_deg"] == 0).all()
    # draw 1 uses seed 4 + 10: the orthogonal rows, tanh, G by autograd
    p = spiked_problem(n, d, m, alpha=0.0, nu=0.75, activation="tanh", weights="orthogonal", seed=14)
    U, s, _ = np.linalg.svd(_autograd_gradient(p.data.X, p.y, p.W, p.a, p.gamma, torch.tanh), full_matrices=False)
    row = out.draws.query("activation == 'tanh' and weights == 'orthogonal' and repeat == 1").iloc[0]
    assert row["s2_over_s1"] == pytest.approx(s[1] / s[0], rel=1e-9)
    assert row["align_u1_q"] == pytest.approx(abs(float(U[:, 0] @ p.data.q.numpy())), abs=1e-9)
    # draw 0 keeps the whole spectrum (G is d x m of rank <= min(n, d))
    p0 = spiked_problem(n, d, m, alpha=0.0, nu=0.75, activation="tanh", weights="orthogonal", seed=4)
    s0 = np.linalg.svd(_autograd_gradient(p0.data.X, p0.y, p0.W, p0.a, p0.gamma, torch.tanh), compute_uv=False)
    np.testing.assert_allclose(out.spectra["tanh", "orthogonal"], s0, rtol=1e-8, atol=1e-14 * s0[0])


def test_configuration_medians_on_a_hand_worked_table():
    draws = pd.DataFrame({
        "activation": ["tanh"] * 4 + ["relu"] * 2, "weights": ["W"] * 6, "repeat": [0, 1, 2, 3, 0, 1],
        "s2_over_s1": [0.05, 0.07, 0.5, 0.02, 0.3, 0.2], "mu_median": [0.2, 0.3, 0.4, 0.0, 0.05, 0.05],
        "diverged": [False, False, True, False, False, False], "collapsed": [False] * 6})
    table = large_spike.configuration_medians(draws, rank_one_threshold=0.1, mu_min=0.1)
    assert list(table["activation"]) == ["tanh", "relu"]  # order of first appearance
    # tanh keeps draws 0, 1, 3 (draw 2 diverged): medians 0.05 and 0.2
    assert table["s2_over_s1"].tolist() == pytest.approx([0.05, 0.25])
    assert table["mu_median"].tolist() == pytest.approx([0.2, 0.05])
    assert table["rank_one"].tolist() == [True, False]
    assert table["assumption4"].tolist() == [True, False]
    assert "repeat" not in table and "diverged" not in table


def test_rank_one_draws_are_the_same_for_one_and_two_workers():
    """Every configuration is seeded by its draw: the tables and spectra of two workers are those of one
    process, value for value, and a row is its own draw's (checked against autograd above)."""
    settings = dict(alpha=0.0, nu=0.75, activations=["tanh", "relu"], weights=["isotropic", "trained"], repeats=2,
                    trained_steps=2, seed=4)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one, two = (large_spike.rank_one_draws(18, 10, 14, workers=w, **settings) for w in (1, 2))
    finally:
        torch.set_num_threads(threads)
    pd.testing.assert_frame_equal(one.draws, two.draws, check_exact=True)
    pd.testing.assert_frame_equal(one.losses, two.losses, check_exact=True)
    assert one.spectra.keys() == two.spectra.keys() == {(a, w) for a in ("tanh", "relu")
                                                        for w in ("isotropic", "trained")}
    for key in one.spectra:
        np.testing.assert_array_equal(one.spectra[key], two.spectra[key])
    assert list(zip(one.draws["activation"], one.draws["weights"], one.draws["repeat"]))[:3] == [
        ("tanh", "isotropic", 0), ("tanh", "isotropic", 1), ("tanh", "trained", 0)]
    # the trained relu draw 1, by hand: W_S trained on its own data (seed 4 + 10), then its statistics
    p = spiked_problem(18, 10, 14, alpha=0.0, nu=0.75, activation="relu", seed=14)
    trained = large_spike.train_on_the_data(p, steps=2, lr_factor=0.25, collapse_threshold=0.9)
    _, stats = rank_one_statistics(trained.problem)
    row = two.draws.query("activation == 'relu' and weights == 'trained' and repeat == 1").iloc[0]
    assert row["s2_over_s1"] == pytest.approx(stats["s2_over_s1"], rel=1e-12)
    assert row["trained_angle_deg"] == pytest.approx(trained.angle_deg, rel=1e-12)
    np.testing.assert_array_equal(two.losses.query("activation == 'relu' and repeat == 1")["loss"], trained.losses)
    with pytest.raises(ValueError, match="workers"):
        large_spike.rank_one_draws(18, 10, 14, workers=0, **settings)
