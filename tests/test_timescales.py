"""Time scales of the square-loss mechanisms (lowrank.square.timescales) and the pages' set-up
(lowrank.square.pages.page_setup), against independent computations."""

import math

import numpy as np
import pytest
import torch

from lowrank.core import regimes
from lowrank.square import pages, timescales, training


def _simulate_rho(mu, M, lam, eta, rho0, steps):
    """Gradient descent on L(rho) = 1 - 2 rho mu + rho^2 (M + lam), by autograd (independent of the formula)."""
    rho = torch.tensor(float(rho0), dtype=torch.float64, requires_grad=True)
    out = []
    for _ in range(steps):
        loss = 1 - 2 * rho * mu + rho**2 * (M + lam)
        (g,) = torch.autograd.grad(loss, rho)
        with torch.no_grad():
            rho -= eta * g
        out.append(float(rho.detach()))
    return np.array(out)


@pytest.mark.parametrize("M,lam,eta", [(1e-3, 1e-3, 5.0), (0.02, 0.0, 3.0), (0.0, 1e-2, 2.0)])
def test_relaxation_steps_match_simulated_gradient_descent(M, lam, eta):
    mu, rho0 = 0.05, 30.0
    tau = timescales.rho_relaxation_steps(M, lam, eta)
    steps = int(math.ceil(5 * tau))
    rho = _simulate_rho(mu, M, lam, eta, rho0, steps)
    target = mu / (M + lam)
    err = np.abs(rho - target)
    e0 = abs(rho0 - target)
    # after k steps the distance is e0 * exp(-k / tau), to float64 round-off
    k = np.arange(1, steps + 1)
    assert np.allclose(err, e0 * np.exp(-k / tau), rtol=1e-8, atol=1e-12)
    # and the small-step limit is the gradient flow's 1 / (2 eta (M + lam))
    assert tau == pytest.approx(1 / (2 * eta * (M + lam)), rel=2 * eta * (M + lam))


def test_relaxation_steps_edge_cases_and_bad_input():
    assert timescales.rho_relaxation_steps(0.0, 0.0, 1.0) == math.inf
    assert timescales.rho_relaxation_steps(0.5, 0.5, 1.0) == math.inf  # factor |1 - 2| = 1: oscillates
    assert timescales.rho_relaxation_steps(0.25, 0.0, 2.0) == 0.0  # lands on rho_eq in one step
    for bad in (dict(M=-1, lam=0, rho_lr=1), dict(M=0, lam=float("nan"), rho_lr=1), dict(M=0, lam=0, rho_lr=0)):
        with pytest.raises(ValueError):
            timescales.rho_relaxation_steps(**bad)


def test_relaxations_needed_counts_e_foldings():
    assert timescales.relaxations_needed(math.e**3, 1.0) == pytest.approx(3.0)
    assert timescales.relaxations_needed(0.005, 0.01) == 0.0
    assert timescales.relaxations_needed(0.0, 0.01) == 0.0
    with pytest.raises(ValueError, match="tolerance"):
        timescales.relaxations_needed(1.0, 0.0)


def test_weight_decay_time_is_the_e_folding_of_rho_under_the_penalty_alone():
    lam, eta = 1e-3, 2.0
    T = timescales.weight_decay_steps(lam, eta)
    assert T == pytest.approx(500.0)
    rho = _simulate_rho(0.0, 0.0, lam, eta, 1.0, int(T))  # mu = M = 0: the penalty alone
    # (1 - 2 eta lam)^T -> exp(-2) as the step shrinks; here within 1 %
    assert rho[-1] == pytest.approx(math.exp(-2), rel=1e-2)
    assert timescales.weight_decay_steps(0.0, eta) == math.inf
    assert timescales.accumulated_weight_decay(1000, lam, eta) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        timescales.accumulated_weight_decay(-1, lam, eta)


