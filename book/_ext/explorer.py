"""Interactive explorers beside two static figures, from the CSV the figure saved (issue 34).

At build time this extension reads the CSV that `plotting.save_figure` wrote next to a page's
figure (`_build/figures/<part>/<name>/<stem>.csv`; the paper-scale book's `_build/paper/figures/`),
keeps the columns an explorer shows, and inlines them as JSON right after the code cell that saved
the figure. `static/explorer/explorer.js` draws them with Vega-Lite (vendored, see
static/explorer/README.md), so the explorer shows the numbers of the static figure, offline, and
the static figure stays for print and for the regression tests.

- Part I, phase diagram: sliders for nu, alpha and the seed (and the activation when the CSV has
  that column); the selected cell's measured label, the rule of thumb's call, beta_hat, the spike
  norms and the spectrum of G as far as the CSV has them; the map with the cell highlighted.
- Part II, the rank-versus-(lambda, B, mu) pages: sliders over the sweep's mu, B, lambda and
  momentum; rank and accuracy per epoch (from the curves CSV, which holds every trained setting,
  both momenta), the final values over the fitted seeds and the accumulated weight decay A (from
  the final CSV).

The data extraction (`phase_data`, `rank_data`) is plain Python, tested without a browser in
tests/test_explorer.py; tests/test_explorer_html.py moves the sliders in Chromium.
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

from docutils import nodes
from sphinx.util import logging

ROOT = Path(__file__).resolve().parents[2]
STATIC = Path(__file__).resolve().parent / "static"
NOTEBOOK_PREFIX = "notebooks/"
LOG = logging.getLogger(__name__)

# page (notebook name) -> the explorer: its kind and the figure stems whose CSV it reads. The
# explorer is placed after the code cell that saves the first stem's figure.
# A rank explorer opens on the setting its page's static curves figure draws (`start`: the largest value
# of each named key, the smallest of the others): the main momentum (0.9, beside the no-momentum
# variant) and, where the page trains a lambda = 0 control, the page's lambda > 0.
EXPLORERS = {
    "gradients/phase_diagram": {"kind": "phase", "stems": ["phase_diagram_map"]},
    "sgd/rank_vs_weight_decay": {"kind": "rank", "stems": ["rank_vs_weight_decay_curves", "rank_vs_weight_decay_final"],
                                 "swept": "weight_decay", "start": ["momentum"]},
    "sgd/rank_vs_batch_size": {"kind": "rank", "stems": ["rank_vs_batch_size_curves", "rank_vs_batch_size_final"],
                               "swept": "batch_size", "start": ["momentum", "weight_decay"]},
    "sgd/rank_vs_learning_rate": {"kind": "rank", "stems": ["rank_vs_learning_rate_curves", "rank_vs_learning_rate_final"],
                                  "swept": "lr0", "start": ["momentum", "weight_decay"]},
}
JS_FILES = ["explorer/vega.min.js", "explorer/vega-lite.min.js", "explorer/vega-embed.min.js", "explorer/explorer.js"]

# Part I: the columns shown for the selected cell; `sv_1`, `sv_2`, ... (the leading singular values of
# G) and `activation` are shown when the CSV has them.
PHASE_KEYS = ["nu", "alpha", "seed"]
PHASE_SHOWN = ["measured", "rule", "agree", "beta_hat", "outliers", "second_ratio", "align_residue", "align_q",
               "residue_in_top2", "q_in_top2", "norm_S1", "norm_S12", "norm_S2"]
PHASE_WANTED = ["activation", "sv_1"]  # columns the explorer would show and the page's CSV may lack
SPECTRUM = re.compile(r"^sv_(\d+)$")

# Part II: a setting of the sweep, and what is shown for it
RANK_KEYS = ["lr0", "batch_size", "weight_decay", "momentum"]
CURVE_SHOWN = ["avg_rank", "train_acc", "test_acc"]
FINAL_SHOWN = ["avg_rank", "train_acc", "test_acc"]
RANK_WANTED = ["A"]  # the regime quantity, in the final CSV


def figure_dir(outdir) -> Path:
    """Where the executed notebooks' figures are: the paper-scale book's when rendering into
    _build/paper/ (as reader.build_scale decides), else the ci book's."""
    from lowrank.book import pages

    paper = pages.BUILD / "paper"
    return paper / "figures" if paper in Path(outdir).resolve().parents else pages.FIGURES


