"""lowrank: the package behind the companion book on low-rank structure in neural-network training.

One concept per module:

- `spectral`: singular values and every rank-like quantity; conv reshaping.
- `data` (generators: spiked Gaussian, index targets) and `datasets` (digits, MNIST-1D, local MNIST
  and CIFAR-10; nothing downloads).
- `nets/`: every architecture of the three papers, each exposing its weight matrices.
- `gradients` (Part I: the two-layer gradient, its decomposition, regularisers, conv1d, rule of
  thumb) and `gradient_dynamics` (its scaling laws and weight-normalised training).
- `train` (Part II: SGD with monitors, ensembles) and `sgd_theory` (per-sample ranks, Theorem 3.2).
- `square_training`, `collapse`, `bounds` (Part III: rho dynamics, neural collapse, Rademacher bounds).
- `plotting` (one figure style), `verdicts` (measured claims), `device`.
- `notebooks`, `build`, `runs`, `cli`, `report`, `ledger`, `sweeps`: executing, rerunning and
  sweeping the book's notebooks.

Importing the package turns on torch's deterministic algorithms (see `device.deterministic`).
"""

__version__ = "0.1.0"

from .device import deterministic as _deterministic

_deterministic()
