"""book/_ext/explorer.py without a browser: the data it inlines is the figure CSV's, selected and
averaged as the static figures do (checked against numbers computed here by hand); the explorer
goes after the cell that saves its figure; the vendored JavaScript is the one its README names."""

import hashlib
import importlib.util
import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from docutils import nodes

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("explorer", ROOT / "book" / "_ext" / "explorer.py")
explorer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(explorer)


def _phase_csv(path, **extra):
    rows = []
    for nu in (0.5, 0.0):  # written out of order: the explorer sorts the grid's values
        for alpha in (0.3, 0.0):
            rows.append({"nu": nu, "alpha": alpha, "seed": 0, "measured": "data" if nu else "residue",
                         "rule": "residue", "beta_hat": math.inf if alpha else 0.9, "agree": not nu,
                         "outliers": 1, "second_ratio": 0.1, "norm_S1": 1 + nu + alpha, "norm_S12": 0.5,
                         "norm_S2": 0.25, **extra})
    pd.DataFrame(rows).to_csv(path, index=False)
    return rows


def test_phase_data_keeps_every_cell_with_its_numbers(tmp_path):
    rows = _phase_csv(tmp_path / "map.csv")
    data = explorer.phase_data(tmp_path / "map.csv")
    assert data["keys"] == {"nu": [0.0, 0.5], "alpha": [0.0, 0.3], "seed": [0]}
    assert len(data["cells"]) == 4
    cell = next(c for c in data["cells"] if c["nu"] == 0.5 and c["alpha"] == 0.3)
    assert cell["measured"] == "data" and cell["rule"] == "residue" and cell["agree"] is False
    assert cell["norm_S1"] == pytest.approx(1.8) and cell["beta_hat"] is None  # inf is not JSON
    # columns the CSV lacks are listed, not invented
    assert "align_q" in data["lacks"] and "activation" in data["lacks"] and "sv_1" in data["lacks"]
    assert data["spectrum"] == []
    json.dumps(data, allow_nan=False)
    assert {(c["nu"], c["alpha"]) for c in data["cells"]} == {(r["nu"], r["alpha"]) for r in rows}


def test_phase_data_reads_the_spectrum_and_activation_when_saved(tmp_path):
    _phase_csv(tmp_path / "map.csv", activation="tanh", sv_10=0.01, sv_2=0.5, sv_1=2.0)
    data = explorer.phase_data(tmp_path / "map.csv")
    assert data["spectrum"] == ["sv_1", "sv_2", "sv_10"]  # in the order of k, not of the text
    assert data["keys"]["activation"] == ["tanh"]
    assert "sv_1" not in data["lacks"] and "activation" not in data["lacks"]
    assert data["cells"][0]["sv_2"] == 0.5


def test_phase_data_carries_each_cell_s_spectrum_and_outlier_count(tmp_path):
    """The columns the phase page saves (sv_1 .. sv_8 beside `outliers`) reach every cell unchanged."""
    spectra = {(nu, alpha): [10.0 * (1 + nu) / 2 ** k + alpha for k in range(8)] for nu in (0.5, 0.0) for alpha in (0.3, 0.0)}
    rows = [{"nu": nu, "alpha": alpha, "seed": 0, "measured": "data", "rule": "both", "outliers": 1 + int(nu > 0),
             **{f"sv_{k + 1}": v for k, v in enumerate(s)}} for (nu, alpha), s in spectra.items()]
    pd.DataFrame(rows).to_csv(tmp_path / "map.csv", index=False)
    data = explorer.phase_data(tmp_path / "map.csv")
    assert data["spectrum"] == [f"sv_{k}" for k in range(1, 9)] and "outliers" in data["shown"]
    for cell in data["cells"]:
        assert [cell[k] for k in data["spectrum"]] == pytest.approx(spectra[cell["nu"], cell["alpha"]], rel=1e-15)
        assert cell["outliers"] == 1 + int(cell["nu"] > 0)


