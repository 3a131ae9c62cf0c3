"""Input validation shared by the public functions: fail early, name the argument.

One vocabulary for every public function (and, through the same rules, `lowrank run` and sweep
files): numbers are Python or NumPy numbers but never bools, finite, and bounded where the argument
needs it (`check_number`); counts are Python or NumPy integers, never bools (`check_int`); choices
are strings from a fixed set (`check_choice`); arrays are real, non-empty and finite in the
precision they are computed in (`as_tensor`; half-precision input is computed in float32, which
the linear algebra kernels support on every device).
"""

from __future__ import annotations

import numpy as np


def as_tensor(x, name: str, *, dtype="float64", min_ndim: int = 0, allow_empty=False):
    """Convert array-like `x` to a tensor of `dtype` (None keeps a float tensor's dtype).

    Raises ValueError naming `name` for too few dimensions, empty input or NaN/inf entries, and
    TypeError for complex input (converting it would drop the imaginary part without a word).
    """
    import torch  # here, not at the top: the command line reads this module's rules without torch

    if dtype == "float64":
        dtype = torch.float64
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
    if t.dtype == torch.bool:
        raise TypeError(f"{name} is boolean; pass numbers (e.g. its .double())")
    if t.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions, got shape {tuple(t.shape)}")
    if not allow_empty and t.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)})")
    if t.is_floating_point() and not _all_finite(t):  # judged in the input's own precision
        raise ValueError(f"{name} contains NaN or infinite entries")
    if dtype is not None:
        target = dtype
    elif not t.is_floating_point():
        target = torch.float64
    elif t.dtype in (torch.float16, torch.bfloat16):
        target = torch.float32  # no half-precision SVD / eigensolver on the CPU
    else:
        target = t.dtype
    if t.dtype == target:
        return t  # nothing converted: the check above covered it
    converted = t.to(target)
    if not _all_finite(converted):  # finite before, not after: the cast overflowed
        raise ValueError(f"{name} has entries beyond the range of {target} (largest {torch.finfo(target).max:.3g}); "
                         f"pass dtype=torch.float64 or rescale it")
    return converted


def _all_finite(t) -> bool:
    """Every entry of the float tensor `t` finite. A finite sum proves it in one pass without a mask (a
    NaN or an infinity makes the sum NaN or infinite); only a sum that is not finite, which a sum of
    huge finite entries can also be, is decided entry by entry."""
    import torch

    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def cut(text: str, limit: int = 300) -> str:
    """`text` cut to `limit` characters, the cut said."""
    return text if len(text) <= limit else text[: limit - 5] + " ..."


def short(value, limit: int = 80) -> str:
    """`repr(value)` cut to `limit` characters (an error message never prints a huge value)."""
    return cut(repr(value), limit)


def check_choice(value, name: str, allowed) -> None:
    """`value` is one of `allowed` (strings or other hashable constants); free text that is not is
    refused with the close matches."""
    try:
        ok = value in allowed
    except TypeError:  # unhashable (a list or a dict given for a name)
        ok = False
    if ok and isinstance(value, (bool, np.bool_)):  # True == 1: a bool is never a name or a count
        ok = any(isinstance(a, bool) for a in allowed)
    if not ok:
        import difflib

        close = difflib.get_close_matches(value, [str(a) for a in allowed], n=1) if isinstance(value, str) else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{name}={short(value)} is not allowed{hint}; choose one of {sorted(allowed, key=str)}")


def is_number(value) -> bool:
    """A real number (Python or NumPy), not a bool."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def check_number(value, name: str, *, gt=None, ge=None, lt=None, le=None) -> float:
    """`value` as a float: a finite real number (not a bool, not NaN) within the given bounds."""
    if not is_number(value) or not np.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {short(value)}")
    for bound, bad, text in ((gt, lambda b: value <= b, "greater than"), (ge, lambda b: value < b, "at least"),
                             (lt, lambda b: value >= b, "less than"), (le, lambda b: value > b, "at most")):
        if bound is not None and bad(bound):
            raise ValueError(f"{name} must be {text} {bound}, got {value!r}")
    return float(value)


def check_int(value, name: str, *, min=None, max=None) -> int:  # noqa: A002 (the rule words)
    """`value` as an int: a Python or NumPy integer (not a bool, not a float) within [min, max]."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer, got {short(value)} ({type(value).__name__})")
    if (min is not None and value < min) or (max is not None and value > max):
        where = (f"between {min} and {max}" if min is not None and max is not None else
                 f"at least {min}" if min is not None else f"at most {max}")
        raise ValueError(f"{name} must be an integer {where}, got {value!r}")
    return int(value)


def check_positive(value, name: str, *, strict=True) -> None:
    """A finite number, > 0 (`strict`) or >= 0; NaN and bools are refused."""
    ok = is_number(value) and np.isfinite(value) and (value > 0 if strict else value >= 0)
    if not ok:
        raise ValueError(f"{name} must be {'positive' if strict else 'non-negative'}, got {short(value)}")


SEED_MAX = 2**32 - 1  # numpy's and torch's seeds: larger ones overflow


def check_seed(value, name: str = "seed") -> None:
    """A seed is an integer in 0..2^32-1 (the same rule `lowrank run` checks before a kernel starts)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= SEED_MAX:
        raise ValueError(f"{name} must be an integer in 0..{SEED_MAX}, got {value!r}")


def check_finite(value, name: str) -> None:
    """A number that is neither NaN nor infinite."""
    check_number(value, name)


def user_path(value, name: str):
    """`value` as a `pathlib.Path` with `~` / `~user` expanded; ValueError naming `name` when the
    user has no home folder (`Path.expanduser` raises RuntimeError there)."""
    from pathlib import Path

    try:
        return Path(value).expanduser()
    except RuntimeError:
        raise ValueError(f"{name} {short(value)}: {str(value).split('/')[0]} names no user with a home folder") from None
