"""The laptop scale's parameter files, sized from each page's mechanism before training.

A laptop file `params/laptop/<part>/<name>.yaml` holds the smallest sizes at which every claim of the
page reaches its regime: for Part II's rank pages, the run length at which the accumulated weight decay
`A = sum_t mu_t lambda / (1 - beta)` of every slice of the page's statistic (its largest over the
slice's runs with weight decay, `lowrank.sgd.ranks.epochs_to_regime`) reaches Theorem 3.2's need
ln(1/eps) at the page's rank threshold `eps` (`regime_needed`, paper l.1143-1144). Everything else is the notebook's ci defaults (synthetic or bundled data, nothing
downloaded, at least 3 seeds pooled in each statistic). Its estimated training time (`page_seconds`,
from bench/epoch_seconds.csv) must fit `PAGE_BUDGET_S`, and the tier's `TIER_BUDGET_S`.

    python -m lowrank.book.laptop --write [PART/NAME ...]   # (re)write the files from the grids
                                                            # (Part III's: lowrank.square.sizing)
    python -m lowrank.book.laptop --check                   # every file's run length is the computed one

A test runs `check` (tests/test_laptop.py): a laptop file's run length is never typed by hand.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable

import yaml

from lowrank.book import notebooks, rules
from lowrank.book.costs import PAGE_BUDGET_S, TIER_BUDGET_S

__all__ = ["SizedPage", "SIZED_PAGES", "page_grid", "page_seconds", "regime_needed", "regime_epochs", "regime_lengths",
           "laptop_text", "write", "check", "main"]



def _rank_grid(params: dict, *, batch_sizes, lrs, weight_decays) -> list[dict]:
    from lowrank.sgd import ranks

    seeds = list(range(params["seed"], params["seed"] + params["seeds"]))
    return ranks.experiment_grid(batch_sizes=batch_sizes, lrs=lrs, weight_decays=weight_decays,
                                 momenta=[params["momentum"], params["variant_momentum"]], seeds=seeds)


def _rank_groups(name: str, params: dict) -> list:
    """A rank page's training: each batch size's ensemble (every run at that B, trained together)."""
    grid = page_grid(name, params)
    return [(params["model"], params["dataset"], B, sum(g["batch_size"] == B for g in grid), params["epochs"])
            for B in sorted({g["batch_size"] for g in grid})]


@dataclass(frozen=True)
class SizedPage:
    """How a page's grid and slices are read from its parameters (as its training cell builds them)."""
    grid: Callable[[dict], list]  # parameters -> run dicts (batch_size, lr, weight_decay, momentum, seed)
    slices: tuple  # the slices whose regime each verdict needs: one momentum and one statistic slice
    why: str  # in words, for the file's leading comment
    epochs_key: str = "epochs"  # the run-length parameter this sizing sets
    dataset_key: str = "dataset"  # the parameter naming the data set whose training-set size counts the steps
    also: tuple = ()  # further SizedPage(s) of the same page, each setting its own epochs_key (e.g. a second data set)
    groups: Callable[[str, dict], list] | None = None  # (name, params) -> costs.training_seconds groups; default _rank_groups
    eps_key: str = "eps"  # the parameter holding the rank threshold whose regime ln(1/eps) the sizing reaches
    fixed: tuple = ()  # (parameter, value, why) the laptop file sets apart from the run length (the paper's, where ci differs)
    fill: str = ""  # why this run length is stretched to the budget (`FILL_SHARE`): a claim whose clock is read only after training


# A page whose claims have a clock readable only after training (sgd_noise's gap to lambda = 0) runs as long as the
# budget allows, up to the paper's run length: its stretched run lengths share FILL_SHARE of the page budget equally.
# A quarter: the estimate leaves out evaluation, and a claim near its threshold reruns the page (so twice the time).
FILL_SHARE = 0.25


def _noise_grid(p: dict, dataset_key: str = "dataset") -> list[dict]:
    """SGD noise's runs with weight decay: one slice per lambda, each entering the statistics only at
    A >= ln(1/eps) (notebooks/sgd/sgd_noise.md), so every one must reach it. The lambda = 0 runs' clock (their
    d levelling off, gap_to_lambda0's) is read from the trained runs: no length is known for it beforehand."""
    return [{"batch_size": p["batch_size"], "lr": p["lr"], "weight_decay": wd, "momentum": p["momentum"], "seed": p["seed"]}
            for wd in p["weight_decays"] if wd > 0]


