"""Section 3.4's tables (lowrank.gradients.mf_vs_ntk) against an independent computation: autograd
gradients, full SVDs, scipy's principal angles, hand-built weight-normalised descent and hand-worked
traces."""

import math

import numpy as np
import pandas as pd
import pytest
import scipy.linalg
import torch

from lowrank.core.data import single_index_target, spiked_gaussian
from lowrank.gradients import dynamics as gd
from lowrank.gradients import mf_vs_ntk

GAMMA = {"mf": lambda m: 1.0 / m, "ntk": lambda m: 1.0 / math.sqrt(m)}  # gamma_m in closed form


def _autograd_gradient(X, y, W, a, gamma, act):
    """(G, r, loss): G = d/dW of mean (f - y)^2 / 2, transposed (d x m), by autograd."""
    W = W.clone().requires_grad_(True)
    f = gamma * act(X @ W.T) @ a
    loss = 0.5 * ((f - y) ** 2).mean()
    (g,) = torch.autograd.grad(loss, W)
    loss = loss.detach()
    return g.T.numpy(), (f - y).detach().numpy(), float(loss)


def _u1(G):
    return np.linalg.svd(G, full_matrices=False)[0][:, 0]


def _cos(u, v):
    return abs(float(u @ v)) / (np.linalg.norm(u) * np.linalg.norm(v))


def test_draw_seeds_and_bad_repeats():
    assert [mf_vs_ntk.draw_seed(7, k) for k in range(3)] == [7, 1007, 2007]
    with pytest.raises(ValueError, match="draw"):
        mf_vs_ntk.draw_seed(0, -1)
    with pytest.raises(ValueError, match="repeats"):
        mf_vs_ntk.initial_alignment_table(10, 6, 8, repeats=0)
    with pytest.raises(ValueError, match="snapshot_every"):
        mf_vs_ntk.scaling_runs(10, 6, 8, repeats=1, activation="tanh", steps=2, snapshot_every=0)


def test_initial_alignment_table_against_autograd_and_a_full_svd():
    n, d, m = 14, 9, 11
    table = mf_vs_ntk.initial_alignment_table(n, d, m, repeats=2, activation="tanh", noise_std=0.1, seed=5)
    assert list(zip(table["scaling"], table["repeat"])) == [("mf", 0), ("mf", 1), ("ntk", 0), ("ntk", 1)]
    # draw 1: the bulk inputs, omega, W and a of single_index_draw's seeds, labels from X_B (no spike)
    data, omega, _, W, a = gd.single_index_draw(n, d, m, nu=0.0, seed=1005)
    X = data.X_B
    y = single_index_target(X, omega, noise_std=0.1, seed=1007, link="sigmoid")
    for sc in ("mf", "ntk"):
        G, r, _ = _autograd_gradient(X, y, W, a, GAMMA[sc](m), torch.tanh)
        u1, Xn = _u1(G), X.numpy()
        row = table[(table["scaling"] == sc) & (table["repeat"] == 1)].iloc[0]
        assert row["align_Xy"] == pytest.approx(_cos(u1, Xn.T @ y.numpy()), abs=1e-10)
        assert row["align_Xr"] == pytest.approx(_cos(u1, Xn.T @ r), abs=1e-10)
        assert row["align_omega"] == pytest.approx(_cos(u1, omega.numpy()), abs=1e-10)
        assert row["omega_span_norm"] == pytest.approx(1.0) and row["align_omega_span"] == pytest.approx(row["align_omega"])
        assert row["r_y_corr"] == pytest.approx(-float(r @ y.numpy()) / (np.linalg.norm(r) * float(y.norm())))
    # n < d: omega's part in the span of the inputs (least squares on the columns of X^T), what u1 can reach
    n = 6
    table = mf_vs_ntk.initial_alignment_table(n, d, m, repeats=2, activation="tanh", noise_std=0.1, seed=5)
    data, omega, _, W, a = gd.single_index_draw(n, d, m, nu=0.0, seed=1005)
    X = data.X_B
    y = single_index_target(X, omega, noise_std=0.1, seed=1007, link="sigmoid")
    Xn = X.numpy()
    omega_span = Xn.T @ np.linalg.lstsq(Xn.T, omega.numpy(), rcond=None)[0]
    assert np.linalg.norm(omega_span) < 0.99
    for sc in ("mf", "ntk"):
        u1 = _u1(_autograd_gradient(X, y, W, a, GAMMA[sc](m), torch.tanh)[0])
        row = table[(table["scaling"] == sc) & (table["repeat"] == 1)].iloc[0]
        assert row["omega_span_norm"] == pytest.approx(np.linalg.norm(omega_span), abs=1e-10)
        assert row["align_omega_span"] == pytest.approx(_cos(u1, omega_span), abs=1e-10)
        assert row["align_omega"] == pytest.approx(row["align_omega_span"] * row["omega_span_norm"], abs=1e-10)


