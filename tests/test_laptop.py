"""The laptop scale: run lengths computed from the mechanism before training, the laptop files that hold
them, the costs read from measured epoch times, and `--scale laptop` running only what is stale."""

import csv
import math

import pytest
import yaml

from lowrank.book import build, costs, keys, laptop, notebooks, paper_results as pr, rules
from lowrank.core import datasets
from lowrank.sgd import ranks


def _epochs_by_hand(grid, *, n_train, target, slices, milestones=(), lr_decay=0.1):
    """Per slice, the first epoch at which the slice's largest A reaches `target`, summing the step
    sizes epoch by epoch (an independent reading of A = sum_t mu_t lambda / (1 - beta))."""
    out = {}
    for g in grid:
        key = tuple(g[k] for k in slices)
        out.setdefault(key, None)
        if g["weight_decay"] == 0:
            continue
        steps, A, e = n_train // g["batch_size"], 0.0, 0
        while A < target:
            e += 1
            A += steps * g["lr"] * lr_decay ** sum(m < e for m in milestones) * g["weight_decay"] / (1 - g["momentum"])
        out[key] = e if out[key] is None else min(out[key], e)
    return out


@pytest.mark.parametrize("milestones", [(), (3, 7)])
def test_epochs_to_regime_is_the_first_epoch_each_slice_reaches_its_target(milestones):
    grid = ranks.experiment_grid(batch_sizes=[16, 64], lrs=[0.05, 0.2], weight_decays=[0.0, 2e-3, 8e-3],
                                 momenta=[0.0, 0.9], seeds=[0, 1])
    table = ranks.epochs_to_regime(grid, n_train=1000, target=5.0, slices=["momentum", "batch_size"],
                                   milestones=milestones, lr_decay=0.5)
    want = _epochs_by_hand(grid, n_train=1000, target=5.0, slices=["momentum", "batch_size"], milestones=milestones,
                           lr_decay=0.5)
    got = {(r.momentum, r.batch_size): r.epochs for r in table.itertuples()}
    assert got == want and table["reachable"].all()
    # the closed form at a constant rate: momentum 0, B = 64 (15 steps), its largest mu lambda = 0.2 * 8e-3
    if not milestones:
        assert got[(0.0, 64)] == math.ceil(5.0 / (15 * 0.2 * 8e-3))
    assert (table["A"] >= 5.0).all()


def test_a_slice_without_weight_decay_cannot_reach_the_regime():
    grid = ranks.experiment_grid(batch_sizes=[16], lrs=[0.1], weight_decays=[0.0], momenta=[0.0], seeds=[0])
    table = ranks.epochs_to_regime(grid, n_train=100, target=1.0, slices="batch_size")
    assert not table["reachable"].any() and table["epochs"].tolist() == [0]
    with pytest.raises(ValueError, match="target must be positive"):
        ranks.epochs_to_regime(grid, n_train=100, target=0.0, slices="batch_size")
    with pytest.raises(ValueError, match="no 'lr0'"):
        ranks.epochs_to_regime(grid, n_train=100, target=1.0, slices="lr0")
    small = ranks.experiment_grid(batch_sizes=[16], lrs=[1e-3], weight_decays=[1e-6], momenta=[0.0], seeds=[0])
    with pytest.raises(ValueError, match="more than max_epochs"):
        ranks.epochs_to_regime(small, n_train=100, target=1.0, slices="batch_size", max_epochs=10)


