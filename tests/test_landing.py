"""The landing page's first screen (#43, #47 item 1): one generated sentence per paper saying what holds,
what fails and at which scale, on the first screen of a desktop (1366 x 900) and within the first two
screens of a phone (390 x 844), each with its links working. Reads the built book in Chromium
(tests/test_html.py's server and browser)."""

import pytest

from lowrank.book import ledger
from test_html import DESKTOP, PHONE, _open, browser, server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.book  # reads the built HTML book

_ANSWERS = """() => [...document.querySelectorAll('p.paper-answer')].map(p => {
  const r = p.getBoundingClientRect();
  return {part: p.dataset.part, scale: p.dataset.scale, top: r.top + window.scrollY, bottom: r.bottom + window.scrollY,
          text: p.innerText, links: [...p.querySelectorAll('a')].map(a => a.href)};
})"""


@pytest.mark.parametrize("viewport, screens", [(DESKTOP, 1), (PHONE, 2)], ids=["desktop", "phone"])
def test_each_papers_answer_is_on_the_first_screens(browser, server, viewport, screens):  # noqa: F811
    tab, outside, errors = _open(browser, server, "book/intro.html", viewport)
    try:
        answers = tab.evaluate(_ANSWERS)
        assert [a["part"] for a in answers] == list(ledger.PARTS), "one sentence per paper, in order"
        for a in answers:
            assert a["scale"] in ledger.SCALES and "claims agree" in a["text"] and "Every claim holds on" in a["text"]
            assert a["bottom"] <= screens * viewport["height"], \
                f"Part {a['part']}'s answer ends at {a['bottom']:.0f} px, below {screens} screen(s) of {viewport['height']} px"
            assert a["links"], f"Part {a['part']}'s answer links to its pages"
        for href in {h for a in answers for h in a["links"]}:
            assert tab.request.get(href).ok, f"{href} does not load"
        assert not errors
    finally:
        tab.context.close()
