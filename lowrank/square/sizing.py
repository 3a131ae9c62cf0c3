"""Laptop sizes of the Part III pages, computed from each mechanism's time scale before training.

A page's laptop file (`params/laptop/square/<page>.yaml`, `lowrank.book.laptop`'s tier) holds the run length at
which every claim of the page reaches its regime, from a bound that holds whatever the margins do:

- rho's relaxation towards `mu / (M + lam)` contracts by `|1 - 2 eta (M + lam)|` per step. That factor is at
  most `1 - 2 eta lam`, i.e. at least `-log(1 - 2 eta lam)` e-foldings per step
  (`timescales.relaxation_rate(0, lam, eta)`), for every `0 <= M <= 1/eta - 2 lam` (`relaxation_bound_holds`);
  above that the step overshoots and the bound fails (at `M >= 1/eta - lam` rho does not relax at all). So
  `needed / rate` steps reach `needed` e-foldings in every run whose margins stay in that range, however little
  the network learns. The sizing checks the range before training with an a-priori bound on `M`
  (`margin_bound`: a bias-free ReLU MLP with unit-Frobenius layers has `|f_V(x)| <= ||x|| <= 1`, so `M <= 1`)
  at the largest step the schedule takes, and refuses to size when it does not hold;
- weight decay: `steps * eta * lam` (`timescales.accumulated_weight_decay`) against the page's need.

The estimated training time comes from a per-epoch time measured on this machine when the file is written
(`measure_epoch_seconds`: the page's network trained for a few epochs; `measure_log_seconds`: one more logged state),
times the page's runs, epochs and logged states. Both are wall times: measured while other processes load the cores
(two torch threads oversubscribed), they overstate a quiet machine's several times over. A page whose estimate exceeds `lowrank.book.costs.PAGE_BUDGET_S` is not written: its laptop column reads
"needs a larger scale" with that estimate. `lowrank.book.laptop` writes and checks the files:

    python -m lowrank.book.laptop --write [square/NAME ...]
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lowrank.square import timescales

__all__ = ["relaxation_bound_holds", "margin_bound", "epochs_to_relax", "epochs_to_weight_decay", "page_setup_of", "Arm",
           "SizedSquarePage", "SIZED_PAGES", "rho_dynamics_size", "quasi_interpolation_size", "low_rank_sgd_size",
           "neural_collapse_size", "LOW_RANK_SGD_PAGE", "NEURAL_COLLAPSE_PAGE", "RANDOM_LABELS_FIXED", "random_labels_size",
           "disjoint_patch_margin_bound", "RADEMACHER_BOUNDS_FIXED", "rademacher_bounds_size", "rademacher_epoch_seconds",
           "measure_epoch_seconds", "measure_log_seconds", "with_fixed", "sized_settings", "laptop_text", "NC_FIT_PROBE",
           "fit_probe_summary"]


def relaxation_bound_holds(M: float, *, lam: float, rho_lr: float) -> bool:
    """Whether rho's contraction factor at `M`, `|1 - 2 rho_lr (M + lam)|`, is at most the one at `M = 0`,
    `1 - 2 rho_lr lam`: true exactly for `0 <= M <= 1 / rho_lr - 2 lam` (the factor at M = 0 below 1)."""
    M, lam, eta = float(M), float(lam), float(rho_lr)
    if not (eta > 0 and lam >= 0 and M >= 0):
        raise ValueError(f"need rho_lr > 0, lam >= 0, M >= 0; got {rho_lr!r}, {lam!r}, {M!r}")
    return M <= 1.0 / eta - 2.0 * lam


def margin_bound(arch: str, max_input_norm: float = 1.0) -> float:
    """An upper bound on `M = mean ||f_V(x_n)||^2` that holds before training: for a bias-free ReLU MLP with
    unit-Frobenius layers, `||f_V(x)|| <= prod ||V_k||_op ||x|| <= prod ||V_k||_F ||x|| = ||x||` (ReLU is
    1-Lipschitz with sigma(0) = 0), so `M <= max ||x_n||^2` (1 for the pages' inputs, scaled to `||x_n|| <= 1`).
    ValueError for conv nets: a unit-norm filter's operator norm can exceed 1, so no such bound is claimed."""
    if arch != "mlp":
        raise ValueError(f"no a-priori bound on M for arch {arch!r} (a unit-norm conv filter can have operator norm "
                         "above 1): size its run length by another route")
    return float(max_input_norm) ** 2


def epochs_to_relax(needed: float, *, lam: float, rho_lr: float, steps_per_epoch: int,
                    M_max: float | None = None, max_rho_lr: float | None = None) -> int:
    """The fewest epochs after which rho's distance to `mu / (M + lam)` has fallen by `needed` e-foldings for any
    margins with `0 <= M <= 1/eta - 2 lam` (`relaxation_bound_holds`):
    `ceil(needed / (steps_per_epoch * relaxation_rate(0, lam, rho_lr)))`, `rho_lr` the smallest step taken.
    With `M_max` (a bound on M over the run, e.g. `margin_bound`) the condition is checked at the largest step
    `max_rho_lr` (default `rho_lr`) and a ValueError says where it fails. ValueError for `lam = 0` (no bound
    without weight decay)."""
    if M_max is not None and not relaxation_bound_holds(M_max, lam=lam, rho_lr=max_rho_lr or rho_lr):
        eta = max_rho_lr or rho_lr
        raise ValueError(f"the relaxation bound needs M <= 1/eta - 2 lam = {1 / eta - 2 * lam:.4g} at the largest "
                         f"step eta = {eta:g}; the margins may reach M = {M_max:g}")
    if not needed > 0:
        return 0
    rate = timescales.relaxation_rate(0.0, lam, rho_lr)
    if rate == 0:
        raise ValueError("without weight decay (lam = 0) the relaxation has no bound independent of M")
    return math.ceil(needed / (steps_per_epoch * rate) - 1e-12)


def epochs_to_weight_decay(needed: float, *, lam: float, rho_lr: float, steps_per_epoch: int) -> int:
    """The fewest epochs with `epochs * steps_per_epoch * rho_lr * lam >= needed` (ValueError for `lam = 0`)."""
    if not needed > 0:
        return 0
    if not lam * rho_lr > 0:
        raise ValueError("without weight decay no run length reaches a weight-decay time")
    return math.ceil(needed / (steps_per_epoch * rho_lr * lam) - 1e-12)


def page_setup_of(params: dict):
    """The `lowrank.square.pages.PageSetup` of a Part III page from its parameters (every page names its task and
    training options alike; `num_samples` and `num_outputs` only where the page has them)."""
    from lowrank.square import pages

    p = params
    optional = {k: p[k] for k in ("num_samples", "num_outputs") if k in p}
    return pages.page_setup(p["dataset"], p["classes"], arch=p["arch"], arch_kwargs=p["arch_kwargs"],
                            data_root=p["data_root"], max_train=p["max_train"], max_test=p["max_test"],
                            input_shape=p["input_shape"], seed=p["seed"], epochs=p["epochs"], lr=p["lr"],
                            batch_size=p["batch_size"], momentum=p["momentum"], schedule=p["schedule"],
                            min_lr=p.get("min_lr", 0.0), log_every=p.get("log_every", p["epochs"]), nc=False, dtype=p["dtype"],
                            **optional)


@dataclass(frozen=True)
class Arm:
    """One set of runs of a page that share a run length: `runs` runs of `epochs_key` epochs, each costing what one
    run trained with `train` (keyword overrides of `PageSetup.train`: lam, rho_lr, batch_size, lr, ...) costs per
    epoch here. `setup`: page parameters the measured run differs in from the page's (e.g. `classes` where a page
    names its tasks otherwise). `logs`: the states each run logs beyond its start and end (its history rows; with
    `track_layers` each ranks every layer), each costing what one more logged state costs here (`measure_log_seconds`)."""
    epochs_key: str
    runs: int
    train: dict
    setup: dict = field(default_factory=dict)
    logs: int = 0


@dataclass(frozen=True)
class SizedSquarePage:
    """How a Part III page is sized: `size(params)` (its ci defaults with `fixed`) returns
    {"set": {parameter: value} (the run lengths it computes, and what follows from them, e.g. log_every),
    "per_need": [(epochs_key, what, epochs)] (each clock's run length, in words; a run length is its clocks'
    largest), "arms": [Arm], optionally "notes": [line] (what the sizing read besides the clocks, for the
    header)}; `fixed` holds {parameter: (value, why)} the laptop file sets apart from the run lengths (the paper's,
    where ci differs); `header` the file's opening lines: what the page mirrors here and how that differs from the paper."""
    size: Callable[[dict], dict]
    fixed: dict
    header: tuple
    measure: Callable | None = None  # (params, arm) -> seconds per epoch; None: measure_epoch_seconds


RHO_DYNAMICS_FIXED = {
    "rho_lr_variant": (0.0, "no variant: the verdicts use the paper's single step size (rho_lr = lr, Eq. 6 with one "
                            "eta); the ci variant only lets rho follow the tiny margins within the ci budget"),
    "lams": ([0.001, 0.0], "Fig. 3 (l.1044): WD lambda = 0.001 and lambda = 0"),
    "lr": (0.03, "Fig. 3 (l.1044): initial learning rate 0.03, one step size for rho and the V_k"),
    "schedule": ("cosine", "Fig. 3 (l.1044): cosine annealing"),
    "min_lr": (0.0299, "Fig. 3 (l.1044): ending with 0.0299"),
}
# Not the paper's, and why: full-batch gradient descent on digits 1 vs 2 (the paper: SGD with minibatches of 128 on
# CIFAR-10, a GPU), so Lemma 4's rho_dot is the flow's; the one-hidden-layer MLP of ci; the ci initial rho 1 and 30.


def rho_dynamics_size(params: dict) -> dict:
    """The laptop run length of square/rho_dynamics at `params` (its ci defaults): the largest of
    - `init_dependence_wd`'s weight-decay time, `steps * eta * lam >= 1/2` (one e-folding of rho under the penalty);
    - each initialisation's relaxation to its own need, `log(|rho_0 / rho_eq,0 - 1| / t)` e-foldings, `t` the
      tolerance tied to the claim's threshold, `timescales.spread_relaxation_tolerance(spread_share_max,
      log(max rho_inits / min rho_inits))`, bounded for every `M <= 1/eta - 2 lam` by the weight-decay part of the
      rate (`epochs_to_relax`; the range is checked at the largest step with `margin_bound`, M <= 1 for the MLP).
      The need uses the equilibrium of the untrained margins, the only one known before training; the page reads
      the need of each run from its trajectory (`timescales.initial_distance(need_from="final")`) and says "needs
      a larger scale" if the run length sized here falls short of it.
    The control's runs (lambda = 0) relax at the rate 2 eta M, which has no bound before training (M of an
    untrained network is tiny): they are not sized here; the page reads their relaxation from the logged M
    (`timescales.init_dependence_regimes`) and says "needs a larger scale" when it falls short. Nor is any run's
    tracking lag behind its moving equilibrium (the drift of rho_eq at the end, known only from the trajectory;
    `timescales.equilibrium_tracking_regime`), read on the page to the same tolerance.
    Returns {"epochs", "log_every", "per_need": [(what, epochs)], "runs"}, eta the paper's single step size at its
    smallest over the schedule."""
    lam = max(params["lams"])
    # the smallest step the schedule takes (the cosine ends at min_lr): the rate at M = 0 bounds every step's from
    # below, provided M <= 1/eta - 2 lam at the largest step (checked with the a-priori margin bound, M <= 1)
    eta = params["rho_lr"] or (min(params["lr"], params["min_lr"]) if params["schedule"] == "cosine" else params["lr"])
    eta_max = params["rho_lr"] or (max(params["lr"], params["min_lr"]) if params["schedule"] == "cosine" else params["lr"])
    M_max = margin_bound(params["arch"])
    S = page_setup_of(params)
    spe = S.steps(1)
    per_need = [("epochs", "weight-decay time steps × η × λ ≥ 1/2", epochs_to_weight_decay(0.5, lam=lam, rho_lr=eta,
                                                                                  steps_per_epoch=spe))]
    tolerance = timescales.spread_relaxation_tolerance(params["spread_share_max"],
                                                       timescales.log_spread(params["rho_inits"]))
    for r0 in params["rho_inits"]:
        row = S.initial_row(rho_init=r0, seed=params["seed"], lam=lam)
        need = timescales.relaxations_needed(abs(row["rho_over_rho_eq"] - 1), tolerance)
        per_need.append(("epochs", f"relaxation of ρ₀ = {r0:g} ({need:.3g} e-foldings)",
                         epochs_to_relax(need, lam=lam, rho_lr=eta, steps_per_epoch=spe, M_max=M_max,
                                         max_rho_lr=eta_max)))
    epochs = max(e for _, _, e in per_need)
    log_every = max(1, epochs // 200)
    arm = Arm("epochs", len(params["lams"]) * len(params["rho_inits"]),
              {"rho_init": params["rho_inits"][0], "lam": lam, "rho_lr": params["rho_lr"] or params["lr"]},
              logs=epochs // log_every)
    return {"set": {"epochs": epochs, "log_every": log_every}, "per_need": per_need, "arms": [arm]}

QUASI_INTERPOLATION_FIXED = {
    "lams": ([0.0, 0.001], "Figs. 8 and 10 (l.1049, l.1051): WD lambda = 0.001 and lambda = 0"),
    "lr": (0.03, "Fig. 8 (l.1049): initial learning rate 0.03"),
    "rho_lr": (0.0, "the paper's single step size (Eq. 6 with one eta): rho steps with lr; ci's 10 only lets rho "
                    "follow the tiny margins within the ci budget"),
    "schedule": ("cosine", "Fig. 3 (l.1044), the schedule of the paper's runs (Fig. 8, l.1049, names the initial rate)"),
    "min_lr": (0.0299, "Fig. 3 (l.1044): ending with 0.0299"),
    "batch_size": (128, "Fig. 10 (l.1051): SGD with minibatches of 128 (288 digits, 3 steps per epoch)"),
    "rho_init": (0.81, "Fig. 8 (l.1049): initialisation 0.9 per layer, rho = 0.9^2 for the ci MLP's two layers"),
    "pool_seeds": ([1, 2], "three initialisations pooled (issue 43 item 5); Fig. 10 (l.1051) pools 10 runs of "
                           "different initialisations"),
}
# Not the paper's, and why: digits 1 vs 2 and the ci one-hidden-layer MLP with one output (the paper: CIFAR-10, the
# 6-layer CNN with two outputs, a GPU); the three initialisations differ in the network's seed, not in scale.


def quasi_interpolation_size(params: dict) -> dict:
    """The laptop run length of square/quasi_interpolation at `params` (its ci defaults with the fixed settings):
    the weight-decay claims' regime (`wd_regime` on the page), `steps * eta * lam >= wd_times_needed` at
    `histogram_lam`, eta the smallest step of the schedule (the page counts the initial one, so it reads at least
    the need). `interpolation_no_wd` (lambda = 0) relaxes at 2 eta M, which has no bound before training: the page
    reads it per run from the logged M and says "needs a larger scale" when it falls short. The margin histograms
    are kept at ci's epochs below the run length and at its last epoch (where the statistics are read).
    Returns {"set", "per_need", "arms"}: one arm of (1 + len(pool_seeds)) x (len(lams) + 1 shuffled-label) runs."""
    lam = params["histogram_lam"]
    eta = params["rho_lr"] or (min(params["lr"], params["min_lr"]) if params["schedule"] == "cosine" else params["lr"])
    spe = page_setup_of(params).steps(1)
    epochs = epochs_to_weight_decay(params["wd_times_needed"], lam=lam, rho_lr=eta, steps_per_epoch=spe)
    per_need = [("epochs", f"weight-decay time steps × η × λ ≥ {params['wd_times_needed']:g} (λ = {lam:g}, "
                           f"η = {eta:g}, {spe} steps per epoch)", epochs)]
    margin_epochs = [e for e in params["margin_epochs"] if e < epochs] + [epochs]
    runs = (1 + len(params["pool_seeds"])) * (len(params["lams"]) + 1)
    log_every = max(1, epochs // 200)
    arm = Arm("epochs", runs, {"rho_init": params["rho_init"], "lam": lam, "rho_lr": params["rho_lr"] or params["lr"]},
              logs=epochs // log_every + len(margin_epochs))
    return {"set": {"epochs": epochs, "log_every": log_every, "margin_epochs": margin_epochs},
            "per_need": per_need, "arms": [arm]}


RANDOM_LABELS_FIXED = {
    "lam": (0.001, "Fig. 4 (l.1045): WD of 0.001 (ci: 1e-4)"),
    "rho_lr": (0.0, "one step size for rho and the V_k (l.639-642, l.759: one eta); ci inflates rho's to 10"),
    "regression_rho_lr": (0.0, "one step size for rho and the V_k (l.639-642, l.759); ci inflates rho's to 1"),
    "lr": (0.1, "not the paper's 0.03 (Fig. 3, l.1044; Figs. 4-5, l.1045-1046, state none): with one step size a "
                "weight-decay time 1/(eta lambda) at 0.03 is 33,334 epochs per figure, 3.3 times this file's, over the "
                "600 s budget; 0.1 is ci's Fig. 5 step"),
    "regression_seeds": ([0, 1, 2], "3 seeds per initialisation scale pooled in each per-scale mean (issue 43; the paper: "
                                    "10 runs, l.1046)"),
}
# Not the paper's, and why: ci's task and network (MNIST-1D 3 vs 5, 100 training samples, a one-hidden-layer MLP of
# width 256, full-batch gradient descent; the paper: CIFAR-10 classes 1 and 2, the 6-layer CNN, SGD, a GPU); 3 seeds
# per point (the paper: 10); a constant step (Figs. 4-5 state no schedule; Fig. 3's cosine, l.1044, moves it 0.3 %).


def random_labels_size(params: dict) -> dict:
    """The laptop run lengths of square/random_labels at `params` (its ci defaults with `RANDOM_LABELS_FIXED`): each
    figure's runs with weight decay last `wd_times_needed` weight-decay times, `steps * eta * lam >= wd_times_needed`
    (the page's own regime, `timescales.weight_decay_regime`, computed before training), eta rho's step (`rho_lr`, 0:
    the single step `lr`), at its smallest if the schedule is cosine:
    - `epochs`: Fig. 4's random-label runs at `lam`;
    - `regression_epochs`: Fig. 5's initialisation-scale runs at `regression_lam`.
    With a constant step the weight decay accumulates at the same rate in every run, whatever it learns, so the regime
    computed here is the one each run has. The lambda = 0 runs (each figure's control) have no weight-decay clock;
    they run as long as their figure's runs with weight decay."""
    S = page_setup_of(params)
    spe = S.steps(1)

    def smallest_step(lr, rho_lr):  # rho's step is the schedule's times rho_lr / lr (training.SquareConfig)
        return (rho_lr or lr) * (params["min_lr"] / lr if params["schedule"] == "cosine" else 1.0)

    need = params["wd_times_needed"]
    per_need, arms = [], []
    for key, fig, lam, lr, rho_lr, runs in (
            ("epochs", "Fig. 4", params["lam"], params["lr"], params["rho_lr"],
             2 * len(params["random_fractions"]) * len(params["fraction_seeds"])),
            ("regression_epochs", "Fig. 5", params["regression_lam"], params["regression_lr"], params["regression_rho_lr"],
             (len(params["regression_scales_wd"]) + len(params["regression_scales_no_wd"])) * len(params["regression_seeds"]))):
        eta = smallest_step(lr, rho_lr)
        per_need.append((key, f"{fig}: weight-decay time steps × η × λ ≥ {need:g} (η = {eta:g}, λ = {lam:g})",
                         epochs_to_weight_decay(need, lam=lam, rho_lr=eta, steps_per_epoch=spe)))
        arms.append(Arm(key, runs, {"lam": lam, "lr": lr, "rho_lr": rho_lr or lr}))
    return {"set": {key: e for key, _, e in per_need}, "per_need": per_need, "arms": arms}


def disjoint_patch_margin_bound(model, x) -> float:
    """An upper bound on `M = mean ||f_V(x_n)||^2` of a `lowrank.core.nets.normalized.NormalizedNet` over inputs
    `x`, before training, for nets whose every layer is dense or a convolution over disjoint patches (stride >= kernel,
    no padding: the tree CNN of Theorem 4): such a conv layer's matrix is block diagonal with copies of the filter
    (C_out x C_in k^dim), so its operator norm is the filter's, at most its Frobenius norm g_k. With ReLU
    1-Lipschitz, sigma(0) = 0, and a unit-norm last layer, `||f_V(x)|| <= prod g_k ||x||`, so
    `M <= prod g_k^2 max ||x_n||^2`. ValueError for overlapping or padded convolutions (a unit-norm filter applied to
    overlapping patches can have operator norm above 1: `margin_bound`'s reason) and a free last layer."""
    import torch

    if not model.normalize_last:
        raise ValueError("a free (not normalised) last layer has no a-priori norm: no bound on M")
    for layer in model.body:
        if layer.kind != "linear" and (layer.padding != 0 or layer.stride < layer.kernel_size):
            raise ValueError(f"a {layer.kind} layer with kernel {layer.kernel_size}, stride {layer.stride}, padding "
                             f"{layer.padding} has overlapping or padded patches: no a-priori bound on M")
    gains = math.prod(float(layer.g) for layer in model.body)
    x = torch.as_tensor(x).double().flatten(1)
    return gains**2 * float((x**2).sum(1).max())


RADEMACHER_BOUNDS_FIXED = {
    "lam": (0.001, "Figs. 6-7 (l.1047-1048): WD lambda = 0.001 (ci: 1e-4)"),
    "init_scale": (0.1, "Figs. 6-7 (l.1047-1048): initialisation scale 0.1, rho_0 = 0.1^L (ci: rho_0 = 100)"),
    "rho_lr": (0.5, "not one step size (l.639-642): the tree CNN's runs train one at a time, and at ci's step 0.1 for "
                    "both rho relaxes over 11,513 epochs per run, over the 600 s budget; ci's variant (rho's own step) "
                    "kept at 0.5, not ci's 10, so that the relaxation bound holds for every M <= max ||x||^2 = 1 "
                    "(M <= 1/eta - 2 lambda); the V_k keep ci's 0.1 and constant step (the paper: 0.03 annealed, l.1047)"),
}
# Not the paper's, and why: digits 1 vs 2 as 64-vectors and ci's networks (the paper: CIFAR-10, the 6-layer CNN and a
# 2-D tree, a GPU); full-batch gradient descent without momentum (the paper: SGD with momentum 0.9, batch 32 for Fig. 7)
# because the clock below is plain gradient descent's contraction (Eq. 6), which momentum changes.


def _rademacher_runs(params: dict):
    """The runs of square/rademacher_bounds, as its training cell sets them up: (label, N, PageSetup, rho_0, data)
    for each N and network, and the tree CNN's random-label control at each N (data None: the page's labels)."""
    from lowrank.core import datasets
    from lowrank.square import pages

    p = params
    nets = {"tree CNN": ("tree_cnn", p["tree_kwargs"], p["tree_shape"]),
            "dense": (p["dense_arch"], p["dense_kwargs"], p["dense_shape"])}
    for n in p["train_sizes"]:
        for label, (arch, kwargs, shape) in nets.items():
            S = pages.page_setup(p["dataset"], p["classes"], arch=arch, arch_kwargs=kwargs, data_root=p["data_root"],
                                 max_train=n, max_test=p["max_test"], input_shape=shape, seed=p["seed"],
                                 epochs=p["epochs"], lr=p["lr"], rho_lr=p["rho_lr"], batch_size=p["batch_size"],
                                 momentum=p["momentum"], schedule=p["schedule"], nc=False, dtype=p["dtype"])
            depth = S.build(rho_init=1.0, seed=p["seed"]).depth
            rho0 = p["init_scale"] ** depth if p["init_scale"] else p["rho_init"]
            yield label, n, S, rho0, None
            if arch == "tree_cnn":
                d = S.data
                y = datasets.random_labels(d.y_train, 1.0, 2, seed=p["random_label_seed"])
                yield f"{label}, random labels", n, S, rho0, datasets.Dataset(d.x_train, y, d.x_test, d.y_test, 2, d.name)


def rademacher_bounds_size(params: dict) -> dict:
    """The laptop run length of square/rademacher_bounds at `params` (its ci defaults with `RADEMACHER_BOUNDS_FIXED`):
    the largest over the page's runs (each N, both networks, the tree CNN's random-label control) of rho's
    relaxation from rho_0 to within `rho_tolerance` of the untrained equilibrium, `log(|rho_0 / rho_eq,0 - 1| /
    rho_tolerance)` e-foldings (the need the page's logged regime uses, `timescales.rho_relaxation_regime_logged`),
    bounded for every `M <= 1/eta - 2 lam` by the weight-decay part of the rate (`epochs_to_relax`). The range is
    checked with `disjoint_patch_margin_bound` for each run's untrained network and training inputs (the tree CNN's
    patches are disjoint, so its layers' operator norms are its filters'). The page reads each run's relaxation
    from its logged M and says "needs a larger scale" if this bound was not enough. ValueError for a cosine schedule
    (the page's anneals to 0: no lower bound on the rate at the end) and for lam = 0."""
    if params["schedule"] != "constant":
        raise ValueError("the page's cosine schedule anneals to 0: no lower bound on rho's relaxation rate")
    lam, eta = params["lam"], params["rho_lr"] or params["lr"]
    per_need, arms = [], []
    for label, n, S, rho0, data in _rademacher_runs(params):
        M_max = disjoint_patch_margin_bound(S.build(rho_init=rho0, seed=params["seed"]), S.data.x_train)
        row = S.initial_row(rho_init=rho0, seed=params["seed"], lam=lam, data=data)
        need = timescales.relaxations_needed(abs(row["rho_over_rho_eq"] - 1), params["rho_tolerance"])
        per_need.append(("epochs", f"{label}, N = {n}: relaxation of ρ₀ = {rho0:.3g} ({need:.3g} e-foldings)",
                         epochs_to_relax(need, lam=lam, rho_lr=eta, steps_per_epoch=S.steps(1), M_max=M_max)))
        arms.append(Arm("epochs", 1, {"network": label.split(",")[0], "N": n, "lam": lam, "rho_lr": eta}))
    epochs = max(e for _, _, e in per_need)
    return {"set": {"epochs": epochs}, "per_need": per_need, "arms": arms}


def rademacher_epoch_seconds(params: dict, arm: Arm, epochs: int = 200) -> float:
    """Seconds per epoch of one run of square/rademacher_bounds' `arm` (its `train` names the network and N beside
    the `PageSetup.train` overrides), measured here: the page's runs differ in network and training-set size, which
    `measure_epoch_seconds` (one network per page) cannot set."""
    train = dict(arm.train)
    network, n = train.pop("network"), train.pop("N")
    S = next(S for label, N, S, _, data in _rademacher_runs({**params, "epochs": epochs, "train_sizes": [n]})
             if label == network and data is None)
    t0 = time.perf_counter()
    S.train(rho_init=1.0, seed=params["seed"], **train, epochs=epochs, log_every=epochs, desc=None, progress=False)
    return (time.perf_counter() - t0) / epochs


def measure_epoch_seconds(params: dict, arm: Arm, epochs: int = 200) -> float:
    """Seconds per epoch of one run of `arm` (the page's network at `params`, `arm.train`'s overrides), measured here."""
    S = page_setup_of({**params, **arm.setup, "epochs": epochs, "log_every": epochs})
    train = {"rho_init": 1.0, "seed": params["seed"], **arm.train}
    t0 = time.perf_counter()
    S.train(**train, epochs=epochs, log_every=epochs, desc=None, progress=False)
    return (time.perf_counter() - t0) / epochs


def measure_log_seconds(params: dict, arm: Arm, epochs: int = 4) -> float:
    """Seconds one more logged state of a run of `arm` costs here: a run of `epochs` epochs logged twice as often,
    minus the same run logged at its start and end only (never below 0)."""
    S = page_setup_of({**params, **arm.setup, "epochs": epochs, "log_every": epochs})
    train = {"rho_init": 1.0, "seed": params["seed"], **arm.train}
    times = []
    for every in (epochs, epochs // 2):
        t0 = time.perf_counter()
        S.train(**train, epochs=epochs, log_every=every, desc=None, progress=False)
        times.append(time.perf_counter() - t0)
    return max(0.0, times[1] - times[0])


def with_fixed(name: str, params: dict) -> dict:
    """`params` (a page's ci defaults) with the page's fixed laptop settings (`SIZED_PAGES[name].fixed`)."""
    return {**params, **{k: v for k, (v, _) in SIZED_PAGES[name].fixed.items()}}


def sized_settings(name: str, params: dict) -> dict:
    """What page `name`'s sizing computes at `params` (its ci defaults): `SIZED_PAGES[name].size` with the fixed
    settings applied."""
    return SIZED_PAGES[name].size(with_fixed(name, params))


def laptop_text(name: str, params: dict, budget_s: float, seconds_per_epoch=None,
                seconds_per_log=measure_log_seconds) -> tuple[str, float]:
    """(the laptop file of `name` at its ci defaults `params`, its estimated training seconds): each arm's runs ×
    (its run length × `seconds_per_epoch(params, arm)` + its further logged states × `seconds_per_log(params, arm)`),
    measured here, one run each (`seconds_per_epoch` default the page's `measure`, else `measure_epoch_seconds`;
    `seconds_per_log` measured only for an arm that logs further states)."""
    page = SIZED_PAGES[name]
    seconds_per_epoch = seconds_per_epoch or page.measure or measure_epoch_seconds
    full = with_fixed(name, params)
    sized = page.size(full)
    at = {**full, **sized["set"]}
    costs = [(arm, sized["set"][arm.epochs_key], seconds_per_epoch(at, arm), seconds_per_log(at, arm) if arm.logs else 0.0)
             for arm in sized["arms"]]
    estimate = sum(arm.runs * (epochs * spe + arm.logs * spl) for arm, epochs, spe, spl in costs)
    keys = dict.fromkeys(key for key, _, _ in sized["per_need"])
    lines = ["# Laptop scale, sized from the mechanism before training (python -m lowrank.book.laptop --write; never by hand):",
             *(f"# {line}" for line in page.header), *(f"# {line}" for line in sized.get("notes", ())),
             *(f"# {key}: the largest of " + "; ".join(f"{what}: {e}" for k, what, e in sized["per_need"] if k == key) + "."
               for key in keys),
             "# Estimated training: " + " + ".join(f"{arm.runs} runs × ({epochs} epochs × {spe * 1e3:.3g} ms + {arm.logs} logged "
                                                  f"states × {spl * 1e3:.3g} ms)" for arm, epochs, spe, spl in costs)
             + f" (measured here, one run) = {estimate:.0f} s (page budget {budget_s:.0f} s). The ci defaults otherwise.",
             "scale: laptop", *(f"{k}: {v}" for k, v in sized["set"].items())]
    for key, (value, why) in page.fixed.items():
        lines.append(f"{key}: {value}  # {why}")
    return "\n".join(lines) + "\n", estimate


LOW_RANK_SGD_FIXED = {
    "lr": (0.03, "the paper's learning rate 0.03 (Fig. 3, l.1044; Fig. 7, l.1048), one step size for rho and the V_k"),
    "rho_lr": (0.0, "no variant: rho steps with lr, the paper's single step size (Eq. 6 with one eta); the ci variant "
                    "(rho_lr 5) only reaches the weight-decay time within the ci budget"),
}
# Kept from ci, and why: lam = 1e-3 is the paper's already (Fig. 10, l.1051); the constant schedule; minibatches of 16
# on digits' 288 training samples (the paper's B = 128 is 1.3 % of its N = 10^4, l.1051; 128 of 288 would be 44 %,
# close to the full batch Lemma 8 excludes); the ci MLP (the paper's CNN needs CIFAR-10 and a GPU).
LOW_RANK_SGD_LOGS = 50  # logged epochs per run (ci: 25), so the last quarter Eq. 53 reads holds about a dozen


def low_rank_sgd_size(params: dict) -> dict:
    """The laptop run lengths of square/low_rank_sgd at `params` (its ci defaults with `LOW_RANK_SGD_FIXED`):
    - `epochs`: the SGD runs' weight-decay time, `steps * eta * lam >= wd_times_needed` (the page's regime,
      `timescales.weight_decay_regime`, with eta the step rho takes: `rho_lr or lr`; the schedule is constant);
    - `gd_epochs`: the full-batch control takes as many steps as the SGD run (the page's "about the same number
      of steps"), which is also its own weight-decay time.
    The SGD arm trains the main run, the lambda = 0 run and the `pool_seeds` runs (Eq. 53's correlation pools
    `1 + len(pool_seeds)` seeds); the GD arm one run. Their per-epoch time is measured with the layer tracking
    (ranks and update norms) the page trains with."""
    if params["schedule"] != "constant":
        raise ValueError("the weight-decay clock here assumes a constant step; the page's regime does too")
    eta = params["rho_lr"] or params["lr"]
    S = page_setup_of(params)
    spe = S.steps(1, params["batch_size"])
    epochs = epochs_to_weight_decay(params["wd_times_needed"], lam=params["lam"], rho_lr=eta, steps_per_epoch=spe)
    gd_wd = epochs_to_weight_decay(params["wd_times_needed"], lam=params["lam"], rho_lr=eta, steps_per_epoch=1)
    gd_epochs = max(epochs * spe, gd_wd)
    per_need = [("epochs", f"SGD (B = {params['batch_size']}, {spe} steps per epoch) weight-decay time steps × η × λ ≥ "
                           f"{params['wd_times_needed']:g}", epochs),
                ("gd_epochs", "full-batch GD weight-decay time steps × η × λ ≥ "
                              f"{params['wd_times_needed']:g}", gd_wd),
                ("gd_epochs", "as many steps as the SGD run", epochs * spe)]
    layers = {"track_layers": True, "eps": params["eps"], "lr": params["lr"], "rho_lr": params["rho_lr"],
              "lam": params["lam"]}
    log_every = max(1, epochs // LOW_RANK_SGD_LOGS)
    logs = epochs // log_every  # the GD run logs as often in steps (the page's log_every * gd_epochs // epochs)
    arms = [Arm("epochs", 2 + len(params["pool_seeds"]), {**layers, "batch_size": params["batch_size"]}, logs=logs),
            Arm("gd_epochs", 1, {**layers, "batch_size": 0}, logs=logs)]
    return {"set": {"epochs": epochs, "gd_epochs": gd_epochs, "log_every": log_every},
            "per_need": per_need, "arms": arms}


LOW_RANK_SGD_PAGE = SizedSquarePage(low_rank_sgd_size, LOW_RANK_SGD_FIXED, (
    "Lemma 8 / Eq. 53 of Xu et al. (2023) on digits 1 vs 2 with the ci MLP (two hidden layers of 64), SGD with",
    "minibatches of 16 (the paper: CIFAR-10, the 6-layer CNN, B = 128, a GPU; lowrank.square.sizing says why B stays 16),",
    "lambda = 1e-3 (Fig. 10, l.1051) and the paper's single step size 0.03 for rho and the V_k (l.1044). The run",
    "lengths are the page's regime: one weight-decay time 1/(eta lambda) of the SGD runs; full-batch GD takes as many",
    f"steps. About {LOW_RANK_SGD_LOGS} logged epochs per run (ranks and update norms at each)."))


NEURAL_COLLAPSE_FIXED = {
    "lam": (5e-4, "Fig. 9 (l.1050): WD = 5 × 10^-4"),
    "lr": (0.067, "Fig. 9 (l.1050): learning rate 0.067"),
    "rho_lr": (10.0, "kept from ci, not the paper's single step (l.1050: one learning rate): with eta = 0.067 one "
                     "weight-decay time is 1/(eta lambda) = 29,851 full-batch epochs for each of the page's 18 "
                     "full-batch runs, and 9 to 19 times as many steps for the SGD arm, far above the page budget"),
    "sgd_batch_size": (32, "kept from ci: Theorem 5 has batch size 1 (l.547), i.e. 288 to 581 steps per epoch here; "
                           "B = 32 keeps 9 to 19 minibatches per epoch on digits"),
}
# Not the paper's, and why: digits (1 vs 2, and 0-3) with the ci MLP (the paper: CIFAR-10, the 6-layer CNN, a GPU);
# a constant step (Fig. 9's "stepped" decay is not specified, l.1050).


# bench/nc_fit_probe.py --write: a clone's bench/, or the copy an installed lowrank carries in lowrank/_book/ (setup.py);
# found here, not through lowrank.book, so that the page importing this module keeps the book's machinery out of its code key
_PACKAGE = Path(__file__).resolve().parents[1]
NC_FIT_PROBE = next((p for p in (_PACKAGE.parent / "bench" / "nc_fit_probe.csv", _PACKAGE / "_book" / "bench" / "nc_fit_probe.csv")
                     if p.is_file()), _PACKAGE.parent / "bench" / "nc_fit_probe.csv")
NC_WEIGHT_DECAY_ARMS = ("trained", "SGD")  # the arms with the page's lambda: the claims' (SGD) and its full-batch control


def fit_probe_summary(table=None, *, scale: str = "laptop", fit_error: float = 0.0) -> dict:
    """What bench/nc_fit_probe.py measured at `scale` (`table`: its rows, default `NC_FIT_PROBE`): whether the
    multiclass runs with weight decay (`NC_WEIGHT_DECAY_ARMS`) fit their training set (train error <= `fit_error`;
    Lemma 7 and Theorem 6 assume it, l.609) at some width and run length tried. Returns {"fits", "width", "epochs"
    (the smallest width whose every such arm fits, at its fewest epochs; None when none does), "settings" (how many
    (width, epochs) were tried), "min_error", "max_error" (over the arms with weight decay), "text" (in words)}.
    ValueError when the table holds no row of `scale`."""
    import pandas as pd

    table = pd.read_csv(NC_FIT_PROBE) if table is None else pd.DataFrame(table)
    rows = table[(table.scale == scale) & table.arm.isin(NC_WEIGHT_DECAY_ARMS)]
    if rows.empty:
        raise ValueError(f"bench/nc_fit_probe.py has no {scale} row (run it with --scale {scale} --write)")
    worst = rows.groupby(["width", "epochs"]).train_error.max()
    fitted = sorted(k for k, e in worst.items() if e <= fit_error)
    widths_at = {}  # run length -> the widths tried at it
    for w, e in worst.index:
        widths_at.setdefault(int(e), []).append(int(w))
    tried = "; ".join(f"{e} epochs: width{'s' if len(ws) > 1 else ''} {', '.join(map(str, sorted(ws)))}"
                      for e, ws in sorted(widths_at.items()))
    seeds = ", ".join(map(str, sorted(rows.seed.unique())))
    where = (f"bench/nc_fit_probe.py trained the multiclass task at the {scale} parameters (seed {seeds}; {tried}), "
             "full batch and SGD with the page's weight decay")
    if fitted:
        width, epochs = fitted[0]
        text = f"{where}: the smallest width that fits is {width}, at {epochs} epochs"
    else:
        width = epochs = None
        text = f"{where}: none fits, their train error is {rows.train_error.min():.2%} to {rows.train_error.max():.2%}"
    no_wd = table[(table.scale == scale) & (table.lam == 0)]
    no_wd_fits = sorted((int(r.width), int(r.epochs)) for r in no_wd.itertuples() if r.train_error <= fit_error)
    if len(no_wd):
        epochs_at = {}  # width -> the run lengths at which the lambda = 0 run fits
        for w, e in no_wd_fits:
            epochs_at.setdefault(w, []).append(e)
        text += (("; without weight decay (the lambda = 0 control) it fits at " +
                  "; ".join(f"width {w}, {', '.join(map(str, es))} epochs" for w, es in sorted(epochs_at.items())))
                 if no_wd_fits else "; without weight decay (the lambda = 0 control) it does not fit either")
    return {"fits": bool(fitted), "width": width, "epochs": epochs, "settings": len(worst),
            "min_error": float(rows.train_error.min()), "max_error": float(rows.train_error.max()),
            "no_wd_fits": no_wd_fits, "text": text}


def neural_collapse_size(params: dict) -> dict:
    """The laptop run length of square/neural_collapse at `params` (its ci defaults with `NEURAL_COLLAPSE_FIXED`):
    the page's regime, one weight-decay time `steps * eta_rho * lam >= wd_times_needed` of its fewest-step runs (the
    full-batch arms; eta_rho = `rho_lr or lr`, constant schedule); the SGD arm takes more steps per epoch. Whether a
    run fits its training set (Lemma 7, Theorem 6: l.609) has no bound before training: the width is the smallest
    that bench/nc_fit_probe.py saw fit (`fit_probe_summary`; run at least as long as it took), ci's when none did,
    and the page reads the fit per run and leaves out, counted, the runs that do not fit. Arms: per task, the
    full-batch trainings (true labels, shuffled labels, lambda = 0) of every seed, counted as separate runs (the page
    stacks the further seeds', so this overestimates), and the SGD run of every seed; each measured on the multiclass
    task, the dearer one, at the sized width."""
    if params["schedule"] != "constant":
        raise ValueError("the weight-decay clock here assumes a constant step; the page's regime does too")
    eta = params["rho_lr"] or params["lr"]
    tasks = [c for c in (params["binary_classes"], params["multiclass_classes"]) if c]
    setups = [page_setup_of({**params, "classes": c}) for c in tasks]
    spe = min(S.steps(1, params["batch_size"]) for S in setups)
    sgd_spe = [S.steps(1, params["sgd_batch_size"]) for S in setups]
    epochs = epochs_to_weight_decay(params["wd_times_needed"], lam=params["lam"], rho_lr=eta, steps_per_epoch=spe)
    per_need = [("epochs", f"weight-decay time steps × η_ρ × λ ≥ {params['wd_times_needed']:g} of the full-batch runs "
                           f"({spe} step per epoch; the SGD arm takes {' and '.join(map(str, sgd_spe))})", epochs)]
    seeds = 1 + len(params["pool_seeds"])
    train = {"lam": params["lam"], "lr": params["lr"], "rho_lr": params["rho_lr"], "nc": True, "nc_shuffled": True,
             "nc_convention": params["nc_convention"]}
    settings = {"epochs": epochs}
    # Lemma 7 and Theorem 6 assume a network "overparameterized enough to attain 100% accuracy" (l.609): a width is
    # taken from bench/nc_fit_probe.py's measured train errors (nothing bounds the fit before training). As measured
    # (seed 0): widths 128-1024 at 200 epochs and width 128 up to 4000 epochs (about the page budget) leave the
    # weight-decay runs at 0.34-1.20 % train error (2 to 7 of 581 samples), so ci's width stays
    probe = fit_probe_summary(scale="laptop", fit_error=params["fit_error"])
    widths = list(params["arch_kwargs"]["widths"])
    if probe["fits"]:  # the smallest width the probe saw fit, for at least the epochs it took
        widths = [probe["width"]] * len(widths)
        settings["arch_kwargs"] = {**params["arch_kwargs"], "widths": widths}
        per_need.append(("epochs", f"the fit (l.609) at width {probe['width']} (bench/nc_fit_probe.py)", probe["epochs"]))
        settings["epochs"] = max(epochs, probe["epochs"])
        fit = f"The width is {probe['width']}: {probe['text']}."
    else:
        fit = (f"The width stays ci's {widths[0]}: {probe['text']}. So no width or run length tried meets the assumption "
               "within the page budget, and the page's multiclass claims are read only on runs that fit (undecided "
               "where none does).")
    measured = {"classes": tasks[-1], "arch_kwargs": {**params["arch_kwargs"], "widths": widths}}
    arms = [Arm("epochs", 3 * len(tasks) * seeds, {**train, "batch_size": params["batch_size"]}, measured),
            Arm("epochs", len(tasks) * seeds, {**train, "batch_size": params["sgd_batch_size"]}, measured)]
    notes = [f"Lemma 7 and Theorem 6 assume a network overparameterized enough to fit its training set (l.609). {fit}"]
    return {"set": settings, "per_need": per_need, "arms": arms, "notes": notes}


NEURAL_COLLAPSE_PAGE = SizedSquarePage(neural_collapse_size, NEURAL_COLLAPSE_FIXED, (
    "Fig. 9 of Xu et al. (2023) on digits (1 vs 2, and 0-3) with an MLP of two hidden layers (width below): the paper's",
    "lambda = 5e-4 and learning rate 0.067 (l.1050), rho's own step size and the SGD arm's B = 32 kept from ci",
    "(lowrank.square.sizing says why). The run length is the page's regime, one weight-decay time of its",
    "full-batch runs. Whether a run fits its training set is not known before training: the page reads it per run",
    "and leaves out, counted, the runs that do not fit (Lemma 7, Theorem 6, l.609)."))


SIZED_PAGES = {
    "square/rho_dynamics": SizedSquarePage(rho_dynamics_size, RHO_DYNAMICS_FIXED, (
        "Fig. 3 of Xu et al. (2023) on digits 1 vs 2 with the ci network, full-batch gradient descent (the paper: SGD, B = 128,",
        "CIFAR-10, the 6-layer CNN; lowrank.square.sizing says why). Each clock below is a bound that holds for any margins",
        "M <= 1/eta - 2 lambda (the relaxation rate at M = 0 is the weight decay's, Eq. 6; the MLP's margins have",
        "M <= max ||x||^2 = 1, checked at the largest step). The relaxation tolerance is tied to init_dependence_wd's threshold",
        "(timescales.spread_relaxation_tolerance); the lambda = 0 control relaxes at 2 eta M, which has no bound before",
        "training: the page reads it from the logged M.")),
    "square/quasi_interpolation": SizedSquarePage(quasi_interpolation_size, QUASI_INTERPOLATION_FIXED, (
        "Figs. 8 and 10 of Xu et al. (2023) on digits 1 vs 2 with the ci network (one hidden layer of 128, one output),",
        "SGD with minibatches of 128 (the paper: CIFAR-10, the 6-layer CNN with two outputs, a GPU). The weight-decay claims'",
        "clock counts steps x eta x lambda at the schedule's smallest step; the lambda = 0 run relaxes at 2 eta M, which has no",
        "bound before training: the page reads it per run from the logged M. Three initialisations pooled (pool_seeds).")),
    "square/random_labels": SizedSquarePage(random_labels_size, RANDOM_LABELS_FIXED, (
        "Figs. 4-5 of Xu et al. (2023) on ci's task and network (MNIST-1D 3 vs 5, 100 training samples, a one-hidden-layer",
        "MLP of width 256, full-batch gradient descent; the paper: CIFAR-10 classes 1 and 2, the 6-layer CNN, SGD, 10 runs",
        "per point; lowrank.square.sizing says why) with the paper's lambda and one step size for rho and the V_k. Each",
        "figure's runs with weight decay last the page's wd_times_needed weight-decay times 1/(eta lambda), the regime the",
        "page computes before training (with a constant step every run accumulates the same). The lambda = 0 controls",
        "run as long.")),
    "square/rademacher_bounds": SizedSquarePage(rademacher_bounds_size, RADEMACHER_BOUNDS_FIXED, (
        "Figs. 6-7 of Xu et al. (2023) on digits 1 vs 2 as 64-vectors with ci's 6-layer binary-tree CNN and dense MLP,",
        "full-batch gradient descent without momentum (the paper: CIFAR-10, SGD with momentum 0.9, a GPU; lowrank.square.sizing",
        "says why), the paper's lambda and initialisation scale. The run length is the slowest run's relaxation of rho to",
        "within rho_tolerance of its untrained equilibrium, bounded for any margins M <= 1/eta - 2 lambda by the weight",
        "decay's rate (Eq. 6); both networks' margins have M <= max ||x||^2 = 1 (the tree's patches are disjoint, so each",
        "layer's operator norm is its filter's: disjoint_patch_margin_bound). The page reads each run's relaxation from",
        "its logged M."), measure=rademacher_epoch_seconds),
    "square/low_rank_sgd": LOW_RANK_SGD_PAGE,
    "square/neural_collapse": NEURAL_COLLAPSE_PAGE,
}
