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
metrics of the last-layer features. The loop is a few lines over named pieces: the state
(`_State`), one step (`_step`), one epoch (`_epoch`), the evaluation of a logged row (`evaluate`)
and the per-layer monitor (`_layer_rows`); `SquareConfig` holds every option.

Vocabulary: `lam` is the paper's lambda, the penalty `lam * rho^2` (on rho only); "square loss" is
`(1/N) sum_n ||rho f_V(x_n) - t_n||^2` (summed over outputs, averaged over samples); `eps` is the
rank threshold relative to the largest singular value (spectral normalisation).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import pandas as pd
import torch

from lowrank.square import collapse
from lowrank.core import spectral
from lowrank.core import datasets
from lowrank.core.datasets import DEFAULT_DATA_ROOT, Dataset
from lowrank.core.device import get_device

__all__ = ["TrainingDiverged", "SquareConfig", "SquareRun", "prepare", "load_task", "train_targets", "cosine_lr",
           "evaluate", "train_square", "train_network", "shuffle_labels",
           "rho_stationary_point", "classifier_gradient", "per_sample_gradient_ranks"]


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


def load_task(dataset: str, classes, data_root: str = DEFAULT_DATA_ROOT, max_train: int | None = None,
              max_test: int | None = None, shape=None, unit_ball: bool = True, seed: int = 0,
              num_samples: int | None = None) -> Dataset:
    """A classification task of the square-loss notebooks, inputs in the unit ball.

    Two classes give ±1 labels (`datasets.binary_subset`: `classes[0] -> -1`, `classes[1] -> +1`);
    more give labels 0..k-1 in the order of `classes`. `max_train` / `max_test` keep the first
    samples; `shape` reshapes the inputs (e.g. `(1, 8, 8)` for digits into a CNN). "digits" and
    "mnist1d" are generated locally (`seed` sets the digits split) and centred by the training mean,
    not standardised per feature (per-feature scaling blows up rare pixels, and then dividing by the
    largest norm leaves most inputs far inside the unit ball); "mnist" and "cifar10" are read from
    `data_root` (default `lowrank.core.datasets.DEFAULT_DATA_ROOT`) with their usual per-channel
    normalisation. `num_samples`: how many MNIST-1D signals to generate (train + test, 80/20; default 5000).

    Returns
    -------
    Dataset with inputs of norm <= 1 (with `unit_ball`) and labels ±1 (two classes) or 0..k-1.
    """
    if dataset in ("mnist", "cifar10"):
        ds, center = datasets.load(dataset, root=data_root or DEFAULT_DATA_ROOT), False
    elif dataset == "digits":
        ds, center = datasets.digits(seed=seed, standardize=False), True
    else:
        extra = {} if num_samples is None else {"num_samples": int(num_samples)}
        ds, center = datasets.load(dataset, standardize=False, **extra), True
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


