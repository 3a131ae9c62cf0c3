"""Laptop sizes of the Part III pages (lowrank.square.sizing), against step-by-step contraction."""

import math

import pytest

from lowrank.square import sizing


def _steps_to_contract(needed, *, M, lam, eta):
    """Steps of e -> (1 - 2 eta (M + lam)) e until log(e_0 / e) >= needed, counted one by one."""
    e, steps = 1.0, 0
    while math.log(1.0 / e) < needed:
        e *= abs(1 - 2 * eta * (M + lam))
        steps += 1
    return steps


@pytest.mark.parametrize("spe", [1, 7])
def test_epochs_to_relax_is_the_first_epoch_that_contracts_enough_at_any_margin(spe):
    lam, eta, needed = 1e-3, 0.1, 4.51
    epochs = sizing.epochs_to_relax(needed, lam=lam, rho_lr=eta, steps_per_epoch=spe)
    steps = _steps_to_contract(needed, M=0.0, lam=lam, eta=eta)
    assert epochs == math.ceil(steps / spe)  # at M = 0: exactly the first epoch that reaches it
    # any 0 < M <= 1/eta - 2 lam contracts at least as fast: the bound holds for every margin in that range
    for M in (1e-5, 1e-3, 0.5, 1.0, 1 / eta - 2 * lam):
        assert sizing.relaxation_bound_holds(M, lam=lam, rho_lr=eta)
        assert _steps_to_contract(needed, M=M, lam=lam, eta=eta) <= epochs * spe
    assert sizing.epochs_to_relax(0.0, lam=lam, rho_lr=eta, steps_per_epoch=spe) == 0
    with pytest.raises(ValueError):
        sizing.epochs_to_relax(1.0, lam=0.0, rho_lr=eta, steps_per_epoch=spe)


def test_epochs_to_weight_decay_by_hand():
    # 0.5 / (0.1 * 1e-3) = 5000 steps; at 3 steps per epoch 1667 epochs (1666 give 4998 steps)
    assert sizing.epochs_to_weight_decay(0.5, lam=1e-3, rho_lr=0.1, steps_per_epoch=1) == 5000
    assert sizing.epochs_to_weight_decay(0.5, lam=1e-3, rho_lr=0.1, steps_per_epoch=3) == 1667
    with pytest.raises(ValueError):
        sizing.epochs_to_weight_decay(0.5, lam=0.0, rho_lr=0.1, steps_per_epoch=1)


def test_the_square_laptop_files_hold_the_computed_run_length_and_known_parameters():
    import yaml

    from lowrank.book import notebooks, rules

    for name, page in sizing.SIZED_PAGES.items():
        path = notebooks.scale_params_path(name, "laptop")
        data = yaml.safe_load(path.read_text())
        assert data["scale"] == "laptop" and set(data) <= set(rules.parameter_specs(name))
        sized = sizing.sized_settings(name, rules.resolve_parameters(name, scale="ci", memory=False))
        assert {k: data[k] for k in sized["set"]} == sized["set"]
        assert {k: data[k] for k in page.fixed} == {k: v for k, (v, _) in page.fixed.items()}
        for key in {arm.epochs_key for arm in sized["arms"]}:  # each run length is its slowest clock's
            assert data[key] == max(e for k, _, e in sized["per_need"] if k == key)


