"""lowrank: the package behind the companion book on low-rank structure in neural-network training.

Three layers; imports run one way only, book -> parts -> core (tests/test_layers.py):

- `lowrank.core`: what the three parts share: input validation, spectral quantities (every
  rank-like number, once), data (synthetic generators, real data sets), networks, training.
- One subpackage per part of the book:
  - `lowrank.gradients` (Part I, rank-two gradients of two-layer networks),
  - `lowrank.sgd` (Part II, SGD with weight decay and low rank),
  - `lowrank.square` (Part III, square-loss dynamics, neural collapse, bounds).
- `lowrank.book`: the machinery that executes, reruns, sweeps and publishes the notebooks
  (build, runs, cli, sweeps, verdicts, ledger, plotting, report).

Importing changes no global state: notebooks and runners call `lowrank.core.device.reproducible`.
The science (`core` and the parts) needs only numpy, scipy, pandas and torch.
"""

__version__ = "0.1.0"