def test_steps_per_epoch():
    assert timescales.steps_per_epoch(100, None) == 1
    assert timescales.steps_per_epoch(100, 0) == 1
    assert timescales.steps_per_epoch(100, 16) == 7
    assert timescales.steps_per_epoch(10, 16) == 1
    with pytest.raises(ValueError):
        timescales.steps_per_epoch(0, 4)


def test_page_setup_trains_as_train_network_and_reads_the_initial_state():
    setup = pages.page_setup("digits", [1, 2], arch="mlp", arch_kwargs={"widths": [16]}, input_shape=[64],
                                max_train=40, max_test=20, epochs=3, lr=0.1, rho_lr=0, batch_size=0, log_every=1,
                                nc=False, dtype="float64")
    direct = training.load_task("digits", [1, 2], max_train=40, max_test=20, shape=[64])
    assert torch.equal(setup.data.x_train, direct.x_train) and torch.equal(setup.data.y_train, direct.y_train)
    run = setup.train(rho_init=2.0, seed=3, lam=1e-3, progress=False)
    ref = training.train_network(direct, arch="mlp", arch_kwargs={"widths": [16]}, rho_init=2.0, seed=3, epochs=3,
                                 lr=0.1, lam=1e-3, log_every=1, nc=False, dtype="float64", progress=False)
    assert np.allclose(run.history.rho, ref.history.rho, rtol=0, atol=0)
    row = setup.initial_row(rho_init=2.0, seed=3, lam=1e-3)
    assert row["rho"] == pytest.approx(ref.history.rho.iloc[0])
    assert row["M"] == pytest.approx(ref.history.M.iloc[0], rel=1e-12)
    assert setup.steps() == 3 and setup.steps(batch_size=16) == 9
    with pytest.raises(ValueError, match="unknown training options"):
        pages.page_setup("digits", [1, 2], arch="mlp", max_train=40, epoch=3)


def test_shuffle_labels_permutes_training_labels_only():
    data = training.load_task("digits", [0, 1, 2], max_train=60, max_test=20)
    shuffled = training.shuffle_labels(data, seed=1)
    assert torch.equal(shuffled.x_train, data.x_train) and torch.equal(shuffled.y_test, data.y_test)
    assert torch.equal(torch.sort(shuffled.y_train).values, torch.sort(data.y_train).values)
    assert not torch.equal(shuffled.y_train, data.y_train)
    assert torch.equal(training.shuffle_labels(data, seed=1).y_train, shuffled.y_train)


def _trained_pair(classes, lam=1e-3, epochs=5):
    setup = pages.page_setup("digits", classes, arch="mlp", arch_kwargs={"widths": [12, 10]}, input_shape=[64],
                                max_train=30, max_test=10, epochs=epochs, lr=0.1, rho_lr=1.0, log_every=epochs,
                                nc=False, dtype="float64", num_outputs=1 if len(classes) == 2 else len(classes))
    return setup, setup.train(rho_init=3.0, seed=1, lam=lam, progress=False).model


def test_rho_stationary_point_is_the_minimiser_of_the_loss_in_rho():
    from scipy.optimize import minimize_scalar

    setup, model = _trained_pair([1, 2])
    lam = 1e-3

    def loss(r):  # the full network's loss with rho replaced, by its forward pass
        with torch.no_grad():
            model.rho.fill_(r)
            y = setup.data.y_train.double()
            return float(((model(setup.data.x_train.double()) - y) ** 2).mean() + lam * r**2)

    rho_saved = float(model.rho.detach())
    best = minimize_scalar(loss, bracket=(0.0, 50.0), tol=1e-12).x
    with torch.no_grad():
        model.rho.fill_(rho_saved)
    found = training.rho_stationary_point(model, setup.data, lam)
    assert found == pytest.approx(best, rel=1e-6)
    row = training.evaluate(model, training._to_device(model, setup.data, torch.device("cpu"), torch.float64), lam,
                            nc=False)[0]
    assert found == pytest.approx(row["rho_eq"], rel=1e-10)  # Eq. 7 from the margins