def _noise_groups(name: str, params: dict) -> list:
    """SGD noise trains one ensemble of its runs (`noise.page_runs`) per loss, on each data set."""
    from lowrank.sgd import noise

    def members(first):
        return len(noise.page_runs(lr=params["lr"], weight_decays=params["weight_decays"], momentum=params["momentum"],
                                   seed=params["seed"], seed_pair=first))

    return [(params["model"], params[key], params["batch_size"], members(key == "dataset"), params[epochs])
            for key, epochs in (("dataset", "epochs"), ("second_dataset", "second_epochs")) for _ in params["losses"]]


def _architectures_grid(p: dict) -> list[dict]:
    """The MLP and RES-BN sweeps of sgd/architectures (as its grid cell builds them), each run labelled
    with the slice of its statistic: each learning rate's B trend (the two batch-size figures) and each
    batch size's lambda trend (the MLP lambda figure)."""
    from lowrank.sgd import ranks

    seeds = list(range(p["seed"], p["seed"] + p["seeds"]))

    def label(runs, what, key):
        return [{**g, "slice": f"{what} at {key} {g[key]:g}"} for g in runs]

    def grid(batch_sizes, lrs, weight_decays):
        return ranks.experiment_grid(batch_sizes=batch_sizes, lrs=lrs, weight_decays=weight_decays,
                                     momenta=[p["mlp_momentum"]], seeds=seeds)

    return (label(grid(p["mlp_batch_sizes"], p["res_bn_lrs"], [p["mlp_weight_decay"], 0.0]), f"{p['res_bn_model']} B trend", "lr")
            + label(grid(p["mlp_batch_sizes"], p["mlp_lrs"], [p["mlp_weight_decay"], 0.0]), f"{p['mlp_model']} B trend", "lr")
            + label(grid(p["mlp_wd_batch_sizes"], [p["mlp_wd_lr"]], p["mlp_weight_decays"]), f"{p['mlp_model']} λ trend",
                    "batch_size"))


def _architectures_groups(name: str, params: dict) -> list:
    """sgd/architectures trains each network's runs at one batch size together: the MLP and RES-BN sweeps for
    `mlp_epochs`. Its convolutional and transformer sweeps (beyond the budget) are not trained: their planned
    regime is out of reach, so their claims need a larger scale (the page prints the paper sweeps' cost)."""
    runs = _architectures_grid(params)
    groups = []
    for model in (params["res_bn_model"], params["mlp_model"]):
        mine = {tuple(sorted((k, v) for k, v in g.items() if k != "slice")) for g in runs
                if g["slice"].startswith(model + " ")}
        for B in sorted({dict(g)["batch_size"] for g in mine}):
            groups.append((model, params["dataset"], B, sum(dict(g)["batch_size"] == B for g in mine), params["mlp_epochs"]))
    return groups


def _generalization_grid(p: dict) -> list[dict]:
    """sgd/generalization's gen_1 runs (as its grid cell builds them), each labelled with the slice of its statistic:
    each panel's correlation over its batch sizes (the regime of its smallest B), panel (b)'s lambda = 0 control in
    panel (b)'s slice (trained as long). Figure gen_2 is not sized: at laptop scale its planned regime is out of reach,
    so the page does not train it."""
    from lowrank.sgd import ranks

    seeds = list(range(p["seed"], p["seed"] + p["n_seeds"]))
    panels = {"gen₁ (b) and its λ = 0 control": [(p["lr"], p["weight_decay"]), (p["lr"], 0.0)],
              **{f"gen₁ ({key})": [(mu, wd)] for key, mu, wd in zip("ac", p["panel_lrs"], p["panel_weight_decays"])}}
    return [{**g, "slice": what} for what, settings in panels.items() for mu, wd in settings
            for g in ranks.experiment_grid(batch_sizes=p["batch_sizes"], lrs=[mu], weight_decays=[wd],
                                           momenta=[p["momentum"]], seeds=seeds)]


_NOISE_FILL = ("gap_to_lambda0's second clock is read from the trained runs' trends (noise.gap_clock): no length "
               "known before training reaches it, so the run is as long as the budget allows, up to the paper's (l.542)")

