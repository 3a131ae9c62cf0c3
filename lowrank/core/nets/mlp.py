"""The fully-connected networks of Galanti et al. (2022), Section 5.1:

- MLP-L-H: L hidden layers `relu(W_l z)` of width H, then a linear classifier;
- MLP-BN-L-H: the same with BatchNorm before each ReLU, `relu(BN(W_l z))`;
- RES-L-H: a linear layer of width H, L residual blocks `z + relu(n2(W2 relu(n1(W1 z))))`, a linear
  classifier; RES-BN-L-H has BatchNorm as `n1, n2` (identity otherwise).

Every network of `lowrank.core.nets` exposes `weight_matrices()`: its trainable weight matrices as the
paper counts them (conv kernels reshaped to `C_out x (C_in k k)`), each with a flag telling whether it
is the final classifier (which the authors' code leaves out of the average rank). The helpers here
(`WeightMatrix`, `WeightMatrixMixin`) are shared by `conv` and `vit`.

Ensembles: `forward_stacked(params, buffers, x)` evaluates K networks of the same shape at once from
parameters and buffers stacked along a leading axis (`torch.func.stack_module_state`), with batched
matrix products and one BatchNorm call over all members' channels. `lowrank.core.train` uses it in place
of `vmap(functional_call)`, which on two CPU cores spends most of a small MLP's step in per-layer
dispatch; it computes the same function (tested against each member's own `forward`).
`stacked_layout(params)` gives the parameters as `forward_stacked` consumes them (biases `(K, out, 1)`,
BatchNorm scales and shifts `(K*C,)`): training from leaves in that layout leaves the reshapes out of
the autograd graph (a few to 30 % of a small MLP's forward and backward, measured on a loaded
2-core CPU) and computes the same numbers, bit for bit.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import torch
from torch import nn

from lowrank.core.spectral import conv_weight_as_matrix

__all__ = [
    "WeightMatrix",
    "WeightMatrixMixin",
    "MLP",
    "ResMLP",
    "mlp",
    "from_name",
    "stacked_linear",
    "stacked_batchnorm",
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


def _column(b: torch.Tensor) -> torch.Tensor:
    """A stacked bias (K, out) as (K, out, 1); given as (K, out, 1) already (`stacked_layout`), itself."""
    return b if b.ndim == 3 else b.unsqueeze(-1)


def _flat(v: torch.Tensor) -> torch.Tensor:
    """Stacked BatchNorm parameters (K, C) as (K*C,); given as (K*C,) already (`stacked_layout`), themselves."""
    return v if v.ndim == 1 else v.reshape(-1)


def stacked_linear(params: dict, prefix: str, z: torch.Tensor) -> torch.Tensor:
    """K `nn.Linear` layers at once, on feature-major activations: `z` (K, fan_in, n), or (fan_in, n)
    shared by all members, -> (K, out, n); weights `params[prefix + "weight"]` (K, out, fan_in), optional
    bias (K, out) or (K, out, 1). Feature-major, the weights' gradients come out in their own layout and
    BatchNorm needs no transposed copy."""
    W, b = params[prefix + "weight"], params.get(prefix + "bias")
    K, out, fan_in = W.shape
    if z.ndim == 2:  # one product for all members
        y = (W.reshape(K * out, fan_in) @ z).view(K, out, z.shape[1])
        return y if b is None else y + _column(b)
    if b is None:
        return torch.bmm(W, z)
    return torch.baddbmm(_column(b), W, z)


def stacked_batchnorm(module: nn.BatchNorm1d, params: dict, buffers: dict, prefix: str,
                      z: torch.Tensor) -> torch.Tensor:
    """K `nn.BatchNorm1d` layers at once on feature-major `z` (K, C, n), in `module`'s mode (train:
    batch statistics, running statistics updated in place in `buffers`; eval: running statistics).
    Seen as (1, K*C, n), the K*C channels go through one `batch_norm` call, which normalises each
    channel over the n samples of its member. Scale and shift: (K, C) or (K*C,)."""
    K, C, n = z.shape
    if module.training:
        buffers[prefix + "num_batches_tracked"].add_(1)
    out = nn.functional.batch_norm(z.reshape(1, K * C, n), buffers[prefix + "running_mean"].view(-1),
                                   buffers[prefix + "running_var"].view(-1), _flat(params[prefix + "weight"]),
                                   _flat(params[prefix + "bias"]), module.training, module.momentum, module.eps)
    return out.view(K, C, n)


def _stacked_sequential(seq: nn.Sequential, prefix: str, params, buffers, z):
    for i, layer in enumerate(seq):
        if isinstance(layer, nn.Linear):
            z = stacked_linear(params, f"{prefix}{i}.", z)
        elif isinstance(layer, nn.BatchNorm1d):
            z = stacked_batchnorm(layer, params, buffers, f"{prefix}{i}.", z)
        elif isinstance(layer, nn.ReLU):
            z = torch.relu(z)
        else:
            raise TypeError(f"no stacked form for {type(layer).__name__}")
    return z


class StackedMixin:
    """`forward_stacked` for the MLPs; `_stacked_body(params, buffers, z)` maps feature-major inputs
    (K, in, n) or shared (in, n) to logits (K, C, n)."""

    def stacked_layout(self, params: dict) -> dict:
        """Views of the stacked `params` (K, ...) in the layout `forward_stacked` consumes: linear biases
        (K, out, 1), BatchNorm scales and shifts (K*C,), the rest as they are. Leaves in this layout
        give the same gradients as leaves in the stacked layout (reshaped back), with no reshape nodes in
        the autograd graph."""
        shapes = self.__dict__.get("_stacked_shapes")
        if shapes is None:
            shapes = {}
            for name, module in self.named_modules():
                for pname, _ in module.named_parameters(recurse=False):
                    if isinstance(module, nn.BatchNorm1d):
                        shapes[f"{name}.{pname}"] = "flat"
                    elif isinstance(module, nn.Linear) and pname == "bias":
                        shapes[f"{name}.{pname}"] = "column"
            self.__dict__["_stacked_shapes"] = shapes
        how = {"flat": _flat, "column": _column}
        return {k: how[shapes[k]](v) if k in shapes else v for k, v in params.items()}

    def forward_stacked(self, params: dict, buffers: dict, x: torch.Tensor, *, shared: bool = False) -> torch.Tensor:
        """The K networks whose parameters are stacked in `params` (and buffers in `buffers`) on their
        inputs: `x` (K, n, ...) one batch per member, or (n, ...) with `shared=True`. Returns the
        logits (K, n, num_classes). BatchNorm follows `self.training`."""
        K = next(iter(params.values())).shape[0]
        if shared:
            z = x.reshape(x.shape[0], -1).T
        elif x.shape[0] != K:
            raise ValueError(f"x has {x.shape[0]} member batches for {K} stacked networks")
        else:
            z = x.reshape(K, x.shape[1], -1).mT
        return self._stacked_body(params, buffers, z).mT


def _check_sizes(**sizes):
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


class MLP(StackedMixin, WeightMatrixMixin, nn.Module):
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

    def _stacked_body(self, params, buffers, z):
        return stacked_linear(params, "classifier.", _stacked_sequential(self.features, "features.", params, buffers, z))


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

    def forward_stacked(self, params, buffers, prefix: str, z):
        def norm(module, name, h):
            return stacked_batchnorm(module, params, buffers, prefix + name, h) if isinstance(module, nn.BatchNorm1d) else h

        h = torch.relu(norm(self.n1, "n1.", stacked_linear(params, prefix + "fc1.", z)))
        return z + torch.relu(norm(self.n2, "n2.", stacked_linear(params, prefix + "fc2.", h)))


class ResMLP(StackedMixin, WeightMatrixMixin, nn.Module):
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

    def _stacked_body(self, params, buffers, z):
        z = stacked_linear(params, "stem.", z)
        for i, block in enumerate(self.blocks):
            z = block.forward_stacked(params, buffers, f"blocks.{i}.", z)
        return stacked_linear(params, "classifier.", z)


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