def test_every_laptop_file_holds_the_run_length_computed_from_its_grid():
    assert laptop.check() == []
    root = notebooks.REPO_ROOT / "params" / "laptop"
    files = sorted(root.glob("*/*.yaml"))
    from lowrank.square import sizing as square_sizing  # Part III's own rule: tests/test_sizing.py

    assert {p.relative_to(root).with_suffix("").as_posix() for p in files} == set(laptop.SIZED_PAGES) | set(square_sizing.SIZED_PAGES)
    for path in files:
        name = path.relative_to(root).with_suffix("").as_posix()
        if name in square_sizing.SIZED_PAGES:
            continue
        text = path.read_text()
        assert text.startswith("# "), f"{path}: a leading comment says how it was sized"
        data = yaml.safe_load(text)
        assert data["scale"] == "laptop" and set(data) <= set(rules.parameter_specs(name))
        params = rules.resolve_parameters(name, scale="laptop", memory=False)
        if "seeds" in params:  # the rank pages; SGD noise has one run per (lambda, loss), pooled over both
            assert params["seeds"] >= 3, "a laptop statistic pools at least 3 seeds"
        page = laptop.SIZED_PAGES[name]
        for stage in (page, *page.also):
            n_train = int(datasets.load(params[stage.dataset_key]).x_train.shape[0])
            by_hand = _epochs_by_hand(stage.grid(params), n_train=n_train, target=ranks.regime_from_bound(params[stage.eps_key]),
                                      slices=stage.slices, milestones=params.get("milestones", ()),
                                      lr_decay=params.get("lr_decay", 0.1))
            assert None not in by_hand.values(), "every slice of a sized grid has weight decay"
            if not stage.fill:
                assert data[stage.epochs_key] == max(by_hand.values()), (name, stage.epochs_key)
                continue
            # stretched to the budget: the measured seconds per epoch of its ensembles (one per loss), by hand; on the
            # first data set each ensemble also trains the second lambda = 0 run (gap_to_lambda0's control)
            members = len(params["weight_decays"]) + (stage.dataset_key == "dataset")
            unit = len(params["losses"]) * costs.epoch_seconds(params["model"], params[stage.dataset_key], params["batch_size"],
                                                               members)
            share = laptop.FILL_SHARE * costs.PAGE_BUDGET_S / sum(bool(s.fill) for s in (page, *page.also))
            paper = rules.resolve_parameters(name, scale="paper", memory=False)[stage.epochs_key]
            assert data[stage.epochs_key] == max(max(by_hand.values()), min(paper, int(share / unit))), (name, stage.epochs_key)
            assert data[stage.epochs_key] > max(by_hand.values()), "the budget allows more than the regime's length"


def test_a_hand_edited_run_length_is_reported(tmp_path, monkeypatch):
    name = "sgd/rank_vs_weight_decay"
    edited = tmp_path / "params" / "laptop" / f"{name}.yaml"
    edited.parent.mkdir(parents=True)
    edited.write_text(notebooks.scale_params_path(name, "laptop").read_text().replace("epochs: ", "epochs: 1"))
    monkeypatch.setattr(notebooks, "SOURCE_ROOT", tmp_path)
    problems = laptop.check()
    assert any(p.startswith(f"{name}: epochs 1") and "computed from its grid" in p for p in problems)
    assert any("sgd/rank_vs_batch_size: no laptop file" in p for p in problems)


def test_laptop_scale_is_chosen_like_the_others():
    name = "sgd/rank_vs_weight_decay"
    params = rules.resolve_parameters(name, scale="laptop")
    assert params["scale"] == "laptop" and params["epochs"] == yaml.safe_load(
        notebooks.scale_params_path(name, "laptop").read_text())["epochs"]
    with pytest.raises(rules.ParameterError, match="no laptop-scale parameter file"):
        rules.resolve_parameters("gradients/decomposition", scale="laptop")
    with pytest.raises(rules.ParameterError, match="scale must be one of ci, laptop, paper"):
        rules.resolve_parameters(name, scale="gpu")


def _timings(tmp_path, rows):
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=costs.FIELDS)
        w.writeheader()
        w.writerows(rows)
    return costs.read_timings(path)


