"""The claims ledger: every claim of the book with the verdicts its notebook glued, as a dashboard.

Written by the book build (`book/ledger.md`, generated, not committed) from the executed ci-scale
notebooks and, where they exist, the stored laptop- and paper-scale results under `results/laptop/` and
`results/paper/` (a stored result whose parameters or code changed since its run is marked stale). It
reads only what the notebooks glued. Claims and checks are counted apart: the headline counts claims only, and a claim
whose negative control also meets its threshold is "uninformative", never agreement.

The landing page opens with one generated sentence per paper (`landing_html`: what holds and what
fails, each page at the largest scale it ran at, linked). The ledger page opens with the summary, which
the landing page also includes (`summary_html`, included by
book/intro.md): what each outcome word means, the counts at each scale, and for each paper generated
sentences (which pages agree at the largest scale measured, what has not run at paper scale and why)
with its pages by scale as badges. Then one table per part, one row per claim (its description with
the verdict's `latex` rendered, the outcome at ci, laptop and paper scale; threshold and controls folded),
the part's checks folded below. Each verdict links to its row on its page (anchor `verdict-<name>`,
set by book/_ext/reader.py). No number in these sentences is typed: all are counted from the verdicts.
"""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from pathlib import Path

import nbformat
import yaml

from lowrank.book import paper_results as _paper_results_module
from lowrank.book.goldens import notebook_verdicts
from lowrank.book.notebooks import REPO_ROOT, list_notebooks
from lowrank.book.verdicts import CHECK_OUTCOMES, CLAIM_OUTCOMES, LARGER_SCALE, UNSTABLE, stability_text

__all__ = ["CLAIMS", "PARTS", "SCALES", "OUTCOME_STYLE", "MEANING", "ledger_rows", "ledger_counts", "counts_by_part",
           "ledger_markdown", "summary_html", "paper_summary_html", "landing_html", "matrix_html", "page_scales_html",
           "math_segments",
           "math_html", "description_html", "write_ledger"]

CLAIMS = REPO_ROOT / "book" / "claims.yaml"
PARTS = {"I": "Part I: rank-two gradients", "II": "Part II: SGD and weight decay", "III": "Part III: square loss"}
# badge class of each outcome (book/_ext/static/reader.css): green, red, amber, blue
# how a count reads: "12 agree", "3 checks hold"
LABEL = {"agrees": "agree", "disagrees": "disagree", "uninformative": "uninformative",
         LARGER_SCALE: "need a larger scale", UNSTABLE: "unstable", "holds": "hold", "fails": "fail", "loose": "loose"}
# the scales side by side, smallest first, and the row key of each one's verdict
SCALES = ("ci", "laptop", "paper")
ROW_KEY = {"ci": "verdict", "laptop": "laptop", "paper": "paper"}
OUTCOME_STYLE = {"agrees": "good", "holds": "good", "disagrees": "bad", "fails": "bad", "uninformative": "weak",
                 LARGER_SCALE: "pending", UNSTABLE: "weak", "loose": "weak"}


def _stored_result(name: str, root: Path | None, scale: str) -> dict | None:
    """The stored result of `name` at `scale` (results/<scale>/, `lowrank results store`), with its date
    and whether it is stale (its parameters or code changed since the run) and why."""
    found = _paper_results_module.stored_result(name, root, scale)
    if found is None:
        return None
    return {"date": found["provenance"].get("end", "")[:10], "verdicts": found["verdicts"], "stale": found["stale"],
            "stale_reason": found["stale_reason"]}


def ledger_rows(executed: dict[str, Path], results_root: Path | None = None, laptop_root: Path | None = None,
                larger_scale: dict | None = None) -> list[dict]:
    """One row per (claim, verdict); claims without a notebook yet get one row saying so. Each row has
    the ci verdict (`verdict`) and, when stored, the laptop and paper ones (`laptop`, `paper`, each with
    `<scale>_date`, `<scale>_stale` and `<scale>_stale_reason`); `results_root` / `laptop_root` replace
    results/paper/ and results/laptop/. `larger_scale`: `{page: cost}` of the pages whose claims are beyond the
    laptop budget (`lowrank.book.sweeps.larger_scale_costs`), kept in each of their rows as `larger_scale`.

    A verdict whose claim id is not the notebook's row in claims.yaml is listed too (under its own
    id), so that the ledger counts every glued verdict.
    """
    claims = yaml.safe_load(CLAIMS.read_text())
    existing = set(list_notebooks())
    rows, seen = [], set()
    by_notebook: dict[str, list[str]] = {}
    for c in claims:
        by_notebook.setdefault(c["notebook"], []).append(c["claim_id"])
    for c in claims:
        name = c["notebook"]
        path = executed.get(name)
        if name not in existing or path is None or not Path(path).is_file():
            rows.append({"claim_id": c["claim_id"], "notebook": name, "exists": name in existing, "verdict": None,
                         "larger_scale": (larger_scale or {}).get(name)})
            continue
        nb = nbformat.read(path, as_version=4)
        stored = {"paper": _stored_result(name, results_root, "paper"), "laptop": _stored_result(name, laptop_root, "laptop")}
        found_all = notebook_verdicts(nb)
        found = [v for v in found_all.values() if v["claim_id"] == c["claim_id"]]
        if c["claim_id"] == by_notebook[name][-1]:  # the notebook's last claims.yaml row takes the unlisted ones
            found += [v for v in found_all.values() if v["claim_id"] not in by_notebook[name]]
        for v in found or [None]:
            if v is not None:
                if (name, v["name"]) in seen:
                    continue
                seen.add((name, v["name"]))
            row = {"claim_id": v["claim_id"] if v else c["claim_id"], "notebook": name, "exists": True, "verdict": v,
                   "larger_scale": (larger_scale or {}).get(name)}
            for scale, found in stored.items():
                sv = found["verdicts"].get(v["name"]) if found and v else None
                row |= {scale: sv, f"{scale}_date": found["date"] if sv else None,
                        f"{scale}_stale": bool(sv and found["stale"]), f"{scale}_stale_reason": found["stale_reason"] if sv else None}
            rows.append(row)
    return rows


