"""lowrank.square.training: the rho * f_V training loop, its logs and its failure modes."""

import math

import pandas as pd
import pytest
import torch

from lowrank.core import datasets
from lowrank.square import training
from lowrank.core.nets import normalized


@pytest.fixture(scope="module")
def binary():
    return training.load_task("digits", [1, 2], max_train=60, max_test=30)


def test_load_task_and_prepare(binary):
    assert binary.x_train.shape == (60, 64) and set(binary.y_train.tolist()) == {-1, 1}
    assert float(binary.x_train.norm(dim=1).max()) == pytest.approx(1.0)
    images = training.load_task("digits", [0, 1, 2], shape=(1, 8, 8))
    assert images.x_train.shape[1:] == (1, 8, 8) and set(images.y_train.tolist()) == {0, 1, 2}
    with pytest.raises(ValueError, match="distinct"):
        training.load_task("digits", [1, 1, 2])


def test_full_batch_gd_log_lemma4_and_equilibrium(binary):
    net = normalized.mlp(64, [16], rho_init=2.0, seed=0)
    run = training.train_square(net, binary, epochs=60, lr=0.1, rho_lr=1.0, lam=1e-2, log_every=10,
                                       dtype=torch.float64, progress=False)
    h = run.history
    assert isinstance(h, pd.DataFrame) and list(h.epoch) == [0, 10, 20, 30, 40, 50, 60]
    for col in ("rho", "mu", "M", "sigma2", "rho_eq", "gap_measured", "gap_predicted", "loss", "train_error",
                "test_error", "nc1", "nc3", "nc4", "lemma4_rhs", "rho_dot_step", "rho_dot_gf"):
        assert col in h.columns, col
    done = h.dropna(subset=["lemma4_rhs"])
    # Lemma 4 and Eq. 6 hold to round-off along full-batch gradient descent
    assert (done.loss - done.lemma4_rhs).abs().max() < 1e-12
    assert (done.rho_dot_step - done.rho_dot_gf).abs().max() < 1e-10
    assert (h.loss - h.loss_eq11).abs().max() < 1e-12
    assert run.config["rho_lr"] == pytest.approx(1.0)
    assert abs(run.final.rho_over_rho_eq - 1) < 0.05


def test_multiclass_targets_margins_layers(binary):
    data = training.load_task("digits", [0, 1, 2], max_train=90, max_test=30)
    net = normalized.mlp(64, [12, 12], num_outputs=3, rho_init=5.0, seed=1)
    run = training.train_square(net, data, epochs=6, lr=0.05, lam=1e-3, batch_size=16, log_every=3,
                                       margin_epochs=[0, 6], track_layers=True, dtype=torch.float64, progress=False)
    assert set(run.margins.epoch) == {0, 6} and len(run.margins) == 2 * 90
    assert set(run.layers.layer) == {1, 2, 3} and run.layers.classifier.sum() == 3
    assert run.layers.update_norm.iloc[3:].notna().all()
    assert run.history.nc2_equiangular_classifiers.notna().all()
    # loss with centred targets: c = mean ||e~||^2 = C / (C - 1)
    h = run.history
    assert (h.loss - h.loss_eq11).abs().max() < 1e-12


def test_cnn_on_digit_images():
    data = training.load_task("digits", [3, 8], max_train=40, max_test=20, shape=(1, 8, 8))
    net = normalized.paper_cnn((1, 8, 8), channels=(4, 4, 4, 4), padding=1, hidden=16, rho_init=5.0)
    run = training.train_square(net, data, epochs=3, lr=0.05, lam=1e-3, progress=False)
    assert len(run.history) == 4 and math.isfinite(run.final.loss)