def test_costs_come_from_measurements_or_are_unknown(tmp_path):
    row = {"model": "M", "dataset": "digits", "batch_size": 16, "members": 36, "device": "cpu",
           "seconds_per_epoch": 0.5, "measured_on": "cpu:test"}
    t = _timings(tmp_path, [row, {**row, "batch_size": 32, "seconds_per_epoch": 0.25}])
    assert costs.epoch_seconds("M", "digits", 16, 36, timings=t) == 0.5
    assert costs.epoch_seconds("M", "digits", 16, 1, timings=t) is None  # another ensemble size is not guessed
    assert costs.epoch_seconds("M", "digits", 16, 36, device="cuda", timings=t) is None
    assert costs.training_seconds([("M", "digits", 16, 36, 10), ("M", "digits", 32, 36, 10)], timings=t) == (7.5, [])
    seconds, missing = costs.training_seconds([("M", "digits", 16, 36, 10), ("M", "digits", 64, 36, 10)], timings=t)
    assert seconds is None and missing == ["M on digits, B = 64, 36 member(s)"]
    assert costs.format_seconds(None) == "unknown" and costs.format_seconds(7200) == "7200 s (2 CPU-hours)"
    assert costs.format_seconds(3600, "cuda") == "3600 s (1 GPU-hours)"
    old = tmp_path / "old.csv"  # the columns before members and device: one member on the CPU
    old.write_text("model,dataset,batch_size,seconds_per_epoch,measured_on\nM,digits,8,2.0,cpu:vm\n")
    assert costs.read_timings(old) == {("M", "digits", 8, 1, "cpu"): (2.0, "cpu:vm")}
    assert costs.read_timings(tmp_path / "absent.csv") == {}


def test_a_page_is_costed_by_its_batch_size_ensembles(tmp_path):
    name = "sgd/rank_vs_weight_decay"
    params = rules.resolve_parameters(name, scale="laptop", memory=False)
    grid = laptop.page_grid(name, params)
    groups = {B: sum(g["batch_size"] == B for g in grid) for B in params["batch_sizes"]}
    assert groups == {B: len(params["weight_decays"]) * 2 * params["seeds"] for B in params["batch_sizes"]}
    rows = [{"model": params["model"], "dataset": params["dataset"], "batch_size": B, "members": n, "device": "cpu",
             "seconds_per_epoch": 0.1 * B, "measured_on": "cpu:test"} for B, n in groups.items()]
    t = _timings(tmp_path, rows)
    assert laptop.page_seconds(name, params, timings=t) == pytest.approx(params["epochs"] * sum(0.1 * B for B in groups))
    assert laptop.page_seconds(name, params, timings=_timings(tmp_path, rows[:1])) is None


def test_build_at_laptop_scale_runs_only_what_is_stale(tmp_path, monkeypatch, capsys):
    """The build's bookkeeping with the kernel replaced by a stub: the page is executed and stored with its
    figures' data, a second build finds it current, a changed laptop file makes it stale again; a page
    without a laptop file is skipped."""
    from lowrank.book.verdicts import GLUE_PREFIX

    name = "sgd/rank_vs_weight_decay"
    calls = []

    def fake_execute(nb, output, parameters=None, figure_dir=None, figure_url=None, timeout=None):
        calls.append((nb, parameters["epochs"], timeout))
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text("{}")
        figure_dir.mkdir(parents=True, exist_ok=True)
        (figure_dir / "curves.csv").write_text("epoch,rank\n1,3.0\n")
        (figure_dir / "curves.png").write_bytes(b"png")
        return {f"{GLUE_PREFIX}wd_rank_trend": {"name": "wd_rank_trend", "claim_id": "II-4", "kind": "claim",
                                                "measured": 1.2, "outcome": "agrees", "scale": "laptop"}}

    monkeypatch.setattr(notebooks, "execute", fake_execute)
    monkeypatch.setattr(build, "LAPTOP", tmp_path / "build")
    monkeypatch.setattr(pr, "RESULTS", tmp_path / "results" / "paper")
    ready, skipped = build.execute_laptop([name, "gradients/decomposition"])
    epochs = rules.resolve_parameters(name, scale="laptop")["epochs"]
    assert ready == [name] and skipped == {"gradients/decomposition": "no laptop file"}
    assert calls == [(name, epochs, build.LAPTOP_CELL_TIMEOUT)]
    stored = tmp_path / "results" / "laptop" / name
    assert sorted(p.relative_to(stored).as_posix() for p in stored.rglob("*") if p.is_file()) == [
        "figures/curves.csv", "provenance.json", "verdicts.json"]
    r = pr.stored_result(name, scale="laptop")
    assert r["stale"] is False and r["provenance"]["scale"] == "laptop" and r["provenance"]["wall_s"] >= 0
    assert r["provenance"]["code_files"][f"notebooks/{name}.md"] and r["provenance"]["git"]["commit"]
    assert build.execute_laptop([name])[0] == [name] and len(calls) == 1, "a current result was executed again"
    edited = tmp_path / "laptop.yaml"
    edited.write_text(notebooks.scale_params_path(name, "laptop").read_text() + "seeds: 4\n")
    real = notebooks.scale_params_path
    monkeypatch.setattr(notebooks, "scale_params_path", lambda n, s: edited if s == "laptop" else real(n, s))
    assert pr.stored_result(name, scale="laptop")["stale_reason"] == "parameters changed since the run: seeds"
    build.execute_laptop([name])
    assert len(calls) == 2
    out = capsys.readouterr().out
    assert "no stored result" in out and "current (stored" in out and "stale: parameters changed since the run: seeds" in out


