"""Part II's experiment tables: layer averages and the rank-versus-hyperparameter trend."""

import numpy as np
import pandas as pd
import pytest
from scipy.stats import kendalltau

from lowrank.sgd import ranks


def _table():
    rows = []
    for run, (B, r_fc, r_cls) in enumerate([(8, 2, 3), (16, 4, 3), (32, 6, 3)]):
        for epoch in (0, 1):
            for li, (layer, cls, rk) in enumerate([("fc", False, 10 if epoch == 0 else r_fc), ("classifier", True, r_cls)]):
                rows.append({"run": run, "epoch": epoch, "batch_size": B, "layer": layer, "layer_index": li,
                             "classifier": cls, "shape": "3x3", "rank": rk + 1, "rank_frobenius": rk,
                             "stable_rank": 1.0, "weight_norm": 1.0, "spectral_norm": 1.0, "dist": 0.1,
                             "dist_rel": 0.1, "train_acc": 1.0})
    return pd.DataFrame(rows)


def test_average_rank_conventions_and_classifier():
    t = _table()
    fro = ranks.final_values(t, convention="frobenius", include_classifier=False)
    assert fro["avg_rank"].tolist() == [2, 4, 6]
    spec = ranks.final_values(t)  # spectral, classifier included: mean of (r + 1) and 4
    assert spec["avg_rank"].tolist() == [3.5, 4.5, 5.5]
    both = ranks.rank_tables(t)
    assert both.loc[both.epoch == 1, "avg_rank"].tolist() == [2, 4, 6]
    assert both.loc[both.epoch == 1, "avg_rank_spectral"].tolist() == [3.5, 4.5, 5.5]
    only_cls = ranks.average_rank(t, layers=lambda name: name == "classifier")
    assert set(only_cls["avg_rank"]) == {4.0}
    with pytest.raises(ValueError, match="convention"):
        ranks.average_rank(t, convention="nuclear")


def test_rank_trend_against_scipy_and_exclusions():
    rng = np.random.default_rng(0)
    final = pd.DataFrame({"run": range(12), "x": np.tile([1, 2, 4, 8, 16, 32], 2), "g": np.repeat(["a", "b"], 6),
                          "avg_rank": rng.normal(size=12), "train_acc": 1.0})
    res = ranks.rank_trend(final, "x", by="g", sign=-1)
    for key, grp in final.groupby("g"):
        # Spearman without ties equals the Pearson correlation of ranks; check through Kendall's sign too
        rho = np.corrcoef(grp["x"].rank(), grp["avg_rank"].rank())[0, 1]
        assert res["per_group"][key] == pytest.approx(-rho)
        assert np.sign(res["per_group"][key]) == np.sign(-kendalltau(grp["x"], grp["avg_rank"]).statistic)
    assert res["worst"] == min(res["per_group"].values()) and res["excluded"] == 0
    # a diverged run and a run at chance are left out and counted
    final.loc[3, "train_acc"] = 0.1
    res = ranks.rank_trend(final, "x", by="g", sign=-1, diverged=[0], min_train_acc=0.5)
    assert res["excluded"] == 2 and res["total"] == 12 and set(res["final"]["run"]) == set(range(12)) - {0, 3}
    # a constant rank: no trend (0), not NaN
    flat = final.assign(avg_rank=1.0)
    assert ranks.rank_trend(flat, "x", by="g", sign=1)["worst"] == 0.0
    # too few runs left in a group: NaN, not part of worst
    res = ranks.rank_trend(final, "x", by="g", sign=1, diverged=[0, 1, 2, 3], min_points=3)
    assert np.isnan(res["per_group"]["a"]) and res["worst"] == res["per_group"]["b"]
    with pytest.raises(ValueError, match="sign"):
        ranks.rank_trend(final, "x", by="g", sign=0)


def test_spearman_critical_values_match_the_published_table():
    """One-sided 5 % critical values of Spearman's rho (Zar, Biostatistical Analysis, table B.19)."""
    assert ranks.spearman_critical(4) == 1.0
    assert ranks.spearman_critical(5) == pytest.approx(0.9)
    assert ranks.spearman_critical(6) == pytest.approx(0.829, abs=1e-3)
    assert ranks.spearman_critical(7) == pytest.approx(0.714, abs=1e-3)
    assert ranks.spearman_critical(8) == pytest.approx(0.643, abs=1e-3)
    assert ranks.spearman_critical(3) == float("inf")
    with pytest.raises(ValueError):
        ranks.spearman_critical(12)


def test_authors_layers_leave_out_resnet_shortcuts():
    from lowrank.core.nets import conv

    names = [n for n, _ in conv.resnet18(3, 10, width=0.125).weight_specs()]
    kept = [n for n in names if ranks.authors_layers(n)]
    assert len(names) == 21 and len(kept) == 18  # 17 3x3 convolutions and the classifier


