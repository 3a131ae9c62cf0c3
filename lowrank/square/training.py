"""Training `rho * f_V` (`lowrank.core.nets.normalized`) with the square loss and weight decay on rho,
as in the square-loss paper (Xu et al. 2023):

    L(rho, V) = (1/N) sum_n || rho f_V(x_n) - t_n ||^2 + lambda rho^2,

with `t_n = y_n` (±1) for a scalar output and `t_n = e~_{y_n}` (1 at the class, -1/(C-1) elsewhere)
for C outputs. Only rho enters the regulariser (the paper's Eq. 1 and its experiments); the `V_k`
are kept at unit norm by the parametrisation (and, with `project=True`, `v_k` is put back on the
unit sphere after every step, the Lagrange-multiplier model, so that the step size does not decay).

`train_square` runs plain (full-batch) gradient descent or minibatch SGD with small steps and logs,
once per `log_every` epochs, one row of a tidy table: rho, the margin statistics (mu, M, sigma^2),
the predictions `rho_eq = mu / (M + lambda)` and the gap `(sigma^2 + lambda) / (mu^2 + sigma^2 +
lambda)`, the loss and Lemma 4's right-hand side, train and test error and the neural-collapse
metrics of the last-layer features.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import torch

from lowrank.square import collapse
from lowrank.core import spectral
from lowrank.core import datasets
from lowrank.core.datasets import Dataset
from lowrank.core.device import get_device

__all__ = ["TrainingDiverged", "SquareRun", "prepare", "load_task", "train_targets", "train_square"]


class TrainingDiverged(FloatingPointError):
    """The loss or rho became NaN or infinite; `history` holds the rows logged until then."""

    def __init__(self, message, history=None):
        super().__init__(message)
        self.history = history


@dataclass
class SquareRun:
    """The result of `train_square`."""

    history: pd.DataFrame  # one row per logged epoch
    layers: pd.DataFrame  # one row per logged epoch and layer (empty unless track_layers)
    margins: pd.DataFrame  # one row per sample and epoch in margin_epochs (f_bar_n of f_V)
    model: torch.nn.Module
    config: dict = field(default_factory=dict)
    stopped: str | None = None  # why training stopped early (on_nan="stop"), else None

    @property
    def final(self) -> pd.Series:
        return self.history.iloc[-1]


def prepare(ds: Dataset, shape=None, unit_ball: bool = True, center: bool = False) -> Dataset:
    """Reshape the inputs to `shape` (e.g. `(1, 8, 8)` for digits into a CNN), optionally subtract the
    training mean (`center`), and with `unit_ball` divide all inputs by the largest training norm so
    that `||x_n|| <= 1` (the paper's assumption)."""
    x_tr, x_te = ds.x_train, ds.x_test
    if center:
        mean = x_tr.mean(0, keepdim=True)
        x_tr, x_te = x_tr - mean, x_te - mean
    if shape is not None:
        shape = tuple(shape)
        x_tr, x_te = x_tr.reshape(-1, *shape), x_te.reshape(-1, *shape)
    if unit_ball:
        scale = x_tr.flatten(1).norm(dim=1).max()
        if not scale > 0:
            raise ValueError("all training inputs are zero")
        x_tr, x_te = x_tr / scale, x_te / scale
    return Dataset(x_tr, ds.y_train, x_te, ds.y_test, ds.num_classes, ds.name)


def load_task(dataset: str, classes, data_root: str = "", max_train: int | None = None,
              max_test: int | None = None, shape=None, unit_ball: bool = True, seed: int = 0) -> Dataset:
    """A classification task of the square-loss notebooks, inputs in the unit ball.

    Two classes give ±1 labels (`datasets.binary_subset`: `classes[0] -> -1`, `classes[1] -> +1`);
    more give labels 0..k-1 in the order of `classes`. `max_train` / `max_test` keep the first
    samples; `shape` reshapes the inputs (e.g. `(1, 8, 8)` for digits into a CNN). "digits" and
    "mnist1d" are generated locally (`seed` sets the digits split) and centred by the training mean,
    not standardised per feature (per-feature scaling blows up rare pixels, and then dividing by the
    largest norm leaves most inputs far inside the unit ball); "mnist" and "cifar10" are read from
    `data_root` with their usual per-channel normalisation.
    """
    if dataset in ("mnist", "cifar10"):
        ds, center = datasets.load(dataset, root=data_root or None), False
    elif dataset == "digits":
        ds, center = datasets.digits(seed=seed, standardize=False), True
    else:
        ds, center = datasets.load(dataset, standardize=False), True
    classes = [int(c) for c in classes]
    if len(classes) == 2:
        ds = datasets.binary_subset(ds, tuple(classes), max_train, max_test)
    else:
        if len(set(classes)) != len(classes) or len(classes) < 2 or not all(0 <= c < ds.num_classes for c in classes):
            raise ValueError(f"classes must be distinct labels in [0, {ds.num_classes}), got {classes}")
        remap = torch.full((ds.num_classes,), -1, dtype=torch.int64)
        remap[torch.tensor(classes)] = torch.arange(len(classes))

        def pick(x, y, cap):
            keep = torch.nonzero(remap[y] >= 0).flatten()[:cap]
            return x[keep], remap[y[keep]]

        x_tr, y_tr = pick(ds.x_train, ds.y_train, max_train)
        x_te, y_te = pick(ds.x_test, ds.y_test, max_test)
        ds = Dataset(x_tr, y_tr, x_te, y_te, len(classes), f"{ds.name}{classes}")
    return prepare(ds, shape=shape, unit_ball=unit_ball, center=center)


def _class_indices(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    if num_classes == 2 and bool(((y == 1) | (y == -1)).all()):
        return (y + 1) // 2
    if y.numel() and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}) for a {num_classes}-output network")
    return y


