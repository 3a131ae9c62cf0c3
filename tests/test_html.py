"""The rendered book in headless Chromium, as a reader sees it, with the network blocked.

Every page loads without JavaScript errors; every figure is an image that displayed, shown at no
less than 70 % of its drawn width unless the reader can enlarge it; no raw TeX is left (MathJax is
served with the book); internal links and anchors resolve; no page scrolls sideways on a phone.
Every notebook page's verdict section holds an HTML table with one row per glued verdict, each row
anchored as `verdict-<name>`; every notebook page ends with the rerun box. The ledger's summary
counts equal the verdicts the executed notebooks glued. A reader's view of the verdicts and figures:
at 390 px every verdict card's text column is at least MIN_VERDICT_COLUMN px wide and breaks no word
inside itself, at 1366 px every outcome lies inside the page and its table, the verdict fields write
formulas as typeset math (no ASCII formula outside it, ASCII_FORMULA), and every figure's smallest
text is shown at MIN_FIGURE_TEXT px or more at 390 px. Full-page screenshots of a few pages are
saved to `_build/screenshots/` for review.

Needs Debian's chromium (`apt-get install -y chromium`; `.ci/run` installs it, `make test` refuses
to start without it). Without it these tests fail, they are never skipped.
"""

import functools
import http.server
import re
import shutil
import threading
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote, urljoin, urlparse

import nbformat
import pytest

from lowrank.book import build, goldens, notebooks, pages, rules

pytestmark = pytest.mark.book  # reads the built HTML book

HTML = pages.BUILD / "html"
SCREENSHOTS = pages.BUILD / "screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run"]
MIN_SHOWN = 0.70  # a figure shown below 70 % of its drawn width must be enlargeable
DESKTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}
SHOTS = {"book/intro.html", "book/ledger.html", "notebooks/gradients/decomposition.html",
         "notebooks/square/neural_collapse.html", "book/bibliography.html"}
MIN_BODY = 300  # px: the body column of a notebook page on a phone
MIN_VERDICT_COLUMN = 200  # px: the narrowest text column of a verdict card on a phone
MIN_FIGURE_TEXT = 8.0  # px: a figure's smallest text as shown on a phone
FIGURE_DPI = 100  # px per inch of the PNGs a page shows (lowrank.book.plotting.use_style)
# A formula written as ASCII: norms as ||, subscripts and superscripts as _ and ^, sqrt( and min(,
# >= and ->, Greek letters spelled out. Verdict fields write formulas as $...$ (typeset by MathJax).
ASCII_FORMULA = re.compile(
    r"\|\||_perp|\bsqrt\(|>=|<=|!=|->|\^T\b|\w\^[\w({-]|\b[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9{]+|"
    r"\b(?:min|max|log|log2|exp|cos|sign)\(|"
    r"\b(?:nu|alpha|beta|gamma|sigma|rho|lambda|mu|eta|tau|theta|Theta|zeta|epsilon|eps|perp)\b")


def _pages() -> list[str]:
    return [f"{f}.html" for f in sorted(build.toc_files())]


def _notebook(page: str) -> str | None:
    return page[len("notebooks/"):-len(".html")] if page.startswith("notebooks/") else None


def _glued(name: str) -> dict:
    return goldens.notebook_verdicts(nbformat.read(build.executed_path(name), as_version=4))


@pytest.fixture(scope="module")
def server():
    assert (HTML / "index.html").is_file(), "build the book first (make book)"
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.fail("Chromium is missing: the browser check of the book needs it. "
                    "Install it with `sudo apt-get install -y chromium` (Debian/Ubuntu; .ci/run does this).")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield b
        b.close()


def _open(browser, server, page, viewport=DESKTOP):
    """A tab on `page` with every request off the local server aborted (the book must work offline);
    returns (tab, outside requests, JavaScript errors) once MathJax has typeset and figures are marked."""
    context = browser.new_context(viewport=viewport)
    outside, errors = [], []

    def route(r):
        if r.request.url.startswith(server) or r.request.url.startswith("data:"):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    tab = context.new_page()
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    response = tab.goto(urljoin(server, page), wait_until="load")
    assert response is not None and response.ok, f"{page} did not load"
    tab.evaluate("async () => { if (window.MathJax && MathJax.startup) await MathJax.startup.promise; }")
    tab.wait_for_function("document.documentElement.dataset.figuresMarked === '1'", timeout=10_000)
    return tab, outside, errors