def _key(value) -> float:
    """A sweep value as a key: 12 significant digits (the curves' `lr0` is a mean over seeds,
    0.10000000000000002 where the final table has 0.1)."""
    return float(f"{float(value):.12g}")


def _clean(value):
    """JSON-safe: NaN and infinities become None; numpy scalars become Python numbers."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _records(frame, columns) -> list[dict]:
    return [{c: _clean(v) for c, v in zip(columns, row)} for row in frame[columns].itertuples(index=False)]


def phase_data(csv_path) -> dict:
    """The phase-diagram explorer's data from the map figure's CSV: one record per (nu, alpha, seed)
    [, activation] with the columns in PHASE_SHOWN that the CSV has and its spectrum `sv_k`."""
    import pandas as pd

    grid = pd.read_csv(csv_path)
    missing = [c for c in PHASE_KEYS + ["measured", "rule"] if c not in grid.columns]
    if missing:
        raise ValueError(f"{csv_path}: the phase map's CSV lacks {missing}")
    spectrum = sorted((c for c in grid.columns if SPECTRUM.match(c)), key=lambda c: int(SPECTRUM.match(c)[1]))
    keys = PHASE_KEYS + (["activation"] if "activation" in grid.columns else [])
    shown = [c for c in PHASE_SHOWN if c in grid.columns]
    return {
        "kind": "phase",
        "keys": {k: sorted(grid[k].unique().tolist()) for k in keys},
        "spectrum": spectrum,
        "shown": shown,
        "lacks": [c for c in PHASE_SHOWN if c not in grid.columns]
        + [c for c in PHASE_WANTED if c not in grid.columns and not (c == "sv_1" and spectrum)],
        "cells": _records(grid, keys + shown + spectrum),
    }


def rank_data(curves_csv, final_csv, swept: str, start=()) -> dict:
    """The rank explorer's data from a Part II page's two CSVs.

    `curves`: per setting (RANK_KEYS) and epoch, the seeds' mean rank (`avg_rank` and the coarser
    `avg_rank@eps` when saved) and accuracy, as the curves figure draws them. `finals`: per setting,
    the mean, min and max over the fitted seeds of the final values (as the final figure), the
    number of fitted and of all seeds, and the accumulated weight decay `A` (the same for every seed
    of a setting). A setting is in the explorer when the final table has it; its curve may be
    absent (a page that saves only some settings' curves). `initial`: the setting the explorer opens
    on, the largest value of the keys in `start` and the smallest of the others.
    """
    import pandas as pd

    curves, final = pd.read_csv(curves_csv), pd.read_csv(final_csv)
    keys = [k for k in RANK_KEYS if k in final.columns]
    if swept not in keys:
        raise ValueError(f"{final_csv}: the swept column {swept!r} is missing")
    coarse = sorted(c for c in curves.columns if c.startswith("avg_rank@"))
    curve_keys = [k for k in keys if k in curves.columns]
    for frame in (curves, final):
        for k in keys:
            if k in frame.columns:
                frame[k] = frame[k].map(_key)
    single = {k: final[k].iloc[0] for k in keys if k not in curves.columns and final[k].nunique() == 1}
    curve_cols = curve_keys + ["epoch"] + [c for c in CURVE_SHOWN + coarse[:1] if c in curves.columns]
    curve_rows = _records(curves.sort_values(curve_keys + ["epoch"]), curve_cols)
    for row in curve_rows:  # a key the curves CSV leaves out because the page has one value of it
        row.update({k: _clean(v) for k, v in single.items()})
    fitted = final["fitted"].astype(bool) if "fitted" in final.columns else pd.Series(True, index=final.index)
    finals = []
    for setting, runs in final.groupby(keys, sort=True):
        ok = runs[fitted.loc[runs.index]]
        row = dict(zip(keys, map(_clean, setting)), seeds=len(runs), fitted=len(ok))
        for c in [c for c in FINAL_SHOWN + coarse[:1] if c in final.columns]:
            row[c] = _clean(ok[c].mean()) if len(ok) else None
        row["avg_rank_min"] = _clean(ok["avg_rank"].min()) if len(ok) else None
        row["avg_rank_max"] = _clean(ok["avg_rank"].max()) if len(ok) else None
        if "A" in runs.columns:
            row["A"] = _clean(runs["A"].iloc[0])
        if "epoch" in runs.columns:
            row["epochs"] = _clean(runs["epoch"].max())
        finals.append(row)
    return {
        "kind": "rank",
        "swept": swept,
        "keys": {k: sorted(final[k].unique().tolist()) for k in keys},
        "initial": {k: _clean(final[k].max() if k in start else final[k].min()) for k in keys},
        "coarse": coarse[0] if coarse else None,
        "lacks": [c for c in RANK_WANTED if c not in final.columns]
        + [c for c in CURVE_SHOWN if c not in curves.columns],
        "curves": curve_rows,
        "finals": finals,
    }


def explorer_data(name: str, figures: Path) -> dict:
    """The explorer of notebook `name` from the CSVs under `figures/<name>/`."""
    spec = EXPLORERS[name]
    paths = [figures / name / f"{stem}.csv" for stem in spec["stems"]]
    absent = [str(p) for p in paths if not p.is_file()]
    if absent:
        raise FileNotFoundError(f"explorer of {name}: no CSV {absent} (was the notebook executed?)")
    if spec["kind"] == "phase":
        return phase_data(paths[0])
    return rank_data(paths[0], paths[1], spec["swept"], spec.get("start", ()))


def explorer_html(data: dict, name: str) -> str:
    """The explorer's container: the data as JSON (inert until explorer.js reads it) and a line
    for readers without JavaScript."""
    payload = json.dumps(data, allow_nan=False, separators=(",", ":")).replace("</", "<\\/")
    what = ("the phase map: choose nu, alpha and the seed" if data["kind"] == "phase"
            else "the sweep: choose mu, B and lambda")
    return (f'<div class="lowrank-explorer" data-kind="{data["kind"]}" data-page="{html.escape(name)}">'
            f'<p class="explorer-title"><strong>Explore</strong> {html.escape(what)} (the numbers of the '
            f'figure above, from its CSV).</p>'
            f'<script type="application/json" class="explorer-data">{payload}</script>'
            '<noscript><p>The explorer needs JavaScript; the figure above shows the same data.</p></noscript>'
            '</div>')


def _saving_cell(doctree, stem: str):
    """The code cell whose source saves the figure `stem`."""
    for cell in doctree.findall(lambda n: isinstance(n, nodes.container) and n.get("nb_element") == "cell_code"):
        source = next(iter(cell.findall(nodes.literal_block)), None)
        if source is not None and re.search(rf"""save_figure\([^)]*["']{re.escape(stem)}["']""", source.astext()):
            return cell
    return None


def _add_explorer(app, doctree, docname):
    name = docname[len(NOTEBOOK_PREFIX):] if docname.startswith(NOTEBOOK_PREFIX) else None
    if name not in EXPLORERS:
        return
    stem = EXPLORERS[name]["stems"][0]
    cell = _saving_cell(doctree, stem)
    if cell is None:
        LOG.warning(f"explorer: no cell of {docname} saves the figure {stem!r}; explorer left out", location=docname)
        return
    try:
        data = explorer_data(name, figure_dir(app.outdir))
    except (OSError, ValueError) as exc:
        LOG.warning(f"explorer: {exc}; explorer left out", location=docname)
        return
    if data["lacks"]:
        LOG.info(f"explorer of {name}: the CSV has no column {data['lacks']} (shown when added)")
    cell.parent.insert(cell.parent.index(cell) + 1, nodes.raw("", explorer_html(data, name), format="html"))


def _page_assets(app, pagename, templatename, context, doctree):
    if pagename.startswith(NOTEBOOK_PREFIX) and pagename[len(NOTEBOOK_PREFIX):] in EXPLORERS:
        app.add_css_file("explorer/explorer.css")
        for js in JS_FILES:
            app.add_js_file(js, defer="defer")


def _config_inited(app, config):
    if str(STATIC) not in map(str, config.html_static_path):
        config.html_static_path = [*config.html_static_path, str(STATIC)]


def setup(app):
    app.connect("config-inited", _config_inited)
    app.connect("doctree-resolved", _add_explorer)
    app.connect("html-page-context", _page_assets)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
