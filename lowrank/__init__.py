"""lowrank: the package behind the companion book on low-rank structure in neural-network training.

Modules, one concept each: `spectral` (singular values, ranks), `data` (generators), `nets`
(architectures), `gradients` (the two-layer gradient and its decomposition), `device`,
`plotting` (one figure style), `verdicts` (measured claims), `notebooks` (executing the book's
notebooks), `build` (the book build).
"""

__version__ = "0.1.0"

from .device import deterministic as _deterministic

_deterministic()