def beyond_paper(row: dict) -> bool:
    """A verdict on the book's own hypothesis (details `beyond_paper`): listed apart, never counted with
    the papers' claims."""
    return bool(((row.get("verdict") or {}).get("details") or {}).get("beyond_paper"))


def ledger_counts(rows: list[dict], scale: str = "ci") -> dict[str, Counter]:
    """`{kind: Counter(outcome)}` over the measured rows at `scale` ("ci", "laptop" or "paper"), the
    papers' own claims only (verdicts beyond the paper are counted by `beyond_paper`)."""
    counts: dict[str, Counter] = {"claim": Counter(), "check": Counter()}
    for r in rows:
        v = r.get(ROW_KEY[scale])
        if v and not beyond_paper(r):
            counts[v["kind"]][v["outcome"]] += 1
    return counts


def _part(row: dict) -> str:
    return row["claim_id"].split("-")[0]


def counts_by_part(rows: list[dict], scale: str = "ci") -> dict[str, dict[str, Counter]]:
    """`{part: {kind: Counter(outcome)}}`, parts as in PARTS."""
    return {p: ledger_counts([r for r in rows if _part(r) == p], scale) for p in PARTS}


# --- HTML pieces (the page is Markdown with raw HTML blocks, so that tables can have sticky headers,
# badges, and a card layout on a phone) ------------------------------------------------------------

def _e(text) -> str:
    return html.escape(str(text), quote=True)


def math_segments(text: str) -> list[tuple[bool, str]] | None:
    """`text` with inline LaTeX (`$...$`, `\\$` a literal dollar) as `[(is_math, piece), ...]`;
    None when a dollar is left unmatched or a formula is empty (the caller falls back to the plain
    description rather than show broken TeX)."""
    pieces: list[tuple[bool, str]] = []
    buf, in_math, i = [], False, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] == "$":
            buf.append("\\$" if in_math else "$")
            i += 2
            continue
        if ch == "$":
            if in_math and not "".join(buf).strip():
                return None
            if buf:
                pieces.append((in_math, "".join(buf)))
            buf, in_math = [], not in_math
        else:
            buf.append(ch)
        i += 1
    if in_math:
        return None
    if buf:
        pieces.append((False, "".join(buf)))
    return pieces


def math_html(text: str) -> str | None:
    """Inline LaTeX as HTML for MathJax (the markup Sphinx writes for `$...$` in prose), None when
    `text` does not parse (`math_segments`)."""
    pieces = math_segments(text)
    if pieces is None:
        return None
    return "".join(f'<span class="math notranslate nohighlight">\\({_e(p)}\\)</span>' if m else _e(p)
                   for m, p in pieces)


def _math(text: str) -> str:
    """Verdict text with `$...$` as HTML for MathJax (expects, origins, control names, notes)."""
    shown = math_html(text) if text else None
    return _e(text) if shown is None else shown


def description_html(v: dict) -> str:
    """A verdict's description: its `latex` rendered when present and well formed, else the plain text."""
    shown = math_html(v["latex"]) if v.get("latex") else None
    return shown if shown is not None else _e(v.get("description") or v["name"])


def badge(outcome: str | None, text: str | None = None) -> str:
    style = OUTCOME_STYLE.get(outcome or "", "none")
    return f'<span class="outcome-badge outcome-{style}">{_e(text if text is not None else outcome or "—")}</span>'


def verdict_url(row: dict, base: str) -> str:
    """Link to the verdict's row on its page (`base` is the relative path from the linking page to the root)."""
    v = row["verdict"]
    frag = f"verdict-{v['name']}" if v else "verdict"
    return f"{base}notebooks/{row['notebook']}.html#{frag}"


