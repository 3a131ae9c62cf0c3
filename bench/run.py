"""Benchmarks of the book on this machine; writes bench/RESULTS.md (a markdown table).

    .venv/bin/python bench/run.py [--book] [--repeats 5] [--only decomposition ensemble monitors notebooks paper]

Every number is a median over `--repeats` runs of the same measurement, and every ratio is of two
numbers measured in the same invocation. `--book` also times a cold and a warm book build (it
deletes `_build/`, so it takes the full ci build time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lowrank.book import build, pages
from lowrank.core import datasets, device, train
from lowrank.gradients import decomposition  # noqa: E402
from lowrank.core.nets import mlp  # noqa: E402

device.reproducible()

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
    problem = decomposition.spiked_problem(750, 1000, 1250, alpha=0.0, nu=0.375, activation="tanh", seed=0)
    t_dec = median_time(lambda: decomposition.decompose_problem(problem), repeats)
    t_data = median_time(lambda: decomposition.spiked_problem(750, 1000, 1250, alpha=0.0, nu=0.375,
                                                          activation="tanh", seed=0), repeats)
    row("gradient decomposition at paper size (n=750, d=1000, m=1250), seconds", f"{t_dec:.3f}", "< 0.5",
        "yes" if t_dec < 0.5 else "no")
    row("  data, target and weights for it, seconds", f"{t_data:.3f}")
    bench_part_one_work(repeats)


def mf_vs_ntk_work(repeats) -> dict:
    """What bounds mf_vs_ntk at paper scale on this CPU, measured as the paper build runs it (the paper
    file's `product_precision` and `workers`): one n x d x m product on all cores, one Fig. 4 draw (both
    scalings) and one training step as a worker runs them (one thread each when there are several
    workers). The floor is the page's products alone at the all-core product time: nothing else done."""
    from lowrank.book import rules
    from lowrank.core.nets import gamma_m
    from lowrank.gradients import dynamics, mf_vs_ntk

    p = rules.resolve_parameters("gradients/mf_vs_ntk", scale="paper")
    n, d, m, precision = p["n"], p["d"], p["m"], p.get("product_precision", "float64")
    workers, threads = int(p.get("workers", 1)), os.cpu_count() or 1
    torch.set_num_threads(threads)
    dtype = dynamics.PRODUCT_PRECISIONS[precision]
    X, W = torch.randn(n, d, dtype=dtype), torch.randn(m, d, dtype=dtype)
    t_mm = median_time(lambda: X @ W.T, repeats)
    torch.set_num_threads(1 if workers > 1 else threads)
    t_draw = median_time(lambda: dynamics.initial_alignments_by_scaling(n, d, m, product_precision=precision), repeats)
    data, _, y, W0, a = dynamics.single_index_draw(n, d, m, nu=0.0, seed=0)
    steps = 10
    t_run = median_time(lambda: dynamics.train_weight_normalized(
        data.X, y, W0, a, activation="sigmoid", gamma=gamma_m(m, "mf"), steps=steps, X_B=data.X_B,
        snapshot_steps=[0], product_precision=precision, top_k=mf_vs_ntk.TRACE_TOP_K), repeats)
    torch.set_num_threads(threads)
    draws = p["init_repeats"]  # one draw, one product, serves both scalings
    train_steps = (2 + len(p["spike_nus"])) * p["train_repeats"] * (p["steps"] + 1)
    products = draws + 2 * train_steps
    return {"n": n, "d": d, "m": m, "precision": precision, "threads": threads, "workers": workers,
            "product_s": t_mm, "draw_s": t_draw, "step_s": t_run / (steps + 1), "draws": draws,
            "train_steps": train_steps, "products": products, "floor_s": products * t_mm,
            "estimate_s": (draws * t_draw + train_steps * t_run / (steps + 1)) / workers}


