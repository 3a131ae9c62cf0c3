"""A sweep point for the sweep tests: a seeded computation that can be told to kill its worker."""

import os
from pathlib import Path

import torch

from lowrank.core import spectral


def ranked_matrix(size: int, seed: int, crash_file: str = ""):
    """Numerical and stable rank of a seeded random low-rank-plus-noise matrix."""
    if crash_file and Path(crash_file).exists() and seed == 1:
        os._exit(9)  # the worker dies as if killed: no exception, no cleanup
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(size, 3, generator=g, dtype=torch.float64) @ torch.randn(3, size, generator=g, dtype=torch.float64)
    M += 1e-4 * torch.randn(size, size, generator=g, dtype=torch.float64)
    return {"rank": spectral.numerical_rank(M, eps=1e-3), "stable_rank": spectral.stable_rank(M)}
