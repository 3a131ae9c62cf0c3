"""What every page of the book shows a reader, generated in one place (the notebooks stay as written).

- **Rerun box**: a "Rerun this page" section at the end of every notebook page, from one template:
  `lowrank run PART/NAME`, the paper-scale command with its YAML and cost note, an example `-p`,
  and the table of parameters the page allows (read by `lowrank.book.runs.parameter_specs`, the
  same parsing `lowrank run` uses), with when and how long the page executed.
- **Verdict rows**: a page's verdict table is rebuilt from the glued records in four columns (claim;
  the verdict with what it expects and the threshold's origin; the measured value with its controls;
  the outcome as a colour badge), which fit the page column and read as cards on a phone; every row
  gets the anchor `verdict-<name>` (the ledger links there); `$...$` in any of its text is typeset.
  The verdicts' details, notes and excluded runs follow the table in a folded block.
- **Code folded**: the parameter cell and code cells longer than `FOLD_LINES` lines are folded behind a
  "Show code" toggle (still in the notebook, still runnable).
- **Theorem boxes numbered as the papers number them**: "Proposition 2.1" when the title cites
  "Prop. 2.1 of ...", no number when the title cites none (sphinx-proof would count 1, 2, ...);
  references to the box read the same.
- **Launch and provenance**: the Colab button opens the executed notebook the book publishes
  (its first cell installs the package); the footer names the commit, the build date and the scale.
- **Figures**: `static/reader.js` lets every figure shown smaller than it was drawn be enlarged; in a
  phone's column it shows a figure's phone layout (`lowrank.book.plotting.phone_layout`), or, for the few
  figures without one, the wide figure at a legible width in a box that scrolls sideways.
"""

from __future__ import annotations

import html
import json
import re
import shlex
import subprocess
import time
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.transforms.post_transforms import SphinxPostTransform

ROOT = Path(__file__).resolve().parents[2]
STATIC = Path(__file__).resolve().parent / "static"
FOLD_LINES = 10  # code cells longer than this are folded
NOTEBOOK_PREFIX = "notebooks/"
# "Prop. 2.1", "Props. 4.3 and 4.4", "Theorem 3.2", "Theorems 5 and 6", "Lemma 8", "Prop. A", "Remark 1"
_PAPER_NUMBER = re.compile(
    r"\b(?:Props?\.|Propositions?|Theorems?|Lemmas?|Remarks?|Corollar(?:y|ies)|Definitions?|Observations?)\s+"
    r"((?:[A-Z]|\d+(?:\.\d+)*)(?:\s*(?:,|and|-|–)\s*(?:[A-Z]|\d+(?:\.\d+)*))*)\b")


# --- configuration -------------------------------------------------------------------------------

def _git(*args) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def build_scale(outdir) -> tuple[str, Path]:
    """("paper", _build/paper/executed) for the paper-scale book (`make paper` renders into
    _build/paper/), else ("ci", _build/executed)."""
    paper = ROOT / "_build" / "paper"
    if paper in Path(outdir).resolve().parents:
        return "paper", paper / "executed"
    return "ci", ROOT / "_build" / "executed"


_SCALE = {"scale": "ci", "executed": ROOT / "_build" / "executed"}  # set at config-inited


def provenance() -> dict:
    """Commit (with `-dirty` when the tree has uncommitted changes), the commit's date (UTC), scale.

    The commit's date, not the build's: the footer lives in the Sphinx configuration, whose hash a
    clock would change every minute, so that every warm build rewrote all pages."""
    commit = _git("rev-parse", "--short=10", "HEAD") or "unknown"
    if _git("status", "--porcelain", "--untracked-files=no"):
        commit += "-dirty"
    stamp = _git("log", "-1", "--format=%ct")
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(int(stamp))) if stamp.isdigit() else "an unknown date"
    return {"commit": commit, "date": date, "scale": _SCALE["scale"]}


def repository(app) -> tuple[str, str]:
    """(url, branch) of `repository:` in _config.yml, the one place the repository is named."""
    opts = app.config.html_theme_options
    return opts.get("repository_url", "").rstrip("/"), opts.get("repository_branch", "main") or "main"