class Loaded(NamedTuple):
    page: str
    tab: Any
    outside: list  # requests off the local server, aborted
    errors: list  # JavaScript errors


@pytest.fixture(scope="module")
def desktop(request, server, browser):
    """Page `request.param` loaded once at DESKTOP size for every check that only reads it: the fixture is
    module-scoped and parametrized, so pytest runs the checks of one page one after another on one tab
    (loading a page and typesetting its math takes seconds; the per-page checks would load it four times)."""
    tab, outside, errors = _open(browser, server, request.param)
    yield Loaded(request.param, tab, outside, errors)
    tab.context.close()


_CHECK_JS = """() => {
  const main = document.querySelector('main') || document.body;
  const imgs = [...(document.querySelector('article') || main).querySelectorAll('img')];
  const mathText = [...main.querySelectorAll('p, li, td, dd, .math, h1, h2, h3, .admonition-title')]
      .filter(e => !e.closest('pre, code, .highlight, mjx-container, script')).map(e => e.innerText).join('\\n');
  return {
    images: imgs.map(i => ({src: i.getAttribute('src'), alt: i.alt, ok: i.complete && i.naturalWidth > 0,
                            shown: i.getBoundingClientRect().width, drawn: i.naturalWidth,
                            enlargeable: i.classList.contains('enlargeable')})),
    links: [...main.querySelectorAll('a[href]')].map(a => a.href),
    problematic: main.querySelectorAll('.problematic, .xref.std-ref:not(a)').length,
    text: main.innerText,
    mathText: mathText,
    typeset: main.querySelectorAll('mjx-container').length,
    rawMath: main.querySelectorAll('span.math, div.math').length,
  };
}"""


@pytest.mark.parametrize("desktop", _pages(), indirect=True)
def test_page_offline_figures_math_links(desktop, server):
    page, tab, outside, errors = desktop
    info = tab.evaluate(_CHECK_JS)
    assert not errors, f"{page}: JavaScript errors {errors}"
    broken = [i["src"] for i in info["images"] if not i["ok"]]
    assert not broken, f"{page}: images that did not display: {broken}"
    small = [f"{i['src']} shown {i['shown']:.0f} of {i['drawn']} px" for i in info["images"]
             if i["shown"] < MIN_SHOWN * i["drawn"] and not i["enlargeable"]]
    assert not small, f"{page}: figures shown below {MIN_SHOWN:.0%} of their width and not enlargeable: {small}"
    hashes = [i["alt"] for i in info["images"] if re.search(r"\.(png|svg)$|[0-9a-f]{16}", i["alt"] or "")]
    assert not hashes, f"{page}: alt text that is a file name: {hashes}"
    # MathJax is served with the book: with the network blocked no formula stays raw TeX
    assert "\\(" not in info["mathText"] and "$$" not in info["mathText"], f"{page}: raw TeX left on the page"
    if info["rawMath"]:
        assert info["typeset"] > 0, f"{page}: {info['rawMath']} formulas, none typeset by MathJax"
    assert not [u for u in outside if "mathjax" in u.lower()], f"{page}: MathJax requested from the network"
    assert info["problematic"] == 0, f"{page}: unresolved references"
    assert "??" not in info["text"], f"{page}: an unresolved cross-reference prints '??'"
    for link in info["links"]:
        url = urlparse(link)
        if not link.startswith(server):
            continue
        target = HTML / unquote(url.path.lstrip("/"))
        if target.is_dir():
            target = target / "index.html"
        assert target.is_file(), f"{page}: broken internal link {link}"
        if url.fragment and target.suffix == ".html":
            assert f'id="{url.fragment}"' in target.read_text(), f"{page}: missing anchor {link}"
    name = _notebook(page)
    if name:
        declared = sum("plotting.save_figure(" in line and "optional figure" not in line  # see test_notebooks
                       for line in notebooks.source_path(name).read_text().splitlines())
        assert len(info["images"]) >= declared, f"{page}: {len(info['images'])} images, {declared} figures declared"
    if page in SHOTS:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(SCREENSHOTS / (page.replace("/", "__")[:-5] + ".png")), full_page=True)


