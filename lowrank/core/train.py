"""Training with mini-batch SGD, and the per-epoch monitors of Galanti et al. (2022).

The optimiser is PyTorch's SGD written out (so that K models of the same shape train at once):

    g = grad L_batch(W) + weight_decay * W,   buf = momentum * buf + g,   W <- W - lr * buf,

with coupled weight decay on every parameter (PyTorch's convention; the paper's `lambda` in
`L + lambda ||W||^2` is `weight_decay / 2`) and the learning rate multiplied by `lr_decay` at each
epoch in `milestones` (`lr_at`). The loss is cross-entropy ("ce") or the mean squared error to one-hot targets
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

The loop (`train_ensemble`) is a few dozen lines over named pieces: `TrainConfig` (the settings shared
by the members), `EnsembleState` (everything that evolves; also the checkpoint payload), `_Forward`
(the members' forward passes), `_sgd_epoch` (one epoch of steps), `_evaluate` and `_monitor`;
checkpoints (saving, resuming, what a checkpoint belongs to) are `lowrank.core.checkpoint`'s.

Monitors, at epoch 0 (initialisation) and after every epoch, for every weight matrix the model lists
(`model.weight_matrices()`), by `lowrank.core.spectral.spectrum_stats`: numerical rank under both
conventions (`rank_frobenius`: singular values of `M/||M||_F` above `eps`, the paper's `||.||_2` (l.1034)
and the authors' code; `rank_spectral`: of `M/||M||_2`),
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
import dataclasses
import functools
import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from lowrank.core import checkpoint as checkpointing
from lowrank.core.io import digest
from lowrank.core.validation import check_choice, check_seed, is_number
from lowrank.core.datasets import DEFAULT_DATA_ROOT, Dataset
from lowrank.core.spectral import monitor_dtype, rank_from_singular_values, singular_values_by_shape, spectrum_stats

__all__ = [
    "LOSSES",
    "loss_value",
    "member_losses",
    "lr_at",
    "TrainConfig",
    "EnsembleState",
    "train_ensemble",
    "train",
    "PointConfig",
    "train_point",
    "train_points",
    "ENSEMBLE_KEYS",
    "STATUS_COLUMNS",
    "with_status",
    "diverged_runs",
    "AllDiverged",
    "check_some_run_finite",
    "sweep",
    "augment_images",
    "extra_rank_column",
]

LOSSES = frozenset({"ce", "mse"})
RUN_KEYS = ("lr", "weight_decay", "momentum", "seed")


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


def lr_at(lr0, epoch: int, milestones=(), lr_decay: float = 0.1):
    """Learning rate during epoch `epoch` (1-based): `lr0 * lr_decay^(number of milestones < epoch)`.

    As `torch.optim.lr_scheduler.MultiStepLR` stepped once per epoch: with milestone 60 the rate
    drops from epoch 61 on (after 60 epochs). `lr0` may be a number or a tensor (one per member).
    """
    return lr0 * lr_decay ** sum(1 for m in milestones if epoch > m)


ROTATIONS = frozenset({"uniform", "multiples", "none"})


def augment_images(x: torch.Tensor, generator: torch.Generator, *, padding: int = 4, flip: bool = True,
                   rotation: str = "uniform", max_degrees: float = 15.0, rotation_step: float = 15.0) -> torch.Tensor:
    """The paper's training augmentation for a batch of images `(n, C, H, W)`: a random crop after
    zero-padding by `padding`, a random horizontal flip, and a random rotation.

    Parameters
    ----------
    rotation : "uniform": an angle uniform in [-max_degrees, max_degrees] (the authors' code,
        `RandomRotation(15)`); "multiples": `rotation_step * k` degrees with k uniform in {1, ..., 24}
        (a literal reading of the paper's text, l.1290); "none" (the authors' logged runs used none).
    max_degrees, rotation_step : degrees.

    Randomness comes from `generator` only, drawn on its device (a generator on the images' GPU
    avoids host-to-device copies per batch).
    """
    check_choice(rotation, "rotation", ROTATIONS)
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
    if rotation == "none" or (rotation == "uniform" and not max_degrees) or (rotation == "multiples" and not rotation_step):
        return x
    if rotation == "uniform":
        degrees = ((2 * torch.rand(n, **draw) - 1) * max_degrees).to(dev, x.dtype)
    else:
        degrees = (rotation_step * torch.randint(1, 25, (n,), **draw)).to(dev, x.dtype)
    return _rotate(x, torch.deg2rad(degrees))


def _rotate(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Rotate each image of `x` (n, C, H, W) by `theta` (n,) radians about its centre (zeros outside)."""
    cos, sin = torch.cos(theta), torch.sin(theta)
    zero = torch.zeros_like(cos)
    A = torch.stack([torch.stack([cos, -sin, zero], -1), torch.stack([sin, cos, zero], -1)], 1)
    grid = nn.functional.affine_grid(A, list(x.shape), align_corners=False)
    return nn.functional.grid_sample(x, grid, align_corners=False)


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
        for key in ("lr", "weight_decay", "momentum"):
            if not is_number(r[key]):
                raise ValueError(f"runs[{i}]: {key} must be a number, got {r[key]!r}")
        check_seed(r["seed"], f"runs[{i}]: seed")
        if not (r["lr"] > 0 and math.isfinite(r["lr"])):
            raise ValueError(f"runs[{i}]: lr must be a positive number, got {r['lr']}")
        if not r["weight_decay"] >= 0:
            raise ValueError(f"runs[{i}]: weight_decay must be non-negative, got {r['weight_decay']}")
        if not 0 <= r["momentum"] < 1:
            raise ValueError(f"runs[{i}]: momentum must be in [0, 1), got {r['momentum']}")
        out.append(r)
    return out


