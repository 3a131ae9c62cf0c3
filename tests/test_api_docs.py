"""The API page (book/api.md): every module of the science and of a page's helpers is on it, and
docstrings reach Sphinx as plain-text blocks (lowrank.book.api_docs)."""

import re
from pathlib import Path

from lowrank.book.api_docs import as_literal_block

ROOT = Path(__file__).resolve().parents[1]
ON_THE_PAGE = ("core", "gradients", "sgd", "square")


def test_every_science_module_is_on_the_api_page():
    listed = set(re.findall(r"^\.\. automodule:: (\S+)$", (ROOT / "book" / "api.md").read_text(), flags=re.M))
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts)
               for sub in ON_THE_PAGE for p in (ROOT / "lowrank" / sub).rglob("*.py") if p.name != "__init__.py"}
    assert modules - listed == set(), "add these modules to book/api.md"
    assert {m for m in listed if not (ROOT / (m.replace(".", "/") + ".py")).is_file()} == set()


def test_a_docstring_becomes_a_text_block_word_for_word():
    lines = ["`|z^T r| / ||r||`, the statistic", "", "Parameters", "----------", "z : (n,)", "", ""]
    block = as_literal_block(lines)
    assert block[:2] == [".. code-block:: text", ""]
    assert [b[4:] if b else "" for b in block[2:-1]] == lines[:5]
    assert all(b.startswith("    ") for b in block[2:-1] if b)
    assert as_literal_block(["", "  "]) == []