_VERDICT_JS = """() => {
  const section = document.getElementById('verdict');
  if (!section) return null;
  const tables = [...section.querySelectorAll('table')].filter(t =>
      [...t.querySelectorAll('thead th')].some(th => th.innerText.trim().toLowerCase() === 'outcome'));
  return tables.map(t => ({rows: t.querySelectorAll('tbody tr').length,
                           ids: [...t.querySelectorAll('tbody tr')].map(r => r.id),
                           pipes: t.innerText.includes('|---')}));
}"""


@pytest.mark.parametrize("desktop", [p for p in _pages() if _notebook(p)], indirect=True)
def test_verdict_section_is_a_table_with_one_anchored_row_per_verdict(desktop):
    page, tab = desktop.page, desktop.tab
    tables = tab.evaluate(_VERDICT_JS)
    glued = _glued(_notebook(page))
    assert tables is not None, f"{page}: no section with id 'verdict'"
    assert tables, f"{page}: the verdict section has no HTML table (raw Markdown?)"
    assert sum(t["rows"] for t in tables) == len(glued), f"{page}: {tables} rows, {len(glued)} verdicts glued"
    ids = {i for t in tables for i in t["ids"]}
    assert ids == {f"verdict-{n}" for n in glued}, f"{page}: verdict rows not anchored as verdict-<name>"
    text = tab.inner_text("main")
    assert "| ---" not in text and "|---" not in text, f"{page}: raw table text"
    # the rerun box, from the one template, with the page's own parameters
    box = tab.locator("#rerun-this-page")
    assert box.count() == 1, f"{page}: no rerun box"
    box_text = box.inner_text()
    assert f"lowrank run {_notebook(page)}" in box_text
    assert len(rules.parameter_specs(_notebook(page))) == box.locator(".rerun-parameter-table tbody tr").count()


def test_ledger_summary_counts_equal_the_glued_verdicts(server, browser):
    """Counted here from the executed notebooks directly, not through the ledger's code; verdicts on
    the book's own hypotheses (details beyond_paper) are listed apart, not counted with the papers'."""
    expected, beyond = Counter(), 0
    for name in build.book_notebooks():
        for v in _glued(name).values():
            if (v.get("details") or {}).get("beyond_paper"):
                beyond += 1
            else:
                expected[(v["kind"], v["outcome"])] += 1
    assert beyond >= 1  # conv_residual_along_filter_ntk (I-8)
    for page in ("book/ledger.html", "book/intro.html"):
        tab, _, _ = _open(browser, server, page)
        shown = tab.evaluate("""() => [...document.querySelectorAll('.ledger-cards[data-scale="ci"] .count')]
            .map(e => [e.dataset.kind, e.dataset.outcome, Number(e.innerText)])""")
        got = Counter({(k, o): n for k, o, n in shown if n})
        assert got == +expected, f"{page}: summary {dict(got)} vs glued {dict(expected)}"
        if page == "book/ledger.html":
            sticky = tab.evaluate("() => [...document.querySelectorAll('table.ledger-table.rows thead th')]"
                                  ".every(th => getComputedStyle(th).position === 'sticky')")
            assert sticky, "the ledger's table headers do not stick"
        tab.context.close()