def test_classifier_gradient_matches_finite_differences_and_its_row_sum_ignores_labels():
    setup, model = _trained_pair([0, 1, 2])
    lam = 1e-3
    G = training.classifier_gradient(model, setup.data, lam)
    h = model.features(setup.data.x_train.double()).detach()
    T = training.train_targets(setup.data.y_train, 3)[0]
    V0, rho = model.classifier().detach().clone(), float(model.rho.detach())

    def loss(V):
        return float(((rho * h @ V.T - T) ** 2).sum(1).mean())

    step = 1e-6
    for c, j in ((0, 0), (2, 5)):
        E = torch.zeros_like(V0)
        E[c, j] = step
        assert float(G[c, j]) == pytest.approx((loss(V0 + E) - loss(V0 - E)) / (2 * step), rel=1e-5, abs=1e-10)
    shuffled = training.shuffle_labels(setup.data, seed=4)
    Gs = training.classifier_gradient(model, shuffled, lam)
    assert torch.allclose(G.sum(0), Gs.sum(0), atol=1e-14)  # centred targets sum to 0 for any label
    assert not torch.allclose(G[0], Gs[0], atol=1e-6)  # a single row does depend on the labels


def test_per_sample_gradients_have_rank_one_and_pairs_rank_two():
    setup, model = _trained_pair([1, 2])
    table = training.per_sample_gradient_ranks(model, setup.data, max_samples=4)
    one = table[table.kind == "one sample"]
    two = table[table.kind == "two samples"]
    assert set(one["layer"]) == {1, 2, 3} and len(one) == 12
    assert one["rank"].max() == 1
    hidden_two = two[two.layer == 1]
    assert hidden_two["rank"].max() == 2
    # the model is left as it was: its forward again reads v / ||v||
    assert "direction" not in vars(model.body[0])


def test_regimes_compare_done_with_needed():
    r = timescales.rho_relaxation_regime(M0=0.0, lam=1e-3, rho_lr=1.0, steps=1000, initial_error=math.e**2,
                                         tolerance=1.0)
    assert r["value"] == pytest.approx(1000 / timescales.rho_relaxation_steps(0.0, 1e-3, 1.0))
    assert r["needed"] == pytest.approx(2.0)
    assert timescales.rho_relaxation_regime(M0=0.0, lam=0.0, rho_lr=1.0, steps=10, initial_error=1.0,
                                            tolerance=0.1)["value"] == 0.0
    w = timescales.weight_decay_regime(steps=400, lam=1e-3, rho_lr=10.0)
    assert w["value"] == pytest.approx(4.0) and w["needed"] == 1.0


def _simulate_rho_varying_M(mu, Ms, lam, eta, rho0):
    """Gradient descent on L(rho) = 1 - 2 rho mu + rho^2 (M_t + lam) with M_t changing every step, by autograd;
    returns the log-distance to the moving equilibrium's contraction, i.e. the e-foldings of the error
    e_{t+1} = (1 - 2 eta (M_t + lam)) e_t measured against a frozen target (mu / (M_t + lam) recomputed)."""
    efold = 0.0
    for M in Ms:
        target = mu / (M + lam)
        rho = torch.tensor(float(rho0), dtype=torch.float64, requires_grad=True)
        loss = 1 - 2 * rho * mu + rho**2 * (M + lam)
        (g,) = torch.autograd.grad(loss, rho)
        new = float(rho.detach() - eta * g)
        efold += math.log(abs(rho0 - target) / abs(new - target))
    return efold


