"""The normalised parametrisation of the square-loss paper (Xu, Rangamani, Liao, Galanti, Poggio 2023):

    f(x) = rho * f_V(x),   f_V(x) = V_L relu(V_{L-1} ... relu(V_1 x) ...),

where every layer but the last is weight-normalised, `W_k = g_k v_k / ||v_k||_F` with the scale `g_k`
**frozen** (a buffer, 1 by default, so that `||W_k||_F = 1` exactly as the paper's `V_k`), and the
last layer is `rho * V_L`: its direction `V_L = v_L / ||v_L||_F` and its norm `rho`, the one learnable
scale (the paper's Fig. 1B; `W_L = rho V_L` is the unnormalised top layer). There are no biases, so
the network is positively homogeneous and `rho * prod_k g_k` is the product of the layer norms.

A convolutional layer is normalised by the Frobenius norm of its **filter** (the kernel tensor),
not of its Toeplitz matrix; that is the norm the paper's bounds count.

Three architectures:

- `mlp`: fully connected, `in -> widths... -> outputs`;
- `paper_cnn`: the paper's CNN (4 conv layers 32/64/128/128, 3x3, then 1024 and the output), with
  strides (1, 2, 1, 2) and no padding so that a 32x32 input gives the paper's 128*5*5 = 3200 inputs
  to the first fully connected layer (the paper gives the sizes, not the strides: our choice);
- `tree_cnn`: the binary-tree (non-overlapping) CNN of Theorem 4: kernel = stride = k, so every
  unit sees its own patch of the layer below, until one unit is left; `d = k^L`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from lowrank.core.nets.conv import num_patches
from lowrank.core.spectral import conv_weight_as_matrix

__all__ = [
    "NormalizedLayer",
    "NormalizedNet",
    "NormalizedWeight",
    "mlp",
    "paper_cnn",
    "tree_cnn",
    "make",
    "ARCHITECTURES",
    "toeplitz_frobenius_norm",
]


class NormalizedWeight(NamedTuple):
    name: str
    matrix: torch.Tensor  # C_out x fan_in (conv kernels reshaped to C_out x (C_in prod(kernel)))
    classifier: bool  # True for the last layer V_L


def _check_int(value, name, minimum=1):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


class NormalizedLayer(nn.Module):
    """One layer `W = g v / ||v||_F` (linear, conv1d or conv2d; no bias), `g` frozen.

    `v` is initialised like PyTorch's default (Kaiming uniform) from `generator` and then scaled to
    `||v||_F = 1`; its scale is irrelevant to the function but sets the effective step size.
    """

    def __init__(self, kind: str, in_channels: int, out_channels: int, kernel_size: int = 1, stride: int = 1,
                 padding: int = 0, g: float = 1.0, generator: torch.Generator | None = None):
        super().__init__()
        if kind not in ("linear", "conv1d", "conv2d"):
            raise ValueError(f"kind must be 'linear', 'conv1d' or 'conv2d', got {kind!r}")
        _check_int(in_channels, "in_channels")
        _check_int(out_channels, "out_channels")
        _check_int(kernel_size, "kernel_size")
        _check_int(stride, "stride")
        _check_int(padding, "padding", minimum=0)
        if not g > 0:
            raise ValueError(f"the frozen scale g must be positive, got {g}")
        self.kind, self.stride, self.padding, self.kernel_size = kind, stride, padding, kernel_size
        shape = {"linear": (out_channels, in_channels), "conv1d": (out_channels, in_channels, kernel_size),
                 "conv2d": (out_channels, in_channels, kernel_size, kernel_size)}[kind]
        fan_in = math.prod(shape[1:])
        bound = 1 / math.sqrt(fan_in)  # kaiming_uniform(a=sqrt 5), PyTorch's default for Linear/Conv
        v = (torch.rand(shape, generator=generator) * 2 - 1) * bound
        self.v = nn.Parameter(v / v.norm())
        self.register_buffer("g", torch.tensor(float(g)))

    def direction(self) -> torch.Tensor:
        """`V = v / ||v||_F`, unit Frobenius norm."""
        return self.v / self.v.norm()

    def weight(self) -> torch.Tensor:
        """`g V`, the weight the layer applies."""
        return self.g * self.direction()

    @torch.no_grad()
    def project_(self) -> None:
        """Rescale `v` to unit norm (the function is unchanged): keeps `V_k` on the sphere as the
        Lagrange-multiplier model does, instead of letting `||v||` grow as plain WN does."""
        self.v.div_(self.v.norm())

    def forward(self, x):
        w = self.weight()
        if self.kind == "linear":
            return F.linear(x.flatten(1) if x.ndim > 2 else x, w)
        conv = F.conv1d if self.kind == "conv1d" else F.conv2d
        return conv(x, w, stride=self.stride, padding=self.padding)

    def extra_repr(self):
        s = f"{self.kind}, v={tuple(self.v.shape)}, g={float(self.g):g}"
        return s + (f", stride={self.stride}, padding={self.padding}" if self.kind != "linear" else "")


class NormalizedNet(nn.Module):
    """`f(x) = rho * V_L h(x)`, `h(x) = relu(W_{L-1} ... relu(W_1 x))` flattened (the features).

    `body` holds the weight-normalised layers 1..L-1 (each followed by ReLU), `head` the direction
    `V_L` of the last layer (unit Frobenius norm, no frozen scale), `rho` the learnable scalar.
    With `normalize_last=False` the last layer is a free matrix instead (then the norm of the top
    layer is `rho * ||W_L||_F`; `product_norm` accounts for it).
    """

    def __init__(self, body: list[NormalizedLayer], feature_dim: int, num_outputs: int, in_shape: tuple,
                 rho_init: float = 1.0, normalize_last: bool = True, generator: torch.Generator | None = None,
                 name: str = "normalized"):
        super().__init__()
        _check_int(num_outputs, "num_outputs")
        if not rho_init > 0:
            raise ValueError(f"rho_init must be positive, got {rho_init}")
        self.body = nn.ModuleList(body)
        self.head = NormalizedLayer("linear", feature_dim, num_outputs, generator=generator)
        self.normalize_last = bool(normalize_last)
        self.rho = nn.Parameter(torch.tensor(float(rho_init)))
        self.in_shape = tuple(in_shape)
        self.num_outputs = num_outputs
        self.feature_dim = feature_dim
        self.name = name
        self._layer_in_shapes = self._trace_shapes()

    # -- the function -------------------------------------------------------------------------
    def features(self, x) -> torch.Tensor:
        """`h(x)`, the last-layer features (N x p)."""
        for layer in self.body:
            x = F.relu(layer(x))
        return x.flatten(1)

    def classifier(self) -> torch.Tensor:
        """The last layer's direction `V_L` (num_outputs x p); the classifier is `rho V_L`."""
        return self.head.direction() if self.normalize_last else self.head.v

    def f_V(self, x) -> torch.Tensor:
        """The normalised network's output (N, or N x C when num_outputs > 1)."""
        return self.outputs_and_features(x)[0]

    def outputs_and_features(self, x) -> tuple[torch.Tensor, torch.Tensor]:
        """`(f_V(x), h(x))` in one pass."""
        h = self.features(x)
        out = F.linear(h, self.classifier())
        return (out.squeeze(-1) if self.num_outputs == 1 else out), h

    def forward(self, x):
        return self.rho * self.f_V(x)

    # -- what the paper counts ----------------------------------------------------------------
    @property
    def depth(self) -> int:
        """L, the number of weight layers."""
        return len(self.body) + 1

    def directions(self) -> list[torch.Tensor]:
        """`[V_1, ..., V_L]`, each of unit Frobenius norm (kernels keep their conv shape)."""
        return [layer.direction() for layer in self.body] + [self.classifier()]

    def frozen_scales(self) -> list[float]:
        return [float(layer.g) for layer in self.body]

    def layer_norms(self, conv: str = "filter") -> list[float]:
        """Frobenius norm of every layer's weight (conv: of the filter, or of its Toeplitz matrix
        on this network's input size with `conv="toeplitz"`); the last entry is `rho ||V_L||`."""
        if conv not in ("filter", "toeplitz"):
            raise ValueError(f"conv must be 'filter' or 'toeplitz', got {conv!r}")
        norms = []
        with torch.no_grad():
            for layer, shape in zip(self.body, self._layer_in_shapes):
                w = layer.weight()
                if conv == "toeplitz" and layer.kind != "linear":
                    norms.append(toeplitz_frobenius_norm(w, shape, layer.stride, layer.padding))
                else:
                    norms.append(float(w.norm()))
            norms.append(abs(float(self.rho.detach())) * float(self.classifier().detach().norm()))
        return norms

    def product_norm(self, conv: str = "filter") -> float:
        """The paper's rho: product of the layer norms (conv layers by their filter norm)."""
        return math.prod(self.layer_norms(conv))

    def num_patches(self) -> list[int]:
        """Output positions of every body layer (1 for a linear layer), by
        `lowrank.core.nets.conv.num_patches` (a 1-D conv counted as a 2-D one with a second axis of 1)."""
        out = []
        for layer, shape in zip(self.body, self._layer_in_shapes):
            k, s, p = layer.kernel_size, layer.stride, layer.padding
            if layer.kind == "linear":
                out.append(1)
            elif layer.kind == "conv1d":
                out.append(num_patches((shape[1], 1), (k, 1), (s, 1), (p, 0)))
            else:
                out.append(num_patches(tuple(shape[1:]), k, s, p))
        return out

    def weight_matrices(self) -> list[NormalizedWeight]:
        """The normalised weights `V_k` as matrices (conv kernels as `C_out x (C_in k k)`)."""
        mats = []
        for i, layer in enumerate(self.body, 1):
            mats.append(NormalizedWeight(f"V{i}", conv_weight_as_matrix(layer.direction().detach()), False))
        mats.append(NormalizedWeight(f"V{self.depth}", self.classifier().detach(), True))
        return mats

    def parameter_groups(self) -> dict:
        """`{"rho": [rho], "V": [v_1, ..., v_L]}` (weight decay acts on rho only)."""
        return {"rho": [self.rho], "V": [layer.v for layer in self.body] + [self.head.v]}

    @torch.no_grad()
    def canonicalize_(self) -> bool:
        """If rho < 0, flip the signs of rho and of the last layer (the function is unchanged), so that
        rho is a norm as in the paper; returns whether it flipped."""
        if float(self.rho.detach()) >= 0:
            return False
        self.rho.neg_()
        self.head.v.neg_()
        return True

    @torch.no_grad()
    def project_(self) -> None:
        """Put every `v_k` back on the unit sphere (the function is unchanged)."""
        for layer in self.body:
            layer.project_()
        if self.normalize_last:
            self.head.project_()

    def _trace_shapes(self) -> list[tuple]:
        shapes = []
        x = torch.zeros((1, *self.in_shape))
        with torch.no_grad():
            for layer in self.body:
                shapes.append(tuple(x.shape[1:]))
                x = layer(x)
            if x.flatten(1).shape[1] != self.feature_dim:
                raise ValueError(f"the body gives {x.flatten(1).shape[1]} features, "
                                 f"the head expects {self.feature_dim}")
        return shapes

    def extra_repr(self):
        return f"name={self.name}, L={self.depth}, in_shape={self.in_shape}, p={self.feature_dim}"


