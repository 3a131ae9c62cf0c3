"""Lemma 3.1 (per-sample gradient ranks) and Theorem 3.2 (the rank bound along SGD)."""

import math

import pytest
import torch
from torch import nn

from lowrank.sgd import theory
from lowrank.core import spectral, train
from lowrank.core.nets import conv, mlp, vit


def _data(n=12, shape=(10,), c=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=g), torch.randint(0, c, (n,), generator=g)


def test_per_sample_gradients_match_autograd_loop():
    torch.manual_seed(0)
    net = mlp.from_name("RES-BN-1-8", 10, 4)
    net.train()(torch.randn(32, 10))  # non-trivial running statistics
    x, y = _data()
    grads = theory.per_sample_gradients(net, x, y, loss="mse")
    ref = net.double().eval()
    for i in range(3):
        ref.zero_grad()
        train.loss_value(ref(x[i:i + 1].double()), y[i:i + 1], "mse").backward()
        for name, _ in ref.weight_specs():
            torch.testing.assert_close(grads[name][i], dict(ref.named_parameters())[name].grad)


@pytest.mark.parametrize("name", ["MLP-3-16", "MLP-BN-3-16", "RES-2-16", "RES-BN-2-16"])
def test_fully_connected_gradients_have_rank_one(name):
    torch.manual_seed(1)
    x, y = _data()
    table = theory.gradient_ranks(mlp.from_name(name, 10, 4), x, y)
    assert (table["patches"] == 1).all()
    assert table["rank"].max() == 1


@pytest.mark.parametrize("make, shape", [
    (lambda: conv.vgg16(1, 4, width=0.125, image_size=8), (1, 8, 8)),
    (lambda: conv.resnet18(1, 4, width=0.125), (1, 8, 8)),
    (lambda: vit.vit(8, 1, 4, dim=16, mlp_dim=16, depth=1, dropout=0.0), (1, 8, 8))])
def test_gradient_rank_at_most_patch_count(make, shape):
    torch.manual_seed(2)
    x, y = _data(n=6, shape=shape)
    table = theory.gradient_ranks(make(), x, y)
    assert (table["rank"] <= table["bound"]).all()
    assert (table["patches"] > 1).any()  # the bound is not the trivial fully-connected one