def test_landing_page_says_what_each_paper_found(server, browser):
    """Each part's generated sentences, with the counts taken here from the glued verdicts directly; the
    outcome words defined before their first use; the pages by scale, one row per page of the part."""
    from lowrank.book import paper_results

    tab, _, _ = _open(browser, server, "book/intro.html")
    found = tab.evaluate("""() => Object.fromEntries([...document.querySelectorAll('p.paper-summary')]
        .map(p => [p.dataset.part, p.innerText]))""")
    matrix = tab.evaluate("""() => Object.fromEntries([...document.querySelectorAll('section.paper-block')]
        .map(s => [s.dataset.part, s.querySelectorAll('table.ledger-matrix tbody tr').length]))""")
    order = tab.evaluate("""() => { const t = document.querySelector('article').innerHTML;
        return [t.indexOf('outcome-legend'), t.indexOf('paper-summary')]; }""")
    tab.context.close()
    assert 0 <= order[0] < order[1], "the outcome words are not defined before the summaries use them"
    for part in ("I", "II", "III"):
        paper_verdicts = {n: [v for v in _glued(n).values() if v["claim_id"].split("-")[0] == part
                              and not (v.get("details") or {}).get("beyond_paper")] for n in build.book_notebooks()}
        names = [n for n, found in paper_verdicts.items() if found]  # a page only beyond the paper has no row
        claims = [v for n in names for v in paper_verdicts[n] if v["kind"] == "claim"]
        agree = sum(v["outcome"] == "agrees" for v in claims)
        text = found.get(part, "")
        assert f"At ci scale, {agree} of {len(claims)} claims agree" in text if agree else f"of {len(claims)} claims" in text, \
            f"Part {part}: {text!r}"
        stored = [n for n in names if paper_results.paper_results(n) is not None]
        assert ("At paper scale (" in text) == bool(stored), f"Part {part}: {text!r}"
        if len(stored) < len(names):
            assert "run at paper scale (" in text, f"Part {part} does not say what has not run and why: {text!r}"
        assert matrix.get(part) == len(names), f"Part {part}: {matrix.get(part)} rows for {len(names)} pages"


def test_ledger_rows_link_to_their_verdicts_and_read_on_a_phone(server, browser):
    n_glued = sum(len(_glued(n)) for n in build.book_notebooks())
    tab, _, _ = _open(browser, server, "book/ledger.html", viewport=PHONE)
    links = tab.evaluate("""() => [...document.querySelectorAll('table.ledger-table.rows a[href*="#verdict-"]')]
        .map(a => a.getAttribute('href'))""")
    assert len(links) == n_glued, f"{len(links)} deep links for {n_glued} glued verdicts"
    width = tab.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert width[0] <= width[1] + 1, f"the ledger scrolls sideways on a phone: {width}"
    box = tab.locator("table.ledger-table.rows tbody tr td[data-label='ci scale']").first.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], \
        "the ci-scale outcome is off-screen on a phone"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SCREENSHOTS / "book__ledger-phone.png"), full_page=True)
    tab.context.close()


_LAYOUT_JS = """() => {
  const article = document.querySelector('article.bd-article') || document.querySelector('main');
  const para = [...article.querySelectorAll(':scope > section > p, :scope > section > section > p')]
      .map(p => p.getBoundingClientRect().width).filter(w => w > 0);
  const margins = [...article.querySelectorAll('aside.margin, aside.sidebar')].map(a => a.getBoundingClientRect().width);
  const rows = [...document.querySelectorAll('table.verdict-table tbody tr')].map(r => getComputedStyle(r).display);
  // the verdict cards' text columns and the words broken inside themselves (a word on two lines)
  const cells = [...document.querySelectorAll('table.verdict-table tbody td.vcol-verdict, table.verdict-table tbody td.vcol-measured')];
  const broken = [];
  for (const cell of cells) {
    const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT,
        {acceptNode: n => n.parentElement.closest('mjx-container') ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
    for (let node = walk.nextNode(); node; node = walk.nextNode()) {
      for (const m of node.data.matchAll(/[^\\s\\-\\/–—]+/g)) {  // a hyphen or a slash may end a line
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        if (new Set([...range.getClientRects()].map(r => Math.round(r.top))).size > 1) broken.push(m[0]);
      }
    }
  }
  // each outcome inside the viewport and inside the box that clips it (a table wrapper scrolling sideways)
  const cut = [];
  for (const badge of document.querySelectorAll('table.verdict-table tbody td.vcol-outcome')) {
    const box = badge.getBoundingClientRect();
    let right = document.documentElement.clientWidth, left = 0;
    for (let e = badge.parentElement; e; e = e.parentElement) {
      if (['auto', 'scroll', 'hidden', 'clip'].includes(getComputedStyle(e).overflowX)) {
        const r = e.getBoundingClientRect();
        right = Math.min(right, r.right); left = Math.max(left, r.left);
      }
    }
    if (box.right > right + 1 || box.left < left - 1) cut.push(badge.closest('tr').id);
  }
  return {scroll: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
          body: para.length ? Math.min(...para) : null, margins: margins, verdictRows: rows,
          verdictColumn: cells.length ? Math.min(...cells.map(c => c.getBoundingClientRect().width)) : null,
          broken: broken, cut: cut};
}"""


