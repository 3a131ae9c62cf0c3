"""Part II's experiment tables: layer averages and the rank-versus-hyperparameter trend."""

import math

import numpy as np
import pandas as pd
import pytest

from lowrank.sgd import ranks


def _table():
    rows = []
    for run, (B, r_fc, r_cls) in enumerate([(8, 2, 3), (16, 4, 3), (32, 6, 3)]):
        for epoch in (0, 1):
            for li, (layer, cls, rk) in enumerate([("fc", False, 10 if epoch == 0 else r_fc), ("classifier", True, r_cls)]):
                rows.append({"run": run, "epoch": epoch, "batch_size": B, "layer": layer, "layer_index": li,
                             "classifier": cls, "shape": "3x3", "rank_spectral": rk + 1, "rank_frobenius": rk,
                             "stable_rank": 1.0, "weight_norm": 1.0, "spectral_norm": 1.0, "dist": 0.1,
                             "dist_rel": 0.1, "train_acc": 1.0})
    return pd.DataFrame(rows)


def test_average_rank_norms_and_classifier():
    t = _table()
    fro = ranks.final_values(t, norm="frobenius", include_classifier=False)
    assert fro["avg_rank"].tolist() == [2, 4, 6]
    spec = ranks.final_values(t)  # spectral, classifier included: mean of (r + 1) and 4
    assert spec["avg_rank"].tolist() == [3.5, 4.5, 5.5]
    both = ranks.rank_tables(t)
    assert both.loc[both.epoch == 1, "avg_rank"].tolist() == [2, 4, 6]
    assert both.loc[both.epoch == 1, "avg_rank_spectral"].tolist() == [3.5, 4.5, 5.5]
    only_cls = ranks.average_rank(t, layers=lambda name: name == "classifier")
    assert set(only_cls["avg_rank"]) == {4.0}
    with pytest.raises(ValueError, match="norm"):
        ranks.average_rank(t, norm="nuclear")


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
    """d = exp(a e) over epochs 0..20, window [t/2, t] = epochs 10..20: ce's lambda = 0 run falls at
    a = -0.2 (by e^2 = 7.4 > 2: settled), one run levels off (a = 0: moving), one falls as fast
    with a larger d (settled, whatever its size), one collapses; mse's lambda = 0 run levels off and
    so counts as moving by the same criterion (the control is not 0 by construction)."""
    from lowrank.sgd import noise

    rows = []
    for run, (loss, wd, a, scale, norm_end) in enumerate([("ce", 0.0, -0.2, 1.0, 1.0), ("ce", 0.1, 0.0, 1.0, 0.5),
                                                            ("ce", 0.2, -0.2, 50.0, 0.5), ("ce", 0.3, -0.5, 1.0, 1e-4),
                                                            ("mse", 0.0, -0.05, 1.0, 1.0), ("mse", 0.1, 0.0, 1.0, 0.5)]):
        for e in range(0, 21):
            rows.append({"run": run, "epoch": e, "loss": loss, "weight_decay": wd, "dist": scale * np.exp(a * e),
                         "weight_norm": 1.0 + (norm_end - 1.0) * e / 20})
    t = noise.moving_table(pd.DataFrame(rows), collapse_tol=1e-2, settle_factor=2.0)
    assert t["log_d_slope"].round(6).tolist() == [-0.2, 0.0, -0.2, -0.5, -0.05, 0.0]
    assert t["d_fall"].tolist() == pytest.approx(np.exp([2.0, 0.0, 2.0, 5.0, 0.5, 0.0]))
    assert set(t["window"]) == {"10-20"}
    assert t["moving"].tolist() == [False, True, False, False, True, True]
    assert t["collapsed"].tolist() == [False, False, False, True, False, False]
    assert t["d_over_zero"].iloc[2] == pytest.approx(50.0)
    assert noise.collapse_or_moving_share(t) == (pytest.approx(3 / 4), pytest.approx(1 / 2))
    assert noise.log_slope([0, 1, 2], [1.0, np.e, np.e**2]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="window_start"):
        noise.moving_table(pd.DataFrame(rows), window_start=1.0, collapse_tol=1e-2, settle_factor=2.0)
    with pytest.raises(ValueError, match="settle_factor"):
        noise.moving_table(pd.DataFrame(rows), collapse_tol=1e-2, settle_factor=1.0)