def test_logged_relaxations_match_stepwise_contraction_and_bound_it_from_below():
    lam, eta, spe = 1e-3, 2.0, 3
    epochs = np.array([0, 10, 20, 40, 80])
    M = np.array([1e-5, 1e-4, 1e-3, 5e-3, 2e-2])  # grows as in training
    # per-step M: geometric interpolation between the logs (monotone), simulated step by step
    per_step = np.concatenate([np.geomspace(a, b, (e1 - e0) * spe, endpoint=False)
                               for a, b, e0, e1 in zip(M[:-1], M[1:], epochs[:-1], epochs[1:])])
    exact = _simulate_rho_varying_M(0.05, per_step, lam, eta, rho0=30.0)
    got = timescales.logged_rho_relaxations(epochs, M, lam=lam, rho_lr=eta, steps_per_epoch=spe)
    assert got <= exact + 1e-9  # a lower bound for monotone M
    assert got >= 0.5 * exact  # and not a vacuous one at this logging density
    # constant M: exactly steps / tau
    const = timescales.logged_rho_relaxations(epochs, np.full(5, 1e-3), lam=lam, rho_lr=eta, steps_per_epoch=spe)
    assert const == pytest.approx(80 * spe / timescales.rho_relaxation_steps(1e-3, lam, eta), rel=1e-12)
    # far more than the initial M alone would give
    assert got > 2 * 80 * spe / timescales.rho_relaxation_steps(M[0], lam, eta)
    with pytest.raises(ValueError):
        timescales.logged_rho_relaxations([0, 0], [1e-3, 1e-3], lam=lam, rho_lr=eta, steps_per_epoch=1)


def test_logged_regime_reads_the_history():
    import pandas as pd

    h = pd.DataFrame({"epoch": [0, 50, 100], "M": [1e-4, 1e-2, 2e-2], "rho_over_rho_eq": [20.0, 1.5, 1.01]})
    r = timescales.rho_relaxation_regime_logged(h, lam=0.0, rho_lr=5.0, steps_per_epoch=1, tolerance=0.1)
    assert r["value"] == pytest.approx(50 / timescales.rho_relaxation_steps(1e-4, 0, 5.0)
                                       + 50 / timescales.rho_relaxation_steps(1e-2, 0, 5.0))
    assert r["needed"] == pytest.approx(math.log(19 / 0.1))
    assert r["details"]["final_abs_rho_over_rho_eq_minus_1"] == pytest.approx(0.01)
    assert r["details"]["efoldings_at_initial_M"] < r["value"]


def test_weight_decay_regime_counts_efoldings_of_the_penalty_alone():
    # hand computation: under L = lam rho^2 alone, rho_{t+1} = (1 - 2 eta lam) rho_t; after 2500 steps at
    # eta = 0.1, lam = 1e-3: 2500 * 0.1 * 1e-3 = 0.25 weight-decay times, log(rho_0 / rho_T) = 2500 * -log(0.9998)
    w = timescales.weight_decay_regime(steps=2500, lam=1e-3, rho_lr=0.1, needed=0.5, origin="one e-folding")
    assert w["value"] == pytest.approx(0.25) and w["needed"] == 0.5
    efold = -2500 * math.log(1 - 2 * 0.1 * 1e-3)
    assert efold == pytest.approx(2 * w["value"], rel=1e-3)  # steps * eta * lam >= 1/2 <=> one e-folding
    assert (efold >= 1) == (w["value"] >= w["needed"])
    assert timescales.weight_decay_regime(steps=5001, lam=1e-3, rho_lr=0.1, needed=0.5)["value"] > 0.5


