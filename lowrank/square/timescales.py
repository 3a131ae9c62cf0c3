"""Time scales of the square-loss mechanisms, computed from the parameters before any training.

A Part III claim is informative only if the run lasted long enough for the mechanism it tests to act.
The paper's own dynamics give the clocks:

- rho's relaxation (Eq. 6): for fixed margins, gradient descent on `L(rho) = c - 2 rho mu + rho^2 (M + lam)`
  with step `eta_rho` maps the distance to `rho_eq = mu / (M + lam)` as `e -> (1 - 2 eta_rho (M + lam)) e`,
  so `e` falls by `e` (Euler's number) every `rho_relaxation_steps(M, lam, eta_rho)` steps;
- weight decay: the penalty `lam rho^2` alone shrinks rho by `(1 - 2 eta_rho lam)` per step; its time
  is `weight_decay_steps(lam, eta_rho) = 1 / (eta_rho lam)` steps (the "1/(eta lambda)" of the literature;
  `accumulated_weight_decay = steps * eta_rho * lam` counts how many of them a run lasts).

`M` grows as the network learns (the margins of an untrained normalised network are tiny: 100-15,000x
growth is measured on the Part III pages), so the relaxation time at the *initial* `M` says little about
the run. The regime of a trained run is therefore read from its logged trajectory:
`logged_rho_relaxations` integrates the e-folding rate `-log|1 - 2 eta (M_t + lam)|` over the steps,
taking on each logged interval the smaller of its two end values of `M` (a lower bound where `M` is
monotone within the interval), and `rho_relaxation_regime_logged` compares that count with the one
needed and records the measured end state `|rho / rho_eq - 1|` beside it. The e-foldings needed come from
rho's starting distance to an equilibrium: the untrained one (`need_from="initial"`) or, from the trajectory,
the one the run ends at (`need_from="final"`, `initial_distance`). `rho_relaxation_regime`
(initial `M`) stays as the estimate made before training, for sizing a run.

The e-foldings count contraction towards a *fixed* target; while the network learns, `rho_eq = mu / (M + lam)`
moves. A first-order lag that contracts at rate `r` per step towards a target whose log moves by `d` per step
settles `d / r` (relative) behind it: `equilibrium_tracking_lag` reads that from the last logged interval. A run
whose lag exceeds the tolerance cannot be within it, however many e-foldings it lasted.

The dependence of the final rho on the initialisation (Fig. 3) is read as the share of the initial log-spread of
rho over the initialisations that is kept at the end (`kept_log_spread`). Its regime ties the relaxation to the
claim's threshold: `spread_relaxation_tolerance(share, D0)` is the largest relative distance `|rho / rho_eq - 1|`
per run at which the residual of the relaxation alone keeps the final log-spread within `share * D0` (runs that
are further from their equilibria may be kept apart by that residual, whatever weight decay does), and
`init_dependence_regimes` gives the clocks of the runs with weight decay (the claim), of those without it (the
control: their relaxation, at the rate 2 eta M, must be done too, or a spread they keep says only that they
were short), each run's relaxation towards the equilibrium it ends at and its tracking lag behind that moving
equilibrium (`equilibrium_tracking_regime`), both to the same tolerance, and the weight-decay time;
`lowrank.core.regimes.furthest_from_done` picks the one that decides.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["steps_per_epoch", "rho_relaxation_steps", "relaxations_needed", "weight_decay_steps",
           "accumulated_weight_decay", "rho_relaxation_regime", "weight_decay_regime",
           "relaxation_rate", "logged_rho_relaxations", "initial_distance", "rho_relaxation_regime_logged",
           "equilibrium_tracking_lag", "equilibrium_tracking_regime", "log_spread", "kept_log_spread",
           "spread_relaxation_tolerance", "init_dependence_regimes"]


def _nonneg(value, name):
    v = float(value)
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return v


def steps_per_epoch(n: int, batch_size: int | None) -> int:
    """Optimiser steps per epoch: 1 for full-batch gradient descent (`batch_size` None or 0), else ceil(n / B)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 0):
        raise ValueError(f"batch_size must be a non-negative integer or None, got {batch_size!r}")
    return 1 if not batch_size else math.ceil(n / min(batch_size, n))


