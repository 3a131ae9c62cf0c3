"""One style for every figure, and saving a figure together with the data behind it."""

from __future__ import annotations

import io
import os
from pathlib import Path

from lowrank.core.io import write_atomically

__all__ = ["use_style", "figure_dir", "save_figure", "text_overlaps", "OVERLAP_WARNING", "PALETTE", "PALETTE_COLOURS",
           "SEABORN_THEME", "MAX_WIDTH", "MIN_FONT", "PHONE_WIDTH", "PHONE_SUFFIX", "phone_layout", "panel_grid",
           "legend_below", "count_colours", "legibility", "describe_network", "describe_task", "dataset_label"]

PALETTE = "colorblind"  # seaborn's colour-blind-safe palette, whose colours follow
PALETTE_COLOURS = ["#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc", "#ca9161", "#fbafe4", "#949494",
                   "#ece133", "#56b4e9"]
# seaborn's set_theme(style="ticks", palette=PALETTE, context="notebook") as matplotlib settings: importing
# seaborn (and scipy.stats with it) cost every page about a second. tests/test_figures.py checks them against
# seaborn's own. Left out: seaborn's default colour map ("rocket", which only importing seaborn registers);
# every image of the book names its colour map.
SEABORN_THEME = {
    "axes.axisbelow": True, "axes.edgecolor": ".15", "axes.labelcolor": ".15", "axes.labelsize": 12.0,
    "axes.linewidth": 1.25, "axes.titlesize": 12.0, "font.size": 12.0,
    "font.sans-serif": ["Arial", "DejaVu Sans", "Liberation Sans", "Bitstream Vera Sans", "sans-serif"],
    "grid.color": ".8", "grid.linewidth": 1.0, "legend.fontsize": 11.0, "legend.title_fontsize": 12.0,
    "lines.solid_capstyle": "round", "patch.edgecolor": "w", "patch.force_edgecolor": True, "text.color": ".15",
    **{f"{axis}.{key}": value for axis in ("xtick", "ytick") for key, value in (
        ("color", ".15"), ("labelsize", 11.0), ("major.size", 6.0), ("major.width", 1.25), ("minor.size", 4.0),
        ("minor.width", 1.0))},
}
# A figure is shown in the page's column (about 750 px wide, drawn at 100 px per inch): drawn no wider
# than MAX_WIDTH inches with no text below MIN_FONT points, no text is shown below about 9 px.
MAX_WIDTH = 9.5  # inches
MIN_FONT = 10  # points; seaborn's "notebook" context (use_style) draws 11-12 pt by default
# A phone shows the page column about 358 px wide: a figure drawn at most PHONE_WIDTH inches wide shows
# MIN_FONT text at 8 px or more there. save_figure writes such a phone layout of every wider figure
# (`<stem>.phone.png`: its panels in fewer columns, the same fonts), which the book shows below 600 px.
PHONE_WIDTH = 6.0  # inches
PHONE_SUFFIX = ".phone.png"


def use_style():
    """Seaborn's ticks style with the colour-blind-safe palette (SEABORN_THEME); call once per notebook.

    Seaborn's "notebook" context sets the font sizes (12 pt labels and titles, 11 pt ticks and
    legends); a figure passes a smaller `fontsize=` nowhere below MIN_FONT."""
    import matplotlib as mpl

    mpl.rcParams.update({**SEABORN_THEME, "axes.prop_cycle": mpl.cycler(color=PALETTE_COLOURS)})
    # the written PNG is the one the page shows (save_figure), so it is drawn at the screen's 100 px per inch
    mpl.rcParams.update({"figure.dpi": 100, "savefig.dpi": "figure", "axes.grid": True, "grid.alpha": 0.3,
                         "svg.hashsalt": "lowrank", "svg.fonttype": "none"})


DATASET_LABELS = {"digits": "8x8 digits", "mnist1d": "MNIST-1D", "mnist": "MNIST", "cifar10": "CIFAR-10"}


