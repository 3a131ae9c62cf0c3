"""lowrank.square.bounds: the constants of Eqs. 12, 16, 19, 22 and 25 and the Toeplitz norm of conv layers."""

import math

import pytest
import torch
import torch.nn.functional as F

from lowrank.square import bounds
from lowrank.core.nets import normalized


def test_golowich_rademacher_and_confidence_constants():
    assert bounds.golowich_rademacher(2, 100) == pytest.approx((math.sqrt(4 * math.log(2)) + 1) / 10)
    assert bounds.golowich_rademacher(3, 25, radius=2.0) == pytest.approx(2 * (math.sqrt(6 * math.log(2)) + 1) / 5)
    assert bounds.confidence_term(4.0, 50, 0.1) == pytest.approx(3 * math.sqrt(math.log(2 * 25 / 0.1) / 100))


def test_theorem3_terms_add_up():
    b = bounds.theorem3_bound(7.0, 400, 6, delta=0.05)
    r = (math.sqrt(2 * math.log(2) * 6) + 1) / 20
    assert b["complexity_term"] == pytest.approx(2 * 8 * r)
    assert b["bound"] == pytest.approx(b["complexity_term"] + b["confidence_term"])
    assert b["equation"] == "16" and "ramp_term" not in b


def test_bound_decreases_with_n_and_grows_with_rho():
    small = bounds.theorem3_bound(5.0, 100, 4)["bound"]
    assert bounds.theorem3_bound(5.0, 1000, 4)["bound"] < small < bounds.theorem3_bound(50.0, 100, 4)["bound"]


def test_tree_and_dense_rademacher_constants():
    X = torch.full((8, 16), 0.25, dtype=torch.float64)  # ||x_i|| = 1, sqrt(sum ||x||^2) = sqrt(8)
    root = math.sqrt(8) / 8
    for L in (2, 4, 6):
        assert bounds.tree_rademacher(3.0, X, L) == pytest.approx(2**L * 3 * root)
        assert bounds.tree_rademacher(3.0, X, L, constant="eq22") == pytest.approx(2 ** (L - 1) * 3 * root)
        # Eq. 25: the product form equals the closed form 2^(0.25 L^2 + 1.25 L)
        assert bounds.dense_tree_rademacher(3.0, X, L) == pytest.approx(2 ** (0.25 * L**2 + 1.25 * L) * 3 * root)
        ratio = bounds.dense_tree_rademacher(1.0, X, L) / bounds.tree_rademacher(1.0, X, L)
        assert ratio == pytest.approx(2 ** (L * (L + 1) / 4))


