"""Section 3.4's experiments (the page gradients/mf_vs_ntk), repeated over draws and returned as tables.

Each function repeats one of `lowrank.gradients.dynamics`' single-draw helpers over independent
draws and stacks the results, so that the page computes a figure's quantity in one call:

- Fig. 4, `initial_alignment_table`: `initial_alignments_by_scaling` (the initial gradient's `u1`
  against `X^T y`, `X^T r` and omega, one draw under every scaling) for each draw;
- Fig. 5, `scaling_runs`: what `scaling_comparison` does (MF and NTK trained from one `W_0` on one
  data set, `train_weight_normalized` with step `lr_factor / gamma_m`, `snapshot_angles` between the
  two) for each draw: the traces, the angles between the two scalings' weights, how far each
  scaling's own weights moved from `W_0`, and the control: how far apart two runs under one scaling
  end when only the label noise is drawn afresh (`RELABEL_SEED_OFFSET`);
- Fig. 6, `spike_size_runs`: `train_weight_normalized` under one scaling for each (spike size nu,
  draw), beside its control, `initial_lead` on the spike-free inputs `X_B`;
- `initial_leads` (Theorems 3.1-3.2: which side each spike size starts on) and `direction_switches`
  (`direction_switch` for every run) read the tables `spike_size_runs` returns.
- `omega_alternative_degenerate` (Fig. 4's omega claim): why "not aligned with omega" cannot tell NTK
  from ref. [28]'s alternative (u1 along `X^T y`) where that alternative is below the threshold too.

Draw `k` of every figure uses the seed `seed + DRAW_SEED_STRIDE * k` (`single_index_draw` and
`initial_alignments` derive their sub-seeds from it), so the draws are independent tasks: with
`workers > 1` they run in that many worker processes (`lowrank.core.parallel.map_tasks`, one thread
each) and the tables are the same as with `workers=1` under one thread.
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple, Sequence

import torch

from lowrank.core.data import single_index_target
from lowrank.core.parallel import check_workers, map_tasks
from lowrank.core.nets import gamma_m
from lowrank.gradients.dynamics import (  # the private ones: `final_weights` repeats the descent step for step
    DescentConfig,
    _fixed_operands,
    _gradient,
    _normalized_step,
    _training_data,
    direction_switch,
    samples_for_target_share,
    target_span_share,
    initial_alignments_by_scaling,
    initial_lead,
    scaling_run,
    single_index_draw,
    snapshot_angles,
    train_weight_normalized,
    weight_angles,
)

__all__ = [
    "paired_sign_flip_p",
    "paired_sign_flip_floor",
    "DRAW_SEED_STRIDE",
    "RELABEL_SEED_OFFSET",
    "draw_seed",
    "initial_alignment_table",
    "ScalingRuns",
    "scaling_runs",
    "final_weights",
    "SpikeRuns",
    "spike_size_runs",
    "initial_leads",
    "direction_switches",
    "omega_alternative_degenerate",
]

DRAW_SEED_STRIDE = 1000  # draw k uses seed + 1000 k: the sub-seeds seed .. seed + 4 of two draws never meet
RELABEL_SEED_OFFSET = 5  # Fig. 5's control: the fresh label noise of draw k uses draw_seed(seed, k) + 5 (free sub-seed)
TRACE_TOP_K = 1  # the figures read u1(G_t) and s1 only; a second pair in a flat bulk costs most of a step


def draw_seed(seed: int, draw: int) -> int:
    """The seed of draw number `draw` (0, 1, ...) of an experiment seeded by `seed`."""
    if not isinstance(draw, int) or draw < 0:
        raise ValueError(f"draw must be a non-negative integer, got {draw!r}")
    return seed + DRAW_SEED_STRIDE * draw


def _check_repeats(repeats):
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")


def initial_alignment_table(n: int, d: int, m: int, *, repeats: int, activation: str = "relu",
                            scalings: Sequence[str] = ("mf", "ntk"), noise_std: float = 0.1, seed: int = 0,
                            product_precision: str = "float64", workers: int = 1):
    """Fig. 4: the initial gradient's alignments, one row per (scaling, draw).

    Parameters
    ----------
    n, d, m : samples, input dimension, width. repeats : independent draws of (X, omega, y, W, a).
    activation : of the network. scalings : `gamma_m` conventions ("mf", "ntk"). noise_std : of the
    single-index target. seed : of draw 0 (`draw_seed`). product_precision : of each draw's n x d x m
    product ("float64" or "float32", `dynamics.gradient_matrix`). workers : processes for the draws.

    Returns
    -------
    DataFrame with columns `scaling`, `repeat` and `initial_alignments`' `align_Xy`, `align_Xr`,
    `align_omega` (|cos| of u1(G) with `X^T y`, `X^T r`, omega), `align_omega_span` and `omega_span_norm`
    (|cos| with omega's projection onto the inputs' span, and its norm), `align_random`, `s1_over_s2` and
    `r_y_corr`. Draw `k`
    is the same data and network under every scaling.
    """
    import pandas as pd

    _check_repeats(repeats)
    draws = map_tasks(functools.partial(_initial_draw, n=n, d=d, m=m, scalings=tuple(scalings), activation=activation,
                                       noise_std=noise_std, seed=seed, product_precision=product_precision),
                     range(repeats), workers, desc="initial draws")
    return pd.DataFrame([{"scaling": sc, "repeat": k, **draws[k][sc]}
                         for sc, k in itertools.product(scalings, range(repeats))])


def _initial_draw(k, *, seed, **settings):
    return initial_alignments_by_scaling(seed=draw_seed(seed, k), **settings)


class ScalingRuns(NamedTuple):
    """What `scaling_runs` recorded (Fig. 5)."""

    traces: object  # DataFrame: `TrainingRun.trace` rows with `scaling` and `repeat`
    angles: object  # DataFrame: `weight_angles` between the first two scalings' W_t, per (repeat, step)
    moved: object  # DataFrame: per (scaling, repeat), `weight_angles` between W at the last snapshot and W_0
    relabelled: object  # DataFrame: per (scaling, repeat), `weight_angles` between W at the last snapshot of the
    # run and of a run under the same scaling from the same W_0 whose labels differ by a fresh draw of the noise


def scaling_runs(n: int, d: int, m: int, *, repeats: int, activation: str, steps: int, snapshot_every: int,
                 lr_factor: float = 1.0, normalization: str = "wn", noise_std: float = 0.1, seed: int = 0,
                 scalings: Sequence[str] = ("mf", "ntk"), product_precision: str = "float64",
                 workers: int = 1) -> ScalingRuns:
    """Fig. 5: each scaling trained from one initialisation on one data set, for `repeats` draws.

    Draw `k` is `single_index_draw(n, d, m, nu=0, seed=draw_seed(seed, k))` (isotropic inputs, a
    single-index target); every scaling trains from its `W_0` with `train_weight_normalized`, step
    `lr_factor / gamma_m`, for `steps` full-batch steps, recording the alignment of u1(G_t) with
    `q`, `X_B^T y` and omega (`align_q`, `align_Xy`, `align_omega`), with `X_B^T r_t` and with u1(G_0).
    W_t is kept every `snapshot_every` steps from 0. `product_precision` is that of each step's two
    n x d x m products (`DescentConfig`). workers : processes for the (draw, scaling) runs.

    The control (the scaling left unchanged): every scaling is trained once more from the same `W_0`
    on the same inputs, with labels `link(omega^T x)` plus noise of the same `noise_std` drawn afresh
    (sub-seed `draw_seed(seed, k) + RELABEL_SEED_OFFSET`). With `noise_std = 0` those labels are the
    run's own and the control's angles are 0 by construction.

    Returns
    -------
    `ScalingRuns`: `traces` (one row per scaling, draw and step), `angles` (the mean and largest
    principal angle and the mean neuron angle, in degrees, between the first two scalings' W_t at
    each snapshot, per draw), `moved` (the same angles between each scaling's W at its last snapshot
    and at step 0: how far its own weights moved) and `relabelled` (the same angles between each
    scaling's W at its last snapshot and that of its relabelled run, at the same step).
    """
    import pandas as pd

    _check_repeats(repeats)
    if not isinstance(snapshot_every, int) or snapshot_every < 1:
        raise ValueError(f"snapshot_every must be a positive integer, got {snapshot_every!r}")
    tasks = list(itertools.product(range(repeats), scalings))
    last = max(range(0, steps + 1, snapshot_every))
    relabel_tasks = [(k, sc, last) for k, sc in tasks]
    done = map_tasks(functools.partial(_scaling_run, n=n, d=d, m=m, activation=activation, steps=steps,
                                      snapshot_every=snapshot_every, lr_factor=lr_factor, normalization=normalization,
                                      noise_std=noise_std, seed=seed, product_precision=product_precision),
                    tasks + relabel_tasks, workers, desc="scaling runs")
    runs = dict(zip(tasks, done[:len(tasks)]))
    relabelled_W = dict(zip(tasks, done[len(tasks):]))
    # the angles are tasks too (a few hundred ms each at the paper's sizes): the two scalings' W at each
    # common snapshot of each draw, then each run's last W against its W_0
    between = [(k, t) for k in range(repeats) if len(scalings) >= 2
               for t in sorted(set(runs[k, scalings[0]].W) & set(runs[k, scalings[1]].W))]
    pairs = [({t: runs[k, scalings[0]].W[t]}, {t: runs[k, scalings[1]].W[t]}) for k, t in between]
    pairs += [(runs[task].W[0], runs[task].W[max(runs[task].W)]) for task in tasks]
    pairs += [(runs[task].W[last], relabelled_W[task]) for task in tasks]
    found = map_tasks(_angles, pairs, workers, desc="principal angles")
    angles = [rows.assign(repeat=k) for (k, _), rows in zip(between, found)]
    moved = [{"scaling": sc, "repeat": k, "step": max(runs[k, sc].W), **row}
             for (k, sc), row in zip(tasks, found[len(between):len(between) + len(tasks)])]
    relabelled = [{"scaling": sc, "repeat": k, "step": last, **row}
                  for (k, sc), row in zip(tasks, found[len(between) + len(tasks):])]
    traces = [runs[k, sc].trace.assign(scaling=sc, repeat=k) for k, sc in tasks]
    return ScalingRuns(pd.concat(traces, ignore_index=True),
                       pd.concat(angles, ignore_index=True) if angles else pd.DataFrame(),
                       pd.DataFrame(moved), pd.DataFrame(relabelled))


def _angles(pair):
    """`snapshot_angles` of two {step: W} maps, or `weight_angles` of two matrices."""
    A, B = pair
    if isinstance(A, dict):
        return snapshot_angles(A, B)
    if torch.equal(A, B):  # a control run on its own labels (noise_std = 0): 0, not the SVD's rounding
        return {"mean_principal_angle": 0.0, "max_principal_angle": 0.0, "mean_neuron_angle": 0.0}
    return weight_angles(A, B)


def _scaling_run(task, *, n, d, m, activation, steps, snapshot_every, lr_factor, normalization, noise_std, seed,
                 product_precision):
    """Draw `k` trained under one scaling (one of `dynamics.scaling_comparison`'s runs); for a task
    `(k, scaling, step)`, the control: the same run on freshly drawn label noise, whose W at `step` it returns."""
    k, scaling = task[:2]
    data, omega, y, W0, a = single_index_draw(n, d, m, nu=0.0, seed=draw_seed(seed, k), noise_std=noise_std)
    if len(task) == 3:
        y = single_index_target(data.X, omega, noise_std=noise_std, seed=draw_seed(seed, k) + RELABEL_SEED_OFFSET)
        gamma = gamma_m(m, scaling)
        return final_weights(data.X, y, W0, a, activation=activation, gamma=gamma, steps=task[2],
                             lr=lr_factor / gamma, normalization=normalization, product_precision=product_precision)
    return scaling_run(data.X, y, W0, a, scaling=scaling, activation=activation, steps=steps, lr_factor=lr_factor,
                       X_B=data.X_B, references={"q": data.q, "Xy": data.X_B.T @ y, "omega": omega},
                       normalization=normalization, snapshot_steps=range(0, steps + 1, snapshot_every),
                       product_precision=product_precision, top_k=TRACE_TOP_K)


def final_weights(X, y, W0, a, *, activation: str, gamma: float, steps: int, lr: float, normalization: str = "wn",
                  product_precision: str = "float64") -> torch.Tensor:
    """W at step `steps` of `train_weight_normalized`'s descent (MSE), operation for operation, so equal to its
    snapshot to the bit, without the trace: the relabelled control needs only where a run ends, and the
    trace's tracked singular pairs cost about a fifth of a step at the paper's sizes."""
    cfg = DescentConfig(activation=activation, gamma=gamma, steps=steps, lr=lr, normalization=normalization,
                        product_precision=product_precision)  # the same checks as the traced run
    X, y, W0, a, _, _ = _training_data(X, y, W0, a, None, None, 1)
    fixed = _fixed_operands(X, gamma, product_precision)
    V = W0.clone()
    norms = V.norm(dim=1, keepdim=True)
    for t in range(cfg.steps):
        W = V / norms
        G, _, _ = _gradient(X, W, a, y, activation, gamma, cfg.loss, product_precision, fixed)
        V = _normalized_step(V, W, G.T, cfg.lr, normalization, norms)
        norms = V.norm(dim=1, keepdim=True)
        if not torch.isfinite(norms).all() or not bool((norms > 0).all()):
            raise FloatingPointError(f"training diverged at step {t + 1} (lr={cfg.lr:g})")
    return V / norms


class SpikeRuns(NamedTuple):
    """What `spike_size_runs` recorded (Fig. 6)."""

    traces: object  # DataFrame: `TrainingRun.trace` rows with `nu` and `repeat`
    spike_free: object  # DataFrame: per (nu, repeat), `lead` of the initial gradient on X_B alone


def spike_size_runs(n: int, d: int, m: int, *, nus: Sequence[float], repeats: int, activation: str, steps: int,
                    lr_factor: float = 1.0, normalization: str = "wn", noise_std: float = 0.1, seed: int = 0,
                    scaling: str = "mf", product_precision: str = "float64", workers: int = 1) -> SpikeRuns:
    """Fig. 6: training under one scaling for each spike size nu and draw, and the spike-free control.

    Draw `k` at spike size `nu` is `single_index_draw(n, d, m, nu=nu, seed=draw_seed(seed, k))` (the
    same bulk, target and network at every nu: only the spike `zeta = n^nu` changes). Each trains with
    `train_weight_normalized` (`gamma_m` of `scaling`, step `lr_factor / gamma_m`, no weight snapshots),
    recording `align_q` and `align_residue` (|cos| of u1(G_t) with q and with `X_B^T r_t`), its
    n x d x m products in `product_precision` (`DescentConfig`). workers : processes for the (nu, draw) runs.

    Returns
    -------
    `SpikeRuns`: `traces` (one row per nu, draw and step) and `spike_free`, per (nu, draw), the
    `initial_lead` `|cos(u1, q)| - |cos(u1, X_B^T r)|` of the same network and labels on the inputs
    `X_B` without the spike (the mechanism removed).
    """
    import pandas as pd

    _check_repeats(repeats)
    check_workers(workers)
    gamma_m(m, scaling)  # a bad scaling fails here, before any work
    tasks = list(itertools.product(nus, range(repeats)))
    done = map_tasks(functools.partial(_spike_run, n=n, d=d, m=m, activation=activation, steps=steps,
                                      lr_factor=lr_factor, normalization=normalization, noise_std=noise_std,
                                      seed=seed, scaling=scaling, product_precision=product_precision),
                    tasks, workers, desc="spike-size runs")
    traces = [run.trace.assign(nu=nu, repeat=k) for (nu, k), (run, _) in zip(tasks, done)]
    spike_free = [{"nu": nu, "repeat": k, "lead": lead} for (nu, k), (_, lead) in zip(tasks, done)]
    return SpikeRuns(pd.concat(traces, ignore_index=True), pd.DataFrame(spike_free))


def _spike_run(task, *, n, d, m, activation, steps, lr_factor, normalization, noise_std, seed, scaling,
               product_precision):
    """Draw `k` at spike size `nu`: its training run (no snapshots) and the spike-free `initial_lead`."""
    nu, k = task
    gamma = gamma_m(m, scaling)
    data, omega, y, W0, a = single_index_draw(n, d, m, nu=nu, seed=draw_seed(seed, k), noise_std=noise_std)
    lead = initial_lead(data.X_B, y, W0, a, activation=activation, gamma=gamma, X_B=data.X_B, q=data.q,
                        product_precision=product_precision)
    run = train_weight_normalized(data.X, y, W0, a, activation=activation, gamma=gamma, steps=steps,
                                  lr=lr_factor / gamma, X_B=data.X_B, references={"q": data.q},
                                  normalization=normalization, snapshot_steps=[],
                                  product_precision=product_precision, top_k=TRACE_TOP_K)
    return run._replace(U=run.U[:0]), lead  # the page reads the trace: the vectors need not travel back


def initial_leads(traces, *, by: str = "nu"):
    """The median over runs, per value of `by`, of the lead `align_q - align_residue` at step 0.

    traces : a table with columns `step`, `align_q`, `align_residue` and `by` (`SpikeRuns.traces`).
    Returns a Series indexed by the sorted values of `by` (> 0: u1(G_0) nearer the spike q).
    """
    for col in ("step", "align_q", "align_residue", by):
        if col not in traces:
            raise ValueError(f"traces has no column {col!r}")
    first = traces[traces["step"] == 0]
    return (first["align_q"] - first["align_residue"]).groupby(first[by]).median().rename("lead").sort_index()


def direction_switches(traces, *, by: Sequence[str] = ("nu", "repeat"), source: str = "align_residue",
                       target: str = "align_q"):
    """`direction_switch` for every run of a trace table: one row per group of `by`.

    traces : a table of several runs, one row per (run, step) (`SpikeRuns.traces`); `by` names the
    columns that identify a run. source, target : the alignment columns (default: from the residue
    `X_B^T r_t` to the spike q). Returns a DataFrame with the `by` columns and `direction_switch`'s
    (`switched`, `switch_step`, `loss_before`, `loss_at`, `loss_after`, `loss_jump`, ...).
    """
    import pandas as pd

    by = list(by)
    return pd.DataFrame([{**dict(zip(by, key)), **direction_switch(g.sort_values("step"), source=source, target=target)}
                         for key, g in traces.groupby(by)])


def omega_alternative_degenerate(n: int, d: int, threshold: float, *, noise_std: float = 0.0,
                                 link: str = "sigmoid") -> str | None:
    """Whether "u1 not aligned with P_X omega" (Fig. 4, NTK) can tell NTK from the paper's named alternative
    (ref. [28]: u1 along `X^T y`, whose population limit `E[x y]` is along omega), and if not, why.

    The alternative reaches at most about `target_span_share(n, d)` on that statistic. Below the
    alignment `threshold` it is "not aligned" too, so the claim could only agree: the reason is returned
    (the level, and the fewest samples, `samples_for_target_share(d, threshold)`, at which `X^T y` reaches
    the threshold along omega itself). At or above it, None: the alternative can then be aligned, and
    its own alignment (MF's u1, the `X^T y` form) is the claim's control.
    """
    if not 0 < threshold < 1:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    level = target_span_share(n, d, noise_std=noise_std, link=link)
    if level >= threshold:
        return None
    need = samples_for_target_share(d, threshold, noise_std=noise_std, link=link)
    return (f"the alternative (u1 along X_B^T y, ref. [28]) is not aligned either at n = {n}, d = {d}: X_B^T y's "
            f"share along P_X omega is {level:.3f} (leading order, target_span_share), below {threshold:g}; "
            f"X_B^T y reaches {threshold:g} along omega only from n = {need} samples at d = {d} "
            f"(samples_for_target_share), so 'not aligned' cannot tell NTK from it")


def paired_sign_flip_p(observed: Sequence[float], null: Sequence[float]) -> float:
    """The exact one-sided sign-flip p-value that `observed` is larger than `null`, pair by pair: `observed[k]`
    and `null[k]` share draw k (its W_0 and X), so the per-draw differences are symmetric about 0 under the null.
    It is the share of the 2^n sign patterns of the differences whose sum is at least the observed one (the
    observed pattern counts, so p >= 2^-n, reached when every difference is positive)."""
    import numpy as np

    obs, nul = np.asarray(observed, float).ravel(), np.asarray(null, float).ravel()
    if obs.size == 0 or obs.size != nul.size or not (np.all(np.isfinite(obs)) and np.all(np.isfinite(nul))):
        raise ValueError("paired_sign_flip_p needs finite values, one null per observed draw")
    diff = obs - nul
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=diff.size)))  # 2^n x n: n is a handful of draws
    sums, total = signs @ diff, diff.sum()
    return float(np.mean(sums >= total - 1e-12 * max(1.0, abs(total))))  # ties count as extreme


def paired_sign_flip_floor(draws: int) -> float:
    """The least value `paired_sign_flip_p` can take with `draws` pairs: 2^-draws."""
    _check_repeats(draws)
    return 2.0 ** -draws
