"""The claims ledger: every claim of the book with the verdicts its notebook glued, as a dashboard.

Written by the book build (`book/ledger.md`, generated, not committed) from the executed ci-scale
notebooks and, where they exist, the stored paper-scale results under `results/paper/`. It reads only what the
notebooks glued. Claims and checks are counted apart: the headline counts claims only, and a claim
whose negative control also meets its threshold is "uninformative", never agreement.

The page opens with the summary (claims by outcome, checks, unconverted verdicts; by part and by
scale) and the list of claims that disagree, then one table per part. Each verdict links to its
row on its page (anchor `verdict-<name>`, set by book/_ext/reader.py). The same summary is written
for the landing page (`summary_html`, included by book/intro.md).
"""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path

import nbformat
import yaml

from lowrank.book.paper_results import paper_results
from lowrank.book.notebooks import REPO_ROOT, list_notebooks, verdicts
from lowrank.book.verdicts import CHECK_OUTCOMES, CLAIM_OUTCOMES, LARGER_SCALE, UNSTABLE, stability_text

__all__ = ["CLAIMS", "PARTS", "OUTCOME_STYLE", "ledger_rows", "ledger_counts", "counts_by_part", "ledger_markdown",
           "summary_html", "write_ledger"]

CLAIMS = REPO_ROOT / "book" / "claims.yaml"
PARTS = {"I": "Part I: rank-two gradients", "II": "Part II: SGD and weight decay", "III": "Part III: square loss"}
# badge class of each outcome (book/_ext/static/reader.css): green, red, amber, blue
# how a count reads: "12 agree", "3 checks hold"
LABEL = {"agrees": "agree", "disagrees": "disagree", "uninformative": "uninformative",
         LARGER_SCALE: "need a larger scale", UNSTABLE: "unstable", "holds": "hold", "fails": "fail", "loose": "loose"}
OUTCOME_STYLE = {"agrees": "good", "holds": "good", "disagrees": "bad", "fails": "bad", "uninformative": "weak",
                 LARGER_SCALE: "pending", UNSTABLE: "weak", "loose": "weak"}


def _paper_result(name: str, results_root: Path | None) -> dict | None:
    """The stored paper-scale result of `name` (results/paper/, `lowrank results store`), with its date
    and whether its parameters still match the notebook's paper file."""
    found = paper_results(name, results_root)
    if found is None:
        return None
    return {"date": found["provenance"].get("end", "")[:10], "verdicts": found["verdicts"], "stale": found["stale"]}


def ledger_rows(executed: dict[str, Path], results_root: Path | None = None) -> list[dict]:
    """One row per (claim, verdict); claims without a notebook yet get one row saying so.

    A verdict whose claim id is not the notebook's row in claims.yaml is listed too (under its own
    id), so that the ledger counts every glued verdict.
    """
    claims = yaml.safe_load(CLAIMS.read_text())
    existing = set(list_notebooks())
    rows, seen = [], set()
    by_notebook: dict[str, list[str]] = {}
    for c in claims:
        by_notebook.setdefault(c["notebook"], []).append(c["claim"])
    for c in claims:
        name = c["notebook"]
        path = executed.get(name)
        if name not in existing or path is None or not Path(path).is_file():
            rows.append({"claim": c["claim"], "notebook": name, "exists": name in existing, "verdict": None})
            continue
        nb = nbformat.read(path, as_version=4)
        paper = _paper_result(name, results_root)
        found_all = verdicts(nb)
        found = [v for v in found_all.values() if v["claim"] == c["claim"]]
        if c["claim"] == by_notebook[name][-1]:  # the notebook's last claims.yaml row takes the unlisted ones
            found += [v for v in found_all.values() if v["claim"] not in by_notebook[name]]
        for v in found or [None]:
            if v is not None:
                if (name, v["name"]) in seen:
                    continue
                seen.add((name, v["name"]))
            pv = paper["verdicts"].get(v["name"]) if paper and v else None
            rows.append({"claim": v["claim"] if v else c["claim"], "notebook": name, "exists": True, "verdict": v,
                         "paper": pv, "paper_date": paper["date"] if pv else None,
                         "paper_stale": bool(pv and paper["stale"])})
    return rows


