"""Standalone HTML for one run folder, or a side-by-side comparison of several."""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path

from lowrank.core.io import (OutputRefused, check_replaceable, read_regular_bytes, write_atomically,
                             written_by_lowrank)

__all__ = ["render"]

_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f3f3f3}.no{color:#b00;font-weight:bold}.diff{background:#fff6d5}img{max-width:100%}"""


def _cell(x) -> str:
    return html.escape(f"{x:.4g}" if isinstance(x, float) else str(x))


# in every report's head (a name for what wrote it; never proof: an existing file is replaced only when
# `lowrank.core.io.written_by_lowrank` says so)
GENERATOR = "<meta name='generator' content='lowrank report'>"


def check_output(out) -> Path:
    """`out` as the file to write the report to, or InputError (one line) before any work: a link, a
    folder, a device, a FIFO, an existing file this tool did not write (`written_by_lowrank`: a `.py`,
    a notebook, the goldens, whatever their first bytes say), a path inside a run folder or the runs
    folder (its parent's links resolved), or an unwritable folder."""
    from lowrank.book.notebooks import InputError
    from lowrank.book.runs import RUNS, check_output_folder, enclosing_run_folder

    out = Path(out)
    if out.is_dir():
        # the hint names a file that would be accepted: never one inside a run folder or the runs folder
        resolved, runs_root = out.resolve(), RUNS.resolve()
        inside = enclosing_run_folder(resolved)
        if inside is not None or resolved == runs_root or runs_root in resolved.parents:
            where = f"the run folder {inside}" if inside is not None else f"the runs folder {RUNS}"
            raise InputError(f"report output {out} is a folder in {where}, where no report is written; give a file "
                             f"name outside it, e.g. report.html")
        raise InputError(f"report output {out} is a folder; give a file name, e.g. {out / 'report.html'}")
    try:
        target = check_replaceable(out, "report output", ours=written_by_lowrank)
    except OutputRefused as err:
        raise InputError(str(err)) from None
    # a file written into a run folder breaks its manifest, and the next run replaces the folder
    # (the report and anything else in it lost): refused, as anywhere below the runs folder
    inside = enclosing_run_folder(target.parent)
    if inside is not None:
        raise InputError(f"report output {out} is inside the run folder {inside}; write it elsewhere")
    runs_root = RUNS.resolve()
    if target.parent == runs_root or runs_root in target.parents:
        raise InputError(f"report output {out} is inside the runs folder {RUNS}; write it elsewhere")
    check_output_folder(target.parent, "report output's folder")
    if not os.access(target.parent, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise InputError(f"report output {out} cannot be written")
    return target


def render(loaded: list[dict], out: Path) -> Path:
    """Write `out`: parameters and verdicts as tables (differences highlighted), then figures."""
    if not loaded:
        raise ValueError("nothing to render: give at least one run folder")
    out = check_output(out)
    labels = [r["provenance"].get("hash", r["folder"].name) for r in loaded]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'>{GENERATOR}<title>lowrank runs</title><style>{_STYLE}</style>",
             "</head><body>"]
    names = sorted({r["provenance"].get("notebook") or r["provenance"].get("function", "?") for r in loaded})
    parts.append(f"<h1>{html.escape(', '.join(names))}</h1>")
    head = "<tr><th></th>" + "".join(f"<th>{html.escape(x)}</th>" for x in labels) + "</tr>"

    def table(title, rows):
        parts.append(f"<h2>{title}</h2><table>{head}")
        for key, values in rows:
            cls = " class='diff'" if len({repr(v) for v in values}) > 1 else ""
            parts.append(f"<tr{cls}><th>{html.escape(key)}</th>" + "".join(f"<td>{v}</td>" for v in values) + "</tr>")
        parts.append("</table>")

    pkeys = sorted({k for r in loaded for k in r["provenance"]["parameters"]})
    table("Parameters", [(k, [_cell(r["provenance"]["parameters"].get(k, "")) for r in loaded]) for k in pkeys])
    vkeys = sorted({k for r in loaded for k in r["verdicts"]})

    def verdict(r, k):
        v = r["verdicts"].get(k)
        if v is None:
            return ""
        good = v["outcome"] in ("agrees", "holds")
        mark = html.escape(v["outcome"]) if good else f"<span class='no'>{html.escape(v['outcome'])}</span>"
        return f"{_cell(v['measured'])} ({mark})<br><small>expects {html.escape(v['expected'])}</small>"

    table("Verdicts", [(k, [verdict(r, k) for r in loaded]) for k in vkeys])
    prov = ["start", "wall_s", "device", "git"]
    table("Provenance", [(k, [_cell(r["provenance"].get(k)) for r in loaded]) for k in prov])
    parts.append("<h2>Figures</h2>")
    stems = sorted({p.stem for r in loaded for p in r["figures"]})
    for stem in stems:
        parts.append(f"<h3>{html.escape(stem)}</h3><table><tr>")
        for r in loaded:
            png = r["folder"] / "figures" / f"{stem}.png"
            img = (f"<img src='data:image/png;base64,{base64.b64encode(read_regular_bytes(png, 'figure')).decode()}'>"
                   if png.is_file() else "(none)")
            parts.append(f"<td><b>{html.escape(r['provenance'].get('hash', r['folder'].name))}</b><br>{img}</td>")
        parts.append("</tr></table>")
    parts.append("</body></html>")
    return write_atomically(out, "".join(parts), record=True)