def test_the_relaxation_bound_holds_exactly_up_to_one_over_eta_minus_two_lambda():
    lam, eta, needed = 1e-3, 0.1, 2.0
    edge = 1 / eta - 2 * lam  # 9.998: the contraction factor is 1 - 2 eta lam again (overshooting)
    epochs = sizing.epochs_to_relax(needed, lam=lam, rho_lr=eta, steps_per_epoch=1)
    for M in (edge + 3e-4, edge + 8e-4):  # between the edge and 1/eta - lam, where rho stops relaxing
        assert not sizing.relaxation_bound_holds(M, lam=lam, rho_lr=eta)
        # beyond the edge the step overshoots: slower than at M = 0, so the sized run length is too short
        assert _steps_to_contract(needed, M=M, lam=lam, eta=eta) > epochs
    factor = lambda M: abs(1 - 2 * eta * (M + lam))  # noqa: E731
    assert factor(edge) == pytest.approx(factor(0.0), rel=1e-12)
    assert sizing.relaxation_bound_holds(edge, lam=lam, rho_lr=eta)
    # epochs_to_relax checks the range at the largest step when told the margins' bound
    assert sizing.epochs_to_relax(needed, lam=lam, rho_lr=eta, steps_per_epoch=1, M_max=1.0) == epochs
    with pytest.raises(ValueError, match="1/eta - 2 lam"):
        sizing.epochs_to_relax(needed, lam=lam, rho_lr=eta, steps_per_epoch=1, M_max=1.0, max_rho_lr=2.0)
    with pytest.raises(ValueError):
        sizing.relaxation_bound_holds(-1.0, lam=lam, rho_lr=eta)


def test_margin_bound_holds_for_a_unit_norm_relu_mlp():
    import torch

    torch.manual_seed(0)
    assert sizing.margin_bound("mlp") == 1.0
    with pytest.raises(ValueError):
        sizing.margin_bound("paper_cnn")
    # independent: random bias-free ReLU MLPs with unit-Frobenius layers on inputs of norm <= 1
    for widths in ([64, 8, 1], [64, 128, 1], [16, 32, 32, 2]):
        x = torch.randn(500, widths[0], dtype=torch.float64)
        x = x / x.norm(dim=1, keepdim=True).max()
        h = x
        for k, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            V = torch.randn(b, a, dtype=torch.float64)
            h = h @ (V / V.norm()).T
            if k < len(widths) - 2:
                h = torch.relu(h)
        assert float((h**2).sum(1).max()) <= sizing.margin_bound("mlp") + 1e-12


def test_rho_dynamics_relaxation_need_is_tied_to_the_claims_threshold():
    """Each initialisation's need is log(|rho_0 / rho_eq,0 - 1| / tanh(share * D0 / 2)), D0 = log(max / min rho_0):
    the tolerance at which the relaxation's residual alone keeps at most the claim's share of the log-spread."""
    from lowrank.book import rules

    ci = sizing.with_fixed("square/rho_dynamics", rules.resolve_parameters("square/rho_dynamics", scale="ci", memory=False))
    S = sizing.page_setup_of(ci)
    lam, eta = max(ci["lams"]), min(ci["lr"], ci["min_lr"])
    d0 = math.log(max(ci["rho_inits"]) / min(ci["rho_inits"]))
    epochs = {}
    for share in (ci["spread_share_max"], 0.5 * ci["spread_share_max"]):
        sized = sizing.rho_dynamics_size({**ci, "spread_share_max": share})
        tol = math.tanh(share * d0 / 2)
        for r0, (_, what, e) in zip(ci["rho_inits"], sized["per_need"][1:]):
            e0 = abs(S.initial_row(rho_init=r0, seed=ci["seed"], lam=lam)["rho_over_rho_eq"] - 1)
            need = max(0.0, math.log(e0 / tol))
            assert e == sizing.epochs_to_relax(need, lam=lam, rho_lr=eta, steps_per_epoch=S.steps(1)), what
        epochs[share] = sized["set"]["epochs"]
    assert epochs[0.5 * ci["spread_share_max"]] > epochs[ci["spread_share_max"]]  # a stricter bar needs longer runs


def test_the_laptop_estimate_is_each_arms_runs_times_its_length_times_its_epoch_time():
    from lowrank.book import rules

    name = "square/rho_dynamics"
    ci = rules.resolve_parameters(name, scale="ci", memory=False)
    sized = sizing.sized_settings(name, ci)
    text, seconds = sizing.laptop_text(name, ci, 600.0, seconds_per_epoch=lambda params, arm: 1e-3,
                                       seconds_per_log=lambda params, arm: 0.5)
    assert seconds == pytest.approx(sum(arm.runs * (sized["set"][arm.epochs_key] * 1e-3 + arm.logs * 0.5)
                                        for arm in sized["arms"]))
    assert sized["arms"][0].logs == sized["set"]["epochs"] // sized["set"]["log_every"]
    assert f"= {seconds:.0f} s (page budget 600 s)" in text and text.startswith("# Laptop scale")


