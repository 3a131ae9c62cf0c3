"""The benchmark scripts run (the GPU script at tiny sizes on this device)."""

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