def _check_data(data: Dataset, batch_size: int):
    if not isinstance(data, Dataset):
        raise ValueError(f"data must be a lowrank.core.datasets.Dataset, got {type(data).__name__}")
    if data.y_train.min() < 0:
        raise ValueError("labels must be class indices 0..C-1 (got negative labels; binary ±1 data needs remapping)")
    if batch_size > data.x_train.shape[0]:
        raise ValueError(f"batch_size={batch_size} is larger than the training set ({data.x_train.shape[0]} samples)")


def _broadcast(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.reshape(-1, *([1] * (like.ndim - 1)))


@dataclass(frozen=True)
class TrainConfig:
    """The settings an ensemble's members share (each member's `lr`, `weight_decay`, `momentum` and
    `seed` are in its run dict).

    Parameters
    ----------
    batch_size : samples per step, B; the last incomplete batch of an epoch is dropped.
    epochs : passes over the training set.
    loss : "ce" (cross-entropy) or "mse" (mean squared error to one-hot targets, averaged over
        samples and classes).
    milestones, lr_decay : the learning rate is multiplied by `lr_decay` after each epoch in
        `milestones` (`lr_at`; the paper's text says 0.1 at l.1290, the authors' code uses 0.2).
    eps : rank threshold of the monitors (both normalisations are recorded).
    extra_eps : further thresholds of the Frobenius-normalised rank, recorded as columns
        `rank_frobenius@<eps>` (e.g. `rank_frobenius@0.01`) from the same singular values.
    eval_every : train / test loss and accuracy at epoch 0, every `eval_every` epochs and after the
        last (NaN in between); ranks, norms and distances after every epoch.
    eval_initial : whether epoch 0 (the initialisation) is evaluated; False leaves its losses and
        accuracies NaN. Evaluation only reads the networks: neither option changes the training.
    eval_batch : samples per member per evaluation chunk (default about 8192 / K).
    augment : `augment(x, generator)` transforms each member's training batch, or None.
    mixed_precision : training forward / backward in bfloat16 autocast; weights, optimiser, loss
        and every monitor stay in float32.
    checkpoint, checkpoint_every : a file the whole `EnsembleState` is written to atomically every
        `checkpoint_every` epochs; an existing file is resumed from (same runs and batch size).
    device : torch device (default `lowrank.core.device.get_device()`).
    progress, desc : a tqdm bar and its label.
    run_offset : added to the `run` column (several ensembles in one table).
    extra : constant columns added to every row (e.g. the model's name).
    """

    # Every field is part of a checkpoint's identity (`lowrank.core.checkpoint.identity`) unless its metadata says
    # `identity: False`: the fields that cannot change the table (where and how often the state is
    # saved, the device, the progress bar, the evaluation's chunk size). `epochs` is checked on its
    # own: a checkpoint may be resumed to train longer, never to return more epochs than asked.
    batch_size: int
    epochs: int = field(metadata={"identity": False})
    loss: str = "ce"
    milestones: tuple = ()
    lr_decay: float = 0.1
    eps: float = 1e-3
    extra_eps: tuple = ()
    eval_every: int = 1
    eval_initial: bool = True
    eval_batch: int | None = field(default=None, metadata={"identity": False})
    augment: Callable | None = None
    mixed_precision: bool = False
    checkpoint: str | Path | None = field(default=None, metadata={"identity": False})
    checkpoint_every: int = field(default=1, metadata={"identity": False})
    device: object = field(default=None, metadata={"identity": False})
    progress: bool = field(default=True, metadata={"identity": False})
    desc: str | None = field(default=None, metadata={"identity": False})
    run_offset: int = 0
    extra: dict | None = None

    def __post_init__(self):
        for name in ("batch_size", "epochs", "eval_every", "checkpoint_every"):
            _check_positive_int(getattr(self, name), name)
        if self.eval_batch is not None:
            _check_positive_int(self.eval_batch, "eval_batch")
        check_choice(self.loss, "loss", LOSSES)
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps}")
        if not self.lr_decay > 0:
            raise ValueError(f"lr_decay must be positive, got {self.lr_decay}")
        object.__setattr__(self, "milestones", tuple(self.milestones))
        object.__setattr__(self, "extra_eps", tuple(float(e) for e in self.extra_eps))
        if not all(0 < e < 1 for e in self.extra_eps):
            raise ValueError(f"extra_eps must be thresholds in (0, 1), got {self.extra_eps}")