def test_patch_counts_of_a_strided_conv():
    class Net(mlp.WeightMatrixMixin, nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(2, 3, 3, stride=2, padding=1)
            self.fc = nn.Linear(3 * 16, 2)
            self._weight_specs = [("c.weight", False), ("fc.weight", True)]

        def forward(self, x):
            return self.fc(self.c(x).flatten(1))

    counts = theory.patch_counts(Net(), torch.randn(1, 2, 7, 7))
    assert counts == {"c.weight": conv.num_patches(7, 3, 2, 1), "fc.weight": 1}


def test_batch_gradient_rank_at_most_batch_size_with_batchnorm():
    torch.manual_seed(3)
    x, y = _data(n=3)
    table = theory.batch_gradient_ranks(mlp.from_name("MLP-BN-2-16", 10, 4), x, y)
    assert (table["rank"] <= 3).all() and (table["bound"] == 3).all()


def test_plain_sgd_is_the_papers_update():
    torch.manual_seed(4)
    net = mlp.MLP(10, 4, 1, 6)
    ref = mlp.MLP(10, 4, 1, 6).double()
    ref.load_state_dict(net.state_dict())
    x, y = _data(n=8)
    norms, snaps, losses = theory.plain_sgd(net, x, y, lr=0.1, lam=0.05, batch_size=8, steps=2, keep=[2])
    for _ in range(2):  # full batch: every step sees all 8 samples (order does not matter for the mean)
        ref.zero_grad()
        train.loss_value(ref(x.double()), y, "ce").backward()
        with torch.no_grad():
            for p in ref.parameters():
                p.copy_((1 - 2 * 0.1 * 0.05) * p - 0.1 * p.grad)
    torch.testing.assert_close(snaps[("features.0.weight", 2)], ref.features[0].weight.detach())
    assert norms["classifier.weight"].shape == (3, 2) and len(losses) == 2


@pytest.mark.parametrize("norm", ["fro", "spectral"])
def test_theorem_holds_and_the_unrolled_difference_has_low_rank(norm):
    torch.manual_seed(5)
    x, y = _data(n=40, shape=(20,), c=3)
    kw = dict(lr=0.2, lam=0.05, batch_size=2, steps=30)
    table = theory.rank_bound_check(mlp.MLP(20, 3, 2, 24), x, y, check_at=[10, 30], ks=[1, 3, 6, 9, 29],
                                        norm=norm, **kw)
    assert table["holds"].all()
    full = table[table["rank_budget"] >= table["min_dim"]]
    assert len(full) and (full["lhs"] == 0).all()
    # the left side is Eckart-Young's tail, as spectral.rank_k_error computes it from the matrix
    torch.manual_seed(5)
    norms_, snaps_, _ = theory.plain_sgd(mlp.MLP(20, 3, 2, 24), x, y, keep=[30], **kw)
    row = table[(table["layer"] == "features.2.weight") & (table["t"] == 30) & (table["k"] == 6)].iloc[0]
    W = snaps_[("features.2.weight", 30)]
    W = W / (torch.linalg.matrix_norm(W) if norm == "fro" else torch.linalg.matrix_norm(W, ord=2))
    assert row["lhs"] == pytest.approx(spectral.rank_k_error(W, 12, norm=norm), rel=1e-9, abs=1e-15)
    assert row["lhs_quarter_budget"] == pytest.approx(spectral.rank_k_error(W, 3, norm=norm), rel=1e-9, abs=1e-15)
    assert (table["lhs_quarter_budget"] >= table["lhs"] - 1e-15).all() and (table["rhs_lambda_x4"] <= table["rhs"]).all()
    # the proof's decomposition: W_t - (1 - 2 mu lambda)^k W_{t-k} has rank <= B k (fully connected: N = 1)
    torch.manual_seed(5)
    _, snaps, _ = theory.plain_sgd(mlp.MLP(20, 3, 2, 24), x, y, keep=[7, 10], **kw)
    U = snaps[("features.2.weight", 10)] - (1 - 2 * 0.2 * 0.05) ** 3 * snaps[("features.2.weight", 7)]
    assert spectral.numerical_rank(U, 1e-9) <= 2 * 3


def test_bad_inputs():
    x, y = _data()
    net = mlp.MLP(10, 4, 1, 6)
    with pytest.raises(ValueError, match="numbers of samples"):
        theory.per_sample_gradients(net, x, y[:3])
    with pytest.raises(ValueError, match="eps"):
        theory.gradient_ranks(net, x, y, eps=0)
    with pytest.raises(ValueError, match="below 1"):
        theory.plain_sgd(net, x, y, lr=1.0, lam=1.0, batch_size=2, steps=1)
    with pytest.raises(ValueError, match="check_at"):
        theory.rank_bound_check(net, x, y, lr=0.1, lam=0.1, batch_size=2, steps=5, check_at=[9], ks=[1])
    with pytest.raises(ValueError, match="weight_specs"):
        theory.patch_counts(nn.Linear(3, 2), torch.randn(1, 3))


def test_bound_regime_picks_the_largest_k_below_full_rank():
    got = theory.bound_regime(lr=0.1, lam=0.05, batch_size=4, ks=[1, 2, 5, 10, 15, 20], min_dim=64)
    assert got["k"] == 15  # 4 * 15 = 60 < 64 <= 4 * 20
    assert got["factor"] == pytest.approx(0.99**15) and got["exponent"] == pytest.approx(-15 * math.log(0.99))
    none = theory.bound_regime(lr=0.1, lam=0.05, batch_size=4, ks=[20], min_dim=64, patches=2)
    assert none == {"k": 0, "factor": 1.0, "exponent": 0.0}
    with pytest.raises(ValueError, match="min_dim"):
        theory.bound_regime(lr=0.1, lam=0.05, batch_size=4, ks=[1], min_dim=0)