SIZED_PAGES = {
    "sgd/rank_vs_weight_decay": SizedPage(
        lambda p: _rank_grid(p, batch_sizes=p["batch_sizes"], lrs=[p["lr"]], weight_decays=p["weight_decays"]),
        ("momentum", "batch_size"), "each batch size's lambda trend (its largest lambda)"),
    "sgd/rank_vs_batch_size": SizedPage(
        lambda p: _rank_grid(p, batch_sizes=p["batch_sizes"], lrs=p["lrs"], weight_decays=[p["weight_decay"], 0.0]),
        ("momentum", "lr"), "each learning rate's B trend (its smallest B)"),
    "sgd/rank_vs_learning_rate": SizedPage(
        lambda p: _rank_grid(p, batch_sizes=p["batch_sizes"], lrs=p["lrs"], weight_decays=[p["weight_decay"], 0.0]),
        ("momentum", "batch_size"), "each batch size's mu trend (its largest mu)"),
    "sgd/sgd_noise": SizedPage(
        _noise_grid, ("weight_decay",), "every lambda > 0 run on the first data set (its smallest lambda)",
        fill=_NOISE_FILL,
        also=(SizedPage(_noise_grid, ("weight_decay",), "every lambda > 0 run on the second data set",
                        epochs_key="second_epochs", dataset_key="second_dataset", fill=_NOISE_FILL),),
        groups=_noise_groups),
    "sgd/architectures": SizedPage(
        _architectures_grid, ("slice",), "each MLP and RES-BN trend (its largest lambda, or its smallest B)",
        epochs_key="mlp_epochs", eps_key="mlp_eps", groups=_architectures_groups,
        fixed=(("mlp_weight_decays", [0.0, 1e-4, 2e-4, 4e-4, 8e-4, 6e-3],
                "the MLP lambda figure's grid (paper l.549, l.1523); the ci grid is ten times the paper's, and at its largest "
                "lambda (the largest per-step decay mu lambda / (1 - beta) of the page) every run collapses and is left out"),)),
    "sgd/generalization": SizedPage(
        _generalization_grid, ("slice",), "each gen₁ panel's batch sizes (its smallest B)",
        fixed=(("milestones", [60, 100, 200],
                "the paper's learning-rate decays (l.1290); the ci file decays after epoch 10 so that its short runs fit"),)),
}


def _sized(name: str) -> SizedPage:
    if name not in SIZED_PAGES:
        raise ValueError(f"{name}: no sizing rule (pages sized from their mechanism: {', '.join(SIZED_PAGES)})")
    return SIZED_PAGES[name]


def page_grid(name: str, params: dict) -> list[dict]:
    """The run dicts page `name` trains with `params`."""
    return _sized(name).grid(params)


def page_seconds(name: str, params: dict, device: str = "cpu", timings: dict | None = None) -> float | None:
    """The training seconds of a sized page at `params`: each batch size's ensemble (every run of the
    page at that batch size, trained together as the page trains them) for `params["epochs"]`, from
    `lowrank.book.costs`' measurements; None when a group is not measured."""
    from lowrank.book import costs

    page = _sized(name)
    groups = (page.groups or _rank_groups)(name, params)
    return costs.training_seconds(groups, device, timings)[0]


def _n_train(dataset: str) -> int:
    from lowrank.core import datasets

    if dataset in ("mnist", "cifar10"):
        raise ValueError(f"the laptop scale downloads nothing: {dataset} is a paper-scale data set")
    return int(datasets.load(dataset).x_train.shape[0])


def regime_needed(params: dict, eps_key: str = "eps") -> float:
    """The accumulated weight decay a sized page's claims need: `lowrank.sgd.ranks.regime_from_bound`
    at the page's rank threshold `params[eps_key]` (ln(1/eps), paper l.1143-1144), as its verdicts judge it."""
    from lowrank.sgd import ranks

    return ranks.regime_from_bound(params[eps_key])


def _stages(name: str) -> list[SizedPage]:
    page = _sized(name)
    return [page, *page.also]


def _stage_epochs(name: str, page: SizedPage, params: dict):
    from lowrank.sgd import ranks

    table = ranks.epochs_to_regime(page.grid(params), n_train=_n_train(params[page.dataset_key]),
                                   target=regime_needed(params, page.eps_key), slices=list(page.slices),
                                   milestones=params.get("milestones", ()), lr_decay=params.get("lr_decay", 0.1))
    if not table["reachable"].all():
        raise ValueError(f"{name}: a slice has no run with weight decay, so no run length reaches the regime")
    return int(table["epochs"].max()), table


def regime_epochs(name: str, params: dict):
    """(epochs, table): the smallest run length at which every slice of page `name` with `params`
    reaches `regime_needed(params)`, and `lowrank.sgd.ranks.epochs_to_regime`'s table per slice.
    A slice without weight decay cannot reach it: ValueError. (The page's first run length; a page with
    several, e.g. a second data set, has them all in `regime_lengths`.)"""
    return _stage_epochs(name, _sized(name), params)