@dataclass(frozen=True)
class SquareConfig:
    """Every option of `train_square`; checked on construction (one-line errors before any work).

    Parameters
    ----------
    epochs : int
        Passes over the training set.
    lr : float
        Step size of the directions `v_k` (the paper's eta).
    lam : float
        The paper's lambda: the penalty `lam * rho^2` added to the square loss (rho only, Eq. 1).
    batch_size : int or None
        Minibatch size; None or 0 is full-batch gradient descent (one step per epoch).
    rho_lr : float or None
        rho's own step size (default `lr`, the paper's single step size). A larger one rescales time in
        rho's gradient flow only: the critical points (Eq. 7) and Lemma 4, with rho_dot measured in
        rho's time, are unchanged.
    momentum : float
        SGD momentum (the same for rho and the `v_k`).
    schedule : str
        "constant", or "cosine": annealed per step from `lr` to `min_lr` (`cosine_lr`).
    min_lr : float
        The cosine schedule's last step size (Fig. 3 ends at 0.0299 for lr 0.03, l.1044).
    log_every : int
        Epochs between logged rows (plus epoch 0, every epoch of `margin_epochs` and the last).
    nc : bool
        Log the neural-collapse metrics of the last-layer features (`collapse.nc_metrics`).
    nc_convention : str
        Global mean and Sigma_W for unbalanced classes: "papyan", "zhu" or "paper" (Eqs. 26-27);
        see `collapse.nc_metrics`.
    nc_shuffled : bool
        Also log the NC metrics of the same features and classifier under a fixed random permutation
        of the training labels (columns `shuffled_<metric>`): the null model of no class structure.
    track_layers : bool
        Log per layer the numerical rank (threshold `eps`, spectral), stable rank and update norm.
    eps : float
        Rank threshold: singular values above `eps` times the largest count.
    margin_epochs : tuple of int
        Epochs whose per-sample margins are kept (`SquareRun.margins`).
    project : bool
        Put every `v_k` back on the unit sphere after each step (the Lagrange-multiplier model).
    seed : int
        Seed of the minibatch order.
    dtype : torch.dtype or str
        Training dtype ("float32", "float64" or a torch dtype).
    on_nan : str
        "raise" (`TrainingDiverged`) or "stop" (`SquareRun.stopped` set) on a non-finite loss.
    eval_batch_size : int
        Samples per forward pass when evaluating a logged row.
    """

    epochs: int
    lr: float
    lam: float = 0.0
    batch_size: int | None = None
    rho_lr: float | None = None
    momentum: float = 0.0
    schedule: str = "constant"
    min_lr: float = 0.0
    log_every: int = 1
    nc: bool = True
    nc_convention: str = "papyan"
    nc_shuffled: bool = False
    track_layers: bool = False
    eps: float = 1e-3
    margin_epochs: tuple = ()
    project: bool = True
    seed: int = 0
    dtype: object = torch.float32
    on_nan: str = "raise"
    eval_batch_size: int = 4096

    def __post_init__(self):
        for name in ("epochs", "log_every", "eval_batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not self.lam >= 0:
            raise ValueError(f"lam (the paper's lambda, penalty lam * rho^2) must be non-negative, got {self.lam}")
        if self.rho_lr is not None and not self.rho_lr > 0:
            raise ValueError(f"rho_lr must be positive, got {self.rho_lr}")
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size < 0):
            raise ValueError(f"batch_size must be a positive integer (0 or None: full batch), got {self.batch_size!r}")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"min_lr must be in [0, lr={self.lr}], got {self.min_lr}")
        if self.nc_convention not in collapse.GLOBAL_MEAN_CONVENTIONS:
            raise ValueError(f"nc_convention must be one of {collapse.GLOBAL_MEAN_CONVENTIONS}, got {self.nc_convention!r}")
        if self.on_nan not in ("raise", "stop"):
            raise ValueError(f"on_nan must be 'raise' or 'stop', got {self.on_nan!r}")
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps}")
        dtype = getattr(torch, self.dtype) if isinstance(self.dtype, str) else self.dtype
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype!r}")
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "margin_epochs", tuple(int(e) for e in self.margin_epochs))

    @property
    def rho_scale(self) -> float:
        """rho's step over the `v_k` step (1 with the paper's single step size)."""
        return 1.0 if self.rho_lr is None else float(self.rho_lr) / self.lr


def cosine_lr(step: int, total: int, lr: float, min_lr: float = 0.0) -> float:
    """Cosine annealing per step: `min_lr + (lr - min_lr) (1 + cos(pi step / total)) / 2`.

    Parameters
    ----------
    step : steps done (0-based); clipped at `total`.
    total : steps of the whole run.
    lr, min_lr : the first and the last step size.

    Returns
    -------
    The step size of step `step` (PyTorch's `CosineAnnealingLR` with `T_max = total`, `eta_min = min_lr`).
    """
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(step, total) / max(total, 1)))


def _lr_at(config: SquareConfig, step: int, total: int) -> float:
    return config.lr if config.schedule == "constant" else cosine_lr(step, total, config.lr, config.min_lr)


