"""The rendered book in headless Chromium: every page loads, every figure is an image that
displayed, internal links and anchors resolve, theorem references resolve. Screenshots of a few
pages are saved to `_build/screenshots/` as build artefacts.

Needs Debian's chromium (`.ci/run` installs it); without it the test is skipped, except in CI.
"""

import functools
import http.server
import os
import shutil
import threading
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest

from lowrank.book import build, notebooks

HTML = build.BUILD / "html"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-quic", "--no-first-run"]

if CHROMIUM is None:
    pytestmark = pytest.mark.skipif(not os.environ.get("CI"), reason="chromium is not installed")


def _pages() -> list[str]:
    files = [f for f in build.toc_files()]
    return [f"{f}.html" for f in sorted(files)]


@pytest.fixture(scope="module")
def server():
    assert (HTML / "index.html").is_file(), "build the book first (make book)"
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(HTML))
    handler.log_message = lambda *a, **k: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    assert CHROMIUM, "chromium is required in CI: apt-get install chromium"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield b
        b.close()


_CHECK_JS = """() => {
  const main = document.querySelector('main') || document.body;
  const imgs = [...main.querySelectorAll('img')];
  return {
    title: document.title,
    images: imgs.map(i => ({src: i.getAttribute('src'), ok: i.complete && i.naturalWidth > 0})),
    links: [...main.querySelectorAll('a[href]')].map(a => a.href),
    ids: [...document.querySelectorAll('[id]')].map(e => e.id),
    problematic: main.querySelectorAll('.problematic, .xref.std-ref:not(a)').length,
    text: main.innerText,
  };
}"""


@pytest.mark.parametrize("page", _pages())
def test_page_loads_with_figures_and_working_links(page, server, browser):
    tab = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    response = tab.goto(urljoin(server, page), wait_until="load")
    assert response is not None and response.ok, f"{page} did not load"
    info = tab.evaluate(_CHECK_JS)
    assert not errors, f"{page}: JavaScript errors {errors}"
    broken = [i["src"] for i in info["images"] if not i["ok"]]
    assert not broken, f"{page}: images that did not display: {broken}"
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
    if page.startswith("notebooks/"):
        name = page[len("notebooks/"):-len(".html")]
        declared = notebooks.source_path(name).read_text().count("plotting.save_figure(")
        assert len(info["images"]) >= declared, f"{page}: {len(info['images'])} images, {declared} figures declared"
        assert "Verdict" in info["text"]
    if page in ("book/intro.html", "book/ledger.html") or page.startswith("notebooks/gradients/decomposition"):
        out = build.BUILD / "screenshots"
        out.mkdir(exist_ok=True)
        tab.screenshot(path=str(out / (page.replace("/", "__")[:-5] + ".png")), full_page=True)
    tab.close()


def test_theorem_references_resolve():
    """The part overview cites the decomposition by its prf label; the link lands on the theorem box."""
    index = (HTML / "book" / "gradients" / "index.html").read_text()
    assert "decomposition.html#prop-gradient-decomposition" in index
    target = (HTML / "notebooks" / "gradients" / "decomposition.html").read_text()
    assert 'id="prop-gradient-decomposition"' in target
