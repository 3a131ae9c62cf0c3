"""lowrank.core.spectral against NumPy/SciPy and planted low-rank matrices."""

import numpy as np
import pytest
import scipy.linalg
import torch

from lowrank.core import spectral


def planted(m, n, spectrum, seed=0):
    """A matrix with exactly the given singular values (random orthogonal factors)."""
    rng = np.random.default_rng(seed)
    k = len(spectrum)
    U, _ = np.linalg.qr(rng.standard_normal((m, k)))
    V, _ = np.linalg.qr(rng.standard_normal((n, k)))
    return U @ np.diag(spectrum) @ V.T


def test_singular_values_match_numpy():
    M = np.random.default_rng(1).standard_normal((7, 5))
    np.testing.assert_allclose(spectral.singular_values(M).numpy(), np.linalg.svd(M, compute_uv=False), rtol=1e-12)


def test_numerical_rank_spectral_and_frobenius_on_planted_spectrum():
    s = [10.0, 1.0, 0.05, 0.011, 0.009, 1e-6]
    M = planted(20, 15, s)
    # spectral: s_i / 10 > 1e-3  <=> s_i > 0.01 -> 10, 1, 0.05, 0.011
    assert spectral.numerical_rank(M, eps=1e-3) == 4
    fro = np.sqrt(np.sum(np.square(s)))
    assert spectral.numerical_rank(M, eps=1e-3, norm="frobenius") == sum(v / fro > 1e-3 for v in s)
    # the authors' code: torch.linalg.matrix_rank(M / ||M||_F, tol=1e-3)
    Mt = torch.as_tensor(M)
    assert spectral.numerical_rank(M, eps=1e-3, norm="frobenius") == int(
        torch.linalg.matrix_rank(Mt / Mt.norm(), atol=1e-3, rtol=0.0))
    assert spectral.numerical_rank(M, eps=0.5) == 1


def test_stable_and_effective_rank_closed_forms():
    s = np.array([3.0, 2.0, 1.0])
    M = planted(6, 4, s)
    assert spectral.stable_rank(M) == pytest.approx(np.sum(s**2) / 9.0, rel=1e-12)
    p = s / s.sum()
    assert spectral.effective_rank(M) == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-10)
    # a rank-one matrix: 0 log 0 = 0 gives effective rank exactly 1
    assert spectral.effective_rank(planted(5, 5, [2.0])) == pytest.approx(1.0, abs=1e-6)
    assert spectral.effective_rank(np.eye(4)) == pytest.approx(4.0, rel=1e-12)


def test_rank_k_error_is_eckart_young():
    rng = np.random.default_rng(2)
    M = rng.standard_normal((9, 6))
    U, s, Vt = np.linalg.svd(M, full_matrices=False)
    for k in range(0, 7):
        best = U[:, :k] @ np.diag(s[:k]) @ Vt[:k]
        assert spectral.rank_k_error(M, k) == pytest.approx(np.linalg.norm(M - best), abs=1e-12)
        assert spectral.rank_k_error(M, k, norm="spectral") == pytest.approx(np.linalg.norm(M - best, 2), abs=1e-12)


def test_batched_input_matches_loop():
    rng = np.random.default_rng(3)
    B = rng.standard_normal((2, 3, 6, 4))
    ranks = spectral.numerical_rank(B, eps=0.3)
    assert ranks.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            assert ranks[i, j] == spectral.numerical_rank(B[i, j], eps=0.3)
            assert spectral.stable_rank(B)[i, j].item() == pytest.approx(spectral.stable_rank(B[i, j]))
            assert spectral.effective_rank(B)[i, j].item() == pytest.approx(spectral.effective_rank(B[i, j]))


def test_alignment():
    assert spectral.alignment([1, 0], [-3, 0]) == pytest.approx(1.0)
    assert spectral.alignment([1, 0], [0, 2]) == pytest.approx(0.0)
    assert spectral.alignment([1, 1], [1, 0]) == pytest.approx(2**-0.5)
    with pytest.raises(ValueError, match="zero vector"):
        spectral.alignment([0, 0], [1, 0])
    with pytest.raises(ValueError, match="same length"):
        spectral.alignment([1, 0, 0], [1, 0])