def test_nan_stops_with_a_clear_message(binary):
    net = normalized.mlp(64, [8], rho_init=1e3, seed=0)
    with pytest.raises(training.TrainingDiverged, match="Lower the learning rate") as err:
        training.train_square(net, binary, epochs=20, lr=1e6, lam=1e-3, progress=False,
                                     dtype=torch.float64)
    assert isinstance(err.value.history, pd.DataFrame) and len(err.value.history) >= 1
    net = normalized.mlp(64, [8], rho_init=1e3, seed=0)
    run = training.train_square(net, binary, epochs=20, lr=1e6, lam=1e-3, progress=False,
                                       on_nan="stop", dtype=torch.float64)
    assert run.stopped and "diverged" in run.stopped


def test_input_validation(binary):
    net = normalized.mlp(64, [8])
    with pytest.raises(ValueError, match="expects"):
        training.train_square(normalized.mlp(10, [4]), binary, epochs=1, lr=0.1, lam=0.0, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        training.train_square(net, binary, epochs=1, lr=0.1, lam=0.0, batch_size=61, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        training.SquareConfig(epochs=1, lr=0.1, batch_size=-1)
    with pytest.raises(ValueError, match="min_lr"):
        training.SquareConfig(epochs=1, lr=0.1, schedule="cosine", min_lr=0.2)
    with pytest.raises(ValueError, match="lambda"):
        training.train_square(net, binary, epochs=1, lr=0.1, lam=-1.0, progress=False)
    with pytest.raises(ValueError, match="-1, \\+1"):
        training.train_targets(torch.tensor([0, 1, 2]), 1)
    wrong = datasets.Dataset(binary.x_train, (binary.y_train + 1) // 2 * 3, binary.x_test, binary.y_test, 2, "x")
    with pytest.raises(ValueError, match="labels"):
        training.train_square(net, wrong, epochs=1, lr=0.1, lam=0.0, progress=False)


def test_rho_stays_a_norm_when_a_step_crosses_zero():
    data = training.load_task("digits", [1, 2], max_train=70)
    net = normalized.mlp(64, [128], rho_init=100.0, seed=0)
    run = training.train_square(net, data, epochs=150, lr=0.1, rho_lr=10.0, lam=1e-4, log_every=50,
                                       dtype=torch.float64, progress=False, nc=False)
    assert run.config["rho_sign_flips"] >= 1  # this configuration overshoots through rho = 0 once
    assert (run.history.rho >= 0).all() and run.final.train_error == 0.0


def test_cosine_lr_matches_torch_scheduler():
    """The schedule against PyTorch's CosineAnnealingLR (an independent implementation)."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.03)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=40, eta_min=0.0299)
    for step in range(41):
        assert training.cosine_lr(step, 40, 0.03, 0.0299) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12)
        opt.step()
        sched.step()


def test_config_object_and_keywords_agree(binary):
    cfg = training.SquareConfig(epochs=5, lr=0.1, lam=1e-3, log_every=5, dtype="float64", nc=False)
    a = training.train_square(normalized.mlp(64, [8], seed=3), binary, cfg, progress=False)
    b = training.train_square(normalized.mlp(64, [8], seed=3), binary, epochs=5, lr=0.1, lam=1e-3, log_every=5,
                              dtype=torch.float64, nc=False, progress=False)
    pd.testing.assert_frame_equal(a.history, b.history)
    assert a.config["lam"] == 1e-3 and a.config["rho_lr"] == pytest.approx(0.1)


def test_train_network_builds_the_head_from_the_labels(binary):
    run = training.train_network(binary, arch="mlp", arch_kwargs={"widths": [8]}, rho_init=2.0, epochs=2, lr=0.1,
                                 progress=False, nc=False)
    assert run.model.num_outputs == 1 and run.model.rho.detach() > 0
    multi = training.load_task("digits", [0, 1, 2], max_train=30, max_test=10)
    run = training.train_network(multi, arch="mlp", arch_kwargs={"widths": [8]}, epochs=1, lr=0.1, progress=False)
    assert run.model.num_outputs == 3
    two = training.train_network(binary, arch="mlp", arch_kwargs={"widths": [8]}, epochs=1, lr=0.1, num_outputs=2,
                                 progress=False)
    assert two.model.num_outputs == 2 and "nc1" in two.history


def test_layer_ranks_against_numpy(binary):
    """The logged numerical and stable ranks against numpy's SVD of the logged weights."""
    import numpy as np

    run = training.train_square(normalized.mlp(64, [12, 6], seed=0), binary, epochs=2, lr=0.1, track_layers=True,
                                eps=0.3, dtype=torch.float64, progress=False, nc=False)
    last = run.layers[run.layers.epoch == 2].set_index("layer")
    for k, w in enumerate(run.model.weight_matrices(), 1):
        s = np.linalg.svd(w.matrix.double().cpu().numpy(), compute_uv=False)
        assert last.loc[k, "rank_spectral"] == int((s > 0.3 * s[0]).sum())
        assert last.loc[k, "stable_rank"] == pytest.approx(float((s**2).sum() / s[0] ** 2), rel=1e-10)


def test_nc_shuffled_and_convention_columns():
    data = training.load_task("digits", [0, 1, 2], max_train=45, max_test=15)
    run = training.train_network(data, arch="mlp", arch_kwargs={"widths": [8]}, epochs=2, lr=0.1, nc_shuffled=True,
                                 nc_convention="paper", dtype="float64", progress=False)
    h = run.history
    assert {"shuffled_nc1", "shuffled_nc3", "nc2_equiangular_classifiers_fig9"} <= set(h.columns)
    # the classifier is the same, so its own metrics agree; the class means differ
    assert (h.nc2_equinorm_classifiers == h.shuffled_nc2_equinorm_classifiers).all()
    assert (h.nc1 != h.shuffled_nc1).all()
    with pytest.raises(ValueError, match="nc_convention"):
        training.SquareConfig(epochs=1, lr=0.1, nc_convention="global")


def test_summaries_against_hand_computed_tables():
    import numpy as np
    from scipy import stats

    from lowrank.square import summaries

    history = pd.DataFrame({"epoch": [0, 5, 10], "nc1": [4.0, 3.0, 1.0], "shuffled_nc1": [4.0, 4.0, 3.0],
                            "nc3": [0.1, 0.2, 0.09]})
    t = summaries.nc_falls(history, 2.0, keys=("nc1", "nc3", "nc4"))
    got = {(r.metric, r.labels): r.falls for r in t.itertuples()}
    assert got == {("nc1", "true"): True, ("nc1", "shuffled"): False, ("nc3", "true"): False,
                   ("nc3", "shuffled"): False, ("nc4", "true"): False, ("nc4", "shuffled"): False}
    layers = pd.DataFrame({"epoch": [0, 0, 0, 4, 4, 4, 8, 8, 8], "layer": [1, 2, 3] * 3,
                           "classifier": [False, False, True] * 3, "rank_spectral": [8, 6, 1, 4, 6, 1, 2, 3, 1],
                           "update_norm": [np.nan] * 3 + [5.0, 2.0, 9.0, 1.0, 1.0, 0.5]})
    assert summaries.hidden_rank_ratio(layers) == pytest.approx((2 / 8 + 3 / 6) / 2)
    # layer 1: ranks (4, 2), norms (5, 1) -> +1; layer 2: ranks (6, 3), norms (2, 1) -> +1
    assert summaries.rank_update_correlation(layers) == pytest.approx(1.0)
    assert summaries.rank_update_correlation(layers, reverse=True) == pytest.approx(-1.0)
    one = layers[layers.layer == 1].dropna()
    assert stats.spearmanr(one["rank_spectral"], one.update_norm).statistic == pytest.approx(1.0)
    # a power law t^-0.3 over the last half of training, summed over two layers: the fit returns its exponent
    epochs = np.arange(10, 21)
    tail = pd.DataFrame({"epoch": np.repeat(epochs, 2), "progress": np.repeat(epochs / 20, 2),
                         "update_norm": np.repeat(epochs ** -0.3, 2) * np.tile([1.0, 2.0], len(epochs))})
    assert summaries.update_norm_decay_exponent(tail, 0.5) == pytest.approx(0.3)
    assert summaries.update_norm_decay_exponent(tail.assign(update_norm=1.0), 0.5) == pytest.approx(0.0, abs=1e-12)
    assert np.isnan(summaries.update_norm_decay_exponent(tail, 0.08)), "two logged epochs in the window: no fit"


def test_classifier_log_scale_is_the_rescaling_of_the_classifier_by_each_step():
    """`classifier_log_scale` after one and after two full-batch steps, against autograd's gradient in
    V_L at the state before each step (`classifier_gradient`) and a copy of the network stepped by hand."""
    data = training.load_task("digits", [0, 1, 2], max_train=45, max_test=15)
    lr, rho_lr, lam = 0.1, 1.0, 1e-2
    run = training.train_network(data, arch="mlp", arch_kwargs={"widths": [12]}, rho_init=2.0, seed=5, epochs=2,
                                 lr=lr, rho_lr=rho_lr, lam=lam, dtype="float64", progress=False, nc=False)
    model = normalized.make("mlp", data.x_train.shape[1:], num_outputs=3, rho_init=2.0, seed=5, widths=[12]).double()
    expected = 0.0
    for epoch in (1, 2):
        G = training.classifier_gradient(model, data, lam)
        expected += math.log(1 + lr * float((G * model.classifier()).sum()))
        assert run.history.set_index("epoch").classifier_log_scale[epoch] == pytest.approx(expected, rel=1e-10)
        opt = torch.optim.SGD([{"params": [model.rho], "lr": rho_lr},
                               {"params": [p for n, p in model.named_parameters() if n != "rho"], "lr": lr}])
        x, t = data.x_train.double(), training.train_targets(data.y_train, 3)[0]
        opt.zero_grad()
        (((model(x) - t) ** 2).sum(1).mean() + lam * model.rho**2).backward()
        opt.step()
        model.project_()
    assert run.history.classifier_log_scale.iloc[0] == 0.0
    momentum = training.train_network(data, arch="mlp", arch_kwargs={"widths": [12]}, epochs=1, lr=lr, momentum=0.5,
                                      dtype="float64", progress=False, nc=False)
    assert math.isnan(momentum.history.classifier_log_scale.iloc[-1])  # the bound's step is not SGD with momentum


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_heavy_ball_equals_torch_sgd_bit_for_bit(momentum):
    """HeavyBall against torch.optim.SGD: two groups with their own (changing) learning rates, a parameter
    that gets no gradient, random gradients over several steps; every parameter equal to the last bit."""
    gen = torch.Generator().manual_seed(3)
    shapes = [(1,), (4, 3), (3,), (2, 5)]
    ours = [torch.randn(s, generator=gen, dtype=torch.float64, requires_grad=True) for s in shapes]
    theirs = [p.detach().clone().requires_grad_(True) for p in ours]
    opt = training.HeavyBall([ours[:1], ours[1:]], momentum=momentum)
    ref = torch.optim.SGD([{"params": theirs[:1]}, {"params": theirs[1:]}], lr=0.1, momentum=momentum)
    for step in range(6):
        lrs = (0.3 / (step + 1), 0.05 * (step + 1))
        for g, lr in zip(ref.param_groups, lrs):
            g["lr"] = lr
        opt.zero_grad()
        ref.zero_grad(set_to_none=True)
        grads = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
        for i, (a, b, g) in enumerate(zip(ours, theirs, grads)):
            if i != 2:  # parameter 2 gets no gradient
                a.grad, b.grad = g.clone(), g.clone()
        opt.step(lrs)
        ref.step()
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b)
    assert ours[2].equal(theirs[2]) and (momentum == 0) == (not opt.buffers)