def bench_part_one_work(repeats):
    w = mf_vs_ntk_work(repeats)
    row(f"one {w['n']} x {w['d']} x {w['m']} {w['precision']} product, {w['threads']} threads, seconds (GFLOP/s)",
        f"{w['product_s']:.4f} ({2 * w['n'] * w['d'] * w['m'] / w['product_s'] / 1e9:.1f})")
    per = f"in one of {w['workers']} workers" if w["workers"] > 1 else f"{w['threads']} threads"
    row(f"  Fig. 4: one draw, both scalings (data, one product, top-2 singular pairs of each G = A^T B), {per}, "
        "seconds", f"{w['draw_s']:.3f}")
    row(f"  Figs. 5-6: one weight-normalised step (two products, tracked top pairs), {per}, seconds",
        f"{w['step_s']:.3f} ({w['step_s'] / w['product_s']:.1f} all-core products)")
    row(f"  mf_vs_ntk's paper file: {w['draws']} draws + {w['train_steps']} steps = {w['products']} products; "
        f"the products alone (the floor), seconds", f"{w['floor_s']:.0f}", f"<= {PAPER_TARGET_S}",
        "yes" if w["floor_s"] <= PAPER_TARGET_S else "no")
    row(f"  the same at the measured draw and step times over {w['workers']} worker(s), seconds (the page's "
        "bookkeeping and figures come on top)",
        f"{w['estimate_s']:.0f} ({w['estimate_s'] / w['floor_s']:.1f}x the floor)", f"<= {PAPER_TARGET_S}",
        "yes" if w["estimate_s"] <= PAPER_TARGET_S else "no")
    torch.set_num_threads(os.cpu_count() or 1)


def _mlp_bn(data):
    return lambda: mlp.mlp("MLP-BN", depth=10, width=100, in_features=data.x_train.shape[1],
                           num_classes=data.num_classes)


def _runs(k):
    return [{"lr": 0.05, "weight_decay": 5e-4, "momentum": 0.9, "seed": s} for s in range(k)]


def _train_seconds_per_epoch(model_fn, data, k, epochs, **kw):
    """Seconds per epoch of the training steps alone, the run's whole wall time, its timings."""
    t = time.perf_counter()
    table = train.train_ensemble(model_fn, data, _runs(k), batch_size=32, epochs=epochs, progress=False, **kw)
    return table.attrs["seconds"]["train"] / epochs, time.perf_counter() - t, table.attrs["seconds"]


def _plain_torch_seconds_per_epoch(model_fn, data, epochs):
    """The baseline a sequential run could at best be: one nn.Module, torch.optim.SGD, no monitors."""
    torch.manual_seed(0)
    net = model_fn()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(0)
    n = data.x_train.shape[0]
    t = time.perf_counter()
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        net.train()
        for s in range(n // 32):
            idx = perm[s * 32:(s + 1) * 32]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(data.x_train[idx]), data.y_train[idx]).backward()
            opt.step()
    return (time.perf_counter() - t) / epochs


def _in_training_step(func, args, kwargs) -> bool:
    """Whether an operation belongs to a training step: the forward of the differentiated loss (grad
    mode on and an input requires grad), its backward (autograd is executing a node) or the SGD update (the
    `_foreach_` operations). Evaluation and the rank tracking do neither."""
    if torch._C._current_autograd_node() is not None or func.__name__.startswith("_foreach_"):
        return True
    if not torch.is_grad_enabled():
        return False
    leaves = [*args, *(kwargs or {}).values()]
    while leaves:
        x = leaves.pop()
        if isinstance(x, torch.Tensor) and x.requires_grad:
            return True
        if isinstance(x, (list, tuple)):
            leaves.extend(x)
    return False


class _KernelTimer(TorchDispatchMode):
    """Times the ATen operations (the kernels, forward and backward) of the training steps from
    below autograd, so the Python and autograd bookkeeping between them is left out. Each time is a
    sum of non-negative durations (no difference of two runs), so it cannot come out negative."""

    def __init__(self):
        super().__init__()
        self.seconds, self.calls, self.skipped = 0.0, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not _in_training_step(func, args, kwargs):
            self.skipped += 1
            return func(*args, **(kwargs or {}))
        t = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.seconds += time.perf_counter() - t
        self.calls += 1
        return out


def _kernel_seconds_per_epoch(model_fn, data, k, epochs=2):
    """Kernel seconds per epoch of `train_ensemble`'s training steps for K models: only the
    operations of the steps are timed (`_in_training_step`); evaluation and rank tracking are not.
    The batch gathers `x[idx]` are left out too, and the few setup operations on the parameters
    (stacking the members) are in, spread over the epochs. Returns (seconds per epoch, operations timed)."""
    with _KernelTimer() as timer:
        train.train_ensemble(model_fn, data, _runs(k), batch_size=32, epochs=epochs, progress=False,
                             eval_every=epochs + 1)
    return timer.seconds / epochs, timer.calls