# what each outcome word means, shown where the word first appears (landing page, ledger)
MEANING = {
    "agrees": "the claim meets its threshold and none of its negative controls does",
    "disagrees": "the claim misses its threshold",
    "uninformative": "the claim meets its threshold, but so does a negative control that removes the paper's "
                     "mechanism: not evidence either way",
    LARGER_SCALE: "the run cannot reach the regime the mechanism needs (computed from the parameters before "
                  "training), whatever it measured",
    UNSTABLE: "the outcome differs over seed offsets 0–4 or between two CPU code paths (rounding), so no single "
              "run decides it",
    "holds": "a check (an identity, a closed form, a theorem's inequality) is met, as it must be whatever the data",
    "fails": "a check is not met: a bug, or a statement that is false at these sizes",
    "loose": "a check holds, but so does a deliberately wrong version of it: at these sizes it catches only gross errors",
}


def legend_html() -> str:
    """Every outcome word with its badge and its meaning."""
    items = "".join(f"<dt>{badge(o)}</dt><dd>{_e(MEANING[o])}.</dd>" for o in CLAIM_OUTCOMES + CHECK_OUTCOMES[:3])
    return (f'<dl class="outcome-legend"><dt class="legend-head">claims</dt><dd class="legend-head">'
            f"empirical statements of a paper, each judged beside a negative control</dd>{items}</dl>")


def _cards(counts: dict[str, Counter], scale: str) -> str:
    claims, checks = counts["claim"], counts["check"]
    cards = [(o, claims[o], f"claims {LABEL[o]}", "claim") for o in CLAIM_OUTCOMES]
    cards += [(o, checks[o], f"checks {LABEL[o]}", "check") for o in CHECK_OUTCOMES]
    out = [f'<div class="ledger-cards" data-scale="{scale}">']
    for outcome, n, label, kind in cards:
        style = OUTCOME_STYLE[outcome] if n else "none"
        out.append(f'<div class="ledger-card outcome-{style}" title="{_e(MEANING[outcome])}"><span class="count" '
                   f'data-kind="{kind}" data-outcome="{_e(outcome)}" data-scale="{scale}">{n}</span>'
                   f'<span class="label">{_e(label)}</span></div>')
    out.append("</div>")
    return "".join(out)


# --- pages: short names, what did not run at paper scale and why -----------------------------------

def page_title(name: str) -> str:
    """The notebook's title without its trailing citation and subtitle: "A large spike makes the gradient rank one"."""
    from lowrank.book.notebooks import source_path

    try:
        source = source_path(name).read_text()
    except (FileNotFoundError, ValueError):  # a claims.yaml row whose notebook is not written yet
        return name
    for line in source.splitlines():
        if line.startswith("# "):
            title = line[2:].strip()
            title = re.sub(r"\s*\((?:[^()]|\([^()]*\))*\)\s*$", "", title) or title
            return title.split(": ")[0] if ": " in title else title
    return name


def _title_html(name: str) -> str:
    title = page_title(name)
    return math_html(title) or _e(title)


DATA_NAME = {"mnist": "MNIST", "cifar10": "CIFAR-10"}


def not_run_reason(name: str, short: bool = False) -> str:
    """Why `name` has no stored paper-scale result, in words ("no CIFAR-10 where this book was built
    (...), and the paper's sizes take hours of a GPU"; `short`: "no CIFAR-10"): the real data its paper
    file reads when they are not where the book was built, a paper file the page's parameter checks
    reject, or simply that nobody has run it."""
    from lowrank.core import datasets

    try:
        params = _paper_results_module.paper_parameters(name)
    except Exception:  # noqa: BLE001 (a paper file that no longer parses or validates: say so, build on)
        return "paper file rejected" if short else \
            "paper file rejected by the page's parameter checks (`lowrank run PART/NAME --scale paper` says why)"
    data = _paper_results_module.required_data(params)
    root = datasets.resolve_root(params.get("data_root") or None)
    absent = [d for d in data if not datasets.present(d, root)]
    names = " or ".join(DATA_NAME.get(d, d) for d in absent)
    if absent and short:
        return f"no {names}"
    if absent:
        fetch = " ".join(f"`lowrank data fetch {d}`" for d in absent)
        return f"no {names} where this book was built ({fetch}), and the paper's sizes take hours of a GPU"
    return "" if short else "not run yet"


def _page_claims(rows: list[dict], name: str, scale: str) -> list[dict]:
    key = ROW_KEY[scale]
    return [r[key] for r in rows if r["notebook"] == name and r.get(key) and r[key]["kind"] == "claim"
            and not beyond_paper(r)]


PAGE_GROUPS = {  # how a page's claims came out at one scale, in the order the sentences list them
    "all": "every claim agrees on",
    "most": "most claims agree on",
    "few": "at most half agree on",
    "none": "none agrees on",
}


def _page_group(claims: list[dict]) -> str | None:
    """"all" (every claim agrees), "most" (more than half agree), "few" (some agree), "none"."""
    outcomes = [v["outcome"] for v in claims]
    if not outcomes:
        return None
    agree = outcomes.count("agrees")
    return "all" if agree == len(outcomes) else "most" if 2 * agree > len(outcomes) else "few" if agree else "none"


