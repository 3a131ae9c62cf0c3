"""float32 for Section 3.4's n x d x m products (`product_precision`), allowed where the page's verdicts
do not move: float64 stays the reference, and the page at ci scale in float32 meets every golden entry
measured in float64."""

import nbformat
import pytest
import torch

from lowrank.book import goldens, keys, runs, verdicts
from lowrank.core.nets import gamma_m
from lowrank.gradients import dynamics as gd

GOLDEN = goldens.load()


def _draw(n=60, d=80, m=100, nu=0.5, seed=3):
    data, omega, y, W, a = gd.single_index_draw(n, d, m, nu=nu, seed=seed)
    return data, y, W, a


def test_float32_products_round_like_float32_and_keep_float64_tensors():
    data, y, W, a = _draw()
    G64, r64 = gd.gradient_matrix(data.X, W, a, y, activation="tanh", gamma=gamma_m(100, "mf"))
    G32, r32 = gd.gradient_matrix(data.X, W, a, y, activation="tanh", gamma=gamma_m(100, "mf"),
                                  product_precision="float32")
    assert G32.dtype == r32.dtype == torch.float64
    # an independent float64 reference: autograd through the same loss
    Wg = W.clone().requires_grad_(True)
    f = gamma_m(100, "mf") * torch.tanh(data.X @ Wg.T) @ a
    (0.5 * ((f - y) ** 2).mean()).backward()
    assert torch.allclose(G64, Wg.grad.T, rtol=1e-10, atol=1e-14 * float(G64.abs().max()))
    err = float((G32 - G64).norm() / G64.norm())
    assert 1e-10 < err < 1e-5  # float32 rounding: neither float64's nor worse than float32's
    with pytest.raises(ValueError, match="product_precision"):
        gd.gradient_matrix(data.X, W, a, y, activation="tanh", gamma=1.0, product_precision="float16")


def test_float32_training_starts_on_the_float64_run():
    """The first steps agree to float32's rounding. Later the step 1/gamma_m (here m = 100) amplifies
    that rounding about tenfold every few steps, as it does any CPU path's, so the page-level test below
    (outcomes over draws) is what decides."""
    data, y, W, a = _draw()
    settings = dict(activation="tanh", gamma=gamma_m(100, "mf"), steps=30, X_B=data.X_B,
                    references={"q": data.q}, snapshot_steps=[30])
    ref = gd.train_weight_normalized(data.X, y, W, a, **settings)
    low = gd.train_weight_normalized(data.X, y, W, a, product_precision="float32", **settings)
    first = slice(0, 3)
    for col in ("loss", "s1", "align_q", "align_residue", "align_initial"):
        assert low.trace[col].to_numpy()[first] == pytest.approx(ref.trace[col].to_numpy()[first], rel=1e-5, abs=1e-6), col
    assert not low.trace["loss"].equals(ref.trace["loss"])  # the products really were float32
    with pytest.raises(ValueError, match="product_precision"):
        gd.DescentConfig(activation="tanh", gamma=1.0, steps=1, product_precision="half")


@pytest.mark.slow
def test_mf_vs_ntk_in_float32_meets_every_float64_golden_entry(tmp_path, monkeypatch):
    """The owner's condition for float32 at paper scale: at a reduced configuration (the ci scale), the
    same verdict outcomes and values within the golden tolerances, which were measured in float64."""
    name = "gradients/mf_vs_ntk"
    monkeypatch.setenv(verdicts.STABILITY_ENV, str(goldens.GOLDEN))  # as nbval: recorded-unstable verdicts read so
    found, _ = runs.execute(keys.notebook_code(name), {"product_precision": "float32"}, tmp_path / "nb.ipynb", tmp_path / "figures")
    injected = [c.source for c in nbformat.read(tmp_path / "nb.ipynb", as_version=4).cells
                if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "product_precision = \"float32\"" in injected[0]
    assert not goldens.block_mismatches(found, GOLDEN[name]), "\n".join(goldens.block_mismatches(found, GOLDEN[name]))
