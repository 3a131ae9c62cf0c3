"""MLP-L-H, MLP-BN-L-H, RES-L-H, RES-BN-L-H of Galanti et al.: structure, forward pass, weight matrices."""

import pytest
import torch
from torch import nn

from lowrank.core.nets import mlp


@pytest.mark.parametrize("name, n_matrices, n_bn", [("MLP-3-16", 4, 0), ("MLP-BN-3-16", 4, 3), ("RES-2-16", 6, 0),
                                                     ("RES-BN-2-16", 6, 4)])
def test_structure_and_weight_matrices(name, n_matrices, n_bn):
    net = mlp.from_name(name, 12, 5)
    out = net(torch.randn(7, 3, 4))  # inputs are flattened
    assert out.shape == (7, 5)
    wm = net.weight_matrices()
    assert len(wm) == n_matrices
    assert [w.classifier for w in wm] == [False] * (n_matrices - 1) + [True]
    assert wm[0].matrix.shape == (16, 12) and wm[-1].matrix.shape == (5, 16)
    assert all(w.matrix.shape == (16, 16) for w in wm[1:-1])
    assert sum(isinstance(m, nn.BatchNorm1d) for m in net.modules()) == n_bn
    assert len(net.weight_matrices(include_classifier=False)) == n_matrices - 1
    # every counted matrix is a trainable Linear weight; no other Linear weight is left out
    linear = {f"{n}.weight" for n, m in net.named_modules() if isinstance(m, nn.Linear)}
    assert {w.name for w in wm} == linear


def test_mlp_forward_is_the_paper_formula():
    torch.manual_seed(0)
    net = mlp.MLP(6, 3, 2, 8, bias=False)
    x = torch.randn(4, 6)
    W = [w.matrix for w in net.weight_matrices()]
    expected = torch.relu(torch.relu(x @ W[0].T) @ W[1].T) @ W[2].T
    torch.testing.assert_close(net(x), expected)


def test_residual_block_is_the_paper_formula():
    torch.manual_seed(0)
    net = mlp.ResMLP(6, 3, 1, 8, batchnorm=True).eval()
    with torch.no_grad():  # non-trivial running statistics
        for bn in (net.blocks[0].n1, net.blocks[0].n2):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
    x = torch.randn(5, 6)
    blk = net.blocks[0]

    def bn(m, z):
        return (z - m.running_mean) / torch.sqrt(m.running_var + m.eps) * m.weight + m.bias

    z = net.stem(x)
    z = z + torch.relu(bn(blk.n2, blk.fc2(torch.relu(bn(blk.n1, blk.fc1(z))))))
    torch.testing.assert_close(net(x), net.classifier(z))


def test_weight_matrices_of_stacked_params():
    nets = [mlp.from_name("RES-BN-1-8", 4, 3) for _ in range(3)]
    params, _ = torch.func.stack_module_state(nets)
    wm = nets[0].weight_matrices(params)
    assert [w.matrix.shape for w in wm] == [(3, 8, 4), (3, 8, 8), (3, 8, 8), (3, 3, 8)]
    torch.testing.assert_close(wm[1].matrix[2], nets[2].blocks[0].fc1.weight.detach())
    with pytest.raises(ValueError, match="no entry"):
        nets[0].weight_matrices({})
    with pytest.raises(ValueError, match="shape"):
        nets[0].weight_matrices({k: v[0, :1] for k, v in params.items()})


@pytest.mark.parametrize("bad", ["MLP-0-10", "MLP10-100", "CNN-2-3", "MLP-BN-2", 5])
def test_bad_names(bad):
    with pytest.raises(ValueError):
        mlp.from_name(bad, 4, 2)


def test_bad_sizes():
    with pytest.raises(ValueError, match="width"):
        mlp.MLP(4, 2, 2, 0)
    with pytest.raises(ValueError, match="kind"):
        mlp.mlp("LSTM", 2, 4, 4, 2)


@pytest.mark.parametrize("kind", ["MLP", "MLP-BN", "RES", "RES-BN"])
def test_forward_stacked_equals_each_members_forward(kind):
    """The batched ensemble forward against each network's own nn.Module forward, in train mode
    (BatchNorm batch statistics, running statistics updated) and in eval mode with shared inputs."""
    from torch.func import stack_module_state

    nets = []
    for seed in range(3):
        torch.manual_seed(seed)
        nets.append(mlp.mlp(kind, 2, 8, 6, 3))
    params, buffers = stack_module_state(nets)
    buffers = {k: v.clone() for k, v in buffers.items()}
    base = mlp.mlp(kind, 2, 8, 6, 3).to("meta")
    x = torch.randn(3, 5, 6, generator=torch.Generator().manual_seed(0))
    out = base.train().forward_stacked(params, buffers, x)
    expected = torch.stack([net.train()(x[k]) for k, net in enumerate(nets)])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    for name in buffers:
        own = torch.stack([dict(net.named_buffers())[name] for net in nets])
        torch.testing.assert_close(buffers[name], own, rtol=1e-5, atol=1e-6)
    shared = torch.randn(7, 2, 3, generator=torch.Generator().manual_seed(1))  # flattened to 6 features
    out = base.eval().forward_stacked(params, buffers, shared, shared=True)
    expected = torch.stack([net.eval()(shared) for net in nets])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="2 member batches for 3"):
        base.forward_stacked(params, buffers, x[:2])
