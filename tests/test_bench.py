"""The benchmark scripts run (the GPU script at tiny sizes on this device)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_script_smoke(tmp_path):
    out = tmp_path / "gpu.md"
    subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--smoke", "--out", str(out)], check=True,
                   capture_output=True, text=True)
    text = out.read_text()
    for model in ("MLP-BN-2-16", "VGG-16", "ResNet-18", "ViT"):
        assert f"{model}, one epoch" in text and f"{model}: mixed vs float32" in text
    assert "throughput ratio" in text and "via the CPU" in text and "gradients/decomposition" in text


@pytest.mark.slow
def test_gpu_script_refuses_to_time_a_cpu_as_a_gpu():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py")], capture_output=True, text=True,
                          env={"LOWRANK_DEVICE": "cpu", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "no GPU here" in done.stderr


def _bench():
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.slow
def test_kernel_timer_counts_the_training_steps_only():
    """The ensemble ceiling's kernel timer counts the operations of the training steps (forward,
    backward, update) and none of evaluation or rank tracking: every epoch adds the same count
    (monitors run after each epoch, so a counted monitor would show as a difference), and a forward
    pass without gradients counts nothing. Counts, not times: no wall-clock inequality here
    (the bench itself checks that the time lies between 0 and the steps' wall time)."""
    import torch

    from lowrank.core import datasets
    from lowrank.core.nets import mlp

    bench = _bench()
    data = datasets.digits()
    model_fn = lambda: mlp.mlp("MLP-BN", depth=2, width=16, in_features=data.x_train.shape[1],  # noqa: E731
                               num_classes=data.num_classes)
    timed = [bench._kernel_seconds_per_epoch(model_fn, data, 1, epochs=e) for e in (1, 2, 3)]
    calls = [c for _, c in timed]
    assert calls[2] - calls[1] == calls[1] - calls[0] > 0
    assert all(seconds >= 0 for seconds, _ in timed)  # sums of durations
    net = model_fn()
    with bench._KernelTimer() as timer, torch.no_grad():
        net(data.x_train[:64])
    assert timer.calls == 0 and timer.skipped > 0


def test_ci_table_comes_from_one_ci_run(tmp_path):
    """README's ci table is written from one `.ci/run`'s stage times and its build's page times."""
    import json

    bench = _bench()
    build_dir = tmp_path / "_build"
    (build_dir / "executed" / "p").mkdir(parents=True)
    (build_dir / "ci-times.txt").write_text("install 120\nbook 300\nmake-test 600\n")
    for name, wall in (("a", 30.0), ("b", 50.0), ("c", 20.0)):
        (build_dir / "executed" / "p" / f"{name}.ipynb").write_text(json.dumps({"metadata": {"lowrank": {"wall_s": wall}}}))
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{bench.CI_TABLE_START}\nold\n<!-- end -->\nafter\n")
    seconds = tmp_path / "ci_page_seconds.csv"
    bench.bench_ci(build_dir, readme, seconds)
    assert seconds.read_text() == "page,seconds\np/a,30.0\np/b,50.0\np/c,20.0\n"  # the next build's schedule
    text = readme.read_text()
    assert text.startswith("before\n") and text.endswith("<!-- end -->\nafter\n") and "old" not in text
    assert "| `.ci/run` stage: book | 300 | | 29% |" in text and "| `.ci/run` in all | 1020 | <= 900 | |" in text
    assert "| floor of the ci book's execution on 2 workers (max of sum / 2, slowest page) | 50 |" in text
    assert text.index("page p/b") < text.index("page p/a") < text.index("page p/c")  # slowest first


def _epoch_bench():
    spec = importlib.util.spec_from_file_location("bench_epoch_seconds", ROOT / "bench" / "epoch_seconds.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_every_architecture_the_laptop_and_paper_files_use_is_measured():
    """bench/epoch_seconds.csv holds a CPU time per epoch for every (model, dataset, batch size) of the
    sweep specs (the paper's Part II architectures) and for every batch-size ensemble of each laptop
    page, so that no dry run prints a cost of zero and every laptop file's cost is known."""
    from lowrank.book import costs, laptop, rules

    timings = costs.read_timings()
    bench = _epoch_bench()
    missing = [(p["model"], p["dataset"], p["batch_size"]) for p in bench._architecture_combos()
               if (p["model"], p["dataset"], int(p["batch_size"]), 1, "cpu") not in timings]
    assert missing == [], "run `python bench/epoch_seconds.py --architectures`"
    for name in laptop.SIZED_PAGES:
        params = rules.resolve_parameters(name, scale="laptop", memory=False)
        seconds = laptop.page_seconds(name, params, timings=timings)
        assert seconds is not None, f"{name}: run `python bench/epoch_seconds.py --pages`"
        assert seconds <= laptop.PAGE_BUDGET_S, f"{name}: {seconds:.0f} s of training over the laptop budget"
    assert all(s > 0 for s, _ in timings.values()), "a measurement of zero: rerun it"


def test_epoch_bench_measures_and_replaces_rows(tmp_path, monkeypatch):
    """One real measurement at a tiny size (2 SGD steps of an MLP on the digits), written beside an older row
    of another key, and replacing an older row of its own key."""
    bench = _epoch_bench()
    monkeypatch.setattr(bench, "_architecture_combos", lambda: [{"model": "MLP-BN-2-8", "dataset": "digits",
                                                                 "batch_size": 64}])
    rows = bench.measure_architectures(threads=1, steps=2)
    assert len(rows) == 1 and rows[0]["members"] == 1 and rows[0]["device"] == "cpu"
    assert rows[0]["seconds_per_epoch"] > 0 and rows[0]["measured_on"].startswith("cpu:")
    assert "2 SGD steps" in rows[0]["method"] and f"x {1438 // 64} steps per epoch" in rows[0]["method"]
    out = tmp_path / "t.csv"
    out.write_text("model,dataset,batch_size,members,device,seconds_per_epoch,measured_on,method\n"
                   "MLP-BN-2-8,digits,64,1,cpu,99.0,old,old\nM,digits,8,1,cpu,2.0,kept,kept\n")
    bench.write(rows, out)
    from lowrank.book import costs

    t = costs.read_timings(out)
    assert t[("M", "digits", 8, 1, "cpu")] == (2.0, "kept")
    assert t[("MLP-BN-2-8", "digits", 64, 1, "cpu")][0] == rows[0]["seconds_per_epoch"] != 99.0