def test_quasi_interpolation_reaches_one_weight_decay_time_at_the_schedules_smallest_step():
    """Counted one step at a time: the first epoch whose steps x 0.0299 x 1e-3 reach wd_times_needed, with the 288
    digits in minibatches of 128 (3 steps per epoch); the page's own regime (the initial step) then reads reached."""
    from lowrank.book import rules
    from lowrank.square import timescales

    name = "square/quasi_interpolation"
    ci = sizing.with_fixed(name, rules.resolve_parameters(name, scale="ci", memory=False))
    S = sizing.page_setup_of(ci)
    assert len(S.data.x_train) == 288 and ci["batch_size"] == 128
    spe = math.ceil(288 / 128)
    for need in (ci["wd_times_needed"], 0.25):
        sized = sizing.quasi_interpolation_size({**ci, "wd_times_needed": need})
        accumulated, epochs = 0.0, 0
        while accumulated < need * (1 - 1e-12):
            epochs += 1
            accumulated += spe * 0.0299 * ci["histogram_lam"]
        assert sized["set"]["epochs"] == epochs
        assert timescales.weight_decay_regime(steps=S.steps(epochs), lam=ci["histogram_lam"], rho_lr=ci["lr"],
                                              needed=need)["value"] >= need
        assert sized["set"]["margin_epochs"][-1] == epochs  # the end's margins are kept: the claims read them
        (arm,) = sized["arms"]
        assert arm.runs == 3 * (len(ci["lams"]) + 1)  # three initialisations, each lambda and the shuffled control


