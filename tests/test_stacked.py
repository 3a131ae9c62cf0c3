"""lowrank.square.stacked.train_stacked against one-by-one training (training.train_network)."""

import numpy as np
import pytest
import torch

from lowrank.core import datasets
from lowrank.core.nets import normalized
from lowrank.square import pages, stacked, training


@pytest.fixture(scope="module")
def base():
    return training.load_task("digits", [1, 2], max_train=40, max_test=30)


@pytest.mark.parametrize("options", [dict(momentum=0.0, schedule="constant"),
                                     dict(momentum=0.9, schedule="cosine", min_lr=0.01)])
def test_stacked_members_end_where_single_runs_end(base, options):
    members = [(0.0, 1.0, 0, 1e-3), (0.5, 3.0, 1, 0.0), (0.2, 0.5, 2, 1e-2)]  # fraction, rho_init, seed, lambda
    data = [datasets.Dataset(base.x_train, datasets.random_labels(base.y_train, f, 2, seed=s), base.x_test, base.y_test,
                             2, base.name) for f, _, s, _ in members]
    common = dict(epochs=30, lr=0.2, rho_lr=2.0, dtype="float64", **options)
    models = [normalized.mlp(64, [12, 8], rho_init=r, seed=s) for _, r, s, _ in members]
    table = stacked.train_stacked(models, data, [lam for *_, lam in members], **common)
    for k, (f, r, s, lam) in enumerate(members):
        single = training.train_network(data[k], arch="mlp", arch_kwargs={"widths": [12, 8]}, rho_init=r, seed=s,
                                        lam=lam, log_every=30, nc=False, progress=False, **common).final
        for key in ("rho", "mu", "M", "train_error", "test_error", "loss"):
            assert table[key][k] == pytest.approx(single[key], rel=1e-9, abs=1e-12), (k, key)
    assert not table.diverged.any()


def test_stacked_flags_a_diverged_member_and_rejects_bad_input(base):
    models = [normalized.mlp(64, [8], rho_init=1.0, seed=0), normalized.mlp(64, [8], rho_init=1.0, seed=1)]
    table = stacked.train_stacked(models, [base, base], [1e6, 0.0], epochs=100, lr=0.1, rho_lr=1.0, dtype="float64")
    assert table.diverged.tolist() == [True, False]  # rho's step factor |1 - 2e6| overflows; the other is fine
    assert np.isnan(table.rho[0]) and np.isfinite(table.rho[1])
    with pytest.raises(ValueError, match="one dataset per model"):
        stacked.train_stacked(models, [base], [0.0, 0.0], epochs=1, lr=0.1)
    with pytest.raises(ValueError, match="same layer shapes"):
        stacked.train_stacked([models[0], normalized.mlp(64, [9])], [base, base], [0.0, 0.0], epochs=1, lr=0.1)
    with pytest.raises(ValueError, match="lams"):
        stacked.train_stacked(models, [base, base], [0.0, -1.0], epochs=1, lr=0.1)
    cnn = normalized.make("tree_cnn", (1, 8, 8))
    with pytest.raises(ValueError, match="MLPs"):
        stacked.train_stacked([cnn], [base], [0.0], epochs=1, lr=0.1)


def test_page_setup_train_final_stacks_mlps_and_loops_otherwise(base):
    setup = pages.page_setup("digits", [1, 2], arch="mlp", arch_kwargs={"widths": [10]}, input_shape=[64],
                                max_train=40, max_test=30, epochs=15, lr=0.2, rho_lr=2.0, dtype="float64", nc=False)
    flipped = datasets.Dataset(setup.data.x_train, -setup.data.y_train, setup.data.x_test, setup.data.y_test, 2, "flip")
    members = [dict(rho_init=1.0, seed=0, lam=1e-3), dict(rho_init=2.0, seed=1, lam=0.0, data=flipped)]
    table = setup.train_final(members)
    assert list(table.seed) == [0, 1] and "data" not in table
    for k, m in enumerate(members):
        single = setup.train(rho_init=m["rho_init"], seed=m["seed"], lam=m["lam"], data=m.get("data"), progress=False,
                             log_every=15).final
        assert table.rho[k] == pytest.approx(single.rho, rel=1e-9)
        assert table.test_error[k] == single.test_error
    looped = setup.train_final(members, batch_size=8)  # minibatches: one run after the other
    single = setup.train(rho_init=1.0, seed=0, lam=1e-3, batch_size=8, progress=False).final
    assert looped.rho[0] == pytest.approx(single.rho, rel=1e-12) and not looped.diverged.any()


@pytest.mark.parametrize("classes", [[1, 2], [0, 1, 2]])
def test_train_pooled_rows_equal_the_single_runs_first_and_last_rows(classes):
    # the NC page's pooled seeds: stacked members (trained, shuffled labels, lambda = 0 on one split)
    # against train_square one run at a time, NC metrics under true and shuffled labels included
    setup = pages.page_setup("digits", classes, arch="mlp", arch_kwargs={"widths": [12, 10]}, input_shape=[64],
                             max_train=60, max_test=30, num_outputs=len(classes), epochs=20, lr=0.1, rho_lr=2.0,
                             log_every=5, nc=True, nc_convention="paper", nc_shuffled=True, dtype="float64")
    members = [dict(rho_init=3.0, seed=4, lam=1e-3), dict(rho_init=3.0, seed=4, lam=0.0),
               dict(rho_init=2.0, seed=5, lam=1e-3, data=training.shuffle_labels(setup.data, 9))]
    pooled = setup.train_pooled(members)
    assert len(pooled) == 3
    for m, got in zip(members, pooled):
        single = setup.train(rho_init=m["rho_init"], seed=m["seed"], lam=m["lam"], data=m.get("data"), progress=False,
                             log_every=20).history
        assert got.epoch.tolist() == [0, 20] and single.epoch.tolist() == [0, 20]
        columns = [c for c in single.columns if c.startswith(("nc", "shuffled_nc")) or c in ("rho", "mu", "loss", "train_error")]
        assert any(c.startswith("shuffled_nc") for c in columns) and len(columns) > 8
        for c in columns:
            np.testing.assert_allclose(got[c].to_numpy(float), single[c].to_numpy(float), rtol=1e-8, atol=1e-12, err_msg=c)
