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
    # too few runs left in a group: NaN, not part of worst
    res = ranks.rank_trend(final, "x", by="g", sign=1, diverged=[0, 1, 2, 3], min_points=3)
    assert np.isnan(res["per_group"]["a"]) and res["worst"] == res["per_group"]["b"]
    with pytest.raises(ValueError, match="sign"):
        ranks.rank_trend(final, "x", by="g", sign=0)
