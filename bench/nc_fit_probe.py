"""Whether square/neural_collapse's multiclass runs fit their training set, by MLP width and run length.

Lemma 7 and Theorem 6 assume a network "overparameterized enough to attain 100% accuracy" (Xu et al. 2023,
l.609). This probe trains the page's multiclass task at a scale's parameters (default the laptop file's: lam, lr,
rho_lr, epochs) with two hidden layers of each width given, seed 0, and records only the final train error of each
arm: the full-batch arm ("trained"), the SGD arm the claims are read on (B = sgd_batch_size) and the lambda = 0
control. It computes no NC metric (nc=False), so a width or run length is chosen from the fit alone. The table it
writes (`--write`, bench/nc_fit_probe.csv; rows measured again replace the old ones) is what
`lowrank.square.sizing.fit_probe_summary` reads for the laptop file and the page.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/nc_fit_probe.py [--scale laptop] [--widths 128 256]
        [--epochs 200 1000] [--write]
"""

from __future__ import annotations

import argparse
import time

import pandas as pd
import torch

from lowrank.book import rules
from lowrank.core import device
from lowrank.square import pages, sizing

PAGE = "square/neural_collapse"
KEY = ["scale", "seed", "width", "epochs", "arm"]


def probe(width: int, epochs: int, seed: int, params: dict, scale: str) -> list[dict]:
    """One row per arm: the final train error of the multiclass task with two hidden layers of `width`."""
    p = params
    S = pages.page_setup(p["dataset"], p["multiclass_classes"], arch=p["arch"], arch_kwargs={"widths": [width, width]},
                         data_root=p["data_root"], max_train=p["max_train"], max_test=p["max_test"],
                         input_shape=p["input_shape"], seed=seed, num_outputs=len(p["multiclass_classes"]), epochs=epochs,
                         lr=p["lr"], rho_lr=p["rho_lr"], batch_size=p["batch_size"], momentum=p["momentum"],
                         schedule=p["schedule"], log_every=epochs, nc=False, dtype=p["dtype"])
    arms = {"trained": (p["lam"], p["batch_size"]), "SGD": (p["lam"], p["sgd_batch_size"]), "lambda = 0": (0.0, p["batch_size"])}
    rows = []
    for arm, (lam, batch_size) in arms.items():
        t0 = time.process_time()
        run = S.train(rho_init=p["rho_init"], seed=seed, lam=lam, batch_size=batch_size, progress=False)
        rows.append({"scale": scale, "seed": seed, "width": width, "epochs": epochs, "arm": arm, "lam": lam,
                     "batch_size": batch_size, "n_train": len(S.data.y_train),
                     "train_error": float(run.history.iloc[-1].train_error), "cpu_s": round(time.process_time() - t0, 1)})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", choices=["ci", "laptop"], default="laptop")
    ap.add_argument("--widths", type=int, nargs="+", default=[128, 256, 512, 1024])
    ap.add_argument("--epochs", type=int, nargs="+", default=None, help="run lengths (default: the scale's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", action="store_true", help=f"add the rows to {sizing.NC_FIT_PROBE}")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    device.reproducible()
    params = rules.resolve_parameters(PAGE, scale=args.scale, memory=False)
    print(f"{PAGE}, multiclass {params['multiclass_classes']} on {params['dataset']}, {args.scale} parameters: "
          f"lam {params['lam']:g}, lr {params['lr']:g}, rho_lr {params['rho_lr']:g}, seed {args.seed}")
    print(f"{'width':>6} {'epochs':>6}  {'arm':<10} {'B':>4} {'train error':>11} {'CPU s':>7}")
    rows = []
    for epochs in args.epochs or [params["epochs"]]:
        for width in args.widths:
            for r in probe(width, epochs, args.seed, params, args.scale):
                rows.append(r)
                print(f"{r['width']:>6} {r['epochs']:>6}  {r['arm']:<10} {r['batch_size'] or 'all':>4} "
                      f"{r['train_error']:>11.4f} {r['cpu_s']:>7.1f}", flush=True)
    if args.write:
        new = pd.DataFrame(rows)
        old = pd.read_csv(sizing.NC_FIT_PROBE) if sizing.NC_FIT_PROBE.is_file() else new.iloc[:0]
        kept = old[~old.set_index(KEY).index.isin(new.set_index(KEY).index)]
        pd.concat([kept, new]).sort_values(KEY).to_csv(sizing.NC_FIT_PROBE, index=False)
        print(f"wrote {sizing.NC_FIT_PROBE}")


if __name__ == "__main__":
    main()