@torch.no_grad()
def _forward_all(model, x, batch: int):
    outs, feats = [], []
    for i in range(0, x.shape[0], batch):
        o, h = model.outputs_and_features(x[i:i + batch])
        outs.append(o)
        feats.append(h)
    return torch.cat(outs), torch.cat(feats)


def _errors(out: torch.Tensor, labels: torch.Tensor) -> float:
    pred = torch.where(out > 0, 1, -1) if out.ndim == 1 else out.argmax(1)
    return float((pred != labels).to(torch.float64).mean())


@dataclass
class _Data:
    """The training and test tensors on the training device, targets and labels as `train_targets`."""

    x_train: torch.Tensor
    targets: torch.Tensor
    labels_train: torch.Tensor
    x_test: torch.Tensor
    labels_test: torch.Tensor
    labels_shuffled: torch.Tensor | None = None  # a fixed permutation of labels_train (NC's null model)

    @property
    def n(self) -> int:
        return self.x_train.shape[0]

    def shuffle_labels(self, seed: int) -> None:
        """Set `labels_shuffled`: the training labels under the permutation drawn from `seed + 1`."""
        perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(int(seed) + 1))
        self.labels_shuffled = self.labels_train[perm.to(self.labels_train.device)]

    @property
    def target_sq(self) -> float:
        """c = mean ||t_n||^2 (1 for ±1 targets, C/(C-1) for centred one-hot)."""
        return float((self.targets**2).reshape(self.n, -1).sum(1).mean())


def _to_device(model, ds: Dataset, device, dtype) -> _Data:
    x_tr = ds.x_train.to(device=device, dtype=dtype)
    if tuple(x_tr.shape[1:]) != tuple(model.in_shape):
        raise ValueError(f"inputs have shape {tuple(x_tr.shape[1:])}, the network expects {model.in_shape} "
                         "(use lowrank.square.training.prepare(ds, shape=...))")
    t_tr, lab_tr = train_targets(ds.y_train, model.num_outputs)
    _, lab_te = train_targets(ds.y_test, model.num_outputs)
    return _Data(x_tr, t_tr.to(device=device, dtype=dtype), lab_tr.to(device),
                 ds.x_test.to(device=device, dtype=dtype), lab_te.to(device))


def _nc_columns(h, labels, W, convention: str, prefix: str = "") -> dict:
    try:
        return {prefix + k: v for k, v in collapse.nc_metrics(h, labels, W, convention=convention).items()
                if k != "num_classes"}
    except ValueError as err:  # e.g. a class collapsed to zero features at initialisation
        return {prefix + "nc_error": str(err)}


def evaluate(model, data: _Data, lam: float, *, nc: bool = True, nc_convention: str = "papyan",
             eval_batch_size: int = 4096):
    """One logged row: rho, the margin statistics and predictions (`collapse.margin_stats`), the loss
    `(1/N) sum ||rho f_V - t||^2 + lam rho^2`, Eq. 11's form of it, the flow's rho_dot (Eq. 6), train and
    test error, and (with `nc`) the neural-collapse metrics (and, when `data.labels_shuffled` is set,
    the same under shuffled labels, prefixed `shuffled_`). Returns `(row, fbar)`, or `(None, None)`
    when an output is not finite."""
    out_tr, h = _forward_all(model, data.x_train, eval_batch_size)
    out_te, _ = _forward_all(model, data.x_test, eval_batch_size)
    if not (bool(torch.isfinite(out_tr).all()) and bool(torch.isfinite(out_te).all())):
        return None, None
    rho = float(model.rho.detach())
    fbar = collapse.margins(out_tr, data.labels_train)
    second = None if out_tr.ndim == 1 else float((out_tr.double() ** 2).sum(1).mean())
    stats = collapse.margin_stats(fbar.double().cpu(), rho, lam, second_moment=second, target_sq=data.target_sq)
    loss = float(((rho * out_tr.double() - data.targets.double()) ** 2).reshape(data.n, -1).sum(1).mean()) + lam * rho**2
    row = {**stats, "product_norm": model.product_norm(), "loss": loss,
           "loss_eq11": data.target_sq - 2 * rho * stats["mu"] + rho**2 * (stats["M"] + lam),
           "rho_dot_gf": 2 * (stats["mu"] - rho * (stats["M"] + lam)),
           "rho_dot_step": float("nan"), "lemma4_rhs": float("nan"),
           "train_error": _errors(out_tr, data.labels_train), "test_error": _errors(out_te, data.labels_test)}
    if nc:
        W, h = model.classifier().detach().double().cpu(), h.double().cpu()
        row.update(_nc_columns(h, data.labels_train.cpu(), W, nc_convention))
        if data.labels_shuffled is not None:
            row.update(_nc_columns(h, data.labels_shuffled.cpu(), W, nc_convention, prefix="shuffled_"))
    return row, fbar


