"""The training loop: the vmapped ensemble is K independent runs of torch.optim.SGD; monitors and
divergence handling."""

import math
import warnings

import numpy as np
import pytest
import torch

from lowrank.core import datasets, spectral, train
from lowrank.core.nets import mlp
from lowrank.sgd import ranks


def _tiny(n=96, d=6, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return datasets.Dataset(x[:64], y[:64], x[64:], y[64:], c, "tiny")


def _reference(model_fn, data, run, *, batch_size, epochs, loss, milestones, lr_decay):
    """One run with torch.optim.SGD + MultiStepLR and the same batch order as train_ensemble."""
    torch.manual_seed(run["seed"])
    net = model_fn()
    opt = torch.optim.SGD(net.parameters(), lr=run["lr"], momentum=run["momentum"], weight_decay=run["weight_decay"])
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=list(milestones), gamma=lr_decay)
    gen = torch.Generator().manual_seed(10_007 * run["seed"] + 17)
    n = data.x_train.shape[0]
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        net.train()
        for s in range(n // batch_size):
            idx = perm[s * batch_size:(s + 1) * batch_size]
            opt.zero_grad()
            train.loss_value(net(data.x_train[idx]), data.y_train[idx], loss).backward()
            opt.step()
        sched.step()
    return net


@pytest.mark.parametrize("kind, loss", [("MLP", "ce"), ("MLP-BN", "mse"), ("RES-BN", "ce")])
def test_ensemble_equals_independent_torch_sgd(kind, loss):
    data = _tiny()
    model_fn = lambda: mlp.mlp(kind, 2, 8, 6, 3)  # noqa: E731
    runs = [{"lr": 0.1, "weight_decay": 1e-2, "momentum": 0.9, "seed": 3},
            {"lr": 0.05, "weight_decay": 0.0, "momentum": 0.0, "seed": 5}]
    kw = dict(batch_size=16, epochs=3, loss=loss, milestones=(1, 2), lr_decay=0.5)
    table = train.train_ensemble(model_fn, data, runs, progress=False, device="cpu", **kw)
    for k, run in enumerate(runs):
        ref = _reference(model_fn, data, run, **kw).eval()
        last = table[(table["run"] == k) & (table["epoch"] == 3)].sort_values("layer_index")
        for (name, _), row in zip(ref.weight_specs(), last.itertuples()):
            M = spectral.conv_weight_as_matrix(dict(ref.named_parameters())[name])
            assert row.weight_norm == pytest.approx(float(M.norm()), rel=1e-5)
            assert row.rank_spectral == spectral.numerical_rank(M, 1e-3)
        with torch.no_grad():
            acc = float((ref(data.x_test).argmax(1) == data.y_test).float().mean())
        assert last["test_acc"].iloc[0] == pytest.approx(acc, abs=1e-6)
        assert last["lr"].iloc[0] == pytest.approx(run["lr"] * 0.25)


def test_conv_ensemble_through_vmap_equals_independent_torch_sgd():
    """Networks without `forward_stacked` (conv, ViT) train through vmap(functional_call)."""
    from lowrank.core.nets import conv

    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 1, 8, 8, generator=g)
    y = (x[:, 0, :4].mean((1, 2)) > 0).long() + (x[:, 0, 4:].mean((1, 2)) > 0.2).long()
    data = datasets.Dataset(x[:32], y[:32], x[32:], y[32:], 3, "tiny images")
    model_fn = lambda: conv.VGG((4, "M", 8), in_channels=1, num_classes=3, image_size=8)  # noqa: E731
    assert not hasattr(model_fn(), "forward_stacked")
    runs = [{"lr": 0.05, "weight_decay": 1e-2, "momentum": 0.9, "seed": 1}, {"lr": 0.1, "seed": 2}]
    kw = dict(batch_size=8, epochs=2, loss="ce", milestones=(1,), lr_decay=0.5)
    table = train.train_ensemble(model_fn, data, runs, progress=False, device="cpu", **kw)
    for k, run in enumerate(runs):
        ref = _reference(model_fn, data, {"momentum": 0.0, "weight_decay": 0.0, **run}, **kw).eval()
        last = table[(table["run"] == k) & (table["epoch"] == 2)].sort_values("layer_index")
        for (name, _), row in zip(ref.weight_specs(), last.itertuples()):
            M = spectral.conv_weight_as_matrix(dict(ref.named_parameters())[name])
            assert row.weight_norm == pytest.approx(float(M.norm()), rel=1e-5)
        with torch.no_grad():
            loss = float(train.loss_value(ref(data.x_test), data.y_test, "ce"))
        assert last["test_loss"].iloc[0] == pytest.approx(loss, rel=1e-5)