def rho_relaxation_steps(M: float, lam: float, rho_lr: float) -> float:
    """Steps for the distance of rho to `mu / (M + lam)` to fall by a factor e under gradient descent with
    step `rho_lr` at fixed margins (Eq. 6 discretised): `-1 / log|1 - 2 rho_lr (M + lam)|`.

    Infinite when `M + lam = 0` (rho does not move) or when the step overshoots so that the distance does
    not shrink (`2 rho_lr (M + lam) >= 2`).
    """
    M, lam = _nonneg(M, "M"), _nonneg(lam, "lam")
    eta = _nonneg(rho_lr, "rho_lr")
    if not eta > 0:
        raise ValueError(f"rho_lr must be positive, got {rho_lr!r}")
    factor = abs(1 - 2 * eta * (M + lam))
    if factor >= 1:
        return math.inf
    if factor == 0:
        return 0.0  # one step lands on rho_eq
    return -1.0 / math.log(factor)


def relaxations_needed(initial_error: float, tolerance: float) -> float:
    """How many e-foldings take a distance `initial_error` below `tolerance`: `log(initial / tolerance)`,
    0 when it is already within."""
    e0, tol = _nonneg(initial_error, "initial_error"), _nonneg(tolerance, "tolerance")
    if not tol > 0:
        raise ValueError(f"tolerance must be positive, got {tolerance!r}")
    return max(0.0, math.log(e0 / tol)) if e0 > 0 else 0.0


def weight_decay_steps(lam: float, rho_lr: float) -> float:
    """The weight-decay time `1 / (rho_lr * lam)` in steps (infinite for `lam = 0`)."""
    lam, eta = _nonneg(lam, "lam"), _nonneg(rho_lr, "rho_lr")
    return math.inf if lam * eta == 0 else 1.0 / (eta * lam)


def accumulated_weight_decay(steps: int, lam: float, rho_lr: float) -> float:
    """`steps * rho_lr * lam`: how many weight-decay times a run of `steps` steps lasts."""
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    return steps * _nonneg(rho_lr, "rho_lr") * _nonneg(lam, "lam")


def rho_relaxation_regime(*, M0: float, lam: float, rho_lr: float, steps: int, initial_error: float,
                          tolerance: float) -> dict:
    """The regime of "rho reaches mu / (M + lam)": `steps / rho_relaxation_steps(M0, lam, rho_lr)` e-foldings
    done (0 when rho cannot relax), against `relaxations_needed(initial_error, tolerance)`. `M0` is the
    initial M (a lower bound on M during training, so the time is an upper bound). Fields of
    `lowrank.book.verdicts.Regime`."""
    tau = rho_relaxation_steps(M0, lam, rho_lr)
    return {"quantity": f"e-foldings of ρ's distance to its equilibrium μ/(M + λ) in {steps} steps of size {rho_lr:g} "
                        f"(relaxation time {tau:.4g} steps at the initial M = {M0:.3g}, λ = {lam:g}; Eq. 6)",
            "value": steps / tau if math.isfinite(tau) and tau > 0 else (math.inf if tau == 0 else 0.0),
            "needed": relaxations_needed(initial_error, tolerance),
            "origin": f"the log of the initial relative distance {initial_error:.3g} over the tolerance {tolerance:g}"}


def weight_decay_regime(*, steps: int, lam: float, rho_lr: float, needed: float = 1.0,
                        origin: str = "one weight-decay time 1/(ηλ), η the step size of ρ, fixed in advance") -> dict:
    """The regime of a weight-decay mechanism: `accumulated_weight_decay(steps, lam, rho_lr)` against `needed`.
    Fields of `lowrank.book.verdicts.Regime`."""
    return {"quantity": f"accumulated weight decay, steps × η × λ ({steps} steps, step size of ρ η = {rho_lr:g}, "
                        f"λ = {lam:g})",
            "value": accumulated_weight_decay(steps, lam, rho_lr), "needed": float(needed), "origin": origin}


def relaxation_rate(M: float, lam: float, rho_lr: float) -> float:
    """E-foldings per step of rho's distance to `mu / (M + lam)`: `1 / rho_relaxation_steps` (0 when rho does
    not relax, infinite when one step lands on the equilibrium)."""
    tau = rho_relaxation_steps(M, lam, rho_lr)
    return 0.0 if math.isinf(tau) else (math.inf if tau == 0 else 1.0 / tau)


