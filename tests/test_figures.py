"""Figures are legible in the page column: drawn no wider than plotting.MAX_WIDTH inches, no text
below plotting.MIN_FONT points (read from the SVG each notebook saved through save_figure); and the
plotting helpers behind that."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import pytest  # noqa: E402

from lowrank.book import build, pages, plotting  # noqa: E402

NAMES = build.book_notebooks()


@pytest.mark.parametrize("name", NAMES)
def test_figures_fit_the_page_column(name, executed_notebooks):
    executed_notebooks[name]  # executes it when stale, which writes its figures
    svgs = sorted((pages.FIGURES / name).glob("*.svg"))
    assert svgs, f"{name}: no figure"
    bad = {p.name: plotting.legibility(p)["problems"] for p in svgs}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"{name}: figures not legible in the page column: {bad}"


@pytest.mark.parametrize("name", NAMES)
def test_no_figure_draws_text_over_text(name, executed_notebooks):
    """save_figure warns when two labels overlap (plotting.text_overlaps); no executed page shows the warning."""
    nb = nbformat.read(executed_notebooks[name], as_version=4)
    shown = [o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
             if plotting.OVERLAP_WARNING in str(o.get("text", ""))]
    assert not shown, f"{name}: {shown}"


def test_text_overlaps_finds_two_labels_drawn_over_each_other(tmp_path, monkeypatch):
    plotting.use_style()
    fig, axes = plt.subplots(2, 1, figsize=(4, 3), layout="constrained")
    axes[0].set_ylabel("a label much longer than its panel is high")
    axes[1].set_ylabel("a second label, also too long")
    axes[1].set_xlabel("x")
    with pytest.warns(UserWarning, match=plotting.OVERLAP_WARNING):
        _save(fig, tmp_path, monkeypatch)
    assert plotting.text_overlaps(fig) == [("a label much longer than its panel is high", "a second label, also too long")]
    fig, axes = plt.subplots(2, 1, figsize=(4, 3), layout="constrained")
    axes[0].set_ylabel("short")
    axes[1].set_ylabel("also short")
    axes[0].legend(handles=axes[0].plot([0, 1], [0, 1], label="a line"))
    fig.canvas.draw()
    assert plotting.text_overlaps(fig) == []
    plt.close("all")


def _save(fig, tmp_path, monkeypatch, stem="f"):
    import pandas as pd

    monkeypatch.setenv("LOWRANK_FIGURE_DIR", str(tmp_path))
    plotting.save_figure(fig, stem, pd.DataFrame({"x": [1]}))
    plt.close(fig)
    return tmp_path / f"{stem}.svg"


def test_use_style_sets_seaborns_ticks_theme_without_importing_it():
    """use_style's settings equal seaborn's set_theme(style="ticks", palette="colorblind",
    context="notebook"), but for seaborn's default colour map, which only seaborn registers."""
    import matplotlib as mpl
    import seaborn as sns

    def settings(apply):
        with mpl.rc_context():
            mpl.rcdefaults()
            apply()
            return dict(mpl.rcParams)

    default = settings(lambda: None)
    seaborn = settings(lambda: sns.set_theme(style="ticks", palette=plotting.PALETTE, context="notebook"))
    ours = settings(plotting.use_style)
    changed = {k for k in seaborn if seaborn[k] != default[k]} - {"image.cmap", "axes.prop_cycle"}
    assert changed and changed == set(plotting.SEABORN_THEME)
    assert {k: ours[k] for k in changed} == {k: seaborn[k] for k in changed}
    colours = [[mpl.colors.to_rgb(c) for c in s["axes.prop_cycle"].by_key()["color"]] for s in (ours, seaborn)]
    assert colours[0] == colours[1]


def test_legibility_reads_width_and_smallest_font(tmp_path, monkeypatch):
    plotting.use_style()
    fig, ax = plt.subplots(figsize=(12, 3))
    ax.plot([1, 10], [1, 100])
    ax.set_yscale("log")  # tick labels 10^k: their exponents are drawn at 70 %, and do not count
    ax.set_title("a title", fontsize=8)
    report = plotting.legibility(_save(fig, tmp_path, monkeypatch))
    assert report["width_in"] > plotting.MAX_WIDTH
    assert report["min_font_pt"] == pytest.approx(8)
    assert any("wide" in p for p in report["problems"])
    assert any("atitle" in p for p in report["problems"])

    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([1, 10], [1, 100])
    ax.set_yscale("log")
    ax.set_title(r"$\|S_1\|_2$ against $\nu$")
    report = plotting.legibility(_save(fig, tmp_path, monkeypatch, "g"))
    assert report["problems"] == [] and report["min_font_pt"] >= plotting.MIN_FONT


