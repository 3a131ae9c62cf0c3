"""The verdict machinery: checks apart from claims, claims judged beside their negative controls."""

import json
import math

import pytest

from lowrank.book import verdicts as V

T = V.Threshold(">=", 0.667, "paper l.83: two thirds of the cells")


def _claim(measured, control, **kw):
    return V.claim("c", claim_id="I-1", measured=measured, threshold=T, controls=V.Control("constant predictor", control),
                   expected="agreement >= 2/3", scale="ci", **kw)


def test_a_claim_whose_control_passes_is_uninformative():
    assert _claim(0.78, 0.70).outcome == "uninformative"
    assert not _claim(0.78, 0.70).agrees
    assert _claim(0.78, 0.40).outcome == "agrees"
    assert _claim(0.50, 0.70).outcome == "disagrees"  # a miss stays a miss whatever the control


def test_a_claim_with_every_run_excluded_is_uninformative_whatever_the_number():
    left_none = V.Excluded(6, 6, "train accuracy below the fit threshold")
    assert _claim(0.0, 0.1, excluded=left_none).outcome == "uninformative"
    assert _claim(0.9, 0.1, excluded=left_none).outcome == "uninformative"
    assert _claim(0.9, 0.1, excluded=V.Excluded(5, 6, "diverged")).outcome == "agrees"


def test_any_passing_control_makes_it_uninformative_and_each_is_recorded():
    v = V.claim("c", claim_id="I-1", measured=0.9, threshold=T, expected="", scale="ci",
                controls=[V.Control("never residue", 0.1), V.Control("always data", 0.8)])
    assert v.outcome == "uninformative"
    assert [c["passes"] for c in v.controls] == [False, True]


def test_a_claim_needs_a_control_and_a_threshold_its_origin():
    with pytest.raises(ValueError, match="needs at least one Control"):
        V.claim("c", claim_id="I-1", measured=0.9, threshold=T, controls=[], expected="", scale="ci")
    with pytest.raises(ValueError, match="origin"):
        V.Threshold(">=", 0.5, " ")
    with pytest.raises(ValueError, match="finite"):
        V.Threshold("<=", math.nan, "paper")
    with pytest.raises(ValueError, match="op must be"):
        V.Threshold("=>", 0.5, "paper")


def test_a_check_never_counts_as_a_claim():
    c = V.check("identity", claim_id="I-1", measured=1e-15, threshold=V.Threshold("<=", 1e-12, "identity"),
                expected="round-off", scale="ci")
    assert c.kind == "check" and c.outcome == "holds" and c.controls == []
    failing = V.check("identity", claim_id="I-1", measured=1e-3, threshold=V.Threshold("<=", 1e-12, "identity"),
                      expected="round-off", scale="ci")
    assert failing.outcome == "fails"
    assert c.outcome not in V.CLAIM_OUTCOMES and failing.outcome not in V.CLAIM_OUTCOMES


def test_a_claim_whose_regime_is_not_reached_needs_a_larger_scale_whatever_it_measures():
    short = V.Regime("accumulated weight decay A", 2.5, 5.0, "onset measured at A ~ 5-10, fixed in advance")
    enough = V.Regime("accumulated weight decay A", 12.0, 5.0, "onset measured at A ~ 5-10, fixed in advance")
    for measured in (0.9, 0.1):
        v = _claim(measured, 0.1, regime=short)
        assert v.outcome == "needs a larger scale" and v.details["regime"]["reached"] is False
        assert v.details["regime"]["value"] == 2.5
    assert _claim(0.9, 0.1, regime=enough).outcome == "agrees"
    assert _claim(0.1, 0.1, regime=enough).outcome == "disagrees"
    assert "NOT reached" in short.text() and "reached" in enough.text()
    with pytest.raises(ValueError, match="finite"):
        V.Regime("A", math.inf, 5.0, "x")
    with pytest.raises(ValueError, match="origin"):
        V.Regime("A", 1.0, 5.0, "")


def _golden_file(tmp_path, outcomes):
    path = tmp_path / "golden.yaml"
    path.write_text(f"page:\n  c: {{value: 0.5, abs: 0.1, outcome: x, outcomes: {outcomes}}}\n")
    return path