def test_principal_angles_match_scipy_and_resolve_tiny_angles():
    rng = np.random.default_rng(4)
    A, B = rng.standard_normal((10, 3)), rng.standard_normal((10, 2))
    ours = spectral.principal_angles(A, B).numpy()
    np.testing.assert_allclose(ours, np.sort(scipy.linalg.subspace_angles(A, B)), atol=1e-12)
    # a tiny angle: arccos alone would give 0 (or ~1e-8 noise) for 1e-10
    theta = 1e-10
    e1 = np.eye(5)[:, [0]]
    rotated = np.cos(theta) * e1 + np.sin(theta) * np.eye(5)[:, [1]]
    assert spectral.principal_angles(e1, rotated).item() == pytest.approx(theta, rel=1e-6)
    assert spectral.principal_angles(e1, np.eye(5)[:, [1]]).item() == pytest.approx(np.pi / 2)


def test_principal_angles_of_tall_matrices_through_complements_match_planted_angles_and_scipy():
    """N x k with N / 2 < k < N (the m x d weights of Fig. 5) go through the complements (N - k
    columns): planted angles are recovered, the rest are 0, and scipy and the general path agree."""
    rng = np.random.default_rng(5)
    N, k = 30, 20
    Q = np.linalg.qr(rng.standard_normal((N, N)))[0]
    theta = np.sort(rng.uniform(1e-9, np.pi / 2, N - k))
    theta[0] = 1e-9  # tiny angles stay resolved
    basis_B = Q[:, :k].copy()
    basis_B[:, : N - k] = np.cos(theta) * Q[:, : N - k] + np.sin(theta) * Q[:, k:]
    A = Q[:, :k] @ rng.standard_normal((k, k))  # any basis of the same spaces
    B = basis_B @ rng.standard_normal((k, k))
    ours = spectral.principal_angles(A, B).numpy()
    assert ours.shape == (k,)
    np.testing.assert_allclose(ours, np.concatenate([np.zeros(k - (N - k)), theta]), rtol=1e-6, atol=1e-12)
    # scipy takes the angles whose cosine is large from arccos, resolved to about sqrt(eps) only
    np.testing.assert_allclose(ours, np.sort(scipy.linalg.subspace_angles(A, B)), atol=1e-7)
    general = spectral._angles_between_bases(spectral.orthonormal_basis(A), spectral.orthonormal_basis(B))
    np.testing.assert_allclose(ours, general.numpy(), atol=1e-12)
    C = spectral.column_complement(A)
    assert C.shape == (N, N - k)
    np.testing.assert_allclose(C.T.numpy() @ C.numpy(), np.eye(N - k), atol=1e-12)
    assert np.abs(A.T @ C.numpy()).max() < 1e-12 * np.abs(A).max()
    # a rank-deficient matrix has no complement of dimension N - k: the general path (SVD bases) takes it
    A_deficient = A.copy()
    A_deficient[:, 1] = A_deficient[:, 0]
    assert spectral.column_complement(A_deficient) is None
    np.testing.assert_allclose(spectral.principal_angles(A_deficient, B).numpy(),
                               np.sort(scipy.linalg.subspace_angles(A_deficient, B)), atol=1e-7)
    with pytest.raises(ValueError, match="at least as many rows"):
        spectral.column_complement(A.T)


def test_conv_weight_as_matrix():
    w = torch.arange(2 * 3 * 5 * 5, dtype=torch.float64).reshape(2, 3, 5, 5)
    M = spectral.conv_weight_as_matrix(w)
    assert M.shape == (2, 75)
    assert torch.equal(M[1, :25], w[1, 0].flatten())


def test_count_outliers_on_planted_spikes():
    rng = np.random.default_rng(5)
    bulk = rng.standard_normal((200, 300)) / np.sqrt(300)
    u, v = rng.standard_normal(200), rng.standard_normal(300)
    u2, v2 = rng.standard_normal(200), rng.standard_normal(300)
    one = bulk + 20 * np.outer(u / np.linalg.norm(u), v / np.linalg.norm(v))
    two = one + 8 * np.outer(u2 / np.linalg.norm(u2), v2 / np.linalg.norm(v2))
    assert spectral.count_outliers(bulk) == 0
    assert spectral.count_outliers(one) == 1
    assert spectral.count_outliers(two) == 2