@pytest.mark.parametrize("desktop", _pages(), indirect=True)
def test_pages_do_not_scroll_sideways_on_a_desktop(desktop):
    _check_layout(desktop.page, desktop.tab, DESKTOP)


@pytest.mark.parametrize("page", _pages())
def test_pages_do_not_scroll_sideways_and_keep_a_readable_column_on_a_phone(page, server, browser):
    tab, _, _ = _open(browser, server, page, viewport=PHONE)
    _check_layout(page, tab, PHONE)
    tab.context.close()


def _check_layout(page, tab, viewport):
    """Code blocks and wide tables scroll inside their own box; the page itself never does. Every verdict's
    outcome is inside the page and its table. On a phone a notebook page's paragraphs keep at least
    MIN_BODY px (margin notes join the flow), its verdict tables read as cards whose text columns keep
    MIN_VERDICT_COLUMN px without breaking a word, and its figures' text is legible."""
    info = tab.evaluate(_LAYOUT_JS)
    width = info["scroll"]
    assert width[0] <= width[1] + 1, f"{page} scrolls sideways at {viewport['width']} px: {width}"
    if viewport is PHONE and _notebook(page):
        assert info["body"] is not None and info["body"] >= MIN_BODY, \
            f"{page}: body column {info['body']} px at {PHONE['width']} px (margin notes {info['margins']})"
        assert all(w >= MIN_BODY for w in info["margins"]), f"{page}: margin notes still float: {info['margins']}"
        assert info["verdictRows"] and set(info["verdictRows"]) <= {"block", "grid"}, \
            f"{page}: verdict rows are not cards on a phone: {set(info['verdictRows'])}"
        assert info["verdictColumn"] >= MIN_VERDICT_COLUMN, \
            f"{page}: a verdict card's text column is {info['verdictColumn']:.0f} px at {PHONE['width']} px"
        assert not info["broken"], f"{page}: words broken inside themselves in the verdict cards: {info['broken'][:8]}"
        _check_figure_text(page, tab)
    if _notebook(page):
        assert not info["cut"], f"{page}: outcomes cut off at {viewport['width']} px: {info['cut']}"
    if page in SHOTS and viewport is PHONE:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(SCREENSHOTS / (page.replace("/", "__")[:-5] + "-phone.png")), full_page=True)


_FIGURES_JS = """() => [...document.querySelectorAll('article img')].map(img => {
  const cell = img.closest('.cell_output');
  const links = cell ? [...cell.querySelectorAll('p.figure-downloads')].find(p =>
      img.compareDocumentPosition(p) & Node.DOCUMENT_POSITION_FOLLOWING) : null;
  const svg = links ? [...links.querySelectorAll('a')].map(a => a.href).find(h => h.endsWith('.svg')) : null;
  return {src: img.currentSrc, shown: img.getBoundingClientRect().width, drawn: img.naturalWidth, svg: svg};
})"""


