"""The ledger's counts: the papers' claims by outcome, the book's own hypotheses apart."""

import html as html_text
import re
from collections import Counter

import pytest

from lowrank.book import ledger
from test_html import DESKTOP, PHONE, _open, browser, server  # noqa: F401 (fixtures of the landing-page test)


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
    assert "1 verdict on the book's own hypotheses" in html
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
    assert "1 verdict varies" in ledger.summary_html([_row("a", "unstable")], "../", golden=golden)


def _claim(name, outcome):
    return {"name": name, "kind": "claim", "outcome": outcome, "measured": 0.9, "controls": [], "expected": "",
            "threshold": {}, "details": {}}


def _three_scales(monkeypatch):
    """Part II: page X at ci only, page Y with a laptop result (stale), page Z at paper scale."""
    monkeypatch.setattr(ledger, "page_title", lambda name: {"sgd/x": "Page X", "sgd/y": "Page Y", "sgd/z": "Page Z"}[name])
    monkeypatch.setattr(ledger, "not_run_reason", lambda name, short=False: "no CIFAR-10 here")
    return [_row("a", "agrees"), _row("b", "disagrees"),
            {**_row("c", "needs a larger scale"), "notebook": "sgd/y", "laptop": _claim("c", "disagrees"),
             "laptop_stale": True, "laptop_stale_reason": "code changed since the run: lowrank/sgd/ranks.py"},
            {**_row("d", "agrees"), "notebook": "sgd/y", "laptop": _claim("d", "agrees")},
            {**_row("e", "disagrees"), "notebook": "sgd/z", "paper": _claim("e", "agrees"), "paper_date": "2026-12-01"}]


def _text(html):
    return html_text.unescape(re.sub(r"<[^>]+>", "", html))


def test_the_landing_sentence_says_what_holds_and_fails_at_each_pages_largest_scale(monkeypatch):
    """Counted by hand: X at ci (1 of 2 agree: holds in part), Y at laptop (1 of 2, stale: in part), Z at
    paper (1 of 1 agrees, though it disagrees at ci: holds): 3 of 5 claims agree. Each page is named by its
    finding (claims.yaml), or its title without one."""
    rows = _three_scales(monkeypatch)
    monkeypatch.setattr(ledger, "page_finding", lambda name: {"sgd/z": "rank falls"}.get(name))
    html = ledger.landing_html(rows, "../")
    assert html.count('class="paper-answer"') == 1 and 'data-part="II" data-scale="paper"' in html
    assert _text(html) == ("Part II (Galanti, Siegel, Gupte and Poggio, 2022). Holds: rank falls (paper). Holds in part: "
                           "Page X (1 of 2, ci); Page Y (1 of 2, laptop). In all, 3 of 5 claims agree (paper scale on 1, "
                           "laptop scale on 1, ci scale on 1 of its 3 pages; 1 stored result stale). Its pages.")
    assert '<a href="../notebooks/sgd/x.html">Page X</a>' in html and 'href="../book/sgd/index.html"' in html
    counts = ledger.ledger_counts(rows, "laptop")["claim"]
    assert counts == Counter({"agrees": 1, "disagrees": 1})


def test_a_page_whose_claims_all_miss_fails_and_one_without_a_decided_claim_is_undecided(monkeypatch):
    rows = _three_scales(monkeypatch)
    monkeypatch.setattr(ledger, "page_finding", lambda name: None)
    rows = [r for r in rows if r["notebook"] != "sgd/y"]
    rows = [{**r, "verdict": {**r["verdict"], "outcome": "disagrees"}} if r["notebook"] == "sgd/x" else r for r in rows]
    rows.append({**_row("f", "needs a larger scale"), "notebook": "sgd/y"})
    text = _text(ledger.landing_html(rows, "../"))
    assert "Fails: Page X (ci)." in text and "Undecided: Page Y (ci)." in text and "Holds: Page Z (paper)." in text


def test_every_claims_row_has_a_finding_that_states_and_does_not_assert():
    import yaml

    for row in yaml.safe_load(ledger.CLAIMS.read_text()):
        finding = row.get("finding", "")
        assert 10 <= len(finding) <= 100, f"{row['claim_id']}: a quotable phrase, not {finding!r}"
        assert not re.search(r"\b(agrees?|confirm|shown|we find|reproduces?)\b", finding), \
            f"{row['claim_id']}: the finding states the claim; the verdicts say whether it holds"


def test_the_ledger_shows_ci_laptop_and_paper_side_by_side_with_stale_marked(monkeypatch):
    rows = _three_scales(monkeypatch)
    matrix = ledger.matrix_html(rows, "II", "../")
    assert "<th>ci scale</th><th>laptop scale</th><th>paper scale</th>" in matrix
    assert matrix.count('data-label="laptop scale"') == 3  # one cell per page
    assert 'title="stale: code changed since the run: lowrank/sgd/ranks.py">stale<' in matrix
    assert "no laptop file" in matrix  # pages X and Z have none (sgd/x, sgd/z are not notebooks)
    table = ledger._part_table(rows, set())
    assert "<th>laptop scale</th>" in table and table.count('data-label="laptop scale"') == len(rows)
    text = _text(ledger.paper_summary_html(rows, "II", "../"))
    assert text.startswith("At paper scale (1 of 3 pages run), 1 of 1 claim agrees: every claim agrees on Page Z")
    assert "At laptop scale (1 of 3 pages run, 1 stale), 1 of 2 claims agrees and 1 disagrees." in text
    summary = ledger.summary_html(rows, "../", golden={})
    assert 'data-scale="laptop"' in summary and "At laptop scale (Part II only): 2 claims, 0 checks" in summary