def test_eval_every_and_timings():
    data = _tiny()
    table = train.train(lambda: mlp.MLP(6, 3, 2, 8), data, lr=0.1, batch_size=8, epochs=5, eval_every=2,
                        progress=False)
    per_epoch = table.groupby("epoch")["test_acc"].first()
    assert per_epoch[[1, 3]].isna().all() and per_epoch[[0, 2, 4, 5]].notna().all()
    assert table.groupby("epoch")["rank_spectral"].first().notna().all()  # ranks after every epoch
    seconds = table.attrs["seconds"]
    assert set(seconds) == {"train", "evaluate", "track_ranks"} and all(v > 0 for v in seconds.values())
    with pytest.raises(ValueError, match="eval_every must be a positive integer"):
        train.train(lambda: mlp.MLP(6, 3, 2, 8), data, lr=0.1, batch_size=8, epochs=1, eval_every=0)


def test_augmented_member_trains_as_it_would_alone():
    """Each member's augmentation has its own generator: a run gives the same weights in an ensemble
    as alone."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 1, 6, 6, generator=g)
    y = (x.mean((1, 2, 3)) > 0).long()
    data = datasets.Dataset(x[:32], y[:32], x[32:], y[32:], 2, "tiny images")
    model_fn = lambda: mlp.MLP(36, 2, 2, 8)  # noqa: E731
    aug = lambda xb, gen: train.augment_images(xb, gen, padding=1, rotation="none")  # noqa: E731
    kw = dict(batch_size=8, epochs=2, augment=aug, progress=False)
    both = train.train_ensemble(model_fn, data, [{"lr": 0.1, "seed": 4}, {"lr": 0.1, "seed": 9}], **kw)
    alone = train.train_ensemble(model_fn, data, [{"lr": 0.1, "seed": 9}], **kw)
    last = both[(both.run == 1) & (both.epoch == 2)]["weight_norm"].to_numpy()
    np.testing.assert_allclose(last, alone[alone.epoch == 2]["weight_norm"].to_numpy(), rtol=1e-6)


def test_mixed_precision_keeps_float32_weights_and_close_losses():
    data = _tiny()
    kw = dict(lr=0.1, batch_size=8, epochs=3, progress=False)
    full = train.train(lambda: mlp.mlp("MLP-BN", 2, 16, 6, 3), data, **kw)
    mixed = train.train(lambda: mlp.mlp("MLP-BN", 2, 16, 6, 3), data, mixed_precision=True, **kw)
    last = lambda t: t[t.epoch == 3].sort_values("layer_index")  # noqa: E731
    assert not np.array_equal(last(full)["weight_norm"], last(mixed)["weight_norm"])  # bfloat16 was used
    np.testing.assert_allclose(last(mixed)["weight_norm"], last(full)["weight_norm"], rtol=0.02)
    assert last(mixed)["test_loss"].iloc[0] == pytest.approx(last(full)["test_loss"].iloc[0], rel=0.05)


@pytest.mark.parametrize("kind, bias", [("MLP", True), ("MLP-BN", True), ("RES-BN", True), ("RES-BN", False)])
def test_training_layout_gives_the_stacked_layouts_gradients_bit_for_bit(kind, bias):
    """`_Forward.gradients` differentiates leaves in the MLPs' `stacked_layout` (biases (K, out, 1),
    BatchNorm scales and shifts (K*C,)); its gradients, losses and running statistics equal, bit for
    bit, those of leaves in the stacked layout reshaped inside the forward (the previous implementation)."""
    from torch.func import stack_module_state

    nets = []
    for seed in range(3):
        torch.manual_seed(seed)
        nets.append(mlp.mlp(kind, 2, 8, 6, 3, bias=bias))
    params, buffers = stack_module_state(nets)
    params = {k: v.detach() for k, v in params.items()}
    base = mlp.mlp(kind, 2, 8, 6, 3, bias=bias).to("meta").train()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 5, 6, generator=g), torch.randint(0, 3, (3, 5), generator=g)

    before = {k: v.clone() for k, v in buffers.items()}
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    losses = train.member_losses(base.forward_stacked(leaves, before, x), y, "ce")
    expected = torch.autograd.grad(losses.sum(), list(leaves.values()))

    after = {k: v.clone() for k, v in buffers.items()}
    grads, got = train._Forward(base, False, "ce", torch.device("cpu"), False).gradients(params, after, x, y)
    assert torch.equal(got, losses.detach())
    for name, e, a in zip(params, expected, grads):
        assert a.shape == params[name].shape and torch.equal(a, e), name
    assert all(torch.equal(before[k], after[k]) for k in buffers)
    shaped = base.stacked_layout(params)
    assert shaped["classifier.weight"] is params["classifier.weight"]
    if bias:
        assert shaped["classifier.bias"].shape == (3, 3, 1)
    if kind.endswith("BN"):
        bn = next(k for k in params if k.endswith(("n1.weight", "1.weight")) and params[k].ndim == 2)
        assert shaped[bn].shape == (3 * 8,)


def test_member_losses_equal_loss_value():
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(3, 5, 4, generator=g), torch.randint(0, 4, (3, 5), generator=g)
    for loss in ("ce", "mse"):
        expected = torch.stack([train.loss_value(logits[k], y[k], loss) for k in range(3)])
        torch.testing.assert_close(train.member_losses(logits, y, loss), expected)


def test_table_is_tidy_and_distances_are_right():
    data = _tiny()
    table = train.train(lambda: mlp.MLP(6, 3, 2, 8), data, lr=0.1, batch_size=8, epochs=2, progress=False)
    assert len(table) == 3 * 3  # epochs 0..2, three matrices
    assert table[table.epoch == 0]["dist"].isna().all()
    assert not table.duplicated(["run", "epoch", "layer"]).any()
    e1 = table[table.epoch == 1].set_index("layer")
    e0 = table[table.epoch == 0].set_index("layer")
    # dist_rel = dist / ||W_before||_F
    np.testing.assert_allclose(e1["dist_rel"], e1["dist"] / e0["weight_norm"], rtol=1e-10)
    assert (e1["dist"] >= (e1["weight_norm"] - e0["weight_norm"]).abs() - 1e-9).all()  # triangle inequality
    for col in ("rank_spectral", "rank_frobenius", "stable_rank", "train_acc", "test_loss", "spectral_norm"):
        assert col in table


def test_spectrum_stats_matches_numpy_matrix_rank():
    """Both rank conventions against numpy's matrix_rank with an absolute tolerance (an independent
    computation: the authors' code calls matrix_rank(M / ||M||_F, tol=eps))."""
    g = torch.Generator().manual_seed(0)
    M = torch.randn(4, 7, 5, generator=g, dtype=torch.float64) @ torch.diag(torch.logspace(0, -5, 5, dtype=torch.float64))
    st = spectral.spectrum_stats(torch.linalg.svdvals(M), 1e-3)
    A = M.numpy()
    fro = [np.linalg.matrix_rank(a / np.linalg.norm(a), tol=1e-3) for a in A]
    spec = [np.linalg.matrix_rank(a / np.linalg.norm(a, 2), tol=1e-3) for a in A]
    assert st["rank_frobenius"].tolist() == fro and st["rank_spectral"].tolist() == spec
    assert st["rank_spectral"].tolist() == spectral.numerical_rank(M, 1e-3).tolist()
    assert st["rank_frobenius"].tolist() == spectral.numerical_rank(M, 1e-3, norm="frobenius").tolist()
    np.testing.assert_allclose(st["stable_rank"].numpy(), [np.linalg.norm(a) ** 2 / np.linalg.norm(a, 2) ** 2 for a in A])
    zero = spectral.spectrum_stats(torch.zeros(1, 3, dtype=torch.float64), 1e-3)
    assert zero["rank_spectral"].item() == 0 and zero["rank_frobenius"].item() == 0 and math.isnan(zero["stable_rank"].item())