@pytest.mark.parametrize("name, n_key", [("square/low_rank_sgd", "batch_size"), ("square/neural_collapse", None)])
def test_weight_decay_pages_are_sized_to_the_first_epoch_that_reaches_their_regime(name, n_key):
    """The sized run length against the page's regime counted by hand: steps = epochs * ceil(N / B) (B = N for
    full batch), steps * eta * lam >= wd_times_needed at the sized length and not one epoch earlier."""
    from lowrank.book import rules

    page = {"square/low_rank_sgd": sizing.LOW_RANK_SGD_PAGE, "square/neural_collapse": sizing.NEURAL_COLLAPSE_PAGE}[name]
    p = {**rules.resolve_parameters(name, scale="ci", memory=False), **{k: v for k, (v, _) in page.fixed.items()}}
    sized = page.size(p)
    classes = p.get("classes") or p["binary_classes"]  # neural_collapse: the binary task has the fewer samples
    n = len(sizing.page_setup_of({**p, "classes": classes}).data.x_train)
    bs = p[n_key] if n_key and p[n_key] else n
    per_epoch = -(-n // bs)
    eta = p["rho_lr"] or p["lr"]
    epochs = sized["set"]["epochs"]
    assert epochs * per_epoch * eta * p["lam"] >= p["wd_times_needed"] > (epochs - 1) * per_epoch * eta * p["lam"]
    if name == "square/low_rank_sgd":  # full-batch GD takes as many steps as the SGD run
        assert sized["set"]["gd_epochs"] == epochs * per_epoch
        assert sized["arms"][0].runs == 2 + len(p["pool_seeds"])


def test_random_labels_run_lengths_are_each_figures_weight_decay_time_counted_step_by_step():
    """Each figure's run length is the first epoch whose accumulated steps × eta × lam reaches wd_times_needed, eta
    rho's step (rho_lr, or lr for the single step size), added up one step at a time."""
    from lowrank.book import rules

    name = "square/random_labels"
    ci = rules.resolve_parameters(name, scale="ci", memory=False)

    def epochs_by_hand(need, lam, eta):
        total, epochs = 0.0, 0
        while total < need * (1 - 1e-12):
            total += eta * lam  # full-batch gradient descent: one step per epoch
            epochs += 1
        return epochs

    for params in (ci, sizing.with_fixed(name, ci)):
        sized = sizing.random_labels_size(params)
        need = params["wd_times_needed"]
        assert sized["set"]["epochs"] == epochs_by_hand(need, params["lam"], params["rho_lr"] or params["lr"])
        assert sized["set"]["regression_epochs"] == epochs_by_hand(
            need, params["regression_lam"], params["regression_rho_lr"] or params["regression_lr"])
        runs = {arm.epochs_key: arm.runs for arm in sized["arms"]}  # the page's members: both arms of Fig. 4, all of Fig. 5
        assert runs["epochs"] == 2 * len(params["random_fractions"]) * len(params["fraction_seeds"])
        assert runs["regression_epochs"] == sum(len(params[k]) for k in ("regression_scales_wd", "regression_scales_no_wd")) \
            * len(params["regression_seeds"])
    laptop = sizing.with_fixed(name, ci)
    assert laptop["lam"] == 1e-3 and not laptop["rho_lr"] and not laptop["regression_rho_lr"]  # the paper's, l.1045, l.639-642
    assert len(laptop["fraction_seeds"]) >= 3 and len(laptop["regression_seeds"]) >= 3  # issue 43: 3 seeds pooled


def test_disjoint_patch_margin_bound_holds_for_tree_cnns_and_refuses_overlapping_convs():
    """Independent: each layer's operator norm by power iteration on the map itself (autograd), and the worst input
    on the unit sphere found by gradient ascent, against prod g_k^2 max ||x||^2."""
    import torch

    from lowrank.core.nets import normalized

    torch.manual_seed(0)
    for in_shape, kwargs in (((1, 64), dict(kernel_size=2, channels=4)), ((2, 27), dict(kernel_size=3, channels=3)),
                             ((1, 16), dict(kernel_size=2, channels=2, g=1.7))):
        net = normalized.tree_cnn(in_shape, **kwargs, seed=1).double()
        x = torch.randn(50, *in_shape, dtype=torch.float64)
        x = x / x.flatten(1).norm(dim=1, keepdim=True).max()
        bound = sizing.disjoint_patch_margin_bound(net, x)
        assert bound == pytest.approx(kwargs.get("g", 1.0) ** (2 * (net.depth - 1)))
        shape = in_shape
        for layer in net.body:  # the layer's operator norm is at most its filter's Frobenius norm g
            u = torch.randn(1, *shape, dtype=torch.float64)
            for _ in range(200):
                u = u / u.norm()
                u = torch.autograd.functional.vjp(layer, u, layer(u))[1]  # A^T A u
            u = u / u.norm()
            assert float(layer(u).detach().norm()) <= float(layer.g) * (1 + 1e-9)
            shape = tuple(layer(u).shape[1:])
        z = torch.randn(1, *in_shape, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.Adam([z], lr=0.05)
        for _ in range(300):
            loss = -(net.f_V(z / z.norm()) ** 2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert float((net.f_V(x) ** 2).max()) <= bound and -float(loss) <= bound * (1 + 1e-9)
    with pytest.raises(ValueError, match="overlapping"):
        sizing.disjoint_patch_margin_bound(normalized.make("paper_cnn", (3, 32, 32)), torch.zeros(1, 3, 32, 32))


def test_rademacher_bounds_run_length_is_the_slowest_runs_relaxation_at_the_weight_decay_rate():
    """The run length contracts the slowest run's distance log(|rho_0 / rho_eq,0 - 1| / rho_tolerance) step by step at
    the factor 1 - 2 eta lam (M = 0); the ci variant's rho step (10) overshoots for margins up to 1 and is refused."""
    from lowrank.book import rules

    name = "square/rademacher_bounds"
    ci = rules.resolve_parameters(name, scale="ci", memory=False)
    laptop = sizing.with_fixed(name, ci)
    sized = sizing.rademacher_bounds_size(laptop)
    lam, eta = laptop["lam"], laptop["rho_lr"]
    needs = []
    for label, n, S, rho0, data in sizing._rademacher_runs(laptop):
        assert rho0 == pytest.approx(0.1 ** S.build(rho_init=1.0, seed=0).depth)  # the paper's scale 0.1, rho_0 = s^L
        row = S.initial_row(rho_init=rho0, seed=laptop["seed"], lam=lam, data=data)
        needs.append(max(0.0, math.log(abs(row["rho_over_rho_eq"] - 1) / laptop["rho_tolerance"])))
    assert len(needs) == 3 * len(laptop["train_sizes"]) == len(sized["arms"])  # tree, dense, random-label tree per N
    assert sized["set"]["epochs"] == _steps_to_contract(max(needs), M=0.0, lam=lam, eta=eta)  # full batch: 1 step/epoch
    with pytest.raises(ValueError, match="1/eta - 2 lam"):
        sizing.rademacher_bounds_size({**laptop, "rho_lr": ci["rho_lr"]})


def _probe_rows(errors):
    """bench/nc_fit_probe.py's rows: {(width, epochs): (full batch, SGD, lambda = 0) train errors}, laptop, seed 0."""
    arms = (("trained", 5e-4, 0), ("SGD", 5e-4, 32), ("lambda = 0", 0.0, 0))
    return [{"scale": "laptop", "seed": 0, "width": w, "epochs": e, "arm": arm, "lam": lam, "batch_size": b,
             "n_train": 581, "train_error": err, "cpu_s": 1.0}
            for (w, e), errs in errors.items() for (arm, lam, b), err in zip(arms, errs)]


def test_fit_probe_summary_takes_the_smallest_width_whose_weight_decay_arms_both_fit():
    none = _probe_rows({(128, 200): (0.0069, 0.0034, 0.0017), (256, 200): (0.0069, 0.0, 0.0),
                        (128, 1000): (0.0052, 0.0034, 0.0)})
    s = sizing.fit_probe_summary(none)
    # (256, 200) has SGD fitted but not full batch: a setting fits only when both arms with weight decay do
    assert not s["fits"] and s["width"] is None and s["settings"] == 3
    assert (s["min_error"], s["max_error"]) == (0.0, 0.0069) and s["no_wd_fits"] == [(128, 1000), (256, 200)]
    assert "none fits" in s["text"] and "200 epochs: widths 128, 256; 1000 epochs: width 128" in s["text"]
    some = _probe_rows({(512, 200): (0.0, 0.0, 0.0), (256, 3000): (0.0, 0.0, 0.0), (256, 1000): (0.0, 0.0, 0.0),
                        (128, 200): (0.01, 0.0, 0.0)})
    s = sizing.fit_probe_summary(some)
    assert s["fits"] and (s["width"], s["epochs"]) == (256, 1000)  # the smallest width, at its fewest epochs
    assert "the smallest width that fits is 256, at 1000 epochs" in s["text"]
    with pytest.raises(ValueError, match="no ci row"):
        sizing.fit_probe_summary(none, scale="ci")


def test_neural_collapse_takes_its_width_from_the_fit_probe(tmp_path, monkeypatch):
    import pandas as pd

    from lowrank.book import rules

    name = "square/neural_collapse"
    p = sizing.with_fixed(name, rules.resolve_parameters(name, scale="ci", memory=False))
    path = tmp_path / "probe.csv"
    monkeypatch.setattr(sizing, "NC_FIT_PROBE", path)
    pd.DataFrame(_probe_rows({(128, 200): (0.01, 0.01, 0.0)})).to_csv(path, index=False)
    sized = sizing.neural_collapse_size(p)
    regime_epochs = sized["per_need"][0][2]  # the weight-decay time alone (the test above counts it by hand)
    assert sized["set"] == {"epochs": regime_epochs} and "undecided where none does" in sized["notes"][0]
    pd.DataFrame(_probe_rows({(128, 200): (0.01, 0.01, 0.0), (512, 10 * regime_epochs): (0.0, 0.0, 0.0)})).to_csv(
        path, index=False)
    sized = sizing.neural_collapse_size(p)
    assert sized["set"] == {"epochs": 10 * regime_epochs, "arch_kwargs": {**p["arch_kwargs"], "widths": [512, 512]}}
    assert all(arm.setup["arch_kwargs"]["widths"] == [512, 512] for arm in sized["arms"])  # timed at that width
