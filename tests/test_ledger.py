"""The ledger's counts: the papers' claims by outcome, the book's own hypotheses apart."""

import html as html_text
import re
from collections import Counter

from lowrank.book import ledger


def _row(name, outcome, part="II", kind="claim", **details):
    return {"claim_id": f"{part}-1", "notebook": "sgd/x", "exists": True, "paper": None,
            "verdict": {"name": name, "kind": kind, "outcome": outcome, "measured": 0.5, "controls": [],
                        "expected": "", "threshold": {}, "details": details}}


def test_beyond_the_paper_verdicts_are_not_counted_with_the_papers_claims():
    rows = [_row("a", "agrees"), _row("b", "agrees", beyond_paper=True), _row("c", "unstable"),
            _row("d", "needs a larger scale")]
    counts = ledger.ledger_counts(rows)
    assert counts["claim"] == Counter({"agrees": 1, "unstable": 1, "needs a larger scale": 1})
    html = ledger.summary_html(rows, "../", golden={})
    assert "1 verdict(s) on the book's own hypotheses" in html
    page = ledger.ledger_markdown(rows, set())
    assert "## Beyond the papers" in page


def test_each_part_gets_generated_sentences_on_what_holds_and_what_did_not_run(monkeypatch):
    """Counted here by hand from the rows: the sentences say the counts, the pages by outcome at the
    largest scale measured, and why the other pages did not run at paper scale."""
    monkeypatch.setattr(ledger, "page_title", lambda name: {"sgd/x": "Page X", "sgd/y": "Page Y"}[name])
    monkeypatch.setattr(ledger, "not_run_reason", lambda name, short=False: "no CIFAR-10 here")
    rows = [_row("a", "agrees"), _row("b", "needs a larger scale"), _row("c", "unstable"),
            {**_row("d", "agrees"), "notebook": "sgd/y"}, {**_row("e", "disagrees"), "notebook": "sgd/y"},
            {**_row("f", "disagrees"), "notebook": "sgd/y"}]
    text = html_text.unescape(re.sub(r"<[^>]+>", "", ledger.paper_summary_html(rows, "II", "../")))
    assert text.startswith("At ci scale, 2 of 6 claims agree, 2 disagree, 1 needs a larger scale and 1 is unstable: "
                           "at most half agree on Page X (1 of 3 agree), Page Y (1 of 3 agree).")
    assert "No paper-scale result exists yet" in text
    assert text.endswith("Nothing has run at paper scale (2 pages: no CIFAR-10 here).")
    paper = {"name": "a", "kind": "claim", "outcome": "agrees", "measured": 0.9, "controls": [], "expected": "",
             "threshold": {}, "details": {}}
    rows[0] = {**rows[0], "paper": paper, "paper_date": "2026-12-01"}
    text = html_text.unescape(re.sub(r"<[^>]+>", "", ledger.paper_summary_html(rows, "II", "../")))
    assert text.startswith("At paper scale (1 of 2 pages run), 1 of 1 claim agrees: every claim agrees on Page X (1 of 1 agrees).")
    assert "Not run at paper scale (Page Y: no CIFAR-10 here)." in text
    assert "No paper-scale result exists yet" not in text
    # every outcome word is defined where the summary first uses it
    summary = ledger.summary_html(rows, "../", golden={})
    assert summary.index('class="outcome-legend"') < summary.index('class="paper-summary"')
    for outcome, meaning in ledger.MEANING.items():
        assert html_text.escape(meaning) in summary, outcome


def test_math_in_descriptions_renders_and_broken_math_falls_back():
    assert ledger.math_segments(r"$\lambda \|W\|_F$ at most \$5") == [(True, r"\lambda \|W\|_F"), (False, " at most $5")]
    assert ledger.math_segments("an unmatched $x") is None and ledger.math_segments("empty $$ math") is None
    v = {"name": "n", "description": "lambda ||W|| < 1", "latex": r"$\lambda \|W\| < 1$"}
    assert ledger.description_html(v) == r'<span class="math notranslate nohighlight">\(\lambda \|W\| &lt; 1\)</span>'
    assert ledger.description_html({**v, "latex": "broken $x"}) == "lambda ||W|| &lt; 1"
    assert ledger.description_html({**v, "latex": ""}) == "lambda ||W|| &lt; 1"
    row = {**_row("a", "agrees"), "verdict": {**_row("a", "agrees")["verdict"], **v}}
    cell = ledger._row_html(row, {"notebooks/sgd/x"})
    assert r"\(\lambda" in cell and "<details" in cell


def test_an_unstable_row_shows_how_often_each_outcome_came():
    r = _row("a", "unstable", stability={"outcomes": {"agrees": 2, "disagrees": 5}, "runs": 7, "this_run": "agrees"})
    assert "disagrees in 5 of 7, agrees in 2 of 7" in ledger._row_html(r, set())


def test_tolerances_that_cover_the_range_are_counted():
    golden = {"sgd/x": {"a": {"tolerance_covers_range": True}, "b": {}}}
    assert "1 verdict(s) vary" in ledger.summary_html([_row("a", "unstable")], "../", golden=golden)