def _config_inited(app, config):
    config.html_static_path = [*config.html_static_path, str(STATIC)]
    _SCALE["scale"], _SCALE["executed"] = build_scale(app.outdir)
    p = provenance()
    url, _ = repository(app)
    commit = p["commit"].removesuffix("-dirty")
    link = f'<a href="{html.escape(url)}/tree/{commit}">{html.escape(p["commit"])}</a>' if url and commit != "unknown" \
        else html.escape(p["commit"])
    config.html_theme_options["extra_footer"] = (
        f'<p class="build-provenance">Built from commit {link} of {p["date"]}; every notebook executed at '
        f'<strong>{p["scale"]}</strong> scale (see <em>Rerun this page</em> on each page for the paper\'s).</p>')


# --- rerun box -----------------------------------------------------------------------------------

def _notebook_name(docname: str) -> str | None:
    return docname[len(NOTEBOOK_PREFIX):] if docname.startswith(NOTEBOOK_PREFIX) else None


def _short(value, limit: int = 60) -> str:
    text = json.dumps(value) if isinstance(value, (list, dict)) else repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _table(header: list[str], rows: list[list], classes: list[str]) -> nodes.table:
    table = nodes.table(classes=classes)
    group = nodes.tgroup(cols=len(header))
    table += group
    group.extend(nodes.colspec(colwidth=1) for _ in header)

    def row(cells):
        r = nodes.row()
        for c in cells:
            entry = nodes.entry()
            entry += c if isinstance(c, nodes.Node) else nodes.paragraph(text=str(c))
            r += entry
        return r

    thead = nodes.thead()
    thead += row(header)
    tbody = nodes.tbody()
    tbody.extend(row(cells) for cells in rows)
    group += thead
    group += tbody
    return table


def _prose(text: str, classes: list[str] | None = None) -> nodes.paragraph:
    """A paragraph from plain text in which `code` (a YAML comment, a parameter's comment) is code and
    `$...$` is math."""
    p = nodes.paragraph(classes=classes or [])
    for i, piece in enumerate(re.split(r"`([^`]+)`", text)):
        if piece and i % 2:
            p += nodes.literal(text=piece)
        elif piece:
            shown = latex_paragraph(piece)
            p.extend(shown.children if shown is not None else [nodes.Text(piece)])
    return p


def _literal_cell(text: str) -> nodes.paragraph:
    p = nodes.paragraph()
    p += nodes.literal(text=text)
    return p


def _paper_note(path: Path) -> str:
    """The leading comment of the paper-scale YAML (what it reproduces, its cost)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def executed_meta(name: str) -> dict:
    """`metadata.lowrank` of the build's executed notebook (executed_at, wall_s), {} if absent."""
    path = _SCALE["executed"] / f"{name}.ipynb"
    if not path.is_file():
        return {}
    return json.loads(path.read_text()).get("metadata", {}).get("lowrank", {})


REPRODUCE_PAGE = "book/reproduce"