def test_phase_data_refuses_a_csv_without_the_grid(tmp_path):
    pd.DataFrame({"nu": [0.0], "measured": ["data"]}).to_csv(tmp_path / "map.csv", index=False)
    with pytest.raises(ValueError, match="alpha"):
        explorer.phase_data(tmp_path / "map.csv")


def _rank_csvs(tmp_path):
    final = pd.DataFrame({
        "weight_decay": [0.0, 0.0, 0.0, 0.01, 0.01, 0.01],
        "batch_size": [16] * 6,
        "lr0": [0.1] * 6,
        "momentum": [0.9] * 6,
        "seed": [0, 1, 2, 0, 1, 2],
        "epoch": [3] * 6,
        "avg_rank": [10.0, 12.0, 50.0, 4.0, 6.0, 8.0],
        "avg_rank@0.01": [9.0, 11.0, 40.0, 3.0, 5.0, 7.0],
        "train_acc": [0.9, 0.8, 0.1, 0.95, 0.85, 0.75],
        "test_acc": [0.8, 0.7, 0.1, 0.9, 0.8, 0.7],
        "A": [0.0, 0.0, 0.0, 2.5, 2.5, 2.5],
        "fitted": [True, True, False, True, True, True],  # seed 2 at lambda = 0 did not fit
    })
    variant = final.assign(momentum=0.0, avg_rank=final["avg_rank"] + 20, fitted=True)  # the no-momentum runs
    final = pd.concat([final, variant], ignore_index=True)
    epochs = pd.DataFrame([{"weight_decay": wd, "batch_size": 16, "lr0": 0.10000000000000002, "momentum": m,
                            "epoch": e, "avg_rank": 60.0 - e * (1 + 10 * wd) + 20 * (m == 0), "avg_rank@0.01": 50.0 - e,
                            "train_acc": 0.5 + e / 10, "test_acc": 0.4 + e / 10}
                           for m in (0.0, 0.9) for wd in (0.01, 0.0) for e in (2, 0, 1, 3)])
    final.to_csv(tmp_path / "final.csv", index=False)
    epochs.to_csv(tmp_path / "curves.csv", index=False)
    return final, epochs


def test_rank_data_averages_the_fitted_seeds_and_matches_curves_to_settings(tmp_path):
    final, epochs = _rank_csvs(tmp_path)
    data = explorer.rank_data(tmp_path / "curves.csv", tmp_path / "final.csv", swept="weight_decay",
                              start=["momentum"])
    assert data["keys"] == {"lr0": [0.1], "batch_size": [16], "weight_decay": [0.0, 0.01], "momentum": [0.0, 0.9]}
    assert data["coarse"] == "avg_rank@0.01" and data["lacks"] == []
    # opens on the largest momentum (the static figure's), the smallest value of the other keys
    assert data["initial"] == {"lr0": 0.1, "batch_size": 16, "weight_decay": 0.0, "momentum": 0.9}
    at0 = next(f for f in data["finals"] if f["weight_decay"] == 0.0 and f["momentum"] == 0.9)
    # by hand: seeds 0 and 1 (seed 2 unfitted): ranks 10, 12; train 0.9, 0.8
    assert at0["avg_rank"] == pytest.approx(11.0) and at0["avg_rank_min"] == 10.0 and at0["avg_rank_max"] == 12.0
    assert at0["train_acc"] == pytest.approx(0.85) and at0["avg_rank@0.01"] == pytest.approx(10.0)
    assert (at0["fitted"], at0["seeds"], at0["A"], at0["epochs"]) == (2, 3, 0.0, 3)
    at1 = next(f for f in data["finals"] if f["weight_decay"] == 0.01 and f["momentum"] == 0.9)
    assert at1["avg_rank"] == pytest.approx(6.0) and at1["A"] == 2.5 and at1["fitted"] == 3
    # the no-momentum variant: all three seeds fitted, ranks 30, 32, 70
    var0 = next(f for f in data["finals"] if f["weight_decay"] == 0.0 and f["momentum"] == 0.0)
    assert var0["avg_rank"] == pytest.approx(44.0) and (var0["fitted"], var0["seeds"]) == (3, 3)
    # the curves' lr0 0.10000000000000002 is the final table's 0.1; rows sorted by setting and epoch;
    # each momentum keeps its own curve
    for m, offset in ((0.9, 0.0), (0.0, 20.0)):
        curve = [r for r in data["curves"] if r["weight_decay"] == 0.01 and r["lr0"] == 0.1 and r["momentum"] == m]
        assert [r["epoch"] for r in curve] == [0, 1, 2, 3]
        assert [r["avg_rank"] for r in curve] == pytest.approx([60.0 - e * 1.1 + offset for e in range(4)])
    json.dumps(data, allow_nan=False)


