"""book/_ext/reader.py on docutils nodes: a verdict's LaTeX description becomes math nodes (which Sphinx
writes for MathJax as it does the prose's `$...$`), the verdict table's columns are named for the phone
layout, backticks in generated text become code, and a rounded zero loses its sign."""

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


def test_the_empty_claim_header_is_named_and_cells_are_labelled(monkeypatch):
    header = ["", "kind", "verdict", "measured", "control", "expects (origin)", "outcome"]
    doc, table = _verdict_table(header, ["I-1", "check", "lambda ||W|| <= 1", "-0", "—", "<= 1 (probe)", "holds"])
    record = {"name": "probe_norm", "description": "lambda ||W|| <= 1", "latex": r"$\lambda \|W\| \le 1$",
              "kind": "check", "outcome": "holds", "measured": 0.7}
    monkeypatch.setattr(reader, "_executed_verdicts", lambda name: {"probe_norm": record})
    reader._mark_verdicts(None, doc, "notebooks/probe/page")
    head = next(iter(table.findall(nodes.thead)))
    assert [e.astext() for e in head.findall(nodes.entry)][0] == "claim"
    row = next(iter(next(iter(table.findall(nodes.tbody))).children))
    assert row["ids"] == ["verdict-probe_norm"] and "verdict-table" in table["classes"]
    cells = [c for c in row.children if isinstance(c, nodes.entry)]
    assert [c["classes"][0] for c in cells] == ["vcol-claim", "vcol-kind", "vcol-verdict", "vcol-measured",
                                                "vcol-control", "vcol-expectsorigin", "vcol-outcome"]
    assert any(isinstance(n, nodes.math) for n in cells[2].findall(nodes.math))
    assert cells[3].astext() == "0.7000"  # one format down the measured column
    # a record without latex keeps its plain description
    doc, table = _verdict_table(header, ["I-1", "check", "lambda ||W|| <= 1", "1", "—", "<= 1", "holds"])
    monkeypatch.setattr(reader, "_executed_verdicts", lambda name: {"probe_norm": {**record, "latex": ""}})
    reader._mark_verdicts(None, doc, "notebooks/probe/page")
    assert not list(table.findall(nodes.math))


def test_backticks_in_generated_text_become_code():
    para = reader._prose("run `lowrank data fetch cifar10` first, then `make paper`")
    assert [type(c).__name__ for c in para.children] == ["Text", "literal", "Text", "literal"]
    assert "`" not in para.astext()


def test_rounded_zeros_lose_their_sign_and_nothing_else_changes():
    cases = {"at least -0.00 here": "at least 0.00 here", "measured -0": "measured 0", "(-0.0).": "(0.0).",
             "-0.001": "-0.001", "-0.5": "-0.5", "x-0.0": "x-0.0", "10-0": "10-0", "−0": "0"}
    for text, expected in cases.items():
        assert reader.without_negative_zero(text) == expected, text