def regime_lengths(name: str, params: dict) -> dict:
    """Every run length page `name` sets: {epochs_key: (epochs, table)}, one per sizing of `_stages`."""
    return {page.epochs_key: _stage_epochs(name, page, params) for page in _stages(name)}


def filled_lengths(name: str, sized: dict, timings: dict | None = None) -> dict:
    """`{epochs_key: run length}` of the stages of page `name` marked `fill`, at the sized parameters `sized`: the
    longest each can run within an equal share of `FILL_SHARE * PAGE_BUDGET_S` (its groups' measured seconds per
    epoch, `page_seconds` with that stage's run length 1 and the others 0), at most the paper file's run length and
    at least the regime's (`sized`). ValueError when a stage's groups are not measured."""
    stages = [page for page in _stages(name) if page.fill]
    if not stages:
        return {}
    paper = rules.resolve_parameters(name, scale="paper", memory=False)
    keys = [page.epochs_key for page in _stages(name)]
    out = {}
    for page in stages:
        unit = page_seconds(name, {**sized, **{k: int(k == page.epochs_key) for k in keys}}, timings=timings)
        if unit is None:
            raise ValueError(f"{name}: {page.epochs_key} is stretched to the budget, but its training is not measured "
                             "(python bench/epoch_seconds.py --pages)")
        fits = int(FILL_SHARE * PAGE_BUDGET_S / len(stages) / unit)
        out[page.epochs_key] = max(sized[page.epochs_key], min(int(paper[page.epochs_key]), fits))
    return out


def _sized_run(name: str) -> tuple[dict, object, float | None]:
    """(the laptop parameters, the per-slice table, the estimated training seconds) of page `name`:
    its ci defaults with the run length `regime_epochs` computes (stretched to the budget where marked `fill`)."""
    params = {**rules.resolve_parameters(name, scale="ci", memory=False), **{k: v for k, v, _ in _sized(name).fixed}}
    lengths = regime_lengths(name, params)
    sized = {**params, **{key: e for key, (e, _) in lengths.items()}, "scale": "laptop"}
    sized |= filled_lengths(name, sized)
    return sized, {key: t for key, (_, t) in lengths.items()}, page_seconds(name, sized)


def sized_lengths(name: str) -> dict:
    """`{epochs_key: run length}` the laptop file of sized page `name` holds (`_sized_run`)."""
    sized = _sized_run(name)[0]
    return {page.epochs_key: sized[page.epochs_key] for page in _stages(name)}


def _slice_text(key: str, value) -> str:
    return value if key == "slice" else f"{key} {value:g}"


def laptop_text(name: str) -> str:
    """The laptop file of `name`: a leading comment (how its run length was computed, per slice, and
    its estimated training time), `scale: laptop`, and `epochs`."""
    from lowrank.book import costs

    sized, tables, seconds = _sized_run(name)
    lines = ["# Laptop scale, sized from the mechanism before training (python -m lowrank.book.laptop --write; never by hand):"]
    for page in _stages(name):
        per_slice = ", ".join(f"{' '.join(_slice_text(k, row[k]) for k in page.slices)}: {int(row['epochs'])}"
                              for _, row in tables[page.epochs_key].iterrows())
        lines += [f"# {page.epochs_key}: the run length at which the accumulated weight decay A = sum_t mu_t lambda / (1 - beta) "
                  f"of {page.why} ({sized[page.dataset_key]})",
                  f"# reaches ln(1/eps) = {regime_needed(sized, page.eps_key):.3g} (eps {sized[page.eps_key]:g}; Theorem 3.2's bound, paper l.1143-1144). "
                  f"Epochs per slice: {per_slice}."]
        if page.fill:
            share = FILL_SHARE * PAGE_BUDGET_S / sum(bool(p.fill) for p in _stages(name))
            lines += [f"# {page.epochs_key} stretched to {sized[page.epochs_key]}: {page.fill}; the longest whose estimated "
                      f"training fits {share:.0f} s (a {FILL_SHARE:g} share of the page budget, split over the stretched "
                      f"run lengths), at most the paper file's."]
    count = sized.get("seeds", sized.get("n_seeds"))  # the rank pages' `seeds`, generalization's `n_seeds`
    seeds = f"{count} seeds pooled" if count else f"seed {sized['seed']}"
    models = sized["model"] if "model" in sized else f"{sized['mlp_model']} and {sized['res_bn_model']}"
    lines += [f"# The ci defaults otherwise ({models} on {sized['dataset']}, {seeds}). "
              f"Estimated training: {costs.format_seconds(seconds)} (bench/epoch_seconds.csv; page budget {PAGE_BUDGET_S:.0f} s).",
              "scale: laptop", *(f"{page.epochs_key}: {sized[page.epochs_key]}" for page in _stages(name))]
    for key, value, why in _sized(name).fixed:
        flow = yaml.safe_dump(value, default_flow_style=True).removesuffix("...\n").strip()  # a scalar's end-of-document marker
        lines += [f"# {key}: {why}", f"{key}: {flow}"]
    return "\n".join(lines) + "\n"


