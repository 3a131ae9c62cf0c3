"""Many `rho * f_V` MLPs trained at once by full-batch gradient descent: the runs of a Part III sweep
(label corruption levels, initialisation scales, seeds) stacked along a leading member axis.

The mathematics is that of `lowrank.square.training.train_square` with full batches, step for step:
the loss `(1/N) sum_n ||rho f_V(x_n) - t_n||^2 + lam rho^2` per member, PyTorch's SGD (momentum with
dampening 0) with rho's own step `rho_lr`, every `v_k` put back on the unit sphere after each step,
and rho kept >= 0 by flipping (rho, V_L) and their momentum. Only the arithmetic is batched (one
einsum per layer for all members), which on two CPU cores makes a sweep of dozens of small runs
several times faster than running them one by one. The members share the inputs, the step sizes and
the number of epochs; each has its own initialisation (its `NormalizedNet`), training labels and
`lam`. At the end every member's parameters are written back into its model, and its row is
`training.evaluate`'s, so the statistics are computed exactly as for a single run.
"""

from __future__ import annotations

import functools
import math

import pandas as pd
import torch

from lowrank.core.datasets import Dataset
from lowrank.square import training

__all__ = ["train_stacked"]


def _stack(models, dtype):
    body = [torch.stack([m.body[k].v.detach().to(dtype) for m in models]).clone().requires_grad_(True)
            for k in range(len(models[0].body))]
    head = torch.stack([m.head.v.detach().to(dtype) for m in models]).clone().requires_grad_(True)
    rho = torch.stack([m.rho.detach().to(dtype) for m in models]).clone().requires_grad_(True)
    return body, head, rho


def _unit(v):
    return v / v.flatten(1).norm(dim=1).reshape(-1, *([1] * (v.ndim - 1)))


def _outputs(x, body, head, gains, single):
    h = x
    for v, g in zip(body, gains):
        W = g * _unit(v)
        h = torch.relu(torch.einsum("nd,kod->kno", h, W) if h.ndim == 2 else torch.einsum("kni,koi->kno", h, W))
    out = torch.einsum("knp,kcp->knc", h, _unit(head))
    return out.squeeze(-1) if single else out


def _check(models, datasets):
    if not models or len(models) != len(datasets):
        raise ValueError(f"need one dataset per model, got {len(models)} models and {len(datasets)} datasets")
    first = models[0]
    for m in models:
        if not hasattr(m, "outputs_and_features") or any(layer.kind != "linear" for layer in m.body):
            raise ValueError("train_stacked trains weight-normalised MLPs (lowrank.core.nets.normalized.mlp) only")
        if [tuple(layer.v.shape) for layer in m.body] != [tuple(layer.v.shape) for layer in first.body] or \
                m.head.v.shape != first.head.v.shape or not m.normalize_last:
            raise ValueError("every member must have the same layer shapes (and a normalised last layer)")
    for d in datasets:
        if not torch.equal(d.x_train, datasets[0].x_train):
            raise ValueError("the members must share the training inputs (labels may differ)")


