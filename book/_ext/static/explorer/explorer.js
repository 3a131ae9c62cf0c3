/* The book's explorers (book/_ext/explorer.py inlines the data; Vega-Lite draws it).
 * Each .lowrank-explorer holds its data as JSON; sliders choose a grid cell (Part I) or a sweep
 * setting (Part II); the charts and the table of numbers follow. After every redraw the container's
 * data-rendered counter goes up (the browser test waits on it). */
(function () {
  "use strict";
  const LABEL_COLOURS = {residue: "#d62728", data: "#1f77b4", both: "#9467bd", none: "#cccccc"};
  const NAMES = {
    nu: "spike size ν", alpha: "bulk decay α", seed: "seed", activation: "activation",
    lr0: "learning rate μ", batch_size: "batch size B", weight_decay: "weight decay λ", momentum: "momentum",
  };
  const same = (a, b) => (typeof a === "number" && typeof b === "number")
    ? Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(a), Math.abs(b)) : a === b;
  const fmt = (v) => v === null || v === undefined ? "–"
    : typeof v === "number" ? (Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4)))) : String(v);

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => e.setAttribute(k, v));
    if (text !== undefined) e.textContent = text;
    return e;
  }

  /* One slider per key with more than one value (a fixed line otherwise); state[key] follows it. */
  function controls(box, keys, state, redraw, initial) {
    const setters = {};
    const form = el("div", {class: "explorer-controls"});
    Object.entries(keys).forEach(([key, values]) => {
      const start = Math.max(0, values.findIndex((v) => initial && key in initial && same(v, initial[key])));
      state[key] = values[start];
      const label = el("label", {class: "explorer-control"});
      label.appendChild(el("span", {class: "explorer-name"}, NAMES[key] || key));
      const out = el("output", {class: "explorer-value", "data-key": key}, fmt(values[start]));
      if (values.length > 1) {
        const input = el("input", {type: "range", min: 0, max: values.length - 1, step: 1, value: start,
                                   "data-key": key, "aria-label": NAMES[key] || key});
        input.addEventListener("input", () => {
          state[key] = values[Number(input.value)];
          out.textContent = fmt(state[key]);
          redraw();
        });
        setters[key] = (value) => {  // move the slider to `value`, as a reader would
          const i = values.findIndex((v) => same(v, value));
          if (i >= 0 && i !== Number(input.value)) {
            input.value = String(i);
            input.dispatchEvent(new Event("input"));
          }
        };
        label.appendChild(input);
      }
      label.appendChild(out);
      form.appendChild(label);
    });
    box.appendChild(form);
    return setters;
  }

  function readout(table, rows) {
    table.replaceChildren(...rows.map(([label, col, value]) => {
      const tr = el("tr");
      tr.appendChild(el("th", {scope: "row"}, label));
      tr.appendChild(el("td", {"data-col": col, "data-value": JSON.stringify(value === undefined ? null : value)},
                        fmt(value)));
      return tr;
    }));
  }

  function width(box) {
    return Math.max(220, Math.min(380, box.clientWidth - 70));
  }

  async function draw(target, spec) {
    const result = await vegaEmbed(target, spec, {actions: false, renderer: "svg"});
    return result.view;
  }

  function layout(box) {
    const charts = el("div", {class: "explorer-charts"});
    const panes = [0, 1, 2].map((i) => el("div", {class: "explorer-chart", "data-chart": String(i)}));
    panes.forEach((p) => charts.appendChild(p));
    const table = el("table", {class: "explorer-readout"});
    const missing = el("p", {class: "explorer-missing"});  // why a value reads "–"
    missing.hidden = true;
    box.appendChild(charts);
    box.appendChild(table);
    box.appendChild(missing);
    return {panes, table, missing};
  }

  function rendered(box) {
    box.dataset.rendered = String(Number(box.dataset.rendered || 0) + 1);
  }

  /* Part I: the phase map of one seed, the selected cell outlined; its spectrum of G (outliers marked),
   * spike norms and numbers. */
  function phase(box, data) {
    const state = {}, keys = data.keys;
    const {panes, table, missing} = layout(box);
    const views = {};
    box.explorer = {state, views, data};
    const match = (c, ks) => ks.every((k) => same(c[k], state[k]));
    const others = Object.keys(keys).filter((k) => k !== "nu" && k !== "alpha");
    const labels = Object.keys(LABEL_COLOURS);
    let pending = Promise.resolve();

    async function redraw() {
      const cells = data.cells.filter((c) => match(c, others));
      const cell = cells.find((c) => match(c, ["nu", "alpha"])) || null;
      const w = width(box);
      views.map = await draw(panes[0], {
        $schema: "https://vega.github.io/schema/vega-lite/v6.json",
        title: `measured label (× rule disagrees), seed ${fmt(state.seed)}`,
        width: w, height: Math.round(w * 0.8),
        datasets: {map: cells, selected: cell ? [cell] : []},
        layer: [
          {data: {name: "map"}, mark: {type: "rect", stroke: "white", strokeWidth: 1},
           encoding: {x: {field: "alpha", type: "ordinal", title: "bulk decay α"},
                      y: {field: "nu", type: "ordinal", sort: "descending", title: "spike size ν"},
                      color: {field: "measured", type: "nominal", title: "measured",
                              legend: {orient: box.clientWidth < 560 ? "bottom" : "right"},  // a phone: below the map
                              scale: {domain: labels, range: labels.map((l) => LABEL_COLOURS[l])}},
                      tooltip: [{field: "nu"}, {field: "alpha"}, {field: "measured"}, {field: "rule"}]}},
          {data: {name: "map"}, transform: [{filter: "datum.agree === false || datum.agree === 'False'"}],
           mark: {type: "text", text: "×", fontSize: 16, color: "black"},
           encoding: {x: {field: "alpha", type: "ordinal"}, y: {field: "nu", type: "ordinal", sort: "descending"}}},
          {data: {name: "selected"}, mark: {type: "rect", fill: null, stroke: "black", strokeWidth: 3},
           encoding: {x: {field: "alpha", type: "ordinal"}, y: {field: "nu", type: "ordinal", sort: "descending"}}},
        ],
      });
      views.map.addEventListener("click", (event, item) => {  // a click on a cell selects it
        const d = item && item.datum;
        if (d && "nu" in d && "alpha" in d) { setters.nu && setters.nu(d.nu); setters.alpha && setters.alpha(d.alpha); }
      });
      // the spectrum of G: its leading singular values, the outliers the page counted marked as such
      const outliers = cell && typeof cell.outliers === "number" ? cell.outliers : 0;
      const spectrum = cell ? data.spectrum.map((key) => Number(key.slice(3)))  // sv_k
        .map((k) => ({k, value: cell[`sv_${k}`], part: k <= outliers ? "outlier" : "bulk"}))
        .filter((d) => typeof d.value === "number" && d.value > 0) : [];  // a log axis: positive values
      views.spectrum = await draw(panes[1], {
        $schema: "https://vega.github.io/schema/vega-lite/v6.json",
        title: {text: data.spectrum.length ? `spectrum of G: ${outliers} outlier${outliers === 1 ? "" : "s"}`
                                           : "spectrum of G: not saved with this map",
                subtitle: cell ? `measured: ${cell.measured}; rule of thumb: ${cell.rule}` : "no cell"},
        width: w, height: 170,
        datasets: {spectrum}, data: {name: "spectrum"},
        layer: [
          {mark: {type: "rule", strokeWidth: 2},
           encoding: {x: {field: "k", type: "ordinal", title: "index k (leading singular values, descending)"},
                      y: {field: "value", type: "quantitative", scale: {type: "log"},
                          title: "s_k of G (gradient units, log)"},
                      y2: {datum: spectrum.length ? Math.min(...spectrum.map((d) => d.value)) / 1.5 : 1},
                      color: {field: "part", type: "nominal", title: null, legend: {orient: "bottom"},
                              scale: {domain: ["outlier", "bulk"], range: ["#d62728", "#888888"]}}}},
          {mark: {type: "point", filled: true, size: 70},
           encoding: {x: {field: "k", type: "ordinal"}, y: {field: "value", type: "quantitative"},
                      color: {field: "part", type: "nominal"},
                      tooltip: [{field: "k", title: "k"}, {field: "value", title: "s_k", format: ".4g"},
                                {field: "part"}]}},
        ],
      });
      const norms = cell ? ["norm_S1", "norm_S12", "norm_S2"].filter((k) => k in cell && cell[k] > 0)
        .map((k) => ({spike: k.slice(5), norm: cell[k]})) : [];
      views.spikes = await draw(panes[2], {
        $schema: "https://vega.github.io/schema/vega-lite/v6.json",
        title: "spike norms ‖S‖₂ of the selected cell", width: w, height: 160,
        datasets: {spikes: norms}, data: {name: "spikes"}, mark: {type: "point", filled: true, size: 90},
        encoding: {x: {field: "spike", type: "nominal", sort: null, title: "spike"},
                   y: {field: "norm", type: "quantitative", scale: {type: "log"},
                       title: "spectral norm (gradient units, log)"},
                   tooltip: [{field: "spike"}, {field: "norm", format: ".4g"}]},
      });
      const rows = [["spike size ν", "nu", state.nu], ["bulk decay α", "alpha", state.alpha]];
      others.forEach((k) => rows.push([NAMES[k] || k, k, state[k]]));
      const said = {measured: "measured dominant spike", rule: "rule of thumb's call", agree: "agree",
                    beta_hat: "β̂ (residue alignment)", outliers: "outliers of G", second_ratio: "s₂/s₁ of G",
                    align_residue: "|cos(u₁, X_Bᵀr)|", align_q: "|cos(u₁, q)|",
                    residue_in_top2: "‖U₂ᵀ X_Bᵀr‖ (unit)", q_in_top2: "‖U₂ᵀ q‖",
                    norm_S1: "‖S₁‖₂", norm_S12: "‖S₁₂‖₂", norm_S2: "‖S₂‖₂"};
      data.shown.forEach((k) => rows.push([said[k] || k, k, cell ? cell[k] : null]));
      readout(table, rows);
      const why = !cell ? "this cell of the grid was not computed at this scale"
        : rows.some((r) => r[2] === null || r[2] === undefined) ? "not recorded for this cell (the page's CSV has no value there)" : "";
      missing.textContent = why ? `– : ${why}.` : "";
      missing.hidden = !why;
      rendered(box);
    }

    const setters = controls(box, keys, state, () => { pending = pending.then(redraw); });
    box.insertBefore(box.querySelector(".explorer-controls"), box.querySelector(".explorer-charts"));
    pending = pending.then(redraw);
  }

  /* Part II: one sweep setting's rank and accuracy per epoch; the final rank along the swept
   * parameter with the setting marked; the final numbers and A. */
  function rank(box, data) {
    const state = {}, keys = data.keys, swept = data.swept;
    const {panes, table, missing} = layout(box);
    const views = {};
    box.explorer = {state, views, data};
    const names = Object.keys(keys);
    const match = (r, ks) => ks.every((k) => !(k in r) || same(r[k], state[k]));
    let pending = Promise.resolve();

    async function redraw() {
      const w = width(box);
      const epochs = data.curves.filter((r) => match(r, names));
      const coarseName = data.coarse ? `average rank at ε = ${data.coarse.slice(9)}` : "coarse rank";
      const long = [];
      epochs.forEach((r) => {
        long.push({epoch: r.epoch, quantity: "average rank", value: r.avg_rank});
        if (data.coarse) long.push({epoch: r.epoch, quantity: coarseName, value: r[data.coarse]});
      });
      const acc = [];
      epochs.forEach((r) => {
        acc.push({epoch: r.epoch, quantity: "train accuracy", value: r.train_acc});
        acc.push({epoch: r.epoch, quantity: "test accuracy", value: r.test_acc});
      });
      const none = epochs.length === 0;
      const line = (name, rows, title, quantities) => ({
        $schema: "https://vega.github.io/schema/vega-lite/v6.json",
        title: none ? `${title}: no per-epoch curve saved for this setting` : title,
        width: w, height: 170, datasets: {[name]: rows}, data: {name},
        mark: {type: "line", point: false},
        encoding: {x: {field: "epoch", type: "quantitative", title: "epoch"},
                   y: {field: "value", type: "quantitative", title, scale: {zero: false}},
                   strokeDash: {field: "quantity", type: "nominal", title: null, legend: {orient: "bottom"},
                               scale: {domain: quantities, range: [[1, 0], [5, 3]]}},  // as the figure: solid, dashed
                   tooltip: [{field: "epoch"}, {field: "quantity"}, {field: "value", format: ".4g"}]},
      });
      views.rank = await draw(panes[0], line("curve", long, "average rank per epoch", ["average rank", coarseName]));
      views.accuracy = await draw(panes[1], line("accuracy", acc, "accuracy per epoch", ["train accuracy", "test accuracy"]));
      const along = data.finals.filter((r) => match(r, names.filter((k) => k !== swept)));
      const setting = data.finals.find((r) => match(r, names)) || null;
      views.final = await draw(panes[2], {
        $schema: "https://vega.github.io/schema/vega-lite/v6.json",
        title: `final rank against ${(NAMES[swept] || swept).split(" ").pop()} (fitted seeds)`, width: w, height: 170,
        datasets: {along, selected: setting ? [setting] : []},
        layer: [
          {data: {name: "along"}, mark: {type: "line", point: true},
           encoding: {x: {field: swept, type: "ordinal", title: NAMES[swept] || swept},
                      y: {field: "avg_rank", type: "quantitative", scale: {zero: false}, title: "final average rank"},
                      tooltip: [{field: swept}, {field: "avg_rank", format: ".4g"}, {field: "A", format: ".3g"}]}},
          {data: {name: "along"}, mark: {type: "rule"},
           encoding: {x: {field: swept, type: "ordinal"}, y: {field: "avg_rank_min", type: "quantitative"},
                      y2: {field: "avg_rank_max"}}},
          {data: {name: "selected"}, mark: {type: "point", size: 160, color: "black", filled: false, strokeWidth: 2.5},
           encoding: {x: {field: swept, type: "ordinal"}, y: {field: "avg_rank", type: "quantitative"}}},
        ],
      });
      const f = setting || {};
      const rows = names.map((k) => [NAMES[k] || k, k, state[k]]);
      rows.push(["final average rank (mean of fitted seeds)", "avg_rank", f.avg_rank],
                ["its range over fitted seeds", "avg_rank_range",
                 f.avg_rank_min === undefined ? null : `${fmt(f.avg_rank_min)} – ${fmt(f.avg_rank_max)}`]);
      if (data.coarse) rows.push([`final ${coarseName}`, data.coarse, f[data.coarse]]);
      rows.push(["final train accuracy", "train_acc", f.train_acc], ["final test accuracy", "test_acc", f.test_acc],
                ["fitted seeds / seeds", "fitted", f.seeds === undefined ? null : `${f.fitted} / ${f.seeds}`],
                ["epochs", "epochs", f.epochs]);
      if (data.lacks.indexOf("A") < 0) rows.push(["accumulated weight decay A", "A", f.A]);
      readout(table, rows);
      // a dash is a number that does not exist for this setting: say why, under the table
      const why = !setting ? "this combination of settings was not run"
        : f.fitted === 0 ? `none of its ${f.seeds} seeds fitted the training set (diverged or below the page's train-accuracy bar), so there is no final value to average`
        : "";
      missing.textContent = why ? `– : ${why}.` : "";
      missing.hidden = !why;
      rendered(box);
    }

    // open on the setting of the page's static curves figure (explorer.py's `initial`)
    controls(box, keys, state, () => { pending = pending.then(redraw); }, data.initial || data.curves[0]);
    box.insertBefore(box.querySelector(".explorer-controls"), box.querySelector(".explorer-charts"));
    pending = pending.then(redraw);
  }

  function start() {
    if (typeof vegaEmbed !== "function") return;
    document.querySelectorAll(".lowrank-explorer").forEach((box) => {
      const data = JSON.parse(box.querySelector("script.explorer-data").textContent);
      (data.kind === "phase" ? phase : rank)(box, data);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