def test_save_figure_shows_the_written_png_once_in_a_kernel(tmp_path, monkeypatch):
    """In a kernel the page shows the PNG file itself (drawn as the inline backend draws it: 100 px per
    inch, tight box), then the download links; the figure is closed, so it is not drawn again."""
    import base64

    import pandas as pd
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    from matplotlib_inline.backend_inline import InlineBackend
    from IPython.core.pylabtools import print_figure

    plotting.use_style()
    monkeypatch.setenv("LOWRANK_FIGURE_DIR", str(tmp_path))
    monkeypatch.setattr(InteractiveShell, "_instance", None)
    InteractiveShell.instance()
    try:
        fig, ax = plt.subplots(figsize=(5, 3), layout="constrained")
        ax.plot([0, 1], [0, 1], label="a line")
        ax.set_xlabel("x (units)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1))
        inline = print_figure(fig, "png", **InlineBackend.instance().print_figure_kwargs)
        with capture_output() as shown:
            out = plotting.save_figure(fig, "f", pd.DataFrame({"x": [1]}))
        assert fig.number not in plt.get_fignums()
    finally:
        InteractiveShell.clear_instance()
    image, links = shown.outputs
    assert out is None  # a cell ending in save_figure prints nothing more
    png = (tmp_path / "f.png").read_bytes()
    data = image.data["image/png"]
    assert (base64.b64decode(data) if isinstance(data, str) else data) == png
    assert png[16:24] == inline[16:24], "not the inline backend's pixel size"  # PNG header: width, height
    assert "figure-downloads" in links.data["text/html"] and "f.svg" in links.data["text/html"]


def test_panel_grid_wraps_rows_to_the_column_width():
    fig, axes = plotting.panel_grid(5, panel=(3.0, 2.0))
    assert len(axes) == 5 and len(fig.axes) == 5
    width, height = fig.get_size_inches()
    assert width <= plotting.MAX_WIDTH and width == pytest.approx(9.0) and height == pytest.approx(4.0)
    plt.close(fig)
    fig, axes = plotting.panel_grid(4, panel=(3.0, 2.0), ncols=2)
    assert tuple(fig.get_size_inches()) == pytest.approx((6.0, 4.0))
    plt.close(fig)
    fig, axes = plotting.panel_grid(1, panel=(9.5, 2.0))
    assert len(axes) == 1
    plt.close(fig)
    for bad in ({"n": 0}, {"n": 2.0}, {"n": 2, "panel": (10, 2)}, {"n": 2, "panel": (3, 0)}, {"n": 2, "ncols": 0}):
        with pytest.raises(ValueError):
            plotting.panel_grid(**bad)


def test_legend_below_collects_each_label_once():
    fig, axes = plotting.panel_grid(2, panel=(3.0, 2.0))
    for ax in axes:
        ax.plot([0, 1], [0, 1], label="a")
        ax.plot([0, 1], [1, 0], label="b")
    legend = plotting.legend_below(fig)
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b"]
    assert all(ax.get_legend() is None for ax in axes)
    plt.close(fig)
    fig, ax = plt.subplots(layout="constrained")
    with pytest.raises(ValueError):
        plotting.legend_below(fig)
    plt.close(fig)


def test_count_colours_one_colour_per_whole_number():
    colours = plotting.count_colours([1, 2, 3, 1])
    assert list(colours) == [0, 1, 2, 3] and len(set(colours.values())) == 4
    for bad in ([], [1.5], [-1], [float("nan")]):
        with pytest.raises(ValueError):
            plotting.count_colours(bad)


def test_titles_in_words():
    assert plotting.describe_network("mlp", {"widths": [128]}) == "MLP, 1 hidden layer of 128"
    assert plotting.describe_network("mlp", {"widths": [128, 128]}) == "MLP, 2 hidden layers of 128"
    assert plotting.describe_network("mlp", {"widths": [64, 32]}) == "MLP, hidden layers of 64, 32"
    assert plotting.describe_network("mlp") == "MLP, 2 hidden layers of 256"  # make's default widths
    assert plotting.describe_network("paper_cnn") == "the paper's 6-layer CNN"
    assert plotting.describe_network("paper_cnn", {"channels": [8]}) == "the paper's CNN shape, 3 layers, channels 8"
    assert plotting.describe_network("tree_cnn", {"kernel_size": 2, "channels": 4}) == \
        "tree CNN, kernel = stride = 2, 4 channels"
    assert plotting.describe_task("digits", [1, 2]) == '8x8 digits, "1" vs "2"'
    assert plotting.describe_task("cifar10", list(range(10))) == "CIFAR-10, classes 0-9"
    assert plotting.describe_task("mnist", [0, 3, 5]) == "MNIST, classes 0, 3, 5"
    for bad in (("mlp2", None),):
        with pytest.raises(ValueError):
            plotting.describe_network(*bad)
    for bad in (("svhn", [1, 2]), ("digits", [1])):
        with pytest.raises(ValueError):
            plotting.describe_task(*bad)


def test_a_wide_figure_gets_a_phone_layout_with_its_fonts_and_is_left_as_it_was(tmp_path, monkeypatch):
    """Three panels 9.5 in wide: the phone PNG is at most PHONE_WIDTH inches wide (so 10 pt text shows at
    8 px or more in a 358 px column), taller (panels wrapped), and the figure itself is unchanged."""
    import io

    import numpy as np
    from PIL import Image

    plotting.use_style()
    fig, axes = plt.subplots(1, 3, figsize=(9.5, 3.0), sharey=True)
    for ax in axes:
        ax.plot(np.arange(5), np.arange(5) ** 2)
        ax.set_xlabel("step")
    axes[0].set_ylabel("loss")
    fig.tight_layout()
    before = [ax.get_position().bounds for ax in axes], tuple(fig.get_size_inches())
    phone = plotting.phone_layout(fig)
    assert phone is not None
    w, h = Image.open(io.BytesIO(phone)).size
    assert w <= plotting.PHONE_WIDTH * fig.dpi * 1.08 and h > 1.5 * 3.0 * fig.dpi, (w, h)
    assert 10 * fig.dpi / 72 * 358 / w >= 8  # the smallest text allowed, as a phone shows it
    assert ([ax.get_position().bounds for ax in axes], tuple(fig.get_size_inches())) == before
    assert not axes[1].yaxis.get_tick_params().get("labelleft", True)  # the shared axis' inner labels still hidden
    _save(fig, tmp_path, monkeypatch, stem="wide")
    assert (tmp_path / f"wide{plotting.PHONE_SUFFIX}").read_bytes()[:4] == b"\x89PNG"


def test_the_phone_layout_wraps_a_long_title_and_narrows_the_figure_legend():
    """Two columns of 4.6 in panels become one; the suptitle wraps and the legend below takes two columns
    (a one-row legend of four entries is wider than a phone); the figure keeps its own legend."""
    import io

    import numpy as np
    from PIL import Image

    plotting.use_style()
    fig, axes = plotting.panel_grid(4, panel=(4.6, 2.6), ncols=2)
    for ax in axes:
        for j in range(4):
            ax.plot(np.arange(5), np.arange(5) * (j + 1), label=f"singular value group {j}")
    legend = plotting.legend_below(fig)
    fig.suptitle("Spectrum of $G$: ReLU, MSE loss, n = 2000, d = 1000, m = 1500, alpha = 0.5, ten seeds pooled")
    phone = plotting.phone_layout(fig)
    assert phone is not None and Image.open(io.BytesIO(phone)).size[0] <= plotting.PHONE_WIDTH * fig.dpi * 1.08
    assert fig.legends == [legend] and legend._ncols == 4 and not fig._suptitle.get_wrap()
    plt.close(fig)


def test_no_phone_layout_for_a_narrow_figure_or_a_panel_across_cells(tmp_path, monkeypatch):
    plotting.use_style()
    fig, ax = plt.subplots(figsize=(5.5, 3.0))
    ax.plot([0, 1])
    assert plotting.phone_layout(fig) is None
    fig = plt.figure(figsize=(9.0, 4.0))
    grid = fig.add_gridspec(2, 3)
    fig.add_subplot(grid[:, 0]).plot([0, 1])  # spans both rows: no cell-by-cell reflow
    fig.add_subplot(grid[0, 1]).plot([0, 1])
    assert plotting.phone_layout(fig) is None
    _save(fig, tmp_path, monkeypatch, stem="span")
    assert not (tmp_path / f"span{plotting.PHONE_SUFFIX}").exists()
    plt.close("all")


def test_range_errorbar_draws_min_to_max_and_no_bar_for_identical_values():
    import pandas as pd

    runs = pd.DataFrame({"x": [1, 1, 1, 2, 2, 2], "v": [0.7, 0.7, 0.7, 0.1, 0.4, 0.25]})
    stats = runs.groupby("x")["v"].agg(["mean", "min", "max"])
    assert not stats.loc[1, "min"] <= stats.loc[1, "mean"] <= stats.loc[1, "max"]  # the rounding that made matplotlib refuse the bars
    fig, ax = plt.subplots()
    bars = plotting.range_errorbar(ax, stats.index, stats)
    (identical, spread), = [seg[:, 1] for seg in bars.lines[2][0].get_segments()],
    assert 0 <= identical[1] - identical[0] < 1e-15 and list(spread) == pytest.approx([0.1, 0.4])
    plt.close(fig)
