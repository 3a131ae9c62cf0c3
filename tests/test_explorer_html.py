"""The explorers in the built book, in headless Chromium with the network blocked (issue 34).

On each page with an explorer: it draws without JavaScript errors or outside requests; moving a
slider with the keyboard redraws the plot (its SVG changes) and the numbers shown, and those
numbers (the table beside the plot and the data the plot draws: Part I's spectrum of G with its
outliers, Part II's curves of either momentum) equal the figure's CSV as published with the book,
averaged here with pandas as the static figures average them. A setting without final numbers says why.
"""

import json
import re

import pandas as pd
import pytest

from test_html import HTML, _open, browser, server  # noqa: F401 (fixtures)

import test_explorer

pytestmark = pytest.mark.book  # reads the built HTML book

explorer = test_explorer.explorer
PAGES = sorted(explorer.EXPLORERS)


def _csv(name: str, stem: str) -> pd.DataFrame:
    return pd.read_csv(HTML / "figures" / name / f"{stem}.csv")


def _state(tab) -> dict:
    return tab.evaluate("() => ({...document.querySelector('.lowrank-explorer').explorer.state})")


def _readout(tab) -> dict:
    cells = tab.evaluate("() => [...document.querySelectorAll('.lowrank-explorer .explorer-readout td')]"
                         ".map(td => [td.dataset.col, td.dataset.value])")
    return {col: json.loads(value) for col, value in cells}


def _rendered(tab) -> int:
    return int(tab.evaluate("() => document.querySelector('.lowrank-explorer').dataset.rendered || 0"))


def _move(tab, key: str, arrow: str = "ArrowRight") -> None:
    """Press an arrow key on the slider of `key`; wait for the redraw."""
    before = _rendered(tab)
    slider = tab.locator(f".lowrank-explorer input[type=range][data-key='{key}']")
    slider.focus()
    slider.press(arrow)
    tab.wait_for_function(f"Number(document.querySelector('.lowrank-explorer').dataset.rendered) > {before}",
                          timeout=15_000)


def _svg(tab, chart: int) -> str:
    return tab.evaluate(f"() => document.querySelector('.lowrank-explorer [data-chart=\"{chart}\"] svg').outerHTML")


def _near(a, b) -> bool:
    return a == pytest.approx(b, rel=1e-9, abs=1e-12)


def _open_explorer(browser, server, name):
    tab, outside, errors = _open(browser, server, f"notebooks/{name}.html")
    tab.wait_for_function("Number((document.querySelector('.lowrank-explorer') || {dataset: {}}).dataset.rendered) >= 1",
                          timeout=20_000)
    return tab, outside, errors


def _phase_row(grid, state):
    row = grid[(grid["nu"] == state["nu"]) & (grid["alpha"] == state["alpha"]) & (grid["seed"] == state["seed"])]
    assert len(row) == 1, state
    return row.iloc[0]


def _spectrum_columns(grid) -> list[str]:
    """The map CSV's `sv_k` columns (G's leading singular values per cell), in the order of k."""
    found = sorted((c for c in grid.columns if re.fullmatch(r"sv_\d+", c)), key=lambda c: int(c[3:]))
    assert len(found) >= 6, f"the phase map's CSV lacks G's spectrum: {list(grid.columns)}"
    return found


def _check_phase_spectrum(tab, row, columns):
    """The spectrum the explorer draws is the cell's `sv_k`, the first `outliers` of them marked."""
    drawn = tab.evaluate("() => document.querySelector('.lowrank-explorer').explorer.views.spectrum.data('spectrum')")
    assert [d["k"] for d in drawn] == [int(c[3:]) for c in columns]
    assert [d["value"] for d in drawn] == pytest.approx([row[c] for c in columns], rel=1e-12)
    assert [d["part"] for d in drawn] == ["outlier" if int(c[3:]) <= row["outliers"] else "bulk" for c in columns]
    return drawn


def _check_phase_readout(shown, row):
    for col in ("measured", "rule"):
        assert shown[col] == row[col]
    for col in ("beta_hat", "norm_S1", "norm_S12", "norm_S2", "second_ratio"):
        if col in row.index:
            assert _near(shown[col], row[col]), col