def test_leading_left_vectors():
    M = planted(8, 6, [5.0, 2.0, 1.0], seed=6)
    U = spectral.leading_left_vectors(M, 2)
    Un = np.linalg.svd(M)[0][:, :2]
    np.testing.assert_allclose(np.abs(U.numpy().T @ Un), np.eye(2), atol=1e-10)


def test_count_outliers_from_leading_values_equals_from_matrix():
    rng = np.random.default_rng(5)
    M = rng.standard_normal((250, 300)) / np.sqrt(300) + 20 * np.outer(np.eye(250)[0], np.eye(300)[0])
    s = torch.from_numpy(np.linalg.svd(M, compute_uv=False))
    assert spectral.count_outliers(M) == spectral.count_outliers(s[:6]) == 1


@pytest.mark.parametrize("shape", [(30, 40), (260, 300), (700, 500)])
@pytest.mark.parametrize("k", [1, 2, 6])
def test_top_singular_matches_numpy_full_svd(shape, k):
    """ARPACK (large matrices) and the sliced full SVD (small ones) against NumPy's LAPACK SVD:
    values to 1e-12 of s_1, vectors to 1e-8 in |cos| on a spectrum with distinct leading values."""
    rng = np.random.default_rng(sum(shape) + k)
    m, n = shape
    decay = np.concatenate([[40.0, 25.0, 15.0, 10.0, 7.0, 5.0], 3.0 * np.linspace(1, 0.1, min(m, n) - 6)])
    M = planted(m, n, decay, seed=sum(shape))
    U, s, Vh = np.linalg.svd(M, full_matrices=False)
    top = spectral.top_singular(M, k)
    assert top.U.shape == (m, k) and top.s.shape == (k,) and top.Vh.shape == (k, n)
    np.testing.assert_allclose(top.s.numpy(), s[:k], rtol=0, atol=1e-12 * s[0])
    np.testing.assert_allclose(np.abs(np.sum(top.U.numpy() * U[:, :k], axis=0)), 1.0, atol=1e-8)
    np.testing.assert_allclose(np.abs(np.sum(top.Vh.numpy() * Vh[:k], axis=1)), 1.0, atol=1e-8)
    assert spectral.top_singular_value(M) == pytest.approx(s[0], rel=1e-12)


@pytest.mark.parametrize("p, q", [(40, 50), (300, 260), (500, 700)])
def test_top_singular_of_product_matches_the_formed_product(p, q):
    rng = np.random.default_rng(p + q)
    A = rng.standard_normal((350, p))
    B = rng.standard_normal((350, q)) + 3.0 * np.outer(A[:, 0], np.ones(q)) / np.sqrt(q)
    U, s, Vh = np.linalg.svd(A.T @ B, full_matrices=False)
    top = spectral.top_singular_of_product(A, B, 3)
    np.testing.assert_allclose(top.s.numpy(), s[:3], rtol=0, atol=1e-12 * s[0])
    np.testing.assert_allclose(np.abs(np.sum(top.U.numpy() * U[:, :3], axis=0)), 1.0, atol=1e-8)
    np.testing.assert_allclose(np.abs(np.sum(top.Vh.numpy() * Vh[:3], axis=1)), 1.0, atol=1e-8)
    with pytest.raises(ValueError, match="same number of rows"):
        spectral.top_singular_of_product(A, B[:-1])


@pytest.mark.parametrize("p, q", [(40, 50), (400, 500)])  # a formed product, and ARPACK on the product form
def test_leading_spectrum_is_the_svd_s_leading_values(p, q):
    rng = np.random.default_rng(7 * p + q)
    A = rng.standard_normal((300, p))
    B = rng.standard_normal((300, q)) + 5.0 * np.outer(A[:, 0] + A[:, 1], np.ones(q)) / np.sqrt(q)  # outliers
    s = scipy.linalg.svdvals(A.T @ B)
    row = spectral.leading_spectrum((A, B), 8)
    assert list(row) == [f"sv_{i}" for i in range(1, 9)] and all(type(v) is float for v in row.values())
    np.testing.assert_allclose(list(row.values()), s[:8], rtol=0, atol=1e-12 * s[0])
    assert spectral.leading_spectrum(A.T @ B, 8) == pytest.approx(row, rel=0, abs=1e-12 * s[0])
    assert list(spectral.leading_spectrum(A.T @ B, 2, prefix="s")) == ["s1", "s2"]
    top = spectral.top_singular_of_product(A, B, 8)  # computed once, read without a second SVD
    assert spectral.leading_spectrum(top) == row and list(spectral.leading_spectrum(top, 3)) == ["sv_1", "sv_2", "sv_3"]
    with pytest.raises(ValueError, match="k must be given"):
        spectral.leading_spectrum(A.T @ B)
    with pytest.raises(ValueError, match="k must be"):
        spectral.leading_spectrum((A, B), min(p, q) + 1)


