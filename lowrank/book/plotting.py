"""One style for every figure, and saving a figure together with the data behind it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["use_style", "figure_dir", "save_figure", "dataset_label", "PALETTE"]

PALETTE = "colorblind"


def use_style():
    """Seaborn's ticks style with the colour-blind-safe palette; call once per notebook."""
    import matplotlib as mpl
    import seaborn as sns

    sns.set_theme(style="ticks", palette=PALETTE, context="notebook")
    mpl.rcParams.update({"figure.dpi": 100, "savefig.dpi": 150, "axes.grid": True, "grid.alpha": 0.3,
                         "svg.hashsalt": "lowrank", "svg.fonttype": "none"})


DATASET_LABELS = {"digits": "8x8 digits", "mnist1d": "MNIST-1D", "mnist": "MNIST", "cifar10": "CIFAR-10"}


def dataset_label(name: str) -> str:
    """A data set's name in the reader's words (figure titles): "digits" -> "8x8 digits"; other names unchanged."""
    return DATASET_LABELS.get(name, name)


def figure_dir() -> Path:
    """Where figures go: $LOWRANK_FIGURE_DIR (set by the book build and `lowrank run`) or ./figures."""
    return Path(os.environ.get("LOWRANK_FIGURE_DIR", "figures"))


def _atomic_write(path: Path, write, mode: int = 0o644):
    """`write(tmp)` to a temporary file next to `path`, then rename it over `path`. The file gets
    `mode` (mkstemp makes it 0600, which a web server running as another user cannot serve)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_figure(fig, stem: str, data) -> dict:
    """Write `stem`.png, .svg and the figure's data as `stem`.csv (a pandas DataFrame), atomically.

    Returns the written paths. Every figure of the book goes through here, so every figure has
    its data next to it.
    """
    if not hasattr(data, "to_csv") or len(data) == 0:
        raise ValueError(f"figure {stem!r}: data must be a non-empty DataFrame")
    out = figure_dir()
    paths = {ext: out / f"{stem}.{ext}" for ext in ("png", "svg", "csv")}
    _atomic_write(paths["csv"], lambda p: data.to_csv(p, index=False))
    for ext in ("png", "svg"):
        _atomic_write(paths[ext], lambda p, ext=ext: fig.savefig(p, format=ext, bbox_inches="tight"))
    _show_download_links(stem)
    return paths


def _show_download_links(stem: str) -> None:
    """Inside a kernel, print links to the figure's data and vector image.

    The book build sets LOWRANK_FIGURE_URL to where it publishes the figure folder, relative to
    the page; elsewhere the links point at the files themselves.
    """
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display
    except ImportError:
        return
    if get_ipython() is None:
        return
    base = os.environ.get("LOWRANK_FIGURE_URL") or figure_dir().resolve().as_uri()
    links = " · ".join(f'<a href="{base}/{stem}.{ext}" download>{label}</a>'
                       for ext, label in (("csv", "data (CSV)"), ("svg", "figure (SVG)")))
    display(HTML(f'<p class="figure-downloads">Download: {links}</p>'))


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

    colours = dict(zip(colour_values, plt.get_cmap(cmap)(np.linspace(0, 0.9, len(colour_values)))))
    # at most ~9.5 in wide (a page's width), whatever the number of panels
    fig, axes = plt.subplots(2, len(panel_values), figsize=(min(9.5, 4.2 * len(panel_values)), 6.4), sharex=True,
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
    axes[0, 0].set_ylabel(rank_label)
    axes[1, 0].set_ylabel("accuracy (test dashed)")
    axes[0, 0].legend(fontsize=10, loc="best")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
