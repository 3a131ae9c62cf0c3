"""Networks of the three papers, one module per family; each exposes its weight matrices as its
paper counts them.

- `two_layer`: `f(x) = gamma_m a^T sigma(W x)` of the low-rank-gradients paper, activations by name.
- `mlp`, `conv`, `vit`: Part II's MLP-L-H / MLP-BN / RES / RES-BN, VGG-16 and ResNet-18, the ViT;
  `zoo.for_data` builds any of them by its paper name for a data set.
- `normalized`: Part III's `rho * f_V` (weight normalisation with a learnable scale).
"""

from .two_layer import (
    ACTIVATIONS,
    WEIGHT_STRUCTURES,
    Activation,
    activation,
    gamma_m,
    normalize_rows,
    outer_weights,
    sphere_rows,
    sphere_rows_orthogonal_to,
    tilted_rows,
    two_layer_forward,
    weight_structure,
)

__all__ = [
    "ACTIVATIONS",
    "WEIGHT_STRUCTURES",
    "Activation",
    "activation",
    "gamma_m",
    "normalize_rows",
    "outer_weights",
    "sphere_rows",
    "sphere_rows_orthogonal_to",
    "tilted_rows",
    "two_layer_forward",
    "weight_structure",
]
from . import conv, mlp, vit, zoo  # noqa: E402
from . import normalized  # noqa: E402
