"""Training with mini-batch SGD, and the per-epoch monitors of Galanti et al. (2022).

The optimiser is PyTorch's SGD written out (so that K models of the same shape train at once):

    g = grad L_batch(W) + weight_decay * W,   buf = momentum * buf + g,   W <- W - lr * buf,

with coupled weight decay on every parameter (PyTorch's convention; the paper's `lambda` in
`L + lambda ||W||^2` is `weight_decay / 2`) and the learning rate multiplied by `gamma` at each epoch
in `milestones`. The loss is cross-entropy ("ce") or the mean squared error to one-hot targets
("mse", averaged over samples and classes as `torch.nn.MSELoss`). Each epoch uses
`floor(N / batch_size)` batches of a fresh permutation (the last incomplete batch is dropped, so
every step sees exactly `batch_size` samples).

Ensembles: `train_ensemble` stacks K models (`torch.func.stack_module_state`) and trains them at
once: networks with a `forward_stacked` (the MLPs) through batched matrix products, the others
(conv nets, ViT) through `vmap(functional_call)`; one reverse pass through the sum of the members'
losses gives each member its own gradient. Each member has its own seed (initialisation, batch
order, augmentation), learning rate, weight decay and momentum; BatchNorm running statistics are
stacked buffers, so each member keeps its own. `sweep` groups a grid of runs by batch size and
trains each group as one ensemble.

Monitors, at epoch 0 (initialisation) and after every epoch, for every weight matrix the model lists
(`model.weight_matrices()`): numerical rank under both conventions (`rank`: singular values of
`M/||M||_2` above `eps`, the paper's text; `rank_frobenius`: of `M/||M||_F`, the authors' code),
stable rank, Frobenius and spectral norms, the distance to the previous epoch `dist = ||W_e - W_{e-1}||_F`
(the paper) and `dist_rel = dist / ||W_{e-1}||_F` (the authors' code), and per run the train / test
loss and accuracy (evaluation mode). The result is a tidy pandas table, one row per run, epoch and
layer; `table.attrs["seconds"]` says how long the training steps, the evaluation and the rank
tracking took. Singular values are computed in float32 when `eps >= 1e-4` (float64 below), one call
per group of equal-shape matrices (`lowrank.core.spectral.singular_values_by_shape`). A run whose loss
or weights stop being finite (checked once per epoch) is stopped with a warning; the epochs
measured before are kept and `table.attrs["diverged"]` says where it happened.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from lowrank.core.validation import check_choice
from lowrank.core.datasets import Dataset
from lowrank.core.spectral import monitor_dtype, singular_values_by_shape

__all__ = [
    "LOSSES",
    "loss_value",
    "member_losses",
    "lr_at",
    "spectrum_stats",
    "train_ensemble",
    "train",
    "train_point",
    "train_points",
    "ENSEMBLE_KEYS",
    "sweep",
    "average_rank",
    "final_values",
    "augment_images",
]

LOSSES = frozenset({"ce", "mse"})
RUN_KEYS = ("lr", "weight_decay", "momentum", "seed")
CHECKPOINT_FORMAT = 2  # 2: per-member augmentation generators, float32 distance snapshots


def loss_value(logits: torch.Tensor, y: torch.Tensor, loss: str) -> torch.Tensor:
    """Mean cross-entropy (`"ce"`) or mean squared error to one-hot targets (`"mse"`)."""
    if loss == "ce":
        return nn.functional.cross_entropy(logits, y)
    if loss == "mse":
        target = (y.unsqueeze(-1) == torch.arange(logits.shape[-1], device=y.device)).to(logits.dtype)
        return nn.functional.mse_loss(logits, target)  # one-hot targets, written vmap-safely
    check_choice(loss, "loss", LOSSES)


def member_losses(logits: torch.Tensor, y: torch.Tensor, loss: str) -> torch.Tensor:
    """`loss_value` of each of K members at once: logits (K, n, C), labels (K, n) -> (K,)."""
    K, n, C = logits.shape
    if loss == "ce":
        return nn.functional.cross_entropy(logits.reshape(K * n, C), y.reshape(K * n), reduction="none").view(K, n).mean(1)
    target = (y.unsqueeze(-1) == torch.arange(C, device=y.device)).to(logits.dtype)
    return (logits - target).square().mean((1, 2))


def lr_at(lr0: float, epoch: int, milestones=(), gamma: float = 0.1) -> float:
    """Learning rate during epoch `epoch` (1-based): `lr0 * gamma^(number of milestones < epoch)`.

    As `torch.optim.lr_scheduler.MultiStepLR` stepped once per epoch: with milestone 60 the rate
    drops from epoch 61 on (after 60 epochs).
    """
    return lr0 * gamma ** sum(1 for m in milestones if epoch > m)


def spectrum_stats(s: torch.Tensor, eps: float, fro: torch.Tensor | None = None) -> dict:
    """Rank-like quantities from singular values `s` (..., r), descending.

    Equal to `lowrank.core.spectral.numerical_rank(M, eps, scale=...)` and `stable_rank(M)`; a zero
    matrix (weights decayed to zero) has rank 0 and an undefined (NaN) stable rank. `fro`: the
    Frobenius norms computed from the matrices (in float64), more accurate than `||s||` when `s`
    is float32; by default `||s||`.
    """
    s = s.double()
    top = s[..., 0]
    fro = torch.linalg.vector_norm(s, dim=-1) if fro is None else fro.double()
    safe_top = torch.where(top > 0, top, torch.ones_like(top))
    rank = (s > eps * top.unsqueeze(-1)).sum(-1)
    rank_f = (s > eps * fro.unsqueeze(-1)).sum(-1)
    stable = torch.where(top > 0, fro**2 / safe_top**2, torch.full_like(top, math.nan))
    return {"rank": torch.where(top > 0, rank, 0), "rank_frobenius": torch.where(fro > 0, rank_f, 0),
            "stable_rank": stable, "weight_norm": fro, "spectral_norm": top}


def augment_images(x: torch.Tensor, generator: torch.Generator, *, padding: int = 4, flip: bool = True,
                   rotation_step: float = 15.0) -> torch.Tensor:
    """The paper's training augmentation for a batch of images `(n, C, H, W)`: a random crop after
    zero-padding by `padding`, a random horizontal flip, and a rotation by `rotation_step * k` degrees,
    `k` uniform in {1, ..., 24} (as the paper writes it; `rotation_step=0`
    turns rotations off). Randomness comes from `generator` only, drawn on its device (a generator on
    the images' GPU avoids host-to-device copies per batch)."""
    if x.ndim != 4:
        raise ValueError(f"augment_images takes images (n, C, H, W), got shape {tuple(x.shape)}")
    n, _, h, w = x.shape
    dev = x.device
    draw = {"generator": generator, "device": generator.device}
    if padding:
        xp = nn.functional.pad(x, (padding,) * 4)
        dy = torch.randint(0, 2 * padding + 1, (n,), **draw).to(dev)
        dx = torch.randint(0, 2 * padding + 1, (n,), **draw).to(dev)
        rows = (dy[:, None] + torch.arange(h, device=dev)[None]).reshape(n, 1, h, 1)
        cols = (dx[:, None] + torch.arange(w, device=dev)[None]).reshape(n, 1, 1, w)
        x = xp.gather(2, rows.expand(n, x.shape[1], h, xp.shape[3])).gather(3, cols.expand(n, x.shape[1], h, w))
    if flip:
        mask = (torch.rand(n, **draw) < 0.5).to(dev)
        x = torch.where(mask[:, None, None, None], x.flip(-1), x)
    if rotation_step:
        k = torch.randint(1, 25, (n,), **draw).to(dev)
        theta = torch.deg2rad(rotation_step * k.to(x.dtype))
        cos, sin = torch.cos(theta), torch.sin(theta)
        zero = torch.zeros_like(cos)
        A = torch.stack([torch.stack([cos, -sin, zero], -1), torch.stack([sin, cos, zero], -1)], 1)
        grid = nn.functional.affine_grid(A, list(x.shape), align_corners=False)
        x = nn.functional.grid_sample(x, grid, align_corners=False)
    return x


def _check_positive_int(value, name):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _normalise_runs(runs) -> list[dict]:
    if not runs:
        raise ValueError("runs is empty: give at least one dict with lr (and weight_decay, momentum, seed)")
    out = []
    for i, r in enumerate(runs):
        if not isinstance(r, dict) or "lr" not in r:
            raise ValueError(f"runs[{i}] must be a dict with at least 'lr', got {r!r}")
        r = {"weight_decay": 0.0, "momentum": 0.0, "seed": i, **r}
        if not (r["lr"] > 0 and math.isfinite(r["lr"])):
            raise ValueError(f"runs[{i}]: lr must be a positive number, got {r['lr']}")
        if not r["weight_decay"] >= 0:
            raise ValueError(f"runs[{i}]: weight_decay must be non-negative, got {r['weight_decay']}")
        if not 0 <= r["momentum"] < 1:
            raise ValueError(f"runs[{i}]: momentum must be in [0, 1), got {r['momentum']}")
        out.append(r)
    return out


def _check_data(data: Dataset):
    if not isinstance(data, Dataset):
        raise ValueError(f"data must be a lowrank.core.datasets.Dataset, got {type(data).__name__}")
    if data.y_train.min() < 0:
        raise ValueError("labels must be class indices 0..C-1 (got negative labels; binary ±1 data needs remapping)")


def _broadcast(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.reshape(-1, *([1] * (like.ndim - 1)))


def train_ensemble(model_fn: Callable[[], nn.Module], data: Dataset, runs, *, batch_size: int, epochs: int,
                   loss: str = "ce", milestones=(), gamma: float = 0.1, eps: float = 1e-3, eval_batch: int | None = None,
                   augment: Callable | None = None, progress: bool = True, device=None,
                   desc: str | None = None, run_offset: int = 0, extra: dict | None = None,
                   checkpoint=None, checkpoint_every: int = 1, eval_every: int = 1,
                   mixed_precision: bool = False) -> pd.DataFrame:
    """Train `len(runs)` models `model_fn()` at once; return the tidy monitor table.

    `runs`: list of dicts with `lr` and optionally `weight_decay`, `momentum`, `seed` (default: its
    index), plus any other keys (kept as columns, e.g. a label). `model_fn` is called once per run
    after `torch.manual_seed(seed)`, so the seed fixes the initialisation; it also fixes the batch
    order. `augment(x, generator)` optionally transforms each training batch (paper-scale images).
    `extra` adds constant columns (e.g. the model's name).

    `checkpoint`: a file path. Every `checkpoint_every` epochs the whole state (weights, BatchNorm
    buffers, momentum, the batch-order generators, the monitors so far) is written there atomically;
    if the file exists when training starts, training resumes after its epoch and ends exactly as an
    uninterrupted run would (the same runs and batch size are required; `epochs` may be larger).

    `eval_batch`: samples per member per evaluation chunk (default: about 8192 / K).
    `eval_every`: the train/test loss and accuracy (a forward pass over both sets, the costly part of
    the monitors) are measured at epoch 0, every `eval_every` epochs and after the last one; NaN in
    between. Ranks, norms and distances are measured after every epoch.

    `mixed_precision`: the training forward and backward passes run in bfloat16 autocast (for GPUs);
    the weights, the optimiser, the loss and every monitor (evaluation, singular values, norms)
    stay in float32, so the measured ranks are not rounded to bfloat16's 3 significant digits.
    """
    runs = _normalise_runs(runs)
    _check_positive_int(checkpoint_every, "checkpoint_every")
    _check_positive_int(eval_every, "eval_every")
    if eval_batch is not None:
        _check_positive_int(eval_batch, "eval_batch")
    _check_positive_int(batch_size, "batch_size")
    _check_positive_int(epochs, "epochs")
    check_choice(loss, "loss", LOSSES)
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    _check_data(data)
    n_train = data.x_train.shape[0]
    if batch_size > n_train:
        raise ValueError(f"batch_size={batch_size} is larger than the training set ({n_train} samples)")
    from lowrank.core.device import get_device

    dev = torch.device(device) if device is not None else get_device()
    K = len(runs)
    models = []
    for r in runs:
        torch.manual_seed(int(r["seed"]))
        models.append(model_fn().to(dev))
    base = copy.deepcopy(models[0]).to("meta")
    if not hasattr(models[0], "weight_matrices"):
        raise ValueError("model_fn() must return a network with weight_matrices() (see lowrank.core.nets)")
    specs = models[0].weight_specs()
    has_dropout = any(isinstance(m, nn.Dropout) and m.p > 0 for m in models[0].modules())
    params, buffers = stack_module_state(models)
    params = {k: v.detach().clone() for k, v in params.items()}
    buffers = {k: v.clone() for k, v in buffers.items()}
    mom_buf = {k: torch.zeros_like(v) for k, v in params.items()}
    lr0 = torch.tensor([float(r["lr"]) for r in runs], device=dev)
    wd = torch.tensor([float(r["weight_decay"]) for r in runs], device=dev)
    mom = torch.tensor([float(r["momentum"]) for r in runs], device=dev)
    gens = [torch.Generator().manual_seed(10_007 * int(r["seed"]) + 17) for r in runs]
    # each member's augmentation draws from its own generator on the data's device
    aug_gens = [torch.Generator(device=dev).manual_seed(10_007 * int(r["seed"]) + 29) for r in runs]
    x_tr, y_tr = data.x_train.to(dev), data.y_train.to(dev)
    x_te, y_te = data.x_test.to(dev), data.y_test.to(dev)

    if hasattr(base, "forward_stacked"):  # batched products, far less dispatch than vmap (lowrank.core.nets.mlp)
        def member_logits(p, b, x):
            return base.forward_stacked(p, b, x)

        def eval_logits(p, b, x):
            return base.forward_stacked(p, b, x, shared=True)
    else:
        def forward(p, b, x):
            return functional_call(base, (p, b), (x,))

        member_logits = vmap(forward, in_dims=(0, 0, 0), randomness="different" if has_dropout else "error")
        eval_logits = vmap(forward, in_dims=(0, 0, None))
    names = list(params)

    def grad_fn(p, b, x, y):
        # members are independent, so the gradient of the sum of their losses is each member's own
        # gradient; reverse-mode autograd through the batched forward is faster than vmap(grad(.)).
        leaves = {k: v.detach().requires_grad_(True) for k, v in p.items()}
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=mixed_precision):
            logits = member_logits(leaves, b, x)
        losses = member_losses(logits.float(), y, loss)
        grads = torch.autograd.grad(losses.sum(), [leaves[k] for k in names], allow_unused=True)
        return [torch.zeros_like(p[k]) if g is None else g for k, g in zip(names, grads)], losses.detach()

    # evaluation chunks of about 8192 member-samples: large enough for efficient products, small
    # enough that the activations stay in cache (K=16 on 1437 samples at once was 1.8x slower)
    chunk = eval_batch or max(256, 8192 // K)

    def evaluate(x, y):
        base.eval()
        tot_loss = torch.zeros(K, device=dev, dtype=torch.float64)
        correct = torch.zeros(K, device=dev, dtype=torch.float64)
        with torch.no_grad():
            for i in range(0, x.shape[0], chunk):
                xb, yb = x[i:i + chunk], y[i:i + chunk]
                out = eval_logits(params, buffers, xb)  # K x n x C
                tot_loss += member_losses(out, yb.expand(K, -1), loss).double() * xb.shape[0]
                correct += (out.argmax(-1) == yb).double().sum(-1)
        return (tot_loss / x.shape[0]).cpu().numpy(), (correct / x.shape[0]).cpu().numpy()

    plist = [params[k] for k in names]
    bufs = [mom_buf[k] for k in names]
    wd_b = [_broadcast(wd, params[k]) for k in names]
    mom_b = [_broadcast(mom, params[k]) for k in names]
    alive = np.ones(K, dtype=bool)
    diverged: dict = {}
    prev: dict = {}
    rows: list = []
    run_cols = [{k: v for k, v in r.items() if k not in ("lr",)} | {"lr0": float(r["lr"])} for r in runs]
    svd_dtype = monitor_dtype(eps)
    seconds = {"train": 0.0, "evaluate": 0.0, "track_ranks": 0.0}  # where the time went (table.attrs)
    nan_k = np.full(K, math.nan)

    def track_ranks() -> list[dict]:
        """Per weight matrix, numpy arrays over the K members: ranks, norms, distance to the last call."""
        mats = [params[name].detach().reshape(K, params[name].shape[1], -1) for name, _ in specs]
        mats = [torch.nan_to_num(M, nan=0.0, posinf=0.0, neginf=0.0).to(svd_dtype) for M in mats]
        out = []
        for (name, _), M, s in zip(specs, mats, singular_values_by_shape(mats)):
            fro = torch.linalg.vector_norm(M.reshape(K, -1), dim=-1, dtype=torch.float64)
            st = spectrum_stats(s, eps, fro=fro)
            if name in prev:
                dist = torch.linalg.vector_norm((M - prev[name][0]).reshape(K, -1), dim=-1, dtype=torch.float64)
                pfro = prev[name][1]
                dist_rel = torch.where(pfro > 0, dist / torch.where(pfro > 0, pfro, 1.0), math.nan)
                dist, dist_rel = dist.cpu().numpy(), dist_rel.cpu().numpy()
            else:
                dist = dist_rel = nan_k
            prev[name] = (M, fro)  # nan_to_num made M a copy
            out.append({k: v.cpu().numpy() for k, v in st.items()} | {"dist": dist, "dist_rel": dist_rel,
                                                                       "shape": f"{M.shape[1]}x{M.shape[2]}"})
        return out

    def monitor(epoch: int, lr_now: np.ndarray):
        evaluated = epoch % eval_every == 0 or epoch == epochs
        if evaluated:
            t0 = time.perf_counter()
            tr_loss, tr_acc = evaluate(x_tr, y_tr)
            te_loss, te_acc = evaluate(x_te, y_te)
            seconds["evaluate"] += time.perf_counter() - t0
        else:
            tr_loss = tr_acc = te_loss = te_acc = nan_k
        finite_weights = torch.stack([torch.isfinite(params[n].reshape(K, -1)).all(1) for n, _ in specs]).all(0)
        bad = ~finite_weights.cpu().numpy() | (evaluated & ~np.isfinite(tr_loss))
        for k in np.flatnonzero(alive & bad):
            _stop(k, epoch, f"train loss {tr_loss[k]:.3g} or non-finite weights after the epoch")
        base_row = {"batch_size": batch_size, "loss": loss, **(extra or {})}
        t0 = time.perf_counter()
        stats = track_ranks()
        seconds["track_ranks"] += time.perf_counter() - t0
        for li, ((name, classifier), st) in enumerate(zip(specs, stats)):
            for k in np.flatnonzero(alive):
                rows.append({"run": run_offset + int(k), **run_cols[k], **base_row, "epoch": epoch, "lr": float(lr_now[k]),
                             "layer": name, "layer_index": li, "classifier": classifier, "shape": st["shape"],
                             "rank": int(st["rank"][k]), "rank_frobenius": int(st["rank_frobenius"][k]),
                             "stable_rank": float(st["stable_rank"][k]), "weight_norm": float(st["weight_norm"][k]),
                             "spectral_norm": float(st["spectral_norm"][k]), "dist": float(st["dist"][k]),
                             "dist_rel": float(st["dist_rel"][k]), "train_loss": float(tr_loss[k]),
                             "train_acc": float(tr_acc[k]), "test_loss": float(te_loss[k]),
                             "test_acc": float(te_acc[k])})

    def _stop(k, epoch, why):
        alive[k] = False
        diverged[run_offset + int(k)] = {"epoch": epoch, "reason": why, **{key: runs[k][key] for key in RUN_KEYS}}
        warnings.warn(f"run {run_offset + int(k)} (lr={runs[k]['lr']}, weight_decay={runs[k]['weight_decay']}, "
                      f"batch_size={batch_size}) diverged in epoch {epoch}: {why}. It is stopped; the "
                      f"{epoch if epoch else 0} epoch(s) measured before are kept.", RuntimeWarning, stacklevel=3)

    identity = {"runs": runs, "batch_size": batch_size, "loss": loss, "milestones": list(milestones), "gamma": gamma}
    state_tensors = {"params": params, "buffers": buffers, "mom_buf": mom_buf}
    start_epoch = 0
    if checkpoint is not None and Path(checkpoint).is_file():
        saved = torch.load(checkpoint, map_location=dev, weights_only=False)
        if saved.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"checkpoint {checkpoint} was written by another version of lowrank.core.train "
                             f"(format {saved.get('format')}, this one reads {CHECKPOINT_FORMAT}); remove it")
        if saved["identity"] != identity:
            raise ValueError(f"checkpoint {checkpoint} belongs to other runs or another batch size; "
                             "remove it or pass another path")
        for group, tensors in state_tensors.items():
            for k, v in tensors.items():
                v.copy_(saved[group][k])  # in place: the optimiser's lists point at these tensors
        for g, st in zip(gens + aug_gens, saved["generators"] + saved["augment_generators"]):
            g.set_state(st)
        torch.set_rng_state(saved["torch_rng"])  # dropout draws from the global generator
        alive[:] = saved["alive"]
        diverged.update(saved["diverged"])
        prev.update({k: tuple(t.to(dev) for t in v) for k, v in saved["prev"].items()})
        rows.extend(saved["rows"])
        start_epoch = saved["epoch"]
    else:
        monitor(0, lr0.cpu().numpy())

    def save_checkpoint(epoch):
        path = Path(checkpoint)
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save({"format": CHECKPOINT_FORMAT, "identity": identity, "epoch": epoch, **{g: {k: v.detach().cpu() for k, v in t.items()}
                    for g, t in state_tensors.items()}, "generators": [g.get_state() for g in gens],
                    "augment_generators": [g.get_state() for g in aug_gens],
                    "torch_rng": torch.get_rng_state(),
                    "alive": alive.copy(), "diverged": dict(diverged), "prev": {k: tuple(t.cpu() for t in v) for k, v in prev.items()},
                    "rows": list(rows)}, tmp)
        os.replace(tmp, path)

    steps = n_train // batch_size
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=epochs, initial=start_epoch, desc=desc or f"B={batch_size}, {K} run(s)", leave=False)
    for epoch in range(start_epoch + 1, epochs + 1):
        if not alive.any():
            break
        factor = gamma ** sum(1 for m in milestones if epoch > m)
        lr = lr0 * factor
        perms = torch.stack([torch.randperm(n_train, generator=g) for g in gens]).to(dev)
        alive_t = torch.as_tensor(alive, device=dev)
        neg_lr = [_broadcast(-(lr * alive_t), v) for v in plist]  # stopped runs take no steps
        finite = torch.ones(K, dtype=torch.bool, device=dev)
        base.train()
        t0 = time.perf_counter()
        for s in range(steps):
            idx = perms[:, s * batch_size:(s + 1) * batch_size]
            xb, yb = x_tr[idx], y_tr[idx]
            if augment is not None:
                xb = torch.stack([augment(xb[k], aug_gens[k]) for k in range(K)])
            g, losses = grad_fn(params, buffers, xb, yb)
            # checked once per epoch, not per step (a per-step check would wait for the GPU); members
            # never mix, so a diverging one harms no other
            finite &= torch.isfinite(losses)
            with torch.no_grad():
                # PyTorch's SGD, all parameters at once: buf = m buf + (g + wd p); p -= lr buf
                torch._foreach_mul_(bufs, mom_b)
                torch._foreach_add_(bufs, g)
                torch._foreach_addcmul_(bufs, plist, wd_b)
                torch._foreach_addcmul_(plist, bufs, neg_lr)
        for k in np.flatnonzero(alive & ~finite.cpu().numpy()):
            _stop(k, epoch, "non-finite training loss during the epoch")
        seconds["train"] += time.perf_counter() - t0
        monitor(epoch, (lr).cpu().numpy())
        if checkpoint is not None and (epoch % checkpoint_every == 0 or epoch == epochs):
            save_checkpoint(epoch)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    table = pd.DataFrame(rows)
    table.attrs["diverged"] = diverged
    table.attrs["eps"] = eps
    table.attrs["seconds"] = seconds
    return table


