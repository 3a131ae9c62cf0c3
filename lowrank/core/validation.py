"""Input validation shared by the public functions: fail early, name the argument."""

from __future__ import annotations

import numpy as np
import torch


def as_tensor(x, name: str, *, dtype=torch.float64, min_ndim: int = 0, allow_empty=False):
    """Convert array-like `x` to a tensor of `dtype` (None keeps a float tensor's dtype).

    Raises ValueError naming `name` for too few dimensions, empty input or NaN/inf entries, and
    TypeError for complex input (converting it would drop the imaginary part without a word).
    """
    if isinstance(x, torch.Tensor):
        t = x.detach()
    else:
        try:
            t = torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name} must be array-like of numbers, got {type(x).__name__}") from err
    if t.is_complex():
        raise TypeError(f"{name} is complex ({t.dtype}); only real input is supported: pass its real part, "
                        f"its modulus, or the real matrix [[Re, -Im], [Im, Re]] explicitly")
    if dtype is not None:
        t = t.to(dtype)
    elif not t.is_floating_point():
        t = t.to(torch.float64)
    if t.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions, got shape {tuple(t.shape)}")
    if not allow_empty and t.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)})")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} contains NaN or infinite entries")
    return t


def check_choice(value, name: str, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; choose one of {sorted(allowed)}")


def check_positive(value, name: str, *, strict=True) -> None:
    ok = value > 0 if strict else value >= 0
    if not ok:
        raise ValueError(f"{name} must be {'positive' if strict else 'non-negative'}, got {value}")


SEED_MAX = 2**32 - 1  # numpy's and torch's seeds: larger ones overflow


def check_seed(value, name: str = "seed") -> None:
    """A seed is an integer in 0..2^32-1 (the same rule `lowrank run` checks before a kernel starts)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= SEED_MAX:
        raise ValueError(f"{name} must be an integer in 0..{SEED_MAX}, got {value!r}")


def check_finite(value, name: str) -> None:
    """A number that is neither NaN nor infinite."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not np.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