def logged_rho_relaxations(epochs, M, *, lam: float, rho_lr: float, steps_per_epoch: int) -> float:
    """E-foldings of rho's relaxation accumulated over a run's logged trajectory: the sum over logged
    intervals `[e_i, e_{i+1}]` of `(e_{i+1} - e_i) * steps_per_epoch * relaxation_rate(min(M_i, M_{i+1}))`.
    `epochs` and `M` are the history's columns (increasing epochs, the first the run's start)."""
    e = np.asarray(epochs, dtype=float)
    m = np.asarray(M, dtype=float)
    if e.ndim != 1 or e.shape != m.shape or len(e) < 2:
        raise ValueError("epochs and M must be 1-D of the same length >= 2")
    if not (np.all(np.isfinite(e)) and np.all(np.diff(e) > 0)):
        raise ValueError("epochs must be finite and increasing")
    if not isinstance(steps_per_epoch, int) or steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be a positive integer, got {steps_per_epoch!r}")
    total = 0.0
    for de, m_lo in zip(np.diff(e), np.minimum(m[:-1], m[1:])):
        total += de * steps_per_epoch * relaxation_rate(float(m_lo), lam, rho_lr)
    return float(total)


def initial_distance(history, *, need_from: str = "initial") -> float:
    """rho's starting distance to its equilibrium, relative, from a logged `history`:
    `|rho_0 / rho_eq,0 - 1|` for `need_from="initial"` (the equilibrium of the untrained margins), or
    `|rho_0 / rho_eq,T - 1|` for `need_from="final"`: the distance from the starting rho to the equilibrium the
    logged trajectory ends at (columns `rho`, `rho_eq`). The untrained margins are tiny (M grows 100-fold and
    more), so `rho_eq,0` is an equilibrium the run leaves within its first logs: the distance rho has to cover is
    the one to where its equilibrium goes, which only the trajectory says."""
    h = history.sort_values("epoch")
    first, last = h.iloc[0], h.iloc[-1]
    if need_from == "initial":
        return abs(float(first.rho_over_rho_eq) - 1)
    if need_from == "final":
        return abs(float(first.rho) / float(last.rho_eq) - 1)
    raise ValueError(f"need_from must be 'initial' or 'final', got {need_from!r}")


def rho_relaxation_regime_logged(history, *, lam: float, rho_lr: float, steps_per_epoch: int, tolerance: float,
                                 label: str = "", need_from: str = "initial") -> dict:
    """The regime of "rho reaches mu / (M + lam)" of one trained run, from its logged `history` (columns
    `epoch`, `M`, `rho_over_rho_eq`, and `rho`, `rho_eq` for `need_from="final"`): `logged_rho_relaxations`
    against `relaxations_needed(initial_distance(history, need_from=need_from), tolerance)`: the need from the
    initial equilibrium (`"initial"`) or from the one the logged trajectory ends at (`"final"`). Fields of
    `lowrank.book.verdicts.Regime`, plus `details` (initial and final M, the e-foldings the initial M alone would
    give, both initial distances, and the measured end state |rho / rho_eq - 1|)."""
    h = history.sort_values("epoch")
    first, last = h.iloc[0], h.iloc[-1]
    steps = int(round((float(last.epoch) - float(first.epoch)) * steps_per_epoch))
    value = logged_rho_relaxations(h.epoch.to_numpy(), h.M.to_numpy(), lam=lam, rho_lr=rho_lr,
                                   steps_per_epoch=steps_per_epoch)
    e0 = initial_distance(h, need_from=need_from)
    at = f" ({label})" if label else ""
    to = "ρ_eq at the start" if need_from == "initial" else "ρ_eq at the end of the logged trajectory"
    return {"quantity": f"e-foldings of ρ's distance to μ/(M + λ){at} over the logged trajectory of M "
                        f"({len(h)} logs, {steps} steps of size {rho_lr:g}, λ = {lam:g}; M from {float(first.M):.3g} "
                        f"to {float(last.M):.3g}; Eq. 6)",
            "value": value, "needed": relaxations_needed(e0, tolerance),
            "origin": f"the log of the initial relative distance {e0:.3g} (ρ₀ to {to}) over the tolerance {tolerance:g}",
            "details": {"label": label, "M_initial": float(first.M), "M_final": float(last.M), "steps": steps,
                        "need_from": need_from, "initial_distance_to_initial_rho_eq": initial_distance(h),
                        **({"initial_distance_to_final_rho_eq": initial_distance(h, need_from="final")}
                           if need_from == "final" else {}),
                        "efoldings_at_initial_M": steps * relaxation_rate(float(first.M), lam, rho_lr),
                        "final_abs_rho_over_rho_eq_minus_1": abs(float(last.rho_over_rho_eq) - 1)}}


