"""Golden verdicts written by a stated rule, and the verdict diff of a build against them."""

import json
import math

import nbformat
import pytest

from lowrank.book import goldens, verdicts
from lowrank.book.cli import main


def _record(name, measured, outcome="agrees", control=None):
    kind = "claim" if control is not None else "check"
    controls = [{"name": "null", "value": control, "passes": False}] if control is not None else []
    return {"name": name, "claim": "I-1", "kind": kind, "measured": measured, "outcome": outcome, "controls": controls}


def _executed(tmp_path, records) -> "Path":
    """A notebook whose outputs are glued verdict records, as myst-nb writes them."""
    cell = nbformat.v4.new_code_cell("")
    for r in records:
        key = verdicts.GLUE_PREFIX + r["name"]
        cell.outputs.append(nbformat.v4.new_output("display_data", data={"text/plain": json.dumps(r)},
                                                   metadata={"scrapbook": {"name": key, "mime_prefix": ""}}))
    nb = nbformat.v4.new_notebook(cells=[cell])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    return path


def test_parse_seeds():
    assert goldens.parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert goldens.parse_seeds("0,2,5") == [0, 2, 5]
    for bad in ("1-4", "0", "a-b", "0,0", "-3"):
        with pytest.raises(ValueError):
            goldens.parse_seeds(bad)


def test_seed_overrides_shift_single_seeds_and_lists_without_overlap():
    assert goldens.seed_overrides("gradients/decomposition", 3) == {"seed": 3}
    lists = [goldens.seed_overrides("gradients/phase_diagram", k)["seeds"] for k in range(3)]
    assert lists == [[0, 1], [2, 3], [4, 5]]
    # a page pooling `seeds` consecutive seeds from `seed`: each offset moves past all of them
    pooled = [goldens.seed_overrides("sgd/rank_vs_weight_decay", k, {"seed": 10, "seeds": 3})["seed"] for k in range(3)]
    assert pooled == [10, 13, 16]


def test_entries_follow_the_stated_rule():
    runs = {"seed offset 0": {"a": _record("a", 0.5, control=0.1)}, "seed offset 1": {"a": _record("a", 0.6, control=0.2)},
            "seed offset 2": {"a": _record("a", 0.45, control=0.1)}}
    e = goldens.entries_from_runs(runs, "abc123")["a"]
    assert e["value"] == 0.5 and e["outcome"] == "agrees" and e["outcomes"] == {"agrees": 3}
    assert e["abs"] == pytest.approx(1.5 * 0.15)  # the range over every run, times 1.5
    assert e["control"] == {"value": 0.1, "abs": pytest.approx(0.15)}
    assert "3 runs: 0.45 to 0.6" in e["spread"] and e["measured"].endswith("3 runs")
    exact = goldens.entries_from_runs({"s0": {"b": _record("b", 1.0)}, "s1": {"b": _record("b", 1.0)}}, "x")["b"]
    assert exact["abs"] == goldens.FLOOR and "control" not in exact
    # no spread, but more digits than an entry keeps: the tolerance covers the shortening, so the run meets its entry
    p = 0.8099570680396793
    same = goldens.entries_from_runs({f"s{i}": {"p": _record("p", p, control=p / 3)} for i in range(3)}, "x")["p"]
    assert same["value"] == 0.809957 and verdicts.within(p, same) and verdicts.within(p / 3, same["control"])
    assert same["abs"] < 1e-6
    none_left = {f"s{i}": {"c": _record("c", math.nan, outcome="uninformative")} for i in range(3)}
    e = goldens.entries_from_runs(none_left, "x")["c"]  # an undecided claim with no run to measure
    assert math.isnan(e["value"]) and e["abs"] == goldens.FLOOR and e["outcome"] == "uninformative"
    # a run that leaves its first control out (none of its runs fit): the tolerance comes from the runs that have it
    second = {"name": "other", "value": 9.0, "passes": False}
    partial = {"s0": {"d": _record("d", 0.5, control=0.1)}, "s1": {"d": {**_record("d", 0.5), "controls": [second]}},
               "s2": {"d": _record("d", 0.5, control=0.2)}}
    assert goldens.entries_from_runs(partial, "x")["d"]["control"] == {"value": 0.1, "abs": pytest.approx(0.15)}


def test_an_entry_whose_outcome_differs_over_runs_is_unstable_and_wide_tolerances_say_so():
    spearman = lambda m, o: {**_record("s", m, o, control=0.0), "details": {"statistic_range": [-1.0, 1.0]}}
    runs = {"seed offset 0": {"s": spearman(0.41, "disagrees")}, "seed offset 1": {"s": spearman(0.88, "agrees")},
            f"seed offset 0, {goldens.CPU_PATH_ENV}=default": {"s": spearman(-0.4, "disagrees")}}
    e = goldens.entries_from_runs(runs, "x")["s"]
    assert e["outcome"] == "unstable" and e["outcomes"] == {"agrees": 1, "disagrees": 2}
    assert e["tolerance_covers_range"] is True  # 1.5 x 1.28 on each side covers [-1, 1]
    assert e["measured"].endswith("3 runs (offset 0 also on CPU paths default)")
    # the golden rule then compares the outcome alone; a stable entry's outcome must match exactly
    assert goldens.entry_mismatch({**spearman(-0.99, "unstable")}, e) == ""
    assert "outcome agrees, golden unstable" in goldens.entry_mismatch(spearman(0.88, "agrees"), e)
    stable = goldens.entries_from_runs({"s0": {"s": spearman(0.9, "agrees")}, "s1": {"s": spearman(0.95, "agrees")}}, "x")["s"]
    assert "tolerance_covers_range" not in stable
    assert "outside" in goldens.entry_mismatch(spearman(0.5, "agrees"), stable)