def test_a_weight_normalised_net_is_refused_with_a_one_line_error():
    """It has weight_matrices() but not weight_specs(): a ValueError before training, not an AttributeError."""
    from lowrank.core.nets import normalized

    make = lambda: normalized.mlp(6, (8,), 3)  # noqa: E731
    with pytest.raises(ValueError, match="weight_specs"):
        train.train_ensemble(make, _tiny(), [{"lr": 0.1}], batch_size=8, epochs=1, progress=False)


def test_config_object_and_keywords_agree():
    data = _tiny()
    runs = [{"lr": 0.1, "weight_decay": 1e-2, "seed": 1}]
    cfg = train.TrainConfig(batch_size=16, epochs=2, milestones=[1], lr_decay=0.5, progress=False)
    a = train.train_ensemble(lambda: mlp.MLP(6, 3, 1, 8), data, runs, cfg)
    b = train.train_ensemble(lambda: mlp.MLP(6, 3, 1, 8), data, runs, batch_size=16, epochs=2, milestones=[1],
                             lr_decay=0.5, progress=False)
    import pandas as pd

    pd.testing.assert_frame_equal(a, b)
    assert a[a.epoch == 2]["lr"].iloc[0] == pytest.approx(train.lr_at(0.1, 2, [1], 0.5))