def _tracking_rates(history, *, lam: float, rho_lr: float, steps_per_epoch: int) -> tuple[float, float]:
    """(drift, rate) over the last logged interval of `history`: `|log(rho_eq,T / rho_eq,T-1)|` per step and
    `relaxation_rate` at the smaller end of `M` (e-foldings per step)."""
    h = history.sort_values("epoch")
    if len(h) < 2:
        raise ValueError("the history needs at least two logged rows")
    if not isinstance(steps_per_epoch, int) or steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be a positive integer, got {steps_per_epoch!r}")
    prev, last = h.iloc[-2], h.iloc[-1]
    steps = (float(last.epoch) - float(prev.epoch)) * steps_per_epoch
    drift = abs(math.log(float(last.rho_eq) / float(prev.rho_eq))) / steps
    return drift, relaxation_rate(min(float(prev.M), float(last.M)), lam, rho_lr)


def equilibrium_tracking_lag(history, *, lam: float, rho_lr: float, steps_per_epoch: int) -> float:
    """The relative distance by which rho trails its moving equilibrium at the end of a run: the drift of
    `log rho_eq` per step over the last logged interval over the relaxation rate there (`relaxation_rate` at
    the smaller end of `M`), `|d log rho_eq / d step| / r`; infinite when rho does not relax. `history` has
    the columns `epoch`, `M`, `rho_eq` (at least two rows)."""
    drift, rate = _tracking_rates(history, lam=lam, rho_lr=rho_lr, steps_per_epoch=steps_per_epoch)
    if rate == 0:
        return math.inf
    return drift / rate


def equilibrium_tracking_regime(history, *, lam: float, rho_lr: float, steps_per_epoch: int, tolerance: float,
                                label: str = "") -> dict:
    """The regime of "rho keeps up with its moving equilibrium" of one run: the relaxation rate at the end
    (e-foldings per step over the last logged interval, `relaxation_rate` at its smaller `M`) against the rate
    that keeps the tracking lag within `tolerance`, the drift of `log rho_eq` per step there over `tolerance`.
    Reached exactly when `equilibrium_tracking_lag(history, ...) <= tolerance` (a need of 0, an equilibrium that
    no longer moves, is done). Fields of `lowrank.book.verdicts.Regime`, plus `details` (the lag, the drift)."""
    t = _nonneg(tolerance, "tolerance")
    if not t > 0:
        raise ValueError(f"tolerance must be positive, got {tolerance!r}")
    drift, rate = _tracking_rates(history, lam=lam, rho_lr=rho_lr, steps_per_epoch=steps_per_epoch)
    at = f" ({label})" if label else ""
    lag = math.inf if rate == 0 else drift / rate
    return {"quantity": f"e-foldings per step of ρ's relaxation at the end of the run{at}, against the drift of its "
                        f"equilibrium (tracking lag drift / rate = {lag:.3g}; λ = {lam:g}, step size {rho_lr:g}; Eq. 6)",
            "value": rate, "needed": drift / t,
            "origin": f"the drift of log ρ_eq per step over the last logged interval ({drift:.3g}) over the tolerance "
                      f"{t:.3g}: a first-order lag settles drift / rate behind its target",
            "details": {"label": label, "tracking_lag": lag, "drift_per_step": drift, "rate_per_step": rate}}


def log_spread(values) -> float:
    """`log(max / min)` of positive, finite values (0 for a single value)."""
    v = np.asarray(values, dtype=float).ravel()
    if v.size == 0 or not (np.all(np.isfinite(v)) and np.all(v > 0)):
        raise ValueError(f"need at least one positive finite value, got {values!r}")
    return float(np.log(v.max() / v.min()))


def kept_log_spread(initial, final) -> float:
    """The share of the initial log-spread kept at the end: `log_spread(final) / log_spread(initial)`, the
    values of one quantity (rho) over the same runs (e.g. the initialisations) at the start and at the end.
    ValueError when the initial values do not differ (no spread to keep)."""
    d0 = log_spread(initial)
    if len(np.asarray(initial).ravel()) != len(np.asarray(final).ravel()):
        raise ValueError("initial and final must hold one value per run each")
    if not d0 > 0:
        raise ValueError("the initial values do not differ: there is no spread to keep")
    return log_spread(final) / d0


