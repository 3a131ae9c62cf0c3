"""The Sphinx extension behind the book's API page (`book/api.md`): docstrings shown as written.

The package's docstrings are plain text for `help()` and the terminal (formulas in backticks, bars
for norms, NumPy-like "Parameters" blocks), not reStructuredText; parsed as reST, a bar reads as a
substitution and an underline as a section title. So every docstring autodoc collects is shown as a
literal block, word for word. The book's configuration (`_config.yml`) has signatures leave out
type annotations (`autodoc_typehints: none`), whose cross-references to torch or NumPy types have
no target in this book.
"""

from __future__ import annotations

__all__ = ["as_literal_block", "setup"]


def as_literal_block(lines: list[str]) -> list[str]:
    """`lines` (one docstring, as autodoc passes it) as a plain-text literal block; empty stays empty."""
    if not any(line.strip() for line in lines):
        return []
    while not lines[-1].strip():
        lines = lines[:-1]
    return [".. code-block:: text", ""] + [f"    {line}" if line.strip() else "" for line in lines] + [""]


def _process(app, what, name, obj, options, lines) -> None:
    lines[:] = as_literal_block(list(lines))


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.connect("autodoc-process-docstring", _process)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