def test_the_build_command_takes_the_laptop_scale(monkeypatch):
    seen = []
    monkeypatch.setattr(build, "laptop_main", lambda only, force=False: seen.append((only, force)))
    build.main(["--scale", "laptop", "--only", "sgd/rank_vs_weight_decay", "--force"])
    assert seen == [(["sgd/rank_vs_weight_decay"], True)]


def test_pages_beyond_the_laptop_budget_read_needs_a_larger_scale_with_their_cost():
    """The conv / transformer pages: their paper sweeps' points, each costed by hand at a made-up 10 s per
    CPU epoch and 0.5 s per GPU epoch, add up to the printed CPU- and GPU-hours; unmeasured is unknown."""
    from lowrank.book import ledger, sweeps

    for name, specs in sweeps.PAGE_SWEEPS.items():
        points = [p for s in specs for p in sweeps.load_spec(notebooks.REPO_ROOT / s).points]
        assert points and all(p["model"] in ("ResNet-18", "VGG-16", "ViT") for p in points), name
        timings = {(p["model"], p["dataset"], p["batch_size"], 1, dev): (secs, "test")
                   for p in points for dev, secs in (("cpu", 10.0), ("cuda", 0.5))}
        cost = sweeps.larger_scale_cost(name, timings)
        assert cost["cpu_seconds"] == pytest.approx(sum(10.0 * p["epochs"] for p in points))
        assert cost["gpu_seconds"] == pytest.approx(sum(0.5 * p["epochs"] for p in points))
        text = sweeps.larger_scale_text(name, timings)
        assert text.startswith("needs a larger scale") and f"{cost['cpu_seconds'] / 3600:,.0f} CPU-hours" in text
        assert "unknown CPU-hours (one thread) and unknown GPU-hours" in sweeps.larger_scale_text(name, {})
        if name in laptop.SIZED_PAGES:  # its MLP claims are sized; the conv / transformer claims stay beyond,
            note = ledger._beyond_budget_note(cost)  # their cost beside the page's stored laptop outcomes
            assert "beyond the budget" in note and "CPU-hours" in note and "GPU-hours" in note
            continue
        assert not notebooks.scale_params_path(name, "laptop").is_file(), "a page beyond the budget has no laptop file"
        title, short, outcome = ledger._laptop_not_run(name, cost)
        assert outcome == "needs a larger scale" and "CPU-hours" in short and "GPU-hours" in short
    assert sweeps.larger_scale_cost("sgd/rank_vs_weight_decay") is None
    assert set(sweeps.larger_scale_costs([*sweeps.PAGE_SWEEPS, "sgd/rank_vs_weight_decay"])) == set(sweeps.PAGE_SWEEPS)
    assert sweeps.larger_scale_costs(["probe/plain"]) == {}  # a book without those pages needs none of their specs