def test_tracking_lag_matches_a_simulated_moving_equilibrium():
    import pandas as pd

    # rho follows gradient descent on 1 - 2 rho mu_t + rho^2 (M + lam) with M fixed and mu_t growing
    # geometrically, so rho_eq = mu_t / (M + lam) moves by a factor (1 + g) per step; after the transient, rho
    # trails it by a relative distance close to d / r (d = log(1 + g), r = -log(1 - 2 eta (M + lam)))
    M, lam, eta, g = 1e-2, 1e-3, 2.0, 2e-4
    mu, rho, rows = 0.01, 0.0, []
    for t in range(4001):
        rho_eq = mu / (M + lam)
        if t % 100 == 0:
            rows.append({"epoch": t, "M": M, "rho_eq": rho_eq, "err": abs(rho / rho_eq - 1)})
        rho = rho - eta * (-2 * mu + 2 * rho * (M + lam))
        mu *= 1 + g
    h = pd.DataFrame(rows)
    lag = timescales.equilibrium_tracking_lag(h, lam=lam, rho_lr=eta, steps_per_epoch=1)
    assert lag == pytest.approx(math.log(1 + g) / -math.log(1 - 2 * eta * (M + lam)), rel=1e-9)
    assert lag == pytest.approx(h.err.iloc[-1], rel=0.05)  # the measured lag of the simulation
    assert timescales.equilibrium_tracking_lag(h, lam=0.0, rho_lr=eta, steps_per_epoch=1) > lag
    frozen = h.assign(M=0.0)
    assert timescales.equilibrium_tracking_lag(frozen, lam=0.0, rho_lr=eta, steps_per_epoch=1) == math.inf


def test_tracking_regime_is_the_lag_against_the_tolerance_by_hand():
    """The tracking clock is reached exactly when the lag is within the tolerance, whatever the e-foldings: a run
    that relaxed for 6 e-foldings at M = 0.01 (tolerance 0.1 needs log(1 / 0.1) = 2.3 from a distance 1) while
    rho_eq grew by a factor 1.1 over its last 10 steps: drift log(1.1) / 10 = 0.00953 per step, rate
    -log(1 - 2 * 0.5 * 0.01) = 0.01005, lag 0.948 > 0.1."""
    import pandas as pd

    M, eta, tol = 1e-2, 0.5, 0.1
    h = pd.DataFrame({"epoch": [0, 590, 600], "M": [M] * 3, "rho": [2.0, 1.0, 1.0], "rho_eq": [1.0, 1.0, 1.1]})
    h["rho_over_rho_eq"] = h.rho / h.rho_eq
    relax = timescales.rho_relaxation_regime_logged(h, lam=0.0, rho_lr=eta, steps_per_epoch=1, tolerance=tol,
                                                    need_from="initial")
    assert relax["value"] == pytest.approx(600 * -math.log(0.99)) and relax["needed"] == pytest.approx(math.log(10))
    assert relax["value"] >= relax["needed"]  # enough e-foldings ...
    r = timescales.equilibrium_tracking_regime(h, lam=0.0, rho_lr=eta, steps_per_epoch=1, tolerance=tol, label="x")
    drift, rate = math.log(1.1) / 10, -math.log(1 - 2 * eta * M)
    assert r["value"] == pytest.approx(rate, rel=1e-12) and r["needed"] == pytest.approx(drift / tol, rel=1e-12)
    assert r["details"]["tracking_lag"] == pytest.approx(drift / rate, rel=1e-12) == pytest.approx(0.9483, abs=1e-4)
    assert r["value"] < r["needed"]  # ... and still too far behind: the tracking clock is not reached
    assert regimes.furthest_from_done([relax, r]) is r
    assert regimes.share_done(r) == pytest.approx(tol / (drift / rate), rel=1e-12)
    # a tolerance of the lag or more is reached; the clock agrees with equilibrium_tracking_lag
    lag = timescales.equilibrium_tracking_lag(h, lam=0.0, rho_lr=eta, steps_per_epoch=1)
    for t in (0.5 * lag, 0.999 * lag, 1.001 * lag, 2 * lag):
        c = timescales.equilibrium_tracking_regime(h, lam=0.0, rho_lr=eta, steps_per_epoch=1, tolerance=t)
        assert (c["value"] >= c["needed"]) == (lag <= t)
    # an equilibrium that stands still needs 0 (done); rho that does not relax (M = 0, lambda = 0) has rate 0
    still = timescales.equilibrium_tracking_regime(h.assign(rho_eq=1.0), lam=0.0, rho_lr=eta, steps_per_epoch=1,
                                                   tolerance=tol)
    assert still["needed"] == 0 and regimes.share_done(still) == math.inf
    frozen = timescales.equilibrium_tracking_regime(h.assign(M=0.0), lam=0.0, rho_lr=eta, steps_per_epoch=1,
                                                    tolerance=tol)
    assert frozen["value"] == 0 and frozen["value"] < frozen["needed"] and frozen["details"]["tracking_lag"] == math.inf
    with pytest.raises(ValueError):
        timescales.equilibrium_tracking_regime(h, lam=0.0, rho_lr=eta, steps_per_epoch=1, tolerance=0.0)