def train_targets(y: torch.Tensor, num_outputs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(targets, labels)`: for one output, ±1 targets and the ±1 labels; for C outputs the centred
    one-hot targets `e~_c` and labels 0..C-1 (±1 labels are mapped to 0/1 when C = 2)."""
    y = torch.as_tensor(y).reshape(-1).to(torch.int64)
    if num_outputs == 1:
        if not bool(((y == 1) | (y == -1)).all()):
            raise ValueError("a network with one output needs labels in {-1, +1} (see datasets.binary_subset)")
        return y.to(torch.float64), y
    idx = _class_indices(y, num_outputs)
    return collapse.centred_one_hot(idx, num_outputs), idx


def _lr_at(step: int, total: int, lr: float, schedule: str, min_lr: float) -> float:
    if schedule == "constant":
        return lr
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(step, total) / max(total, 1)))


@torch.no_grad()
def _forward_all(model, x, batch: int):
    outs, feats = [], []
    for i in range(0, x.shape[0], batch):
        o, h = model.outputs_and_features(x[i:i + batch])
        outs.append(o)
        feats.append(h)
    return torch.cat(outs), torch.cat(feats)


def _errors(out: torch.Tensor, labels: torch.Tensor) -> float:
    if out.ndim == 1:
        pred = torch.where(out > 0, 1, -1)
    else:
        pred = out.argmax(1)
    return float((pred != labels).to(torch.float64).mean())


def train_square(model, ds: Dataset, *, epochs: int, lr: float, weight_decay: float, batch_size: int | None = None,
                 rho_lr: float | None = None, momentum: float = 0.0, schedule: str = "constant",
                 min_lr: float = 0.0, log_every: int = 1, nc: bool = True, track_layers: bool = False,
                 rank_eps: float = 1e-3, margin_epochs=(), project: bool = True, seed: int = 0, device=None,
                 dtype=torch.float32, progress: bool = True, on_nan: str = "raise", eval_batch_size: int = 4096,
                 desc: str | None = None) -> SquareRun:
    """Train `model` (a `NormalizedNet`) on `ds` with the square loss and weight decay `lambda` on rho.

    `batch_size=None` is full-batch gradient descent (one step per epoch). `rho_lr` (default `lr`)
    is rho's own step size: a larger one rescales time in rho's gradient flow only (the critical
    points, Eq. 7 and Lemma 4 with rho_dot measured in rho's time are unchanged) and lets rho keep up
    with the small outputs of the normalised network. `schedule` is "constant" or "cosine" (annealed
    per step from `lr` to `min_lr`). Rows are logged at epoch 0 (the initialisation), every
    `log_every` epochs, at every epoch of `margin_epochs` and at the last epoch. The margins and their
    statistics are those of `f_V` (with frozen scales g != 1, of the network that includes them; the
    paper's product norm is then `product_norm = rho prod_k g_k`). `rho_dot_step` is the measured
    `(rho_{t+1} - rho_t) / rho_lr` of the step that follows the logged state (the gradient flow's
    `rho_dot` for plain GD), and `lemma4_rhs = c - rho (rho_dot_step / 2 + mu)` with `c` the mean
    squared target (1 for ±1 labels), which Lemma 4 says equals the loss.

    rho is kept non-negative, as a norm: when a step takes it below 0, rho and the last layer change
    sign together (the function, and the loss, are unchanged); `config["rho_sign_flips"]` counts them.

    `track_layers` adds, per layer and logged epoch, the numerical rank (singular values of `V_k`
    above `rank_eps` times the largest), the stable rank and the mean per-step update norm
    `||V_k(t+1) - V_k(t)||_F / lr` since the previous row (Eq. 53's `||V_k dot||`).

    A NaN or infinite loss raises `TrainingDiverged` (`on_nan="raise"`) or ends training with
    `SquareRun.stopped` set (`on_nan="stop"`).
    """
    for name, v in (("epochs", epochs), ("log_every", log_every)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay (lambda) must be non-negative, got {weight_decay}")
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"schedule must be 'constant' or 'cosine', got {schedule!r}")
    if on_nan not in ("raise", "stop"):
        raise ValueError(f"on_nan must be 'raise' or 'stop', got {on_nan!r}")
    if not hasattr(model, "outputs_and_features"):
        raise TypeError("model must be a lowrank.core.nets.normalized.NormalizedNet")
    device = torch.device(device) if device is not None else get_device()
    model = model.to(device=device, dtype=dtype)
    lam = float(weight_decay)

    x_tr = ds.x_train.to(device=device, dtype=dtype)
    x_te = ds.x_test.to(device=device, dtype=dtype)
    if tuple(x_tr.shape[1:]) != tuple(model.in_shape):
        raise ValueError(f"inputs have shape {tuple(x_tr.shape[1:])}, the network expects {model.in_shape} "
                         "(use square_training.prepare(ds, shape=...))")
    t_tr, lab_tr = train_targets(ds.y_train, model.num_outputs)
    _, lab_te = train_targets(ds.y_test, model.num_outputs)
    t_tr = t_tr.to(device=device, dtype=dtype)
    lab_tr, lab_te = lab_tr.to(device), lab_te.to(device)
    n = x_tr.shape[0]
    target_sq = float((t_tr**2).reshape(n, -1).sum(1).mean())
    bs = n if batch_size is None else int(batch_size)
    if not 1 <= bs <= n:
        raise ValueError(f"batch_size must be between 1 and N={n}, got {batch_size}")
    steps_per_epoch = math.ceil(n / bs)
    total_steps = epochs * steps_per_epoch
    groups = model.parameter_groups()
    rho_scale = 1.0 if rho_lr is None else float(rho_lr) / lr  # rho's step = rho_scale * the V step
    if not rho_scale > 0:
        raise ValueError(f"rho_lr must be positive, got {rho_lr}")
    opt = torch.optim.SGD([{"params": groups["rho"]}, {"params": groups["V"]}], lr=lr, momentum=momentum)
    gen = torch.Generator().manual_seed(seed)
    margin_epochs = set(int(e) for e in margin_epochs)

    rows, layer_rows, margin_rows = [], [], []
    update_sums = None

    def layer_directions():
        return [v.detach().clone() for v in model.directions()]

    def log(epoch: int, step: int):
        nonlocal update_sums
        out_tr, h = _forward_all(model, x_tr, eval_batch_size)
        out_te, _ = _forward_all(model, x_te, eval_batch_size)
        if not (bool(torch.isfinite(out_tr).all()) and bool(torch.isfinite(out_te).all())):
            return None
        rho = float(model.rho.detach())
        fbar = collapse.margins(out_tr, lab_tr)
        second = None if out_tr.ndim == 1 else float((out_tr.double() ** 2).sum(1).mean())
        stats = collapse.margin_stats(fbar.double().cpu(), rho, lam, second_moment=second)
        pred = rho * out_tr.double()
        loss = float(((pred - t_tr.double()) ** 2).reshape(n, -1).sum(1).mean()) + lam * rho**2
        row = {"epoch": epoch, "step": step, "lr": _lr_at(step, total_steps, lr, schedule, min_lr), **stats,
               "product_norm": model.product_norm(), "loss": loss,
               "loss_eq11": target_sq - 2 * rho * stats["mu"] + rho**2 * (stats["M"] + lam),
               "rho_dot_gf": 2 * (stats["mu"] - rho * (stats["M"] + lam)),
               "rho_dot_step": float("nan"), "lemma4_rhs": float("nan"),
               "train_error": _errors(out_tr, lab_tr), "test_error": _errors(out_te, lab_te)}
        if nc:
            W = model.classifier().detach().double().cpu()
            try:
                row.update({k: v for k, v in collapse.nc_metrics(h.double().cpu(), lab_tr.cpu(), W).items()
                            if k != "num_classes"})
            except ValueError as err:  # e.g. a class collapsed to zero features at initialisation
                row["nc_error"] = str(err)
        rows.append(row)
        if epoch in margin_epochs:
            f = fbar.double().cpu().numpy()
            margin_rows.extend({"epoch": epoch, "sample": i, "margin": float(v)} for i, v in enumerate(f))
        if track_layers:
            steps_done = update_sums[1] if update_sums else 0
            for k, w in enumerate(model.weight_matrices(), 1):
                mat = w.matrix.double().cpu()
                s = spectral.singular_values(mat)
                layer_rows.append({
                    "epoch": epoch, "layer": k, "classifier": w.classifier, "shape": "x".join(map(str, mat.shape)),
                    "rank": int((s > rank_eps * s[0]).sum()), "stable_rank": float((s**2).sum() / s[0] ** 2),
                    "top_singular_share": float(s[0] ** 2 / (s**2).sum()),
                    "update_norm": float(update_sums[0][k - 1] / steps_done) if steps_done else float("nan"),
                })
            update_sums = ([0.0] * model.depth, 0)
        return row

    def bad(value: float) -> bool:
        return not math.isfinite(value)

    from tqdm.auto import tqdm

    if log(0, 0) is None:
        raise TrainingDiverged("the network's outputs at initialisation are not finite (check the inputs and rho_init)")
    pending_rho = (0, float(model.rho.detach()))  # the row whose rho_dot_step the next step fills in
    stopped, step, flips = None, 0, 0
    bar = tqdm(range(1, epochs + 1), desc=desc or f"{model.name} lambda={lam:g}", disable=not progress, leave=False,
               mininterval=2.0)
    for epoch in bar:
        model.train()
        perm = torch.randperm(n, generator=gen).to(device) if bs < n else None
        epoch_loss = torch.zeros((), device=device, dtype=torch.float64)
        for b in range(steps_per_epoch):
            idx = perm[b * bs:(b + 1) * bs] if perm is not None else None
            xb = x_tr if idx is None else x_tr[idx]
            tb = t_tr if idx is None else t_tr[idx]
            cur_lr = _lr_at(step, total_steps, lr, schedule, min_lr)
            opt.param_groups[0]["lr"] = cur_lr * rho_scale
            opt.param_groups[1]["lr"] = cur_lr
            before = layer_directions() if track_layers else None
            opt.zero_grad(set_to_none=True)
            out = model(xb)
            loss = ((out - tb) ** 2).reshape(xb.shape[0], -1).sum(1).mean() + lam * model.rho**2
            loss.backward()
            opt.step()
            if project:
                model.project_()
            step += 1
            epoch_loss += loss.detach().double()
            if pending_rho is not None:
                row_i, rho_before = pending_rho
                rho_dot = (float(model.rho.detach()) - rho_before) / (cur_lr * rho_scale)
                rows[row_i]["rho_dot_step"] = rho_dot
                rows[row_i]["lemma4_rhs"] = target_sq - rho_before * (rho_dot / 2 + rows[row_i]["mu"])
                pending_rho = None
            if model.canonicalize_():  # rho crossed 0: flip (rho, V_L), and their momentum, to keep rho >= 0
                flips += 1
                for p in (model.rho, model.head.v):
                    buf = opt.state.get(p, {}).get("momentum_buffer")
                    if buf is not None:
                        buf.neg_()
            if track_layers:
                with torch.no_grad():
                    after = model.directions()
                    sums, count = update_sums
                    update_sums = ([s + float((a - bf).norm()) / cur_lr for s, a, bf in zip(sums, after, before)],
                                   count + 1)
        mean_loss = float(epoch_loss) / steps_per_epoch
        rho_now = float(model.rho.detach())
        finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        row = None
        if not (bad(mean_loss) or bad(rho_now) or not finite) and (
                epoch % log_every == 0 or epoch == epochs or epoch in margin_epochs):
            row = log(epoch, step)
            finite = row is not None
        if bad(mean_loss) or bad(rho_now) or not finite:
            msg = (f"training diverged at epoch {epoch} (step {step}): loss={mean_loss:.3g}, rho={rho_now:.3g}"
                   f"{'' if finite else ', outputs or weights not finite'} with "
                   f"lr={lr:g}, lambda={lam:g}, batch_size={bs}. Lower the learning rate (the rho update "
                   f"scales with lr * (M + lambda)) or use a smaller rho_init.")
            if on_nan == "raise":
                raise TrainingDiverged(msg, pd.DataFrame(rows))
            stopped = msg
            break
        if row is not None:
            pending_rho = (len(rows) - 1, row["rho"])
            bar.set_postfix(rho=f"{row['rho']:.3g}", loss=f"{row['loss']:.3g}", test_err=f"{row['test_error']:.3f}",
                            refresh=False)
    bar.close()
    config = {"epochs": epochs, "lr": lr, "rho_lr": lr * rho_scale, "weight_decay": lam, "batch_size": batch_size,
              "momentum": momentum,
              "schedule": schedule, "min_lr": min_lr, "project": project, "seed": seed, "dtype": str(dtype),
              "device": str(device), "model": model.name, "N": n, "rho_sign_flips": flips}
    return SquareRun(pd.DataFrame(rows), pd.DataFrame(layer_rows), pd.DataFrame(margin_rows), model, config, stopped)