def test_rank_data_lists_a_missing_regime_column(tmp_path):
    final, _ = _rank_csvs(tmp_path)
    final.drop(columns=["A"]).to_csv(tmp_path / "final.csv", index=False)
    data = explorer.rank_data(tmp_path / "curves.csv", tmp_path / "final.csv", swept="weight_decay")
    assert data["lacks"] == ["A"] and all("A" not in f for f in data["finals"])
    with pytest.raises(ValueError, match="swept"):
        explorer.rank_data(tmp_path / "curves.csv", tmp_path / "final.csv", swept="dropout")


def test_explorer_html_inlines_inert_json():
    data = {"kind": "rank", "swept": "lr0", "note": "</script><script>alert(1)</script>"}
    page = explorer.explorer_html(data, "sgd/x")
    payload = re.search(r'<script type="application/json" class="explorer-data">(.*?)</script>', page, re.S)[1]
    assert json.loads(payload) == data  # "</" escaped, so the JSON cannot close its script element


def test_the_explorer_goes_after_the_cell_that_saves_the_figure():
    root = nodes.section()
    for i, source in enumerate(['x = 1', 'plotting.save_figure(fig, "rank_curves", shown)\nplt.show()', 'y = 2']):
        cell = nodes.container(nb_element="cell_code")
        cell += nodes.literal_block(source, source)
        root += cell
    found = explorer._saving_cell(root, "rank_curves")
    assert found is root[1]
    assert explorer._saving_cell(root, "rank") is None  # the whole stem, not a prefix


def test_every_page_with_an_explorer_saves_its_figures():
    for name, spec in explorer.EXPLORERS.items():
        source = (ROOT / "notebooks" / f"{name}.md").read_text()
        for stem in spec["stems"]:
            assert re.search(rf"""save_figure\([^)]*["']{stem}["']""", source), f"{name} no longer saves {stem}"
        if spec["kind"] == "rank":  # the curves of every trained setting, not the figure's momentum only
            assert re.search(rf"""save_figure\(fig, ["']{spec["stems"][0]}["'], curves\)""", source), name
        else:  # the spectrum of G per cell, in the map's table (`phase_grid`'s sv_ columns)
            assert re.search(r"rule_of_thumb\.phase_grid\([^)]*spectrum_top=spectrum_top", source), name
            assert "**leading_spectrum(top)" in (ROOT / "lowrank" / "gradients" / "rule_of_thumb.py").read_text()


def test_vendored_javascript_is_the_one_the_readme_names():
    static = ROOT / "book" / "_ext" / "static" / "explorer"
    table = re.findall(r"^\| (\S+\.min\.js) \| (\S+) \| (\S+) \| (.+?) \| ([0-9a-f]{64}) \|$",
                       (static / "README.md").read_text(), re.M)
    assert {row[0] for row in table} == {Path(f).name for f in explorer.JS_FILES} - {"explorer.js"}
    for file, package, version, licence, sha in table:
        assert hashlib.sha256((static / file).read_bytes()).hexdigest() == sha, file
        assert (static / f"LICENSE.{package}").is_file()
