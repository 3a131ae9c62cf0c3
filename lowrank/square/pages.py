"""The set-up every Part III page shares: its task, its network and the training options of its runs
(`page_setup`), and the ways a page trains (`PageSetup.train`: one logged run, `train_square`;
`PageSetup.train_final`: many runs' final rows, and `PageSetup.train_pooled`: their first and last
rows, small full-batch MLPs stacked along a member axis by `lowrank.square.stacked`). It sits above
`training` and `stacked`, which never import it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from lowrank.core.datasets import DEFAULT_DATA_ROOT, Dataset
from lowrank.core.nets import normalized
from lowrank.square import stacked, timescales
from lowrank.square.training import SquareConfig, SquareRun, TrainingDiverged, _to_device, evaluate, load_task, \
    train_network

__all__ = ["PageSetup", "page_setup"]


@dataclass
class PageSetup:
    """What every Part III page sets up once: the task, the network and the training options shared by its
    runs. `train(...)` trains one run with overrides; `initial_row(...)` evaluates the untrained network
    (the margin statistics a regime is computed from, before any training)."""

    data: Dataset
    arch: str
    arch_kwargs: dict
    options: dict  # SquareConfig fields (and num_outputs) shared by the page's runs

    def _options(self, overrides: dict) -> dict:
        opts = {**self.options, **overrides}
        for key in ("rho_lr", "batch_size"):  # the pages' "0: default" convention
            if key in opts and not opts[key]:
                opts[key] = None
        return opts

    def build(self, *, rho_init: float, seed: int, data: Dataset | None = None, num_outputs: int | None = None):
        """The untrained network of a run (`normalized.make`), as `train_network` builds it."""
        data = self.data if data is None else data
        binary = bool(((data.y_train == 1) | (data.y_train == -1)).all())
        outs = num_outputs or self.options.get("num_outputs") or (1 if binary else data.num_classes)
        return normalized.make(self.arch, data.x_train.shape[1:], num_outputs=outs, rho_init=rho_init, seed=seed,
                               **self.arch_kwargs)

    def _evaluate_untrained(self, *, rho_init: float, seed: int, lam: float, data: Dataset | None):
        data = self.data if data is None else data
        model = self.build(rho_init=rho_init, seed=seed, data=data)
        dtype = SquareConfig(epochs=1, lr=1.0, dtype=self._options({}).get("dtype", torch.float32)).dtype
        model = model.to(dtype=dtype)
        row, fbar = evaluate(model, _to_device(model, data, torch.device("cpu"), dtype), lam, nc=False)
        if row is None:
            raise TrainingDiverged("the untrained network's outputs are not finite")
        return row, fbar

    def initial_row(self, *, rho_init: float, seed: int, lam: float, data: Dataset | None = None) -> dict:
        """`evaluate`'s row (rho, mu, M, rho_eq, ...) of the untrained network of a run, in the run's dtype."""
        return self._evaluate_untrained(rho_init=rho_init, seed=seed, lam=lam, data=data)[0]

    def initial_margins(self, *, rho_init: float, seed: int, data: Dataset | None = None) -> np.ndarray:
        """The margins `f_bar_n = y_n f_V(x_n)` of the untrained network of a run (training set, the run's dtype)."""
        fbar = self._evaluate_untrained(rho_init=rho_init, seed=seed, lam=0.0, data=data)[1]
        return fbar.cpu().double().numpy()

    def steps(self, epochs: int | None = None, batch_size: int | None = None) -> int:
        """Optimiser steps of a run of `epochs` epochs (default: the page's) with minibatches `batch_size`."""
        epochs = self.options["epochs"] if epochs is None else epochs
        bs = self.options.get("batch_size") if batch_size is None else batch_size
        return int(epochs) * timescales.steps_per_epoch(len(self.data.x_train), bs or None)

    def train_final(self, members, **overrides) -> pd.DataFrame:
        """Train many runs of the page and return their final rows (`evaluate`'s statistics and `diverged`),
        one per member in order, with the member's own fields. `members`: dicts with `rho_init`, `seed`,
        `lam` and optionally `data` (e.g. corrupted labels). MLPs trained by full-batch gradient descent
        are trained together (`lowrank.square.stacked.train_stacked`, the same arithmetic as one run at a
        time); any other set-up runs one `train` after the other."""
        opts = self._options(overrides)
        members = [dict(m) for m in members]
        datas = [m.pop("data", None) or self.data for m in members]
        if self.arch == "mlp" and not opts.get("batch_size"):
            models = [self.build(rho_init=m["rho_init"], seed=m["seed"], data=d) for m, d in zip(members, datas)]
            keys = ("epochs", "lr", "rho_lr", "momentum", "schedule", "min_lr", "dtype")
            table = stacked.train_stacked(models, datas, [m["lam"] for m in members],
                                          **{k: opts[k] for k in keys if k in opts})
        else:
            rows = []
            for m, d in zip(members, datas):
                opts_m = {**opts, "log_every": opts["epochs"], "on_nan": "stop"}
                run = train_network(d, arch=self.arch, arch_kwargs=self.arch_kwargs, rho_init=m["rho_init"],
                                    seed=m["seed"], lam=m["lam"], progress=False, **{k: v for k, v in opts_m.items()
                                                                                       if k != "lam"})
                rows.append({**run.final.to_dict(), "diverged": run.stopped is not None})
            table = pd.DataFrame(rows)
        return pd.concat([pd.DataFrame(members), table.drop(columns=["rho_init", "seed", "lam"], errors="ignore")], axis=1)

    def train_pooled(self, members, **overrides) -> list[pd.DataFrame]:
        """The first and last rows of many runs' histories (e.g. the further seeds a claim averages over):
        one two-row DataFrame per member in order, `evaluate`'s row at epoch 0 and after the last epoch,
        with the page's options (`nc`, `nc_convention`, `nc_shuffled`). `members` as `train_final`'s. MLPs
        trained by full-batch gradient descent on the same training inputs are trained together
        (`stacked.train_stacked`, the arithmetic of one run at a time); any other set-up runs one `train`
        after the other. A run that diverges raises `TrainingDiverged`, as `train` does."""
        opts = self._options(overrides)
        members = [dict(m) for m in members]
        datas = [m.pop("data", None) or self.data for m in members]
        if self.arch != "mlp" or opts.get("batch_size") or not all(torch.equal(d.x_train, datas[0].x_train) for d in datas):
            return [self.train(rho_init=m["rho_init"], seed=m["seed"], data=d, lam=m["lam"], progress=False,
                               **{**overrides, "log_every": opts["epochs"]}).history for m, d in zip(members, datas)]
        config = SquareConfig(**{k: v for k, v in opts.items() if k != "num_outputs"})
        models = [self.build(rho_init=m["rho_init"], seed=m["seed"], data=d) for m, d in zip(members, datas)]
        table = stacked.train_stacked(models, datas, [m["lam"] for m in members], epochs=config.epochs, lr=config.lr,
                                      rho_lr=config.rho_lr, momentum=config.momentum, schedule=config.schedule,
                                      min_lr=config.min_lr, dtype=config.dtype, nc=config.nc,
                                      nc_convention=config.nc_convention, record_initial=True,
                                      shuffled_label_seeds=[m["seed"] for m in members] if config.nc_shuffled else None)
        n = len(members)
        if table.diverged.any():
            raise TrainingDiverged(f"members {sorted({int(i) % n for i in table.index[table.diverged]})} of {n} diverged")
        return [table.iloc[[k, n + k]].reset_index(drop=True) for k in range(n)]

    def train(self, *, rho_init: float, seed: int, data: Dataset | None = None, desc: str | None = None,
              progress: bool = True, **overrides) -> SquareRun:
        """`train_network` on the page's task (or `data`) with the page's options, `overrides` on top."""
        return train_network(self.data if data is None else data, arch=self.arch, arch_kwargs=self.arch_kwargs,
                             rho_init=rho_init, seed=seed, desc=desc, progress=progress, **self._options(overrides))


def page_setup(dataset: str, classes, *, arch: str, arch_kwargs: dict | None = None, data_root: str = DEFAULT_DATA_ROOT,
               max_train: int = 0, max_test: int = 0, input_shape=(), seed: int = 0, num_samples: int | None = None,
               **options) -> PageSetup:
    """The set-up of a Part III page from its parameters: `load_task` with the pages' conventions (0: all
    samples, an empty `input_shape`: the data's own; `num_samples` only for MNIST-1D) and the training
    options every run of the page shares (`SquareConfig` fields, `num_outputs`; `rho_lr` or `batch_size`
    0: the default). Returns a `PageSetup`."""
    data = load_task(dataset, classes, data_root, max_train or None, max_test or None, shape=list(input_shape) or None,
                     seed=seed, num_samples=num_samples if dataset == "mnist1d" else None)
    unknown = set(options) - {f.name for f in dataclasses.fields(SquareConfig)} - {"num_outputs"}
    if unknown:
        raise ValueError(f"unknown training options {sorted(unknown)} (see SquareConfig)")
    return PageSetup(data, arch, dict(arch_kwargs or {}), dict(options))