def _check_figure_text(page, tab):
    """Every figure's smallest text (its SVG's smallest font, the same in the phone layout) as shown:
    points at FIGURE_DPI px per inch, scaled by the shown over the drawn width of the PNG on screen."""
    from lowrank.book import plotting

    tab.wait_for_function("() => [...document.querySelectorAll('article img')].every(i => i.complete && i.naturalWidth > 0)",
                          timeout=10_000)
    small = []
    for img in tab.evaluate(_FIGURES_JS):
        if not img["svg"]:
            continue  # not a figure of the book (save_figure names its SVG under every figure)
        svg = HTML / unquote(urlparse(img["svg"]).path.lstrip("/"))
        text_px = plotting.legibility(svg)["min_font_pt"] * FIGURE_DPI / 72 * img["shown"] / img["drawn"]
        if text_px < MIN_FIGURE_TEXT:
            small.append(f"{img['src'].rsplit('/', 1)[-1]}: {text_px:.1f} px")
    assert not small, f"{page}: figure text below {MIN_FIGURE_TEXT} px at {PHONE['width']} px: {small}"


_VERDICT_TEXT_JS = """() => [...document.querySelectorAll('table.verdict-table tbody tr, #verdict-details dt, #verdict-details dd')]
  .map(r => { const c = r.cloneNode(true); c.querySelectorAll('mjx-container, code').forEach(m => m.remove());
              return [r.id || r.tagName, c.textContent]; })"""


@pytest.mark.parametrize("desktop", [p for p in _pages() if _notebook(p)], indirect=True)
def test_verdict_fields_write_formulas_as_math(desktop):
    """Claim, expects, origin, controls, notes and regimes: no formula left as ASCII outside the typeset
    math (the numbers behind each row, shown as code, and file paths aside)."""
    texts = [(row, re.sub(r"\S*/\S*\.\w+", "", text)) for row, text in desktop.tab.evaluate(_VERDICT_TEXT_JS)]  # paths aside
    found = [(row, m.group(0), text[max(0, m.start() - 30):m.end() + 30]) for row, text in texts
             for m in [ASCII_FORMULA.search(text)] if m]
    assert not found, f"{desktop.page}: ASCII formulas in verdict fields: {found[:6]}"


def test_the_ascii_formula_pattern_finds_what_the_pages_wrote_before():
    for text in ("||sigma'_perp||_2 = Theta(n) for ReLU where 2 nu > 1 - alpha", "min(rho / 0.5, fall) >= 1",
                 "u1 along X_B^T r", "||E|| / ||S1|| -> 0", "Theta(sqrt n)", "nc2_equinorm_classifiers"):
        assert ASCII_FORMULA.search(text), text
    for text in ("the fall of the mean final rank from the largest to the smallest batch", "MLP-BN-4-64 on 8x8 digits",
                 "effect size fixed in advance: a 20 % drop", "Theorem 3.2 (left side at most the right)"):
        assert not ASCII_FORMULA.search(text), text


_VERDICT_MATH_JS = """() => [...document.querySelectorAll('table.verdict-table tbody tr, table.ledger-table tbody tr')]
  .map(r => { const a = r.querySelector('a[href*="#verdict-"]');
              return {id: r.id || (a ? a.getAttribute('href') : ''), typeset: r.querySelectorAll('mjx-container').length,
                      raw: ['$', '\\\\(', '\\\\)'].some(t => r.innerText.includes(t))}; })"""


def _latex_verdicts() -> dict:
    """{verdict name: record} of every glued verdict that carries a LaTeX description."""
    return {k: v for n in build.book_notebooks() for k, v in _glued(n).items() if v.get("latex")}


@pytest.mark.parametrize("desktop", ["book/ledger.html"] + [p for p in _pages() if _notebook(p)], indirect=True)
def test_verdict_descriptions_render_their_math(desktop):
    """A verdict glued with `latex` shows it typeset by MathJax, in its page's table and in the ledger; no
    verdict table shows raw TeX. (Which verdicts carry `latex` is up to each page: this checks every one that does.)"""
    with_latex = _latex_verdicts()
    page = desktop.page
    rows = desktop.tab.evaluate(_VERDICT_MATH_JS)
    assert rows, f"{page}: no verdict rows"
    raw = [r["id"] for r in rows if r["raw"]]
    assert not raw, f"{page}: verdict rows with raw TeX: {raw}"
    for r in rows:
        name = r["id"].rsplit("verdict-", 1)[-1]
        if name in with_latex:
            assert r["typeset"] > 0, f"{page}: {name} has a LaTeX description that is not typeset"