def test_rank_bound_is_the_papers_formula_and_k_choice():
    """N B log(1/eps) / (2 mu lambda) with lambda = weight_decay / 2; it bounds N B k for the paper's
    k = ceil(log eps / log(1 - 2 mu lambda)) (l.1143), computed here independently."""
    import math

    final = pd.DataFrame({"batch_size": [8, 32, 8], "lr0": [0.1, 0.1, 0.1], "weight_decay": [5e-3, 5e-3, 0.0]})
    b = ranks.rank_bound(final, eps=1e-3, patches=2)
    assert b["bound"].iloc[0] == pytest.approx(2 * 8 * math.log(1e3) / (0.1 * 5e-3))
    assert b["bound"].iloc[1] == pytest.approx(4 * b["bound"].iloc[0])
    assert math.isinf(b["bound"].iloc[2])
    lam = 5e-3 / 2
    k = math.ceil(math.log(1e-3) / math.log(1 - 2 * 0.1 * lam))
    assert (1 - 2 * 0.1 * lam) ** k <= 1e-3 and 2 * 8 * k <= b["bound"].iloc[0] + 2 * 8
    with pytest.raises(ValueError, match="eps"):
        ranks.rank_bound(final, eps=2)


def test_moving_table_separates_levelling_off_from_falling():
    """d = exp(a e): lambda = 0 falls at a = -0.2; one run levels off (a = 0), one falls as fast as
    lambda = 0 with a larger d (not moving, whatever its size), one collapses."""
    from lowrank.sgd import noise

    rows = []
    for run, (wd, a, scale, norm_end) in enumerate([(0.0, -0.2, 1.0, 1.0), (0.1, 0.0, 1.0, 0.5),
                                                      (0.2, -0.2, 50.0, 0.5), (0.3, -0.5, 1.0, 1e-4)]):
        for e in range(0, 21):
            rows.append({"run": run, "epoch": e, "loss": "ce", "weight_decay": wd, "dist": scale * np.exp(a * e),
                         "weight_norm": 1.0 + (norm_end - 1.0) * e / 20})
    t = noise.moving_table(pd.DataFrame(rows), trend_epochs=8, collapse_tol=1e-2, moving_fraction=0.5)
    assert t["log_d_slope"].round(6).tolist() == [-0.2, 0.0, -0.2, -0.5]
    assert t["moving"].tolist() == [False, True, False, False]
    assert t["collapsed"].tolist() == [False, False, False, True]
    assert t["d_over_zero"].iloc[2] == pytest.approx(50.0)
    assert noise.log_slope([0, 1, 2], [1.0, np.e, np.e**2]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="trend_epochs"):
        noise.moving_table(pd.DataFrame(rows), trend_epochs=1, collapse_tol=1e-2, moving_fraction=0.5)


def test_spearman_permutation_null():
    x = np.arange(8.0)
    rho, null5 = ranks.spearman_with_permutation_null(x, -x, seed=0)
    assert rho == pytest.approx(-1.0)
    # the 5th percentile of the null for n = 8 sits near minus the one-sided 5 % critical value (0.643)
    assert -0.8 < null5 < -0.5
    assert ranks.spearman_with_permutation_null([1, 1, 1], [1, 2, 3]) == (0.0, 0.0)


def test_fitting_correlation_keeps_fitting_runs_only():
    from scipy.stats import spearmanr

    final = pd.DataFrame({"run": range(6), "avg_rank": [1.0, 2, 3, 4, 5, 6],
                          "test_acc": [0.9, 0.8, 0.7, 0.6, 0.99, 0.1], "train_acc": [1.0, 1, 1, 1, 0.5, 1]})
    out = ranks.fitting_correlation(final, fit_threshold=0.99, diverged=[5])
    assert out["fitting"] == 4 and out["runs"] == 6
    assert out["rho"] == pytest.approx(-1.0)  # runs 0-3: rank up, accuracy down
    kept = final[final["run"] != 5]
    assert out["rho_all"] == pytest.approx(spearmanr(kept["avg_rank"], kept["test_acc"]).statistic)
    assert out["test_acc_range"] == [0.6, 0.9]
    none = ranks.fitting_correlation(final, fit_threshold=1.0 + 0.0, diverged=range(6))
    assert none["fitting"] == 0 and none["rho"] == 0.0 and none["test_acc_range"] is None
    with pytest.raises(ValueError, match="fit_threshold"):
        ranks.fitting_correlation(final, fit_threshold=2)
    with pytest.raises(ValueError, match="test_acc"):
        ranks.fitting_correlation(final.drop(columns="test_acc"), fit_threshold=0.5)


def test_collapse_or_moving_share_counts_by_hand():
    from lowrank.sgd import noise

    m = pd.DataFrame({"weight_decay": [0.0, 0.1, 0.1, 0.2, 0.0], "collapsed": [False, True, False, False, False],
                      "moving": [True, False, False, True, False]})
    assert noise.collapse_or_moving_share(m) == (pytest.approx(2 / 3), pytest.approx(0.5))
    with pytest.raises(ValueError, match="lambda = 0"):
        noise.collapse_or_moving_share(m[m["weight_decay"] > 0])
    with pytest.raises(ValueError, match="moving"):
        noise.collapse_or_moving_share(m.drop(columns="moving"))