def beyond_paper(row: dict) -> bool:
    """A verdict on the book's own hypothesis (details `beyond_paper`): listed apart, never counted with
    the papers' claims."""
    return bool(((row.get("verdict") or {}).get("details") or {}).get("beyond_paper"))


def ledger_counts(rows: list[dict], scale: str = "ci") -> dict[str, Counter]:
    """`{kind: Counter(outcome)}` over the measured rows at `scale` ("ci" or "paper"), the papers' own
    claims only (verdicts beyond the paper are counted by `beyond_paper`)."""
    counts: dict[str, Counter] = {"claim": Counter(), "check": Counter()}
    for r in rows:
        v = r["verdict"] if scale == "ci" else r.get("paper")
        if v and not beyond_paper(r):
            counts[v["kind"]][v["outcome"]] += 1
    return counts


def _part(row: dict) -> str:
    return row["claim"].split("-")[0]


def counts_by_part(rows: list[dict], scale: str = "ci") -> dict[str, dict[str, Counter]]:
    """`{part: {kind: Counter(outcome)}}`, parts as in PARTS."""
    return {p: ledger_counts([r for r in rows if _part(r) == p], scale) for p in PARTS}


# --- HTML pieces (the page is Markdown with raw HTML blocks, so that tables can have sticky headers,
# badges, and a card layout on a phone) ------------------------------------------------------------

def _e(text) -> str:
    return html.escape(str(text), quote=True)


def badge(outcome: str | None, text: str | None = None) -> str:
    style = OUTCOME_STYLE.get(outcome or "", "none")
    return f'<span class="outcome-badge outcome-{style}">{_e(text if text is not None else outcome or "—")}</span>'


def verdict_url(row: dict, base: str) -> str:
    """Link to the verdict's row on its page (`base` is the relative path from the linking page to the root)."""
    v = row["verdict"]
    frag = f"verdict-{v['name']}" if v else "verdict"
    return f"{base}notebooks/{row['notebook']}.html#{frag}"


def _cards(counts: dict[str, Counter], scale: str) -> str:
    claims, checks = counts["claim"], counts["check"]
    cards = [(o, claims[o], f"claims {LABEL[o]}", "claim") for o in CLAIM_OUTCOMES]
    cards += [(o, checks[o], f"checks {LABEL[o]}", "check") for o in CHECK_OUTCOMES]
    out = [f'<div class="ledger-cards" data-scale="{scale}">']
    for outcome, n, label, kind in cards:
        style = OUTCOME_STYLE[outcome] if n else "none"
        out.append(f'<div class="ledger-card outcome-{style}"><span class="count" data-kind="{kind}" '
                   f'data-outcome="{_e(outcome)}" data-scale="{scale}">{n}</span><span class="label">{_e(label)}</span></div>')
    out.append("</div>")
    return "".join(out)


def _by_part(rows: list[dict]) -> str:
    """Claims and checks per part and per scale: one line of badges each (zeros left out)."""
    items = []
    for scale in ("ci", "paper"):
        per = counts_by_part(rows, scale)
        for part, title in PARTS.items():
            c = per[part]
            if scale == "paper" and not any(sum(c[k].values()) for k in c):
                continue
            items.append(f'<li><strong>{_e(title)}</strong>, {scale} scale: {_count_badges(c) or "nothing measured"}</li>')
    out = f'<ul class="ledger-by-part">{"".join(items)}</ul>'
    if not any(sum(c.values()) for c in ledger_counts(rows, "paper").values()):
        out += ('<p class="ledger-note">No stored paper-scale result yet (<code>make paper</code>, or '
                "<code>lowrank results store RUN_FOLDER</code> after <code>lowrank run NAME --scale paper</code>; "
                "the next build lists its verdicts here).</p>")
    return out