def dataset_label(name: str) -> str:
    """A data set's name in the reader's words (figure titles): "digits" -> "8x8 digits"; other names unchanged."""
    return DATASET_LABELS.get(name, name)


def figure_dir() -> Path:
    """Where figures go: $LOWRANK_FIGURE_DIR (set by the book build and `lowrank run`) or ./figures."""
    return Path(os.environ.get("LOWRANK_FIGURE_DIR", "figures"))


def save_figure(fig, stem: str, data) -> None:
    """Write `stem`.png, .svg and the figure's data as `stem`.csv (a pandas DataFrame), atomically,
    into `figure_dir()`.

    Every figure of the book goes through here, so every figure has its data next to it. Inside a
    kernel it shows the written PNG and the download links, and closes the figure: the inline
    backend would otherwise draw it a third time. It returns nothing, so that a cell ending in it
    prints nothing more.
    """
    if not hasattr(data, "to_csv") or len(data) == 0:
        raise ValueError(f"figure {stem!r}: data must be a non-empty DataFrame")
    out = figure_dir()
    paths = {ext: out / f"{stem}.{ext}" for ext in ("png", "svg", "csv")}
    write_atomically(paths["csv"], save=lambda p: data.to_csv(p, index=False))
    png = io.BytesIO()
    fig.savefig(png, format="png", bbox_inches="tight")
    write_atomically(paths["png"], png.getvalue())
    overlaps = text_overlaps(fig)
    if overlaps:  # tests/test_figures.py finds this warning in any executed notebook
        import warnings

        warnings.warn(f"figure {stem!r}: {OVERLAP_WARNING}: " + "; ".join(f"{a!r} and {b!r}" for a, b in overlaps),
                      stacklevel=2)
    # the SVG keeps the PNG's layout: the constrained layout is not solved a second time
    engine = fig.get_layout_engine()
    fig.set_layout_engine("none")
    try:
        write_atomically(paths["svg"], save=lambda p: fig.savefig(p, format="svg", bbox_inches="tight"))
    finally:
        fig.set_layout_engine(engine)
    phone = phone_layout(fig)
    if phone is not None:
        write_atomically(out / f"{stem}{PHONE_SUFFIX}", phone)
    _show_in_kernel(fig, stem, png.getvalue(), phone is not None)