@dataclass
class EnsembleState:
    """Everything that evolves while K members train; its `payload()` is the checkpoint.

    params, buffers, mom_buf : stacked `(K, ...)` parameters, BatchNorm buffers, momentum buffers.
    batch_generators, augment_generators : each member's batch-order and augmentation generators.
    alive : members still training; diverged : `{run: {epoch, reason, ...}}` of those stopped.
    prev : `{layer: (matrices, Frobenius norms)}` of the last monitor, for `dist`.
    rows : the monitor table so far; epoch : epochs done.
    """

    params: dict
    buffers: dict
    mom_buf: dict
    batch_generators: list
    augment_generators: list
    alive: np.ndarray
    diverged: dict = field(default_factory=dict)
    prev: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)
    epoch: int = 0

    TENSORS = ("params", "buffers", "mom_buf")

    @classmethod
    def start(cls, models, runs, dev) -> "EnsembleState":
        params, buffers = stack_module_state(models)
        params = {k: v.detach().clone() for k, v in params.items()}
        return cls(params, {k: v.clone() for k, v in buffers.items()}, {k: torch.zeros_like(v) for k, v in params.items()},
                   [torch.Generator().manual_seed(10_007 * int(r["seed"]) + 17) for r in runs],
                   # each member's augmentation draws from its own generator on the data's device
                   [torch.Generator(device=dev).manual_seed(10_007 * int(r["seed"]) + 29) for r in runs],
                   np.ones(len(runs), dtype=bool))

    def payload(self) -> dict:
        return {**{g: {k: v.detach().cpu() for k, v in getattr(self, g).items()} for g in self.TENSORS},
                "generators": [g.get_state() for g in self.batch_generators],
                "augment_generators": [g.get_state() for g in self.augment_generators],
                "torch_rng": torch.get_rng_state(), "alive": self.alive.copy(), "diverged": dict(self.diverged),
                "prev": {k: tuple(t.cpu() for t in v) for k, v in self.prev.items()}, "rows": list(self.rows),
                "epoch": self.epoch}

    def restore(self, saved: dict, dev):
        for group in self.TENSORS:
            for k, v in getattr(self, group).items():
                v.copy_(saved[group][k])  # in place: the step's tensor lists point at these
        for g, st in zip(self.batch_generators + self.augment_generators, saved["generators"] + saved["augment_generators"]):
            g.set_state(st)
        torch.set_rng_state(saved["torch_rng"])  # dropout draws from the global generator
        self.alive[:] = np.asarray(saved["alive"])  # a tensor in the file (`checkpoint._plain`)
        self.diverged.update(saved["diverged"])
        self.prev.update({k: tuple(t.to(dev) for t in v) for k, v in saved["prev"].items()})
        self.rows.extend(saved["rows"])
        self.epoch = saved["epoch"]


class _Forward:
    """The members' forward passes from stacked parameters: `train(p, b, x)` on (K, n, ...) batches,
    `eval(p, b, x)` on a batch shared by all members; and their per-member gradients."""

    def __init__(self, base: nn.Module, has_dropout: bool, loss: str, dev, mixed_precision: bool):
        self.base, self.loss, self.dev, self.mixed_precision = base, loss, dev, mixed_precision
        if hasattr(base, "forward_stacked"):  # batched products, far less dispatch than vmap (nets.mlp)
            self.train = lambda p, b, x: base.forward_stacked(p, b, x)
            self.eval = lambda p, b, x: base.forward_stacked(p, b, x, shared=True)
            self.layout = base.stacked_layout  # leaves shaped as the products use them: no reshape nodes
        else:
            def forward(p, b, x):
                return functional_call(base, (p, b), (x,))

            self.train = vmap(forward, in_dims=(0, 0, 0), randomness="different" if has_dropout else "error")
            self.eval = vmap(forward, in_dims=(0, 0, None))
            self.layout = None

    def gradients(self, params, buffers, x, y):
        """Each member's gradient of its own batch loss (shaped as `params`), and the losses (K,)."""
        # members are independent, so the gradient of the sum of their losses is each member's own
        # gradient; reverse-mode autograd through the batched forward is faster than vmap(grad(.)).
        names = list(params)
        shaped = params if self.layout is None else self.layout(params)
        leaves = {k: v.detach().requires_grad_(True) for k, v in shaped.items()}
        with torch.autocast(self.dev.type, dtype=torch.bfloat16, enabled=self.mixed_precision):
            logits = self.train(leaves, buffers, x)
        losses = member_losses(logits.float(), y, self.loss)
        grads = torch.autograd.grad(losses.sum(), [leaves[k] for k in names], allow_unused=True)
        return [torch.zeros_like(params[k]) if g is None else g.reshape(params[k].shape) for k, g in zip(names, grads)], \
            losses.detach()