def test_initial_margins_are_the_untrained_networks_and_match_its_row():
    S = pages.page_setup("digits", [1, 2], arch="mlp", arch_kwargs={"widths": [16]}, max_train=60, max_test=20,
                         input_shape=[64], seed=0, num_outputs=1, epochs=1, lr=0.1, batch_size=0, nc=False,
                         dtype="float64")
    fbar = S.initial_margins(rho_init=2.0, seed=0)
    row = S.initial_row(rho_init=2.0, seed=0, lam=0.0)
    assert fbar.shape == (60,)
    assert fbar.mean() == pytest.approx(row["mu"], rel=1e-12) and (fbar**2).mean() == pytest.approx(row["M"], rel=1e-12)
    # independent: y_n f_V(x_n) from the model's own forward, rho divided out
    model = S.build(rho_init=2.0, seed=0).double()
    with torch.no_grad():
        out = model(torch.as_tensor(S.data.x_train, dtype=torch.float64)).reshape(-1) / float(model.rho)
    y = np.where(np.asarray(S.data.y_train) == 1, 1.0, -1.0)
    assert np.allclose(fbar, y * out.numpy(), rtol=1e-10, atol=1e-14)


def _steps_within(rho0, targets, *, M, lam, eta, tolerance):
    """Steps of gradient descent on rho, rho <- rho - eta * 2 (rho (M + lam) - mu_t) with mu_t = targets[t] (M + lam),
    i.e. towards the equilibrium targets[t], until |rho / targets[-1] - 1| <= tolerance (the target held at its
    last value after the list ends); counted one by one."""
    rho, t = rho0, 0
    while abs(rho / targets[min(t, len(targets) - 1)] - 1) > tolerance or t < len(targets):
        target = targets[min(t, len(targets) - 1)]
        rho = rho - eta * 2 * (M + lam) * (rho - target)
        t += 1
    return t


def test_need_from_the_final_equilibrium_counts_the_distance_rho_covers():
    import pandas as pd

    # the equilibrium of the untrained margins is small (M tiny) and moves within the first steps to where the
    # run ends: rho0 = 30 has to cover its distance to the final equilibrium 14, not to the initial 0.65
    lam, eta, M, tol = 1e-3, 0.1, 0.05, 0.5
    h = pd.DataFrame({"epoch": [0, 1, 2, 400], "M": [M] * 4, "rho": [30.0, 29.0, 28.0, 20.0],
                      "rho_eq": [0.65, 14.0, 14.0, 14.0]})
    h["rho_over_rho_eq"] = h.rho / h.rho_eq
    assert timescales.initial_distance(h) == pytest.approx(30 / 0.65 - 1)
    assert timescales.initial_distance(h, need_from="final") == pytest.approx(30 / 14 - 1)
    final = timescales.rho_relaxation_regime_logged(h, lam=lam, rho_lr=eta, steps_per_epoch=1, tolerance=tol,
                                                    need_from="final")
    initial = timescales.rho_relaxation_regime_logged(h, lam=lam, rho_lr=eta, steps_per_epoch=1, tolerance=tol)
    assert final["needed"] == pytest.approx(math.log((30 / 14 - 1) / tol))
    assert final["details"]["need_from"] == "final" and initial["needed"] > 3 * final["needed"]
    # step by step: the equilibrium jumps to 14 after one step; the steps until rho is within the tolerance of it
    # equal the need over the rate (up to the first step, taken towards the old target)
    steps = _steps_within(30.0, [0.65, 14.0], M=M, lam=lam, eta=eta, tolerance=tol)
    rate = timescales.relaxation_rate(M, lam, eta)
    assert abs(steps - final["needed"] / rate) <= 2
    assert steps < initial["needed"] / rate / 3  # the initial equilibrium overstates the run length needed
    with pytest.raises(ValueError):
        timescales.initial_distance(h, need_from="middle")