def test_lr_at():
    assert train.lr_at(0.1, 60, (60, 100, 200)) == pytest.approx(0.1)
    assert train.lr_at(0.1, 61, (60, 100, 200)) == pytest.approx(0.01)
    assert train.lr_at(0.1, 500, (60, 100, 200)) == pytest.approx(1e-4)


def test_divergence_stops_only_that_run_and_keeps_what_was_measured():
    data = _tiny()
    runs = [{"lr": 0.05, "seed": 0}, {"lr": 1e6, "seed": 0}]
    with pytest.warns(RuntimeWarning, match="diverged"):
        table = train.train_ensemble(lambda: mlp.MLP(6, 3, 2, 8), data, runs, batch_size=8, epochs=3,
                                     loss="mse", progress=False)
    assert 1 in table.attrs["diverged"] and 0 not in table.attrs["diverged"]
    assert table[table.run == 0]["epoch"].max() == 3
    kept = table[table.run == 1]
    assert kept["epoch"].max() < 3 and (kept["epoch"] == 0).any()
    assert np.isfinite(kept[["weight_norm", "train_loss"]].to_numpy()).all()


def test_sweep_groups_by_batch_size_and_keeps_grid_order():
    data = _tiny()
    grid = [{"batch_size": 16, "lr": 0.1, "seed": 0}, {"batch_size": 8, "lr": 0.1, "seed": 0},
            {"batch_size": 16, "lr": 0.05, "seed": 1}]
    table = train.sweep(lambda: mlp.MLP(6, 3, 1, 8), data, grid, epochs=1, progress=False)
    by_run = table.groupby("run").first()
    assert by_run["batch_size"].tolist() == [16, 8, 16]
    assert by_run["lr0"].tolist() == [0.1, 0.1, 0.05]
    avg = ranks.average_rank(table, include_classifier=False)
    assert len(avg) == 3 * 2
    fin = ranks.final_values(table, norm="frobenius")
    assert fin["epoch"].tolist() == [1, 1, 1]


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_size": 0}, "batch_size"), ({"epochs": 0}, "epochs"), ({"loss": "hinge"}, "loss"),
    ({"eps": 0}, "eps"), ({"batch_size": 1000}, "larger than the training set"), ({"lr_decay": 0}, "lr_decay"),
    ({"eval_every": 0}, "eval_every")])
def test_bad_arguments(kwargs, match):
    base = dict(batch_size=8, epochs=1, progress=False)
    with pytest.raises(ValueError, match=match):
        train.train_ensemble(lambda: mlp.MLP(6, 3, 1, 4), _tiny(), [{"lr": 0.1}], **(base | kwargs))


@pytest.mark.parametrize("runs, match", [([], "empty"), ([{"weight_decay": 0.1}], "lr"), ([{"lr": -1}], "lr"),
                                         ([{"lr": 0.1, "momentum": 1.0}], "momentum")])
def test_bad_runs(runs, match):
    with pytest.raises(ValueError, match=match):
        train.train_ensemble(lambda: mlp.MLP(6, 3, 1, 4), _tiny(), runs, batch_size=8, epochs=1, progress=False)




