"""DataFrames as the book shows them: HTML tables with units in the headers and one number format per
column, never a text dump (`print(df.to_string())`).

    from lowrank.book import tables
    tables.show(df, digits=3, units={"wall": "s"})   # in a notebook: displays the table
    tables.table(df, digits=3)                        # the same, as a value (last line of a cell)

Numbers keep `digits` significant digits with their trailing zeros ("0.500", "0.123", "12.3"), so a
column never mixes "0.5" and "0.123"; a column whose magnitudes span more than `digits` decades, or
reach below 1e-3 or above 1e6, is written in scientific notation throughout ("1.29e-15"). Integers
stay integers, booleans read "yes"/"no", a missing value "—", and no number reads "-0". Headers are
words: a column named in code ("batch_size", "avg_rank@0.01") reads "batch size", "average rank at
0.01" (`header_words`), a pivot table's "momentum 0, weight decay 0"; `names=` overrides any header.
"""

from __future__ import annotations

import html
import math
import numbers
import re

__all__ = ["significant", "column_formatter", "header_words", "Table", "table", "show", "text_dump"]

SCIENTIFIC_BELOW, SCIENTIFIC_FROM = 1e-3, 1e6
MISSING = "—"


# the words for the abbreviations a column name in code uses (one token between underscores each)
HEADER_WORDS = {"lr": "learning rate", "wd": "weight decay", "bs": "batch size", "acc": "accuracy", "avg": "average",
                "init": "initial", "nc1": "NC1", "nc2": "NC2", "nc3": "NC3", "nc4": "NC4", "cv": "CV", "sd": "SD",
                "nu": "ν", "alpha": "α", "beta": "β", "gamma": "γ", "lam": "λ", "lambda": "λ", "mu": "μ", "rho": "ρ",
                "sigma": "σ", "tau": "τ", "tau2": "τ²", "eps": "ε", "eta": "η", "zeta": "ζ", "mlp": "MLP", "sgd": "SGD",
                "gd": "GD", "ntk": "NTK", "mf": "MF", "relu": "ReLU", "elu": "ELU", "cnn": "CNN", "vit": "ViT"}
_CODE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*(?:@[0-9.e-]+)?")


def header_words(name) -> str:
    """A column name written in code as words: "batch_size" -> "batch size", "lr" -> "learning rate",
    "avg_rank@0.01" -> "average rank at 0.01"; a name that is already words ("wall (s)") is kept."""
    text = str(name)
    if not _CODE_NAME.fullmatch(text):
        return text
    base, _, at = text.partition("@")
    words = " ".join(HEADER_WORDS.get(t.lower(), t) for t in base.split("_"))
    return words + (f" at {at}" if at else "")


def _level_value(v) -> str:
    """A pivot level's value in a header: 0.0 -> "0", 0.0005 -> "0.0005" (no float repr)."""
    return f"{v:g}" if isinstance(v, float) else str(v)


def _no_negative_zero(text: str) -> str:
    """"-0", "-0.00", "-0.00e+00" -> without the sign: a rounded zero has none."""
    mantissa = text.split("e")[0]
    if text.startswith("-") and not any(c in "123456789" for c in mantissa):
        return text[1:]
    return text


def _is_missing(x) -> bool:
    try:
        return x is None or (isinstance(x, float) and math.isnan(x)) or bool(x != x)
    except (TypeError, ValueError):
        return False


def _is_bool(x) -> bool:
    """A Python or numpy boolean (numpy's is neither a bool nor registered as a number)."""
    return isinstance(x, bool) or (type(x).__module__ == "numpy" and type(x).__name__ in ("bool", "bool_"))


def significant(x, digits: int = 3, scientific: bool | None = None) -> str:
    """`x` to `digits` significant digits, trailing zeros kept; scientific notation below 1e-3 and from
    1e6 (or as `scientific` says); integral values of 10**digits and more as integers ("1234")."""
    if _is_missing(x):
        return MISSING
    if _is_bool(x):
        return "yes" if x else "no"
    if isinstance(x, numbers.Integral):
        return str(int(x))
    x = float(x)
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if x == 0:
        return "0"
    big = abs(x)
    if scientific is None:
        scientific = big < SCIENTIFIC_BELOW or big >= SCIENTIFIC_FROM
    if scientific:
        return _no_negative_zero(f"{x:.{digits - 1}e}")
    text = f"{x:#.{digits}g}"
    if big >= 10 ** digits or "e" in text:  # 1234.5, or 999.7 rounded up into the next decade
        text = f"{x:.0f}"
    return _no_negative_zero(text.rstrip("."))


