"""Fig. 8's cases (lowrank.gradients.real_data.gradient_cases, rule_call) against autograd gradients of
the loss and of the Jacobian penalty written out, and the residue statistic by hand."""

import math

import numpy as np
import pytest
import torch

from lowrank.gradients import real_data, regularization, rule_of_thumb


def _problem():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(40, 12, generator=g, dtype=torch.float64) + 3.0 * torch.randn(40, 1, generator=g,
                                                                                   dtype=torch.float64)
    y = torch.where(torch.randn(40, generator=g) > 0, 1.0, -1.0).to(torch.float64)
    p = real_data.real_problem(X, y, width=15, activation="softplus", seed=2)
    return p, real_data.estimate_nu_alpha(X, fit_range=(1, None))


def _autograd(X, y, W, a, gamma, lam=0.0):
    """d/dW of mean (f - y)^2 / 2 + (lam / 2n) sum_i ||x_i||^2 sum_j gamma^2 a_j^2 sigma'(w_j^T x_i)^2."""
    W = W.clone().requires_grad_(True)
    pre = X @ W.T
    f = gamma * torch.nn.functional.softplus(pre) @ a
    penalty = lam / (2 * X.shape[0]) * ((X * X).sum(1)[:, None] * gamma**2 * a**2 * torch.sigmoid(pre) ** 2).sum()
    (g,) = torch.autograd.grad(0.5 * ((f - y) ** 2).mean() + penalty, W)
    return g.T, (f - y).detach()


def _beta(z, r, d):
    return -2 * math.log(abs(float(z @ r)) / (math.sqrt(len(r)) * float(r.norm()))) / math.log(d)


def test_gradient_cases_against_autograd():
    p, fit = _problem()
    D = p.data
    cases = real_data.gradient_cases(p, fit, noise_tau2=4.0, noise_seed=7, jacobian_lambda=50.0)
    assert list(cases) == ["plain", "input noise", "Jacobian penalty"]
    G, r = _autograd(D.X, p.y, p.W, p.a, p.gamma)
    plain = cases["plain"]
    assert torch.allclose(plain.G, G, atol=1e-12 * float(G.abs().max()))
    assert torch.allclose(plain.residue_direction, D.X_B.T @ r, rtol=1e-10, atol=1e-12)
    assert plain.beta == pytest.approx(_beta(D.z, r, 12), rel=1e-10)
    assert plain.case_rule == rule_of_thumb.rule_of_thumb(fit.nu, fit.alpha, plain.beta)
    penalised = cases["Jacobian penalty"]
    G_pen, _ = _autograd(D.X, p.y, p.W, p.a, p.gamma, lam=50.0)
    assert torch.allclose(penalised.G, G_pen, atol=1e-10 * float(G_pen.abs().max()))
    assert penalised.fit is fit and set(penalised.norms) == {"S1", "S3"}
    assert penalised.case_rule == rule_of_thumb.rule_of_thumb(fit.nu, fit.alpha, plain.beta, large_jacobian_penalty=True)
    noisy = regularization.noisy_problem(p, 4.0, seed=7)  # the noisy inputs; everything else by hand
    G_noise, r_noise = _autograd(noisy.data.X, p.y, p.W, p.a, p.gamma)
    case = cases["input noise"]
    assert torch.allclose(case.G, G_noise, atol=1e-12 * float(G_noise.abs().max()))
    assert torch.allclose(case.residue_direction, noisy.data.X_B.T @ r_noise, rtol=1e-10, atol=1e-12)
    assert case.fit.nu == pytest.approx(real_data.estimate_nu_alpha(noisy.data.X).nu)
    assert case.beta == pytest.approx(_beta(noisy.data.z, r_noise, 12), rel=1e-10)
    assert set(real_data.gradient_cases(p, fit)) == {"plain"}


def test_rule_call_reads_the_top_singular_vector():
    p, fit = _problem()
    case = real_data.gradient_cases(p, fit)["plain"]
    row = real_data.rule_call(case, p.data.q)
    U, s, _ = np.linalg.svd(case.G.numpy(), full_matrices=False)
    res = case.residue_direction.numpy()
    assert row["align_u1_residue"] == pytest.approx(abs(U[:, 0] @ res) / np.linalg.norm(res), abs=1e-9)
    assert row["align_u1_q"] == pytest.approx(abs(U[:, 0] @ p.data.q.numpy()), abs=1e-9)
    assert row["s2_over_s1"] == pytest.approx(s[1] / s[0], rel=1e-9)
    assert row["agree"] == (row["measured"] == row["rule"])
    assert row["rule"] == rule_of_thumb.rule_of_thumb(fit.nu, fit.alpha, case.beta)