def train_stacked(models, datasets, lams, *, epochs: int, lr: float, rho_lr: float | None = None,
                  momentum: float = 0.0, schedule: str = "constant", min_lr: float = 0.0, dtype="float64",
                  nc: bool = False, nc_convention: str = "papyan", shuffled_label_seeds=None,
                  record_initial: bool = False) -> pd.DataFrame:
    """Train the `models` (weight-normalised MLPs of equal shapes) at once by full-batch gradient descent.

    Parameters
    ----------
    models : list of `NormalizedNet` (`normalized.mlp`), one per member; trained in place.
    datasets : one `Dataset` per member, sharing `x_train` (labels, and the test set, may differ).
    lams : one lambda per member (penalty `lam * rho^2`).
    epochs, lr, rho_lr, momentum, schedule, min_lr, dtype : as `training.SquareConfig` (full batches).
    nc, nc_convention : `training.evaluate`'s neural-collapse columns, as `SquareConfig`'s.
    shuffled_label_seeds : one seed per member, or None: with `nc`, the NC metrics also under the
        training labels permuted as `train_square` permutes them with `nc_shuffled` and that `seed`
        (columns `shuffled_...`).
    record_initial : also evaluate every member before training.

    Returns
    -------
    DataFrame, one row per member in order: `training.evaluate`'s statistics of the trained model
    (rho, mu, M, train_error, test_error, ...), `diverged` (True when its loss or parameters stopped
    being finite; its statistics are then NaN) and `rho_sign_flips`. With `record_initial`, first one
    row per member of the untrained networks, then those of the trained ones, and a column `epoch`
    (0, then `epochs`).
    """
    _check(models, datasets)
    lams = [float(v) for v in lams]
    if len(lams) != len(models) or not all(math.isfinite(v) and v >= 0 for v in lams):
        raise ValueError("lams must hold one finite lambda >= 0 per model")
    config = training.SquareConfig(epochs=epochs, lr=lr, rho_lr=rho_lr, momentum=momentum, schedule=schedule,
                                   min_lr=min_lr, dtype=dtype, nc=False)
    dtype = config.dtype
    single = models[0].num_outputs == 1
    data = [training._to_device(m.to(dtype), d, torch.device("cpu"), dtype) for m, d in zip(models, datasets)]
    if shuffled_label_seeds is not None:
        if len(shuffled_label_seeds) != len(models):
            raise ValueError("shuffled_label_seeds must hold one seed per model")
        for d, s in zip(data, shuffled_label_seeds):  # as train_square with nc_shuffled
            d.shuffle_labels(s)
    evaluate = functools.partial(training.evaluate, nc=nc, nc_convention=nc_convention,
                                 eval_batch_size=config.eval_batch_size)
    initial = []
    if record_initial:
        for m, d, lam_k in zip(models, data, lams):
            row = evaluate(m, d, lam_k)[0]
            initial.append({**(row or {}), "diverged": row is None, "rho_sign_flips": 0, "epoch": 0})
    x, n = data[0].x_train, data[0].n
    targets = torch.stack([d.targets for d in data])
    lam = torch.tensor(lams, dtype=dtype)
    gains = [float(layer.g) for layer in models[0].body]
    body, head, rho = _stack(models, dtype)
    params, buffers = body + [head, rho], [None] * (len(body) + 2)
    flips = torch.zeros(len(models), dtype=torch.int64)
    alive = torch.ones(len(models), dtype=torch.bool)
    for step in range(epochs):
        cur = training._lr_at(config, step, epochs)
        out = _outputs(x, body, head, gains, single)
        per_member = ((rho.reshape(-1, *([1] * (out.ndim - 1))) * out - targets) ** 2).reshape(len(models), n, -1)
        loss = per_member.sum(2).mean(1) + lam * rho**2
        grads = torch.autograd.grad(loss.sum(), params)
        with torch.no_grad():
            alive &= torch.isfinite(loss)
            for i, (p, g) in enumerate(zip(params, grads)):
                if momentum:
                    buffers[i] = g.clone() if buffers[i] is None else buffers[i].mul_(momentum).add_(g)
                    g = buffers[i]
                p -= (cur * config.rho_scale if p is rho else cur) * g
            for v in body + [head]:
                v.copy_(_unit(v))
            neg = rho < 0
            if bool(neg.any()):
                flips += neg.to(torch.int64)
                sign = torch.where(neg, -1.0, 1.0).to(dtype)
                rho.mul_(sign)
                head.mul_(sign.reshape(-1, 1, 1))
                for i in (len(body), len(body) + 1):
                    if buffers[i] is not None:
                        buffers[i].mul_(sign.reshape(-1, *([1] * (buffers[i].ndim - 1))))
    rows = []
    with torch.no_grad():
        for k, (m, d) in enumerate(zip(models, data)):
            for layer, v in zip(m.body, body):
                layer.v.copy_(v[k])
            m.head.v.copy_(head[k])
            m.rho.copy_(rho[k])
            finite = bool(alive[k]) and all(bool(torch.isfinite(p).all()) for p in m.parameters())
            row = evaluate(m, d, lams[k])[0] if finite else None
            rows.append({**(row or {}), "diverged": row is None, "rho_sign_flips": int(flips[k])}
                        | ({"epoch": epochs} if record_initial else {}))
    return pd.DataFrame(initial + rows)