@pytest.mark.slow  # starts a kernel and trains the page: about a minute on 2 cores
def test_the_cheapest_stored_laptop_page_reruns_to_its_stored_verdicts(tmp_path):
    """The cheapest stored laptop result (by its recorded wall time), rerun from its laptop file as the build
    runs it, gives every stored verdict again: the same outcome, and the measured value within the
    verdict's recorded tolerance (its golden entry's, measured over 5 seed offsets and 2 CPU code paths at ci
    scale; 1e-9 for a verdict without one). A stale stored result fails here: `make laptop` reruns it."""
    from lowrank.book import goldens, runs

    stored = {n: pr.stored_result(n, scale="laptop") for n in pr.stored_names(scale="laptop")}
    assert stored, "no stored laptop result: run `make laptop`"
    name = min(stored, key=lambda n: stored[n]["provenance"]["wall_s"])
    assert not stored[name]["stale"], f"{name}: {stored[name]['stale_reason']} (run `make laptop`)"
    params = rules.resolve_parameters(name, scale="laptop")
    assert params == stored[name]["provenance"]["parameters"]
    found, _ = runs.execute(keys.notebook_code(name), params, tmp_path / "notebook.ipynb", tmp_path / "figures")
    golden = goldens.load().get(name, {})
    assert set(found) == set(stored[name]["verdicts"])
    for key, was in stored[name]["verdicts"].items():
        now = found[key]
        tolerance = golden.get(key, {}).get("abs", 1e-9)
        first = (was.get("details") or {}).get("stability", {}).get("this_run", was["outcome"])  # an unstable one's own
        assert now["outcome"] == first, f"{name} {key}: {now['outcome']}, stored {was['outcome']} ({first})"
        both_nan = math.isnan(now["measured"]) and math.isnan(was["measured"])  # an undecided claim with no run left
        assert both_nan or abs(now["measured"] - was["measured"]) <= tolerance, \
            f"{name} {key}: {now['measured']}, stored {was['measured']} (tolerance {tolerance})"


def test_a_page_over_the_budget_is_refused_before_any_file_is_written(tmp_path, monkeypatch):
    import shutil

    shutil.copytree(notebooks.SOURCE_ROOT / "params" / "paper", tmp_path / "params" / "paper")  # the stretched pages' caps
    monkeypatch.setattr(notebooks, "SOURCE_ROOT", tmp_path)
    monkeypatch.setattr(laptop, "page_seconds", lambda name, params, **kw: 700.0)
    with pytest.raises(ValueError, match="over the laptop budget of 600 s: it needs a larger scale"):
        laptop.write()
    monkeypatch.setattr(laptop, "page_seconds", lambda name, params, **kw: 1500.0 if "batch" in name else 590.0)
    with pytest.raises(ValueError, match="over the laptop budget"):
        laptop.write(["sgd/rank_vs_batch_size"])
    monkeypatch.setattr(laptop, "page_seconds", lambda name, params, **kw: 590.0)
    assert laptop.write(["sgd/rank_vs_weight_decay"]) == ["sgd/rank_vs_weight_decay"]
    assert not (tmp_path / "params" / "laptop" / "sgd" / "rank_vs_batch_size.yaml").exists()
    monkeypatch.setattr(laptop, "TIER_BUDGET_S", 1000.0)
    with pytest.raises(ValueError, match="over the tier's 1000 s"):
        laptop.write(list(laptop.SIZED_PAGES))


def _record(measured, outcome, op=">=", value=1.0, controls=(), kind="claim"):
    return {"kind": kind, "measured": measured, "outcome": outcome, "threshold": {"op": op, "value": value, "origin": "o"},
            "controls": list(controls), "note": "", "details": {}}