def test_theorem4_and_dense_tree_bounds_use_eq12_at_rho_one():
    X = torch.rand(30, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    b19 = bounds.theorem4_bound(12.0, X, 6)
    b25 = bounds.dense_tree_bound(12.0, X, 6)
    assert b19["complexity_term"] == pytest.approx(2 * 13 * bounds.tree_rademacher(1.0, X, 6))
    assert b25["complexity_term"] / b19["complexity_term"] == pytest.approx(2 ** (6 * 7 / 4))
    assert b19["confidence_term"] == b25["confidence_term"] == pytest.approx(bounds.confidence_term(12.0, 30, 0.05))


def test_ramp_loss_and_margin_normalized_rho():
    assert bounds.ramp_loss([-1.0, 0.0, 0.25, 1.0, 3.0]) == pytest.approx((1 + 1 + 0.75 + 0 + 0) / 5)
    assert bounds.margin_normalized_rho([0.5, 0.25, 1.0]) == pytest.approx(4.0)
    assert bounds.margin_normalized_rho([0.5, -0.1]) == math.inf
    b = bounds.theorem3_bound(2.0, 10, 2, margins=[0.5, 1.5])
    assert b["ramp_term"] == pytest.approx(0.25)
    assert b["bound_with_ramp"] == pytest.approx(b["bound"] + 0.25)


@pytest.mark.parametrize("kwargs, match", [
    ({"rho": -1.0, "n": 10, "depth": 2}, "rho"),
    ({"rho": 1.0, "n": 0, "depth": 2}, "N must"),
    ({"rho": 1.0, "n": 10, "depth": 0}, "depth"),
    ({"rho": 1.0, "n": 10, "depth": 2, "delta": 1.5}, "delta"),
])
def test_invalid_inputs_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bounds.theorem3_bound(**kwargs)


def _toeplitz_matrix(w, in_shape, stride, padding):
    """The matrix of a conv layer, column by column from unit inputs."""
    conv = F.conv1d if w.ndim == 3 else F.conv2d
    n = math.prod(in_shape)
    basis = torch.eye(n, dtype=torch.float64).reshape(n, *in_shape)
    return conv(basis, w, stride=stride, padding=padding).reshape(n, -1).T


@pytest.mark.parametrize("shape, in_shape, stride, padding", [
    ((4, 3, 3, 3), (3, 7, 7), 1, 0),
    ((4, 3, 3, 3), (3, 7, 7), 2, 1),
    ((2, 1, 2), (1, 16), 2, 0),
    ((5, 2, 3), (2, 9), 1, 1),
])
def test_toeplitz_frobenius_norm_matches_the_explicit_matrix(shape, in_shape, stride, padding):
    w = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    T = _toeplitz_matrix(w, in_shape, stride, padding)
    assert normalized.toeplitz_frobenius_norm(w, in_shape, stride, padding) == pytest.approx(float(T.norm()), rel=1e-12)


def test_toeplitz_norm_without_padding_is_sqrt_patches_times_filter_norm():
    w = torch.randn(3, 2, 2, dtype=torch.float64)
    assert normalized.toeplitz_frobenius_norm(w, (2, 32), 2, 0) == pytest.approx(math.sqrt(16) * float(w.norm()))


def test_toeplitz_exponent_against_the_exact_toeplitz_norms():
    """log2(rho_toeplitz / rho) of a tree CNN equals L(L-1)/4 (1-D, kernel 2), not Eq. 25's L(L+1)/4."""
    from lowrank.core.nets import normalized

    for L in (3, 5):
        net = normalized.tree_cnn((1, 2**L), kernel_size=2, channels=3, seed=L).double()
        exact = math.log2(net.product_norm("toeplitz") / net.product_norm())
        assert exact == pytest.approx(L * (L - 1) / 4, abs=1e-9)
        assert bounds.toeplitz_exponent(net) == pytest.approx(exact, abs=1e-9)


def test_trained_network_bounds_by_hand():
    import torch

    from lowrank.core.nets import normalized

    g = torch.Generator().manual_seed(0)
    X = torch.rand(10, 1, 16, generator=g, dtype=torch.float64)
    X = X / X.flatten(1).norm(dim=1).max()
    y = torch.tensor([1, -1] * 5)
    tree = normalized.tree_cnn((1, 16), kernel_size=2, channels=2, rho_init=3.0, seed=0).double()
    row = bounds.trained_network_bounds(tree, X, y)
    L, rho, root = 4, tree.product_norm(), float(X.pow(2).sum().sqrt())
    unit = 2.0**L * root / 10
    assert row["eq19"] == pytest.approx(2 * (rho + 1) * unit + 3 * math.sqrt(math.log(2 * (rho + 1) ** 2 / 0.05) / 20))
    assert row["eq25"] / row["eq19"] > 1 and "eq16" not in row
    dense = normalized.mlp(16, [8], rho_init=3.0, seed=0).double()
    row = bounds.trained_network_bounds(dense, X.flatten(1), y)
    r = (math.sqrt(2 * math.log(2) * 2) + 1) / math.sqrt(10)
    assert row["eq16"] == pytest.approx(2 * (dense.product_norm() + 1) * r + 3 * math.sqrt(
        math.log(2 * (dense.product_norm() + 1) ** 2 / 0.05) / 20))


def test_per_init_regression_against_numpy():
    import numpy as np
    import pandas as pd
    from scipy import stats

    g = np.random.default_rng(0)
    runs = pd.DataFrame({"rho_init": np.repeat([0.8, 1.0, 1.2, 1.5], 3), "inv_rho": g.random(12),
                         "test_accuracy": g.random(12)})
    out = bounds.per_init_regression(runs)
    xm = runs.groupby("rho_init").inv_rho.mean().to_numpy()
    ym = runs.groupby("rho_init").test_accuracy.mean().to_numpy()
    slope, intercept = np.polyfit(xm, ym, 1)
    resid = ym - (slope * xm + intercept)
    r2 = 1 - (resid**2).sum() / ((ym - ym.mean()) ** 2).sum()
    se = math.sqrt((resid**2).sum() / 2 / ((xm - xm.mean()) ** 2).sum())
    p = 2 * stats.t.sf(abs(slope / se), df=2)
    assert out["points"] == 4 and out["slope"] == pytest.approx(slope) and out["r2"] == pytest.approx(r2)
    assert out["p"] == pytest.approx(p)
    assert out["p_negative"] == pytest.approx(stats.t.cdf(slope / se, df=2))  # one-sided, H1: slope < 0
    sd = math.sqrt(np.mean([np.var(v, ddof=1) for _, v in runs.groupby("rho_init").inv_rho]))  # 3 runs per group
    assert out["x_resolution"] == pytest.approx((xm.max() - xm.min()) / (sd / math.sqrt(3)))
    assert math.isnan(bounds.per_init_regression(runs[runs.rho_init < 1.1])["p"])


def test_fitted_spearman_ranks_only_the_runs_that_fit():
    import numpy as np

    x = np.array([35, 70, 140, 280, 560.0])
    y = np.array([9.0, 1.0, 7.0, 2.0, 4.0])
    fitted = np.array([True, False, True, True, True])
    out = bounds.fitted_spearman(x, y, fitted)
    rx, ry = np.argsort(np.argsort(x[fitted])), np.argsort(np.argsort(y[fitted]))  # no ties: ranks by argsort
    assert out["rho"] == pytest.approx(np.corrcoef(rx, ry)[0, 1]) and out["rho"] == pytest.approx(-0.8)
    assert (out["fitted"], out["total"], out["degenerate"]) == (4, 5, None)
    assert bounds.fitted_spearman(x, y, np.ones(5, bool))["rho"] == pytest.approx(-0.3)  # the unfitted run would move it


def test_fitted_spearman_measures_nothing_below_three_runs_or_on_a_constant():
    import numpy as np

    two = bounds.fitted_spearman([1, 2, 3], [3, 2, 1], [True, False, True])
    assert math.isnan(two["rho"]) and two["fitted"] == 2 and two["degenerate"].startswith("2 of 3 runs fit: ")
    assert bounds.fitted_spearman([1, 2], [2, 1], [True] * 2, what="fractions have a run that fits")["degenerate"] == (
        "2 of 2 fractions have a run that fits: a Spearman correlation needs at least 3")
    flat = bounds.fitted_spearman([1, 2, 3], [5, 5, 5], [True] * 3)
    assert math.isnan(flat["rho"]) and "constant" in flat["degenerate"]
    none = bounds.fitted_spearman([1, 2], [float("nan"), 1.0], [False, False])  # an unfitted run's NaN is not read
    assert none["fitted"] == 0 and math.isnan(none["rho"])
    with pytest.raises(ValueError, match="non-finite"):
        bounds.fitted_spearman([1, 2, 3], [1, np.nan, 3], [True] * 3)
    with pytest.raises(ValueError, match="one length"):
        bounds.fitted_spearman([1, 2, 3], [1, 2], [True] * 3)


def test_measured_controls_leaves_out_a_control_whose_runs_do_not_fit_and_names_it():
    from lowrank.book import verdicts as V

    fit, unfit, nan = V.Control("fits", -0.2), V.Control("random labels", -0.9), V.Control("no wd", float("nan"))
    kept, left_out, none_left = bounds.measured_controls([(fit, None), (unfit, "1 of 4 runs fit"), (nan, None)])
    assert kept == [fit] and none_left is None
    assert left_out == {"random labels": "1 of 4 runs fit", "no wd": "its statistic is NaN"}
    kept, left_out, none_left = bounds.measured_controls([(unfit, "1 of 4 runs fit")])
    assert kept == [] and none_left == "no negative control left: random labels: 1 of 4 runs fit"
    # without its control the claim is undecided, whatever it measures
    v = V.claim("c", claim_id="X", measured=-1.0, threshold=V.Threshold("<=", -0.8, "fixed in advance"), controls=kept,
                expected="e", scale="ci", degenerate=none_left)
    assert v.outcome == "uninformative"
    assert bounds.measured_controls([]) == ([], {}, None)