def train(model_fn: Callable[[], nn.Module], data: Dataset, *, lr: float, batch_size: int, epochs: int,
          weight_decay: float = 0.0, momentum: float = 0.0, seed: int = 0, **kwargs) -> pd.DataFrame:
    """One run (an ensemble of one); keyword arguments as `train_ensemble`."""
    return train_ensemble(model_fn, data, [{"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                                            "seed": seed}], batch_size=batch_size, epochs=epochs, **kwargs)


def sweep(model_fn: Callable[[], nn.Module], data: Dataset, grid, *, epochs: int, progress: bool = True,
          **kwargs) -> pd.DataFrame:
    """Train every run of `grid` (dicts with `batch_size`, `lr` and optionally `weight_decay`,
    `momentum`, `seed`, labels), one ensemble per batch size; the tables are concatenated, with a
    global `run` index in grid order and `attrs["diverged"]` merged."""
    grid = list(grid)
    if not grid:
        raise ValueError("grid is empty")
    for i, g in enumerate(grid):
        if not isinstance(g, dict) or "batch_size" not in g:
            raise ValueError(f"grid[{i}] must be a dict with 'batch_size', got {g!r}")
    tables, diverged = [], {}
    for B in sorted({g["batch_size"] for g in grid}):
        idx = [i for i, g in enumerate(grid) if g["batch_size"] == B]
        runs = [{k: v for k, v in grid[i].items() if k != "batch_size"} for i in idx]
        t = train_ensemble(model_fn, data, runs, batch_size=B, epochs=epochs, progress=progress, **kwargs)
        if len(t):
            local = t["run"].to_numpy()
            t["run"] = np.asarray(idx)[local]
        diverged |= {idx[k]: v for k, v in t.attrs.get("diverged", {}).items()}
        tables.append(t)
    out = pd.concat(tables, ignore_index=True).sort_values(["run", "epoch", "layer_index"], ignore_index=True)
    out.attrs["diverged"] = diverged
    return out


def train_point(*, model: str, dataset: str, batch_size: int, lr: float, epochs: int, weight_decay: float = 0.0,
                momentum: float = 0.0, milestones=(), gamma: float = 0.1, eps: float = 1e-3, loss: str = "ce",
                augment: bool = False, seed: int = 0, data_root: str = "", cnn_width: float = 1.0,
                vit_dim: int = 512, vit_depth: int = 6, checkpoint: str = "", checkpoint_every: int = 10,
                eval_every: int = 1, mixed_precision: bool = False) -> pd.DataFrame:
    """One training run named by plain values (a sweep point, see `lowrank.book.sweeps`): the model by
    its paper name (e.g. "MLP-BN-10-100", "ResNet-18"), the data set by name. Returns the tidy monitor table.
    With `checkpoint` (a file path) a killed long run resumes where its last checkpoint left it."""
    return train_points([dict(locals())])[0]


# the run settings an ensemble's members may differ in (everything else is shared)
ENSEMBLE_KEYS = ("lr", "weight_decay", "momentum", "seed")


def train_points(points: list[dict]) -> list[pd.DataFrame]:
    """Several `train_point` runs that differ only in `ENSEMBLE_KEYS`, trained at once as one ensemble
    (a sweep with `ensemble: true`). Returns one table per point, in order, each as `train_point`
    would return it (`run` 0). A checkpoint file is per ensemble: its name gets the members' hash."""
    import hashlib
    import inspect

    from lowrank.core.datasets import load
    from lowrank.core.nets import zoo

    if not points:
        raise ValueError("points is empty")
    signature = inspect.signature(train_point)
    full = []
    for i, p in enumerate(points):
        try:
            bound = signature.bind(**p)
        except TypeError as err:
            raise ValueError(f"points[{i}]: {err}") from None
        bound.apply_defaults()
        full.append(dict(bound.arguments))
    shared = {k: v for k, v in full[0].items() if k not in ENSEMBLE_KEYS}
    for i, p in enumerate(full[1:], 1):
        differ = sorted(k for k, v in p.items() if k not in ENSEMBLE_KEYS and v != shared[k])
        if differ:
            raise ValueError(f"points[{i}] differs from points[0] in {differ}; an ensemble's members may differ "
                             f"only in {list(ENSEMBLE_KEYS)}")
    members = [{k: p[k] for k in ENSEMBLE_KEYS} for p in full]
    checkpoint = shared["checkpoint"] or None
    if checkpoint and len(full) > 1:
        tag = hashlib.sha256(json.dumps(members, sort_keys=True).encode()).hexdigest()[:12]
        checkpoint = str(Path(checkpoint).with_name(f"{Path(checkpoint).stem}.{tag}{Path(checkpoint).suffix}"))
    name = shared["dataset"]
    data = load(name, root=shared["data_root"] or None) if name in ("mnist", "cifar10") else load(name)
    make, data = zoo.for_data(shared["model"], data, cnn_width=shared["cnn_width"], vit_dim=shared["vit_dim"],
                              vit_depth=shared["vit_depth"])
    augmenter = (lambda x, g: augment_images(x, g)) if shared["augment"] else None
    table = train_ensemble(make, data, members, batch_size=shared["batch_size"], epochs=shared["epochs"],
                           milestones=list(shared["milestones"]), gamma=shared["gamma"], eps=shared["eps"],
                           loss=shared["loss"], augment=augmenter, progress=False, extra={"model": shared["model"]},
                           checkpoint=checkpoint, checkpoint_every=shared["checkpoint_every"],
                           eval_every=shared["eval_every"], mixed_precision=shared["mixed_precision"])
    out = []
    for k in range(len(full)):
        one = table[table["run"] == k].reset_index(drop=True).assign(run=0)
        one.attrs = {**table.attrs, "diverged": {0: v for r, v in table.attrs["diverged"].items() if r == k}}
        out.append(one)
    return out


def average_rank(table: pd.DataFrame, *, convention: str = "spectral", include_classifier: bool = True,
                 by=("run", "epoch")) -> pd.DataFrame:
    """Average over layers of the numerical rank, one row per `by` (default run and epoch), with the
    run's other columns (first value) kept. `convention="spectral"` is the paper's text (`rank`);
    "frobenius" the authors' code (`rank_frobenius`); the code also leaves the classifier out."""
    check_choice(convention, "convention", {"spectral", "frobenius"})
    col = "rank" if convention == "spectral" else "rank_frobenius"
    t = table if include_classifier else table[~table["classifier"]]
    if t.empty:
        raise ValueError("no layer left to average (the table is empty or has only the classifier)")
    by = list(by)
    keep = [c for c in t.columns if c not in by and c not in ("layer", "layer_index", "classifier", "shape", "rank",
                                                               "rank_frobenius", "stable_rank", "weight_norm",
                                                               "spectral_norm", "dist", "dist_rel")]
    agg = {c: "first" for c in keep}
    agg |= {col: "mean", "stable_rank": "mean", "dist": "mean", "dist_rel": "mean", "weight_norm": "mean"}
    out = t.groupby(by, sort=True).agg(agg).reset_index().rename(columns={col: "avg_rank"})
    return out


def final_values(table: pd.DataFrame, **kwargs) -> pd.DataFrame:
    """`average_rank` at each run's last measured epoch."""
    avg = average_rank(table, **kwargs)
    return avg.loc[avg.groupby("run")["epoch"].idxmax()].reset_index(drop=True)