def _evaluate(fwd: _Forward, state: EnsembleState, x, y, chunk: int):
    """Mean loss and accuracy of each member on `(x, y)` in evaluation mode, as numpy arrays (K,)."""
    K = len(state.alive)
    fwd.base.eval()
    tot_loss = torch.zeros(K, device=x.device, dtype=torch.float64)
    correct = torch.zeros(K, device=x.device, dtype=torch.float64)
    with torch.no_grad():
        for i in range(0, x.shape[0], chunk):
            xb, yb = x[i:i + chunk], y[i:i + chunk]
            out = fwd.eval(state.params, state.buffers, xb)  # K x n x C
            tot_loss += member_losses(out, yb.expand(K, -1), fwd.loss).double() * xb.shape[0]
            correct += (out.argmax(-1) == yb).double().sum(-1)
    return (tot_loss / x.shape[0]).cpu().numpy(), (correct / x.shape[0]).cpu().numpy()


def extra_rank_column(eps: float) -> str:
    """The monitor column of the Frobenius-normalised rank at a further threshold (`TrainConfig.extra_eps`)."""
    return f"rank_frobenius@{eps:g}"


def _weight_stats(base: nn.Module, state: EnsembleState, eps: float, extra_eps=()) -> list[dict]:
    """Per weight matrix (`base.weight_matrices`), numpy arrays over the K members: the spectral
    record (`spectrum_stats`), the Frobenius-normalised ranks at `extra_eps`, and the distance to the
    last call's matrices."""
    K = len(state.alive)
    weights = base.weight_matrices(state.params)
    dtype = monitor_dtype(min((eps, *extra_eps)))
    mats = [torch.nan_to_num(w.matrix, nan=0.0, posinf=0.0, neginf=0.0).to(dtype) for w in weights]
    out = []
    for w, M, s in zip(weights, mats, singular_values_by_shape(mats)):
        fro = torch.linalg.vector_norm(M.reshape(K, -1), dim=-1, dtype=torch.float64)
        st = spectrum_stats(s, eps, fro=fro)
        st |= {extra_rank_column(e): rank_from_singular_values(s.double(), e, "frobenius", fro=fro) for e in extra_eps}
        dist = dist_rel = np.full(K, math.nan)
        if w.name in state.prev:
            before, pfro = state.prev[w.name]
            d = torch.linalg.vector_norm((M - before).reshape(K, -1), dim=-1, dtype=torch.float64)
            dist = d.cpu().numpy()
            dist_rel = torch.where(pfro > 0, d / torch.where(pfro > 0, pfro, 1.0), math.nan).cpu().numpy()
        state.prev[w.name] = (M, fro)  # nan_to_num made M a copy
        out.append({k: v.cpu().numpy() for k, v in st.items()} | {"dist": dist, "dist_rel": dist_rel,
                                                                   "shape": f"{M.shape[1]}x{M.shape[2]}"})
    return out


MONITOR_COLUMNS = ("rank_spectral", "rank_frobenius", "stable_rank", "weight_norm", "spectral_norm", "dist", "dist_rel")


def _stop(state: EnsembleState, runs, cfg: TrainConfig, k: int, epoch: int, why: str):
    state.alive[k] = False
    run = cfg.run_offset + int(k)
    state.diverged[run] = {"epoch": epoch, "reason": why, **{key: runs[k][key] for key in RUN_KEYS}}
    warnings.warn(f"run {run} (lr={runs[k]['lr']}, weight_decay={runs[k]['weight_decay']}, "
                  f"batch_size={cfg.batch_size}) diverged in epoch {epoch}: {why}. It is stopped; the "
                  f"{epoch if epoch else 0} epoch(s) measured before are kept.", RuntimeWarning, stacklevel=4)


def _evaluation_due(cfg: TrainConfig, epoch: int) -> bool:
    """Whether the monitor evaluates losses and accuracies after `epoch` (`TrainConfig.eval_every`)."""
    return (epoch % cfg.eval_every == 0 and (epoch > 0 or cfg.eval_initial)) or epoch == cfg.epochs


EVALUATION_COLUMNS = ("train_loss", "train_acc", "test_loss", "test_acc")


def _resumed_rows(cfg: TrainConfig, state: EnsembleState) -> None:
    """A checkpoint resumed to train longer: its last epoch was evaluated as the end of the shorter
    run; an uninterrupted run of `cfg.epochs` does not evaluate it unless due, so neither does this one."""
    if state.epoch < cfg.epochs and not _evaluation_due(cfg, state.epoch):
        for row in state.rows:
            if row["epoch"] == state.epoch:
                row.update({c: math.nan for c in EVALUATION_COLUMNS})