def _descend(X, y, W0, a, gamma, lr, steps, act):
    """Weight-normalised gradient descent by autograd on V (w_j = v_j / ||v_j||): the losses and W_t."""
    V, losses, Ws = W0.clone(), [], []
    for _ in range(steps + 1):
        V = V.detach().requires_grad_(True)
        W = V / V.norm(dim=1, keepdim=True)
        loss = 0.5 * ((gamma * act(X @ W.T) @ a - y) ** 2).mean()
        (g,) = torch.autograd.grad(loss, V)
        losses.append(float(loss))
        Ws.append(W.detach().numpy())
        V = V - lr * g
    return losses, Ws


def _degrees(W1, W2):
    principal = np.rad2deg(scipy.linalg.subspace_angles(W1, W2)).mean()
    neuron = np.rad2deg(np.arccos(np.clip((W1 * W2).sum(1), -1, 1))).mean()
    return principal, neuron


def test_scaling_runs_against_autograd_descent_and_scipy_angles():
    n, d, m, steps = 12, 5, 8, 4
    out = mf_vs_ntk.scaling_runs(n, d, m, repeats=2, activation="sigmoid", steps=steps, snapshot_every=2,
                                 lr_factor=0.5, seed=3)
    assert len(out.traces) == 2 * 2 * (steps + 1)
    assert sorted(out.angles["step"].unique()) == [0, 2, 4]
    data, omega, y, W0, a = gd.single_index_draw(n, d, m, nu=0.0, seed=1003)
    runs = {}
    for sc in ("mf", "ntk"):
        gamma = GAMMA[sc](m)
        runs[sc] = _descend(data.X, y, W0, a, gamma, 0.5 / gamma, steps, torch.sigmoid)
        trace = out.traces.query("scaling == @sc and repeat == 1").sort_values("step")
        np.testing.assert_allclose(trace["loss"], runs[sc][0], rtol=1e-10)
        assert trace["align_initial"].iloc[0] == pytest.approx(1.0)
        G, r, _ = _autograd_gradient(data.X, y, W0, a, gamma, torch.sigmoid)
        u1 = _u1(G)
        assert trace["align_Xy"].iloc[0] == pytest.approx(_cos(u1, (data.X_B.T @ y).numpy()), abs=1e-9)
        assert trace["align_residue"].iloc[0] == pytest.approx(_cos(u1, data.X_B.numpy().T @ r), abs=1e-9)
        moved = out.moved.query("scaling == @sc and repeat == 1").iloc[0]
        assert moved["step"] == steps
        assert moved["mean_principal_angle"] == pytest.approx(_degrees(runs[sc][1][0], runs[sc][1][-1])[0], abs=1e-6)
        # the control: the same scaling from the same W_0 on labels whose noise is drawn afresh
        y_fresh = single_index_target(data.X, omega, noise_std=0.1, seed=1003 + mf_vs_ntk.RELABEL_SEED_OFFSET)
        assert not torch.equal(y_fresh, y)
        fresh = _descend(data.X, y_fresh, W0, a, gamma, 0.5 / gamma, steps, torch.sigmoid)[1][-1]
        relabelled = out.relabelled.query("scaling == @sc and repeat == 1").iloc[0]
        assert relabelled["step"] == steps
        principal, neuron = _degrees(runs[sc][1][-1], fresh)
        assert relabelled["mean_principal_angle"] == pytest.approx(principal, abs=1e-6)
        assert relabelled["mean_neuron_angle"] == pytest.approx(neuron, abs=1e-6)
    end = out.angles.query("repeat == 1 and step == @steps").iloc[0]
    principal, neuron = _degrees(runs["mf"][1][-1], runs["ntk"][1][-1])
    assert end["mean_principal_angle"] == pytest.approx(principal, abs=1e-6)
    assert end["mean_neuron_angle"] == pytest.approx(neuron, abs=1e-6)
    assert out.angles.query("step == 0")["mean_principal_angle"].eq(0.0).all()