def test_measure_runs_the_second_cpu_path_in_the_kernel(monkeypatch):
    """The second CPU path reaches the kernel (an environment variable it inherits); the ci book's
    recorded stability does not apply while measuring."""
    seen = []

    def fake_execute(name, output, parameters=None, figure_dir=None, **kw):
        import os
        seen.append((parameters["seed"], os.environ.get(goldens.CPU_PATH_ENV), os.environ.get(verdicts.STABILITY_ENV)))
        nbformat.write(nbformat.v4.new_notebook(), output)

    monkeypatch.setattr(goldens.notebooks, "execute", fake_execute)
    monkeypatch.setattr(goldens, "ProcessPoolExecutor", _InlinePool)
    monkeypatch.setenv(verdicts.STABILITY_ENV, "tests/golden_verdicts.yaml")
    monkeypatch.delenv(goldens.CPU_PATH_ENV, raising=False)  # restored (unset) after the test
    runs = goldens.measure("gradients/decomposition", [0, 1], jobs=1)
    assert list(runs) == ["seed offset 0", "seed offset 1", f"seed offset 0, {goldens.CPU_PATH_ENV}=default",
                          f"seed offset 0, {goldens.CPU_PATH_ENV}=avx2"]
    assert seen == [(0, None, None), (1, None, None), (0, "default", None), (0, "avx2", None)]
    # and this process's environment is left as it was: later kernels and worker pools inherit it
    import os
    assert goldens.CPU_PATH_ENV not in os.environ
    assert os.environ[verdicts.STABILITY_ENV] == "tests/golden_verdicts.yaml"


class _InlinePool:
    """ProcessPoolExecutor's interface, run in this process (for monkeypatched executions)."""

    def __init__(self, max_workers=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, *args):
        from concurrent.futures import Future
        f = Future()
        f.set_result(fn(*args))
        return f


def test_write_block_replaces_one_notebook_and_keeps_the_others(tmp_path):
    path = tmp_path / "g.yaml"
    goldens.write_block("p/one", {"a": {"value": 1.0, "abs": 0.1, "outcome": "agrees"}}, path)
    goldens.write_block("p/two", {"b": {"max": 1e-12, "outcome": "holds"}}, path)
    goldens.write_block("p/one", {"a": {"value": 2.0, "abs": 0.1, "outcome": "agrees"}}, path, order=["p/two", "p/one"])
    loaded = goldens.load(path)
    assert list(loaded) == ["p/two", "p/one"] and loaded["p/one"]["a"]["value"] == 2.0
    assert path.read_text().startswith("# Golden verdicts") and not list(tmp_path.glob("*.tmp"))


def test_compare_spread_reports_a_recorded_spread_that_no_longer_matches():
    recorded = {"a": {"value": 0.5, "abs": 0.3, "outcome": "agrees"}, "b": {"value": 1.0, "abs": 0.1, "outcome": "agrees"}}
    fresh = {"a": {"value": 0.55, "abs": 0.25, "outcome": "agrees"}, "b": {"value": 1.0, "abs": 0.6, "outcome": "agrees"}}
    rows = {r["verdict"]: r for r in goldens.compare_spread(recorded, fresh)}
    assert not rows["a"]["stale"]
    assert rows["b"]["stale"] and "tolerance" in rows["b"]["why"]


def test_a_perturbed_verdict_shows_in_the_diff_and_fails_the_golden_check(tmp_path):
    golden = {"p/nb": {"a": {"value": 0.5, "abs": 0.1, "outcome": "agrees", "control": {"value": 0.1, "abs": 0.05}},
                       "b": {"value": 2.0, "abs": 0.5, "outcome": "holds"}}}
    same = _executed(tmp_path, [_record("a", 0.5, control=0.1), {**_record("b", 2.0), "outcome": "holds"}])
    assert goldens.verdict_diff({"p/nb": same}, golden) == []
    drift = tmp_path / "drift"
    drift.mkdir()
    moved = _executed(drift, [_record("a", 0.55, control=0.1), {**_record("b", 2.9), "outcome": "holds"}])
    rows = {r["verdict"]: r for r in goldens.verdict_diff({"p/nb": moved}, golden)}
    assert rows["a"]["what"] == "moved within tolerance" and rows["a"]["within"]
    assert rows["b"]["what"] == "outside tolerance" and not goldens.within(2.9, golden["p/nb"]["b"])
    text = goldens.diff_markdown(list(rows.values()))
    assert "| p/nb | b | 2 ± 0.5 | 2.9 |" in text and "1 outside tolerance" in text


def test_cli_refuses_bad_seed_ranges_before_any_work(capsys):
    assert main(["goldens", "measure", "gradients/decomposition", "--seeds", "3-4"]) == 2
    assert "seeds must start at 0" in capsys.readouterr().err