def _monitor(ctx: dict, state: EnsembleState, epoch: int):
    """Evaluate (when due), stop members whose loss or weights are not finite, append the rows."""
    cfg, runs, K, seconds = ctx["cfg"], ctx["runs"], len(state.alive), ctx["seconds"]
    evaluated = _evaluation_due(cfg, epoch)
    tr_loss = tr_acc = te_loss = te_acc = np.full(K, math.nan)
    if evaluated:
        t0 = time.perf_counter()
        tr_loss, tr_acc = _evaluate(ctx["fwd"], state, *ctx["train_xy"], ctx["chunk"])
        te_loss, te_acc = _evaluate(ctx["fwd"], state, *ctx["test_xy"], ctx["chunk"])
        seconds["evaluate"] += time.perf_counter() - t0
    specs = ctx["specs"]
    finite = torch.stack([torch.isfinite(state.params[n].reshape(K, -1)).all(1) for n, _ in specs]).all(0)
    for k in np.flatnonzero(state.alive & (~finite.cpu().numpy() | (evaluated & ~np.isfinite(tr_loss)))):
        _stop(state, runs, cfg, k, epoch, f"train loss {tr_loss[k]:.3g} or non-finite weights after the epoch")
    t0 = time.perf_counter()
    stats = _weight_stats(ctx["fwd"].base, state, cfg.eps, cfg.extra_eps)
    seconds["track_ranks"] += time.perf_counter() - t0
    base_row = {"batch_size": cfg.batch_size, "loss": cfg.loss, **(cfg.extra or {})}
    for li, ((name, classifier), st) in enumerate(zip(specs, stats)):
        for k in np.flatnonzero(state.alive):
            state.rows.append({"run": cfg.run_offset + int(k), **ctx["run_cols"][k], **base_row, "epoch": epoch,
                               "lr": lr_at(float(runs[k]["lr"]), epoch, cfg.milestones, cfg.lr_decay),  # exact: not the float32 step's rate
                               "layer": name, "layer_index": li, "classifier": classifier,
                               "shape": st["shape"], "rank_spectral": int(st["rank_spectral"][k]),
                               "rank_frobenius": int(st["rank_frobenius"][k]),
                               **{c: float(st[c][k]) for c in MONITOR_COLUMNS[2:]},
                               **{extra_rank_column(e): int(st[extra_rank_column(e)][k]) for e in cfg.extra_eps},
                               "train_loss": float(tr_loss[k]), "train_acc": float(tr_acc[k]),
                               "test_loss": float(te_loss[k]), "test_acc": float(te_acc[k])})