def test_relabelled_control_at_the_last_snapshot_and_without_label_noise():
    """The control compares W at the last snapshot (4 of 5 steps here); with noise_std = 0 the fresh labels
    are the run's own, so its angles are 0."""
    n, d, m = 12, 5, 8
    out = mf_vs_ntk.scaling_runs(n, d, m, repeats=1, activation="tanh", steps=5, snapshot_every=2, seed=1)
    assert out.relabelled["step"].eq(4).all() and out.moved["step"].eq(4).all()
    data, omega, y, W0, a = gd.single_index_draw(n, d, m, nu=0.0, seed=1)
    y_fresh = single_index_target(data.X, omega, noise_std=0.1, seed=1 + mf_vs_ntk.RELABEL_SEED_OFFSET)
    for sc in ("mf", "ntk"):
        gamma = GAMMA[sc](m)
        W4 = _descend(data.X, y, W0, a, gamma, 1 / gamma, 4, torch.tanh)[1][-1]
        F4 = _descend(data.X, y_fresh, W0, a, gamma, 1 / gamma, 4, torch.tanh)[1][-1]
        row = out.relabelled.query("scaling == @sc").iloc[0]
        assert row["mean_principal_angle"] == pytest.approx(_degrees(W4, F4)[0], abs=1e-6)
    quiet = mf_vs_ntk.scaling_runs(n, d, m, repeats=1, activation="tanh", steps=3, snapshot_every=1, noise_std=0.0)
    assert quiet.relabelled[["mean_principal_angle", "max_principal_angle", "mean_neuron_angle"]].eq(0.0).all().all()


def _rms_target_cos(rng, n, d, noise, *, in_span, draws=300):
    """Root mean square over draws of |cos(X^T y, omega)| (or with P_X omega, from a QR factor of X^T) for a
    sigmoid single-index target, simulated with numpy's own generator and linear algebra."""
    cos = []
    for _ in range(draws):
        X = rng.standard_normal((n, d))
        w = rng.standard_normal(d)
        w /= np.linalg.norm(w)
        v = X.T @ (1 / (1 + np.exp(-X @ w)) + noise * rng.standard_normal(n))
        if in_span:
            Q = np.linalg.qr(X.T)[0]
            w = Q @ (Q.T @ w)
        cos.append(abs(v @ w) / (np.linalg.norm(v) * np.linalg.norm(w)))
    return math.sqrt(np.mean(np.square(cos)))