def _layer_rows(model, epoch: int, eps: float, update_sums: list[float], steps: int) -> list[dict]:
    """Per layer: numerical rank (`spectral.numerical_rank`, spectral, threshold `eps`), stable rank and
    the mean per-step update norm `||V_k(t+1) - V_k(t)||_F / lr` over the `steps` since the last row."""
    rows = []
    for k, w in enumerate(model.weight_matrices(), 1):
        mat = w.matrix.double().cpu()
        stable = spectral.stable_rank(mat)
        rows.append({"epoch": epoch, "layer": k, "classifier": w.classifier, "shape": "x".join(map(str, mat.shape)),
                     "rank_spectral": int(spectral.numerical_rank(mat, eps)), "stable_rank": float(stable),
                     "top_singular_share": 1.0 / float(stable),
                     "update_norm": update_sums[k - 1] / steps if steps else float("nan")})
    return rows


class HeavyBall:
    """SGD with heavy-ball momentum over groups of parameters, each group with its own learning rate:
    `buf = m buf + g` (`buf = g` at the first step), `p -= lr buf`; no dampening, Nesterov or weight
    decay (lambda acts through the loss). The same operations, in the same order, as `torch.optim.SGD` on
    CPU tensors, so the same numbers, without its per-step dispatch and its import of torch._dynamo
    (about 2 s per kernel)."""

    def __init__(self, groups: list, momentum: float = 0.0):
        self.groups, self.momentum = [list(g) for g in groups], float(momentum)
        self.buffers: dict = {}  # parameter -> momentum buffer

    def zero_grad(self) -> None:
        for group in self.groups:
            for p in group:
                p.grad = None

    @torch.no_grad()
    def step(self, lrs) -> None:
        """One step, `lrs[i]` the learning rate of group i; parameters without a gradient stay."""
        for group, lr in zip(self.groups, lrs, strict=True):
            for p in group:
                if p.grad is None:
                    continue
                d = p.grad
                if self.momentum:
                    buf = self.buffers.get(p)
                    if buf is None:
                        buf = self.buffers[p] = d.detach().clone()
                    else:
                        buf.mul_(self.momentum).add_(d)
                    d = buf
                p.add_(d, alpha=-lr)


@dataclass
class _State:
    """What changes during training (and what a checkpoint would hold)."""

    model: torch.nn.Module
    opt: HeavyBall
    generator: torch.Generator
    step: int = 0
    flips: int = 0  # rho sign flips (rho kept >= 0)
    pending_rho: tuple | None = None  # (row index, rho at that row): its rho_dot comes from the next step
    update_sums: list = field(default_factory=list)  # per layer, sum of ||dV_k|| / lr since the last row
    update_steps: int = 0
    classifier_log_scale: float = 0.0  # sum over steps of log(1 + lr <dL/dV_L, V_L>) (`_classifier_scale`)


