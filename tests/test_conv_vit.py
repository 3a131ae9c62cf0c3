"""VGG-16 (BatchNorm, one linear layer), ResNet-18 (CIFAR) and the ViT: sizes, weight matrices."""

import math

import pytest
import torch
from torch import nn

from lowrank.core import spectral
from lowrank.core.nets import conv, vit


def test_resnet18_has_the_known_parameter_count():
    # the CIFAR ResNet-18 (Kuang Liu's pytorch-cifar and the authors' code) has 11,173,962 parameters
    assert sum(p.numel() for p in conv.resnet18().parameters()) == 11_173_962


def test_vgg16_structure():
    net = conv.vgg16()
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 13
    assert sum(isinstance(m, nn.BatchNorm2d) for m in net.modules()) == 13
    assert sum(isinstance(m, nn.Linear) for m in net.modules()) == 1
    assert sum(isinstance(m, nn.MaxPool2d) for m in net.modules()) == 5
    wm = net.weight_matrices()
    assert len(wm) == 14 and wm[-1].classifier and not any(w.classifier for w in wm[:-1])
    assert wm[0].matrix.shape == (64, 27)  # C_out x (C_in k k)
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_reduced_vgg_on_8x8_skips_pools():
    net = conv.vgg16(1, 10, width=0.125, image_size=8)
    assert sum(isinstance(m, nn.MaxPool2d) for m in net.modules()) == 3
    assert net(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    assert net.weight_matrices()[0].matrix.shape == (8, 9)


def test_resnet_weight_matrices_include_shortcuts():
    net = conv.resnet18(1, 10, width=0.125)
    names = [w.name for w in net.weight_matrices()]
    assert len(names) == 1 + 16 + 3 + 1  # stem, 16 block convs, 3 shortcut convs, classifier
    assert sum("shortcut" in n for n in names) == 3
    for w in net.weight_matrices():
        p = dict(net.named_parameters())[w.name]
        torch.testing.assert_close(w.matrix, spectral.conv_weight_as_matrix(p))
    assert net(torch.randn(3, 1, 8, 8)).shape == (3, 10)


def test_vit_structure_and_patches():
    net = vit.vit(8, 1, 10, dim=16, mlp_dim=24, depth=2, heads=8)
    wm = net.weight_matrices()
    assert len(wm) == 1 + 6 * 2 + 2
    assert wm[-1].classifier and wm[-1].matrix.shape == (10, 24)
    x = torch.randn(2, 1, 8, 8)
    # the patches are the 4x4 blocks, flattened channel-major like unfold
    unfold = nn.functional.unfold(x, kernel_size=4, stride=4).transpose(1, 2)
    torch.testing.assert_close(net.patches(x), unfold)
    assert net(x).shape == (2, 10)
    assert sum(isinstance(m, nn.Dropout) and m.p == 0.1 for m in net.modules()) >= 1


def test_paper_vit_defaults():
    net = vit.vit()
    assert len(net.layers) == 6 and net.layers[0].attn.heads == 8 and net.patch_size == 4
    assert net.pos_embed.shape[1] == 64 + 1


def test_num_patches():
    assert conv.num_patches(32, 3, 1, 1) == 1024
    assert conv.num_patches(8, 3, 2, 1) == 16
    x = torch.randn(1, 2, 9, 9)
    out = nn.Conv2d(2, 3, 3, stride=2, padding=1)(x)
    assert conv.num_patches(9, 3, 2, 1) == math.prod(out.shape[-2:])
    with pytest.raises(ValueError, match="does not fit"):
        conv.num_patches(2, 5)


@pytest.mark.parametrize("kwargs, match", [({"width": 0}, "width"), ({"image_size": 0}, "image_size")])
def test_bad_vgg(kwargs, match):
    with pytest.raises(ValueError, match=match):
        conv.vgg16(**kwargs)


def test_bad_vit():
    with pytest.raises(ValueError, match="multiple"):
        vit.vit(10)
    with pytest.raises(ValueError, match="divisible"):
        vit.vit(8, dim=12, heads=8)
    with pytest.raises(ValueError, match="blocks"):
        conv.ResNet(blocks=(2, 0))