def rerun_section(name: str, docname: str = "", reproduce_page: str | None = None) -> nodes.section:
    """The "Rerun this page" section of notebook `name`, from the notebook's parameter cell;
    `reproduce_page` (a docname) is linked when the book has it."""
    import yaml

    from lowrank.book import notebooks, runs

    specs = runs.parameter_specs(name)
    paper_path = notebooks.paper_params_path(name)
    paper = yaml.safe_load(paper_path.read_text()) if paper_path.is_file() else {}
    example = next((s for s in specs.values() if s.name == "seed"), None) or next(
        (s for s in specs.values() if s.name != "scale"), None)
    section = nodes.section(ids=["rerun-this-page"], names=["rerun this page"], classes=["rerun-box"])
    section += nodes.title(text="Rerun this page")
    scale = _SCALE["scale"]
    intro = nodes.paragraph(text=f"Everything above was computed by this page's notebook at {scale} scale, with "
                                 + ("the parameters' defaults" if scale == "ci" else "its paper file")
                                 + ". From a clone of the repository, after ")
    intro += nodes.literal(text="make book")
    if reproduce_page:
        intro += nodes.Text(" (")
        xref = addnodes.pending_xref("", refdomain="std", reftype="doc", reftarget="/" + reproduce_page,
                                     refexplicit=True, refwarn=True, refdoc=docname)
        xref += nodes.inline(text="how to reproduce")
        intro += xref
        intro += nodes.Text(")")
    intro += nodes.Text(":")
    section += intro
    lines = ["# this page at ci scale (the defaults below)", f"lowrank run {name}"]
    laptop_path = notebooks.scale_params_path(name, "laptop")
    if laptop_path.is_file():
        lines += [f"# sized to reach each claim's regime on a laptop ({laptop_path.relative_to(ROOT)})",
                  f"lowrank run {name} --scale laptop"]
    if paper_path.is_file():
        lines += [f"# the paper's sizes ({paper_path.relative_to(ROOT)})", f"lowrank run {name} --scale paper"]
    if example is not None:
        value = example.default + 1 if example.name == "seed" and isinstance(example.default, int) else example.default
        text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()
        lines += ["# any parameter below, e.g.", f"lowrank run {name} -p {example.name} {shlex.quote(text)}"]
    lines += ["# what each parameter allows", f"lowrank list {name}"]
    code = "\n".join(lines)
    section += nodes.literal_block(code, code, language="bash", classes=["rerun-commands"])
    if paper_path.is_file():
        note = _paper_note(paper_path)
        section += _prose("Paper scale: " + (note or "the paper's sizes.") +
                          " Each run writes its executed notebook, figures with their data and verdicts to "
                          "`runs/<part>/<name>/<hash>/`.")
    else:
        section += nodes.paragraph(text="This page has no paper-scale parameter file.")
    rows = [[_literal_cell(s.name), _literal_cell(_short(s.default)),
             _literal_cell(_short(paper[s.name])) if s.name in paper else nodes.paragraph(text="(as ci)"),
             _prose(s.describe()), _prose(s.comment)] for s in specs.values()]
    box = nodes.admonition(classes=["dropdown", "rerun-parameters"])
    box += nodes.title(text=f"The {len(specs)} parameters of this page (-p NAME VALUE)")
    box += _table(["parameter", "ci (this page)", "paper", "allowed", "meaning"], rows, ["rerun-parameter-table"])
    section += box
    meta = executed_meta(name)
    if meta:
        section += nodes.paragraph(
            text=f"This page was executed at {scale} scale on {meta.get('executed_at', '?')} in "
                 f"{meta.get('wall_s', float('nan')):.0f} s; the footer names the commit.",
            classes=["page-provenance"])
    return section


def scales_section(name: str) -> nodes.section | None:
    """"This page at each scale": the page's verdicts at ci, laptop and paper scale side by side
    (`lowrank.book.ledger.page_scales_html`), in the ci book only."""
    from lowrank.book import ledger

    html = ledger.page_scales_html(name, _SCALE["executed"] / f"{name}.ipynb") if _SCALE["scale"] == "ci" else ""
    if not html:
        return None
    section = nodes.section(ids=["this-page-at-each-scale"], names=["this page at each scale"])
    section += nodes.title(text="This page at each scale")
    section += nodes.raw("", html, format="html")
    return section


def _add_rerun_section(app, doctree):
    name = _notebook_name(app.env.docname)
    if name is None:
        return
    top = next(iter(doctree.findall(nodes.section)), None)
    reproduce = REPRODUCE_PAGE if REPRODUCE_PAGE in app.env.found_docs else None
    scales = scales_section(name)
    if scales is not None:
        (top if top is not None else doctree).append(scales)
    (top if top is not None else doctree).append(rerun_section(name, app.env.docname, reproduce))


# --- theorem numbers -----------------------------------------------------------------------------

def paper_number(title: str) -> str:
    """The theorem number a box's title cites ("Prop. 2.1 of ..." -> "2.1"), "" when it cites none."""
    m = _PAPER_NUMBER.search(title or "")
    if not m:
        return ""
    return re.sub(r"\s*(?:,|and)\s*", ", ", m.group(1)).replace(" - ", "-")


def _collect_proof_numbers(app, doctree):
    numbers = app.env.__dict__.setdefault("reader_proof_numbers", {})
    for node in doctree.findall(nodes.Element):
        if node.get("label") and "title" in node.attributes and node.get("realtype"):
            numbers[node["label"]] = (app.env.docname, node["realtype"], paper_number(node["title"]))


def _purge(app, env, docname):
    numbers = env.__dict__.get("reader_proof_numbers", {})
    for label in [k for k, v in numbers.items() if v[0] == docname]:
        del numbers[label]