def test_target_direction_share_against_monte_carlo():
    """|cos(X^T y, omega)| for a sigmoid single-index target, simulated with numpy's own generator: its
    root mean square over draws meets the leading-order share; it tends to 1 only as n/d grows."""
    rng = np.random.default_rng(0)
    for n, d, noise in ((150, 200, 0.1), (2000, 50, 0.3)):
        assert _rms_target_cos(rng, n, d, noise, in_span=False) == pytest.approx(gd.target_direction_share(n, d, noise_std=noise),
                                                                    abs=0.01)
    shares = [gd.target_direction_share(k * 200, 200, noise_std=0.1) for k in (1, 10, 100, 1000)]
    assert shares == sorted(shares) and shares[0] < 0.5 and shares[-1] > 0.99
    need = gd.samples_for_target_share(200, 0.9, noise_std=0.1)
    assert gd.target_direction_share(need, 200, noise_std=0.1) >= 0.9 > gd.target_direction_share(need - 1, 200, noise_std=0.1)
    assert gd.samples_for_target_share(200, 1e-6) == 1
    with pytest.raises(ValueError, match="level"):
        gd.samples_for_target_share(200, 1.0)
    with pytest.raises(ValueError, match="link"):
        gd.target_direction_share(10, 5, link="relu")
    with pytest.raises(ValueError, match="d must"):
        gd.target_direction_share(10, 1)


def test_target_span_share_against_monte_carlo():
    """|cos(X^T y, P_X omega)|, with P_X omega computed from a QR factor of X^T (numpy's own generator and
    linear algebra): its root mean square over draws meets the leading-order span share within 0.02
    where n/d is not small; from n = d on P_X omega = omega and the span share is the share itself."""
    rng = np.random.default_rng(1)
    for n, d, noise in ((150, 200, 0.1), (100, 200, 0.3)):
        assert _rms_target_cos(rng, n, d, noise, in_span=True) == pytest.approx(gd.target_span_share(n, d, noise_std=noise),
                                                                    abs=0.02)
    for n in (200, 500, 5000):
        assert gd.target_span_share(n, 200, noise_std=0.1) == gd.target_direction_share(n, 200, noise_std=0.1)
    assert gd.target_span_share(1, 200, noise_std=0.1) == 1.0  # one input: one direction, shared


def test_omega_alternative_degenerate_reads_the_closed_form():
    """At the ci sizes (n/d = 0.75) X^T y's span share is below 0.9: a reason naming the level and the
    samples needed; with n beyond samples_for_target_share it is aligned and there is no reason."""
    level = gd.target_span_share(150, 200, noise_std=0.1)
    need = gd.samples_for_target_share(200, 0.9, noise_std=0.1)
    reason = mf_vs_ntk.omega_alternative_degenerate(150, 200, 0.9, noise_std=0.1)
    assert level < 0.9 and f"{level:.3f}" in reason and f"n = {need} " in reason and "0.9" in reason
    assert mf_vs_ntk.omega_alternative_degenerate(need, 200, 0.9, noise_std=0.1) is None
    assert mf_vs_ntk.omega_alternative_degenerate(need - 1, 200, 0.9, noise_std=0.1) is not None
    assert mf_vs_ntk.omega_alternative_degenerate(150, 200, 0.3, noise_std=0.1) is None  # 0.36 >= 0.3
    with pytest.raises(ValueError, match="threshold"):
        mf_vs_ntk.omega_alternative_degenerate(150, 200, 1.0)


def test_spike_size_runs_and_the_spike_free_control_against_autograd():
    n, d, m, steps = 16, 7, 9, 2
    nus = [0.0, 0.5]
    out = mf_vs_ntk.spike_size_runs(n, d, m, nus=nus, repeats=2, activation="tanh", steps=steps, seed=1)
    assert len(out.traces) == len(nus) * 2 * (steps + 1)
    assert list(zip(out.spike_free["nu"], out.spike_free["repeat"])) == [(0.0, 0), (0.0, 1), (0.5, 0), (0.5, 1)]
    data, _, y, W0, a = gd.single_index_draw(n, d, m, nu=0.5, seed=1001)
    gamma = 1.0 / m  # MF
    losses, _ = _descend(data.X, y, W0, a, gamma, 1.0 / gamma, steps, torch.tanh)
    trace = out.traces.query("nu == 0.5 and repeat == 1").sort_values("step")
    np.testing.assert_allclose(trace["loss"], losses, rtol=1e-10)
    G, r, _ = _autograd_gradient(data.X, y, W0, a, gamma, torch.tanh)
    assert trace["align_q"].iloc[0] == pytest.approx(_cos(_u1(G), data.q.numpy()), abs=1e-9)
    # the control: the same network and labels on X_B, the spike removed
    G, r, _ = _autograd_gradient(data.X_B, y, W0, a, gamma, torch.tanh)
    u1, res = _u1(G), data.X_B.numpy().T @ r
    expected = _cos(u1, data.q.numpy()) - _cos(u1, res)
    assert out.spike_free.query("nu == 0.5 and repeat == 1")["lead"].item() == pytest.approx(expected, abs=1e-9)


