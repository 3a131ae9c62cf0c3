"""lowrank.core.nets.normalized: the parametrisation f = rho * f_V and its three architectures."""

import math

import pytest
import torch

from lowrank.core.nets import normalized


def test_every_direction_has_unit_frobenius_norm_and_f_is_rho_f_V():
    net = normalized.mlp(10, [7, 5], rho_init=3.5, seed=1).double()
    for V in net.directions():
        assert float(V.detach().norm()) == pytest.approx(1.0, abs=1e-12)
    x = torch.randn(6, 10, dtype=torch.float64)
    assert torch.allclose(net(x), 3.5 * net.f_V(x))
    assert net.depth == 3 and net.product_norm() == pytest.approx(3.5)


def test_function_ignores_the_scale_of_v_and_project_keeps_it():
    net = normalized.mlp(8, [6], seed=2).double()
    x = torch.randn(4, 8, dtype=torch.float64)
    before = net(x).detach().clone()
    with torch.no_grad():
        net.body[0].v.mul_(7.0)
        net.head.v.mul_(0.2)
    assert torch.allclose(net(x), before)
    net.project_()
    assert float(net.body[0].v.detach().norm()) == pytest.approx(1.0)
    assert torch.allclose(net(x), before)


def test_frozen_scale_enters_the_product_norm_but_is_not_trained():
    net = normalized.mlp(8, [6, 6], rho_init=2.0, g=1.5)
    assert net.product_norm() == pytest.approx(2.0 * 1.5**2)
    assert all(not b.requires_grad for b in net.buffers())
    names = {n for n, _ in net.named_parameters()}
    assert names == {"rho", "body.0.v", "body.1.v", "head.v"}
    assert net.parameter_groups()["rho"] == [net.rho]


def test_positive_homogeneity_without_biases():
    for net in (normalized.mlp(12, [9, 9]), normalized.tree_cnn((1, 16), channels=3),
                normalized.paper_cnn((1, 8, 8), channels=(4, 4, 4, 4), padding=1, hidden=10)):
        net = net.double()
        x = torch.randn(3, *net.in_shape, dtype=torch.float64)
        assert torch.allclose(net.f_V(2.5 * x), 2.5 * net.f_V(x), atol=1e-12)


def test_paper_cnn_has_the_papers_sizes():
    net = normalized.paper_cnn(num_outputs=2)
    assert net.depth == 6
    assert tuple(net.body[4].v.shape) == (1024, 3200)  # 128 x 5 x 5 into FC1 (Fig. 3 caption)
    assert tuple(net.head.v.shape) == (2, 1024)
    assert [tuple(b.v.shape) for b in net.body[:4]] == [(32, 3, 3, 3), (64, 32, 3, 3), (128, 64, 3, 3), (128, 128, 3, 3)]
    out, h = net.outputs_and_features(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 2) and h.shape == (2, 1024)


def test_tree_cnn_is_a_non_overlapping_tree():
    net = normalized.tree_cnn((1, 64))
    assert net.depth == 6 and net.num_patches() == [32, 16, 8, 4, 2]
    assert normalized.tree_cnn((3, 9, 9), kernel_size=3).num_patches() == [9]  # 2-D, 3x3 patches
    assert net.feature_dim == 2
    # one channel, kernel 2, unit filters: the Toeplitz product is sqrt of the product of the patch counts
    assert net.product_norm("toeplitz") == pytest.approx(net.product_norm() * math.sqrt(32 * 16 * 8 * 4 * 2), rel=1e-6)
    net2 = normalized.tree_cnn((3, 32, 32), channels=5, num_outputs=2)
    assert net2.depth == 5 and net2.feature_dim == 5 * 4
    assert net2(torch.randn(2, 3, 32, 32)).shape == (2, 2)
    with pytest.raises(ValueError, match="power"):
        normalized.tree_cnn((1, 48))


def test_weight_matrices_and_layer_norms():
    net = normalized.paper_cnn((1, 8, 8), channels=(4, 6, 6, 6), padding=1, hidden=12, rho_init=2.0)
    mats = net.weight_matrices()
    assert [m.classifier for m in mats] == [False] * 5 + [True]
    assert tuple(mats[1].matrix.shape) == (6, 4 * 9)
    norms = net.layer_norms()
    assert norms[:-1] == pytest.approx([1.0] * 5) and norms[-1] == pytest.approx(2.0)
    assert all(t >= f for t, f in zip(net.layer_norms("toeplitz"), norms))


def test_make_and_errors():
    assert normalized.make("mlp", (1, 8, 8), widths=[5]).in_shape == (64,)
    assert normalized.make("tree_cnn", (1, 16), channels=2).depth == 4
    with pytest.raises(ValueError, match="arch"):
        normalized.make("resnet", (3, 32, 32))
    with pytest.raises(ValueError, match="rho_init"):
        normalized.mlp(4, [3], rho_init=0.0)
    with pytest.raises(ValueError, match="one stride per conv layer"):
        normalized.paper_cnn(strides=(1, 2))
    with pytest.raises(ValueError, match="does not fit"):
        normalized.paper_cnn((1, 8, 8))


def test_euler_identity_for_rho():
    """Lemma 2's structure for the one free scale: rho d f / d rho = f."""
    net = normalized.mlp(5, [4]).double()
    x = torch.randn(3, 5, dtype=torch.float64)
    out = net(x).sum()
    (grad,) = torch.autograd.grad(out, net.rho)
    assert float(net.rho.detach() * grad) == pytest.approx(float(out.detach()))


def test_canonicalize_flips_rho_and_the_last_layer_together():
    net = normalized.mlp(6, [5], rho_init=2.0).double()
    x = torch.randn(4, 6, dtype=torch.float64)
    with torch.no_grad():
        net.rho.neg_()
    before = net(x).detach().clone()
    assert net.canonicalize_() and float(net.rho.detach()) == pytest.approx(2.0)
    assert torch.allclose(net(x), before)
    assert not net.canonicalize_()