def _page_links(names: list[str], base: str, claims: dict | None = None) -> str:
    def one(n):
        link = f'<a href="{_e(base)}notebooks/{_e(n)}.html">{_title_html(n)}</a>'
        if claims is None:
            return link
        k = sum(v["outcome"] == "agrees" for v in claims[n])
        return f"{link} ({k} of {len(claims[n])} agree{'s' if len(claims[n]) == 1 and k else ''})"
    return ", ".join(one(n) for n in names)


_VERBS = {"agrees": ("agrees", "agree"), "disagrees": ("disagrees", "disagree"),
          "uninformative": ("is uninformative", "are uninformative"),
          LARGER_SCALE: ("needs a larger scale", "need a larger scale"), UNSTABLE: ("is unstable", "are unstable")}


def _claim_words(claims: Counter) -> str:
    """"14 of 30 claims agree, 9 disagree and 7 need a larger scale", each outcome word as its badge."""
    n = sum(claims.values())
    words = [[str(claims[o]), badge(o, _VERBS[o][claims[o] != 1])] for o in CLAIM_OUTCOMES if claims[o]]
    if not words:
        return "no claim measured"
    words[0][0] += f" of {n} claim{'s' if n != 1 else ''}"
    words = [" ".join(w) for w in words]
    return ", ".join(words[:-1]) + (" and " if len(words) > 1 else "") + words[-1]


def _ran(part_rows: list[dict], pages: list[str], scale: str) -> list[str]:
    """The pages of `pages` with a verdict at `scale` (all of them at ci)."""
    key = ROW_KEY[scale]
    return [n for n in pages if any(r["notebook"] == n and r.get(key) for r in part_rows)]


def _largest_scale(part_rows: list[dict], pages: list[str]) -> str:
    """The largest scale at which any page of a part ran: "paper", "laptop" or "ci"."""
    return next(s for s in reversed(SCALES) if s == "ci" or _ran(part_rows, pages, s))


def paper_summary_html(rows: list[dict], part: str, base: str) -> str:
    """Generated sentences on a part: its claims' outcomes at each scale, which pages agree at the
    largest scale measured, and what has not run at paper scale and why."""
    part_rows = [r for r in rows if _part(r) == part and not beyond_paper(r)]
    pages = list(dict.fromkeys(r["notebook"] for r in part_rows if r.get("verdict")))
    largest = _largest_scale(part_rows, pages)
    sentences = []
    for scale in reversed(SCALES):
        names = _ran(part_rows, pages, scale) if scale != "ci" else pages
        counts = ledger_counts(part_rows, scale)["claim"]
        if not sum(counts.values()):
            continue
        stale = sum(any(r["notebook"] == n and r.get(f"{scale}_stale") for r in part_rows) for n in names)
        where = "At ci scale" if scale == "ci" else \
            f"At {scale} scale ({len(names)} of {len(pages)} pages run{f', {stale} stale' if stale else ''})"
        text = f"{where}, {_claim_words(counts)}"
        if scale == largest:  # the pages by outcome, at the largest scale measured
            claims = {n: _page_claims(part_rows, n, scale) for n in names}
            groups = {g: [n for n in names if _page_group(claims[n]) == g] for g in PAGE_GROUPS}
            said = [f"{PAGE_GROUPS[g]} {_page_links(ns, base, claims)}" for g, ns in groups.items() if ns]
            text += ": " + "; ".join(said) if said else ""
        sentences.append(text + ".")
    if largest == "ci" and sum(ledger_counts(part_rows, "ci")["claim"].values()):
        sentences.append("No paper-scale result exists yet, so these outcomes say how the claims fare at small "
                         "sizes, not whether the paper's figures reproduce.")
    elif largest == "laptop":
        sentences.append("No paper-scale result exists yet: the laptop results are sized so that each claim's "
                         "mechanism reaches its regime, on the small data sets ci uses, not the paper's.")
    ran = _ran(part_rows, pages, "paper")
    missing = [n for n in pages if n not in ran]
    if missing:
        reasons: dict[str, list[str]] = {}
        for n in missing:
            reasons.setdefault(not_run_reason(n), []).append(n)
        lead = "Nothing has run at paper scale" if not ran else "Not run at paper scale"
        said = [f"{_page_links(ns, base)}: {_code(_e(why))}" if len(ns) == 1 else
                f"{len(ns)} pages: {_code(_e(why))}" for why, ns in reasons.items()]
        sentences.append(f"{lead} ({'; '.join(said)}).")
    return f'<p class="paper-summary" data-part="{part}">' + " ".join(sentences) + "</p>"


PART_INDEX = {"I": "gradients", "II": "sgd", "III": "square"}  # book/<folder>/index.md, each part's overview


def page_finding(name: str) -> str | None:
    """The page's claim as a quotable phrase (its claims.yaml row's `finding`), stated, not asserted:
    the landing sentence says whether it holds."""
    for c in yaml.safe_load(CLAIMS.read_text()):
        if c["notebook"] == name and c.get("finding"):
            return c["finding"]
    return None


# how a page's claims came out at its largest scale, as the landing sentence groups them
VERDICT_GROUPS = {"holds": "Holds", "part": "Holds in part", "fails": "Fails", "open": "Undecided"}