def _disagreements(rows: list[dict], base: str) -> str:
    """Claims that disagree and checks that fail."""
    def item(r):
        v = r["verdict"]
        return (f'<li>{badge(v["outcome"])} <a href="{_e(verdict_url(r, base))}">{_e(r["claim"])} · '
                f'{_e(v.get("description") or v["name"])}</a></li>')

    bad = [item(r) for r in rows if r["verdict"] and r["verdict"]["outcome"] in ("disagrees", "fails")]
    return (f'<ul class="ledger-disagreements">{"".join(bad)}</ul>' if bad
            else "<p>No claim disagrees and no check fails at ci scale.</p>")


def _what_it_means(c: dict[str, Counter]) -> str:
    """One sentence on what a part's ci-scale claims say about its paper."""
    claims = c["claim"]
    n = sum(claims.values())
    if not n:
        return "no claim measured yet."
    decided = claims["agrees"] + claims["disagrees"]
    words = [f"{claims[o]} {LABEL[o] if claims[o] != 1 else o}" for o in CLAIM_OUTCOMES if claims[o]]
    text = f"of {n} claims, {', '.join(words)}. "
    if decided == 0:
        return text + "No claim is decided at ci scale: read this part as a method, and its verdicts at paper scale."
    text += f"{decided} of {n} {'is' if decided == 1 else 'are'} decided at ci scale"
    undecided = [f"{claims[o]} {one if claims[o] == 1 else many}" for o, one, many in (
        (LARGER_SCALE, "cannot reach its mechanism's regime here", "cannot reach their mechanism's regime here"),
        (UNSTABLE, "turns on the seed or the CPU's rounding", "turn on the seed or the CPU's rounding"),
        ("uninformative", "is matched by its negative control", "are matched by their negative control")) if claims[o]]
    return text + (f"; {'; '.join(undecided)}." if undecided else ".")


def _part_sentences(rows: list[dict]) -> str:
    per = counts_by_part(rows, "ci")
    items = "".join(f"<li><strong>{_e(title)}</strong>: {_e(_what_it_means(per[part]))}</li>" for part, title in PARTS.items())
    return f'<ul class="ledger-meaning">{items}</ul>'


def _range_note(golden: dict | None) -> str:
    """How many golden entries test the outcome alone (their tolerance covers the statistic's range)."""
    if golden is None:
        from lowrank.book.goldens import GOLDEN, load
        golden = load() if GOLDEN.is_file() else {}  # a book without goldens (a probe book)
    wide = sorted(k for block in golden.values() for k, e in block.items() if e.get("tolerance_covers_range"))
    if not wide:
        return ""
    return (f'<p class="ledger-note">{len(wide)} verdict(s) vary over seeds and CPU paths across the whole range of '
            f"their statistic, so the regression tests compare only their outcome: {_e(', '.join(wide))}.</p>")


def summary_html(rows: list[dict], base: str, golden: dict | None = None) -> str:
    """The headline at ci scale (claims, checks, unconverted) and the disagreements, linked from `base`."""
    counts = ledger_counts(rows, "ci")
    n_claims = sum(counts["claim"].values())
    n_beyond = sum(beyond_paper(r) for r in rows)
    return ("".join([
        f'<p class="ledger-group-title">At ci scale: {n_claims} claims, {sum(counts["check"].values())} checks'
        + (f" (and {n_beyond} verdict(s) on the book's own hypotheses, listed apart)" if n_beyond else "") + "</p>",
        _cards(counts, "ci"),
        '<p class="ledger-group-title">What it means for each paper, at ci scale</p>',
        _part_sentences(rows),
        '<p class="ledger-note"><em>unstable</em>: the outcome differs over seed offsets 0–4 or between two CPU code '
        "paths (rounding), so no single run decides it; <em>needs a larger scale</em>: the run cannot reach the regime "
        "the mechanism needs, computed before training.</p>",
        _range_note(golden),
        '<p class="ledger-group-title">Claims that disagree and checks that fail</p>',
        _disagreements(rows, base)]))


