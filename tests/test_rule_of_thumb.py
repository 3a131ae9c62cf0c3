"""The spike classifier (`dominant_spike`), the rule of thumb and the phase grid of
lowrank.gradients.rule_of_thumb, against hand-made cases and full SVDs of dense gradients."""

import math

import pytest
import torch

from lowrank.core import data, spectral
from lowrank.gradients import decomposition, rule_of_thumb


def _unit(v):
    return v / v.norm()


def test_dominant_spike_hand_made_cases():
    g = torch.Generator().manual_seed(0)
    d, m = 60, 80
    bulk = 0.02 * torch.randn(d, m, generator=g, dtype=torch.float64)
    x = _unit(torch.randn(d, generator=g, dtype=torch.float64))
    q = torch.randn(d, generator=g, dtype=torch.float64)
    q = _unit(q - (q @ x) * x)
    v1 = _unit(torch.randn(m, generator=g, dtype=torch.float64))
    v2 = _unit(torch.randn(m, generator=g, dtype=torch.float64))
    assert rule_of_thumb.dominant_spike(bulk, x, q).label == "none"
    call = rule_of_thumb.dominant_spike(bulk + 3 * torch.outer(x, v1), 7 * x, q)
    assert call.label == "residue" and call.outliers == 1 and call.align_residue > 0.99
    assert rule_of_thumb.dominant_spike(bulk + 3 * torch.outer(q, v1), x, q).label == "data"
    both = rule_of_thumb.dominant_spike(bulk + 3 * torch.outer(x, v1) + 1.5 * torch.outer(q, v2), x, q)
    assert both.label == "both" and both.outliers == 2 and both.q_in_top2 > 0.99
    # two outliers, but the second is neither direction: u1 decides
    other = _unit(torch.randn(d, generator=g, dtype=torch.float64))
    call = rule_of_thumb.dominant_spike(bulk + 3 * torch.outer(q, v1) + 1.5 * torch.outer(other, v2), x, q)
    assert call.label == "data" and call.outliers == 2
    with pytest.raises(ValueError, match="G's 60 rows"):
        rule_of_thumb.dominant_spike(bulk, x[:-1], q)


def test_dominant_spike_on_the_papers_regimes():
    # nu = 0: residue spike; nu = 3/4: the data spike q (as in Figs. 1 and 3)
    for nu, expected in ((0.0, "residue"), (0.75, "data")):
        p = decomposition.spiked_problem(150, 200, 250, alpha=0.0, nu=nu, activation="softplus", seed=0)
        dec = decomposition.decompose_problem(p)
        assert rule_of_thumb.dominant_spike_of_problem(dec, p.data).label == expected


def test_dominant_spike_reads_leading_triplets_computed_once():
    p = decomposition.spiked_problem(150, 300, 250, alpha=0.0, nu=0.75, activation="softplus", seed=1)
    dec = decomposition.decompose_problem(p, dense=False)
    alone = rule_of_thumb.dominant_spike_of_problem(dec, p.data)
    shared = rule_of_thumb.dominant_spike_of_problem(dec, p.data, top=dec.top("G", 8))
    assert shared.label == alone.label and shared.outliers == alone.outliers
    assert shared[1:] == pytest.approx(alone[1:], rel=1e-9, abs=1e-12)
    # too few triplets to count outliers: computed afresh, same answer
    short = rule_of_thumb.dominant_spike_of_problem(dec, p.data, top=dec.top("G", 3))
    assert short == alone
    # the triplets given are the ones read: those of another matrix change the numbers
    other = spectral.top_singular(torch.randn(300, 250, generator=torch.Generator().manual_seed(2),
                                              dtype=torch.float64), 8)
    assert rule_of_thumb.dominant_spike_of_problem(dec, p.data, top=other).align_q != pytest.approx(alone.align_q)


@pytest.mark.parametrize(
    "nu, alpha, beta, expected",
    [
        (0.0, 0.0, 1.0, "residue"),
        (0.2, 0.0, 1.0, "residue"),
        (0.2, 0.7, 1.0, "both"),  # 2 nu >= 1 - alpha
        (0.225, 0.1, 0.5, "both"),  # beta - alpha <= 2 nu <= beta: S1 and S12 comparable
        (0.2, 0.0, 0.3, "data"),  # 2 nu > beta, nu < 1/4: S12 (along q) dominates
        (0.3, 0.0, 1.0, "both"),  # nu in [1/4, 1/2)
        (0.75, 0.0, 1.0, "data"),
        (0.75, 0.0, 1.6, "both"),  # nu >= 1/2 but nu <= beta / 2
    ],
)
def test_rule_of_thumb(nu, alpha, beta, expected):
    assert rule_of_thumb.rule_of_thumb(nu, alpha, beta) == expected