def _step(state: _State, config: SquareConfig, xb, tb, cur_lr: float, track: bool) -> tuple[torch.Tensor, float]:
    """One SGD step on the minibatch (xb, tb); projects, keeps rho >= 0 and accumulates update norms.
    Returns the minibatch loss and rho as the step left it (before a sign flip)."""
    model, opt = state.model, state.opt
    before = [v.detach().clone() for v in model.directions()] if track else None
    opt.zero_grad()
    loss = ((model(xb) - tb) ** 2).reshape(xb.shape[0], -1).sum(1).mean() + config.lam * model.rho**2
    loss.backward()
    state.classifier_log_scale += _classifier_scale(model, config, cur_lr)
    opt.step((cur_lr * config.rho_scale, cur_lr))
    if config.project:
        model.project_()
    state.step += 1
    rho_after = float(model.rho.detach())
    if model.canonicalize_():  # rho crossed 0: flip (rho, V_L), and their momentum, to keep rho >= 0
        state.flips += 1
        for p in (model.rho, model.head.v):
            buf = opt.buffers.get(p)
            if buf is not None:
                buf.neg_()
    if track:
        with torch.no_grad():
            state.update_sums = [s + float((a - b).norm()) / cur_lr
                                 for s, a, b in zip(state.update_sums, model.directions(), before)]
        state.update_steps += 1
    return loss.detach(), rho_after


def _classifier_scale(model, config: SquareConfig, cur_lr: float) -> float:
    """`log(1 + lr <G, V_L>)` of the step about to be taken, `G = dL/dV_L` (the loss's gradient in the
    classifier direction, a free C x p matrix): the factor by which a projected step (no momentum) rescales
    the whole of `V_L` at unit Frobenius norm, every row alike. `f = rho V_L h` is bilinear in (rho, V_L),
    so `<G, V_L> = rho dL_data/drho = rho (rho.grad - 2 lam rho)`. NaN where the step is not of that form
    (momentum, no projection, an unnormalised last layer) or the factor is not positive."""
    if config.momentum or not config.project or not model.normalize_last:
        return float("nan")
    rho = float(model.rho.detach())
    factor = 1.0 + cur_lr * rho * (float(model.rho.grad) - 2 * config.lam * rho)
    return math.log(factor) if factor > 0 else float("nan")


def _fill_rho_dot(state: _State, rows: list, rho_after: float, step_lr: float, target_sq: float) -> None:
    """The measured rho_dot `(rho_{t+1} - rho_t) / step_lr` and Lemma 4's `c - rho (rho_dot / 2 + mu)` of
    the last logged row (rho_after is read before a sign flip, as the step left it)."""
    if state.pending_rho is None:
        return
    i, rho_before = state.pending_rho
    rho_dot = (rho_after - rho_before) / step_lr
    rows[i]["rho_dot_step"] = rho_dot
    rows[i]["lemma4_rhs"] = target_sq - rho_before * (rho_dot / 2 + rows[i]["mu"])
    state.pending_rho = None


def _epoch(state: _State, config: SquareConfig, data: _Data, rows: list, total_steps: int) -> float:
    """One pass over the training set; returns the mean minibatch loss (float64)."""
    n, bs = data.n, config.batch_size or data.n
    perm = torch.randperm(n, generator=state.generator).to(data.x_train.device) if bs < n else None
    total = torch.zeros((), device=data.x_train.device, dtype=torch.float64)
    steps = math.ceil(n / bs)
    for b in range(steps):
        idx = perm[b * bs:(b + 1) * bs] if perm is not None else None
        xb = data.x_train if idx is None else data.x_train[idx]
        tb = data.targets if idx is None else data.targets[idx]
        cur_lr = _lr_at(config, state.step, total_steps)
        loss, rho_after = _step(state, config, xb, tb, cur_lr, config.track_layers)
        total += loss.double()
        _fill_rho_dot(state, rows, rho_after, cur_lr * config.rho_scale, data.target_sq)
    return float(total) / steps


