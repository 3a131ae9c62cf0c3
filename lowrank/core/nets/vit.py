"""The small vision transformer of Galanti et al. (2022), Section 5.1: images cut into 4x4
patches, 6 pre-norm self-attention layers with 8 heads, then a head of two fully-connected layers
with GELU and dropout 0.1.

Written out in plain torch (separate query, key, value and output projections) so that every weight
matrix is a parameter of its own; `weight_matrices()` lists the patch embedding, the q, k, v, output
and two MLP matrices of each layer, the head's hidden layer and the classifier (flagged).
"""

from __future__ import annotations

import torch
from torch import nn

from .mlp import WeightMatrixMixin, _check_sizes

__all__ = ["Attention", "TransformerLayer", "ViT", "vit"]


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.heads = heads
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.out = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        n, t, d = x.shape
        h = self.heads
        split = lambda z: z.reshape(n, t, h, d // h).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // h) ** 0.5, dim=-1)
        y = (self.drop(att) @ v).transpose(1, 2).reshape(n, t, d)
        return self.out(y)


class TransformerLayer(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_dim: int, dropout: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_dim)
        self.fc2 = nn.Linear(mlp_dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.drop(self.fc2(self.drop(nn.functional.gelu(self.fc1(self.norm2(x))))))


class ViT(WeightMatrixMixin, nn.Module):
    """ViT with a class token and learned position embeddings."""

    def __init__(self, image_size: int = 32, in_channels: int = 3, num_classes: int = 10, *, patch_size: int = 4,
                 dim: int = 512, depth: int = 6, heads: int = 8, mlp_dim: int = 512, dropout: float = 0.1):
        super().__init__()
        _check_sizes(image_size=image_size, in_channels=in_channels, num_classes=num_classes, patch_size=patch_size,
                     dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim)
        if image_size % patch_size:
            raise ValueError(f"image_size={image_size} must be a multiple of patch_size={patch_size}")
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.patch_size = patch_size
        tokens = (image_size // patch_size) ** 2
        self.patch_embed = nn.Linear(in_channels * patch_size**2, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, tokens + 1, dim))
        self.layers = nn.Sequential(*[TransformerLayer(dim, heads, mlp_dim, dropout) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head_fc = nn.Linear(dim, mlp_dim)
        self.head_drop = nn.Dropout(dropout)
        self.classifier = nn.Linear(mlp_dim, num_classes)
        specs = [("patch_embed.weight", False)]
        for i in range(depth):
            specs += [(f"layers.{i}.attn.{m}.weight", False) for m in ("q", "k", "v", "out")]
            specs += [(f"layers.{i}.fc1.weight", False), (f"layers.{i}.fc2.weight", False)]
        self._weight_specs = specs + [("head_fc.weight", False), ("classifier.weight", True)]

    def patches(self, x):
        """`(N, C, H, W) -> (N, tokens, C p p)`, row-major over the patch grid."""
        n, c, h, w = x.shape
        p = self.patch_size
        x = x.reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(n, (h // p) * (w // p), c * p * p)

    def forward(self, x):
        z = self.patch_embed(self.patches(x))
        z = torch.cat([self.cls_token.expand(z.shape[0], -1, -1), z], dim=1) + self.pos_embed
        z = self.norm(self.layers(z))[:, 0]
        return self.classifier(self.head_drop(nn.functional.gelu(self.head_fc(z))))


def vit(image_size: int = 32, in_channels: int = 3, num_classes: int = 10, **kwargs) -> ViT:
    """The paper's ViT (patch 4, 6 layers, 8 heads); `dim`, `mlp_dim` smaller for a reduced one."""
    return ViT(image_size, in_channels, num_classes, **kwargs)