def phone_layout(fig) -> bytes | None:
    """`fig` drawn for a phone's column, as PNG: no wider than PHONE_WIDTH inches, the panels of its grid in
    as many columns as fit (in reading order, or a column's panels kept together where the grid's columns
    share their x axis), the same fonts; None when it is narrow enough already or its layout cannot be
    redrawn so (panels spanning several cells, unequal columns, text drawn over text, or still too wide).
    The figure is left as it was."""
    width, height = fig.get_size_inches()
    if width <= PHONE_WIDTH + 0.05:
        return None
    grids = [ax for ax in fig.axes if ax.get_subplotspec() is not None]
    gs = {ax.get_subplotspec().get_gridspec() for ax in grids}
    if len(gs) != 1:
        return None
    (grid,) = gs
    nrows, ncols = grid.get_geometry()
    ratios = grid.get_width_ratios()
    if ratios is not None and len(set(ratios)) > 1 or any(
            len(ax.get_subplotspec().rowspan) != 1 or len(ax.get_subplotspec().colspan) != 1 for ax in grids):
        return None
    cells = sorted({(ax.get_subplotspec().rowspan.start, ax.get_subplotspec().colspan.start) for ax in grids})
    panel_w, panel_h = width / ncols, height / nrows
    cols = max(1, min(ncols, int(PHONE_WIDTH / panel_w + 0.3)))  # panels a little narrower rather than one column
    by_axes = {(ax.get_subplotspec().rowspan.start, ax.get_subplotspec().colspan.start): ax for ax in grids}
    # a grid whose columns are conditions and rows quantities (the x axis shared down each column, as
    # rank_and_accuracy_curves draws): each condition's column stays together, cut into chunks of `cols`;
    # otherwise the panels wrap in reading order
    by_column = nrows > 1 and len(cells) == nrows * ncols and all(
        by_axes[r, c].get_shared_x_axes().joined(by_axes[r, c], by_axes[r + 1, c]) for r in range(nrows - 1) for c in range(ncols))
    if by_column:
        place = {(r, c): ((c // cols) * nrows + r, c % cols) for r, c in cells}
    else:
        place = {cell: divmod(i, cols) for i, cell in enumerate(cells)}
    rows = max(r for r, _ in place.values()) + 1
    before = {ax: ax.get_subplotspec() for ax in grids}
    positions = {ax: (ax.get_position(original=True), ax.get_position(original=False)) for ax in fig.axes}
    labels = {ax: (ax.xaxis.get_tick_params()["labelbottom"] if "labelbottom" in ax.xaxis.get_tick_params() else True,
                   ax.yaxis.get_tick_params()["labelleft"] if "labelleft" in ax.yaxis.get_tick_params() else True)
              for ax in grids}
    engine = fig.get_layout_engine()
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    tight = not isinstance(engine, ConstrainedLayoutEngine)  # laid out once by tight_layout (or not at all)
    from matplotlib.text import Text

    # long titles wrap at the narrower figure's edge and figure legends take at most two columns, else the
    # tight box grows past the phone's width again
    titles = [t for t in fig.findobj(Text) if t.get_text().strip() and (t is getattr(fig, "_suptitle", None)
              or any(t in (ax.title, ax._left_title, ax._right_title) for ax in fig.axes))]
    wraps = {t: t.get_wrap() for t in titles}
    narrowed = {}
    try:
        for t in titles:
            t.set_wrap(True)
        for leg in list(fig.legends):
            copy = _narrow_legend(fig, leg, 2)
            if copy is not None:
                narrowed[leg] = copy
        phone = fig.add_gridspec(rows, cols)
        for ax in grids:
            spec = before[ax]
            r, c = place[(spec.rowspan.start, spec.colspan.start)]
            ax.set_subplotspec(phone[r, c])
            # shared axes hid the inner panels' tick labels; in the new grid other panels are outer
            ax.tick_params(labelleft=True, labelbottom=True)
        fig.set_size_inches(min(PHONE_WIDTH, panel_w * cols), panel_h * rows)
        if tight:
            fig.tight_layout()
        fig.canvas.draw()
        if text_overlaps(fig):
            return None
        png = io.BytesIO()
        fig.savefig(png, format="png", bbox_inches="tight")
        from PIL import Image

        shown = Image.open(io.BytesIO(png.getvalue())).size[0] / fig.dpi
        return png.getvalue() if shown <= PHONE_WIDTH * 1.08 else None  # a tight box adds a few points
    except Exception:  # a layout this cannot redraw: the page shows the wide figure (enlargeable) on phones too
        return None
    finally:
        for t, wrap in wraps.items():
            t.set_wrap(wrap)
        for leg, copy in narrowed.items():
            _restore_legend(fig, leg, copy)
        for ax, spec in before.items():
            ax.set_subplotspec(spec)
            ax.tick_params(labelbottom=labels[ax][0], labelleft=labels[ax][1])
        fig.set_size_inches(width, height)
        if tight:  # the positions tight_layout had found (a constrained layout finds its own at the next draw)
            for ax, (original, active) in positions.items():
                ax._set_position(original, which="original")
                ax._set_position(active, which="active")


def _narrow_legend(fig, legend, ncols: int):
    """Put a copy of figure legend `legend` in at most `ncols` columns in its place (same entries and place);
    returns the copy, or None when `legend` is narrow already. `_restore_legend` undoes it."""
    from matplotlib.legend import Legend

    if legend._ncols <= ncols:
        return None
    where = {code: name for name, code in Legend.codes.items()}[legend._loc_real]
    outside = getattr(legend, "_outside_loc", None)
    copy = fig.legend(legend.legend_handles, [t.get_text() for t in legend.texts], ncols=ncols,
                      loc=f"outside {where}" if outside else where)
    fig.legends.remove(copy)
    fig.legends[fig.legends.index(legend)] = copy
    return copy


def _restore_legend(fig, legend, copy) -> None:
    fig.legends[fig.legends.index(copy)] = legend


def _show_in_kernel(fig, stem: str, png: bytes, phone: bool = False) -> None:
    """Inside a kernel, show the figure as `png`, then links to its data and vector image.

    The book build sets LOWRANK_FIGURE_URL to where it publishes the figure folder, relative to
    the page; elsewhere the links point at the files themselves.
    """
    try:
        from IPython import get_ipython
        from IPython.display import HTML, Image, display
    except ImportError:
        return
    if get_ipython() is None:
        return
    import matplotlib.pyplot as plt

    display(Image(data=png, format="png"))
    plt.close(fig)
    base = os.environ.get("LOWRANK_FIGURE_URL") or figure_dir().resolve().as_uri()
    links = " · ".join(f'<a href="{base}/{stem}.{ext}" download>{label}</a>'
                       for ext, label in (("csv", "data (CSV)"), ("svg", "figure (SVG)")))
    # the phone layout, when there is one, is named here; the book's reader.js shows it in narrow columns
    at = f' data-phone="{base}/{stem}{PHONE_SUFFIX}"' if phone else ""
    display(HTML(f'<p class="figure-downloads"{at}>Download: {links}</p>'))


def rank_and_accuracy_curves(avg, *, panel: str, panel_values, colour: str, colour_values, colour_label,
                             panel_title, rank_column: str, alternative_column: str | None = None,
                             rank_label: str = "average rank", cmap: str = "viridis", title: str = ""):
    """The rank-versus-hyperparameter pages' figure: one column per value of `panel`, one colour per
    value of `colour`; top row the average rank per epoch (dashed: `alternative_column`, the other
    rank convention), bottom row train (solid) and test (dashed) accuracy.

    Parameters
    ----------
    avg : table with columns `epoch`, `train_acc`, `test_acc`, `panel`, `colour` and the rank columns.
    panel_values, colour_values : the values to draw, in order.
    colour_label, panel_title : functions of a value giving the legend label and the column title.
    Returns the figure.
    """
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    colours = dict(zip(colour_values, plt.get_cmap(cmap)(np.linspace(0, 0.9, len(colour_values)))))
    # at most ~9.5 in wide (a page's width), whatever the number of panels
    fig, axes = plt.subplots(2, len(panel_values), figsize=(min(MAX_WIDTH, 4.2 * len(panel_values)), 6.4), sharex=True,
                             squeeze=False)
    for j, p in enumerate(panel_values):
        for c in colour_values:
            run = avg[(avg[panel] == p) & (avg[colour] == c)]
            axes[0, j].plot(run["epoch"], run[rank_column], color=colours[c], label=colour_label(c))
            if alternative_column:
                axes[0, j].plot(run["epoch"], run[alternative_column], color=colours[c], ls="--", lw=1)
            axes[1, j].plot(run["epoch"], run["train_acc"], color=colours[c])
            axes[1, j].plot(run["epoch"], run["test_acc"], color=colours[c], ls="--")
        axes[0, j].set_title(panel_title(p), fontsize=10)
        axes[1, j].set_xlabel("epoch")
        axes[1, j].xaxis.set_major_locator(MaxNLocator(integer=True))  # whole epochs
    axes[0, 0].set_ylabel(rank_label)
    axes[1, 0].set_ylabel("accuracy (test dashed)")
    axes[0, 0].legend(fontsize=10, loc="best")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def range_errorbar(ax, x, stats, **kwargs):
    """`stats["mean"]` at `x` with bars from `stats["min"]` to `stats["max"]` (a groupby's `agg(["mean", "min",
    "max"])`); a mean one rounding step outside its range (identical values) draws no bar rather than failing."""
    import numpy as np

    mean = np.asarray(stats["mean"], dtype=float)
    below = np.clip(mean - np.asarray(stats["min"], dtype=float), 0.0, None)
    above = np.clip(np.asarray(stats["max"], dtype=float) - mean, 0.0, None)
    return ax.errorbar(x, mean, yerr=[below, above], **{"marker": "o", "capsize": 3, **kwargs})


def panel_grid(n: int, *, panel=(4.0, 3.0), ncols: int | None = None, **subplots):
    """`n` panels of `panel` (width, height) inches, in rows of at most `ncols` and never wider than
    MAX_WIDTH (more panels wrap onto more rows). Constrained layout, so that `legend_below` and a
    suptitle find room; unused cells of the last row are removed.

    Returns (figure, list of the n axes in reading order).
    """
    import matplotlib.pyplot as plt

    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    width, height = panel
    if not (0 < width <= MAX_WIDTH and height > 0):
        raise ValueError(f"panel must be (width <= {MAX_WIDTH}, height) in inches, positive, got {panel!r}")
    if ncols is not None and (not isinstance(ncols, int) or ncols < 1):
        raise ValueError(f"ncols must be a positive int, got {ncols!r}")
    fit = max(1, int(MAX_WIDTH // width))
    cols = min(n, ncols or fit, fit)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False,
                             layout="constrained", **subplots)
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.remove()
    return fig, flat[:n]


def legend_below(fig, axes=None, *, ncol: int | None = None, **kwargs):
    """One legend for the whole figure, below the panels (never over the data): the labelled
    artists of `axes` (default: every axes of `fig`), each label once. Needs constrained layout
    (`panel_grid`, or `plt.subplots(..., layout="constrained")`)."""
    handles, labels = [], []
    for ax in (fig.axes if axes is None else axes):
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if not labels:
        raise ValueError("legend_below: no labelled artist in the given axes")
    return fig.legend(handles, labels, loc="outside lower center", ncol=ncol or min(len(labels), 4), **kwargs)


def count_colours(values, cmap: str = "viridis") -> dict:
    """A distinct colour for each whole number from 0 to max(values): {count: colour}, for a map of
    counts drawn with a legend of the integers instead of a continuous colour bar."""
    import matplotlib.pyplot as plt
    import numpy as np

    arr = np.asarray(values, dtype=float)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr < 0) or np.any(arr != np.round(arr)):
        raise ValueError("values must be non-empty, finite, whole and non-negative")
    top = int(arr.max())
    colours = plt.get_cmap(cmap, top + 1)
    return {k: colours(k) for k in range(top + 1)}


OVERLAP_WARNING = "text drawn over other text"


def text_overlaps(fig, min_px: float = 1.0) -> list[tuple[str, str]]:
    """The pairs of texts of a drawn figure whose boxes overlap by more than `min_px` pixels both ways:
    axis labels, titles, legend entries and annotations (tick labels aside, which matplotlib spaces itself);
    a label printed over another cannot be read."""
    from matplotlib.text import Text

    ticks = {label for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
             for tick in axis.get_major_ticks() + axis.get_minor_ticks() for label in (tick.label1, tick.label2)}
    boxes = [(t.get_text(), t.get_window_extent()) for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip() and t not in ticks]
    return [(a, b) for i, (a, box_a) in enumerate(boxes) for b, box_b in boxes[i + 1:]
            if min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0) > min_px
            and min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0) > min_px]


def legibility(svg) -> dict:
    """Width (inches) and smallest font (points) of a figure saved as SVG by `save_figure`.

    The size of a text element is the largest of its parts, so that the exponent of a tick label
    like 10^-2 (drawn at 70 %) counts as part of a legible label. Returns
    {"width_in", "min_font_pt", "problems": [what breaks MAX_WIDTH or MIN_FONT]}."""
    import re
    import xml.etree.ElementTree as ET

    root = ET.parse(svg).getroot()
    width = root.get("width", "")
    if not width.endswith("pt"):
        raise ValueError(f"{svg}: SVG width {width!r} is not in points")
    width_in = float(width[:-2]) / 72
    size = re.compile(r"font-size:\s*([0-9.]+)px")  # matplotlib's SVG: 1 px = 1 pt (72 per inch)
    texts = []
    for el in root.iter("{http://www.w3.org/2000/svg}text"):
        sizes = [float(m) for node in el.iter() for m in size.findall(node.get("style", ""))]
        words = re.sub(r"\s+", "", "".join(el.itertext()))
        if sizes and words:
            texts.append((max(sizes), words))
    min_font = min((s for s, _ in texts), default=float("inf"))
    problems = []
    if width_in > MAX_WIDTH + 0.1:  # a tight bounding box may add a few points of padding
        problems.append(f"{width_in:.1f} in wide (at most {MAX_WIDTH})")
    small = sorted({w for s, w in texts if s < MIN_FONT - 1e-6})
    if small:
        problems.append(f"text below {MIN_FONT} pt: {small[:5]}")
    return {"width_in": width_in, "min_font_pt": min_font, "problems": problems}


def describe_task(dataset: str, classes) -> str:
    """A data set and its classes in a reader's words, for titles: '8x8 digits, "1" vs "2"',
    'CIFAR-10, classes 0-9', 'MNIST, classes 0, 3, 5'."""
    if dataset not in DATASET_LABELS:
        raise ValueError(f"dataset must be one of {sorted(DATASET_LABELS)}, got {dataset!r}")
    classes = [int(c) for c in classes]
    if len(classes) < 2:
        raise ValueError(f"classes must list at least two classes, got {classes!r}")
    if len(classes) == 2:
        which = f'"{classes[0]}" vs "{classes[1]}"'
    elif classes == list(range(classes[0], classes[-1] + 1)):
        which = f"classes {classes[0]}-{classes[-1]}"
    else:
        which = "classes " + ", ".join(map(str, classes))
    return f"{dataset_label(dataset)}, {which}"


def describe_network(arch: str, arch_kwargs: dict | None = None) -> str:
    """A network of `lowrank.core.nets.normalized.make` in a reader's words, for titles:
    'MLP, 1 hidden layer of 128', 'MLP, hidden layers of 64, 32', "the paper's 6-layer CNN",
    'tree CNN, kernel = stride = 2, 1 channel'."""
    import inspect

    from lowrank.core.nets import normalized

    kw = dict(arch_kwargs or {})

    def arg(constructor, name):  # the value the network was built with: given, else the constructor's default
        return kw.get(name, inspect.signature(constructor).parameters[name].default)

    if arch == "mlp":
        widths = [int(w) for w in arg(normalized.mlp, "widths")]
        if not widths:
            return "linear model (no hidden layer)"
        if len(set(widths)) == 1:
            return f"MLP, {len(widths)} hidden layer{'s' if len(widths) > 1 else ''} of {widths[0]}"
        return "MLP, hidden layers of " + ", ".join(map(str, widths))
    if arch == "paper_cnn":
        channels = [int(c) for c in arg(normalized.paper_cnn, "channels")]
        if channels == list(inspect.signature(normalized.paper_cnn).parameters["channels"].default):
            return "the paper's 6-layer CNN"
        return f"the paper's CNN shape, {len(channels) + 2} layers, channels " + ", ".join(map(str, channels))
    if arch == "tree_cnn":
        k, ch = int(arg(normalized.tree_cnn, "kernel_size")), int(arg(normalized.tree_cnn, "channels"))
        return f"tree CNN, kernel = stride = {k}, {ch} channel{'s' if ch > 1 else ''}"
    raise ValueError(f"arch must be mlp, paper_cnn or tree_cnn, got {arch!r}")