def _verdict_group(claims: list[dict]) -> str:
    agree = sum(v["outcome"] == "agrees" for v in claims)
    if claims and agree == len(claims):
        return "holds"
    if agree:
        return "part"
    return "fails" if any(v["outcome"] == "disagrees" for v in claims) else "open"


def landing_html(rows: list[dict], base: str) -> str:
    """The landing page's first screen: one generated paragraph per paper that says, finding by finding
    (each page's claims.yaml `finding`, linked to the page), what holds, what holds in part, what fails
    and what is undecided, each at the largest scale its page ran at (paper, laptop, else ci) and that
    scale named; then the count of claims that agree. A stale stored result counts and is said so."""
    out = []
    for part in PARTS:
        part_rows = [r for r in rows if _part(r) == part and not beyond_paper(r)]
        pages = list(dict.fromkeys(r["notebook"] for r in part_rows if r.get("verdict")))
        if not pages:
            continue
        at = {n: next(s for s in reversed(SCALES) if s == "ci" or n in _ran(part_rows, [n], s)) for n in pages}
        claims = {n: _page_claims(part_rows, n, at[n]) for n in pages}
        stale = [n for n in pages if at[n] != "ci" and any(r["notebook"] == n and r.get(f"{at[n]}_stale") for r in part_rows)]
        groups: dict[str, list[str]] = {g: [] for g in VERDICT_GROUPS}
        for n in pages:
            if claims[n]:
                groups[_verdict_group(claims[n])].append(n)

        def said(n: str) -> str:
            k = sum(v["outcome"] == "agrees" for v in claims[n])
            count = f"{k} of {len(claims[n])}, " if 0 < k < len(claims[n]) else ""
            phrase = _math(page_finding(n) or page_title(n))
            return f'<a href="{_e(base)}notebooks/{_e(n)}.html">{phrase}</a> <small class="finding-scale">({count}{at[n]})</small>'


        findings = [f"<em>{VERDICT_GROUPS[g]}</em>: " + "; ".join(said(n) for n in ns) + "." for g, ns in groups.items() if ns]
        scales = Counter(at.values())
        where = ", ".join(f"{scale} scale on {scales[scale]}" for scale in reversed(SCALES) if scales[scale])
        agree = sum(v["outcome"] == "agrees" for n in pages for v in claims[n])
        total = sum(len(claims[n]) for n in pages)
        authors = PAPERS[part].split(":")[0].replace(" (", ", ").rstrip(")")  # "A and B (2023)" -> "A and B, 2023"
        text = (f"<strong>Part {part}</strong> ({_e(authors)}). " + " ".join(findings)
                + f" In all, {agree} of {total} claims agree ({where} of its {len(pages)} pages"
                + (f"; {len(stale)} stored result{'s' if len(stale) != 1 else ''} stale" if stale else "") + "). "
                + f'<a href="{_e(base)}book/{PART_INDEX[part]}/index.html">Its pages</a>.')
        out.append(f'<p class="paper-answer" data-part="{part}" data-scale="{_largest_scale(part_rows, pages)}">{text}</p>')
    return "".join(out)


def _code(text: str) -> str:
    """`x` in an escaped sentence as <code>x</code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def _count_cell(v_list: list[dict]) -> str:
    """Claims' outcomes of one page at one scale as badges (checks as one muted line)."""
    claims = Counter(v["outcome"] for v in v_list if v["kind"] == "claim")
    checks = Counter(v["outcome"] for v in v_list if v["kind"] == "check")
    out = " ".join(badge(o, f"{claims[o]} {o if claims[o] == 1 else LABEL[o]}") for o in CLAIM_OUTCOMES if claims[o])
    if checks:
        out += ('<br><small class="check-line">checks: ' +
                ", ".join(f"{checks[o]} {o if checks[o] == 1 else LABEL[o]}" for o in CHECK_OUTCOMES if checks[o])
                + "</small>")
    return out or "—"


def _stale_badge(reason: str | None) -> str:
    why = f"stale: {reason}" if reason else "stale: its parameters or code changed since this run"
    return f' <span class="outcome-badge outcome-none stale-badge" title="{_e(why)}">stale</span>'


def _hours(seconds) -> str:
    return "unknown" if seconds is None else f"{seconds / 3600:,.0f}"


def _laptop_not_run(name: str, cost: dict | None) -> tuple[str, str, str | None]:
    """(title, short, outcome) of a page without a laptop result: its laptop file has not run, or its
    claims need a larger scale (`cost`, its `lowrank.book.sweeps.larger_scale_cost`: outcome LARGER_SCALE,
    with the cost in CPU- and GPU-hours), or it has no laptop file yet."""
    from lowrank.book.notebooks import scale_params_path

    if scale_params_path(name, "laptop").is_file():
        return "its laptop file has not run yet (`make laptop`)", "not run yet", None
    if cost is not None:
        return cost["text"], f"{_hours(cost['cpu_seconds'])} CPU-hours, {_hours(cost['gpu_seconds'])} GPU-hours", LARGER_SCALE
    return "no laptop file: not sized for the laptop scale yet", "no laptop file", None