def test_kept_log_spread_by_hand():
    # initial rho 1 and 30 (log-spread log 30), final 2 and 6 (log 3): a share log 3 / log 30 is kept
    assert timescales.kept_log_spread([1.0, 30.0], [2.0, 6.0]) == pytest.approx(math.log(3) / math.log(30))
    assert timescales.kept_log_spread([30.0, 1.0], [6.0, 2.0]) == pytest.approx(math.log(3) / math.log(30))
    assert timescales.kept_log_spread([1.0, 30.0], [5.0, 5.0]) == 0.0  # the curves meet
    assert timescales.kept_log_spread([1.0, 4.0, 2.0], [1.0, 8.0, 3.0]) == pytest.approx(1.5)  # log 8 / log 4
    for bad in (([1.0, 1.0], [1.0, 2.0]), ([1.0, 2.0], [0.0, 2.0]), ([1.0, 2.0], [1.0]), ([1.0, 2.0], [np.nan, 1.0])):
        with pytest.raises(ValueError):
            timescales.kept_log_spread(*bad)


@pytest.mark.parametrize("share,d0", [(0.1, math.log(30)), (0.5, math.log(30)), (0.1, 6 * math.log(1.3 / 0.9)), (1.0, 4.0)])
def test_spread_tolerance_is_the_largest_whose_residual_spread_fits_the_share(share, d0):
    """Independent of the formula: the worst final log-spread of runs with one equilibrium, each within t of it,
    maximised over a grid of residuals, found by bisection on t."""
    allowed = share * d0

    def worst(t):
        e = np.linspace(-t, t, 2001)
        logs = np.log1p(e)
        return float(logs.max() - logs.min())  # the largest |log(1 + e_a) - log(1 + e_b)| over pairs on the grid

    lo, hi = 0.0, 0.999999
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if worst(mid) <= allowed else (lo, mid)
    t = timescales.spread_relaxation_tolerance(share, d0)
    assert t == pytest.approx(lo, rel=1e-9)
    # runs with different equilibria and residuals within t keep at most the equilibria's spread plus the share
    rng = np.random.default_rng(0)
    for _ in range(200):
        eq = np.exp(rng.normal(size=3))
        rho = eq * (1 + rng.uniform(-t, t, size=3))
        assert timescales.log_spread(rho) <= timescales.log_spread(eq) + allowed + 1e-12
    with pytest.raises(ValueError):
        timescales.spread_relaxation_tolerance(0.0, d0)


def _history(epochs, M, rho, rho_eq):
    import pandas as pd

    rho, rho_eq = np.asarray(rho, float), np.asarray(rho_eq, float)
    return pd.DataFrame({"epoch": epochs, "M": M, "rho": rho, "rho_eq": rho_eq, "rho_over_rho_eq": rho / rho_eq})