def test_initial_leads_on_a_hand_worked_table():
    rows = [(0.0, 0, 0, 0.1, 0.3), (0.0, 1, 0, 0.2, 0.6), (0.0, 2, 0, 0.5, 0.4),  # leads -0.2, -0.4, 0.1
            (1.0, 0, 0, 0.8, 0.5), (1.0, 1, 0, 0.9, 0.4),  # leads 0.3, 0.5
            (0.0, 0, 1, 0.9, 0.0), (1.0, 0, 1, 0.0, 0.9)]  # later steps: ignored
    table = pd.DataFrame(rows, columns=["nu", "repeat", "step", "align_q", "align_residue"])
    leads = mf_vs_ntk.initial_leads(table.iloc[::-1])
    assert list(leads.index) == [0.0, 1.0]
    np.testing.assert_allclose(leads.to_numpy(), [-0.2, 0.4])
    with pytest.raises(ValueError, match="align_q"):
        mf_vs_ntk.initial_leads(table.drop(columns="align_q"))


def test_direction_switches_on_hand_worked_runs():
    switching = pd.DataFrame({"step": range(5), "align_residue": [0.9, 0.8, 0.1, 0.1, 0.1],
                              "align_q": [0.1, 0.2, 0.9, 0.9, 0.9], "loss": [1.0, 0.5, 0.6, 0.3, 0.2]})
    staying = switching.assign(align_q=0.0, loss=1.0)
    table = pd.concat([switching.assign(nu=0.5, repeat=0), staying.assign(nu=0.0, repeat=0)]).sample(frac=1,
                                                                                                     random_state=0)
    out = mf_vs_ntk.direction_switches(table)
    assert list(zip(out["nu"], out["repeat"])) == [(0.0, 0), (0.5, 0)]
    assert list(out["switched"]) == [False, True]
    hit = out.iloc[1]
    assert hit["switch_step"] == 2
    assert (hit["loss_before"], hit["loss_at"], hit["loss_after"]) == (0.5, 0.6, 0.3)
    assert hit["loss_jump"] == pytest.approx(1.2)
    backward = mf_vs_ntk.direction_switches(table, source="align_q", target="align_residue")
    assert not backward["switched"].any()


def test_tables_do_not_depend_on_the_number_of_workers():
    """Each draw is seeded by its index: two worker processes (one thread each) give the tables of one
    process under one thread, value for value; and Fig. 4's shared draw is `initial_alignments`' own."""
    n, d, m = 14, 8, 11
    settings = dict(product_precision="float32", seed=2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tables = {w: (mf_vs_ntk.initial_alignment_table(n, d, m, repeats=3, activation="relu", workers=w, **settings),
                      *mf_vs_ntk.scaling_runs(n, d, m, repeats=2, activation="sigmoid", steps=5, snapshot_every=2,
                                              workers=w, **settings),
                      *mf_vs_ntk.spike_size_runs(n, d, m, nus=[0.0, 0.5], repeats=2, activation="tanh", steps=5,
                                                 workers=w, **settings))
                  for w in (1, 2)}
    finally:
        torch.set_num_threads(threads)
    for one, two in zip(tables[1], tables[2]):
        pd.testing.assert_frame_equal(one, two, check_exact=True)
    init = tables[1][0]
    for sc in ("mf", "ntk"):
        alone = gd.initial_alignments(n, d, m, scaling=sc, activation="relu", seed=mf_vs_ntk.draw_seed(2, 1),
                                      product_precision="float32")
        assert init.query("scaling == @sc and repeat == 1").iloc[0][list(alone)].to_dict() == alone
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="workers"):
            mf_vs_ntk.initial_alignment_table(n, d, m, repeats=1, workers=bad)