def _beyond_budget_note(cost: dict | None) -> str:
    """For a page with a stored laptop result whose other claims are beyond the laptop budget (`cost`, its
    `lowrank.book.sweeps.larger_scale_cost`): the cost of the paper sweeps that decide those, as a small line."""
    if cost is None:
        return ""
    return (f'<br><small title="{_e(cost["text"])}">beyond the budget: {_hours(cost["cpu_seconds"])} '
            f'CPU-hours, {_hours(cost["gpu_seconds"])} GPU-hours</small>')


def matrix_html(rows: list[dict], part: str, base: str) -> str:
    """A part's pages by scale: the outcomes of each page's verdicts at ci, laptop and paper scale as
    badges (a stale stored result marked), a link to each page."""
    part_rows = [r for r in rows if _part(r) == part and not beyond_paper(r)]
    body = []
    for name in dict.fromkeys(r["notebook"] for r in part_rows):
        mine = [r for r in part_rows if r["notebook"] == name]
        ci = [r["verdict"] for r in mine if r.get("verdict")]
        if not ci:
            continue
        cells = []
        for scale in SCALES[1:]:
            found = [r[scale] for r in mine if r.get(scale)]
            stale = next((r for r in mine if r.get(f"{scale}_stale")), None)
            if found:
                beyond = _beyond_budget_note(mine[0].get("larger_scale")) if scale == "laptop" else ""
                cells.append(_count_cell(found) + (_stale_badge(stale[f"{scale}_stale_reason"]) if stale else "") + beyond)
                continue
            title, short, outcome = _laptop_not_run(name, mine[0].get("larger_scale")) if scale == "laptop" else \
                (not_run_reason(name), not_run_reason(name, short=True), None)
            style = OUTCOME_STYLE[outcome] if outcome else "none"
            cells.append(f'<span class="outcome-badge outcome-{style}" title="{_e(title)}">{_e(outcome or "not run")}</span> '
                         f'<small>{_e(short)}</small>')
        body.append(f'<tr><td data-label="page"><small class="claim-id">{_e(mine[0]["claim_id"])}</small> '
                    f'<a href="{_e(base)}notebooks/{_e(name)}.html">{_title_html(name)}</a></td>'
                    f'<td data-label="ci scale">{_count_cell(ci)}</td><td data-label="laptop scale">{cells[0]}</td>'
                    f'<td data-label="paper scale">{cells[1]}</td></tr>')
    return ('<table class="ledger-matrix rows"><colgroup><col class="c-page"><col class="c-ci"><col class="c-laptop">'
            '<col class="c-paper"></colgroup><thead><tr><th>page</th><th>ci scale</th><th>laptop scale</th>'
            '<th>paper scale</th></tr></thead><tbody>' + "".join(body) + "</tbody></table>")


def _range_note(golden: dict | None) -> str:
    """How many golden entries test the outcome alone (their tolerance covers the statistic's range)."""
    if golden is None:
        from lowrank.book.goldens import GOLDEN, load
        golden = load() if GOLDEN.is_file() else {}  # a book without goldens (a probe book)
    wide = sorted(k for block in golden.values() for k, e in block.items() if e.get("tolerance_covers_range"))
    if not wide:
        return ""
    return (f'<p class="ledger-note">{len(wide)} verdict{"s vary" if len(wide) != 1 else " varies"} over seeds and CPU paths across the whole range of '
            f"their statistic, so the regression tests compare only their outcome: {_e(', '.join(wide))}.</p>")


PAPERS = {"I": "Sonthalia, Murray and Montúfar (2025): the gradient is rank one or rank two",
          "II": "Galanti, Siegel, Gupte and Poggio (2022): SGD and weight decay minimise rank",
          "III": "Xu, Rangamani, Liao, Galanti and Poggio (2023): square-loss dynamics"}


def summary_html(rows: list[dict], base: str, golden: dict | None = None) -> str:
    """The landing page's answer: what each outcome word means, the counts at each scale, and for each
    paper one or two generated sentences and its pages by scale, linked from `base`."""
    counts = ledger_counts(rows, "ci")
    n_claims = sum(counts["claim"].values())
    n_beyond = sum(beyond_paper(r) for r in rows)
    out = [legend_html(),
           f'<p class="ledger-group-title">At ci scale: {n_claims} claims, {sum(counts["check"].values())} checks'
           + (f" (and {n_beyond} verdict{'s' if n_beyond != 1 else ''} on the book's own hypotheses, listed apart)" if n_beyond else "") + "</p>",
           _cards(counts, "ci")]
    for scale in ("laptop", "paper"):
        at = ledger_counts(rows, scale)
        if sum(at["claim"].values()) + sum(at["check"].values()):
            parts = [p for p in PARTS if sum(counts_by_part(rows, scale)[p]["claim"].values())]
            out += [f'<p class="ledger-group-title">At {scale} scale (Part {", ".join(parts)} only): '
                    f'{sum(at["claim"].values())} claims, {sum(at["check"].values())} checks</p>', _cards(at, scale)]
    for part in PARTS:
        out += [f'<section class="paper-block" data-part="{part}"><p class="paper-title"><strong>Part {part}</strong> · '
                f"{_e(PAPERS[part])}</p>", paper_summary_html(rows, part, base),
                f"<details class=\"paper-matrix\" open><summary>Its pages by scale</summary>{matrix_html(rows, part, base)}"
                "</details></section>"]
    out.append(_range_note(golden))
    return "".join(out)