def test_phase_explorer_slider_moves_the_cell_and_shows_the_csv(browser, server):
    name = "gradients/phase_diagram"
    grid = _csv(name, explorer.EXPLORERS[name]["stems"][0])
    tab, outside, errors = _open_explorer(browser, server, name)
    columns = _spectrum_columns(grid)
    state = _state(tab)
    assert state["nu"] == sorted(grid["nu"].unique())[0]
    _check_phase_readout(_readout(tab), _phase_row(grid, state))
    spectrum_before = _check_phase_spectrum(tab, _phase_row(grid, state), columns)
    map_before, spectrum_svg = _svg(tab, 0), _svg(tab, 1)
    _move(tab, "nu")
    after = _state(tab)
    assert after["nu"] == sorted(grid["nu"].unique())[1] and after["alpha"] == state["alpha"]
    assert _svg(tab, 0) != map_before, "the map did not change when nu moved"
    assert _svg(tab, 1) != spectrum_svg, "the spectrum of G did not change when nu moved"
    row = _phase_row(grid, after)
    _check_phase_readout(_readout(tab), row)
    spectrum = _check_phase_spectrum(tab, row, columns)
    assert [d["value"] for d in spectrum] != [d["value"] for d in spectrum_before]
    # beside the spectrum: the measured dominant spike and the rule's call of the same cell
    title = tab.evaluate("() => document.querySelector('.lowrank-explorer [data-chart=\"1\"] svg').textContent")
    assert f"measured: {row['measured']}; rule of thumb: {row['rule']}" in title
    # the plot draws the same cell: the outlined cell and the spike norms' data
    selected = tab.evaluate("() => document.querySelector('.lowrank-explorer').explorer.views.map.data('selected')")
    assert [(s["nu"], s["alpha"], s["measured"]) for s in selected] == [(row["nu"], row["alpha"], row["measured"])]
    norms = tab.evaluate("() => document.querySelector('.lowrank-explorer').explorer.views.spikes.data('spikes')")
    assert {n["spike"]: n["norm"] for n in norms} == pytest.approx(
        {k[5:]: row[k] for k in ("norm_S1", "norm_S12", "norm_S2") if row[k] > 0}, rel=1e-9)
    # a click on a map cell selects it (the sliders follow)
    nu, alpha = float(grid["nu"].max()), float(grid["alpha"].max())
    xy = tab.evaluate(f"""() => {{ const v = document.querySelector('.lowrank-explorer').explorer.views.map;
        const r = v.container().querySelector('svg').getBoundingClientRect(), o = v.origin();
        const x = v.scale('x'), y = v.scale('y');
        return [r.left + o[0] + x({alpha}) + x.bandwidth() / 2, r.top + o[1] + y({nu}) + y.bandwidth() / 2]; }}""")
    tab.mouse.click(*xy)
    shown = "(col) => Number(document.querySelector(`.explorer-readout td[data-col='${col}']`).dataset.value)"
    tab.wait_for_function(f"() => {{ const v = {shown}; return v('nu') === {nu} && v('alpha') === {alpha}; }}",
                          timeout=15_000)  # redrawn: the table shows the clicked cell
    _check_phase_readout(_readout(tab), _phase_row(grid, _state(tab)))
    _check_phase_spectrum(tab, _phase_row(grid, _state(tab)), columns)
    assert not errors and not outside, (errors, outside)


@pytest.mark.parametrize("name", [n for n in PAGES if explorer.EXPLORERS[n]["kind"] == "rank"])
def test_rank_explorer_slider_changes_the_curves_and_shows_the_csv(browser, server, name):
    spec = explorer.EXPLORERS[name]
    curves, final = _csv(name, spec["stems"][0]), _csv(name, spec["stems"][1])
    swept = spec["swept"]
    tab, outside, errors = _open_explorer(browser, server, name)
    rank_before = _svg(tab, 0)
    final_before = _svg(tab, 2)
    _move(tab, swept)
    state = _state(tab)
    assert _svg(tab, 0) != rank_before or _svg(tab, 2) != final_before, f"the plot did not change when {swept} moved"

    _check_rank_setting(tab, state, curves, final, name)
    # the no-momentum variant (the page's other momentum, below the main one): its own curve, from the CSV
    momenta = sorted(final["momentum"].unique())
    assert len(momenta) >= 2 and state["momentum"] == momenta[-1], f"{name}: opens on {state}, momenta {momenta}"
    assert set(curves["momentum"]) == set(momenta), f"{name}: the curves CSV lacks a momentum"
    rank_main = _svg(tab, 0)
    _move(tab, "momentum", "ArrowLeft")
    variant = _state(tab)
    assert variant["momentum"] == momenta[-2] and _svg(tab, 0) != rank_main
    assert "no per-epoch curve" not in _svg(tab, 0)
    _check_rank_setting(tab, variant, curves, final, name)
    assert not errors and not outside, (errors, outside)