def test_final_weights_are_the_traced_runs_last_snapshot_to_the_bit():
    """The control's untraced descent against `train_weight_normalized` (itself tested against autograd):
    the same W at the last step, bit for bit, under both normalizations and product precisions."""
    data, omega, y, W0, a = gd.single_index_draw(30, 40, 50, nu=0.0, seed=4)
    for normalization, precision in (("wn", "float64"), ("wn", "float32"), ("projected", "float64")):
        gamma = GAMMA["mf"](50)
        run = gd.train_weight_normalized(data.X, y, W0, a, activation="sigmoid", gamma=gamma, lr=1 / gamma, steps=7,
                                         X_B=data.X_B, snapshot_steps=[7], normalization=normalization,
                                         product_precision=precision, top_k=1)
        W = mf_vs_ntk.final_weights(data.X, y, W0, a, activation="sigmoid", gamma=gamma, lr=1 / gamma, steps=7,
                                    normalization=normalization, product_precision=precision)
        assert torch.equal(W, run.W[7]) and not torch.equal(W, W0)
    start = gd.train_weight_normalized(data.X, y, W0, a, activation="sigmoid", gamma=1.0, steps=0, top_k=1).W[0]
    assert torch.equal(mf_vs_ntk.final_weights(data.X, y, W0, a, activation="sigmoid", gamma=1.0, lr=1.0, steps=0), start)
    with pytest.raises(FloatingPointError):
        mf_vs_ntk.final_weights(data.X, y * 1e300, W0, a, activation="sigmoid", gamma=1.0, lr=1e300, steps=3)


def test_paired_sign_flip_p_is_scipys_exact_paired_permutation_test():
    """Against scipy.stats.permutation_test on the paired data (permutation_type="samples" swaps the two values
    of a pair, i.e. flips the sign of its difference; exact), and a hand count: five pairs all above give the
    floor 2^-5; with one of three differences negative, 2 of the 8 sign patterns reach the observed sum."""
    from scipy import stats

    rng = np.random.default_rng(3)
    cases = [([8.5, 9.0, 8.1, 7.0, 9.9], [3.0, 4.5, 3.8, 6.9, 1.0]), (rng.normal(1, 1, 4), rng.normal(0, 1, 4)),
             ([1.0, 2.0, 0.5], [2.0, 1.0, 1.5]), (rng.normal(0, 1, 6), rng.normal(0, 1, 6))]
    for obs, nul in cases:
        want = stats.permutation_test((obs, nul), lambda x, y: np.mean(x - y), permutation_type="samples",
                                      alternative="greater", n_resamples=np.inf).pvalue
        assert mf_vs_ntk.paired_sign_flip_p(obs, nul) == pytest.approx(want)
    assert mf_vs_ntk.paired_sign_flip_p(*cases[0]) == pytest.approx(1 / 32) == mf_vs_ntk.paired_sign_flip_floor(5)
    # differences +3, +2, -1: sums of the sign patterns >= 4 are (+3, +2, -1) = 4 and (+3, +2, +1) = 6
    assert mf_vs_ntk.paired_sign_flip_p([4.0, 3.0, 0.0], [1.0, 1.0, 1.0]) == pytest.approx(2 / 8)
    for bad in (([], []), ([1.0, 2.0], [1.0]), ([np.nan], [0.0])):
        with pytest.raises(ValueError):
            mf_vs_ntk.paired_sign_flip_p(*bad)