def _control_text(v: dict) -> str:
    parts = []
    for c in v.get("controls") or []:
        cls = ' class="control-pass" title="this control meets the threshold too"' if c.get("passes") else ""
        parts.append(f"<span{cls}>{_e(c['name'])}: {c['value']:.3g}</span>")
    return "<br>".join(parts) or "—"


def _threshold_text(v: dict) -> str:
    thr = v.get("threshold") or {}
    op, value = thr.get("op"), thr.get("value")
    if op is None:
        rule = ""
    elif op == "between":
        rule = f"in [{value[0]:.4g}, {value[1]:.4g}] "
    else:
        rule = f"{op} {value:.4g} "
    return f"{_e(v['expected'])}<br><small>{_e(rule)}({_e(thr.get('origin', ''))})</small>"


def _row_html(r: dict, toc_files: set[str]) -> str:
    v, nb = r["verdict"], r["notebook"]
    in_book = f"notebooks/{nb}" in toc_files
    if v is None:
        status = "notebook not in the book yet" if r["exists"] else "not written yet"
        claim = (f'<a href="../notebooks/{_e(nb)}.html">{_e(r["claim"])}</a>' if in_book else _e(r["claim"]))
        return (f'<tr class="missing"><td data-label="verdict" colspan="5">{claim}: <em>{status}</em> '
                f"(<code>{_e(nb)}</code>)</td></tr>")
    name = _e(v.get("description") or v["name"])
    link = f'<a href="{_e(verdict_url(r, "../"))}">{name}</a>' if in_book else name
    kind = v["kind"]
    stab = (v.get("details") or {}).get("stability")
    ci = (f'{v["measured"]:.3g} ({badge(v["outcome"])}'
          + (f'<br><small>{_e(stability_text(stab["outcomes"]))}</small>' if v["outcome"] == UNSTABLE and stab else "") + ")")
    pv = r.get("paper")
    stale = (' <span class="outcome-badge outcome-none" title="the paper file changed since this run">stale</span>'
             if r.get("paper_stale") else "")
    paper = (f'{pv["measured"]:.3g} ({badge(pv["outcome"])}) <small>{_e(r["paper_date"])}'
             f"</small>{stale}" if pv else '<span class="outcome-badge outcome-none">not run</span>')
    return (f'<tr class="kind-{_e(v["kind"])}" data-outcome="{_e(v["outcome"])}">'
            f'<td data-label="verdict"><small class="claim-id">{_e(r["claim"])} · {_e(kind)}</small><br>{link}</td>'
            f'<td data-label="control">{_control_text(v)}</td>'
            f'<td data-label="expects">{_threshold_text(v)}</td>'
            f'<td data-label="ci scale" class="outcome-cell">{ci}</td>'
            f'<td data-label="paper scale" class="outcome-cell">{paper}</td></tr>')


def _part_table(rows: list[dict], toc_files: set[str]) -> str:
    """Claims first, then checks, in claims.yaml order within each."""
    order = {"claim": 0, "check": 1}
    rows = sorted(rows, key=lambda r: order.get((r["verdict"] or {}).get("kind"), 3))
    head = ["verdict (links to its row)", "negative control", "expects (origin of the threshold)", "ci scale",
            "paper scale"]
    return ('<div class="ledger-wrap"><table class="ledger-table rows"><colgroup><col class="c-verdict">'
            '<col class="c-control"><col class="c-expects"><col class="c-ci"><col class="c-paper"></colgroup><thead><tr>' +
            "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead><tbody>" +
            "".join(_row_html(r, toc_files) for r in rows) + "</tbody></table></div>")


def _raw(text: str) -> list[str]:
    return ["```{raw} html", text, "```"]