def write(names=None) -> list[str]:
    """(Re)write the laptop files of `names` (default every sized page); returns those that changed.
    A page whose estimated training exceeds `PAGE_BUDGET_S`, or pages whose sum exceeds `TIER_BUDGET_S`,
    are refused (ValueError) before any file is written: they need a larger scale."""
    from lowrank.square import sizing as square_sizing  # Part III's pages are sized by their own rule

    names = list(names or [*SIZED_PAGES, *square_sizing.SIZED_PAGES])
    texts, total = {}, 0.0
    for name in names:
        if name in square_sizing.SIZED_PAGES:
            texts[name], seconds = square_sizing.laptop_text(name, rules.resolve_parameters(name, scale="ci", memory=False),
                                                             PAGE_BUDGET_S)
            if seconds > PAGE_BUDGET_S:
                raise ValueError(f"{name}: estimated at {seconds:.0f} s of training, over the laptop budget of "
                                 f"{PAGE_BUDGET_S:.0f} s: it needs a larger scale")
            total += seconds
            continue
        sized, _, seconds = _sized_run(name)
        if seconds is not None and seconds > PAGE_BUDGET_S:
            raise ValueError(f"{name}: {sized['epochs']} epochs are estimated at {seconds:.0f} s of training, over the "
                             f"laptop budget of {PAGE_BUDGET_S:.0f} s: it needs a larger scale")
        total += seconds or 0.0
        texts[name] = laptop_text(name)
    if total > TIER_BUDGET_S:
        raise ValueError(f"the laptop pages are estimated at {total:.0f} s of training, over the tier's {TIER_BUDGET_S:.0f} s")
    changed = []
    for name, text in texts.items():
        path = notebooks.scale_params_path(name, "laptop")
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(name)
    return changed


def check() -> list[str]:
    """Mismatches between the laptop files and what the sizing computes: a sized page without a file,
    a file whose `epochs` differs from `regime_epochs`, a file of a page with no sizing rule."""
    problems = []
    root = notebooks.SOURCE_ROOT / "params" / "laptop"
    files = {p.relative_to(root).with_suffix("").as_posix() for p in root.glob("*/*.yaml")}
    from lowrank.square import sizing as square_sizing  # Part III's pages are sized by their own rule

    for name in sorted(files - set(SIZED_PAGES) - set(square_sizing.SIZED_PAGES)):
        problems.append(f"{name}: a laptop file without a sizing rule in lowrank.book.laptop.SIZED_PAGES")
    for name in [*SIZED_PAGES, *square_sizing.SIZED_PAGES]:
        if name not in files:
            problems.append(f"{name}: no laptop file (python -m lowrank.book.laptop --write {name})")
            continue
        stored = rules.load_yaml_mapping(notebooks.scale_params_path(name, "laptop"))
        if name in square_sizing.SIZED_PAGES:
            want = square_sizing.sized_settings(name, rules.resolve_parameters(name, scale="ci", memory=False))["set"]
        else:
            want = sized_lengths(name)
        for key, length in want.items():
            if stored.get(key) != length:
                problems.append(f"{name}: {key} {stored.get(key)} in the laptop file, {length} computed from its grid")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", nargs="*", metavar="PART/NAME", help="write the laptop files (default: every sized page)")
    mode.add_argument("--check", action="store_true", help="compare every laptop file with the computed run length")
    args = ap.parse_args(argv)
    if args.check:
        problems = check()
        print("\n".join(problems) or f"the laptop files match their computed run lengths")
        from lowrank.book import sweeps

        for name in sweeps.PAGE_SWEEPS:
            print(f"{name}: {sweeps.larger_scale_text(name)}")
        return 1 if problems else 0
    for name in write(args.write or None):
        print(f"wrote {notebooks.scale_params_path(name, 'laptop')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