def test_moving_window_scales_with_the_run():
    """d = t^(-1) (a lambda = 0 run that keeps settling as a power law): over [t/2, t] it falls by 2 at
    any length t, so the same criterion classifies it alike at 40 and at 400 epochs (brute force: the
    least-squares slope of log d on the window's epochs, numpy's polyfit); a fixed 10-epoch window
    would call it settled at 40 epochs and moving at 400."""
    from lowrank.sgd import noise

    for t in (40, 400):
        rows = [{"run": r, "epoch": e, "loss": "ce", "weight_decay": wd, "dist": (e + 1.0) ** -1.0, "weight_norm": 1.0}
                for r, wd in ((0, 0.0), (1, 0.1)) for e in range(t + 1)]
        got = noise.moving_table(pd.DataFrame(rows), collapse_tol=1e-2, settle_factor=1.5)
        e = np.arange(t // 2, t + 1)
        slope = np.polyfit(e, np.log((e + 1.0) ** -1.0), 1)[0]
        assert got["d_fall"].iloc[0] == pytest.approx(np.exp(-slope * (t - t // 2)))
        assert 1.5 < got["d_fall"].iloc[0] < 2.5 and not got["moving"].iloc[0]
    kept, out = noise.in_regime(got.assign(A=[0.0, 3.0]), needed=5.0)
    assert out == 1 and kept["weight_decay"].tolist() == [0.0]


def test_spearman_permutation_null():
    x = np.arange(8.0)
    rho, null5 = ranks.spearman_with_permutation_null(x, -x, seed=0)
    assert rho == pytest.approx(-1.0)
    # the 5th percentile of the null for n = 8 sits near minus the one-sided 5 % critical value (0.643)
    assert -0.8 < null5 < -0.5
    assert ranks.spearman_with_permutation_null([1, 1, 1], [1, 2, 3]) == (0.0, 0.0)


def test_spearman_null_p_against_exact_enumeration():
    from itertools import permutations

    from scipy.stats import spearmanr

    x = np.array([1.0, 3, 2, 5, 4, 6])
    y = np.array([0.9, 0.7, 0.8, 0.65, 0.75, 0.5])
    rho = spearmanr(x, y).statistic
    exact = np.mean([spearmanr(np.array(p), y).statistic <= rho + 1e-12 for p in permutations(x)])
    got = ranks.spearman_null_p(x, y, seed=0, permutations=2000)
    assert got == pytest.approx(exact, abs=0.02)  # 2000 shuffles: sampling sd about 0.004 at p ~ 0.03
    assert ranks.spearman_null_p(x, -y, seed=0) > 0.9  # a positive rho is no evidence of a negative one
    assert ranks.spearman_null_p([1, 1, 1], [1, 2, 3]) == 1.0


def test_room_to_move_compares_the_grid_spread_with_the_seed_spread_by_hand():
    rng = np.random.default_rng(3)
    B = np.repeat([16, 32, 64, 128], 3)
    wide = pd.DataFrame({"batch_size": B, "avg_rank": B / 16 + rng.normal(0, 0.1, 12), "test_acc": 0.9 - B / 1e4})
    got = ranks.room_to_move(wide, by="batch_size")
    for c in ("avg_rank", "test_acc"):
        per = [wide.loc[wide["batch_size"] == b, c] for b in (16, 32, 64, 128)]
        between = max(p.mean() for p in per) - min(p.mean() for p in per)
        within = sum(p.max() - p.min() for p in per) / 4
        assert got[c]["between"] == pytest.approx(between, abs=1e-6) and got[c]["within"] == pytest.approx(within, abs=1e-6)
    assert got["room"] and got["reason"] is None
    noisy = wide.assign(test_acc=0.95 + rng.normal(0, 0.01, 12))  # seeds move the accuracy as much as B does
    flat = ranks.room_to_move(noisy, by="batch_size")
    assert not flat["room"] and "test_acc spans" in flat["reason"] and "avg_rank" not in flat["reason"]
    assert flat["test_acc"]["between"] <= flat["test_acc"]["within"]
    assert not ranks.room_to_move(wide[wide["batch_size"] == 16], by="batch_size")["room"]
    single = ranks.room_to_move(wide.drop_duplicates("batch_size"), by="batch_size")
    assert not single["room"] and "no seed spread" in single["reason"]


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
    assert out["null_p"] == pytest.approx(ranks.spearman_null_p([1.0, 2, 3, 4], [0.9, 0.8, 0.7, 0.6]))
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


# --- the shared rank experiment: regime, pooled trend, batch-size effect


def test_accumulated_weight_decay_is_the_sum_over_steps_and_the_papers_cifar_value():
    # by a loop over every step of the schedule
    lr, wd, beta, B, n, epochs, milestones = 0.1, 5e-3, 0.9, 16, 1437, 30, (10, 20)
    total = 0.0
    for epoch in range(1, epochs + 1):
        mu = lr * 0.1 ** sum(epoch > m for m in milestones)
        for _ in range(n // B):
            total += mu * wd / (1 - beta)
    got = ranks.accumulated_weight_decay(lr=lr, weight_decay=wd, momentum=beta, batch_size=B, n_train=n, epochs=epochs,
                                         milestones=milestones)
    assert got == pytest.approx(total, rel=1e-12)
    # the paper's CIFAR-10 runs (l.547): 390 steps per epoch at B = 128, 500 epochs, x0.1 at 60, 100, 200
    paper = ranks.accumulated_weight_decay(lr=0.1, weight_decay=5e-4, momentum=0.9, batch_size=128, n_train=50_000,
                                           epochs=500, milestones=(60, 100, 200))
    assert paper == pytest.approx(390 * (60 * 0.1 + 40 * 0.01 + 100 * 1e-3 + 300 * 1e-4) * 5e-4 / 0.1)
    assert 12 < paper < 14
    assert ranks.per_step_decay(lr=0.1, weight_decay=5e-3, momentum=0.9) == pytest.approx(5e-3)
    with pytest.raises(ValueError, match="momentum"):
        ranks.per_step_decay(lr=0.1, weight_decay=5e-3, momentum=1.0)
    with pytest.raises(ValueError, match="batch_size"):
        ranks.accumulated_weight_decay(lr=0.1, weight_decay=1e-3, momentum=0, batch_size=0, n_train=10, epochs=1)


def test_accumulated_weight_decay_is_the_log_shrink_of_heavy_ball_decay_alone():
    """With no gradient, SGD with momentum and coupled decay shrinks a weight by about exp(-A)."""
    lr, wd, beta, steps = 0.05, 1e-3, 0.9, 4000
    w, buf = 1.0, 0.0
    for _ in range(steps):
        buf = beta * buf + wd * w
        w -= lr * buf
    A = ranks.accumulated_weight_decay(lr=lr, weight_decay=wd, momentum=beta, batch_size=1, n_train=steps, epochs=1)
    assert A == pytest.approx(2.0)
    assert -np.log(w) == pytest.approx(A, rel=0.02)


def test_experiment_grid_and_regime_table():
    grid = ranks.experiment_grid(batch_sizes=[16, 32], lrs=[0.1], weight_decays=[0.0, 1e-3], momenta=[0.9], seeds=[0, 1, 2])
    assert len(grid) == 12 and grid[0] == {"batch_size": 16, "lr": 0.1, "weight_decay": 0.0, "momentum": 0.9, "seed": 0}
    reg = ranks.regime_table(grid, n_train=320, epochs=2)
    assert reg.loc[reg.weight_decay == 0, "A"].eq(0).all()
    one = reg[(reg.batch_size == 32) & (reg.weight_decay > 0)].iloc[0]
    assert one["A"] == pytest.approx(10 * 2 * 0.1 * 1e-3 / 0.1) and one["per_step"] == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="seed"):
        ranks.experiment_grid(batch_sizes=[16], lrs=[0.1], weight_decays=[0.0], momenta=[0.0], seeds=[])


def _slices(values, x=(1, 2, 4, 8, 16), fitted=None):
    rows = [{"x": xv, "s": s, "rank": v, "fitted": True} for s, vals in enumerate(values) for xv, v in zip(x, vals)]
    out = pd.DataFrame(rows)
    if fitted is not None:
        out["fitted"] = fitted
    return out


def test_pooled_trend_is_the_mean_of_scipys_per_slice_spearman():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(1)
    values = rng.normal(size=(4, 5)).round(1)
    values[2] = 7.0  # a slice where every run has the same rank: rho 0
    final = _slices(values)
    got = ranks.pooled_trend(final, "x", column="rank", slices="s", sign=-1, permutations=200)
    expected = [-spearmanr([1, 2, 4, 8, 16], v).statistic if np.unique(v).size > 1 else 0.0 for v in values]
    assert got["statistic"] == pytest.approx(np.mean(expected))
    assert got["per_slice"]["rho"].tolist() == pytest.approx(expected)
    assert got["slices"] == 4 and got["excluded"] == 0 and got["dropped_slices"] == 0


def test_pooled_trend_leaves_out_unfitted_runs_and_thin_slices():
    fitted = [True] * 5 + [True, True, False, False, False] + [False, True, True, True, True]
    final = _slices([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [5, 4, 3, 2, 1]], fitted=fitted)
    got = ranks.pooled_trend(final, "x", column="rank", slices=["s"], sign=+1, permutations=100)
    assert got["excluded"] == 4 and got["total"] == 15
    assert got["dropped_slices"] == 1 and got["slices"] == 2  # slice 1 has 2 fitted runs left
    assert got["statistic"] == pytest.approx((1.0 - 1.0) / 2)
    with pytest.raises(ValueError, match="sign"):
        ranks.pooled_trend(final, "x", column="rank", slices="s", sign=0)
    with pytest.raises(ValueError, match="column"):
        ranks.pooled_trend(final, "x", column="nope", slices="s", sign=1)


def test_pooled_trend_null_matches_the_exact_permutation_distribution():
    """One slice of 5 distinct values: the null is Spearman's exact permutation distribution (120
    orderings), whose 95th percentile and tail share the shuffles must reproduce."""
    import itertools

    from scipy.stats import spearmanr

    y = [3.0, 1.0, 4.0, 1.5, 9.0]
    exact = np.array([spearmanr(p, y).statistic for p in itertools.permutations([1, 2, 4, 8, 16])])
    got = ranks.pooled_trend(_slices([y]), "x", column="rank", slices="s", sign=+1, permutations=20_000, seed=3)
    assert got["null_95"] == pytest.approx(np.percentile(exact, 95), abs=0.051)  # rho moves in steps of 0.05
    assert got["p_value"] == pytest.approx(np.mean(exact >= got["statistic"] - 1e-12), abs=0.01)
    # a planted perfect trend over several slices is far outside the null; a reversed one far below
    perfect = ranks.pooled_trend(_slices([[1, 2, 3, 4, 5]] * 4), "x", column="rank", slices="s", sign=+1)
    assert perfect["statistic"] == 1.0 and perfect["null_95"] < 0.6 and perfect["p_value"] < 0.01
    reverse = ranks.pooled_trend(_slices([[1, 2, 3, 4, 5]] * 4), "x", column="rank", slices="s", sign=-1)
    assert reverse["statistic"] == -1.0 and reverse["p_value"] == 1.0


def test_batch_effect_ratio_by_hand():
    rows = []
    # seed means: lambda 0 -> (60, 61); lambda 1e-3 -> (50, 58); lambda 1e-2 -> (20, 40)
    for wd, (a, b) in {0.0: (60, 61), 1e-3: (50, 58), 1e-2: (20, 40)}.items():
        for B, mean in ((16, a), (32, b)):
            rows += [{"weight_decay": wd, "batch_size": B, "avg_rank": mean + d, "fitted": True} for d in (-1, 1)]
    rows.append({"weight_decay": 1e-2, "batch_size": 32, "avg_rank": 0.0, "fitted": False})  # left out
    got = ranks.batch_effect_ratio(pd.DataFrame(rows))
    assert got["range_at_zero"] == 1 and got["largest_range"] == 20
    assert got["ratio"] == pytest.approx(1 / 20) and got["control_ratio"] == pytest.approx(8 / 20)
    assert got["smallest_positive"] == 1e-3
    # the control inside the regime: the smallest lambda > 0 whose fitted runs all reach A >= 5
    table = pd.DataFrame(rows).assign(A=lambda d: d["weight_decay"] * 1000 / d["batch_size"] * 16)  # 1e-3: 1, 0.5; 1e-2: 10, 5
    inside = ranks.batch_effect_ratio(table, regime_needed=5.0)
    assert inside["control_weight_decay"] == 1e-2 and inside["control_ratio"] == pytest.approx(20 / 20)
    assert inside["control_A"] == pytest.approx(5.0) and inside["control_in_regime"]
    assert inside["ratio"] == got["ratio"]
    outside = ranks.batch_effect_ratio(table, regime_needed=50.0)
    assert outside["control_weight_decay"] == 1e-3 and not outside["control_in_regime"] and outside["control_A"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="weight decay 0"):
        ranks.batch_effect_ratio(pd.DataFrame(rows).query("weight_decay > 0"))


def test_rank_experiment_trains_the_grid_together_and_records_both_thresholds():
    grid = ranks.experiment_grid(batch_sizes=[64, 128], lrs=[0.1], weight_decays=[0.0, 5e-3], momenta=[0.9], seeds=[0, 1])
    kw = dict(model="MLP-BN-2-16", dataset="digits", grid=grid, epochs=2, eps=1e-3, coarse_eps=1e-1, min_train_acc=0.5)
    before = ranks.rank_experiment(**kw, regime_only=True)
    assert set(before) == {"regime", "coarse_column"} and len(before["regime"]) == 8
    got = ranks.rank_experiment(**kw)
    final = got["final"].sort_values("run")
    assert len(final) == 8 and got["coarse_column"] == "avg_rank@0.1"
    assert (final[got["coarse_column"]] <= final["avg_rank"]).all()  # a coarser threshold counts fewer values
    for _, row in final.iterrows():
        assert row["A"] == pytest.approx(ranks.accumulated_weight_decay(
            lr=row["lr0"], weight_decay=row["weight_decay"], momentum=row["momentum"], batch_size=int(row["batch_size"]),
            n_train=1437, epochs=2))
    assert final["fitted"].tolist() == (final["train_acc"] >= 0.5).tolist()
    with pytest.raises(ValueError, match="coarse_eps"):
        ranks.rank_experiment(**(kw | {"coarse_eps": 1e-3}))
    # evaluating only at the start and the end trains the same networks: the same final table
    dense = ranks.rank_experiment(**(kw | {"epochs": 3}))
    assert dense["avg"]["train_acc"].notna().all()
    for options, epochs in (({"eval_every": 3}, [0, 3]), ({"eval_every": 3, "eval_initial": False}, [3])):
        sparse = ranks.rank_experiment(**(kw | {"epochs": 3}), **options)
        pd.testing.assert_frame_equal(sparse["final"], dense["final"])
        assert sorted(sparse["avg"].dropna(subset=["train_acc"])["epoch"].unique().tolist()) == epochs


def test_pooled_trend_claim_outcomes_follow_regime_and_controls():
    from lowrank.book import rank_trends, verdicts

    trend = _slices([[1, 2, 3, 4, 5]] * 4).assign(per_step=1e-3, full_rank=10.0, weight_decay=1e-3, A=8.0)
    flat = _slices([[5, 5, 5, 5, 5]] * 4).assign(per_step=0.0, full_rank=10.0, weight_decay=0.0, A=0.0)
    regime = pd.DataFrame({"weight_decay": [0.0, 1e-3], "A": [0.0, 8.0]})
    planned = rank_trends.decay_regime(regime, needed=5.0, origin="test")
    assert planned.value == 8.0 and planned.reached
    kw = dict(claim_id="II-3", scale="ci", x="x", slices="s", sign=+1, column="rank", eps=1e-3, min_trend=0.5, min_drop_fraction=0.1,
              paper="l.1", description="d", min_train_acc=0.5, control_name="lambda = 0", permutations=500)
    agrees = rank_trends.pooled_trend_claim("t1", final=trend, control=flat, **kw)
    assert agrees.outcome == "agrees" and agrees.controls[0]["value"] == 0.0
    assert agrees.measured == pytest.approx(min(1.0 / 0.5, 0.4 / 0.1))  # rho 1; fall 5 - 1 = 4 of full rank 10
    assert agrees.details["spearman"] == 1.0 and agrees.details["drop_fraction"] == pytest.approx(0.4)
    assert agrees.details["regime"]["value"] == 8.0 and agrees.details["regime"]["needed"] == pytest.approx(np.log(1e3))
    assert rank_trends.pooled_trend_claim("t2", final=trend, control=trend, **kw).outcome == "uninformative"
    assert rank_trends.pooled_trend_claim("t3", final=flat.assign(weight_decay=1e-3, A=8.0), control=flat, **kw).outcome == "disagrees"
    short = rank_trends.pooled_trend_claim("t4", final=trend.assign(A=3.0), control=flat, **kw)
    assert short.outcome == "needs a larger scale" and short.details["regime"]["value"] == 3.0
    with pytest.raises(ValueError, match="'A'"):
        rank_trends.pooled_trend_claim("noA", final=trend.drop(columns="A"), **kw)


def test_pooled_trend_claim_with_no_fitted_run_is_undecided_and_counts_them():
    """Every run below the train-accuracy floor (as the reduced conv nets at ci): no slice enters the
    statistic, so the claim is judged on the planned regime: "uninformative" when the grid reaches it
    (a collapse a longer run would not mend), "needs a larger scale" when it does not (runs too short to
    fit); every run counted as excluded, with or without a control, and no number is invented."""
    from lowrank.book import rank_trends, verdicts

    dead = _slices([[1, 2, 3, 4, 5]] * 3).assign(per_step=1e-3, full_rank=10.0, weight_decay=1e-3, A=9.0, fitted=False)
    kw = dict(claim_id="II-7", scale="ci", x="x", slices="s", sign=+1, column="rank", eps=1e-3, min_trend=0.5,
              min_drop_fraction=0.1, paper="l.1", description="d", min_train_acc=0.8, permutations=200)
    for control in (None, dead.assign(weight_decay=0.0, A=0.0)):
        v = rank_trends.pooled_trend_claim("dead", final=dead, control=control, control_name="lambda = 0", **kw)
        assert v.outcome == "uninformative"
        assert v.details["regime"]["value"] == 9.0 and v.details["slices"] == 0 and v.details["slice_regime"] == []
        assert (v.excluded["count"], v.excluded["total"]) == (15, 15)
        assert v.details["null_p"] is None and v.details["spearman"] is None
        assert not any("shuffled" in c["name"] for c in v.controls), "no null judged on no runs"
        assert np.isnan(v.measured) and v.controls == [], "a control with no fitted run is not recorded as failing"
    short = rank_trends.pooled_trend_claim("short", final=dead.assign(A=1.0), control=None, control_name="lambda = 0", **kw)
    assert short.outcome == verdicts.LARGER_SCALE and short.details["regime"]["value"] == 1.0
    # one slice fitted and in the regime: decided again, the others' runs counted as excluded
    live = dead.assign(fitted=dead["s"] == 0)
    v = rank_trends.pooled_trend_claim("live", final=live, control=dead.assign(weight_decay=0.0, A=0.0, rank=5.0, fitted=True),
                                       control_name="lambda = 0", **kw)
    assert v.outcome == "agrees" and v.details["slices"] == 1 and v.excluded["count"] == 10


def test_untrained_trend_claim_needs_a_larger_scale_with_the_trained_claims_threshold():
    """A grid left untrained because its planned regime is out of reach (the conv sweeps at ci): "needs a
    larger scale", NaN, no control, the same threshold as the trained claim; refused when the regime is reached."""
    from lowrank.book import rank_trends, verdicts

    kw = dict(claim_id="II-7", scale="ci", min_trend=0.5, min_drop_fraction=0.1, paper="l.1", description="d")
    short = rank_trends.decay_regime(pd.DataFrame({"weight_decay": [0.0, 1e-2], "A": [0.0, 0.03]}), needed=6.9, origin="test")
    v = rank_trends.untrained_trend_claim("untrained", planned=short, **kw)
    assert v.outcome == verdicts.LARGER_SCALE and math.isnan(v.measured) and v.controls == []
    assert v.details["trained"] is False and v.details["regime"]["value"] == pytest.approx(0.03)
    trend = _slices([[1, 2, 3, 4, 5]] * 4).assign(per_step=1e-3, full_rank=10.0, weight_decay=1e-3, A=8.0)
    trained = rank_trends.pooled_trend_claim("trained", final=trend, x="x", slices="s", sign=+1, column="rank", eps=1e-3,
                                             min_train_acc=0.5, permutations=200, **kw)
    assert v.threshold == trained.threshold
    reached = rank_trends.decay_regime(pd.DataFrame({"weight_decay": [1e-2], "A": [8.0]}), needed=6.9, origin="test")
    with pytest.raises(ValueError, match="planned regime is reached"):
        rank_trends.untrained_trend_claim("reached", planned=reached, **kw)


def test_pooled_trend_regime_is_over_the_fitted_runs_of_each_used_slice():
    """The regime counts no excluded run: a collapsed run with the largest A sets neither its slice's
    A_max nor the claim's regime, which is the smallest A_max over the used slices (brute force)."""
    from lowrank.book import rank_trends

    rng = np.random.default_rng(4)
    final = _slices(rng.normal(size=(3, 5)).round(2)).assign(weight_decay=lambda d: d["x"] * 1e-3, full_rank=10.0,
                                                              per_step=1e-3)
    final["A"] = final["x"] * (1 + final["s"])  # x = 16 carries the largest A of every slice
    final.loc[(final["s"] == 1) & (final["x"] == 16), "fitted"] = False  # a collapsed run at the slice's largest A
    final.loc[final["s"] == 2, "fitted"] = [True, True, False, False, False]  # slice 2: too few runs, not used
    got = ranks.pooled_trend(final, "x", column="rank", slices="s", sign=-1, permutations=50)
    brute = {}
    for s_, g in final[final["fitted"]].groupby("s"):
        if len(g) >= 3:
            brute[s_] = g.loc[g["weight_decay"] > 0, "A"].max()
    assert dict(zip(got["per_slice"]["s"], got["per_slice"]["A_max"])) == pytest.approx(brute)
    assert brute[1] == 8 * 2  # the excluded run's A = 32 does not count
    regime, record = rank_trends.slice_regime(got["per_slice"], needed=5.0, origin="o")
    assert regime.value == pytest.approx(min(brute.values())) and [r["s"] for r in record] == [0, 1]


def test_pooled_trend_drop_is_measured_within_each_slice():
    """A slice that lost its extreme run is measured between its own ends: brute force per slice."""
    values = [[10.0, 8.0, 6.0, 4.0, 2.0], [10.0, 9.0, 8.0, 7.0, 1.0]]
    final = _slices(values)
    final.loc[(final["s"] == 1) & (final["x"] == 16), "fitted"] = False  # slice 1 ends at x = 8
    got = ranks.pooled_trend(final, "x", column="rank", slices="s", sign=-1, permutations=300, seed=2)
    brute = []
    for _, g in final[final["fitted"]].groupby("s"):
        lo, hi = g["x"].min(), g["x"].max()
        brute.append(g.loc[g["x"] == lo, "rank"].mean() - g.loc[g["x"] == hi, "rank"].mean())
    assert got["drop"] == pytest.approx(np.mean(brute)) and got["drop"] == pytest.approx((8 + 3) / 2)
    # the global ends would have measured slice 1 at x = 1 only: (8 + ...) differs
    assert got["drop"] != pytest.approx(np.mean([10, 10]) - 2.0)


def test_shuffled_label_control_is_judged_by_the_p_value_of_the_observed_score():
    """One slice of five runs: the combined score's exact permutation p-value (120 orderings, scipy's
    Spearman and the fall recomputed by hand) is what the control records; a perfect trend is outside
    its null (the control fails), a score of a noisy slice inside it (the control passes)."""
    import itertools

    from scipy.stats import spearmanr

    from lowrank.book import rank_trends, verdicts

    x = [1, 2, 4, 8, 16]
    kw = dict(claim_id="II-3", scale="ci", x="x", slices="s", sign=+1, column="rank", eps=1e-2, min_trend=0.5,
              min_drop_fraction=0.1, paper="l.1", description="d", min_train_acc=0.5, permutations=20_000, seed=5)
    for y in ([1.0, 2.0, 3.0, 4.0, 5.0], [3.0, 1.0, 4.0, 1.5, 2.0]):
        final = _slices([y]).assign(weight_decay=1e-3, A=9.0, per_step=1e-3, full_rank=10.0)
        got = rank_trends.pooled_trend_claim("p", final=final, **kw)

        def score(order):
            ys = np.asarray(y)[list(order)]
            return min(spearmanr(x, ys).statistic / 0.5, (ys[-1] - ys[0]) / 10.0 / 0.1)

        observed = score(range(5))
        exact = np.array([score(p) for p in itertools.permutations(range(5))])
        p_exact = np.mean(exact >= observed - 1e-12)
        control = got.controls[-1]
        assert got.measured == pytest.approx(observed)
        assert control["p_value"] == pytest.approx(p_exact, abs=0.01)
        assert control["passes"] == (control["p_value"] > verdicts.NULL_ALPHA)
    assert p_exact > 0.05 and control["passes"]  # the noisy slice: the null explains it


def test_regime_from_bound_is_log_one_over_eps():
    assert ranks.regime_from_bound(1e-3) == pytest.approx(6.907755, abs=1e-6)
    assert ranks.regime_from_bound(1e-2) == pytest.approx(4.60517, abs=1e-5)
    # (1 - mu lambda)^k reaches eps after A = mu lambda k = ln(1/eps) accumulated, for a small step
    mu_lam = 1e-5
    k = ranks.regime_from_bound(1e-3) / mu_lam
    assert (1 - mu_lam) ** k == pytest.approx(1e-3, rel=1e-4)
    with pytest.raises(ValueError):
        ranks.regime_from_bound(1.0)


def test_pooled_trend_drop_is_the_signed_fall_of_the_mean_rank_across_the_grid():
    values = [[1, 2, 3, 4, 5], [3, 2, 5, 4, 9]]  # means at x = 1: 2, at x = 16: 7
    up = ranks.pooled_trend(_slices(values), "x", column="rank", slices="s", sign=+1, permutations=4000, seed=1)
    assert up["drop"] == pytest.approx(5.0)
    down = ranks.pooled_trend(_slices(values), "x", column="rank", slices="s", sign=-1, permutations=10)
    assert down["drop"] == pytest.approx(-5.0)
    # under shuffled labels the fall is centred on 0 and each shuffle's value is a difference of two runs' means
    assert abs(up["null_drop"].mean()) < 0.2 and up["null_drop"].shape == (4000,) and up["null"].shape == (4000,)
    pairs = {(a + b) / 2 - (c + d) / 2 for a in values[0] for b in values[1] for c in values[0] for d in values[1]}
    assert set(np.round(up["null_drop"], 9)) <= {round(p, 9) for p in pairs}


def test_pooled_trend_claim_needs_the_size_as_well_as_the_order():
    """A perfect ordering by a hundredth of full rank (what lambda = 0 shows at ci) agrees on Spearman
    alone but not on the combined criterion; judged by the same criterion, such a control does not pass."""
    from lowrank.book import rank_trends, verdicts

    tiny = _slices([[60.0, 60.1, 60.2, 60.3, 60.4]] * 4).assign(per_step=1e-3, full_rank=64.0, weight_decay=1e-3, A=8.0)
    big = _slices([[20.0, 40.0, 50.0, 55.0, 60.0]] * 4).assign(per_step=1e-3, full_rank=64.0, weight_decay=1e-3, A=8.0)
    kw = dict(claim_id="II-3", scale="ci", x="x", slices="s", sign=+1, column="rank", min_trend=0.5, min_drop_fraction=0.1,
              paper="l.1", description="d", min_train_acc=0.5, control_name="lambda = 0", permutations=500, eps=1e-2)
    small = rank_trends.pooled_trend_claim("tiny", final=tiny, **kw)
    assert small.details["spearman"] == 1.0 and small.outcome == "disagrees"
    assert small.measured == pytest.approx(0.4 / 64 / 0.1)
    found = rank_trends.pooled_trend_claim("big", final=big, control=tiny, **kw)
    assert found.outcome == "agrees" and found.controls[0]["value"] < 1 and found.details["control_spearman"] == 1.0
    assert rank_trends.combined_score(0.6, 0.05, min_trend=0.5, min_drop_fraction=0.1) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="full_rank"):
        rank_trends.pooled_trend_claim("nofull", final=big.drop(columns="full_rank"), **kw)


def test_full_rank_is_the_mean_smaller_side_of_the_counted_matrices():
    table = pd.DataFrame([{"run": r, "epoch": e, "layer": l, "classifier": l == "fc", "shape": sh}
                          for r in (0, 1) for e in (0, 1)
                          for l, sh in (("a", "64x64"), ("b", "32x64"), ("shortcut", "8x64"), ("fc", "10x32"))])
    got = ranks.full_rank(table, layers=ranks.authors_layers)
    assert got.to_dict() == {0: 48.0, 1: 48.0}
    assert ranks.full_rank(table).to_dict() == {0: (64 + 32 + 8) / 3, 1: (64 + 32 + 8) / 3}


def test_gap_to_lambda0_is_the_smallest_ratio_over_live_runs_by_hand():
    from lowrank.sgd import noise

    # runs 0, 1 (ce: lambda 0, 0.1), 2, 3 (mse: lambda 0, 0.1), 4 (ce, lambda 0.2, collapsed)
    moving = pd.DataFrame({"run": [0, 1, 2, 3, 4], "loss": ["ce", "ce", "mse", "mse", "ce"],
                           "weight_decay": [0, 0.1, 0, 0.1, 0.2], "collapsed": [False, False, False, False, True],
                           "d_over_zero": [1.0, 7.0, 1.0, 3.0, 0.01]})
    assert noise.gap_to_lambda0(moving) == pytest.approx(3.0)  # run 4 collapsed: its 0.01 is left out
    assert np.isnan(noise.gap_to_lambda0(moving.assign(collapsed=moving["weight_decay"] > 0)))


def test_seed_pair_gap_is_the_largest_lambda0_ratio_at_the_last_epoch_by_hand():
    from lowrank.sgd import noise

    # avg: runs 0 (ce, lambda 0), 1 (ce, lambda 0.1), 2 (mse, lambda 0), epochs 1 and 2; pair: runs 5 (ce), 6 (mse)
    avg = pd.DataFrame({"run": [0, 0, 1, 1, 2, 2], "epoch": [1, 2] * 3, "loss": ["ce"] * 4 + ["mse"] * 2,
                        "weight_decay": [0, 0, 0.1, 0.1, 0, 0], "dist": [9.0, 2.0, 50.0, 40.0, 1.0, 4.0]})
    pair = pd.DataFrame({"run": [5, 5, 6, 6], "epoch": [1, 2] * 2, "loss": ["ce", "ce", "mse", "mse"],
                         "weight_decay": 0.0, "dist": [1.0, 8.0, 1.0, 1.0]})
    # last epoch: ce 2 vs 8 (4x), mse 4 vs 1 (4x the other way); the lambda = 0.1 run and epoch 1 play no part
    assert noise.seed_pair_gap(avg, pair) == pytest.approx(4.0)
    assert noise.seed_pair_gap(avg, pair.assign(dist=[1.0, 3.0, 1.0, 2.0])) == pytest.approx(2.0)  # ce 3/2, mse 4/2
    with pytest.raises(ValueError, match="losses"):
        noise.seed_pair_gap(avg, pair[pair["loss"] == "ce"])


def test_fitted_decay_regime_ignores_excluded_runs():
    """A collapsed run with the grid's largest A cannot put the claim in its regime (issue 44)."""
    from lowrank.book import rank_trends

    grid = pd.DataFrame({"weight_decay": [0.0, 1e-3, 6e-2], "A": [0.0, 1.3, 20.0], "fitted": [True, True, False]})
    fitted = grid[grid["fitted"]]
    r = rank_trends.fitted_decay_regime(fitted, grid, needed=5.0, origin="test")
    assert r.value == 1.3 and not r.reached and "fitted runs" in r.quantity
    assert rank_trends.decay_regime(grid, needed=5.0, origin="test").value == 20.0  # the planned one counts it
    none = rank_trends.fitted_decay_regime(grid.iloc[:0], grid, needed=5.0, origin="test")
    assert none.value == 20.0 and none.reached and "planned" in none.quantity


def _trend_table(d_fall, log_d_slope, d_over_zero, collapsed=(False,) * 4):
    return pd.DataFrame({"loss": ["ce", "ce", "mse", "mse"], "weight_decay": [0.0, 1e-3, 0.0, 1e-3],
                         "collapsed": list(collapsed), "d_fall": d_fall, "log_d_slope": log_d_slope,
                         "d_over_zero": d_over_zero})


def test_ratio_trends_read_each_live_ratio_against_its_own_loss_by_hand():
    """ce: lambda = 0 fell 3x, lambda > 0 1.2x, so the ratio grew 2.5x; mse: 2x against 2.5x, it shrank 0.8x.
    The log-slopes per epoch subtract (-0.05 - -0.2 = 0.15)."""
    from lowrank.sgd import noise

    moving = _trend_table([3.0, 1.2, 2.0, 2.5], [-0.2, -0.05, -0.1, -0.12], [1.0, 12.0, 1.0, 8.0])
    t = noise.ratio_trends(moving)
    assert t["loss"].tolist() == ["ce", "mse"]
    assert t["growth"].tolist() == pytest.approx([2.5, 0.8])
    assert t["log_ratio_slope"].tolist() == pytest.approx([0.15, -0.02])
    with pytest.raises(ValueError, match="one lambda = 0 run"):
        noise.ratio_trends(moving[moving["loss"] == "ce"].assign(loss=["ce", "mse"]))


def test_gap_clock_projects_each_ratio_to_the_horizon_as_a_power_of_the_epoch():
    """Threshold 10, a run of 40 epochs, horizon 2000 (x50), window [t/2, t] (q = log2 growth).
    - gap 12, ratios grew 2.5x (q 1.32) and 2.27x: projected far above 10, an agreement that stays;
    - gap 8 (mse) whose ratio shrank 0.8x (q -0.32): 8 x 50^-0.32 = 2.3 stays below, the shortfall is final;
    - gap 8 (ce) growing 1.05x (q 0.0704): 8 x 50^0.0704 = 10.5 crosses: it waits (value below 1);
    - a run already as long as the horizon is not projected; nothing live: None."""
    from lowrank.sgd import noise

    kw = dict(last_epoch=40, horizon=2000)
    agree = noise.gap_clock(_trend_table([3.0, 1.2, 2.5, 1.1], [-0.2, -0.05, -0.1, -0.01], [1.0, 12.0, 1.0, 15.0]), 12.0, 10.0, **kw)
    assert agree["projected_gap"] == pytest.approx(min(12.0 * 50 ** np.log2(2.5), 15.0 * 50 ** np.log2(2.5 / 1.1)))
    assert agree["value"] >= agree["needed"] == 1.0
    shrink = noise.gap_clock(_trend_table([3.0, 1.2, 2.0, 2.5], [-0.2, -0.05, -0.1, -0.12], [1.0, 12.0, 1.0, 8.0]), 8.0, 10.0, **kw)
    assert shrink["projected_gap"] == pytest.approx(8.0 * 50 ** np.log2(0.8)) and shrink["value"] == pytest.approx(10 / shrink["projected_gap"])
    assert shrink["value"] >= 1.0
    slow = noise.gap_clock(_trend_table([2.1, 2.0, 2.0, 1.0], [-0.2, -0.19, -0.1, -0.05], [1.0, 8.0, 1.0, 9.0]), 8.0, 10.0, **kw)
    assert slow["projected_gap"] == pytest.approx(min(8.0 * 50 ** np.log2(1.05), 9.0 * 50 ** np.log2(2.0)))
    assert slow["projected_gap"] > 10 and slow["value"] < 1.0
    long_run = noise.gap_clock(_trend_table([2.1, 2.0, 2.0, 1.0], [-0.2, -0.19, -0.1, -0.05], [1.0, 8.0, 1.0, 9.0]), 8.0, 10.0,
                               last_epoch=2000, horizon=2000)
    assert long_run["projected_gap"] == pytest.approx(8.0) and long_run["value"] == pytest.approx(10 / 8)
    assert noise.gap_clock(_trend_table([3.0, 1.2, 2.0, 1.9], [-0.2, -0.05, -0.1, -0.09], [1.0, 8.0, 1.0, 9.0],
                                        collapsed=(False, True, False, True)), float("nan"), 10.0, **kw) is None
    with pytest.raises(ValueError):
        noise.gap_clock(_trend_table([3.0, 1.2, 2.0, 1.9], [-0.2, -0.05, -0.1, -0.09], [1.0, 8.0, 1.0, 9.0]), 8.0, 10.0,
                        last_epoch=0, horizon=2000)
