"""Golden verdicts written by a stated rule, and the verdict diff of a build against them."""

import json

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


def test_entries_follow_the_stated_rule():
    runs = {0: {"a": _record("a", 0.5, control=0.1)}, 1: {"a": _record("a", 0.6, control=0.2)},
            2: {"a": _record("a", 0.3, "disagrees", control=0.1)}}
    e = goldens.entries_from_runs(runs, "abc123")["a"]
    assert e["value"] == 0.5 and e["outcome"] == "agrees"
    assert e["abs"] == pytest.approx(1.5 * 0.2)  # the largest distance from the default run, times 1.5
    assert e["control"] == {"value": 0.1, "abs": pytest.approx(0.15)}
    assert "0.3 to 0.6" in e["spread"] and "outcomes seen: agrees, disagrees" in e["spread"]
    exact = goldens.entries_from_runs({0: {"b": _record("b", 1.0)}, 1: {"b": _record("b", 1.0)}}, "x")["b"]
    assert exact["abs"] == goldens.FLOOR and "control" not in exact


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
