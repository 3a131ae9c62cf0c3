"""DataFrames as book tables (lowrank.book.tables): one format per column, units in headers, no "-0",
and the detector of DataFrames printed as text that the browser test uses."""

import math

import numpy as np
import pandas as pd
import pytest

from lowrank.book import tables


@pytest.mark.parametrize("x, text", [
    (0.5, "0.500"), (0.12345, "0.123"), (12.345, "12.3"), (999.7, "1000"), (1234.5, "1234"),
    (-0.0, "0"), (np.float64(-0.0), "0"), (1.2943e-15, "1.29e-15"), (2e7, "2.00e+07"), (-3.5e-4, "-3.50e-04"),
    (float("nan"), "—"), (None, "—"), (math.inf, "∞"), (7, "7"), (np.int64(7), "7"), (True, "yes"), (np.bool_(False), "no"),
])
def test_significant_digits_keep_trailing_zeros_and_drop_the_sign_of_zero(x, text):
    assert tables.significant(x, 3) == text


def test_a_column_has_one_format():
    """Checked against the digits written out by hand: fixed with trailing zeros, or scientific throughout
    when the magnitudes span more than `digits` decades."""
    fixed = tables.column_formatter([0.5, 0.123, 2.0], 3)
    assert [fixed(v) for v in (0.5, 0.123, 2.0)] == ["0.500", "0.123", "2.00"]
    wide = tables.column_formatter([1.3e-15, 0.2], 3)
    assert [wide(v) for v in (1.3e-15, 0.2)] == ["1.30e-15", "2.00e-01"]
    counts = tables.column_formatter([100.0, 200.0, float("nan")], 3)  # integers stored as floats
    assert [counts(v) for v in (100.0, 200.0, float("nan"))] == ["100", "200", "—"]
    rounded_zero = tables.column_formatter([-0.0004, 0.5], 2)
    assert rounded_zero(-0.0004) == "-4.0e-04" and rounded_zero(0.5) == "5.0e-01"


def test_table_html_has_units_numbers_right_aligned_and_the_index_when_it_means_something():
    df = pd.DataFrame({"activation": ["relu", "tanh"], "wall": [1.5, 12.25], "ok": [True, False]})
    html = tables.table(df, units={"wall": "s"})._repr_html_()
    assert "<th>activation</th>" in html and '<th class="num">wall (s)</th>' in html
    assert '<td class="num">1.50</td>' in html and '<td class="num">12.2</td>' in html and "<td>yes</td>" in html
    grouped = df.set_index("activation")
    assert "<th>activation</th>" in tables.table(grouped)._repr_html_()  # a named index is shown
    assert "<th>index</th>" not in html  # a plain 0, 1, ... index is not
    with pytest.raises(ValueError, match="units for columns"):
        tables.table(df, units={"speed": "m/s"})
    text = repr(tables.table(df))
    assert text.splitlines()[0].split() == ["activation", "wall", "ok"] and "12.2" in text


def test_text_dumps_are_found_and_other_printed_lines_are_not():
    df = pd.DataFrame({"act": ["relu", "tanh", "elu"], "s1": [0.5, 0.123, 1.0], "s2": [1, 2, 3]})
    assert len(tables.text_dump(df.to_string(index=False))) == 4
    assert len(tables.text_dump(df.round(3).to_string())) == 4
    summary = ("I-1 check identity_residual: 1.29e-15 (holds)\nI-1 claim rank_two: 0.93; control x: 0.1 (agrees)\n"
               "I-1 claim spike: 0.5 (agrees)")
    assert tables.text_dump(summary) == []
    assert tables.text_dump("max over 40 configurations of ||G - S|| / ||G|| = 1.29e-15") == []
    assert tables.text_dump(repr(tables.table(df))) != []  # the plain-text form is a table too: shown as HTML


def test_a_pivot_tables_columns_are_named_by_their_levels():
    df = pd.DataFrame({"lr": [0.1, 0.1, 0.2], "momentum": [0.0, 0.9, 0.0], "A": [1.5, 15.0, 3.0]})
    pivot = df.pivot_table(index="lr", columns=["momentum"], values="A")
    t = tables.table(pivot)
    assert t.header == ["learning rate", "momentum 0", "momentum 0.9"]  # words, levels without float reprs
    assert t.rows[1] == ["0.200", "3.00", "—"]
    two = df.assign(bs=[4, 4, 8]).pivot_table(index="lr", columns=["momentum", "bs"], values="A")
    assert tables.table(two).header == ["learning rate", "momentum 0, batch size 4", "momentum 0, batch size 8",
                                        "momentum 0.9, batch size 4"]


def test_code_names_in_headers_read_as_words_unless_named():
    assert tables.header_words("batch_size") == "batch size"
    assert tables.header_words("avg_rank@0.01") == "average rank at 0.01"
    assert tables.header_words("nc2_equinorm_classifiers") == "NC2 equinorm classifiers"
    assert tables.header_words("wall (s)") == "wall (s)" and tables.header_words("Fig. 9") == "Fig. 9"
    df = pd.DataFrame({"weight_decay": [0.0, 5e-4], "final_rank": [3, 2]})
    assert tables.table(df, units={"final_rank": "of 64"}).header == ["weight decay", "final rank (of 64)"]
    assert tables.table(df, names={"weight_decay": "λ"}).header == ["λ", "final rank"]