def bench_ensemble(repeats, ks=(4, 16, 64), epochs=3):
    """Rounds of: one `train` run, one plain torch loop, each ensemble; every ratio is taken within a
    round (this machine's speed drifts by tens of percent between minutes) and reported as the
    median over rounds with its range."""
    data = datasets.digits()
    model_fn = _mlp_bn(data)
    _train_seconds_per_epoch(model_fn, data, 1, 1)  # warm-up
    rounds = []
    for _ in range(repeats):
        one, wall_one, _ = _train_seconds_per_epoch(model_fn, data, 1, epochs)
        plain = _plain_torch_seconds_per_epoch(model_fn, data, epochs)
        ens = {k: _train_seconds_per_epoch(model_fn, data, k, epochs)[:2] for k in ks}
        rounds.append((one, wall_one, plain, ens))
    med = lambda xs: statistics.median(xs)  # noqa: E731
    spread = lambda xs: f"{med(xs):.2f}x (range {min(xs):.2f}-{max(xs):.2f})"  # noqa: E731
    t_one, t_plain = med(r[0] for r in rounds), med(r[2] for r in rounds)
    row("one MLP-BN-10-100 (digits, B=32, momentum 0.9): training seconds per epoch, `train` / plain torch loop",
        f"{t_one:.3f} / {t_plain:.3f}")
    for k in ks:
        t_ens = med(r[3][k][0] for r in rounds)
        r_own = [k * r[0] / r[3][k][0] for r in rounds]
        r_plain = [k * r[2] / r[3][k][0] for r in rounds]
        r_wall = [k * r[1] / r[3][k][1] for r in rounds]
        target = ">= 5x at K=16" if k == 16 else ""
        meets = lambda rs: ("yes" if med(rs) >= 5 else "no") if k == 16 else ""  # noqa: E731
        row(f"ensemble of {k} vs {k} sequential `train` runs, training steps: throughput ratio "
            f"({t_ens:.3f} s per ensemble epoch)", spread(r_own), target, meets(r_own))
        row(f"ensemble of {k} vs {k} sequential plain torch loops, training steps: throughput ratio",
            spread(r_plain), target, meets(r_plain))
        row(f"ensemble of {k} vs {k} sequential `train` runs, whole {epochs}-epoch runs with monitors: ratio",
            spread(r_wall))
        if k == 16:
            # one thread each: a single small-model run keeps only one core busy (its time barely changes),
            # so on two cores two sequential runs could go side by side
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            per_core = [k * _plain_torch_seconds_per_epoch(model_fn, data, epochs)
                        / _train_seconds_per_epoch(model_fn, data, k, epochs)[0] for _ in range(repeats)]
            torch.set_num_threads(threads)
            row(f"  per core: ensemble of {k} vs {k} plain torch loops, both on one thread", spread(per_core))
        floor = statistics.median(_kernel_seconds_per_epoch(model_fn, data, k)[0] for _ in range(max(1, repeats // 2)))
        if not 0 < floor < t_ens:  # the bench's own sanity check (wall-clock: here, not in the unit tests)
            row(f"  WARNING: kernel time {floor:.3f} s is not between 0 and the steps' {t_ens:.3f} s per epoch "
                f"(a loaded machine?)", "")
        row(f"  ceiling for {k}: the kernels of the ensemble's training steps alone (every operation timed, "
            f"Python and autograd bookkeeping left out) take {floor:.3f} s per epoch, so with these kernels no "
            f"ensemble beats {k} plain loops by more than", f"{k * t_plain / floor:.1f}x")


def bench_monitors(repeats, ks=(1, 16), epochs=5):
    """Shares of an epoch's training time, from the timings `train_ensemble` records."""
    data = datasets.digits()
    model_fn = _mlp_bn(data)
    _train_seconds_per_epoch(model_fn, data, 1, 1)  # warm-up
    for k in ks:
        shares = []
        for _ in range(repeats if k == 1 else max(1, repeats // 2)):
            per_epoch, _, sec = _train_seconds_per_epoch(model_fn, data, k, epochs)
            # the monitors run after every epoch and once at initialisation
            shares.append((sec["track_ranks"] / (epochs + 1) / per_epoch, sec["evaluate"] / (epochs + 1) / per_epoch))
        ranks, evaluation = (statistics.median(x) for x in zip(*shares))
        row(f"rank tracking (singular values, ranks, norms, distances of the 11 weight matrices) per epoch, "
            f"share of the epoch's training time, {k} MLP-BN-10-100 (digits, B=32)", f"{100 * ranks:.1f} %",
            "<= 5 %", "yes" if ranks <= 0.05 else "no")
        row(f"  evaluation (train and test loss and accuracy, `eval_every=1`) per epoch, share, {k} model(s)",
            f"{100 * evaluation:.1f} %")


def bench_notebooks():
    for path in sorted(pages.EXECUTED.rglob("*.ipynb")):
        meta = json.loads(path.read_text())["metadata"].get("lowrank", {})
        wall = meta.get("wall_s")
        if wall is not None:
            name = path.relative_to(pages.EXECUTED).with_suffix("").as_posix()
            row(f"notebook {name} at ci scale (last build, 2 at once), seconds", f"{wall:.1f}", "<= 60",
                "yes" if wall <= 60 else "no")


PAGE_SECONDS = pages.PAGE_SECONDS
CI_TABLE_START = "<!-- ci timings: bench/run.py --only ci -->"
PAGE_TARGET_S, BOOK_TARGET_S, CI_TARGET_S = 30, 180, 900  # issue 50: per page, the cold ci book, .ci/run


def _replace_between(path: Path, start_marker: str, body: str, end_marker: str = "<!-- end -->") -> None:
    text = path.read_text()
    start = text.index(start_marker) + len(start_marker)
    end = text.index(end_marker, start)
    path.write_text(text[:start] + "\n" + body + "\n" + text[end:])


def bench_ci(build_dir: Path, readme: Path = ROOT / "README.md", page_seconds: Path = PAGE_SECONDS):
    """The stages of the last `.ci/run` (`_build/ci-times.txt`) and the ci pages' execution seconds of
    that build, into README's ci table: one run's numbers, each page also as a share of the whole."""
    stages = [line.split() for line in (build_dir / "ci-times.txt").read_text().splitlines() if line.strip()]
    pages = {}
    for path in sorted((build_dir / "executed").rglob("*.ipynb")):
        wall = json.loads(path.read_text())["metadata"].get("lowrank", {}).get("wall_s")
        if wall is not None:
            pages[path.relative_to(build_dir / "executed").with_suffix("").as_posix()] = wall
    total_ci = sum(int(s) for _, s in stages)
    total_pages = sum(pages.values())
    # two kernels at a time: no schedule finishes the pages in less than this
    floor = max(total_pages / 2, max(pages.values(), default=0.0))
    lines = ["| measured | seconds | target | share |", "|---|---|---|---|"]
    lines += [f"| `.ci/run` stage: {name} | {int(secs)} | | {int(secs) / total_ci:.0%} |" for name, secs in stages]
    lines.append(f"| `.ci/run` in all | {total_ci} | <= {CI_TARGET_S} | |")
    lines.append(f"| ci pages' execution, summed over pages | {total_pages:.0f} | | |")
    lines.append(f"| floor of the ci book's execution on 2 workers (max of sum / 2, slowest page) | {floor:.0f} | "
                 f"<= {BOOK_TARGET_S} with rendering | |")
    lines += [f"| page {name} | {wall:.1f} | <= {PAGE_TARGET_S} | {wall / total_pages:.0%} |"
              for name, wall in sorted(pages.items(), key=lambda kv: -kv[1])]
    stamp = time.strftime("%Y-%m-%d", time.localtime((build_dir / "ci-times.txt").stat().st_mtime))
    body = f"Measured by one `.ci/run` on a fresh clone, {stamp}, {os.cpu_count()} CPU cores.\n\n" + "\n".join(lines)
    _replace_between(readme, CI_TABLE_START, body)
    # the build's schedule (lowrank.book.pages.longest_first) reads these on a fresh clone
    page_seconds.write_text("page,seconds\n" + "".join(f"{n},{w:.1f}\n" for n, w in sorted(pages.items())))
    for name, secs in stages:
        row(f".ci/run stage {name}, seconds", secs)
    row(".ci/run in all, seconds", str(total_ci), f"<= {CI_TARGET_S}", "yes" if total_ci <= CI_TARGET_S else "no")


PAPER_TABLE_START, PAPER_TABLE_END = "<!-- paper-scale timings: bench/run.py --only paper -->", "<!-- end -->"
PAPER_TARGET_S, PART_I_TARGET_S = 180, 900  # issue 32: each Part I notebook, and all that can run together, on 2 cores


def bench_paper():
    """Paper-scale wall times of the stored results (results/paper/, measured by `make paper`), and
    the cost line of every paper file regenerated from them."""
    from lowrank.book import notebooks, paper_results

    part_one = []
    for name in notebooks.list_notebooks():
        paper_results.write_cost_line(name)
        r = paper_results.paper_results(name)
        if r is None or r["parameters_stale"]:
            continue
        p = r["provenance"]
        load = (p.get("load_at_start") or {}).get("load_average_1m")
        where = f"{p['device']}, load {load:g}" if load is not None else p["device"]
        target = f"<= {PAPER_TARGET_S}" if name.startswith("gradients/") else ""
        meets = ("yes" if p["wall_s"] <= PAPER_TARGET_S else "no") if target else ""
        row(f"notebook {name} at paper scale (stored result, {where}), seconds", f"{p['wall_s']:.0f}", target, meets)
        if name.startswith("gradients/"):
            part_one.append(p["wall_s"])
    table = paper_results.timing_table()
    stored = paper_results.paper_results("gradients/mf_vs_ntk")
    if stored is not None and not stored["parameters_stale"]:  # the one page with a floor: its products alone
        w = mf_vs_ntk_work(3)
        wall = stored["provenance"]["wall_s"]
        table += (f"\n\n`gradients/mf_vs_ntk`'s floor on this machine: its {w['products']} products of "
                  f"{w['n']} x {w['d']} x {w['m']} in {w['precision']} on {w['threads']} threads take "
                  f"{w['floor_s']:.0f} s alone ({w['product_s']:.4f} s each, measured by this bench run, "
                  f"{time.strftime('%Y-%m-%d')}); the stored run took {wall / w['floor_s']:.1f}x the floor.")
    readme = ROOT / "README.md"
    text = readme.read_text()
    start, end = text.index(PAPER_TABLE_START) + len(PAPER_TABLE_START), text.index(PAPER_TABLE_END)
    readme.write_text(text[:start] + "\n" + table + "\n" + text[end:])
    if part_one:
        from lowrank.book import build, rules

        runnable = [n for n in notebooks.list_notebooks() if n.startswith("gradients/") and build.missing_data(
            n, rules.resolve_parameters(n, scale="paper")) is None]  # the others need a data set not fetched here
        total = sum(part_one)
        row(f"Part I at paper scale, {len(part_one)} stored notebooks together, seconds", f"{total:.0f}",
            f"<= {PART_I_TARGET_S} (all {len(runnable)} with their data here)",
            "yes" if total <= PART_I_TARGET_S and len(part_one) == len(runnable) else "no")


def bench_book():
    env = {**os.environ}
    shutil.rmtree(pages.BUILD, ignore_errors=True)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lowrank.book.build"], cwd=ROOT, env=env, check=True, capture_output=True)
    cold = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lowrank.book.build"], cwd=ROOT, env=env, check=True, capture_output=True)
    warm = time.perf_counter() - t
    row("book build, cold (every notebook executed), seconds", f"{cold:.0f}", "< 600", "yes" if cold < 600 else "no")
    row("book build, warm (nothing changed), seconds", f"{warm:.1f}", "< 30", "yes" if warm < 30 else "no")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--book", action="store_true", help="also time a cold and a warm book build")
    ap.add_argument("--only", nargs="+", choices=["decomposition", "ensemble", "monitors", "notebooks", "paper", "ci"])
    ap.add_argument("--ci-build", type=Path, default=pages.BUILD,
                    help="the _build folder of a finished `.ci/run` (for --only ci; default this checkout's)")
    args = ap.parse_args()
    chosen = set(args.only or ["decomposition", "ensemble", "monitors", "notebooks", "paper"])
    if args.book:
        bench_book()
    if "decomposition" in chosen:
        bench_decomposition(args.repeats)
    if "monitors" in chosen:
        bench_monitors(args.repeats)
    if "ensemble" in chosen:
        bench_ensemble(args.repeats)
    if "notebooks" in chosen:
        bench_notebooks()
    if "paper" in chosen:
        bench_paper()
    if "ci" in chosen:
        bench_ci(args.ci_build)
    machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, " \
              f"{torch.get_num_threads()} threads"
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {machine} (`bench/run.py`, medians of {args.repeats}).", "",
             "| measurement | value | target | meets |", "|---|---|---|---|"]
    lines += [f"| {w} | {m} | {t} | {k} |" for w, m, t, k in ROWS]
    if chosen == {"ci"} and not args.book:
        return  # the ci table lives in README only: RESULTS.md keeps the last full bench
    out = ROOT / "bench" / "RESULTS.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