def test_ledger_rows_read_stored_laptop_results(tmp_path):
    """A real executed ci notebook is not needed for the stored side: rows of a page with a stored laptop
    result carry it, dated, and current."""
    import json

    import nbformat

    from lowrank.book import paper_results as pr, rules
    from lowrank.book.verdicts import GLUE_PREFIX

    name = "sgd/rank_vs_weight_decay"
    ci = {"name": "wd_rank_trend", "claim_id": "II-4", "kind": "claim", "outcome": "agrees", "measured": 1.1}
    cell = nbformat.v4.new_code_cell("", outputs=[nbformat.v4.new_output(
        "display_data", data={"text/plain": json.dumps(ci)},
        metadata={"scrapbook": {"name": f"{GLUE_PREFIX}wd_rank_trend", "mime_prefix": ""}})])
    executed = tmp_path / "x.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), executed)
    pr.store(name, rules.resolve_parameters(name, scale="laptop", memory=False), {"wd_rank_trend": {**ci, "measured": 1.3}},
             {"wall_s": 5.0, "end": "2026-12-03T06:00:00+00:00"}, tmp_path / "laptop", scale="laptop")
    rows = [r for r in ledger.ledger_rows({name: executed}, tmp_path / "paper", tmp_path / "laptop")
            if r["notebook"] == name and r["verdict"]]
    assert json.dumps(rows[0]["verdict"]["measured"]) == "1.1"
    assert rows[0]["laptop"]["measured"] == 1.3 and rows[0]["laptop_date"] == "2026-12-03"
    assert rows[0]["laptop_stale"] is False and rows[0]["paper"] is None


def test_a_page_shows_its_own_verdicts_at_each_scale(tmp_path):
    """The table a notebook page shows below its verdicts: one row per verdict it glued, ci | laptop |
    paper, the stored laptop result beside the ci one."""
    import json

    import nbformat

    from lowrank.book import paper_results as pr, rules
    from lowrank.book.verdicts import GLUE_PREFIX

    name = "sgd/rank_vs_weight_decay"
    ci = {"name": "wd_rank_trend", "claim_id": "II-4", "kind": "claim", "outcome": "disagrees", "measured": 0.7,
          "controls": [], "expected": "", "threshold": {}}
    cell = nbformat.v4.new_code_cell("", outputs=[nbformat.v4.new_output(
        "display_data", data={"text/plain": json.dumps(ci)},
        metadata={"scrapbook": {"name": f"{GLUE_PREFIX}wd_rank_trend", "mime_prefix": ""}})])
    executed = tmp_path / "x.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), executed)
    assert "no stored laptop- or paper-scale result yet" in ledger.page_scales_html(name, executed, tmp_path / "p", tmp_path / "l")
    pr.store(name, rules.resolve_parameters(name, scale="laptop", memory=False),
             {"wd_rank_trend": {**ci, "outcome": "agrees", "measured": 1.3}}, {"wall_s": 5.0}, tmp_path / "l", scale="laptop")
    html = ledger.page_scales_html(name, executed, tmp_path / "p", tmp_path / "l")
    assert "beside its stored laptop-scale results (results/laptop/, with provenance)" in html
    assert html.count('class="kind-claim"') == 1 and "<th>verdict</th>" in html
    cells = re.findall(r'<td data-label="(\w+) scale" class="outcome-cell">(.*?)</td>', html)
    assert [c[0] for c in cells] == ["ci", "laptop", "paper"]
    assert "disagrees" in cells[0][1] and "agrees" in cells[1][1] and "1.3" in cells[1][1] and "not run" in cells[2][1]
    empty = tmp_path / "empty.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), empty)
    assert ledger.page_scales_html(name, empty) == ""


# ---- the landing page's first screen (#43, #47 item 1): one generated sentence per paper saying what
# holds, what fails and at which scale, on the first screen of a desktop (1366 x 900) and within the first
# two screens of a phone (390 x 844), its links working -------------------------------------------------

_ANSWERS = """() => [...document.querySelectorAll('p.paper-answer')].map(p => {
  const r = p.getBoundingClientRect();
  return {part: p.dataset.part, scale: p.dataset.scale, top: r.top + window.scrollY, bottom: r.bottom + window.scrollY,
          text: p.innerText, links: [...p.querySelectorAll('a')].map(a => a.href)};
})"""


@pytest.mark.book  # reads the built HTML book in Chromium (tests/test_html.py's server and browser)
@pytest.mark.parametrize("viewport, screens", [(DESKTOP, 1), (PHONE, 2)], ids=["desktop", "phone"])
def test_each_papers_answer_is_on_the_first_screens(browser, server, viewport, screens):  # noqa: F811
    tab, outside, errors = _open(browser, server, "book/intro.html", viewport)
    try:
        answers = tab.evaluate(_ANSWERS)
        assert [a["part"] for a in answers] == list(ledger.PARTS), "one sentence per paper, in order"
        for a in answers:
            assert a["scale"] in ledger.SCALES and "claims agree" in a["text"]
            assert any(f"{word}:" in a["text"] for word in ledger.VERDICT_GROUPS.values()), "findings by outcome"
            assert a["bottom"] <= screens * viewport["height"], \
                f"Part {a['part']}'s answer ends at {a['bottom']:.0f} px, below {screens} screen(s) of {viewport['height']} px"
            assert a["links"], f"Part {a['part']}'s answer links to its pages"
        for href in {h for a in answers for h in a["links"]}:
            assert tab.request.get(href).ok, f"{href} does not load"
        assert not errors
    finally:
        tab.context.close()