def spread_relaxation_tolerance(share: float, initial_log_spread: float) -> float:
    """The relative distance `|rho / rho_eq - 1|` each run may keep to its equilibrium so that the residual of the
    relaxation alone cannot spread the final rho by more than `share * initial_log_spread` (in log):
    `tanh(share * D0 / 2)`. With every run within `t` of its equilibrium, `log rho` lies within
    `[log(1 - t), log(1 + t)]` of `log rho_eq`, a band of width `log((1 + t) / (1 - t)) = 2 artanh(t)`; runs with
    one equilibrium reach that width (one at `1 + t`, one at `1 - t`), so `t = tanh(share * D0 / 2)` is the
    largest tolerance whose band fits the share (any number of runs)."""
    s, d0 = _nonneg(share, "share"), _nonneg(initial_log_spread, "initial_log_spread")
    if not (s > 0 and d0 > 0):
        raise ValueError(f"share and initial_log_spread must be positive, got {share!r}, {initial_log_spread!r}")
    return math.tanh(s * d0 / 2)


def init_dependence_regimes(histories: dict, *, lam: float, rho_lr: float, steps_per_epoch: int, steps: int,
                            tolerance: float) -> list[dict]:
    """The clocks of "with weight decay the final rho forgets the initialisation; without it, not" from the runs:
    `histories` maps `(lam_k, rho_0)` to a logged history for `lam_k` in {`lam`, 0}. Every run must end within
    `tolerance` of the equilibrium its trajectory ends at, which takes two clocks per run (both to `tolerance`):

    - `clock="relaxation"`: `rho_relaxation_regime_logged` from rho_0's distance to that equilibrium (the
      e-foldings of the relaxation towards a fixed target);
    - `clock="tracking"`: `equilibrium_tracking_regime`, the lag by which rho trails an equilibrium that is
      still moving at the end (M grows during training), at most `tolerance`: enough e-foldings do not bound it.

    `role="claim"` for the runs with weight decay `lam` (rate 2 eta (M + lam)), `role="control"` for those without
    (rate 2 eta M: the control's runs must have relaxed too, or the spread they keep says only that they were
    short); and `role="weight decay"`, `clock="weight decay"`: the weight-decay time, `steps * eta * lam >= 1/2`
    (one e-folding of rho under the penalty `lam rho^2` alone, `(1 - 2 eta lam)^steps <= 1/e`). Returns regime
    dicts (`lowrank.book.verdicts.Regime` fields, plus `role`, `clock`, `label` and `reached`), in the order of
    `histories`, relaxation before tracking, the weight-decay time last.
    """
    if not lam > 0:
        raise ValueError(f"lam must be the positive weight decay of the claim's runs, got {lam!r}")
    out = []
    for (lam_k, r0), h in histories.items():
        if lam_k not in (lam, 0.0):
            raise ValueError(f"histories hold lambda {lam_k!r}: only {lam!r} (the claim) and 0 (the control)")
        role = "claim" if lam_k > 0 else "control"
        label = f"{role}: λ = {lam_k:g}, ρ₀ = {r0:g}"
        relax = rho_relaxation_regime_logged(h, lam=lam_k, rho_lr=rho_lr, steps_per_epoch=steps_per_epoch,
                                             tolerance=tolerance, label=label, need_from="final")
        track = equilibrium_tracking_regime(h, lam=lam_k, rho_lr=rho_lr, steps_per_epoch=steps_per_epoch,
                                            tolerance=tolerance, label=label)
        for clock, r in (("relaxation", relax), ("tracking", track)):
            out.append({k: r[k] for k in ("quantity", "value", "needed", "origin")}
                       | {"role": role, "clock": clock, "label": label})
    if not {"claim", "control"} <= {r["role"] for r in out}:
        raise ValueError("init_dependence_regimes needs runs with weight decay (the claim) and without (the control)")
    out.append(weight_decay_regime(steps=steps, lam=lam, rho_lr=rho_lr, needed=0.5,
                                   origin="one e-folding of ρ under the penalty λρ² alone, (1 − 2ηλ)^steps ≤ 1/e, "
                                          "i.e. steps × η × λ ≥ 1/2")
               | {"role": "weight decay", "clock": "weight decay", "label": "weight decay"})
    return [r | {"reached": r["value"] >= r["needed"]} for r in out]