def _sgd_epoch(ctx: dict, state: EnsembleState, lr: torch.Tensor):
    """One epoch of PyTorch's SGD for every member still alive: `buf = m buf + (g + wd p); p -= lr buf`."""
    cfg, fwd, (x_tr, y_tr) = ctx["cfg"], ctx["fwd"], ctx["train_xy"]
    K, B, n_train = len(state.alive), cfg.batch_size, x_tr.shape[0]
    names = list(state.params)
    plist, bufs = [state.params[k] for k in names], [state.mom_buf[k] for k in names]
    wd_b = [_broadcast(ctx["wd"], p) for p in plist]
    mom_b = [_broadcast(ctx["mom"], p) for p in plist]
    perms = torch.stack([torch.randperm(n_train, generator=g) for g in state.batch_generators]).to(x_tr.device)
    alive_t = torch.as_tensor(state.alive, device=x_tr.device)
    neg_lr = [_broadcast(-(lr * alive_t), p) for p in plist]  # stopped runs take no steps
    finite = torch.ones(K, dtype=torch.bool, device=x_tr.device)
    fwd.base.train()
    for s in range(n_train // B):
        idx = perms[:, s * B:(s + 1) * B]
        xb, yb = x_tr[idx], y_tr[idx]
        if cfg.augment is not None:
            xb = torch.stack([cfg.augment(xb[k], state.augment_generators[k]) for k in range(K)])
        g, losses = fwd.gradients(state.params, state.buffers, xb, yb)
        # checked once per epoch, not per step (a per-step check would wait for the GPU); members
        # never mix, so a diverging one harms no other
        finite &= torch.isfinite(losses)
        with torch.no_grad():
            torch._foreach_mul_(bufs, mom_b)
            torch._foreach_add_(bufs, g)
            torch._foreach_addcmul_(bufs, plist, wd_b)
            torch._foreach_addcmul_(plist, bufs, neg_lr)
    return finite.cpu().numpy()


def _build_members(model_fn, runs, dev):
    """The K models (member k built after `torch.manual_seed(seed_k)`), a meta-device copy that
    carries the architecture, and its `weight_specs()`."""
    models = []
    for r in runs:
        torch.manual_seed(int(r["seed"]))
        models.append(model_fn().to(dev))
    if not hasattr(models[0], "weight_specs"):
        raise ValueError(f"model_fn() returned a {type(models[0]).__name__}, which has no weight_specs(): "
                         "train_ensemble takes the networks of lowrank.core.nets.mlp / conv / vit")
    return models, copy.deepcopy(models[0]).to("meta"), models[0].weight_specs()


def train_ensemble(model_fn: Callable[[], nn.Module], data: Dataset, runs, config: TrainConfig | None = None,
                   **options) -> pd.DataFrame:
    """Train `len(runs)` models `model_fn()` at once; return the tidy monitor table.

    Parameters
    ----------
    model_fn : builds one network of `lowrank.core.nets` (with `weight_specs()`); called once per run
        after `torch.manual_seed(seed)`, so the seed fixes the initialisation (and the batch order).
    data : a `lowrank.core.datasets.Dataset` with class-index labels.
    runs : dicts with `lr` and optionally `weight_decay` (PyTorch's coupled decay: the paper's
        `lambda ||W||^2` is `weight_decay / 2`), `momentum`, `seed` (default: the index), plus any
        other keys (kept as columns).
    config : a `TrainConfig`; or its fields as keyword `options` (`batch_size=..., epochs=...`).

    Returns
    -------
    One row per run, epoch (0 = initialisation) and weight matrix; `attrs["diverged"]`, `attrs["eps"]`,
    `attrs["seconds"]` (time in training steps, evaluation, rank tracking).
    """
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(TrainConfig)})
    if unknown:
        raise ValueError(f"unknown training options {unknown}; TrainConfig takes "
                         f"{[f.name for f in dataclasses.fields(TrainConfig)]}")
    cfg = dataclasses.replace(config, **options) if config is not None else TrainConfig(**options)
    runs = _normalise_runs(runs)
    _check_data(data, cfg.batch_size)
    checkpointing.check_checkpoint_path(cfg.checkpoint)
    from lowrank.core.device import get_device

    dev = torch.device(cfg.device) if cfg.device is not None else get_device()
    models, base, specs = _build_members(model_fn, runs, dev)
    has_dropout = any(isinstance(m, nn.Dropout) and m.p > 0 for m in models[0].modules())
    state = EnsembleState.start(models, runs, dev)
    K = len(runs)
    ctx = {"cfg": cfg, "runs": runs, "specs": specs, "fwd": _Forward(base, has_dropout, cfg.loss, dev, cfg.mixed_precision),
           "train_xy": (data.x_train.to(dev), data.y_train.to(dev)), "test_xy": (data.x_test.to(dev), data.y_test.to(dev)),
           # evaluation chunks of about 8192 member-samples: large enough for efficient products, small
           # enough that the activations stay in cache (K=16 on 1437 samples at once was 1.8x slower)
           "chunk": cfg.eval_batch or max(256, 8192 // K),
           "wd": torch.tensor([float(r["weight_decay"]) for r in runs], device=dev),
           "mom": torch.tensor([float(r["momentum"]) for r in runs], device=dev),
           "run_cols": [{k: v for k, v in r.items() if k != "lr"} | {"lr0": float(r["lr"])} for r in runs],
           "seconds": {"train": 0.0, "evaluate": 0.0, "track_ranks": 0.0}}
    lr0 = torch.tensor([float(r["lr"]) for r in runs], device=dev)
    identity = checkpointing.identity(runs, cfg, base, data) if cfg.checkpoint is not None else None
    if checkpointing.resume(cfg, identity, state, dev):
        _resumed_rows(cfg, state)
    else:
        _monitor(ctx, state, 0)
    bar = None
    if cfg.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.epochs, initial=state.epoch, desc=cfg.desc or f"B={cfg.batch_size}, {K} run(s)", leave=False)
    for epoch in range(state.epoch + 1, cfg.epochs + 1):
        if not state.alive.any():
            break
        lr = lr_at(lr0, epoch, cfg.milestones, cfg.lr_decay)
        t0 = time.perf_counter()
        finite = _sgd_epoch(ctx, state, lr)
        for k in np.flatnonzero(state.alive & ~finite):
            _stop(state, runs, cfg, k, epoch, "non-finite training loss during the epoch")
        ctx["seconds"]["train"] += time.perf_counter() - t0
        _monitor(ctx, state, epoch)
        state.epoch = epoch
        if cfg.checkpoint is not None and (epoch % cfg.checkpoint_every == 0 or epoch == cfg.epochs):
            checkpointing.save(cfg, identity, state)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    table = pd.DataFrame(state.rows)
    table.attrs.update(diverged=state.diverged, eps=cfg.eps, seconds=ctx["seconds"])
    return table


STATUS_COLUMNS = ("status", "status_epoch", "status_reason")