def _merge(app, env, docnames, other):
    env.__dict__.setdefault("reader_proof_numbers", {}).update(
        {k: v for k, v in other.__dict__.get("reader_proof_numbers", {}).items() if v[0] in docnames})


def _renumber_html(app, body: str) -> str:
    """Replace sphinx-proof's running numbers by the papers' in box titles and in references."""
    from sphinx.locale import get_translation

    _ = get_translation("proof")
    for label, (_doc, realtype, number) in app.env.__dict__.get("reader_proof_numbers", {}).items():
        kind = _(realtype.title())
        plural = {"Proposition": "Propositions", "Theorem": "Theorems", "Lemma": "Lemmas", "Remark": "Remarks"}
        shown = f"{plural.get(kind, kind) if ',' in number else kind} {number}".strip()
        esc = re.escape(label)
        # the box: <div class="... admonition" id="LABEL"> <p class="admonition-title"><span class="caption-number">Kind N </span>
        body = re.sub(rf'(id="{esc}">\s*<p class="admonition-title"><span class="caption-number">)[^<]*(</span>)',
                      rf"\g<1>{shown} \g<2>", body)
        # references: <a class="reference internal" href="...#LABEL" ...><span>Kind N</span></a> (or plain text)
        body = re.sub(rf'(href="[^"]*#{esc}"[^>]*>(?:<span[^>]*>)?){re.escape(kind)} [\d.]+(?=<)', rf"\g<1>{shown}", body)
    return body


# --- code folding --------------------------------------------------------------------------------

class FoldLongCode(SphinxPostTransform):
    """Fold the parameter cell and code cells longer than FOLD_LINES lines (myst-nb's hide-input,
    applied by length): a page leads with its prose and figures, its code a click away."""

    default_priority = 150  # before myst-nb's HideInputCells (199), which does the folding
    formats = ("html",)

    def run(self, **kwargs):
        for cell in self.document.findall(nodes.container):
            if cell.get("nb_element") != "cell_code" or cell.get("hide_mode") or not cell.children:
                continue
            source = cell.children[0]
            if source.get("nb_element") != "cell_code_source":
                continue
            lines = source.astext().count("\n") + 1
            if "parameters" in cell.get("cell_metadata", {}).get("tags", []):
                # the defaults, folded: the rerun box at the end lists them with what each allows
                cell["hide_mode"] = "input"
                cell["prompt_show"] = f"Show code: the page's parameters ({lines} lines)"
                cell["prompt_hide"] = "Hide code"
            elif lines > FOLD_LINES:
                cell["hide_mode"] = "input"
                cell["prompt_show"] = f"Show code ({lines} lines)"
                cell["prompt_hide"] = "Hide code"


# --- numbers: no negative zero ------------------------------------------------------------------

_NEGATIVE_ZERO = re.compile(r"(?<![\w.\-−])[-−](0(?:\.0+)?)(?!\w|\.\d)")


def without_negative_zero(text: str) -> str:
    """"-0", "-0.00" (a value rounded to zero, glued or printed) -> "0", "0.00": a zero has no sign."""
    return _NEGATIVE_ZERO.sub(r"\1", text)


class NoNegativeZero(SphinxPostTransform):
    """Rounded zeros in prose and tables lose their sign ("at least -0.00" reads "at least 0.00");
    code, outputs printed as text and math are left as they are."""

    default_priority = 700
    formats = ("html",)

    def run(self, **kwargs):
        for text in list(self.document.findall(nodes.Text)):
            parent = text.parent
            if parent is None or isinstance(parent, (nodes.FixedTextElement, nodes.literal, nodes.math, nodes.raw)):
                continue
            fixed = without_negative_zero(str(text))
            if fixed != str(text):
                parent.replace(text, nodes.Text(fixed))


# --- verdict rows --------------------------------------------------------------------------------



def _executed_verdicts(name: str) -> dict:
    import nbformat

    from lowrank.book.goldens import notebook_verdicts

    path = _SCALE["executed"] / f"{name}.ipynb"
    return notebook_verdicts(nbformat.read(path, as_version=4)) if path.is_file() else {}


def verdict_tables(doctree) -> list[nodes.table]:
    """The verdict tables of a page: tables whose header has the columns "verdict" and "outcome"."""
    found = []
    for table in doctree.findall(nodes.table):
        head = next(iter(table.findall(nodes.thead)), None)
        cols = [e.astext().strip().lower() for e in head.findall(nodes.entry)] if head is not None else []
        if "verdict" in cols and "outcome" in cols:
            found.append((table, cols))
    return found


