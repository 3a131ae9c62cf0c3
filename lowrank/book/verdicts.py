"""Verdicts: a measured number set against what the paper claims, glued into the notebook.

A notebook calls `record(...)` once per verdict. The record is glued (myst-nb `glue`) twice:
under its name, the measured value (for `{glue:text}` in prose), and under `verdict.<name>`, the
whole record as JSON text (read back by the claims ledger and the golden-value tests).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

__all__ = ["Verdict", "record", "show", "summary", "GLUE_PREFIX"]

GLUE_PREFIX = "verdict."


@dataclass(frozen=True)
class Verdict:
    name: str  # identifier, e.g. "identity_residual"
    claim: str  # CLAIMS.md id, e.g. "I-1"
    measured: float
    expected: str  # the paper's expectation, in words / as an inequality
    agrees: bool
    scale: str  # "ci" or "paper"
    description: str = ""
    note: str = ""  # e.g. why a claim needs the paper scale
    details: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.agrees, bool):
            object.__setattr__(self, "agrees", bool(self.agrees))
        object.__setattr__(self, "measured", float(self.measured))

    def as_dict(self) -> dict:
        return asdict(self)

    def rounded(self, digits: int = 3) -> str:
        """The verdict as one line, stable across reruns: values at round-off level (|m| < 1e-10)
        print as such, since their digits depend on the summation order (thread count)."""
        m = self.measured
        if not math.isfinite(m):
            value = str(m)
        elif abs(m) < 1e-10:
            value = "round-off (< 1e-10)"
        else:
            value = f"{m:.{digits}g}"
        return f"{self.claim} {self.name}: {value} ({'agrees' if self.agrees else 'DISAGREES'})"


def record(name, *, claim, measured, expected, agrees, scale, description="", note="", details=None) -> Verdict:
    """Build a Verdict and glue it (inside a notebook); returns it for display."""
    v = Verdict(name, claim, measured, expected, agrees, scale, description, note, dict(details or {}))
    text = _JsonText(json.dumps(v.as_dict()))  # fails now, not in the ledger, if details are not JSON-able
    try:
        from myst_nb import glue
    except ImportError:  # outside a book build the record is still returned
        return v
    glue(name, v.measured, display=False)
    glue(GLUE_PREFIX + name, text, display=False)
    return v


class _JsonText(str):
    """Glued as its text/plain repr, which is the JSON itself (nbformat keeps prefixed mimetypes as text)."""

    def __repr__(self):
        return str(self)


def summary(verdicts, digits: int = 3) -> str:
    """One rounded line per verdict: stable across runs, so nbval can check it."""
    return "\n".join(v.rounded(digits) for v in verdicts)


def show(verdicts):
    """Display the verdict box that ends every notebook."""
    from IPython.display import Markdown, display

    rows = [
        "| claim | verdict | measured | paper expects | agrees |",
        "|---|---|---|---|---|",
    ]
    for v in verdicts:
        rows.append(
            f"| {v.claim} | {v.description or v.name} | {v.measured:.4g} | {v.expected} | "
            f"{'yes' if v.agrees else '**no**'} |"
        )
    notes = [f"- *{v.name}*: {v.note}" for v in verdicts if v.note]
    scale = ", ".join(sorted({v.scale for v in verdicts}))
    text = f"**Verdict** (scale: {scale})\n\n" + "\n".join(rows) + ("\n\n" + "\n".join(notes) if notes else "")
    display(Markdown(text))