def _diverged(state: _State, config: SquareConfig, epoch: int, mean_loss: float, finite: bool, n: int) -> str:
    rho = float(state.model.rho.detach())
    return (f"training diverged at epoch {epoch} (step {state.step}): loss={mean_loss:.3g}, rho={rho:.3g}"
            f"{'' if finite else ', outputs or weights not finite'} with lr={config.lr:g}, lam={config.lam:g}, "
            f"batch_size={config.batch_size or n}. Lower the learning rate (the rho update scales with "
            "lr * (M + lam)) or use a smaller rho_init.")


def _log(state: _State, config: SquareConfig, data: _Data, tables: dict, epoch: int, total_steps: int) -> dict | None:
    """Evaluate and append one row (and its margins and layer rows); None when an output is not finite."""
    row, fbar = evaluate(state.model, data, config.lam, nc=config.nc, nc_convention=config.nc_convention,
                         eval_batch_size=config.eval_batch_size)
    if row is None:
        return None
    row = {"epoch": epoch, "step": state.step, "lr": _lr_at(config, state.step, total_steps), **row,
           "classifier_log_scale": state.classifier_log_scale}
    tables["history"].append(row)
    if epoch in config.margin_epochs:
        tables["margins"].extend({"epoch": epoch, "sample": i, "margin": float(v)}
                                 for i, v in enumerate(fbar.double().cpu().numpy()))
    if config.track_layers:
        tables["layers"].extend(_layer_rows(state.model, epoch, config.eps, state.update_sums, state.update_steps))
        state.update_sums, state.update_steps = [0.0] * state.model.depth, 0
    state.pending_rho = (len(tables["history"]) - 1, row["rho"])
    return row


def train_square(model, ds: Dataset, config: SquareConfig | None = None, *, device=None, progress: bool = True,
                 desc: str | None = None, **options) -> SquareRun:
    """Train `model` (a `NormalizedNet`) on `ds` with the square loss and the penalty `lam * rho^2`.

    Parameters
    ----------
    model : NormalizedNet (`lowrank.core.nets.normalized`), moved to `device` and `config.dtype`.
    ds : Dataset with inputs of the network's `in_shape` and labels ±1 (one output) or 0..C-1.
    config : SquareConfig; or its fields as keyword `options` (which also override a given config).
    device : torch device (default `lowrank.core.device.get_device()`).
    progress, desc : a tqdm bar and its label.

    Returns
    -------
    SquareRun. `history` has one row at epoch 0 (the initialisation), every `log_every` epochs, at
    every epoch of `margin_epochs` and at the last epoch. The margins and their statistics are those of
    `f_V` (with frozen scales g != 1, of the network that includes them; the paper's product norm is
    then `product_norm = rho prod_k g_k`). `rho_dot_step` is the measured `(rho_{t+1} - rho_t) / rho_lr`
    of the step that follows the logged state (the gradient flow's `rho_dot` for plain GD), and
    `lemma4_rhs = c - rho (rho_dot_step / 2 + mu)` with `c` the mean squared target (1 for ±1 labels),
    which Lemma 4 says equals the loss. rho is kept non-negative, as a norm: when a step takes it
    below 0, rho and the last layer change sign together (the function and the loss are unchanged);
    `config["rho_sign_flips"]` counts them. `classifier_log_scale` is the sum over the steps so far of
    `log(1 + lr <dL/dV_L, V_L>)`, the log of the factor by which the projected steps have rescaled the
    classifier direction as a whole (`collapse.row_sum_excess` reads it; NaN with momentum). A NaN or
    infinite loss raises `TrainingDiverged` (`on_nan="raise"`) or ends training with `SquareRun.stopped`
    set (`on_nan="stop"`).
    """
    config = SquareConfig(**options) if config is None else dataclasses.replace(config, **options)
    if not hasattr(model, "outputs_and_features"):
        raise TypeError("model must be a lowrank.core.nets.normalized.NormalizedNet")
    device = torch.device(device) if device is not None else get_device()
    model = model.to(device=device, dtype=config.dtype)
    data = _to_device(model, ds, device, config.dtype)
    if config.nc_shuffled:
        data.shuffle_labels(config.seed)
    if config.batch_size and config.batch_size > data.n:
        raise ValueError(f"batch_size must be between 1 and N={data.n}, got {config.batch_size}")
    total_steps = config.epochs * math.ceil(data.n / (config.batch_size or data.n))
    groups = model.parameter_groups()
    opt = HeavyBall([groups["rho"], groups["V"]], momentum=config.momentum)
    state = _State(model, opt, torch.Generator().manual_seed(config.seed), update_sums=[0.0] * model.depth)
    tables = {"history": [], "layers": [], "margins": []}
    if _log(state, config, data, tables, 0, total_steps) is None:
        raise TrainingDiverged("the network's outputs at initialisation are not finite (check the inputs and rho_init)")
    from tqdm.auto import tqdm

    stopped = None
    bar = tqdm(range(1, config.epochs + 1), desc=desc or f"{model.name} lam={config.lam:g}", disable=not progress,
               leave=False, mininterval=2.0)
    for epoch in bar:
        model.train()
        mean_loss = _epoch(state, config, data, tables["history"], total_steps)
        finite = math.isfinite(mean_loss) and math.isfinite(float(model.rho.detach())) and all(
            bool(torch.isfinite(p).all()) for p in model.parameters())
        if finite and (epoch % config.log_every == 0 or epoch == config.epochs or epoch in config.margin_epochs):
            row = _log(state, config, data, tables, epoch, total_steps)
            finite = row is not None
            if finite:
                bar.set_postfix(rho=f"{row['rho']:.3g}", loss=f"{row['loss']:.3g}", refresh=False)
        if not finite:
            stopped = _diverged(state, config, epoch, mean_loss, finite, data.n)
            if config.on_nan == "raise":
                raise TrainingDiverged(stopped, pd.DataFrame(tables["history"]))
            break
    bar.close()
    record = {**dataclasses.asdict(config), "dtype": str(config.dtype), "rho_lr": config.lr * config.rho_scale,
              "weight_decay": config.lam, "device": str(device), "model": model.name, "N": data.n,
              "rho_sign_flips": state.flips}
    return SquareRun(pd.DataFrame(tables["history"]), pd.DataFrame(tables["layers"]), pd.DataFrame(tables["margins"]),
                     model, record, stopped)