_OP_WORDS = {">": ">", ">=": "≥", "<": "<", "<=": "≤"}


def _text_html(text: str) -> str:
    """Plain text with inline `$...$` as HTML for MathJax; escaped as it is when a dollar is unmatched."""
    from lowrank.book.ledger import math_html

    return math_html(text) if text and math_html(text) is not None else html.escape(str(text))


def _threshold_words(threshold: dict) -> str:
    op, value = threshold.get("op"), threshold.get("value")
    if op == "between" and isinstance(value, (list, tuple)):
        return f"between {value[0]:.4g} and {value[1]:.4g}"
    return f"{_OP_WORDS.get(op, op)} {value:.4g}" if isinstance(value, (int, float)) else f"{op} {value}"


def _regime_html(regime: dict) -> str:
    state = "reached" if regime.get("reached") else "not reached: the claim needs a larger scale"
    return (f"{_text_html(regime.get('quantity', ''))} = {regime.get('value', float('nan')):.4g}, needs at least "
            f"{regime.get('needed', float('nan')):.4g} ({_text_html(regime.get('origin', ''))}): {state}")


def _details_html(records: list[dict]) -> str:
    from lowrank.book.ledger import description_html

    items = []
    for v in records:
        parts = []
        if v.get("note"):
            parts.append(f"<p>{_text_html(v['note'])}</p>")
        ex = v.get("excluded")
        if ex:
            parts.append(f"<p>{ex['count']} of {ex['total']} runs left out ({_text_html(ex['reason'])}).</p>")
        if v.get("threshold", {}).get("origin"):
            parts.append(f"<p>Threshold: measured {html.escape(_threshold_words(v['threshold']))}; "
                         f"origin: {_text_html(v['threshold']['origin'])}.</p>")
        for key, value in (v.get("details") or {}).items():
            if key == "regime" and isinstance(value, dict):
                parts.append(f"<p><strong>regime</strong>: {_regime_html(value)}</p>")
                continue
            text = json.dumps(value) if not isinstance(value, str) else value
            # the numbers behind the row, as the glued record names them (data, so shown as code)
            parts.append(f"<p><code>{html.escape(str(key))}</code>: <code>{html.escape(text)}</code></p>")
        if parts:
            items.append(f'<dt><a href="#verdict-{html.escape(v["name"])}">{description_html(v)}</a> '
                         f'({html.escape(v["kind"])}, {html.escape(v["outcome"])})</dt><dd>{"".join(parts)}</dd>')
    if not items:
        return ""
    return ('<details class="verdict-details" id="verdict-details"><summary>Details of each verdict: thresholds and their origin, '
            f'notes, runs left out, the numbers behind each row</summary><dl>{"".join(items)}</dl></details>')


def _section_title(node) -> str:
    while node is not None and not isinstance(node, nodes.section):
        node = node.parent
    return node[0].astext() if node is not None and len(node) and isinstance(node[0], nodes.title) else ""


def _figure_alt(doctree, page_title: str) -> None:
    """Output images carry their file name as alt text; say instead which section's figure it is."""
    for img in doctree.findall(nodes.image):
        alt = img.get("alt", "")
        if alt and not re.search(r"[\\/]|\.(png|svg|jpe?g)$|^[0-9a-f]{16,}", alt):
            continue
        section = _section_title(img)
        img["alt"] = f"Figure: {section}" + (f" ({page_title})" if page_title and page_title != section else "")


def latex_paragraph(text: str, classes: list[str] | None = None) -> nodes.paragraph | None:
    """Text with inline LaTeX (`$...$`) as a paragraph of text and math nodes (rendered by MathJax as
    the prose's `$...$` is), None when it is empty or a dollar is left unmatched (the caller keeps the
    plain text rather than show broken TeX)."""
    from lowrank.book.ledger import math_segments

    pieces = math_segments(text) if text else None
    if not pieces:
        return None
    para = nodes.paragraph(classes=classes if classes is not None else ["verdict-latex"])
    for is_math, piece in pieces:
        para += nodes.math(piece, piece) if is_math else nodes.Text(piece)
    return para


def _math_or_plain(text: str, classes: list[str] | None = None) -> nodes.paragraph:
    return latex_paragraph(text, classes) or nodes.paragraph(text=text, classes=classes or [])