def test_augment_images():
    g = torch.Generator().manual_seed(0)
    x = torch.arange(2 * 1 * 6 * 6, dtype=torch.float32).reshape(2, 1, 6, 6)
    # crop only, with no padding, no flip, no rotation: the identity
    torch.testing.assert_close(train.augment_images(x, g, padding=0, flip=False, rotation="none"), x)
    # flips and crops only move pixels: each output pixel is an input pixel or the zero padding
    out = train.augment_images(x, g, padding=2, flip=True, rotation="none")
    assert out.shape == x.shape
    assert set(out.unique().tolist()) <= set(x.unique().tolist()) | {0.0}
    # a rotation by 360 degrees (k * 15 with step 15 includes k = 24) keeps the shape
    assert train.augment_images(x, g, padding=0, flip=False, rotation="multiples").shape == x.shape
    # a quarter turn through the rotation helper is torch.rot90 (an independent computation)
    sq = torch.arange(16.0).reshape(1, 1, 4, 4)
    torch.testing.assert_close(train._rotate(sq, torch.tensor([math.pi / 2])), torch.rot90(sq, 1, (2, 3)), atol=1e-4, rtol=0)
    # uniform rotations within +-15 degrees: the centre pixel of a symmetric blob moves little; angles drawn in range
    big = torch.zeros(64, 1, 9, 9)
    big[:, :, 4, :] = 1.0  # a horizontal bar: rotated by at most 15 degrees it stays mostly in the middle rows
    out = train.augment_images(big, torch.Generator().manual_seed(1), padding=0, flip=False, rotation="uniform")
    assert (out[:, 0, 3:6, :].sum((-1, -2)) > 0.9 * out[:, 0].sum((-1, -2))).all()
    assert not torch.allclose(out[0], out[1])  # each image its own angle
    with pytest.raises(ValueError, match="rotation"):
        train.augment_images(x, g, rotation="spin")
    # reproducible from the generator
    a = train.augment_images(x, torch.Generator().manual_seed(3))
    b = train.augment_images(x, torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="images"):
        train.augment_images(x[0], g)


@pytest.mark.slow
def test_checkpoint_resume_matches_an_uninterrupted_run(tmp_path):
    """A run stopped after epoch 2 and resumed from its checkpoint ends exactly as one that never
    stopped: weights, BatchNorm buffers, momentum, batch order and monitors all carry over."""
    import pandas as pd

    data = datasets.digits()
    make = lambda: mlp.mlp("MLP-BN", 2, 16, 64, 10)  # noqa: E731
    runs = [{"lr": 0.1, "weight_decay": 5e-3, "momentum": 0.9, "seed": s} for s in (0, 1)]
    kwargs = dict(batch_size=64, milestones=[2], progress=False)
    whole = train.train_ensemble(make, data, runs, epochs=4, **kwargs)
    ckpt = tmp_path / "run.ckpt"
    first = train.train_ensemble(make, data, runs, epochs=2, checkpoint=ckpt, **kwargs)
    assert ckpt.is_file() and first["epoch"].max() == 2
    resumed = train.train_ensemble(make, data, runs, epochs=4, checkpoint=ckpt, **kwargs)
    pd.testing.assert_frame_equal(resumed, whole)
    other = [{"lr": 0.2, "weight_decay": 5e-3, "momentum": 0.9, "seed": 0}]
    with pytest.raises(ValueError, match="belongs to other runs"):
        train.train_ensemble(make, data, other, epochs=4, checkpoint=ckpt, **kwargs)
    old = torch.load(ckpt, weights_only=False)
    del old["format"]  # as written before the format was recorded
    torch.save(old, ckpt)
    with pytest.raises(ValueError, match="another version of lowrank.core.train"):
        train.train_ensemble(make, data, runs, epochs=4, checkpoint=ckpt, **kwargs)


def test_extra_eps_ranks_match_numpy_matrix_rank_of_the_trained_weights():
    """`extra_eps` columns against numpy's matrix_rank(M / ||M||_F, tol=eps) of the same run trained
    with torch.optim.SGD (an independent training and rank computation)."""
    data = _tiny()
    run = {"lr": 0.2, "weight_decay": 0.05, "momentum": 0.9, "seed": 3}
    make = lambda: mlp.MLP(6, 3, 3, 8)  # noqa: E731
    table = train.train_ensemble(make, data, [run], batch_size=8, epochs=3, eps=1e-3, extra_eps=(1e-3, 0.1, 0.3),
                                 progress=False)
    last = table[table.epoch == 3].set_index("layer")
    assert (last[train.extra_rank_column(1e-3)] == last["rank_frobenius"]).all()
    net = _reference(make, data, run, batch_size=8, epochs=3, loss="ce", milestones=(), lr_decay=0.1)
    for w in net.weight_matrices():
        a = w.matrix.double().numpy()
        for e in (0.1, 0.3):
            assert last.loc[w.name, train.extra_rank_column(e)] == np.linalg.matrix_rank(a / np.linalg.norm(a), tol=e)
    assert last[train.extra_rank_column(0.3)].max() < last["rank_frobenius"].max()  # the thresholds differ here
    avg = ranks.rank_tables(table)
    assert {"avg_rank@0.1", "avg_rank@0.3"} <= set(avg.columns)
    with pytest.raises(ValueError, match="extra_eps"):
        train.TrainConfig(batch_size=8, epochs=1, extra_eps=(0.0,))