def _control_text(v: dict) -> str:
    parts = []
    for c in v.get("controls") or []:
        why = "the observed score lies inside this null (p > 0.05)" if "p_value" in c else "this control meets the threshold too"
        cls = f' class="control-pass" title="{why}"' if c.get("passes") else ""
        p = f" (p = {c['p_value']:.2g})" if "p_value" in c else ""
        parts.append(f"<span{cls}>{_math(c['name'])}: {fmt(c['value'])}{p}</span>")
    return "<br>".join(parts) or "—"


def _threshold_text(v: dict) -> str:
    thr = v.get("threshold") or {}
    op, value = thr.get("op"), thr.get("value")
    if op is None:
        rule = ""
    elif op == "between":
        rule = f"in [{fmt(value[0])}, {fmt(value[1])}] "
    else:
        rule = f"{op} {fmt(value)} "
    return f"{_math(v['expected'])} <small>({_e(rule)}; {_math(thr.get('origin', ''))})</small>"


def fmt(x, digits: int = 3) -> str:
    """A number to `digits` significant digits, without a negative zero ("-0" reads as a sign)."""
    from lowrank.book.tables import significant

    return significant(x, digits)


def _outcome_html(v: dict | None, date: str | None = None, stale: bool = False, stale_reason: str | None = None) -> str:
    if v is None:
        return '<span class="outcome-badge outcome-none">not run</span>'
    stab = (v.get("details") or {}).get("stability")
    when = f' title="measured {_e(date)}"' if date else ""
    out = f'{badge(v["outcome"])} <span class="measured"{when}>{fmt(v["measured"])}</span>'
    if v["outcome"] == UNSTABLE and stab:
        out += f'<br><small>{_e(stability_text(stab["outcomes"]))}</small>'
    if stale:
        out += _stale_badge(stale_reason)
    return out


def _row_html(r: dict, toc_files: set[str]) -> str:
    """One verdict: its description (math rendered) linking to its row on its page, the outcome at each
    scale; the threshold, its origin, the controls and the note folded in a details element."""
    v, nb = r["verdict"], r["notebook"]
    in_book = f"notebooks/{nb}" in toc_files
    if v is None:
        status = "notebook not in the book yet" if r["exists"] else "not written yet"
        claim = (f'<a href="../notebooks/{_e(nb)}.html">{_e(r["claim_id"])}</a>' if in_book else _e(r["claim_id"]))
        return (f'<tr class="missing"><td data-label="verdict" colspan="4">{claim}: <em>{status}</em> '
                f"(<code>{_e(nb)}</code>)</td></tr>")
    name = description_html(v)
    link = f'<a href="{_e(verdict_url(r, "../"))}">{name}</a>' if in_book else name
    more = [f"<p><strong>Expects</strong> {_threshold_text(v)}</p>"]
    if v.get("controls"):
        more.append(f"<p><strong>Negative control{'s' if len(v['controls']) > 1 else ''}</strong>: {_control_text(v)}</p>")
    if v.get("note"):
        more.append(f"<p>{_math(v['note'])}</p>")
    return (f'<tr class="kind-{_e(v["kind"])}" data-outcome="{_e(v["outcome"])}">'
            f'<td data-label="{_e(v["kind"])}">{link}<details class="ledger-more"><summary>threshold, control</summary>'
            f'{"".join(more)}</details></td>'
            f'<td data-label="ci scale" class="outcome-cell">{_outcome_html(v)}</td>'
            + "".join(f'<td data-label="{s} scale" class="outcome-cell">'
                      f'{_outcome_html(r.get(s), r.get(f"{s}_date"), bool(r.get(f"{s}_stale")), r.get(f"{s}_stale_reason"))}</td>'
                      for s in SCALES[1:]) + "</tr>")


def _page_row(r: dict, toc_files: set[str]) -> str:
    """The row that opens a page's verdicts: its claim id and title, linked."""
    nb = r["notebook"]
    title = (f'<a href="../notebooks/{_e(nb)}.html">{_title_html(nb)}</a>' if f"notebooks/{nb}" in toc_files
             else f"<code>{_e(nb)}</code>")
    return f'<tr class="page-row"><th colspan="4" scope="rowgroup"><span class="claim-id">{_e(r["claim_id"])}</span> {title}</th></tr>'