def _description(record: dict, classes: list[str] | None = None) -> nodes.paragraph:
    """A verdict's `latex` description with its math, else (empty or unmatched dollars) its plain one."""
    shown = latex_paragraph(record.get("latex") or "", classes)
    return shown if shown is not None else nodes.paragraph(text=record.get("description") or record["name"],
                                                          classes=classes or [])


MEASURED_DIGITS = 4  # as lowrank.book.verdicts.show prints them
# The verdict table a page shows: four columns that fit a 750 px column (the seven of
# lowrank.book.verdicts.show, the Markdown a notebook prints, regrouped), each row a card on a phone.
VERDICT_COLUMNS = ("claim", "verdict", "measured", "outcome")


def _key(text: str) -> str:
    """Letters and digits only: a description as glued and as rendered from Markdown (smart quotes,
    escaped pipes, emphasis) compare equal."""
    return re.sub(r"[^a-z0-9]+", "", str(text).lower())


def _entry(label: str, *children) -> nodes.entry:
    entry = nodes.entry(classes=[f"vcol-{label}"])
    entry.extend(children)
    return entry


def _outcome_paragraph(text: str) -> nodes.paragraph:
    """"agrees" or "unstable (agrees in 2 of 6)" with the outcome as a colour badge."""
    from lowrank.book.ledger import OUTCOME_STYLE

    outcome, _, rest = text.strip().partition(" (")
    if outcome not in OUTCOME_STYLE:
        return nodes.paragraph(text=text)
    badge = nodes.inline(text=outcome, classes=["outcome-badge", f"outcome-{OUTCOME_STYLE[outcome]}"])
    return nodes.paragraph("", "", badge, *([nodes.Text(" (" + rest)] if rest else []))


def verdict_row(record: dict, outcome_text: str) -> nodes.row:
    """One verdict as the page shows it, from its glued record: claim id and kind; the description with
    what it expects and the threshold's origin below it; the measured value with the controls below it;
    the outcome (as the Markdown table printed it: "unstable (agrees in 2 of 6)"). Text fields may carry
    `$...$`, rendered as math."""
    from lowrank.book.tables import significant

    row = nodes.row(ids=[f"verdict-{record['name']}"])
    claim = nodes.paragraph(classes=["verdict-claim-id"])
    claim += nodes.Text(record.get("claim_id", ""))
    claim += nodes.inline(text=record.get("kind", ""), classes=["verdict-kind"])
    row += _entry("claim", claim)
    description = _description(record, ["verdict-description"])
    origin = (record.get("threshold") or {}).get("origin", "")
    expects = _math_or_plain(record.get("expected", ""), ["verdict-expects"])
    expects.insert(0, nodes.strong(text="expects "))
    if origin:
        expects += nodes.Text(" (")
        expects.extend(_math_or_plain(origin).children)
        expects += nodes.Text(")")
    row += _entry("verdict", description, expects)
    measured = record.get("measured")
    value = significant(measured, MEASURED_DIGITS) if isinstance(measured, (int, float)) else str(measured)
    cells = [nodes.paragraph(text=value, classes=["verdict-measured"])]
    for c in record.get("controls") or []:
        p = _math_or_plain(c["name"], ["verdict-control"])
        p.insert(0, nodes.strong(text="control "))
        p += nodes.Text(f": {c['value']:.4g}")
        cells.append(p)
    row += _entry("measured", *cells)
    row += _entry("outcome", _outcome_paragraph(outcome_text))
    return row


def verdict_table(rows: list[nodes.row]) -> nodes.table:
    table = nodes.table(classes=["verdict-table"])
    group = nodes.tgroup(cols=len(VERDICT_COLUMNS))
    table += group
    group.extend(nodes.colspec(colwidth=1) for _ in VERDICT_COLUMNS)
    head = nodes.row()
    head.extend(_entry(c, nodes.paragraph(text=c)) for c in VERDICT_COLUMNS)
    thead, tbody = nodes.thead(), nodes.tbody()
    thead += head
    tbody.extend(rows)
    group += thead
    group += tbody
    return table


