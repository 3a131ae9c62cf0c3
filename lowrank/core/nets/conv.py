"""The convolutional networks of Galanti et al. (2022), Section 5.1, in plain torch:

- `VGG`: VGG-16 with BatchNorm after every convolution (in place of dropout) and a single final
  linear layer (`vgg16`); max-pools that would shrink the feature map below 1x1 are left out, so
  the same network runs on 8x8 images (the book's ci scale) and on 32x32 CIFAR-10.
- `ResNet`: the CIFAR variant of ResNet-18 (3x3 stem, no max-pool, four stages of two basic blocks,
  global average pooling, one linear layer) (`resnet18`).

`width` scales every channel count (1.0 is the paper's network). `weight_matrices()` lists every
conv kernel, reshaped to `C_out x (C_in k k)` (`lowrank.core.spectral.conv_weight_as_matrix`), shortcut
1x1 convs included, and the final linear layer flagged as the classifier.
"""

from __future__ import annotations

import torch
from torch import nn

from .mlp import WeightMatrixMixin, _check_sizes

__all__ = ["VGG16_CFG", "VGG", "vgg16", "BasicBlock", "ResNet", "resnet18", "num_patches"]

VGG16_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def _channels(c: int, width: float) -> int:
    return max(1, int(round(c * width)))


def _check_width(width):
    if not (isinstance(width, (int, float)) and width > 0):
        raise ValueError(f"width must be a positive number, got {width!r}")


def num_patches(image_size, kernel_size, stride=1, padding=0) -> int:
    """`N` of Lemma 3.1: the number of patches (output positions) a conv layer sees,
    `prod_d ((h_d - k_d + 2 p_d) // s_d + 1)` over the two spatial dimensions.

    Parameters
    ----------
    image_size, kernel_size, stride, padding : each an int (the same in both dimensions) or a pair
        `(height, width)`, as `nn.Conv2d` takes them.
    """
    dims = [tuple(v) if isinstance(v, (tuple, list)) else (v, v) for v in (image_size, kernel_size, stride, padding)]
    n = 1
    for h, k, s, p in zip(*dims):
        _check_sizes(image_size=h, kernel_size=k, stride=s)
        side = (h - k + 2 * p) // s + 1
        if side < 1:
            raise ValueError(f"a {k}x{k} kernel does not fit a {h}x{h} input with padding {p}")
        n *= side
    return n


class VGG(WeightMatrixMixin, nn.Module):
    """A VGG network from a configuration (channel counts and "M" for 2x2 max-pooling)."""

    def __init__(self, cfg=VGG16_CFG, in_channels: int = 3, num_classes: int = 10, *, width: float = 1.0,
                 image_size: int = 32):
        super().__init__()
        _check_sizes(in_channels=in_channels, num_classes=num_classes, image_size=image_size)
        _check_width(width)
        layers, specs, c_in, side = [], [], in_channels, image_size
        for v in cfg:
            if v == "M":
                if side >= 2:
                    layers.append(nn.MaxPool2d(2))
                    side //= 2
                continue
            c_out = _channels(v, width)
            layers.append(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False))
            specs.append((f"features.{len(layers) - 1}.weight", False))
            layers += [nn.BatchNorm2d(c_out), nn.ReLU()]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(c_in, num_classes)
        self._weight_specs = specs + [("classifier.weight", True)]

    def forward(self, x):
        return self.classifier(self.pool(self.features(x)).flatten(1))


def vgg16(in_channels: int = 3, num_classes: int = 10, *, width: float = 1.0, image_size: int = 32) -> VGG:
    """VGG-16 with BatchNorm and one final linear layer (the paper's; `width < 1` for a reduced one)."""
    return VGG(VGG16_CFG, in_channels, num_classes, width=width, image_size=image_size)


class BasicBlock(nn.Module):
    """`relu(BN(conv(relu(BN(conv(x))))) + shortcut(x))`, shortcut a 1x1 conv + BN when the shape changes."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(WeightMatrixMixin, nn.Module):
    """CIFAR ResNet: 3x3 stem, stages of basic blocks (`blocks`), average pooling, a linear layer."""

    def __init__(self, blocks=(2, 2, 2, 2), in_channels: int = 3, num_classes: int = 10, *, width: float = 1.0):
        super().__init__()
        _check_sizes(in_channels=in_channels, num_classes=num_classes)
        _check_width(width)
        if not blocks or any(not isinstance(b, int) or b < 1 for b in blocks):
            raise ValueError(f"blocks must be positive integers, got {blocks!r}")
        c = _channels(64, width)
        self.conv1 = nn.Conv2d(in_channels, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        stages, c_in = [], c
        for i, n in enumerate(blocks):
            c_out = _channels(64 * 2**i, width)
            stage = [BasicBlock(c_in, c_out, 1 if i == 0 else 2)] + [BasicBlock(c_out, c_out, 1) for _ in range(n - 1)]
            stages.append(nn.Sequential(*stage))
            c_in = c_out
        self.layers = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(c_in, num_classes)
        specs = [(name, False) for name, p in self.named_parameters() if p.ndim == 4]
        self._weight_specs = specs + [("classifier.weight", True)]

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return self.classifier(self.pool(self.layers(out)).flatten(1))


def resnet18(in_channels: int = 3, num_classes: int = 10, *, width: float = 1.0) -> ResNet:
    """ResNet-18, CIFAR variant (`width < 1` for a reduced one)."""
    return ResNet((2, 2, 2, 2), in_channels, num_classes, width=width)