def with_status(table: pd.DataFrame) -> pd.DataFrame:
    """`table` with each run's outcome in its rows, so that it survives a CSV (a sweep's
    `results.csv`, its `collected.csv`), where `attrs` do not: `status` is "diverged" (stopped at
    `status_epoch`, why in `status_reason`; from `attrs["diverged"]`), "collapsed" (a weight matrix
    is exactly zero at the run's last epoch: weight decay took it to the origin; its rank-like
    numbers mean nothing there) or "ok"."""
    out = table.copy()
    out.attrs = dict(table.attrs)
    status = pd.Series("ok", index=out.index, dtype=object)
    epoch = pd.Series(np.nan, index=out.index)
    reason = pd.Series("", index=out.index, dtype=object)
    if len(out) and {"run", "epoch", "spectral_norm"} <= set(out.columns):
        last = out.groupby("run")["epoch"].transform("max") == out["epoch"]
        for run in out.loc[last & (out["spectral_norm"] == 0), "run"].unique():
            rows = out["run"] == run
            status[rows], epoch[rows] = "collapsed", out.loc[rows, "epoch"].max()
            reason[rows] = "a weight matrix is zero at the last epoch"
    for run, info in (table.attrs.get("diverged") or {}).items():
        rows = out["run"] == run if "run" in out.columns else pd.Series(False, index=out.index)
        status[rows], epoch[rows], reason[rows] = "diverged", info.get("epoch"), info.get("reason", "")
    out["status"], out["status_epoch"], out["status_reason"] = status, epoch, reason
    return out


def diverged_runs(table: pd.DataFrame) -> dict:
    """`{run: {"epoch", "reason"}}` of the runs that diverged: `attrs["diverged"]` of a table trained
    here, or the `status` column (`with_status`) of one read from a CSV."""
    found = {int(k): dict(v) for k, v in (table.attrs.get("diverged") or {}).items()}
    if "status" in table.columns and "run" in table.columns:
        for run, rows in table[table["status"] == "diverged"].groupby("run"):
            found.setdefault(int(run) if isinstance(run, (int, np.integer)) else run,
                             {"epoch": rows["status_epoch"].iloc[0], "reason": rows["status_reason"].iloc[0]})
    return found


class AllDiverged(ValueError):
    """Every run of a table diverged: there is nothing to measure (a page says so instead of drawing nothing)."""


def check_some_run_finite(table: pd.DataFrame, runs: int | None = None) -> None:
    """AllDiverged when every run of `table` (`runs` of them, by default its `run` values) diverged
    (`diverged_runs`), naming how, where and at which learning rates."""
    diverged = diverged_runs(table)
    total = runs if runs is not None else (table["run"].nunique() if "run" in table.columns else 0)
    if not diverged or len(diverged) < total:
        return
    first = min(diverged.values(), key=lambda d: (d.get("epoch") is None, d.get("epoch") or 0))
    rates = sorted({d["lr"] for d in diverged.values() if d.get("lr") is not None})
    shown = ", ".join(f"{r:g}" for r in rates[:5]) + (", ..." if len(rates) > 5 else "")
    raise AllDiverged(f"every run diverged ({len(diverged)} of {total}; the first in epoch {first.get('epoch')}: "
                      f"{first.get('reason', 'non-finite values')}){f' at learning rates {shown}' if rates else ''}: "
                      f"there is nothing to measure; lower the learning rate")


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


