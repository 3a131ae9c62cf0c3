// Figures shown smaller than they were drawn can be enlarged: click (or Enter) opens the image at
// its drawn size in an overlay (scrollable when wider than the window); click, Escape or the close
// button closes it. Marked images carry the class "enlargeable" (tests/test_html.py checks it).
// A figure with a phone layout (lowrank.book.plotting.phone_layout: named by its download links'
// data-phone) shows that layout in columns up to PHONE_QUERY wide; "Enlarge" still opens the wide one.
(function () {
  "use strict";
  const SHRUNK = 0.95; // displayed below 95 % of the drawn width: offer to enlarge
  const PHONE_QUERY = "(max-width: 600px)";
  // No text of a figure is drawn below 10 pt at 100 px per inch (lowrank.book.plotting.MIN_FONT, checked by
  // tests/test_figures.py): shown at LEGIBLE of its drawn width or more, it is at least 8 px high.
  const LEGIBLE = 8 / (10 * 100 / 72);

  function phoneLayouts() {
    document.querySelectorAll("p.figure-downloads[data-phone]").forEach((links) => {
      const cell = links.closest(".cell_output") || links.parentElement;
      const before = [...cell.querySelectorAll("img")].filter(
        (i) => i.compareDocumentPosition(links) & Node.DOCUMENT_POSITION_FOLLOWING);
      const img = before[before.length - 1];  // the figure these links belong to
      if (!img || img.closest("picture")) return;
      const picture = document.createElement("picture");
      const source = document.createElement("source");
      source.media = PHONE_QUERY;
      source.srcset = links.dataset.phone;
      img.dataset.wide = img.getAttribute("src");
      img.replaceWith(picture);
      picture.append(source, img);
    });
  }

  function overlay(img) {
    const box = document.createElement("div");
    box.className = "figure-overlay";
    box.setAttribute("role", "dialog");
    box.setAttribute("aria-label", "Enlarged figure: " + (img.alt || ""));
    const close = document.createElement("button");
    close.className = "figure-overlay-close";
    close.type = "button";
    close.textContent = "Close ×";
    const big = document.createElement("img");
    big.alt = img.alt;
    big.addEventListener("load", () => { big.style.width = big.naturalWidth + "px"; });
    big.src = img.dataset.wide || img.currentSrc || img.src;  // the wide layout, at its drawn size
    box.append(close, big);
    const shut = () => { box.remove(); document.removeEventListener("keydown", onKey); img.focus(); };
    const onKey = (e) => { if (e.key === "Escape") shut(); };
    box.addEventListener("click", shut);
    document.addEventListener("keydown", onKey);
    document.body.append(box);
    close.focus();
  }

  function mark(img) {
    if (!img.naturalWidth || img.closest(".figure-overlay")) return;
    const shown = img.getBoundingClientRect().width;
    const shrunk = shown > 0 && shown < SHRUNK * img.naturalWidth;
    img.classList.toggle("enlargeable", shrunk);
    if (img._zoomHint) img._zoomHint.hidden = !shrunk;
    if (shrunk && !img.dataset.zoomReady) {
      img.dataset.zoomReady = "1";
      img.tabIndex = 0;
      img.setAttribute("role", "button");
      img.title = "Click to enlarge (drawn " + img.naturalWidth + " px wide)";
      img.addEventListener("click", () => img.classList.contains("enlargeable") && overlay(img));
      const hint = document.createElement("span");
      hint.className = "zoom-hint";
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = "Enlarge the figure";
      button.addEventListener("click", () => overlay(img));
      hint.append(button, " (shown at " + Math.round(100 * shown / img.naturalWidth) + " % of its drawn size)");
      img.insertAdjacentElement("afterend", hint);
      img._zoomHint = hint;
      img.addEventListener("keydown", (e) => {
        if ((e.key === "Enter" || e.key === " ") && img.classList.contains("enlargeable")) { e.preventDefault(); overlay(img); }
      });
    }
  }

  /* In a phone's column, a figure still shown below LEGIBLE of its drawn width (one without a phone
   * layout) is shown at that width in a box that scrolls sideways (the page does not); "Enlarge" still
   * opens it whole. */
  function legible(img) {
    if (!img.naturalWidth || !img.closest(".cell_output") || img.closest(".figure-overlay")) return;
    const figure = img.closest("picture") || img;
    const narrow = window.matchMedia(PHONE_QUERY).matches;
    const box = figure.parentElement.classList.contains("figure-scroll") ? figure.parentElement : null;
    if (narrow && !box && img.getBoundingClientRect().width < LEGIBLE * img.naturalWidth - 0.5) {
      const scroll = document.createElement("div");
      scroll.className = "figure-scroll";
      figure.replaceWith(scroll);
      scroll.append(figure);
      img.style.width = Math.ceil(LEGIBLE * img.naturalWidth) + "px";
    } else if (!narrow && box) {
      img.style.width = "";
      box.replaceWith(figure);
    }
  }

  function markAll() {
    phoneLayouts();
    document.querySelectorAll("article.bd-article img, main article img").forEach((img) => {
      const both = () => { legible(img); mark(img); };
      if (img.complete) both(); else img.addEventListener("load", both, { once: true });
    });
    document.documentElement.dataset.figuresMarked = "1";
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", markAll); else markAll();
  window.addEventListener("load", markAll);
  window.addEventListener("resize", markAll);
})();