def _generator(seed: int) -> torch.Generator:
    _check_int(seed, "seed", minimum=0)
    return torch.Generator().manual_seed(seed)


def _out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    out = (size + 2 * padding - kernel) // stride + 1
    if out < 1:
        raise ValueError(f"a {kernel}-wide kernel (stride {stride}, padding {padding}) does not fit an input "
                         f"of size {size}")
    return out


def mlp(in_features: int, widths=(256, 256), num_outputs: int = 1, *, rho_init: float = 1.0, g: float = 1.0,
        normalize_last: bool = True, seed: int = 0) -> NormalizedNet:
    """Fully connected `rho * f_V`: `in_features -> widths[0] -> ... -> num_outputs`, L = len(widths) + 1."""
    _check_int(in_features, "in_features")
    widths = list(widths)
    if not widths:
        raise ValueError("widths must name at least one hidden layer")
    for i, w in enumerate(widths):
        _check_int(w, f"widths[{i}]")
    _check_int(num_outputs, "num_outputs")
    gen = _generator(seed)
    sizes = [in_features] + widths
    body = [NormalizedLayer("linear", a, b, g=g, generator=gen) for a, b in zip(sizes[:-1], sizes[1:])]
    return NormalizedNet(body, widths[-1], num_outputs, (in_features,), rho_init=rho_init,
                         normalize_last=normalize_last, generator=gen, name=f"mlp{widths}")