@dataclass(frozen=True)
class PointConfig:
    """One training run named by plain values: a sweep point (`lowrank.book.sweeps`), as `train_point`
    takes it. Its fields are the sweep's parameters (a sweep spec's `base`, `grid` and `points`).

    Parameters
    ----------
    model : the network by its paper name (e.g. "MLP-BN-10-100", "ResNet-18"; `lowrank.core.nets.zoo`).
    dataset : "digits", "mnist1d", "mnist" or "cifar10". data_root : where mnist and cifar10 are read from.
    batch_size, epochs, milestones, lr_decay, eps, loss, eval_every, mixed_precision : as `TrainConfig`.
    lr, weight_decay, momentum, seed : the run's own settings (the members of an ensemble may differ
        in these, `ENSEMBLE_KEYS`).
    augment : random crops and flips of image batches (`augment_images`), with `rotation`.
    cnn_width : width multiplier of the paper's CNNs; vit_dim, vit_depth : of the ViT.
    checkpoint, checkpoint_every : a file the run's state is saved to every `checkpoint_every` epochs,
        and resumed from (empty: none).
    """

    model: str
    dataset: str
    batch_size: int
    lr: float
    epochs: int
    weight_decay: float = 0.0
    momentum: float = 0.0
    milestones: tuple = ()
    lr_decay: float = 0.1
    eps: float = 1e-3
    loss: str = "ce"
    augment: bool = False
    rotation: str = "uniform"
    seed: int = 0
    data_root: str = DEFAULT_DATA_ROOT
    cnn_width: float = 1.0
    vit_dim: int = 512
    vit_depth: int = 6
    checkpoint: str = ""
    checkpoint_every: int = 10
    eval_every: int = 1
    mixed_precision: bool = False

    def member(self) -> dict:
        """The settings an ensemble's members may differ in (`ENSEMBLE_KEYS`), as a run dict."""
        return {k: getattr(self, k) for k in ENSEMBLE_KEYS}

    def shared(self) -> dict:
        """Every other setting: those the members of one ensemble must share."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ENSEMBLE_KEYS}


def train_point(config: PointConfig) -> pd.DataFrame:
    """One training run (a sweep point, see `lowrank.book.sweeps`): the model by its paper name, the
    data set by name (`PointConfig`). Returns the tidy monitor table. With `config.checkpoint` (a file
    path) a killed long run resumes where its last checkpoint left it."""
    return train_points([config])[0]


# the run settings an ensemble's members may differ in (everything else is shared)
ENSEMBLE_KEYS = ("lr", "weight_decay", "momentum", "seed")

# The rules a sweep checks on `train_point`'s arguments before any run starts (JSON Schema keywords,
# as a notebook's parameter declarations state them; read by `lowrank.book.sweeps`); the function
# checks them again.
PARAMETER_RULES = {"train_point": {
    "model": {"format": "network"}, "dataset": {"enum": ["digits", "mnist1d", "mnist", "cifar10"]},
    "batch_size": {"minimum": 1}, "lr": {"exclusiveMinimum": 0}, "epochs": {"minimum": 1},
    "weight_decay": {"minimum": 0}, "momentum": {"minimum": 0, "exclusiveMaximum": 1},
    "milestones": {"items": {"type": "integer", "minimum": 1}}, "lr_decay": {"exclusiveMinimum": 0},
    "eps": {"exclusiveMinimum": 0}, "loss": {"enum": sorted(LOSSES)}, "rotation": {"enum": sorted(ROTATIONS)},
    "seed": {"minimum": 0}, "cnn_width": {"exclusiveMinimum": 0}, "vit_dim": {"minimum": 1}, "vit_depth": {"minimum": 1},
    "checkpoint_every": {"minimum": 1}, "eval_every": {"minimum": 1},
}}


def train_points(points: list) -> list[pd.DataFrame]:
    """Several `train_point` runs that differ only in `ENSEMBLE_KEYS`, trained at once as one ensemble
    (a sweep with `ensemble: true`). `points` are `PointConfig`s or dicts of their fields. Returns one
    table per point, in order, each as `train_point` would return it (`run` 0). A checkpoint file is per
    ensemble: its name gets the members' hash."""
    from lowrank.core.datasets import load
    from lowrank.core.nets import zoo

    if not points:
        raise ValueError("points is empty")
    configs = []
    for i, p in enumerate(points):
        try:
            configs.append(p if isinstance(p, PointConfig) else PointConfig(**p))
        except TypeError as err:
            raise ValueError(f"points[{i}]: {err}") from None
    shared = configs[0].shared()
    for i, c in enumerate(configs[1:], 1):
        differ = sorted(k for k, v in c.shared().items() if v != shared[k])
        if differ:
            raise ValueError(f"points[{i}] differs from points[0] in {differ}; an ensemble's members may differ "
                             f"only in {list(ENSEMBLE_KEYS)}")
    members = [c.member() for c in configs]
    checkpoint = shared["checkpoint"] or None
    if checkpoint and len(configs) > 1:
        tag = digest(json.dumps(members, sort_keys=True))
        checkpoint = str(Path(checkpoint).with_name(f"{Path(checkpoint).stem}.{tag}{Path(checkpoint).suffix}"))
    name = shared["dataset"]
    data = load(name, root=shared["data_root"] or None) if name in ("mnist", "cifar10") else load(name)
    make, data = zoo.for_data(shared["model"], data, cnn_width=shared["cnn_width"], vit_dim=shared["vit_dim"],
                              vit_depth=shared["vit_depth"])
    augmenter = functools.partial(augment_images, rotation=shared["rotation"]) if shared["augment"] else None
    table = train_ensemble(make, data, members, batch_size=shared["batch_size"], epochs=shared["epochs"],
                           milestones=list(shared["milestones"]), lr_decay=shared["lr_decay"], eps=shared["eps"],
                           loss=shared["loss"], augment=augmenter, progress=False, extra={"model": shared["model"]},
                           checkpoint=checkpoint, checkpoint_every=shared["checkpoint_every"],
                           eval_every=shared["eval_every"], mixed_precision=shared["mixed_precision"])
    out = []
    for k in range(len(configs)):
        one = table[table["run"] == k].reset_index(drop=True).assign(run=0)
        one.attrs = {**table.attrs, "diverged": {0: v for r, v in table.attrs["diverged"].items() if r == k}}
        out.append(one)
    return out
