"""book/_ext/reader.py on docutils nodes: a verdict's LaTeX description becomes math nodes (which Sphinx
writes for MathJax as it does the prose's `$...$`), the verdict table is regrouped from its
glued records (four columns, cards on a phone), backticks in generated text become code, and a rounded zero loses its sign."""

import sys

from docutils import nodes

from lowrank.book import build

sys.path.insert(0, str(build.REPO_ROOT / "book" / "_ext"))
import reader  # noqa: E402


def test_latex_description_becomes_text_and_math_nodes():
    para = reader.latex_paragraph(r"$\lambda \|W\|_F$ shrinks as $B$ grows")
    assert [type(c).__name__ for c in para.children] == ["math", "Text", "math", "Text"]
    assert para.children[0].astext() == r"\lambda \|W\|_F" and para.children[3].astext() == " grows"
    assert reader.latex_paragraph("") is None and reader.latex_paragraph("unmatched $x") is None


def _verdict_table(header, row):
    table = nodes.table()
    group = nodes.tgroup(cols=len(header))
    table += group
    for part, cells in ((nodes.thead(), header), (nodes.tbody(), row)):
        r = nodes.row()
        for text in cells:
            entry = nodes.entry()
            entry += nodes.paragraph(text=text)
            r += entry
        part += r
        group += part
    doc = nodes.document(None, None)
    doc += table
    return doc, table


HEADER = ["", "kind", "verdict", "measured", "control", "expects (origin)", "outcome"]  # verdicts.show's Markdown
RECORD = {"name": "probe_norm", "claim_id": "I-1", "kind": "check", "description": "lambda ||W|| <= 1",
          "latex": r"$\lambda \|W\| \le 1$", "outcome": "holds", "measured": 0.7,
          "expected": r"$\lambda \|W\|_2 \le 1$ for every draw", "threshold": {"op": "<=", "value": 1.0,
          "origin": r"Prop. 4.1: $\|S_1\| = \Theta(\sqrt{m})$"},
          "controls": [{"name": r"a budget $10\times$ too small", "value": 3.25, "passes": False}]}


def _marked(monkeypatch, row, record):
    doc, _ = _verdict_table(HEADER, row)
    monkeypatch.setattr(reader, "_executed_verdicts", lambda name: {record["name"]: record})
    reader._mark_verdicts(None, doc, "notebooks/probe/page")
    return next(iter(doc.findall(nodes.table)))


def test_a_verdict_table_is_regrouped_into_four_columns_with_its_math(monkeypatch):
    table = _marked(monkeypatch, ["I-1", "check", "lambda ||W|| <= 1", "-0", "—", "<= 1 (probe)", "holds"], RECORD)
    assert "verdict-table" in table["classes"]
    head = next(iter(table.findall(nodes.thead)))
    assert [e.astext() for e in head.findall(nodes.entry)] == ["claim", "verdict", "measured", "outcome"]
    row = next(iter(next(iter(table.findall(nodes.tbody))).children))
    assert row["ids"] == ["verdict-probe_norm"]
    claim, verdict, measured, outcome = [c for c in row.children if isinstance(c, nodes.entry)]
    assert [c["classes"][0] for c in (claim, verdict, measured, outcome)] == [
        "vcol-claim", "vcol-verdict", "vcol-measured", "vcol-outcome"]
    assert claim.astext() == "I-1check"
    # description, expects and origin, the control's name: each formula a math node, no dollar left
    maths = [m.astext() for m in verdict.findall(nodes.math)]
    assert maths == [r"\lambda \|W\| \le 1", r"\lambda \|W\|_2 \le 1", r"\|S_1\| = \Theta(\sqrt{m})"], maths
    assert verdict.astext().count("expects") == 1 and "$" not in verdict.astext() + measured.astext()
    assert [m.astext() for m in measured.findall(nodes.math)] == [r"10\times"]
    assert measured.astext().startswith("0.7000") and measured.astext().endswith(": 3.25")  # 4 significant digits
    assert next(iter(outcome.findall(nodes.inline)))["classes"] == ["outcome-badge", "outcome-good"]


def test_plain_fields_stay_plain_and_an_unmatched_record_leaves_the_table_as_printed(monkeypatch):
    plain = {**RECORD, "latex": "", "expected": "at most 1", "threshold": {"op": "<=", "value": 1.0, "origin": "probe"},
             "controls": []}
    table = _marked(monkeypatch, ["I-1", "check", "lambda ||W|| <= 1", "1", "—", "<= 1", "holds"], plain)
    assert not list(table.findall(nodes.math)) and "lambda ||W|| <= 1" in table.astext()
    assert "expects at most 1 (probe)" in table.astext()
    table = _marked(monkeypatch, ["I-1", "check", "another verdict", "1", "—", "<= 1", "holds"], RECORD)
    head = next(iter(table.findall(nodes.thead)))
    assert len(list(head.findall(nodes.entry))) == len(HEADER)  # no record for the row: the seven columns stay


def test_backticks_in_generated_text_become_code():
    para = reader._prose("run `lowrank data fetch cifar10` first, then `make paper`")
    assert [type(c).__name__ for c in para.children] == ["Text", "literal", "Text", "literal"]
    assert "`" not in para.astext()


def test_rounded_zeros_lose_their_sign_and_nothing_else_changes():
    cases = {"at least -0.00 here": "at least 0.00 here", "measured -0": "measured 0", "(-0.0).": "(0.0).",
             "-0.001": "-0.001", "-0.5": "-0.5", "x-0.0": "x-0.0", "10-0": "10-0", "−0": "0"}
    for text, expected in cases.items():
        assert reader.without_negative_zero(text) == expected, text


def test_the_notes_after_a_verdict_table_name_each_verdict_by_its_description(monkeypatch):
    doc, table = _verdict_table(HEADER, ["I-1", "check", "lambda ||W|| <= 1", "1", "—", "<= 1", "holds"])
    notes = nodes.bullet_list()
    item = nodes.list_item()
    para = nodes.paragraph()
    para += nodes.emphasis(text="probe_norm")
    para += nodes.Text(": at nu = 0.1 the condition fails")  # as the Markdown rendered the note
    item += para
    notes += item
    doc += notes
    record = {**RECORD, "note": r"at $\nu = 0.1$ the condition fails"}
    monkeypatch.setattr(reader, "_executed_verdicts", lambda name: {"probe_norm": record})
    reader._mark_verdicts(None, doc, "notebooks/probe/page")
    shown = next(iter(doc.findall(nodes.bullet_list)))
    assert "probe_norm" not in shown.astext()
    assert [m.astext() for m in shown.findall(nodes.math)] == [r"\lambda \|W\| \le 1", r"\nu = 0.1"]


def test_math_in_generated_text_is_typeset():
    para = reader._prose(r"weight-decay times $1/(\eta\lambda)$ a run must last, see `lowrank list`")
    assert [type(c).__name__ for c in para.children] == ["Text", "math", "Text", "literal"]
    assert reader._prose("costs $5 a run").astext() == "costs $5 a run"  # an unmatched dollar stays text
