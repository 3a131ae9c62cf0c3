"""Measure seconds per epoch on this machine and record them in bench/epoch_seconds.csv, which the
laptop files (`lowrank.book.laptop`), `lowrank sweep SPEC --dry-run` and `lowrank run --dry-run` read
through `lowrank.book.costs`. One thread (`--threads`), short measurements:

Times are this process's CPU seconds (`time.process_time`, one torch thread), not wall time: on a
shared machine (this project's 2 cores serve several sessions) the wall time of a short measurement
says more about the neighbours than about the network; on an idle core the two agree. On a GPU, wall
time after `torch.cuda.synchronize()`.

- `--pages [--page NAME ...]`: each laptop-sized page's training (or the pages named), one row per batch size: every run of the page at that
  batch size trained together (as the page trains them), the page's own settings; seconds per epoch =
  (time of 3 epochs - time of 1 epoch) / 2, so set-up is left out and evaluation and rank tracking are in.
- `--architectures`: every (model, dataset, batch size) of the sweep specs (sweeps/*.yaml: the paper's
  Part II architectures), one member: `--steps` SGD steps on random inputs of the data set's shape after
  one warm-up step, times the steps of an epoch (floor(n_train / B)); evaluation and rank tracking
  are left out, so this is a lower bound of a training epoch.

    python bench/epoch_seconds.py [--pages] [--architectures] [--steps 3] [--threads 1]

Rows measured again replace the old ones (same model, dataset, batch size, members, device).
"""

from __future__ import annotations

import argparse
import csv
import glob
import platform
import time
from pathlib import Path

import torch

from lowrank.book import costs, laptop, rules, sweeps
from lowrank.core import datasets, device
from lowrank.sgd import ranks

OUT = costs.EPOCH_SECONDS
REPO = Path(__file__).resolve().parents[1]
FIELDS = costs.FIELDS + ["load", "method"]
# the training sets' sizes and input shapes of the paper's data sets (read from disk only at paper scale)
PAPER_DATA = {"cifar10": (50_000, (3, 32, 32), 10), "mnist": (60_000, (1, 28, 28), 10)}


def _where(threads: int) -> tuple[str, str, str]:
    """(device kind, where, load): the host with its GPU or thread count and the day, and the machine's
    1-minute load average on its CPUs when measured (the `load` column)."""
    from lowrank.core.io import machine_load

    dev = device.get_device()
    load = machine_load()
    day = time.strftime("%Y-%m-%d")
    at = f"{load.get('load_average_1m')} on {load.get('cpus')} CPUs"
    if dev.type == "cuda":
        return "cuda", f"cuda:{platform.node()} ({torch.cuda.get_device_name()}, {day})", at
    return "cpu", f"cpu:{platform.node()} ({threads} thread{'s' if threads != 1 else ''}, CPU seconds, {day})", at


def _clock() -> float:
    """CPU seconds of this process on the CPU (see the module's docstring), wall seconds on a GPU."""
    return time.perf_counter() if device.get_device().type == "cuda" else time.process_time()


def _rank_ensembles(p: dict, grid: list[dict]):
    """A rank page's training: (dataset, B, members, train(epochs)) per batch size, as the page trains it."""
    for B in sorted({g["batch_size"] for g in grid}):
        group = [g for g in grid if g["batch_size"] == B]
        yield p["model"], p["dataset"], B, len(group), lambda epochs, group=group: ranks.rank_sweep(
            model=p["model"], dataset=p["dataset"], grid=group, epochs=epochs, cnn_width=p.get("cnn_width", 1.0),
            eps=p["eps"], extra_eps=(p.get("coarse_eps", min(10 * p["eps"], 0.5)),), loss="ce", layers=ranks.authors_layers, progress=False,
            milestones=p["milestones"], lr_decay=p["lr_decay"])


def _noise_ensembles(p: dict, grid: list[dict]):
    """SGD noise's training (notebooks/sgd/sgd_noise.md): one ensemble of every lambda per data set, one loss."""
    from lowrank.core import train
    from lowrank.sgd import noise
    from lowrank.core.nets import mlp

    for key in ("dataset", "second_dataset"):
        runs = noise.page_runs(lr=p["lr"], weight_decays=p["weight_decays"], momentum=p["momentum"], seed=p["seed"],
                               seed_pair=key == "dataset")
        data = datasets.load(p[key])
        make = lambda data=data: mlp.from_name(p["model"], int(data.x_train[0].numel()), data.num_classes)  # noqa: E731
        yield p["model"], p[key], p["batch_size"], len(runs), lambda epochs, make=make, data=data: train.train_ensemble(
            make, data, runs, batch_size=p["batch_size"], epochs=epochs, loss=p["losses"][0], eps=p["eps"], progress=False)


def _architectures_ensembles(p: dict, grid: list[dict]):
    """sgd/architectures' MLP and RES-BN sweeps (the sized part of the page): each network's runs at one batch
    size trained together, as the page trains them."""
    for model in (p["res_bn_model"], p["mlp_model"]):
        mine = list({tuple(sorted((k, v) for k, v in g.items() if k != "slice")): {k: v for k, v in g.items() if k != "slice"}
                     for g in grid if g["slice"].startswith(model + " ")}.values())
        for B in sorted({g["batch_size"] for g in mine}):
            group = [g for g in mine if g["batch_size"] == B]
            yield model, p["dataset"], B, len(group), lambda epochs, model=model, group=group: ranks.rank_sweep(
                model=model, dataset=p["dataset"], grid=group, epochs=epochs, eps=p["mlp_eps"], extra_eps=(1e-2,),
                loss="ce", layers=ranks.authors_layers, progress=False, milestones=p["milestones"], lr_decay=p["lr_decay"])