def _part_table(rows: list[dict], toc_files: set[str], first: str = "verdict (links to its row on its page)") -> str:
    """Rows in claims.yaml order, each page's under a row naming the page; `first` heads the verdicts."""
    head = [first, "ci scale", "laptop scale", "paper scale"]
    body, page = [], None
    for r in rows:
        if r["notebook"] != page and r["verdict"] is not None:
            body.append(_page_row(r, toc_files))
        page = r["notebook"]
        body.append(_row_html(r, toc_files))
    return ('<div class="ledger-wrap"><table class="ledger-table rows"><colgroup><col class="c-verdict">'
            '<col class="c-ci"><col class="c-laptop"><col class="c-paper"></colgroup><thead><tr>' +
            "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead><tbody>" + "".join(body) + "</tbody></table></div>")


def page_scales_html(name: str, executed: Path, results_root: Path | None = None, laptop_root: Path | None = None) -> str:
    """A notebook page's own verdicts at ci, laptop and paper scale side by side (the ledger's rows of
    that page, a stale stored result marked), for the page itself (book/_ext/reader.py); "" when the
    executed notebook glued none."""
    rows = [r for r in ledger_rows({name: executed}, results_root, laptop_root) if r["notebook"] == name and r["verdict"]]
    if not rows:
        return ""
    ran = [s for s in SCALES[1:] if any(r.get(s) for r in rows)]
    said = (f"stored {' and '.join(ran)}-scale results ({', '.join(f'results/{s}/' for s in ran)}, with provenance)"
            if ran else "no stored laptop- or paper-scale result yet")
    return (f'<p class="page-scales-note">Each verdict of this page at ci scale (above) beside its {said}.</p>'
            + _part_table(rows, set(), first="verdict"))


def _raw(text: str) -> list[str]:
    return ["```{raw} html", text, "```"]


def ledger_markdown(rows: list[dict], toc_files: set[str]) -> str:
    lines = ["(claims-ledger)=", "# Claims ledger", "",
             "Every verdict of the book, at each scale: one row per claim, then each part's checks (folded).",
             "A row's outcome links to the verdict's row on its page; its threshold, the origin of that threshold",
             "and its negative controls are folded under the description. Generated by the book build from the",
             "glued verdicts of the executed notebooks (ci scale) and the stored laptop- and paper-scale results",
             "(`make laptop`, `make paper`, `lowrank results store`) when present; a stored result whose parameters,",
             "notebook or imported code changed since its run is marked stale.", "", "## Summary", ""]
    lines += _raw(summary_html(rows, "../"))
    beyond = [r for r in rows if beyond_paper(r)]
    if beyond:
        lines += ["", "## Beyond the papers", "",
                  "The book's own hypotheses, tested like claims but not counted with the papers' claims above.", ""]
        lines += _raw(_part_table(beyond, toc_files))
    for part, title in PARTS.items():
        part_rows = [r for r in rows if _part(r) == part and not beyond_paper(r)]
        claims = [r for r in part_rows if (r["verdict"] or {}).get("kind") != "check"]
        checks = [r for r in part_rows if (r["verdict"] or {}).get("kind") == "check"]
        lines += ["", f"## {title}", ""]
        lines += _raw(_part_table(claims, toc_files))
        if checks:
            tally = Counter(r["verdict"]["outcome"] for r in checks)
            said = ", ".join(f"{k} {o if k == 1 else LABEL[o]}" for o, k in tally.items())
            lines += [""] + _raw(f'<details class="ledger-checks"><summary>The {len(checks)} checks of {_e(title)}: '
                                 f"{_e(said)}</summary>{_part_table(checks, toc_files)}</details>")
    return "\n".join(lines) + "\n"


SUMMARY_INCLUDE = REPO_ROOT / "_build" / "generated" / "ledger_summary.md"
LANDING_INCLUDE = "landing_answers.md"  # beside SUMMARY_INCLUDE: the landing page's first screen


def _write_if_changed(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:  # unchanged: keep the mtime, Sphinx skips the page
        path.write_text(text)


def part_summary_html(rows: list[dict], part: str, base: str) -> str:
    """One part's generated sentences and its pages by scale, linked from `base` (the part's overview)."""
    return paper_summary_html(rows, part, base) + matrix_html(rows, part, base)


def write_ledger(out: Path, executed: dict[str, Path], toc_files: set[str],
                 summary_out: Path | None = SUMMARY_INCLUDE, results_root: Path | None = None,
                 laptop_root: Path | None = None, larger_scale: dict | None = None) -> Path:
    """Write the ledger page and, to include, the landing page's first screen (`landing_answers.md`
    next to `summary_out`) and summary (book/intro.md), and one per part for the parts' overviews
    (`ledger_part_<I|II|III>.md`, book/<part>/index.md). `larger_scale` as `ledger_rows`'."""
    rows = ledger_rows(executed, results_root, laptop_root, larger_scale)
    _write_if_changed(out, ledger_markdown(rows, toc_files))
    if summary_out is not None:
        _write_if_changed(summary_out.with_name(LANDING_INCLUDE), "\n".join(_raw(landing_html(rows, "../"))) + "\n")
        _write_if_changed(summary_out, "\n".join(_raw(summary_html(rows, "../"))) + "\n")
        for part in PARTS:
            _write_if_changed(summary_out.with_name(f"ledger_part_{part}.md"),
                              "\n".join(_raw(part_summary_html(rows, part, "../../"))) + "\n")
    return out
