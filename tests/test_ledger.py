"""The ledger's counts: the papers' claims by outcome, the book's own hypotheses apart."""

import html as html_text
from collections import Counter

from lowrank.book import ledger


def _row(name, outcome, part="II", kind="claim", **details):
    return {"claim": f"{part}-1", "notebook": "sgd/x", "exists": True, "paper": None,
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


def test_each_part_gets_a_sentence_on_what_its_claims_decide():
    rows = [_row("a", "agrees"), _row("b", "needs a larger scale"), _row("c", "unstable"), _row("d", "disagrees", part="I")]
    html = ledger.summary_html(rows, "../", golden={})
    assert ("of 3 claims, 1 agrees, 1 needs a larger scale, 1 unstable. 1 of 3 is decided at ci scale; 1 cannot reach "
            "its mechanism's regime here; 1 turns on the seed or the CPU's rounding.") in html_text.unescape(html)
    assert "No claim measured yet" not in html and "no claim measured yet." in html  # Part III


def test_an_unstable_row_shows_how_often_each_outcome_came():
    r = _row("a", "unstable", stability={"outcomes": {"agrees": 2, "disagrees": 5}, "runs": 7, "this_run": "agrees"})
    assert "disagrees in 5 of 7, agrees in 2 of 7" in ledger._row_html(r, set())


def test_tolerances_that_cover_the_range_are_counted():
    golden = {"sgd/x": {"a": {"tolerance_covers_range": True}, "b": {}}}
    assert "1 verdict(s) vary" in ledger.summary_html([_row("a", "unstable")], "../", golden=golden)