def test_rule_of_thumb_flags_and_boundaries():
    assert rule_of_thumb.rule_of_thumb(0.75, 0.0, 0.0, large_input_noise=True) == "residue"
    assert rule_of_thumb.rule_of_thumb(0.0, 0.0, 1.0, large_jacobian_penalty=True) == "data"
    with pytest.raises(ValueError, match="together"):
        rule_of_thumb.rule_of_thumb(0.1, 0.0, 1.0, large_input_noise=True, large_jacobian_penalty=True)
    with pytest.raises(ValueError, match="beta must be a number"):
        rule_of_thumb.rule_of_thumb(0.1, 0.0, math.nan)
    lines = rule_of_thumb.rule_of_thumb_boundaries(1.0)
    assert lines["nu = (1 - alpha)/2"](0.5) == pytest.approx(0.25)
    assert lines["nu = beta/2"](0.3) == pytest.approx(0.5)
    # just below every residue line the rule says residue, just above the lowest it does not
    for al in (0.0, 0.3, 0.6):
        low = min(f(al) for name, f in lines.items() if name in ("nu = 1/4", "nu = (beta - alpha)/2",
                                                                    "nu = (1 - alpha)/2"))
        assert rule_of_thumb.rule_of_thumb(low - 1e-3, al, 1.0) == "residue"
        assert rule_of_thumb.rule_of_thumb(low + 1e-3, al, 1.0) != "residue"


def test_small_nu_split_by_hand():
    import pandas as pd

    grid = pd.DataFrame({"nu": [0.1, 0.1, 0.2, 0.3], "alpha": [0.2, 0.2, 0.1, 0.0],
                         "beta_hat": [0.5, 0.1, 0.45, 0.9], "norm_S1": [2.0, 1.0, 1.0, 5.0],
                         "norm_S12": [1.0, 3.0, 1.0, 1.0]})
    split = rule_of_thumb.small_nu_split(grid)
    # cell 0: 0.5 > 2(0.1) + 0.2 = 0.4 -> S1; cell 1: 0.1 < 0.2 -> S12; cell 2: 0.4 <= 0.45 <= 0.5 -> neither
    assert split["predicted"].tolist() == ["S1", "S12", "neither"]  # nu = 0.3 is left out
    assert split["larger"].tolist() == ["S1", "S12", "S1"]  # a tie counts for S1


def test_phase_grid_cells_against_their_own_problem_and_the_number_of_workers():
    """Each row is its cell's problem (seeded by the cell's seed): the call, the rule at the cell's
    beta_hat and the spectrum by a full SVD of the dense G; the table is the same for one and two workers."""
    import numpy as np
    import pandas as pd

    n, d, m = 18, 24, 30
    settings = dict(nus=[0.0, 0.75], alphas=[0.0, 0.5], seeds=[4, 9], activation="softplus", spectrum_top=6)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one, two = (rule_of_thumb.phase_grid(n, d, m, workers=w, **settings) for w in (1, 2))
    finally:
        torch.set_num_threads(threads)
    pd.testing.assert_frame_equal(one, two, check_exact=True)
    assert list(zip(one["nu"], one["alpha"], one["seed"])) == [(nu, al, s) for nu in (0.0, 0.75) for al in (0.0, 0.5)
                                                               for s in (4, 9)]
    assert "label" not in one and (one["agree"] == (one["measured"] == one["rule"])).all()
    row = one.iloc[-3]  # nu = 0.75, alpha = 0, seed = 9
    p = decomposition.spiked_problem(n, d, m, alpha=0.0, nu=0.75, activation="softplus", seed=9)
    dense = decomposition.decompose_problem(p, dense=True)
    s = np.linalg.svd(dense.G.numpy(), compute_uv=False)
    np.testing.assert_allclose(row[[f"sv_{k}" for k in range(1, 7)]].to_numpy(float), s[:6], rtol=1e-8)
    call = rule_of_thumb.dominant_spike_of_problem(dense, p.data)
    beta = rule_of_thumb.residue_alignment_beta(p.data.z, dense.r, d)
    assert row["measured"] == call.label and row["beta_hat"] == pytest.approx(beta, rel=1e-12)
    assert row["rule"] == rule_of_thumb.rule_of_thumb(0.75, 0.0, beta)
    for term in ("S1", "S12", "S2"):
        assert row[f"norm_{term}"] == pytest.approx(np.linalg.norm(getattr(dense, term).numpy(), 2), rel=1e-8)
    with pytest.raises(ValueError, match="workers"):
        rule_of_thumb.phase_grid(n, d, m, workers=1.5, **settings)