def test_a_verdict_whose_recorded_outcomes_differ_reads_unstable_in_the_ci_book(tmp_path, monkeypatch):
    monkeypatch.setenv(V.STABILITY_ENV, str(_golden_file(tmp_path, "{agrees: 2, disagrees: 4}")))
    v = _claim(0.9, 0.1)
    assert v.outcome == "unstable" and not v.agrees
    assert v.details["stability"] == {"outcomes": {"agrees": 2, "disagrees": 4}, "runs": 6, "this_run": "agrees"}
    assert "disagrees in 4 of 6, agrees in 2 of 6" in v.note
    # a paper-scale run, or a run outside the ci book (no record named), is judged on its own
    assert V.claim("c", claim_id="I-1", measured=0.9, threshold=T, controls=V.Control("x", 0.1), expected="",
                   scale="paper").outcome == "agrees"
    monkeypatch.delenv(V.STABILITY_ENV)
    assert _claim(0.9, 0.1).outcome == "agrees"


def test_a_verdict_recorded_with_one_outcome_keeps_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv(V.STABILITY_ENV, str(_golden_file(tmp_path, "{agrees: 6}")))
    assert _claim(0.9, 0.1).outcome == "agrees"
    assert _claim(0.1, 0.1).outcome == "disagrees"  # the record never decides a stable outcome


def test_the_nbval_summary_compares_with_the_golden_record_where_one_is_named(tmp_path, monkeypatch):
    path = tmp_path / "golden.yaml"
    path.write_text("page:\n  c: {value: 0.8, abs: 0.05, outcome: agrees, outcomes: {agrees: 7},"
                    " control: {value: 0.1, abs: 0.02}}\n")
    assert V.summary([_claim(0.81, 0.1)]) == "I-1 claim c: 0.81; control constant predictor: 0.1 (agrees)"
    monkeypatch.setenv(V.STABILITY_ENV, str(path))
    # two runs on different CPU paths print the same line when both meet the record
    line = "I-1 claim c: agrees, within its golden tolerance"
    assert V.summary([_claim(0.81, 0.1)]) == V.summary([_claim(0.79, 0.11)]) == line
    assert V.summary([_claim(0.9, 0.1)]) == "I-1 claim c: differs from its golden entry: value 0.9 outside 0.8 +- 0.05"
    assert "outcome disagrees, golden agrees" in V.summary([_claim(0.5, 0.1)])


def test_between_thresholds_and_nan():
    band = V.Threshold("between", (0.4, 0.6), "Prop. 4.1 exponent 1/2 +- 0.1 fixed in advance")
    assert band.met(0.5) and not band.met(0.7) and not band.met(math.nan)
    with pytest.raises(ValueError, match="measured value is nan"):
        _claim(math.nan, 0.1)


def test_excluded_runs_are_counted_and_the_record_is_json():
    v = _claim(0.8, 0.1, excluded=V.Excluded(2, 8, "diverged"), details={"per_band": [0.5, 0.9]})
    d = json.loads(json.dumps(v.as_dict()))
    assert d["excluded"] == {"count": 2, "total": 8, "reason": "diverged"}
    assert d["threshold"]["origin"].startswith("paper")
    with pytest.raises(ValueError):
        V.Excluded(9, 8, "diverged")
    assert "control constant predictor: 0.1" in v.rounded() and v.rounded().endswith("(agrees)")


def test_a_check_whose_wrong_version_also_holds_is_loose():
    thr = V.Threshold("<=", 0, "Theorem 3.2: no violation")
    tight = V.check("violations", claim_id="II-2", measured=0, threshold=thr, expected="0", scale="ci",
                    controls=[V.Control("a quarter of the rank budget", 7)])
    loose = V.check("violations", claim_id="II-2", measured=0, threshold=thr, expected="0", scale="ci",
                    controls=[V.Control("a quarter of the rank budget", 0)])
    broken = V.check("violations", claim_id="II-2", measured=3, threshold=thr, expected="0", scale="ci",
                     controls=[V.Control("a quarter of the rank budget", 0)])
    assert (tight.outcome, loose.outcome, broken.outcome) == ("holds", "loose", "fails")
    assert loose.controls[0]["passes"] and not tight.controls[0]["passes"]


def test_a_null_control_is_judged_against_the_observed_score_by_its_p_value():
    """A permutation null explains a claim only when the observed score is not outside it (p > 0.05),
    whatever its percentile does against the threshold: here its 95th percentile meets the threshold but
    the observed score is beyond every draw, and the other way round."""
    t = V.Threshold(">=", 1.0, "effect size fixed in advance")
    null = [0.5 + 0.001 * i for i in range(1000)]  # 95th percentile 1.45 >= 1
    p = V.null_p_value(2.0, null)
    assert p == pytest.approx(1 / 1001)
    v = V.claim("t_null_beaten", claim_id="X", measured=2.0, threshold=t, expected="", scale="ci",
                controls=V.Control("shuffled", 1.45, p_value=p))
    assert v.outcome == "agrees" and v.controls[0]["p_value"] == p and v.controls[0]["passes"] is False
    inside = V.null_p_value(1.2, null)  # 300 of 1000 draws >= 1.2
    assert inside == pytest.approx(301 / 1001)
    v = V.claim("t_null_explains", claim_id="X", measured=1.2, threshold=t, expected="", scale="ci",
                controls=V.Control("shuffled", 0.2, p_value=inside))
    assert v.outcome == "uninformative", "a null that reaches the observed score explains it even below the threshold"