def train_network(data: Dataset, *, arch: str, arch_kwargs: dict | None = None, rho_init: float = 1.0, seed: int = 0,
                  device=None, progress: bool = True, desc: str | None = None, **options) -> SquareRun:
    """Build `normalized.make(arch, ...)` for `data` (one output for ±1 labels, else one per class) and
    train it: the setup every Part III page repeats.

    Parameters
    ----------
    data : Dataset from `load_task`.
    arch, arch_kwargs : the architecture and its keyword arguments (`lowrank.core.nets.normalized.make`).
    rho_init : the initial product norm rho_0 (the paper's initialisation scale s gives rho_0 = s^L).
    seed : seeds the network's initialisation and the minibatch order.
    options : the fields of `SquareConfig` (`epochs`, `lr`, `lam`, ...), `num_outputs` to override.

    Returns
    -------
    SquareRun of `train_square`.
    """
    from lowrank.core.nets import normalized

    binary = bool(((data.y_train == 1) | (data.y_train == -1)).all())
    num_outputs = options.pop("num_outputs", 1 if binary else data.num_classes)
    model = normalized.make(arch, data.x_train.shape[1:], num_outputs=num_outputs, rho_init=rho_init, seed=seed,
                            **(arch_kwargs or {}))
    return train_square(model, data, seed=seed, device=device, progress=progress, desc=desc, **options)


def shuffle_labels(data: Dataset, seed: int) -> Dataset:
    """`data` with its training labels under a random permutation (seeded): the same inputs and the same
    label counts, no relation between input and label (the null model of the NC claims). Test labels stay."""
    perm = torch.randperm(len(data.y_train), generator=torch.Generator().manual_seed(int(seed)))
    return Dataset(data.x_train, data.y_train[perm], data.x_test, data.y_test, data.num_classes,
                   f"{data.name} (training labels shuffled)")