def _check_rank_setting(tab, state, curves, final, name):
    """The explorer's curves and numbers for the sweep setting `state` are the CSVs'."""

    def at(frame):
        mask = pd.Series(True, index=frame.index)
        for key, value in state.items():
            if key in frame.columns:
                mask &= (frame[key] - value).abs() <= 1e-9 * max(1.0, abs(value))
        return frame[mask]

    # the per-epoch rank and accuracy the plot draws are the curves CSV's, epoch by epoch
    expected = at(curves).sort_values("epoch")
    assert len(expected), f"{name}: no curve saved for {state}"
    assert expected["epoch"].is_unique, f"{name}: {state} matches more than one curve"
    drawn = tab.evaluate("() => document.querySelector('.lowrank-explorer').explorer.views.rank.data('curve')")
    solid = [d for d in drawn if d["quantity"] == "average rank"]
    assert [d["epoch"] for d in solid] == expected["epoch"].tolist()
    assert [d["value"] for d in solid] == pytest.approx(expected["avg_rank"].tolist(), rel=1e-9)
    accuracy = tab.evaluate("() => document.querySelector('.lowrank-explorer').explorer.views.accuracy.data('accuracy')")
    test = [d["value"] for d in accuracy if d["quantity"] == "test accuracy"]
    assert test == pytest.approx(expected["test_acc"].tolist(), rel=1e-9)
    # the final numbers: mean over the fitted seeds of the final CSV, and its A
    runs = at(final)
    fitted = runs[runs["fitted"].astype(bool)] if "fitted" in runs.columns else runs
    shown = _readout(tab)
    assert _near(shown["avg_rank"], fitted["avg_rank"].mean())
    assert _near(shown["test_acc"], fitted["test_acc"].mean())
    assert shown["fitted"] == f"{len(fitted)} / {len(runs)}"
    if "A" in final.columns:
        assert _near(shown["A"], runs["A"].iloc[0])


_SET_JS = """(setting) => { const box = document.querySelector('.lowrank-explorer');
  for (const [key, value] of Object.entries(setting)) {
    const input = box.querySelector(`input[type=range][data-key='${key}']`);
    if (!input) continue;
    const i = box.explorer.data.keys[key].findIndex(v => Math.abs(v - value) <= 1e-9 * Math.max(1, Math.abs(v)));
    input.value = String(i);
    input.dispatchEvent(new Event('input'));
  } }"""
_MISSING_JS = "() => { const p = document.querySelector('.lowrank-explorer .explorer-missing'); return [p.hidden, p.textContent]; }"


@pytest.mark.parametrize("name", [n for n in PAGES if explorer.EXPLORERS[n]["kind"] == "rank"])
def test_rank_explorer_says_why_a_setting_shows_a_dash(browser, server, name):
    """A setting none of whose seeds fitted the training set (counted here from the final CSV) has no
    final numbers: its readout shows "–" and says why under the table; a fitted setting says nothing."""
    final = _csv(name, explorer.EXPLORERS[name]["stems"][1])
    tab, outside, errors = _open_explorer(browser, server, name)
    keys = [k for k in tab.evaluate("() => Object.keys(document.querySelector('.lowrank-explorer').explorer.data.keys)")
            if k in final.columns]
    ok = final["fitted"].astype(bool) if "fitted" in final.columns else pd.Series(True, index=final.index)
    fitted = final.assign(fitted=ok).groupby(keys)["fitted"].sum()
    for setting, n_fitted in ((fitted.idxmin(), fitted.min()), (fitted.idxmax(), fitted.max())):
        before = _rendered(tab)
        tab.evaluate(_SET_JS, dict(zip(keys, map(float, setting if isinstance(setting, tuple) else (setting,)))))
        tab.wait_for_function(f"Number(document.querySelector('.lowrank-explorer').dataset.rendered) > {before}",
                              timeout=15_000)
        hidden, text = tab.evaluate(_MISSING_JS)
        shown = _readout(tab)
        if n_fitted == 0:
            assert shown["avg_rank"] is None and not hidden and "none of its" in text, (setting, text)
        else:
            assert shown["avg_rank"] is not None and hidden, (setting, text)
    assert not errors and not outside, (errors, outside)