def ledger_markdown(rows: list[dict], toc_files: set[str]) -> str:
    lines = ["(claims-ledger)=", "# Claims ledger", "",
             "Every claim of the book, the verdict its notebook measured, the negative control measured beside it,",
             "and the outcome. A *claim* is an empirical statement of a paper; it agrees only when it meets its",
             "threshold and no control does (otherwise it is *uninformative*). A *check* must hold whatever the",
             "data; a failing check is a bug. Generated by the book build from the glued verdicts of the executed",
             "notebooks (ci scale) and the stored paper-scale results (`make paper`, `lowrank results store`) when present.",
             "", "## Summary", ""]
    lines += _raw(summary_html(rows, "../"))
    paper = ledger_counts(rows, "paper")
    if any(sum(c.values()) for c in paper.values()):
        lines += ["", "At paper scale:", ""] + _raw(_cards(paper, "paper"))
    lines += ["", "### By part and scale", ""] + _raw(_by_part(rows))
    beyond = [r for r in rows if beyond_paper(r)]
    if beyond:
        lines += ["", "## Beyond the papers", "",
                  "The book's own hypotheses, tested like claims but not counted with the papers' claims above.", ""]
        lines += _raw(_part_table(beyond, toc_files))
    for part, title in PARTS.items():
        part_rows = [r for r in rows if _part(r) == part and not beyond_paper(r)]
        pages = dict.fromkeys((r["claim"], r["notebook"]) for r in part_rows if f"notebooks/{r['notebook']}" in toc_files)
        lines += ["", f"## {title}", "",
                  "Pages: " + " · ".join(f"[{c}](../notebooks/{nb}.md)" for c, nb in pages), ""]
        lines += _raw(_part_table(part_rows, toc_files))
    return "\n".join(lines) + "\n"


SUMMARY_INCLUDE = REPO_ROOT / "_build" / "generated" / "ledger_summary.md"


def _write_if_changed(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:  # unchanged: keep the mtime, Sphinx skips the page
        path.write_text(text)


def _count(n: int, noun: str, outcome: str) -> str:
    """"1 claim agrees", "3 claims agree"."""
    return f"{n} {noun} {outcome}" if n == 1 else f"{n} {noun}s {LABEL[outcome]}"


def _count_badges(c: dict) -> str:
    """A badge per outcome present in `c` (`ledger_counts`' claims, then checks), as HTML."""
    badges = [badge(o, _count(c["claim"][o], "claim", o)) for o in CLAIM_OUTCOMES if c["claim"][o]]
    badges += [badge(o, _count(c["check"][o], "check", o)) for o in CHECK_OUTCOMES if c["check"][o]]
    return " ".join(badges)


def part_summary_html(rows: list[dict], part: str, base: str) -> str:
    """One part's verdicts at ci scale (badges) and its disagreements, linked from `base`."""
    part_rows = [r for r in rows if _part(r) == part]
    badges = _count_badges(ledger_counts(part_rows, "ci"))
    return (f'<p class="ledger-part-summary">At ci scale: {badges or "nothing measured yet"}</p>'
            + _disagreements(part_rows, base))


def write_ledger(out: Path, executed: dict[str, Path], toc_files: set[str],
                 summary_out: Path | None = SUMMARY_INCLUDE, results_root: Path | None = None) -> Path:
    """Write the ledger page and, to include, the summary for the landing page (book/intro.md) and
    one per part for the parts' overviews (`ledger_part_<I|II|III>.md` next to it, book/<part>/index.md)."""
    rows = ledger_rows(executed, results_root)
    _write_if_changed(out, ledger_markdown(rows, toc_files))
    if summary_out is not None:
        _write_if_changed(summary_out, "\n".join(_raw(summary_html(rows, "../"))) + "\n")
        for part in PARTS:
            _write_if_changed(summary_out.with_name(f"ledger_part_{part}.md"),
                              "\n".join(_raw(part_summary_html(rows, part, "../../"))) + "\n")
    return out
