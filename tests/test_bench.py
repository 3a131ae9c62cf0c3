"""The benchmark scripts run (the GPU script at tiny sizes on this device)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_smoke(tmp_path):
    out = tmp_path / "gpu.md"
    subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--smoke", "--out", str(out)], check=True,
                   capture_output=True, text=True)
    text = out.read_text()
    for model in ("MLP-BN-2-16", "VGG-16", "ResNet-18", "ViT"):
        assert f"{model}, one epoch" in text and f"{model}: mixed vs float32" in text
    assert "throughput ratio" in text and "via the CPU" in text and "gradients/decomposition" in text


def test_gpu_script_refuses_to_time_a_cpu_as_a_gpu():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py")], capture_output=True, text=True,
                          env={"LOWRANK_DEVICE": "cpu", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "no GPU here" in done.stderr


def test_kernel_ceiling_times_a_part_of_the_training_steps():
    """The ensemble ceiling's kernel time is positive and below the steps' own wall time (it leaves
    out the Python and autograd bookkeeping)."""
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from lowrank.core import datasets

    data = datasets.digits()
    model_fn = bench._mlp_bn(data)
    kernels = bench._kernel_seconds_per_epoch(model_fn, data, 2)
    steps = min(bench._train_seconds_per_epoch(model_fn, data, 2, 2)[0] for _ in range(2))
    assert 0 < kernels < steps
