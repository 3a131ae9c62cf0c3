"""Benchmarks of the book on this machine; writes bench/RESULTS.md (a markdown table).

    .venv/bin/python bench/run.py [--book] [--repeats 5] [--only decomposition ensemble monitors notebooks]

Every number is a median over `--repeats` runs of the same measurement, and every ratio is of two
numbers measured in the same invocation. `--book` also times a cold and a warm book build (it
deletes `_build/`, so it takes the full ci build time).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lowrank import build, datasets, gradients, train  # noqa: E402
from lowrank.nets import mlp  # noqa: E402

ROWS: list[tuple[str, str, str, str]] = []  # (what, measured, target, meets)


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def row(what, measured, target="", meets=""):
    ROWS.append((what, measured, target, meets))
    print(f"{what}: {measured} {target} {meets}", flush=True)


def bench_decomposition(repeats):
    problem = gradients.spiked_problem(750, 1000, 1250, alpha=0.0, nu=0.375, activation="tanh", seed=0)
    t_dec = median_time(lambda: gradients.decompose_problem(problem), repeats)
    t_data = median_time(lambda: gradients.spiked_problem(750, 1000, 1250, alpha=0.0, nu=0.375,
                                                          activation="tanh", seed=0), repeats)
    row("gradient decomposition at paper size (n=750, d=1000, m=1250), seconds", f"{t_dec:.3f}", "< 0.5",
        "yes" if t_dec < 0.5 else "no")
    row("  data, target and weights for it, seconds", f"{t_data:.3f}")


def _mlp_bn(data):
    return lambda: mlp.mlp("MLP-BN", depth=10, width=100, in_features=data.x_train.shape[1],
                           num_classes=data.num_classes)


def bench_ensemble(repeats, ks=(4, 16, 64), epochs=1):
    data = datasets.digits()
    model_fn = _mlp_bn(data)
    runs = lambda k: [{"lr": 0.05, "weight_decay": 5e-4, "seed": s} for s in range(k)]  # noqa: E731
    t_one = median_time(lambda: train.train(model_fn, data, lr=0.05, batch_size=32, epochs=epochs,
                                            weight_decay=5e-4, seed=0, progress=False), repeats)
    for k in ks:
        t_ens = median_time(lambda: train.train_ensemble(model_fn, data, runs(k), batch_size=32, epochs=epochs,
                                                         progress=False), max(1, repeats // 2))
        speedup = k * t_one / t_ens
        row(f"ensemble of {k} MLP-BN-10-100 (digits, B=32, {epochs} epoch) vs {k} sequential runs: throughput ratio",
            f"{speedup:.2f}x ({t_ens:.2f} s vs {k} x {t_one:.2f} s)", ">= 5x at K=16" if k == 16 else "",
            ("yes" if speedup >= 5 else "no") if k == 16 else "")


def bench_monitors(epochs=3):
    data = datasets.digits()
    prof = cProfile.Profile()
    prof.enable()
    train.train(_mlp_bn(data), data, lr=0.05, batch_size=32, epochs=epochs, weight_decay=5e-4, seed=0, progress=False)
    prof.disable()
    stats = pstats.Stats(prof)
    total = monitor = svd = 0.0
    for (file, _, func), (_, _, _, cum, _) in stats.stats.items():
        if func == "train_ensemble" and file.endswith("train.py"):
            total = max(total, cum)
        if func == "monitor" and file.endswith("train.py"):
            monitor += cum
        if "svdvals" in func:
            svd += cum
    row(f"monitors' share of training time (MLP-BN-10-100, digits, {epochs} epochs + init)",
        f"{100 * monitor / total:.1f} % (all monitors), {100 * svd / total:.1f} % (singular values)", "<= 5 %",
        "yes" if monitor / total <= 0.05 else "no")


def bench_notebooks():
    for path in sorted(build.EXECUTED.rglob("*.ipynb")):
        meta = json.loads(path.read_text())["metadata"].get("lowrank", {})
        wall = meta.get("wall_s")
        if wall is not None:
            name = path.relative_to(build.EXECUTED).with_suffix("").as_posix()
            row(f"notebook {name} at ci scale (last build, 2 at once), seconds", f"{wall:.1f}", "<= 60",
                "yes" if wall <= 60 else "no")


def bench_book():
    env = {**os.environ}
    shutil.rmtree(build.BUILD, ignore_errors=True)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lowrank.build"], cwd=ROOT, env=env, check=True, capture_output=True)
    cold = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lowrank.build"], cwd=ROOT, env=env, check=True, capture_output=True)
    warm = time.perf_counter() - t
    row("book build, cold (every notebook executed), seconds", f"{cold:.0f}", "< 600", "yes" if cold < 600 else "no")
    row("book build, warm (nothing changed), seconds", f"{warm:.1f}", "< 30", "yes" if warm < 30 else "no")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--book", action="store_true", help="also time a cold and a warm book build")
    ap.add_argument("--only", nargs="+", choices=["decomposition", "ensemble", "monitors", "notebooks"])
    args = ap.parse_args()
    chosen = set(args.only or ["decomposition", "ensemble", "monitors", "notebooks"])
    if args.book:
        bench_book()
    if "decomposition" in chosen:
        bench_decomposition(args.repeats)
    if "monitors" in chosen:
        bench_monitors()
    if "ensemble" in chosen:
        bench_ensemble(args.repeats)
    if "notebooks" in chosen:
        bench_notebooks()
    machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, " \
              f"{torch.get_num_threads()} threads"
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {machine} (`bench/run.py`, medians of {args.repeats}).", "",
             "| measurement | value | target | meets |", "|---|---|---|---|"]
    lines += [f"| {w} | {m} | {t} | {k} |" for w, m, t, k in ROWS]
    out = ROOT / "bench" / "RESULTS.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