ENSEMBLES = {"sgd/sgd_noise": _noise_ensembles, "sgd/architectures": _architectures_ensembles}  # the others are rank pages


def measure_pages(threads: int, only=None) -> list[dict]:
    """One row per (sized page, data set, batch size): the page's ensemble there, 3 epochs minus 1
    (`only`: these pages)."""
    rows = []
    for name in only or laptop.SIZED_PAGES:
        p = rules.resolve_parameters(name, scale="laptop" if (REPO / "params" / "laptop" / f"{name}.yaml").is_file() else "ci")
        for model, dataset, B, members, fit in ENSEMBLES.get(name, _rank_ensembles)(p, laptop.page_grid(name, p)):
            walls = {}
            for epochs in (1, 3):
                t = _clock()
                fit(epochs)
                walls[epochs] = _clock() - t
            seconds = max((walls[3] - walls[1]) / 2, 0.0)
            kind, where, load = _where(threads)
            rows.append({"model": model, "dataset": dataset, "batch_size": B, "members": members,
                         "device": kind, "seconds_per_epoch": round(seconds, 4), "measured_on": where, "load": load,
                         "method": f"{name}: its ensemble at B = {B}, (3 epochs - 1 epoch) / 2"})
            print(rows[-1], flush=True)
    return rows


def _architecture_combos() -> list[dict]:
    seen = {}
    for path in sorted(glob.glob(str(REPO / "sweeps" / "*.yaml"))):
        spec = sweeps.load_spec(path)
        for p in spec.points:
            if p.get("model") and p.get("dataset") and p.get("batch_size"):
                seen.setdefault((p["model"], p["dataset"], int(p["batch_size"])), p)
    return [seen[k] for k in sorted(seen)]


def measure_architectures(threads: int, steps: int) -> list[dict]:
    """One row per (model, dataset, batch size) of the sweep specs: `steps` SGD steps after a warm-up."""
    from lowrank.core.nets import zoo

    dev = device.get_device()
    rows = []
    for p in _architecture_combos():
        if p["dataset"] in PAPER_DATA:
            n_train, shape, classes = PAPER_DATA[p["dataset"]]
        else:  # the bundled and generated sets: their own sizes
            local = datasets.load(p["dataset"])
            n_train, shape, classes = local.x_train.shape[0], tuple(local.x_train.shape[1:]), local.num_classes
        B = int(p["batch_size"])
        x = torch.randn(B, *shape)
        y = torch.randint(0, classes, (B,))
        fake = datasets.Dataset(x, y, x[:1], y[:1], classes, p["dataset"])
        make, data = zoo.for_data(p["model"], fake, cnn_width=p.get("cnn_width", 1.0), vit_dim=p.get("vit_dim", 512),
                                  vit_depth=p.get("vit_depth", 6))
        net = make().to(dev)
        xs, ys = data.x_train.to(dev), data.y_train.to(dev)
        opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=p.get("momentum", 0.0))
        loss_fn = torch.nn.CrossEntropyLoss()

        def step():
            opt.zero_grad(set_to_none=True)
            loss_fn(net(xs), ys).backward()
            opt.step()

        step()  # warm-up: allocation, kernel selection
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = _clock()
        for _ in range(steps):
            step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        per_step = (_clock() - t) / steps
        kind, where, load = _where(threads)
        rows.append({"model": p["model"], "dataset": p["dataset"], "batch_size": B, "members": 1, "device": kind,
                     "seconds_per_epoch": round(per_step * (n_train // B), 4), "measured_on": where, "load": load,
                     "method": f"{steps} SGD steps on random inputs x {n_train // B} steps per epoch (no evaluation, "
                               "no rank tracking: a lower bound)"})
        print(rows[-1], flush=True)
    return rows


def write(rows: list[dict], out: Path = OUT) -> None:
    key = lambda r: (r["model"], r["dataset"], str(r["batch_size"]), str(r.get("members") or 1), r.get("device") or "cpu")
    old = list(csv.DictReader(out.open())) if out.is_file() else []
    new = {key(r) for r in rows}
    kept = [r for r in old if key(r) not in new]
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(kept + rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", action="store_true", help="the laptop-sized pages' ensembles")
    ap.add_argument("--page", action="append", choices=sorted(laptop.SIZED_PAGES), help="with --pages: only this page (repeatable)")
    ap.add_argument("--architectures", action="store_true", help="the sweep specs' (model, dataset, batch size)")
    ap.add_argument("--steps", type=int, default=3, help="timed SGD steps per architecture (default 3)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.threads < 1:
        ap.error("--steps and --threads must be positive")
    device.reproducible(0, cpu_threads=args.threads)
    both = not (args.pages or args.architectures)
    rows = (measure_pages(args.threads, args.page) if args.pages or both else []) + \
           (measure_architectures(args.threads, args.steps) if args.architectures or both else [])
    write(rows)
    print(f"wrote {len(rows)} rows to {OUT}")


if __name__ == "__main__":
    main()