def _replace_notes(table, records: list[dict]) -> None:
    """The list verdicts.show prints after its table ("- *name*: note") again, each verdict named by its
    description (math rendered) instead of its code name, its note's `$...$` rendered."""
    parent = table.parent
    if parent is None:
        return
    names = {r["name"]: r for r in records}
    for sibling in parent.children[parent.index(table) + 1:]:
        if not isinstance(sibling, nodes.bullet_list):
            continue
        for item in sibling.children:
            para = item.children[0] if item.children and isinstance(item.children[0], nodes.paragraph) else None
            first = para.children[0] if para is not None and para.children else None
            record = names.get(first.astext()) if isinstance(first, nodes.emphasis) else None
            if record is None:
                continue
            rest = para.astext()[len(first.astext()):].removeprefix(": ")
            ex = record.get("excluded")
            if ex and rest.startswith(f"{ex['count']} of {ex['total']} runs left out"):
                text = f"{ex['count']} of {ex['total']} runs left out ({ex['reason']})"
            else:  # the note as glued: its Markdown rendering may have eaten the LaTeX's backslashes
                text = record.get("note") or rest
            shown = _description(record)
            new = nodes.paragraph()
            new += nodes.emphasis("", "", *shown.children)
            new += nodes.Text(": ")
            new.extend(_math_or_plain(text).children)
            item.replace(para, new)


def _mark_verdicts(app, doctree, docname):
    name = _notebook_name(docname)
    if name is None:
        return
    title = next(iter(doctree.findall(nodes.title)), None)
    _figure_alt(doctree, title.astext() if title is not None else "")
    records = _executed_verdicts(name)
    by_label = {}
    for v in records.values():
        by_label.setdefault(_key(v.get("description") or v["name"]), []).append(v)
    for table, cols in verdict_tables(doctree):
        i_verdict, i_outcome = cols.index("verdict"), cols.index("outcome")
        tbody = next(iter(table.findall(nodes.tbody)), None)
        rows, used = [], []
        for row in tbody.children if tbody is not None else []:
            entries = [c for c in row.children if isinstance(c, nodes.entry)]
            candidates = by_label.get(_key(entries[i_verdict].astext()), []) if len(entries) == len(cols) else []
            if not candidates:
                break  # a row without its record: the table stays as printed
            used.append(candidates.pop(0))
            rows.append(verdict_row(used[-1], entries[i_outcome].astext()))
        else:
            _replace_notes(table, used)
            table.replace_self(verdict_table(rows))
    details = _details_html(list(records.values()))
    tables = verdict_tables(doctree)
    if details and tables:  # once, after the last verdict table's cell
        cell = tables[-1][0]
        while cell.parent is not None and cell.get("nb_element") != "cell_code":
            cell = cell.parent
        anchor = cell if cell.parent is not None else tables[-1][0]
        anchor.parent.insert(anchor.parent.index(anchor) + 1, nodes.raw("", details, format="html"))


# --- page context: launch links, theorem numbers -------------------------------------------------

def _colab_url(app, pagename: str) -> str:
    """Colab opens the executed notebook that book.yml publishes on the `notebooks` branch
    (`lowrank.book.pages.colab_url`)."""
    from lowrank.book.pages import colab_url

    url, _ = repository(app)
    return colab_url(url, _notebook_name(pagename))


def _walk_buttons(buttons):
    for b in buttons or []:
        yield b
        yield from _walk_buttons(b.get("buttons"))


def _page_context(app, pagename, templatename, context, doctree):
    if _notebook_name(pagename) is not None:
        for b in _walk_buttons(context.get("header_buttons")):
            if "colab.research.google.com" in str(b.get("url", "")):
                b["url"] = _colab_url(app, pagename)
    if "body" in context:
        context["body"] = _renumber_html(app, context["body"])


def setup(app):
    # MathJax on every page: the sidebar lists page titles with math, and the ledger's raw HTML has formulas
    app.set_html_assets_policy("always")
    app.connect("config-inited", _config_inited)
    app.add_css_file("reader.css")
    app.add_js_file("reader.js", defer="defer")
    app.connect("doctree-read", _add_rerun_section, priority=400)  # before the page TOC is collected
    app.connect("doctree-read", _collect_proof_numbers)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.add_post_transform(FoldLongCode)
    app.add_post_transform(NoNegativeZero)
    app.connect("doctree-resolved", _mark_verdicts)
    app.connect("html-page-context", _page_context, priority=600)  # after the theme's launch buttons
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