def _text_dumps(page: str) -> list[str]:
    """The first line of every DataFrame printed as text in `page`'s outputs (lowrank.book.tables.text_dump),
    and every DataFrame left to pandas' own HTML (all digits, no units: `class="dataframe"`)."""
    from lowrank.book.tables import text_dump

    found = []
    for cell in nbformat.read(build.executed_path(_notebook(page)), as_version=4).cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                found += text_dump(out.get("text", ""))[:1]
            if 'class="dataframe' in str(out.get("data", {}).get("text/html", "")):
                found.append("a DataFrame in pandas' own HTML (unformatted)")
    return found


@pytest.mark.parametrize("page", [p for p in _pages() if _notebook(p)])
def test_no_dataframe_is_printed_as_text(page):
    dumps = _text_dumps(page)
    assert not dumps, f"{page}: DataFrames printed as text (use lowrank.book.tables.show): {dumps}"


def test_long_code_is_folded_and_figures_enlarge(server, browser):
    tab, _, _ = _open(browser, server, "notebooks/gradients/decomposition.html")
    folded = tab.evaluate("""() => [...document.querySelectorAll('details.hide')].filter(d => !d.open)
        .map(d => d.querySelector('pre').textContent.trim().split('\\n').length)""")
    assert folded and min(folded) > 10, f"long code cells are not folded: {folded}"
    # the parameter cell folded too: the page leads with its prose, the defaults are in the rerun box
    assert tab.locator(".cell.tag_parameters details.hide").count() == 1, "the parameter cell is not folded"
    img = tab.locator("img.enlargeable").first
    if img.count():
        img.click()
        shown = tab.evaluate("() => { const i = document.querySelector('.figure-overlay img'); "
                             "return i && [i.getBoundingClientRect().width, i.naturalWidth]; }")
        assert shown and shown[0] >= 0.99 * shown[1], f"the enlarged figure is not at its drawn size: {shown}"
        tab.keyboard.press("Escape")
        assert tab.locator(".figure-overlay").count() == 0
    tab.context.close()


def test_theorem_boxes_carry_the_papers_numbers(server, browser):
    """The part overview cites the decomposition by its prf label; box and link read "Proposition 2.1"."""
    index = (HTML / "book" / "gradients" / "index.html").read_text()
    assert "decomposition.html#prop-gradient-decomposition" in index
    tab, _, _ = _open(browser, server, "notebooks/gradients/decomposition.html")
    titles = tab.evaluate("() => [...document.querySelectorAll('.admonition-title .caption-number')]"
                          ".map(e => e.innerText.trim())")
    assert "Proposition 2.1" in titles and "Theorem 3.1" in titles, titles
    tab.context.close()
    tab, _, _ = _open(browser, server, "book/gradients/index.html")
    ref = tab.locator("a[href*='#prop-gradient-decomposition']").first.inner_text()
    assert ref.strip() == "Proposition 2.1", ref
    tab.context.close()


def test_bibliography_is_author_year_with_links(server, browser):
    tab, _, _ = _open(browser, server, "book/bibliography.html")
    text = tab.inner_text("main")
    assert "Galanti et al., 2022" in text and "GSGP22" not in text
    hrefs = tab.evaluate("() => [...document.querySelectorAll('main a[href]')].map(a => a.href)")
    assert "https://arxiv.org/abs/2206.05794" in hrefs and "https://arxiv.org/abs/2510.01303" in hrefs
    tab.context.close()


def test_executed_notebooks_download_with_the_setup_cell():
    for name in build.book_notebooks():
        nb = nbformat.read(HTML / "_sources" / "notebooks" / f"{name}.ipynb", as_version=4)
        assert "colab-setup" in nb.cells[0].metadata.get("tags", [])
        assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{name}: no outputs"