def test_the_null_p_value_counts_the_observed_labelling_and_refuses_nans():
    assert V.null_p_value(0.0, [1.0, 2.0, 3.0], greater=False) == pytest.approx(1 / 4)
    assert V.null_p_value(5.0, [1.0, 2.0, 3.0], greater=False) == 1.0
    with pytest.raises(ValueError, match="finite"):
        V.null_p_value(1.0, [1.0, float("nan")])
    with pytest.raises(ValueError, match="p_value"):
        V.Control("c", 1.0, p_value=0.0)


@pytest.mark.parametrize("value", [0.25, "text", {"a": 1}, float("nan")])
def test_glue_writes_the_output_myst_nb_glue_writes(value, monkeypatch):
    """`verdicts.glue` (no myst-nb in the notebook extra) displays the same data and metadata as
    `myst_nb.glue`, hidden or shown, so the book's {glue:text} roles read it alike."""
    from IPython.core.interactiveshell import InteractiveShell
    import IPython.display
    from myst_nb import glue as myst_glue

    shell = InteractiveShell.instance()
    monkeypatch.setattr("IPython.get_ipython", lambda: shell)
    shown = []
    record = lambda *a, **kw: shown.append((a, kw))  # noqa: E731
    monkeypatch.setattr(IPython.display, "display", record)
    monkeypatch.setattr("myst_nb.ext.glue.ipy_display", record)
    for display in (False, True):
        shown.clear()
        myst_glue("name", value, display=display)
        V.glue("name", value, display=display)
        assert len(shown) == 2 and shown[0] == shown[1], shown


def test_glue_outside_a_kernel_does_nothing(monkeypatch, capsys):
    monkeypatch.setattr("IPython.get_ipython", lambda: None)
    V.glue("name", 1.0)
    assert capsys.readouterr().out == ""


def test_a_degenerate_statistic_is_uninformative_and_says_why_whatever_the_number():
    v = _claim(0.9, 0.1, degenerate="no run fitted a slope")
    assert v.outcome == "uninformative" and v.details["degenerate"] == "no run fitted a slope"
    assert _claim(0.9, 0.1).outcome == "agrees"  # the same numbers, decided, without the reason
    with pytest.raises(ValueError, match="reason"):
        _claim(0.9, 0.1, degenerate=" ")


def test_only_an_undecided_claim_may_go_without_a_control_or_a_number():
    kw = dict(claim_id="II-1", threshold=T, controls=[], expected="", scale="ci")
    short = V.Regime("accumulated weight decay A", 1.0, 5.0, "onset fixed in advance")
    assert V.claim("c", measured=math.nan, regime=short, **kw).outcome == "needs a larger scale"
    gone = V.claim("c", measured=math.nan, excluded=V.Excluded(4, 4, "train accuracy below 0.8"), **kw)
    assert gone.outcome == "uninformative" and math.isnan(gone.measured)
    gone_short = V.claim("c", measured=math.nan, regime=short, excluded=V.Excluded(4, 4, "train accuracy below 0.8"), **kw)
    assert gone_short.outcome == "needs a larger scale"  # runs too short to fit: longer ones may (referee)
    reached = V.Regime("accumulated weight decay A", 9.0, 5.0, "onset fixed in advance")
    gone_reached = V.claim("c", measured=math.nan, regime=reached, excluded=V.Excluded(4, 4, "collapsed"), **kw)
    assert gone_reached.outcome == "uninformative"  # every run collapsed inside the regime: not a matter of scale
    with pytest.raises(ValueError, match="needs at least one Control"):
        V.claim("c", measured=0.9, excluded=V.Excluded(3, 4, "diverged"), **kw)
    with pytest.raises(ValueError, match="measured value is nan"):
        V.claim("c", measured=math.nan, controls=V.Control("null", 0.1),
                **{k: v for k, v in kw.items() if k != "controls"})


def test_a_missing_number_meets_only_a_golden_entry_without_one():
    assert V.within(math.nan, {"value": math.nan, "abs": 0.05})
    assert not V.within(math.nan, {"value": 0.4, "abs": 0.05})
    assert not V.within(0.4, {"value": math.nan, "abs": 0.05})
