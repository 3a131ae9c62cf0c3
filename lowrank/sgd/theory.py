"""The two theoretical statements of Galanti et al. (2022), Section 3, measured.

- Lemma 3.1 (and the fully-connected lemma): the gradient of one sample's loss with respect to a
  layer's weight matrix has rank at most `N`, the number of patches (positions) the layer is applied
  to: 1 for a fully-connected layer, `h_out * w_out` for a convolution (kernel reshaped to
  `C_out x (C_in k k)`), the number of tokens for a linear layer inside a transformer.
  `per_sample_gradients` computes these gradients with `torch.func` (vmap over samples of
  grad of `functional_call`), `patch_counts` finds `N` for every weight matrix with forward hooks and
  `gradient_ranks` tabulates ranks against bounds.
- Theorem 3.2: along plain mini-batch SGD with coupled weight decay,
  `W_{t+1} = (1 - 2 mu lambda) W_t - mu grad L_batch(W_t)` (the paper's `lambda ||W||^2` penalty),
  for every `k < t`, `min_{rank W <= N B k} || W_t/||W_t|| - W || <= (1 - 2 mu lambda)^k ||W_{t-k}|| / ||W_t||`.
  `rank_bound_check` runs that SGD in float64, stores every iterate's norm, and evaluates both sides
  exactly: the left by Eckart-Young (`lowrank.core.spectral.rank_k_error`) in the same norm.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from lowrank.core import spectral
from lowrank.core.validation import check_choice
from lowrank.core.nets.conv import num_patches
from lowrank.core.train import loss_value

__all__ = ["patch_counts", "per_sample_gradients", "gradient_ranks", "batch_gradient_ranks", "plain_sgd",
           "rank_bound_check"]


def _weight_names(model) -> list[tuple[str, bool]]:
    if not hasattr(model, "weight_specs"):
        raise ValueError(f"{type(model).__name__} has no weight_specs(); use a network of lowrank.core.nets")
    return model.weight_specs()


def patch_counts(model: nn.Module, x: torch.Tensor) -> dict[str, int]:
    """`{weight name: N}` for the weight matrices of `model` on inputs shaped like `x` (one sample or
    a batch): the number of positions the layer's matrix is applied to. A Conv2d gives
    `h_out * w_out`, a Linear the product of its input's middle dimensions (1 for `(n, d)`, the
    number of tokens for `(n, T, d)`)."""
    names = {n for n, _ in _weight_names(model)}
    found, hooks = {}, []
    for mod_name, mod in model.named_modules():
        pname = f"{mod_name}.weight" if mod_name else "weight"
        if pname not in names:
            continue
        if isinstance(mod, nn.Conv2d):
            if mod.dilation != (1, 1) or isinstance(mod.padding, str):
                raise ValueError(f"{pname}: patch counts take convolutions without dilation and with numeric padding")
            hooks.append(mod.register_forward_hook(lambda m, i, o, pname=pname: found.__setitem__(
                pname, num_patches(tuple(i[0].shape[-2:]), m.kernel_size, m.stride, m.padding))))
        elif isinstance(mod, nn.Linear):
            hooks.append(mod.register_forward_hook(
                lambda m, i, o, pname=pname: found.__setitem__(pname, int(math.prod(i[0].shape[1:-1])))))
        else:
            raise ValueError(f"{pname}: patch counts are defined for Linear and Conv2d layers, not {type(mod).__name__}")
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(x[:1])
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    missing = names - set(found)
    if missing:
        raise ValueError(f"the forward pass never used {sorted(missing)}")
    return found


def per_sample_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, loss: str = "ce",
                         dtype=torch.float64) -> dict[str, torch.Tensor]:
    """`{weight name: (n, C_out, fan_in)}`: the gradient of each sample's loss `l(f(x_i), y_i)` with
    respect to each weight matrix (conv kernels reshaped), by `vmap(grad(functional_call))`.

    The model is evaluated in eval mode (BatchNorm as the affine map of its running statistics, no
    dropout), in `dtype`, so that each sample's loss depends on that sample only.
    """
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y have different numbers of samples: {x.shape[0]} and {y.shape[0]}")
    check_choice(loss, "loss", {"ce", "mse"})
    import copy

    m = copy.deepcopy(model).to(dtype).eval()
    params = {k: v.detach() for k, v in m.named_parameters()}
    buffers = {k: v.detach() for k, v in m.named_buffers()}
    names = [n for n, _ in _weight_names(m)]

    def one(p, xi, yi):
        out = functional_call(m, (p, buffers), (xi.unsqueeze(0),))
        return loss_value(out, yi.unsqueeze(0), loss)

    g = vmap(grad(one), in_dims=(None, 0, 0))(params, x.to(dtype), y)
    return {n: g[n].reshape(x.shape[0], g[n].shape[1], -1) for n in names}


def gradient_ranks(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, eps: float = 1e-8, loss: str = "ce",
                   architecture: str = "") -> pd.DataFrame:
    """One row per sample and weight matrix: the numerical rank of the per-sample gradient
    (singular values above `eps` times the largest, spectral normalisation, since a per-sample gradient's
    rank is an exact rank and `eps` only absorbs round-off; a zero gradient has rank 0), the bound `N` of
    Lemma 3.1 and `min(N, C_out, fan_in)`."""
    if not 0 < eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {eps}")
    grads = per_sample_gradients(model, x, y, loss=loss)
    counts = patch_counts(model, x)
    flags = dict(_weight_names(model))
    rows = []
    for li, (name, G) in enumerate(grads.items()):
        s = torch.linalg.svdvals(G)
        ranks = spectral.rank_from_singular_values(s, eps, "spectral")
        for i in range(G.shape[0]):
            rows.append({"architecture": architecture, "sample": i, "layer": name, "layer_index": li,
                         "classifier": flags[name], "shape": f"{G.shape[1]}x{G.shape[2]}", "patches": counts[name],
                         "bound": min(counts[name], G.shape[1], G.shape[2]), "rank": int(ranks[i]),
                         "s1": float(s[i, 0]), "s_next": float(s[i, ranks[i]]) if ranks[i] < s.shape[1] else 0.0})
    return pd.DataFrame(rows)


def batch_gradient_ranks(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, eps: float = 1e-8,
                         loss: str = "ce", architecture: str = "") -> pd.DataFrame:
    """The gradient of one mini-batch's mean loss in *training* mode (BatchNorm with batch
    statistics, which couple the samples): rank against the bound `N * B` (B = len(x))."""
    import copy

    m = copy.deepcopy(model).double().train()
    m.zero_grad()
    loss_value(m(x.double()), y, loss).backward()
    counts = patch_counts(m, x.double())
    rows = []
    for li, (name, classifier) in enumerate(_weight_names(m)):
        G = dict(m.named_parameters())[name].grad
        G = G.reshape(G.shape[0], -1)
        s = torch.linalg.svdvals(G)
        rank = int(spectral.rank_from_singular_values(s, eps, "spectral"))
        rows.append({"architecture": architecture, "layer": name, "layer_index": li, "classifier": classifier,
                     "shape": f"{G.shape[0]}x{G.shape[1]}", "patches": counts[name], "batch_size": x.shape[0],
                     "bound": min(counts[name] * x.shape[0], *G.shape), "rank": rank})
    return pd.DataFrame(rows)


def plain_sgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, lr: float, lam: float, batch_size: int,
              steps: int, loss: str = "ce", seed: int = 0, layers=None, keep=()):
    """Plain mini-batch SGD (no momentum) on `(1/B) sum l + lam ||W||^2` over all parameters, in
    float64: `W <- (1 - 2 lr lam) W - lr grad L_batch(W)`. Batches are drawn without replacement
    from a new permutation each epoch.

    Returns `(norms, snapshots, losses)`: `norms[name]` is a `(steps + 1, 2)` array of the Frobenius
    and spectral norms of every iterate `W_0 .. W_steps`; `snapshots[(name, t)]` the matrix `W_t` for
    `t` in `keep`; `losses` the mini-batch losses.
    """
    if not lr > 0 or not lam >= 0:
        raise ValueError(f"lr must be positive and lam non-negative, got lr={lr}, lam={lam}")
    if not 2 * lr * lam < 1:
        raise ValueError(f"2 * lr * lam must be below 1 for the factor (1 - 2 mu lambda) to be positive, got {2 * lr * lam}")
    for name, v in (("batch_size", batch_size), ("steps", steps)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if batch_size > x.shape[0]:
        raise ValueError(f"batch_size={batch_size} is larger than the data ({x.shape[0]} samples)")
    model = model.double().train()
    x = x.double()
    params = dict(model.named_parameters())
    names = list(layers) if layers is not None else [n for n, _ in _weight_names(model)]
    for n in names:
        if n not in params:
            raise ValueError(f"no parameter {n!r} in the model")
    keep = set(keep)
    g = torch.Generator().manual_seed(seed)
    norms = {n: np.zeros((steps + 1, 2)) for n in names}
    snaps, losses = {}, []

    def record(t):
        for n in names:
            M = params[n].detach().reshape(params[n].shape[0], -1)
            norms[n][t] = (float(torch.linalg.matrix_norm(M)), float(torch.linalg.matrix_norm(M, ord=2)))
            if t in keep:
                snaps[(n, t)] = M.clone()

    record(0)
    perm, pos = torch.randperm(x.shape[0], generator=g), 0
    for t in range(1, steps + 1):
        if pos + batch_size > x.shape[0]:
            perm, pos = torch.randperm(x.shape[0], generator=g), 0
        idx = perm[pos:pos + batch_size]
        pos += batch_size
        model.zero_grad()
        value = loss_value(model(x[idx]), y[idx], loss)
        value.backward()
        losses.append(value.item())
        with torch.no_grad():
            for p in params.values():
                p.mul_(1 - 2 * lr * lam).sub_(lr * p.grad)
        record(t)
    return norms, snaps, np.asarray(losses)


def rank_bound_check(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, lr: float, lam: float,
                     batch_size: int, steps: int, check_at, ks, norm: str = "fro", loss: str = "ce",
                     seed: int = 0, layers=None) -> pd.DataFrame:
    """Theorem 3.2 along `plain_sgd`: one row per layer, checked step `t` (in `check_at`) and `k`
    (in `ks`, `k < t`) with both sides, the rank budget `N B k` and `holds = lhs <= rhs` (up to
    1e-12 relative round-off). `norm` is "fro" or "spectral", used for every norm of the statement.

    Negative controls on the same snapshots: `lhs_quarter_budget` (the left side with a quarter of
    the rank budget, `N B k // 4`) against the true right side, and `rhs_lambda_x4` (the right side
    with lambda four times too large) against the true left side; `quarter_budget_holds` and
    `lambda_x4_holds` say whether those wrong bounds happen to hold (a sharp check violates them)."""
    check_choice(norm, "norm", {"fro", "spectral"})
    check_at = sorted(set(int(t) for t in check_at))
    ks = sorted(set(int(k) for k in ks))
    if not check_at or not ks or check_at[0] < 1 or ks[0] < 1 or check_at[-1] > steps:
        raise ValueError(f"check_at must be in [1, steps={steps}] and ks positive, got {check_at} and {ks}")
    counts = patch_counts(model, x[:1].to(next(model.parameters()).dtype))
    norms, snaps, _ = plain_sgd(model, x, y, lr=lr, lam=lam, batch_size=batch_size, steps=steps, loss=loss,
                                seed=seed, layers=layers, keep=check_at)
    col = 0 if norm == "fro" else 1
    factor, wrong_factor = 1 - 2 * lr * lam, max(0.0, 1 - 2 * lr * (4 * lam))
    rows = []
    for (name, t), W in snaps.items():
        nt = norms[name][t, col]
        s = spectral.singular_values(W / nt)

        def tail(r):  # min over rank <= r of ||W_t/||W_t|| - A|| (Eckart-Young), in the chosen norm
            r = min(r, s.shape[0])
            return float(torch.linalg.vector_norm(s[r:])) if norm == "fro" else (float(s[r]) if r < s.shape[0] else 0.0)

        for k in ks:
            if k >= t:
                continue
            budget = counts[name] * batch_size * k
            lhs, lhs_quarter = tail(budget), tail(budget // 4)
            past = norms[name][t - k, col] / nt
            rhs, rhs_wrong = factor**k * past, wrong_factor**k * past
            rows.append({"layer": name, "t": t, "k": k, "patches": counts[name], "batch_size": batch_size,
                         "rank_budget": budget, "min_dim": min(W.shape), "lhs": lhs, "rhs": rhs,
                         "holds": bool(lhs <= rhs * (1 + 1e-12) + 1e-15),
                         "lhs_quarter_budget": lhs_quarter, "rhs_lambda_x4": rhs_wrong,
                         "quarter_budget_holds": bool(lhs_quarter <= rhs * (1 + 1e-12) + 1e-15),
                         "lambda_x4_holds": bool(lhs <= rhs_wrong * (1 + 1e-12) + 1e-15)})
    return pd.DataFrame(rows)


def bound_regime(*, lr: float, lam: float, batch_size: int, ks, min_dim: int, patches: int = 1) -> dict:
    """What Theorem 3.2 can say before any training: the decay factor `(1 - 2 mu lambda)^k` at the
    largest `k` of `ks` whose rank budget `N B k` is still below `min_dim` (a matrix's smaller side;
    at or above it the bound is about a full-rank matrix and says nothing). The right side of the
    bound is this factor times `||W_{t-k}|| / ||W_t||`, so a factor near 1 leaves nothing to check.

    Returns `{"k", "factor", "exponent"}` with `exponent = -log(factor)`; `k = 0`, factor 1 when no k fits.
    """
    if not 0 < 2 * lr * lam < 1 and lam != 0:
        raise ValueError(f"need 0 < 2 lr lam < 1, got lr={lr}, lam={lam}")
    if not isinstance(min_dim, (int, np.integer)) or min_dim < 1:
        raise ValueError(f"min_dim must be a positive integer, got {min_dim!r}")
    fitting = [int(k) for k in ks if patches * batch_size * k < min_dim]
    k = max(fitting, default=0)
    factor = (1 - 2 * lr * lam) ** k
    return {"k": k, "factor": float(factor), "exponent": float(-k * np.log1p(-2 * lr * lam))}