def paper_cnn(in_shape=(3, 32, 32), channels=(32, 64, 128, 128), kernel_size: int = 3, strides=(1, 2, 1, 2),
              padding: int = 0, hidden: int = 1024, num_outputs: int = 1, *, rho_init: float = 1.0, g: float = 1.0,
              normalize_last: bool = True, seed: int = 0) -> NormalizedNet:
    """The paper's CNN (Fig. 1B / Fig. 3): conv layers `channels` (3x3), then `hidden`, then the output.

    With the defaults a 3x32x32 input gives 128*5*5 = 3200 features into the first fully connected
    layer, as in the paper. For 1x8x8 digits use e.g. `padding=1` and fewer channels.
    """
    if len(in_shape) != 3:
        raise ValueError(f"in_shape must be (C, H, W), got {in_shape}")
    channels, strides = list(channels), list(strides)
    if len(strides) != len(channels):
        raise ValueError(f"one stride per conv layer: {len(channels)} channels, {len(strides)} strides")
    for i, (c, st) in enumerate(zip(channels, strides)):
        _check_int(c, f"channels[{i}]")
        _check_int(st, f"strides[{i}]")
    _check_int(kernel_size, "kernel_size")
    _check_int(padding, "padding", minimum=0)
    _check_int(hidden, "hidden", minimum=0)
    _check_int(num_outputs, "num_outputs")
    gen = _generator(seed)
    body, c_in, (h, w) = [], in_shape[0], in_shape[1:]
    for c_out, s in zip(channels, strides):
        body.append(NormalizedLayer("conv2d", c_in, c_out, kernel_size, s, padding, g=g, generator=gen))
        h, w = _out_size(h, kernel_size, s, padding), _out_size(w, kernel_size, s, padding)
        c_in = c_out
    flat = c_in * h * w
    if hidden:
        body.append(NormalizedLayer("linear", flat, hidden, g=g, generator=gen))
        flat = hidden
    return NormalizedNet(body, flat, num_outputs, tuple(in_shape), rho_init=rho_init, normalize_last=normalize_last,
                         generator=gen, name="paper_cnn")