def test_init_dependence_regimes_clock_the_claim_the_control_and_the_weight_decay():
    lam, eta, spe, tol = 1e-3, 0.5, 1, 0.1
    epochs, M = [0, 100, 200], [1e-3, 1e-2, 1e-2]
    hist = {(lam, 1.0): _history(epochs, M, [1.0, 2.0, 2.0], [0.5, 2.0, 2.0]),
            (lam, 30.0): _history(epochs, M, [30.0, 3.0, 2.1], [0.5, 2.0, 2.0]),
            (0.0, 1.0): _history(epochs, M, [1.0, 2.0, 2.2], [0.5, 2.2, 2.2]),
            (0.0, 30.0): _history(epochs, M, [30.0, 9.0, 5.0], [0.5, 3.0, 2.5])}
    clocks = timescales.init_dependence_regimes(hist, lam=lam, rho_lr=eta, steps_per_epoch=spe, steps=200, tolerance=tol)
    assert [(c["role"], c["clock"]) for c in clocks] == [("claim", "relaxation"), ("claim", "tracking")] * 2 + [
        ("control", "relaxation"), ("control", "tracking")] * 2 + [("weight decay", "weight decay")]
    relax = [c for c in clocks if c["clock"] == "relaxation"]
    track = [c for c in clocks if c["clock"] == "tracking"]

    def by_hand(lam_k, rho0, eq_end):  # e-foldings: the smaller M of each logged interval, rate -log|1 - 2 eta (M + lam)|
        value = sum(100 * -math.log(abs(1 - 2 * eta * (m + lam_k))) for m in (1e-3, 1e-2))
        return value, math.log(abs(rho0 / eq_end - 1) / tol)

    runs = [(lam, 1.0, 2.0), (lam, 30.0, 2.0), (0.0, 1.0, 2.2), (0.0, 30.0, 2.5)]
    for c, (lam_k, rho0, eq_end) in zip(relax, runs):
        value, needed = by_hand(lam_k, rho0, eq_end)
        assert c["value"] == pytest.approx(value, rel=1e-12) and c["needed"] == pytest.approx(max(needed, 0.0))
        assert c["reached"] == (value >= max(needed, 0.0))
    # tracking, by hand over the last interval (100 steps at M = 1e-2): rate -log(1 - 2 eta (M + lam)) per step against
    # the drift |log(rho_eq,200 / rho_eq,100)| / 100 over the tolerance; the claim's equilibria and the control's
    # from rho0 = 1 stand still (need 0, done); the control from rho0 = 30 drifts from 3.0 to 2.5: lag 0.18 > 0.1
    for c, (lam_k, _, _), (eq_prev, eq_end) in zip(track, runs, [(2.0, 2.0), (2.0, 2.0), (2.2, 2.2), (3.0, 2.5)]):
        rate, drift = -math.log(1 - 2 * eta * (1e-2 + lam_k)), abs(math.log(eq_end / eq_prev)) / 100
        assert c["value"] == pytest.approx(rate, rel=1e-12) and c["needed"] == pytest.approx(drift / tol, rel=1e-12)
        assert c["reached"] == (drift / rate <= tol)
    assert [c["reached"] for c in track] == [True, True, True, False]
    assert math.log(3.0 / 2.5) / 100 / -math.log(0.99) == pytest.approx(0.1814, abs=1e-4)
    assert relax[2]["value"] < relax[0]["value"]  # without weight decay rho relaxes more slowly (rate 2 eta M)
    assert clocks[-1]["value"] == pytest.approx(200 * eta * lam) and clocks[-1]["needed"] == 0.5
    worst = regimes.furthest_from_done(clocks)
    shares = [c["value"] / c["needed"] if c["needed"] > 0 else math.inf for c in clocks]
    assert worst is clocks[int(np.argmin(shares))] and worst["role"] == "weight decay"  # 0.1 of 0.5
    with pytest.raises(ValueError):  # the control's runs are needed
        timescales.init_dependence_regimes({k: v for k, v in hist.items() if k[0] > 0}, lam=lam, rho_lr=eta,
                                           steps_per_epoch=spe, steps=200, tolerance=tol)
    with pytest.raises(ValueError):
        timescales.init_dependence_regimes({(0.5, 1.0): hist[lam, 1.0], **hist}, lam=lam, rho_lr=eta,
                                           steps_per_epoch=spe, steps=200, tolerance=tol)
    with pytest.raises(ValueError):
        regimes.furthest_from_done([])