def column_formatter(values, digits: int = 3):
    """One format for a column: integers, yes/no, or numbers to `digits` significant digits, in
    scientific notation throughout when the column needs it somewhere."""
    present = [v for v in values if not _is_missing(v)]
    if present and all(_is_bool(v) for v in present):
        return lambda v: significant(v)
    if present and all(isinstance(v, numbers.Integral) and not _is_bool(v) for v in present):
        return lambda v: significant(v)
    if not present or not all(isinstance(v, numbers.Real) and not _is_bool(v) for v in present):
        return lambda v: MISSING if _is_missing(v) else str(v)
    finite = [float(v) for v in present if math.isfinite(float(v))]
    sizes = [abs(v) for v in finite if v != 0]
    if sizes and all(v.is_integer() for v in finite) and max(sizes) < SCIENTIFIC_FROM:  # counts stored as floats
        return lambda v: significant(int(v)) if not _is_missing(v) and math.isfinite(float(v)) else significant(v)
    scientific = bool(sizes) and (min(sizes) < SCIENTIFIC_BELOW or max(sizes) >= SCIENTIFIC_FROM
                                  or max(sizes) / min(sizes) >= 10 ** digits)
    return lambda v: significant(v, digits, scientific=scientific)


class Table:
    """A DataFrame formatted for the book: `_repr_html_` for the page, the same text for a terminal."""

    def __init__(self, df, digits: int = 3, units: dict | None = None, names: dict | None = None,
                 index: bool | None = None, caption: str = ""):
        import pandas as pd

        self.data = df
        frame = df.reset_index() if (index if index is not None else not isinstance(df.index, pd.RangeIndex)) else df
        units, names = dict(units or {}), dict(names or {})
        unknown = sorted(set(units) - set(map(str, frame.columns)))
        if unknown:
            raise ValueError(f"units for columns the table does not have: {unknown}")
        levels = list(frame.columns.names)

        def label(c):  # a pivot table's column ("momentum 0.9, weight decay 0.0005"), else the column's name
            if not isinstance(c, tuple):
                named = len(levels) == 1 and levels[0] and not isinstance(c, str)  # a one-level pivot: "momentum 0.9"
                if named:
                    return f"{header_words(levels[0])} {_level_value(c)}"
                return str(names[str(c)]) if str(c) in names else header_words(c)
            if all(str(v) == "" for v in c[1:]):  # the index, moved into the columns
                return str(names[str(c[0])]) if str(c[0]) in names else header_words(c[0])
            return ", ".join(f"{header_words(lv)} {_level_value(v)}" if lv else str(v)
                             for lv, v in zip(levels, c) if str(v) != "")

        self.header = [label(c) + (f" ({units[str(c)]})" if str(c) in units else "") for c in frame.columns]
        self.numeric = [pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c])
                        for c in frame.columns]
        cells = []
        for c in frame.columns:
            values = frame[c].tolist()
            f = column_formatter(values, digits)
            cells.append([f(v) for v in values])
        self.rows = [list(r) for r in zip(*cells)] if cells else []
        self.caption = caption

    def _repr_html_(self) -> str:
        def cls(i):
            return ' class="num"' if self.numeric[i] else ""

        head = "".join(f"<th{cls(i)}>{html.escape(h)}</th>" for i, h in enumerate(self.header))
        body = "".join("<tr>" + "".join(f"<td{cls(i)}>{html.escape(v)}</td>" for i, v in enumerate(r)) + "</tr>"
                       for r in self.rows)
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return (f'<div class="lowrank-table-wrap"><table class="lowrank-table">{caption}<thead><tr>{head}</tr></thead>'
                f"<tbody>{body}</tbody></table></div>")

    def __repr__(self) -> str:
        widths = [max([len(h)] + [len(r[i]) for r in self.rows]) for i, h in enumerate(self.header)]

        def line(cells):
            return "  ".join(c.rjust(w) if self.numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

        return "\n".join([self.caption] * bool(self.caption) + [line(self.header)] + [line(r) for r in self.rows])


def table(df, digits: int = 3, units: dict | None = None, names: dict | None = None, index: bool | None = None,
          caption: str = "") -> Table:
    """`df` as a book table. units: `{column: unit}`, shown in the header ("wall (s)"); names: `{column:
    header}`; index: show the index as the first columns (default: when it is not a plain 0, 1, ... range)."""
    return Table(df, digits=digits, units=units, names=names, index=index, caption=caption)


def show(df, digits: int = 3, units: dict | None = None, names: dict | None = None, index: bool | None = None,
         caption: str = "") -> None:
    """Display `table(df, ...)` (in place of `print(df.to_string())`)."""
    from IPython.display import display

    display(table(df, digits=digits, units=units, names=names, index=index, caption=caption))


def text_dump(text: str, min_rows: int = 3) -> list[str]:
    """The lines of `text` (a cell's printed output) that read as a DataFrame printed as text: at least
    `min_rows` consecutive lines padded to one width, each with 3 or more whitespace-separated fields
    (the header may have one fewer: the index), numbers in most fields below the first line. [] when none."""
    lines = [line.rstrip("\n") for line in text.splitlines()]

    def numeric(token: str) -> bool:
        try:
            float(token.replace("−", "-"))
            return True
        except ValueError:
            return token in ("NaN", "nan", "None", "True", "False")

    found, run = [], []
    for line in lines + [""]:
        fields = line.split()
        if run and len(fields) >= 3 and len(line) == len(run[0]) and abs(len(fields) - len(run[-1].split())) <= 1:
            run.append(line)
            continue
        body = [f for row in run[1:] for f in row.split()]
        if len(run) >= min_rows and sum(map(numeric, body)) > len(body) / 2:
            found += run
        run = [line] if len(fields) >= 3 else []
    return found