def tree_cnn(in_shape, kernel_size: int = 2, channels: int = 1, num_outputs: int = 1, *, rho_init: float = 1.0,
             g: float = 1.0, normalize_last: bool = True, seed: int = 0) -> NormalizedNet:
    """The non-overlapping ("binary-tree" for kernel 2) CNN of Theorem 4.

    `in_shape` is `(C, d)` (1-D, the theorem's setting, `d = k^L`) or `(C, H, W)` with `H = W = k^L`
    (2-D, patches k x k). Layers 1..L-1 are convolutions with kernel = stride = k and `channels`
    channels (the theorem has one), each followed by ReLU; the last layer maps the remaining k (or
    k x k) units of all channels to the output, i.e. it is the tree's root. L = log_k(d).
    """
    _check_int(kernel_size, "kernel_size", minimum=2)
    _check_int(channels, "channels")
    in_shape = tuple(in_shape)
    if len(in_shape) not in (2, 3):
        raise ValueError(f"in_shape must be (C, d) or (C, H, W), got {in_shape}")
    spatial = in_shape[1:]
    if len(spatial) == 2 and spatial[0] != spatial[1]:
        raise ValueError(f"2-D inputs must be square, got {spatial}")
    d = spatial[0]
    L = round(math.log(d, kernel_size))
    if kernel_size**L != d or L < 2:
        raise ValueError(f"the input size {d} must be a power kernel_size^L with L >= 2 (kernel_size={kernel_size})")
    kind = "conv1d" if len(spatial) == 1 else "conv2d"
    gen = _generator(seed)
    body, c_in = [], in_shape[0]
    for _ in range(L - 1):
        body.append(NormalizedLayer(kind, c_in, channels, kernel_size, kernel_size, 0, g=g, generator=gen))
        c_in = channels
    feature_dim = channels * kernel_size ** len(spatial)
    return NormalizedNet(body, feature_dim, num_outputs, in_shape, rho_init=rho_init, normalize_last=normalize_last,
                         generator=gen, name=f"tree_cnn(k={kernel_size}, L={L})")


ARCHITECTURES = frozenset({"mlp", "paper_cnn", "tree_cnn"})


def make(arch: str, in_shape, num_outputs: int = 1, **kwargs) -> NormalizedNet:
    """Build a network by name: "mlp" (inputs flattened; `widths`), "paper_cnn" (`channels`,
    `strides`, `padding`, `hidden`, `kernel_size`) or "tree_cnn" (`kernel_size`, `channels`); the
    remaining keyword arguments (`rho_init`, `g`, `seed`, ...) go to the constructor."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch={arch!r} is not allowed; choose one of {sorted(ARCHITECTURES)}")
    in_shape = tuple(int(s) for s in in_shape)
    if arch == "mlp":
        return mlp(math.prod(in_shape), num_outputs=num_outputs, **kwargs)
    if arch == "paper_cnn":
        return paper_cnn(in_shape, num_outputs=num_outputs, **kwargs)
    return tree_cnn(in_shape, num_outputs=num_outputs, **kwargs)


def toeplitz_frobenius_norm(weight, in_shape, stride: int = 1, padding: int = 0) -> float:
    """Frobenius norm of the (Toeplitz) matrix that a conv layer applies to inputs of `in_shape`
    `(C_in, *spatial)`: every kernel entry counted once per output position where it meets a real
    (not padded) input. Without padding this is `sqrt(#output positions) * ||kernel||_F`.
    """
    w = torch.as_tensor(weight).detach().to(torch.float64)
    if w.ndim not in (3, 4):
        raise ValueError(f"a conv kernel has 3 (1-D) or 4 (2-D) dimensions, got shape {tuple(w.shape)}")
    if len(in_shape) != w.ndim - 1 or in_shape[0] != w.shape[1]:
        raise ValueError(f"in_shape {tuple(in_shape)} does not fit a kernel of shape {tuple(w.shape)}")
    conv = F.conv1d if w.ndim == 3 else F.conv2d
    ones = torch.ones((1, *in_shape), dtype=torch.float64)
    return float(conv(ones, w**2, stride=stride, padding=padding).sum().sqrt())
