"""The fully-connected networks of Galanti et al. (2022), Section 5.1:

- MLP-L-H: L hidden layers `relu(W_l z)` of width H, then a linear classifier;
- MLP-BN-L-H: the same with BatchNorm before each ReLU, `relu(BN(W_l z))`;
- RES-L-H: a linear layer of width H, L residual blocks `z + relu(n2(W2 relu(n1(W1 z))))`, a linear
  classifier; RES-BN-L-H has BatchNorm as `n1, n2` (identity otherwise).

Every network of `lowrank.nets` exposes `weight_matrices()`: its trainable weight matrices as the
paper counts them (conv kernels reshaped to `C_out x (C_in k k)`), each with a flag telling whether it
is the final classifier (which the authors' code leaves out of the average rank). The helpers here
(`WeightMatrix`, `WeightMatrixMixin`) are shared by `conv` and `vit`.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import torch
from torch import nn

from ..spectral import conv_weight_as_matrix

__all__ = [
    "WeightMatrix",
    "WeightMatrixMixin",
    "MLP",
    "ResMLP",
    "mlp",
    "from_name",
    "MLP_NAMES",
]


class WeightMatrix(NamedTuple):
    name: str  # parameter name in `model.named_parameters()`
    matrix: torch.Tensor  # (..., C_out, fan_in); a leading ensemble axis when params are stacked
    classifier: bool  # True for the final classification layer


class WeightMatrixMixin:
    """`weight_matrices()` from a list `self._weight_specs = [(param_name, classifier), ...]`."""

    _weight_specs: list

    def weight_specs(self) -> list[tuple[str, bool]]:
        """`[(parameter name, is_classifier), ...]` of the matrices the paper counts, in order."""
        return list(self._weight_specs)

    def weight_matrices(self, params: dict | None = None, *, include_classifier: bool = True) -> list[WeightMatrix]:
        """The weight matrices as the paper counts them (detached).

        `params` is an optional `{name: tensor}` (e.g. stacked ensemble parameters of shape
        `(K, *shape)`); a leading ensemble axis is kept, so each matrix is then `(K, C_out, fan_in)`.
        """
        own = dict(self.named_parameters())
        source = own if params is None else params
        out = []
        for name, classifier in self._weight_specs:
            if classifier and not include_classifier:
                continue
            if name not in source:
                raise ValueError(f"params has no entry {name!r} (a weight matrix of {type(self).__name__})")
            p = source[name].detach()
            shape = own[name].shape
            lead = p.shape[: p.ndim - len(shape)]
            if p.shape[len(lead):] != shape:
                raise ValueError(f"params[{name!r}] has shape {tuple(p.shape)}; expected (..., {tuple(shape)})")
            mat = conv_weight_as_matrix(p) if not lead else p.reshape(*lead, shape[0], math.prod(shape[1:]))
            out.append(WeightMatrix(name, mat, classifier))
        return out


def _check_sizes(**sizes):
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


class MLP(WeightMatrixMixin, nn.Module):
    """MLP-L-H (`batchnorm=False`) or MLP-BN-L-H: `depth` hidden layers of width `width`.

    Inputs of any shape `(N, ...)` are flattened to `(N, in_features)`.
    """

    def __init__(self, in_features: int, num_classes: int, depth: int, width: int, *, batchnorm: bool = False,
                 bias: bool = True):
        super().__init__()
        _check_sizes(in_features=in_features, num_classes=num_classes, depth=depth, width=width)
        self.depth, self.width, self.batchnorm = depth, width, batchnorm
        layers, specs, fan_in = [], [], in_features
        for i in range(depth):
            layers.append(nn.Linear(fan_in, width, bias=bias))
            specs.append((f"features.{len(layers) - 1}.weight", False))
            if batchnorm:
                layers.append(nn.BatchNorm1d(width))
            layers.append(nn.ReLU())
            fan_in = width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(fan_in, num_classes, bias=bias)
        self._weight_specs = specs + [("classifier.weight", True)]

    def forward(self, x):
        return self.classifier(self.features(x.flatten(1)))


class _ResBlock(nn.Module):
    """`z + relu(n2(W2 relu(n1(W1 z))))` with `n1, n2` BatchNorm or identity."""

    def __init__(self, width: int, batchnorm: bool, bias: bool):
        super().__init__()
        self.fc1 = nn.Linear(width, width, bias=bias)
        self.n1 = nn.BatchNorm1d(width) if batchnorm else nn.Identity()
        self.fc2 = nn.Linear(width, width, bias=bias)
        self.n2 = nn.BatchNorm1d(width) if batchnorm else nn.Identity()

    def forward(self, z):
        return z + torch.relu(self.n2(self.fc2(torch.relu(self.n1(self.fc1(z))))))


class ResMLP(WeightMatrixMixin, nn.Module):
    """RES-L-H (`batchnorm=False`) or RES-BN-L-H: a linear layer `in -> width`, `depth` residual
    blocks, a linear classifier. Weight matrices: the input layer, two per block, the classifier."""

    def __init__(self, in_features: int, num_classes: int, depth: int, width: int, *, batchnorm: bool = False,
                 bias: bool = True):
        super().__init__()
        _check_sizes(in_features=in_features, num_classes=num_classes, depth=depth, width=width)
        self.depth, self.width, self.batchnorm = depth, width, batchnorm
        self.stem = nn.Linear(in_features, width, bias=bias)
        self.blocks = nn.Sequential(*[_ResBlock(width, batchnorm, bias) for _ in range(depth)])
        self.classifier = nn.Linear(width, num_classes, bias=bias)
        specs = [("stem.weight", False)]
        for i in range(depth):
            specs += [(f"blocks.{i}.fc1.weight", False), (f"blocks.{i}.fc2.weight", False)]
        self._weight_specs = specs + [("classifier.weight", True)]

    def forward(self, x):
        return self.classifier(self.blocks(self.stem(x.flatten(1))))


MLP_NAMES = ("MLP", "MLP-BN", "RES", "RES-BN")
_NAME = re.compile(r"^(MLP|MLP-BN|RES|RES-BN)-(\d+)-(\d+)$")


def mlp(kind: str, depth: int, width: int, in_features: int, num_classes: int, **kwargs) -> nn.Module:
    """`kind` in MLP_NAMES ("MLP", "MLP-BN", "RES", "RES-BN"), the paper's L (`depth`) and H (`width`)."""
    if kind not in MLP_NAMES:
        raise ValueError(f"kind={kind!r} is not allowed; choose one of {list(MLP_NAMES)}")
    cls = MLP if kind.startswith("MLP") else ResMLP
    return cls(in_features, num_classes, depth, width, batchnorm=kind.endswith("BN"), **kwargs)


def from_name(name: str, in_features: int, num_classes: int, **kwargs) -> nn.Module:
    """A network by its name in the paper, e.g. "MLP-BN-10-100", "RES-BN-5-500", "MLP-5-2000"."""
    match = _NAME.match(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(f"name={name!r} is not of the form KIND-L-H with KIND in {list(MLP_NAMES)}")
    kind, depth, width = match.group(1), int(match.group(2)), int(match.group(3))
    return mlp(kind, depth, width, in_features, num_classes, **kwargs)
