"""Singular values and every rank-like quantity of the book.

All functions take a matrix or a batch of matrices `(..., m, n)` (NumPy or torch) and compute in
float64 by default. A single matrix gives Python numbers; a batch gives tensors of shape `(...)`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from lowrank.core.validation import as_tensor, check_choice, check_int, check_number

__all__ = [
    "singular_values",
    "singular_values_by_shape",
    "monitor_dtype",
    "numerical_rank",
    "rank_from_singular_values",
    "spectrum_stats",
    "stable_rank",
    "effective_rank",
    "rank_k_error",
    "alignment",
    "principal_angles",
    "orthonormal_basis",
    "column_complement",
    "conv_weight_as_matrix",
    "count_outliers",
    "leading_left_vectors",
    "TopSingular",
    "top_singular",
    "top_singular_value",
    "top_singular_of_product",
    "top_singular_from",
    "leading_spectrum",
]


def _matrix(M, name="M", dtype=torch.float64):
    return as_tensor(M, name, dtype=dtype, min_ndim=2)


def _out(t: torch.Tensor, single: bool):
    return t.item() if single else t


def singular_values(M, *, dtype=torch.float64) -> torch.Tensor:
    """Singular values of `M` (..., m, n) in descending order, shape (..., min(m, n)).

    `dtype=None` keeps the input's floating dtype (faster for float32 monitors).
    """
    return torch.linalg.svdvals(_matrix(M, dtype=dtype))


# On a GPU, cuSOLVER's SVD synchronises with the host and has a fixed cost per call that dwarfs the
# work for small matrices; batches whose matrices have at most this many entries are copied to the
# CPU (LAPACK) instead. Not yet timed on a GPU (bench/gpu.py times both paths to set it).
GPU_SVD_MIN_ENTRIES = 128 * 128


def monitor_dtype(eps: float) -> torch.dtype:
    """The dtype that resolves singular values down to `eps * ||M||`: float32 (unit round-off 6e-8,
    so SVD errors stay well below 1e-4 of the top value) for `eps >= 1e-4`, float64 below."""
    return torch.float32 if eps >= 1e-4 else torch.float64


def singular_values_by_shape(mats, *, dtype=None) -> list[torch.Tensor]:
    """Singular values of each matrix (or batch of matrices) in `mats`, in order, with one `svdvals`
    call per group of equal shape (e.g. the nine 100x100 hidden layers of an MLP-10-100 ensemble).

    `dtype=None` keeps each input's dtype. On CUDA, groups of small matrices go through the CPU
    (`GPU_SVD_MIN_ENTRIES`); the results come back on each input's device.
    """
    mats = [as_tensor(M, f"mats[{i}]", dtype=dtype, min_ndim=2) for i, M in enumerate(mats)]
    groups: dict = {}
    for i, M in enumerate(mats):
        groups.setdefault((M.shape, M.dtype, M.device), []).append(i)
    out: list = [None] * len(mats)
    for (shape, _, device), idx in groups.items():
        batch = torch.stack([mats[i] for i in idx])
        small = shape[-1] * shape[-2] <= GPU_SVD_MIN_ENTRIES
        s = torch.linalg.svdvals(batch.cpu() if device.type == "cuda" and small else batch).to(device)
        for j, i in enumerate(idx):
            out[i] = s[j]
    return out


def _scale_free_singular_values(M, dtype) -> torch.Tensor:
    """Singular values of `M` times a power of two per matrix, for the scale-free quantities (ranks).

    A matrix whose largest entry is outside [tiny^(1/4), max^(1/4)] of the working dtype (e.g. 1e308
    everywhere: its SVD overflows, its squared norms too) is first multiplied by the power of two
    that brings that entry to [0.5, 1): exact in floating point, so the ratios of singular values
    are those of `M`. Other matrices are left untouched (bit-identical to `singular_values`)."""
    t = as_tensor(M, "M", dtype=None, min_ndim=2)
    target = dtype if dtype is not None else t.dtype
    info = torch.finfo(target)
    big = t.abs().amax(dim=(-2, -1), keepdim=True)
    outside = (big > info.max ** 0.25) | ((big < info.tiny ** 0.25) & (big > 0))
    if outside.any():
        _, exponent = torch.frexp(big.to(torch.float64))
        shift = torch.where(outside, -exponent, torch.zeros_like(exponent)).to(torch.float64)
        half = torch.trunc(shift / 2)  # in two steps: 2^shift alone over- or underflows for subnormals
        t = torch.ldexp(torch.ldexp(t.to(torch.float64), half), shift - half)
    return torch.linalg.svdvals(t.to(target))


def _top_and_fro(s: torch.Tensor):
    top = s[..., 0]
    if (top == 0).any():
        raise ValueError("M is the zero matrix: its rank-like quantities are undefined")
    return top, torch.linalg.vector_norm(s, dim=-1)


def _check_eps(eps) -> None:
    """A rank threshold relative to a norm: in (0, 1) (at 1 or above no singular value passes: rank 0)."""
    try:
        check_number(eps, "eps", gt=0, lt=1)
    except ValueError:
        raise ValueError(f"eps must be positive and below 1 (a threshold relative to the norm, in (0, 1)), got {eps!r}") from None


def _power_of_two_scale(*mats) -> list:
    """Each matrix times the power of two that brings its largest entry to [0.5, 1) (exact: column
    spaces and ratios unchanged; a zero matrix is left as it is), with the exponents removed."""
    out = []
    for M in mats:
        big = M.abs().max() if M.numel() else M.new_zeros(())
        if big == 0:
            out.append((M, 0))
            continue
        _, e = torch.frexp(big.to(torch.float64))
        e = int(e)
        half = -e // 2
        out.append((torch.ldexp(torch.ldexp(M, torch.tensor(half, dtype=M.dtype)),
                                torch.tensor(-e - half, dtype=M.dtype)), e))
    return out


def _singular_value_input(s, name: str) -> torch.Tensor:
    """Singular values as given (their dtype kept): real, non-empty, finite, non-negative, one
    spectrum per last axis."""
    s = as_tensor(s, name, dtype=None, min_ndim=1)
    if (s < 0).any():
        raise ValueError(f"{name} are singular values: they cannot be negative")
    if (s[..., 1:] > s[..., :-1]).any():
        raise ValueError(f"{name} are singular values in descending order (as svdvals returns them): "
                         f"got an increasing pair; sort them first")
    return s


def _norm_input(fro, s: torch.Tensor) -> torch.Tensor:
    """Frobenius norms `(...)` given beside the singular values `s`: finite, non-negative, one per spectrum."""
    fro = as_tensor(fro, "fro", dtype=None)
    if (fro < 0).any():
        raise ValueError("fro are Frobenius norms: they cannot be negative")
    if fro.shape != s.shape[:-1]:
        raise ValueError(f"fro must hold one norm per spectrum, shape {tuple(s.shape[:-1])}, got {tuple(fro.shape)}")
    return fro


def _spectrum_norm(s: torch.Tensor) -> torch.Tensor:
    """`||s||` along the last axis, scaled by the largest value first (1e200 does not overflow)."""
    plain = torch.linalg.vector_norm(s, dim=-1)
    top = s[..., 0]
    lost = ~torch.isfinite(plain) | ((plain == 0) & (top > 0))  # overflowed or underflowed: rescale those
    if not lost.any():
        return plain
    scale = torch.where(top > 0, top, torch.ones_like(top)).unsqueeze(-1)
    return torch.where(lost, torch.linalg.vector_norm(s / scale, dim=-1) * scale[..., 0], plain)


def rank_from_singular_values(s: torch.Tensor, eps: float, norm: str = "spectral", *,
                              fro: torch.Tensor | None = None) -> torch.Tensor:
    """Number of singular values above `eps * ||M||`, from the singular values `s` (..., r), descending.

    Parameters
    ----------
    s : singular values of M, descending along the last axis (any float dtype; compared in it);
        unsorted, negative or non-finite values are refused.
    eps : rank threshold, relative to the norm below.
    norm : "spectral" (divide by `s[..., 0]`, the paper's text as the book first read it) or
        "frobenius" (divide by `||M||_F`: the paper's `||.||_2` at l.1034 and the authors' code,
        `matrix_rank(M / ||M||_F, tol=eps)`).
    fro : Frobenius norms `(...)` computed from the matrices (more accurate than `||s||` for float32 `s`);
        finite and non-negative.

    Returns
    -------
    Integer tensor `(...)`; 0 where the norm is 0 (a zero matrix).
    """
    s = _singular_value_input(s, "s")
    _check_eps(eps)
    check_choice(norm, "norm", {"spectral", "frobenius"})
    top = s[..., 0]
    if norm == "spectral":
        size = top
    elif fro is not None:
        size = _norm_input(fro, s).to(s.dtype)
    else:  # ||s|| / s_1 from the ratios s / s_1 (in [0, 1]): no square overflows or underflows
        safe_top = torch.where(top > 0, top, torch.ones_like(top)).unsqueeze(-1)
        ratios = s / safe_top
        rank = (ratios > eps * torch.linalg.vector_norm(ratios, dim=-1, keepdim=True)).sum(-1)
        return torch.where(top > 0, rank, 0)
    rank = (s > eps * size.unsqueeze(-1)).sum(-1)
    return torch.where(size > 0, rank, 0)


def numerical_rank(M, eps: float = 1e-3, norm: str = "spectral", *, dtype=torch.float64):
    """Number of singular values of `M / ||M||` above `eps` (`rank_from_singular_values`).

    norm="spectral" divides by the largest singular value; norm="frobenius" divides by the
    Frobenius norm (the paper's `||.||_2`, l.1034, and the authors' public code, which calls
    `torch.linalg.matrix_rank(M / ||M||_F, tol=eps)`). Scale-free: right for any finite `M`, 1e308 or
    1e-310 everywhere included. A zero matrix raises.
    """
    _check_eps(eps)
    check_choice(norm, "norm", {"spectral", "frobenius"})
    s = _scale_free_singular_values(M, dtype)
    _top_and_fro(s)
    return _out(rank_from_singular_values(s, eps, norm), s.ndim == 1)


def spectrum_stats(s: torch.Tensor, eps: float, fro: torch.Tensor | None = None) -> dict:
    """The per-matrix record of the training monitors, from singular values `s` (..., r), descending.

    Parameters
    ----------
    s : singular values (cast to float64).
    eps : rank threshold.
    fro : Frobenius norms computed from the matrices in float64 (more accurate than `||s||` when `s`
        is float32); by default `||s||`.

    Returns
    -------
    `{"rank_spectral": spectral-normalised count, "rank_frobenius": Frobenius-normalised count, "stable_rank":
    ||M||_F^2 / ||M||_2^2, "weight_norm": ||M||_F, "spectral_norm": ||M||_2}`, tensors `(...)`. A zero
    matrix (weights decayed to zero) has rank 0 and a NaN stable rank.
    """
    s = _singular_value_input(s, "s").double()
    _check_eps(eps)
    top = s[..., 0]
    safe_top = torch.where(top > 0, top, torch.ones_like(top))
    ratios = s / safe_top.unsqueeze(-1)  # in [0, 1]: squares neither overflow (1e308) nor underflow (1e-320)
    if fro is None:
        fro_over_top = torch.linalg.vector_norm(ratios, dim=-1)
        fro = fro_over_top * top  # beyond float64's largest number (1.7e308 and 1e308): inf, as IEEE rounds it
    else:
        fro = _norm_input(fro, s).double()
        fro_over_top = fro / safe_top
    stable = torch.where(top > 0, fro_over_top ** 2, torch.full_like(top, math.nan))
    rank_frobenius = torch.where(top > 0, (ratios > eps * fro_over_top.unsqueeze(-1)).sum(-1), 0)
    return {"rank_spectral": rank_from_singular_values(s, eps, "spectral"),
            "rank_frobenius": rank_frobenius,
            "stable_rank": stable, "weight_norm": fro, "spectral_norm": top}


def stable_rank(M, *, dtype=torch.float64):
    """`||M||_F^2 / ||M||_2^2` (scale-free: finite for any finite non-zero `M`)."""
    s = _scale_free_singular_values(M, dtype)
    top, fro = _top_and_fro(s)
    return _out(fro**2 / top**2, s.ndim == 1)


def effective_rank(M, *, dtype=torch.float64):
    """Roy and Vetterli's effective rank: `exp(H(p))` with `p = s / sum(s)` and `0 log 0 = 0`."""
    s = _scale_free_singular_values(M, dtype)
    _top_and_fro(s)
    p = s / s.sum(-1, keepdim=True)
    plogp = torch.where(p > 0, p * torch.log(torch.where(p > 0, p, 1.0)), 0.0)
    return _out(torch.exp(-plogp.sum(-1)), s.ndim == 1)


def rank_k_error(M, k: int, norm: str = "fro", *, dtype=torch.float64):
    """`min_{rank(A) <= k} ||M - A||` by Eckart-Young: the tail of the singular values."""
    try:
        k = check_int(k, "k", min=0)
    except ValueError:
        raise ValueError(f"k must be a non-negative integer, got {k!r}") from None
    check_choice(norm, "norm", {"fro", "spectral"})
    s = singular_values(M, dtype=dtype)
    tail = s[..., k:]
    if norm == "fro":
        err = torch.linalg.vector_norm(tail, dim=-1)
    elif tail.shape[-1] == 0:
        err = torch.zeros(s.shape[:-1], dtype=s.dtype)
    else:
        err = tail[..., 0]
    return _out(err, s.ndim == 1)


def alignment(u, v):
    """Absolute cosine `|<u, v>| / (||u|| ||v||)` over the last axis, for any finite non-zero vectors
    (each is divided by its largest entry first; non-finite input is refused)."""
    u = as_tensor(u, "u", min_ndim=1)
    v = as_tensor(v, "v", min_ndim=1)
    if u.shape[-1] != v.shape[-1]:
        raise ValueError(f"u and v must have the same length, got {u.shape[-1]} and {v.shape[-1]}")
    su, sv = u.abs().amax(-1, keepdim=True), v.abs().amax(-1, keepdim=True)
    if (su == 0).any() or (sv == 0).any():
        raise ValueError("alignment of a zero vector is undefined")
    u, v = u / su, v / sv  # scaled before normalising: 1e200 and 1e-200 neither overflow nor vanish
    nu, nv = torch.linalg.vector_norm(u, dim=-1), torch.linalg.vector_norm(v, dim=-1)
    cos = (u * v).sum(-1).abs() / (nu * nv)
    return _out(cos.clamp(max=1.0), cos.ndim == 0)


def orthonormal_basis(A, name: str = "A") -> torch.Tensor:
    """An orthonormal basis of the column space of `A` (d x k), as the columns of a d x r matrix.

    Parameters
    ----------
    A : matrix (d x k), NumPy or torch; computed in float64.
    name : how errors call `A`.

    Returns
    -------
    The left singular vectors of `A` whose singular values exceed `s_1 max(d, k) eps_mach` (the
    numerical-rank cut of LAPACK's `matrix_rank`), d x r. Raises ValueError for a zero matrix.
    """
    A = _matrix(A, name)
    (A, _), = _power_of_two_scale(A)  # the column space is unchanged; 1e308 entries no longer overflow the SVD
    U, s, _ = torch.linalg.svd(A, full_matrices=False)
    tol = s[0] * max(A.shape) * torch.finfo(A.dtype).eps if s.numel() else 0
    r = int((s > tol).sum())
    if r == 0:
        raise ValueError(f"{name} has no column space (zero matrix)")
    return U[:, :r]


_orthonormal_basis = orthonormal_basis  # the former private name


def principal_angles(A, B) -> torch.Tensor:
    """Principal angles (radians, ascending) between the column spaces of `A` and `B`.

    Small angles come from the sines (Bjorck and Golub) so that angles near zero stay accurate;
    the number of angles is the smaller of the two subspace dimensions. Two tall matrices of one
    shape N x k with N / 2 < k < N and full column rank (e.g. m x d weights with m > d) take the shorter
    road through the orthogonal complements (`column_complement`, N x (N - k)): two subspaces of one
    dimension have the same nonzero angles as their complements, so the k - (N - k) others are 0.
    """
    A = _matrix(A, "A")
    B = _matrix(B, "B")
    if A.ndim != 2 or B.ndim != 2:
        raise ValueError("principal_angles takes two matrices, not batches")
    if A.shape[0] != B.shape[0]:
        raise ValueError(f"A and B must have the same number of rows, got {A.shape[0]} and {B.shape[0]}")
    N, k = A.shape
    if A.shape == B.shape and k < N < 2 * k:
        CA, CB = column_complement(A), column_complement(B)
        if CA is not None and CB is not None:
            zeros = torch.zeros(k - CA.shape[1], dtype=A.dtype)
            return torch.cat([zeros, _angles_between_bases(CA, CB)])
    QA, QB = _orthonormal_basis(A, "A"), _orthonormal_basis(B, "B")
    if QA.shape[1] < QB.shape[1]:
        QA, QB = QB, QA
    return _angles_between_bases(QA, QB)


COMPLEMENT_MIN_RCOND = 1e-8  # a far better condition than the numerical-rank cut (~ N eps) of orthonormal_basis


def column_complement(A) -> torch.Tensor | None:
    """An orthonormal basis (N x (N - k)) of the orthogonal complement of the column space of `A`
    (N x k, k <= N), from a Householder QR of `A`: the last N - k columns of its Q. Returns None when
    `A` is not clearly of full column rank (LAPACK's estimate of the reciprocal condition number of R
    below `COMPLEMENT_MIN_RCOND`), where the complement's dimension would be in doubt."""
    from scipy.linalg.lapack import dtrcon

    A = _matrix(A, "A")
    N, k = A.shape
    if k > N:
        raise ValueError(f"A must have at least as many rows as columns, got {tuple(A.shape)}")
    (A, _), = _power_of_two_scale(A)  # the column space is unchanged
    h, tau = torch.geqrf(A)
    rcond, info = dtrcon(np.triu(h[:k].numpy()), norm="1")
    if info != 0 or not rcond >= COMPLEMENT_MIN_RCOND:
        return None
    tail = torch.zeros(N, N - k, dtype=A.dtype)
    tail[k:] = torch.eye(N - k, dtype=A.dtype)
    return torch.ormqr(h, tau, tail)  # Q's last N - k columns


def _angles_between_bases(QA, QB) -> torch.Tensor:
    """Principal angles (ascending) between span(QA) and span(QB), orthonormal columns, QA the wider."""
    cosines = torch.linalg.svdvals(QA.T @ QB).clamp(max=1.0)  # descending
    residual = QB - QA @ (QA.T @ QB)
    sines = torch.linalg.svdvals(residual).clamp(max=1.0).flip(0)  # ascending
    angles_from_sin = torch.arcsin(sines)
    angles_from_cos = torch.arccos(cosines)
    # arccos loses accuracy near 0, arcsin near pi/2: take each where it is well conditioned.
    return torch.where(cosines**2 >= 0.5, angles_from_sin, angles_from_cos)


def count_outliers(M, max_outliers: int = 5, gap: float = 1.5) -> int:
    """Number of singular values of `M` separated from the bulk.

    The count is the largest `k <= max_outliers` with `s_k / s_{k+1} >= gap` (0 when there is
    none): the leading values sit above the last large gap among the top `max_outliers + 1`
    (only those are computed, `top_singular`). `M` may also be those leading singular values,
    descending (a 1-D tensor), when they are already at hand.
    """
    try:
        check_number(gap, "gap", gt=1)
    except ValueError:
        raise ValueError(f"gap must be greater than 1, got {gap!r}") from None
    max_outliers = check_int(max_outliers, "max_outliers", min=1)
    if np.ndim(M) == 1:
        s = _singular_value_input(M, "singular values")
        if (s[1:] > s[:-1]).any():
            raise ValueError("count_outliers takes singular values in descending order")
    else:
        M = _matrix(M)
        if M.ndim != 2:
            raise ValueError("count_outliers takes a single matrix")
        s = top_singular(M, min(max_outliers + 1, min(M.shape))).s
    k_max = min(max_outliers, s.shape[0] - 1)
    ratios = s[:k_max] / s[1 : k_max + 1].clamp(min=torch.finfo(s.dtype).tiny)
    big = torch.nonzero(ratios >= gap).flatten()
    return int(big[-1]) + 1 if big.numel() else 0


def leading_left_vectors(M, k: int = 1) -> torch.Tensor:
    """The `k` leading left singular vectors of a matrix, as columns (signs are arbitrary)."""
    M = _matrix(M)
    if M.ndim != 2:
        raise ValueError(f"M must be a matrix, got shape {tuple(M.shape)}")
    _check_k(k, min(M.shape))
    return top_singular(M, int(k)).U


class TopSingular(NamedTuple):
    """The `k` leading singular triplets of a matrix: `M ~ U diag(s) Vh`, `s` descending."""

    U: torch.Tensor  # m x k
    s: torch.Tensor  # k
    Vh: torch.Tensor  # k x n


# Below this smallest dimension (or for k above a quarter of it) a full LAPACK SVD is as fast as
# ARPACK's Lanczos iterations and simpler.
ITERATIVE_SVD_MIN_DIM = 200


def _check_k(k, small: int) -> int:
    try:
        return check_int(k, "k", min=1, max=small)
    except ValueError:
        raise ValueError(f"k must be an integer between 1 and {small}, got {k!r}") from None


def _full_svd_is_simpler(device: torch.device, small: int, k: int) -> bool:
    return device.type != "cpu" or small <= ITERATIVE_SVD_MIN_DIM or 4 * k > small


def _arpack(op, shape: tuple, k: int, v0, dtype, what: str) -> TopSingular:
    """ARPACK's k leading triplets of `op` (a matrix or a LinearOperator), descending, to machine
    precision, from `v0` (length min(shape)) or a constant start vector."""
    from scipy.sparse.linalg import svds

    small = min(shape)
    start = np.ones(small) if v0 is None else as_tensor(v0, "v0", min_ndim=1).detach().cpu().numpy()
    if start.shape != (small,):
        raise ValueError(f"v0 must have length {small} (the smaller side of {what}), got {start.shape}")
    u, s, vh = svds(op, k=k, tol=0, v0=start)
    order = np.argsort(s)[::-1].copy()  # ARPACK returns them ascending
    return TopSingular(*(torch.from_numpy(np.ascontiguousarray(x)).to(dtype) for x in (u[:, order], s[order], vh[order])))


def top_singular(M, k: int = 1, *, v0=None) -> TopSingular:
    """The `k` leading singular values and vectors of one matrix, without a full SVD.

    On the CPU, for matrices whose smaller side exceeds `ITERATIVE_SVD_MIN_DIM` and `k` below a
    quarter of it, ARPACK's implicitly restarted Lanczos method (`scipy.sparse.linalg.svds`) to
    machine precision (`tol=0`) from a deterministic start vector: `v0` (length `min(M.shape)`,
    e.g. the previous step's leading vector, which shortens the iteration) or a constant vector.
    Otherwise (small matrices, large `k`, tensors on a GPU) a full `torch.linalg.svd` on the
    input's device, sliced. Values agree with the full SVD to about 1e-13 of `s_1` (tested);
    vectors up to sign, where the singular values are distinct.
    """
    M = _matrix(M, dtype=None)
    if M.ndim != 2:
        raise ValueError(f"M must be a matrix, got shape {tuple(M.shape)}")
    k = _check_k(k, min(M.shape))
    (Ms, e), = _power_of_two_scale(M)  # exact: the vectors are those of M, the values 2^-e times M's

    def back(top: TopSingular) -> TopSingular:
        s = torch.ldexp(top.s, torch.tensor(e, dtype=top.s.dtype)) if e else top.s
        if not torch.isfinite(s).all():
            raise ValueError(f"the largest singular value of M exceeds the largest {M.dtype} number; rescale M")
        return TopSingular(top.U, s, top.Vh)

    if _full_svd_is_simpler(M.device, min(M.shape), k):
        U, s, Vh = torch.linalg.svd(Ms, full_matrices=False)
        return back(TopSingular(U[:, :k], s[:k], Vh[:k]))
    return back(_arpack(Ms.detach().numpy(), tuple(M.shape), k, v0, M.dtype, "M"))


def top_singular_of_product(A, B, k: int = 1, *, v0=None) -> TopSingular:
    """The `k` leading singular triplets of `A^T B` (A n x p, B n x q) without forming it.

    ARPACK iterates on the operator `v -> A^T (B v)` (and its transpose), so each step costs
    `O(n (p + q))` instead of the `O(n p q)` of the product; below `ITERATIVE_SVD_MIN_DIM` (or for
    large `k`, or on a GPU) the product is formed and `top_singular` takes it. Agrees with the SVD
    of the formed product to about 1e-13 of `s_1` (tested).
    """
    A = _matrix(A, "A", dtype=None)
    B = _matrix(B, "B", dtype=None)
    if A.ndim != 2 or B.ndim != 2 or A.shape[0] != B.shape[0]:
        raise ValueError(f"A and B must be matrices with the same number of rows, got {tuple(A.shape)} and "
                         f"{tuple(B.shape)}")
    shape = (A.shape[1], B.shape[1])
    k = _check_k(k, min(shape))
    (A, ea), (B, eb) = _power_of_two_scale(A, B)  # A^T B = 2^(ea + eb) As^T Bs: the product cannot overflow

    def back(top: TopSingular) -> TopSingular:
        s = torch.ldexp(top.s, torch.tensor(ea + eb, dtype=top.s.dtype)) if ea + eb else top.s
        if not torch.isfinite(s).all():
            raise ValueError(f"the largest singular value of A^T B exceeds the largest {A.dtype} number "
                             f"(A and B are finite; their product is not): rescale A or B")
        return TopSingular(top.U, s, top.Vh)

    if _full_svd_is_simpler(A.device, min(shape), k):
        return back(top_singular(A.T @ B, k, v0=v0))
    from scipy.sparse.linalg import LinearOperator

    An, Bn = A.detach().numpy(), B.detach().numpy()
    op = LinearOperator(shape, matvec=lambda v: An.T @ (Bn @ v), rmatvec=lambda u: Bn.T @ (An @ u), dtype=An.dtype)
    return back(_arpack(op, shape, k, v0, A.dtype, "A^T B"))


def top_singular_from(M, k: int, start, *, tol: float = 1e-12, value_tol: float = 1e-9,
                      max_iter: int = 20) -> TopSingular | None:
    """The `k` leading singular triplets of `M` (d x m), by block subspace iteration from `start`.

    `start` is a d x p block (p > k), e.g. the left vectors this function or `top_singular(M_prev, p)`
    returned for a nearby matrix: along a training run the gradient moves little per step, so a few
    iterations of `Q <- orth(M M^T Q)` with a Rayleigh-Ritz step converge, each two products of `M`
    with a thin block (BLAS-3; the Ritz pairs give `M^T Q` for free) instead of ARPACK's many matrix-vector products. One fixed pseudo-random
    column joins the block, so that a direction the start misses (a start inside an invariant subspace,
    or a new leading direction) grows like in the power method. Convergence, after at least two
    iterations: the leading pair has the residual `||M v_1 - s_1 u_1|| <= tol * s_1` (so `s_1` is
    exact to `tol * s_1` and `u_1` to `tol` over the gap `1 - s_2 / s_1`), and the values `s_2..s_k`
    moved by at most `value_tol * s_1` in the last iteration (a value inside a flat bulk, `s_2 ~ s_3`,
    creeps up slowly: it is then known to about `value_tol * s_1`). Singular vectors beyond the first are
    returned as they stand: inside a flat bulk only their span is determined. Returns the p leading
    Ritz triplets (pass `.U` as the next start), or None when `max_iter` iterations do not converge
    (the caller falls back to `top_singular`).
    """
    M = _matrix(M, dtype=None)
    if M.ndim != 2:
        raise ValueError(f"M must be a matrix, got shape {tuple(M.shape)}")
    start = as_tensor(start, "start", min_ndim=2).to(M.dtype)
    k = _check_k(k, min(M.shape))
    p = start.shape[1]
    if start.shape[0] != M.shape[0] or not k < p < min(M.shape):
        raise ValueError(f"start must be a {M.shape[0]} x p block with {k} < p < {min(M.shape)}, got {tuple(start.shape)}")
    return _top_singular_from(M, k, start, tol, value_tol, max_iter)


def _top_singular_from(M, k, start, tol=1e-12, value_tol=1e-9, max_iter=20):
    """`top_singular_from` without the checks of its inputs (a training loop's tracked gradient, whose
    caller checks what it passes; a non-finite M gives non-finite values, never an error)."""
    p = start.shape[1]
    probe = torch.randn(M.shape[0], 1, generator=torch.Generator().manual_seed(0), dtype=M.dtype)
    Q = torch.linalg.qr(torch.cat([start, probe], 1)).Q
    power = M @ (M.T @ Q)
    previous = None
    for _ in range(max_iter):
        Q = torch.linalg.qr(power).Q
        Ub, s, Vh = torch.linalg.svd(Q.T @ M, full_matrices=False)  # Rayleigh-Ritz on span(Q)
        U = Q @ Ub
        if s[0] == 0:
            return None
        MV = M @ Vh.T  # M v_i for every Ritz pair: v_1's residual, and the next power step
        residual = float(torch.linalg.vector_norm(MV[:, 0] - U[:, 0] * s[0]))
        moved = float((s[1:k] - previous[1:k]).abs().max()) if previous is not None and k > 1 else 0.0
        if previous is not None and residual <= tol * float(s[0]) and moved <= value_tol * float(s[0]):
            return TopSingular(U[:, :p], s[:p], Vh[:p])
        previous, power = s, MV * s  # M M^T U = M V S, since M^T U = M^T Q Ub = V S: two passes over M per iteration
    return None


def leading_spectrum(M, k: int | None = None, *, prefix: str = "sv_") -> dict:
    """The `k` leading singular values of a matrix as one table row: `{"sv_1": s_1, ..., "sv_k": s_k}`,
    descending, Python floats in the matrix's units.

    `M` is a matrix (`top_singular`), a pair `(A, B)` standing for `A^T B` (`top_singular_of_product`:
    the product is never formed), e.g. a gradient in product form, or a `TopSingular` already computed
    (its values are read, none recomputed). `k` is fixed by the caller (a table keeps the same columns for
    every row) and at most the matrix's smaller side; for a `TopSingular` it defaults to all its values.
    """
    if isinstance(M, TopSingular):
        k = len(M.s) if k is None else _check_k(k, len(M.s))
        top = M
    elif k is None:
        raise ValueError("k must be given for a matrix or a product")
    else:
        top = top_singular_of_product(*M, k) if isinstance(M, tuple) else top_singular(M, k)
    return {f"{prefix}{i + 1}": float(v) for i, v in enumerate(top.s[:k])}


def top_singular_value(M) -> float:
    """`||M||_2` of one matrix (`top_singular` with k = 1)."""
    return float(top_singular(M, 1).s[0])


def conv_weight_as_matrix(weight) -> torch.Tensor:
    """Reshape a conv kernel `(C_out, C_in, *kernel)` to the `C_out x (C_in * prod(kernel))` matrix.

    This is the convention of Galanti et al. (and their code) for ranks of conv layers. A 2-D
    weight is returned unchanged.
    """
    w = weight.detach() if isinstance(weight, torch.Tensor) else torch.as_tensor(weight)
    if w.ndim < 2:
        raise ValueError(f"a weight needs at least 2 dimensions, got shape {tuple(w.shape)}")
    return w.reshape(w.shape[0], math.prod(w.shape[1:]))