def test_top_singular_is_deterministic_and_accepts_a_start_vector():
    M = torch.from_numpy(np.random.default_rng(3).standard_normal((300, 400)))
    a, b = spectral.top_singular(M, 3), spectral.top_singular(M, 3)
    assert torch.equal(a.s, b.s) and torch.equal(a.U, b.U)
    warm = spectral.top_singular(M, 3, v0=a.U[:, 0])
    np.testing.assert_allclose(warm.s.numpy(), a.s.numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="v0 must have length 300"):
        spectral.top_singular(M, 3, v0=torch.ones(400))
    with pytest.raises(ValueError, match="k must be an integer between 1 and 300"):
        spectral.top_singular(M, 0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: spectral.numerical_rank(np.ones(3)), "at least 2 dimensions"),
        (lambda: spectral.numerical_rank(np.array([[1.0, np.nan]])), "NaN"),
        (lambda: spectral.numerical_rank(np.eye(3), eps=-1e-3), "eps must be positive"),
        (lambda: spectral.numerical_rank(np.eye(3), norm="nuclear"), "norm="),
        (lambda: spectral.stable_rank(np.zeros((3, 3))), "zero matrix"),
        (lambda: spectral.rank_k_error(np.eye(3), -1), "k must be"),
        (lambda: spectral.singular_values(np.zeros((0, 3))), "empty"),
        (lambda: spectral.principal_angles(np.eye(3), np.eye(4)), "same number of rows"),
        (lambda: spectral.count_outliers(np.eye(3), gap=1.0), "gap"),
    ],
)
def test_bad_input_is_rejected_clearly(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_singular_values_by_shape_match_scipy_in_order():
    g = np.random.default_rng(0)
    mats = [g.standard_normal(shape) for shape in [(5, 4), (3, 7), (5, 4), (2, 5, 4), (3, 7)]]
    out = spectral.singular_values_by_shape(mats)
    assert len(out) == len(mats)
    for M, s in zip(mats, out):
        expected = np.stack([scipy.linalg.svdvals(m) for m in M]) if M.ndim == 3 else scipy.linalg.svdvals(M)
        np.testing.assert_allclose(s.numpy(), expected, rtol=1e-12)
    f32 = spectral.singular_values_by_shape([torch.tensor(mats[0], dtype=torch.float32)])
    assert f32[0].dtype == torch.float32
    with pytest.raises(ValueError, match=r"mats\[1\] contains NaN"):
        spectral.singular_values_by_shape([mats[0], np.full((2, 2), np.nan)])


def test_monitor_dtype_resolves_eps():
    """float32 singular values count the same rank as float64 at eps >= 1e-4, even with values
    1 % from the threshold; below 1e-4 the monitors use float64."""
    g = torch.Generator().manual_seed(0)
    U, _ = torch.linalg.qr(torch.randn(60, 60, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(40, 40, generator=g, dtype=torch.float64))
    eps = 1e-4
    s = torch.cat([torch.tensor([1.0, 1.01 * eps, 0.99 * eps], dtype=torch.float64),
                   torch.logspace(-1, -3, 10, dtype=torch.float64), torch.logspace(-5, -8, 27, dtype=torch.float64)])
    s = s.sort(descending=True).values
    M = U[:, :40] @ torch.diag(s) @ V.T
    dtype = spectral.monitor_dtype(eps)
    assert dtype == torch.float32 and spectral.monitor_dtype(1e-6) == torch.float64
    assert spectral.numerical_rank(M.to(dtype), eps, dtype=None) == spectral.numerical_rank(M, eps) == 12


@pytest.mark.parametrize("value", [1e308, -1e308, 1e200, 1e-200, 1e-310, 5e-324])
def test_rank_quantities_at_the_edges_of_float64(value):
    """A constant matrix has rank one, stable rank one and effective rank one whatever its scale,
    up to the float64 limit (1e308, where the SVD and the squared norms overflow) and down to the
    subnormals (1e-310, 5e-324)."""
    M = np.full((5, 4), value)
    assert spectral.numerical_rank(M) == 1
    assert spectral.numerical_rank(M, norm="frobenius") == 1
    assert spectral.stable_rank(M) == pytest.approx(1.0, rel=1e-12)
    assert spectral.effective_rank(M) == pytest.approx(1.0, rel=1e-6)
    assert spectral.numerical_rank(M, dtype=torch.float32) == 1


def test_scaling_keeps_the_singular_value_ratios():
    """Near the float limit the ranks are those of the same spectrum at scale one (an independent
    construction: the planted spectrum divided by 1e300)."""
    s = np.array([1.0, 0.5, 1e-2, 1e-5])
    M = planted(8, 6, s, seed=3)
    for scale in (1e300, 1e-300):
        big = M * scale
        assert spectral.numerical_rank(big, eps=1e-3) == spectral.numerical_rank(M, eps=1e-3) == 3
        assert spectral.stable_rank(big) == pytest.approx(np.sum(s**2) / s[0] ** 2, rel=1e-10)
        assert spectral.effective_rank(big) == pytest.approx(spectral.effective_rank(M), rel=1e-10)


def test_ordinary_matrices_are_computed_exactly_as_before():
    """No scaling inside the normal range: the results are bit-identical to the unscaled formulas."""
    M = np.random.default_rng(4).standard_normal((9, 7))
    s = torch.linalg.svdvals(torch.as_tensor(M))
    assert spectral.stable_rank(M) == (torch.linalg.vector_norm(s) ** 2 / s[0] ** 2).item()
    assert spectral.numerical_rank(M, eps=0.3) == int((s > 0.3 * s[0]).sum())


def test_complex_input_is_refused():
    with pytest.raises(TypeError, match="M is complex"):
        spectral.numerical_rank(np.eye(3) * 1j)
    with pytest.raises(TypeError, match="M is complex"):
        spectral.singular_values(torch.eye(3, dtype=torch.complex64))


def test_top_singular_from_tracks_a_moving_matrix_to_the_svd():
    rng = np.random.default_rng(3)
    d, m = 300, 350
    spikes = sum(c * np.outer(rng.standard_normal(d), rng.standard_normal(m)) for c in (8.0, 5.0, 3.0))
    M0 = spikes / np.sqrt(d * m) + rng.standard_normal((d, m)) / np.sqrt(m)
    M1 = M0 + 1e-3 * rng.standard_normal((d, m))  # the next step of a run: a small move
    start = spectral.top_singular(M0, 6).U
    top = spectral.top_singular_from(M1, 2, start)
    U, s, Vh = np.linalg.svd(M1)
    assert top is not None and top.U.shape == (d, 6)
    np.testing.assert_allclose(top.s[:2].numpy(), s[:2], rtol=0, atol=1e-11 * s[0])
    np.testing.assert_allclose(np.abs(np.sum(top.U[:, :2].numpy() * U[:, :2], axis=0)), 1.0, atol=1e-9)
    np.testing.assert_allclose(np.abs(np.sum(top.Vh[:2].numpy() * Vh[:2], axis=1)), 1.0, atol=1e-9)
    # a start inside an invariant subspace away from the top: the probe column finds the leading pairs,
    # not the start's own pairs (with too few iterations: None, for the fallback)
    far = torch.from_numpy(U[:, 50:56].copy())
    assert spectral.top_singular_from(M1, 2, far, max_iter=2) is None
    found = spectral.top_singular_from(M1, 2, far)
    assert found is not None and np.allclose(found.s[:2].numpy(), s[:2], rtol=0, atol=1e-11 * s[0])
    with pytest.raises(ValueError, match="start must be"):
        spectral.top_singular_from(M1, 2, start[:, :2])