def test_claims_within_a_tenth_of_their_threshold_are_near_and_others_are_not():
    from lowrank.book.verdicts import near_threshold

    assert near_threshold(_record(1.09, "agrees")) and near_threshold(_record(0.91, "disagrees"))
    assert not near_threshold(_record(1.2, "agrees")) and not near_threshold(_record(0.5, "disagrees"))
    assert not near_threshold(_record(1.0, "holds", kind="check")), "a check is not rerun"
    assert not near_threshold(_record(1.0, "needs a larger scale")), "decided before training"
    assert near_threshold(_record(0.05, "agrees", op=">", value=0.0)), "a zero threshold is measured on the scale 1"
    assert near_threshold(_record(0.5, "agrees", op="between", value=[0.0, 0.52]))
    assert near_threshold(_record(2.0, "agrees", controls=[{"name": "c", "value": 0.95, "passes": False}])), \
        "a control near the threshold decides the outcome too"
    assert near_threshold(_record(2.0, "agrees", controls=[{"name": "n", "value": 5.0, "p_value": 0.052, "passes": True}]))
    assert not near_threshold(_record(2.0, "agrees", controls=[{"name": "n", "value": 5.0, "p_value": 0.001, "passes": False}]))


def test_a_rerun_that_moves_the_outcome_makes_it_unstable_and_keeps_the_first_run():
    from lowrank.book.verdicts import rerun_stability

    first, same, other = _record(1.05, "agrees"), _record(1.02, "agrees"), _record(0.97, "disagrees")
    kept = rerun_stability(first, same, "seed offset 1")
    assert kept["outcome"] == "agrees" and kept["details"]["rerun"]["measured"] == 1.02
    moved = rerun_stability(first, other, "seed offset 1")
    assert moved["outcome"] == "unstable" and moved["measured"] == 1.05
    assert moved["details"]["stability"] == {"outcomes": {"agrees": 1, "disagrees": 1}, "runs": 2, "this_run": "agrees"}


def test_a_laptop_page_with_a_claim_near_its_threshold_is_run_again_at_the_next_seed(monkeypatch):
    from lowrank.book import runs

    calls = []

    def fake_execute(name, params, output, figure_dir, **kw):
        calls.append(params)
        return {"near": _record(0.97, "disagrees"), "far": _record(3.0, "agrees")}, {"wall_s": 2.0}

    monkeypatch.setattr(runs, "execute", fake_execute)
    notebook = keys.notebook_code("sgd/rank_vs_weight_decay")
    found = {"near": _record(1.04, "agrees"), "far": _record(3.0, "agrees")}
    out, prov = build._rerun_near_threshold(notebook, {"seed": 7, "x": 1}, found, {"wall_s": 5.0})
    assert calls == [{"seed": 8, "x": 1}], "the laptop file's own seed, shifted by one offset"
    assert out["near"]["outcome"] == "unstable" and out["far"] == found["far"]
    assert prov["wall_s"] == 7.0 and prov["near_threshold_rerun"]["claims"] == ["near"]
    calls.clear()
    out, prov = build._rerun_near_threshold(notebook, {"seed": 7}, {"far": found["far"]}, {"wall_s": 5.0})
    assert calls == [] and prov["near_threshold_rerun"] is None


def test_a_stretched_run_length_lies_between_the_regimes_and_the_papers():
    """sgd_noise's run lengths fill a share of the budget: at a made-up tiny epoch time they stop at the paper's
    2000 epochs, at a huge one they keep the regime's length."""
    name = "sgd/sgd_noise"
    sized = laptop._sized_run(name)[0]
    regime = {key: length for key, (length, _) in laptop.regime_lengths(name, sized).items()}
    timings = costs.read_timings()
    assert laptop.filled_lengths(name, sized, {k: (1e-6, "test") for k in timings}) == {"epochs": 2000, "second_epochs": 2000}
    assert laptop.filled_lengths(name, {**sized, **regime}, {k: (1e3, "test") for k in timings}) == regime
    assert laptop.filled_lengths("sgd/rank_vs_weight_decay", sized) == {}
