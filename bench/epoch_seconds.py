"""Measure seconds per epoch for the (model, dataset, batch size) combinations of a sweep spec and
record them in bench/epoch_seconds.csv, which `lowrank sweep SPEC --dry-run` reads to estimate a
sweep's cost. One run of `epochs` epochs per combination (the spec's other settings), wall time of
the whole run divided by its epochs (training, evaluation and rank tracking included).

    python bench/epoch_seconds.py sweeps/sgd_batch_size_ci.yaml [--epochs 2]
"""

from __future__ import annotations

import argparse
import csv
import platform
import time
from pathlib import Path

from lowrank.book import sweeps
from lowrank.core import device, train

OUT = Path(__file__).with_name("epoch_seconds.csv")
FIELDS = ["model", "dataset", "batch_size", "seconds_per_epoch", "measured_on"]


def measure(spec_path: str, epochs: int = 2) -> list[dict]:
    spec = sweeps.load_spec(spec_path)
    seen, rows = set(), []
    dev = device.get_device()
    where = f"{dev.type}:{platform.node()}" + (f" ({__import__('torch').cuda.get_device_name()})" if dev.type == "cuda" else "")
    for p in spec.points:
        key = (p["model"], p["dataset"], p["batch_size"])
        if key in seen:
            continue
        seen.add(key)
        point = {k: v for k, v in p.items() if k != "checkpoint"} | {"epochs": epochs}
        t = time.perf_counter()
        train.train_point(**point)
        rows.append({"model": key[0], "dataset": key[1], "batch_size": key[2],
                     "seconds_per_epoch": round((time.perf_counter() - t) / epochs, 4), "measured_on": where})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec")
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args(argv)
    device.reproducible(0)
    rows = measure(args.spec, args.epochs)
    old = list(csv.DictReader(OUT.open())) if OUT.is_file() else []
    new_keys = {(r["model"], r["dataset"], str(r["batch_size"])) for r in rows}
    kept = [r for r in old if (r["model"], r["dataset"], r["batch_size"]) not in new_keys]
    with OUT.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(kept + rows)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