def _model_data(model, ds: Dataset) -> _Data:
    p = next(model.parameters())
    return _to_device(model, ds, p.device, p.dtype)


def rho_stationary_point(model, ds: Dataset, lam: float) -> float:
    """The rho where the autograd derivative in rho of `(1/N) sum ||rho f_V(x_n) - t_n||^2 + lam rho^2`
    vanishes, the `V_k` of `model` held fixed: the secant through the derivatives at rho = 0 and 1, exact
    (to round-off) because the loss is quadratic in rho. Eq. 7 says it is `mu / (M + lam)`."""
    data = _model_data(model, ds)
    with torch.no_grad():
        f = model.f_V(data.x_train).double()
    t = data.targets.double()

    def derivative(r: float) -> float:
        rho = torch.tensor(r, dtype=torch.float64, requires_grad=True)
        loss = ((rho * f - t) ** 2).reshape(data.n, -1).sum(1).mean() + lam * rho**2
        return float(torch.autograd.grad(loss, rho)[0])

    g0, g1 = derivative(0.0), derivative(1.0)
    if g1 == g0:
        raise ValueError("the loss does not depend on rho (f_V = 0 and lam = 0): no stationary point")
    return -g0 / (g1 - g0)


def classifier_gradient(model, ds: Dataset, lam: float) -> torch.Tensor:
    """Autograd gradient of the regularised square loss in the classifier direction `V_L` (C x p), at the
    model's parameters on the training set of `ds` with its centred one-hot targets."""
    data = _model_data(model, ds)
    V = model.classifier().detach().clone().requires_grad_(True)
    with torch.no_grad():
        h = model.features(data.x_train)
    out = h @ V.T
    out = out.squeeze(-1) if model.num_outputs == 1 else out
    rho = model.rho.detach()
    loss = ((rho * out - data.targets) ** 2).reshape(data.n, -1).sum(1).mean() + lam * rho**2
    return torch.autograd.grad(loss, V)[0].detach()


def per_sample_gradient_ranks(model, ds: Dataset, eps: float = 1e-8, max_samples: int = 32) -> pd.DataFrame:
    """Numerical rank (`spectral.numerical_rank`, threshold `eps` relative to the largest singular value)
    of the gradient of one margin in a layer's direction, `d f_bar_n / d V_k` (conv kernels reshaped to
    C_out x C_in k^2), for every layer k and the first `max_samples` samples: Lemma 8's proof (Eq. 47)
    says each is of rank at most 1. Also the gradient of the sum of two samples' margins (kind "two
    samples", generically rank 2), which a statistic that did not resolve single samples would read.
    Returns one row per (sample, layer, kind)."""
    data = _model_data(model, ds)
    layers = list(model.body) + [model.head]
    leaves = [layer.direction().detach().clone().requires_grad_(True) for layer in layers]
    for layer, leaf in zip(layers, leaves):  # the forward reads these leaves as the V_k
        layer.direction = (lambda d: (lambda: d))(leaf)
    rows = []
    try:
        for i in range(min(int(max_samples), data.n)):
            for kind, idx in (("one sample", [i]), ("two samples", [i, (i + 1) % data.n])):
                out = model.f_V(data.x_train[idx]).reshape(len(idx), -1)
                fbar = (out * data.targets[idx].reshape(len(idx), -1)).sum()  # y_n f_n, or f_n . e~_{y_n}
                for k, g in enumerate(torch.autograd.grad(fbar, leaves, allow_unused=True), 1):
                    mat = torch.zeros(1, 1) if g is None else g.detach().double().reshape(g.shape[0], -1).cpu()
                    rank = int(spectral.numerical_rank(mat, eps)) if bool(mat.abs().max() > 0) else 0
                    rows.append({"sample": i, "layer": k, "kind": kind, "rank": rank})
    finally:
        for layer in layers:
            del layer.direction
    return pd.DataFrame(rows)
