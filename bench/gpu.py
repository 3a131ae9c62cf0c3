"""GPU timings of the book's training code; writes a markdown table (default bench/GPU.md).

    python bench/gpu.py                 # on a machine with CUDA: paper-scale shapes
    python bench/gpu.py --smoke --out /tmp/gpu.md   # tiny shapes on any device (checks this script)

On synthetic data of the paper's shapes (CIFAR-10: 50,000 + 10,000 images 3x32x32, 10 classes; the
real data sets need not be on the machine; timings do not depend on the pixel values), it measures:

- one epoch of each Part II architecture (MLP-BN-10-100 on flattened images, VGG-16, ResNet-18,
  the ViT) at B=128 with the paper's augmentation and every monitor, split into training steps,
  evaluation and rank tracking (`table.attrs["seconds"]`), in float32 and with bfloat16 mixed
  precision, and how far apart the two runs' measured ranks and weight norms are after that epoch;
- an ensemble of 16 MLP-BN-10-100 against one run (B=128), training steps only;
- the singular values of the monitors' stacked weight matrices on the GPU against a copy to the
  CPU, per shape (what sets `lowrank.core.spectral.GPU_SVD_MIN_ENTRIES`);
- one notebook at the paper's scale (`gradients/decomposition`), wall time through `lowrank.book.runs`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lowrank.core import datasets, device, spectral, train
from lowrank.book import rules, runs  # noqa: E402
from lowrank.core.device import describe_device, get_device  # noqa: E402
from lowrank.core.nets import zoo  # noqa: E402

device.reproducible()

PAPER = dict(n_train=50_000, n_test=10_000, side=32, batch=128, cnn_width=1.0, vit_dim=512, vit_depth=6,
             ensemble_batch=128, models=("MLP-BN-10-100", "VGG-16", "ResNet-18", "ViT"),
             svd_shapes=((16, 100, 100), (16, 100, 3072), (1, 512, 4608), (1, 64, 27), (16, 10, 100)),
             notebook_overrides={})
SMOKE = dict(n_train=256, n_test=64, side=8, batch=32, cnn_width=0.125, vit_dim=32, vit_depth=1,
             ensemble_batch=32, models=("MLP-BN-2-16", "VGG-16", "ResNet-18", "ViT"),
             svd_shapes=((4, 16, 16), (1, 8, 27)),
             notebook_overrides={"n": 40, "d": 50, "m": 60, "nus": [0.125, 0.375], "activations": ["tanh"],
                                 "losses": ["mse"], "weights": ["isotropic"]})
ROWS: list[tuple[str, str]] = []


def row(what: str, value: str) -> None:
    ROWS.append((what, value))
    print(f"{what}: {value}", flush=True)


def synchronize(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def synthetic_cifar(cfg) -> datasets.Dataset:
    g = torch.Generator().manual_seed(0)
    shape = (3, cfg["side"], cfg["side"])
    return datasets.Dataset(torch.randn(cfg["n_train"], *shape, generator=g),
                            torch.randint(0, 10, (cfg["n_train"],), generator=g),
                            torch.randn(cfg["n_test"], *shape, generator=g),
                            torch.randint(0, 10, (cfg["n_test"],), generator=g), 10, "synthetic CIFAR-10 shapes")


def one_epoch(model, data, cfg, dev, mixed_precision):
    make, shaped = zoo.for_data(model, data, cnn_width=cfg["cnn_width"], vit_dim=cfg["vit_dim"],
                                vit_depth=cfg["vit_depth"])
    augment = None if model.startswith(("MLP", "RES")) else train.augment_images
    synchronize(dev)
    t = time.perf_counter()
    table = train.train(make, shaped, lr=0.05, batch_size=cfg["batch"], epochs=1, momentum=0.9, weight_decay=5e-4,
                        augment=augment, device=dev, progress=False, mixed_precision=mixed_precision)
    synchronize(dev)
    return table, time.perf_counter() - t


def bench_architectures(cfg, dev):
    data = synthetic_cifar(cfg)
    for model in cfg["models"]:
        tables = {}
        for mixed in (False, True):
            table, wall = one_epoch(model, data, cfg, dev, mixed)
            sec = table.attrs["seconds"]
            tables[mixed] = table[table.epoch == 1].sort_values("layer_index")
            row(f"{model}, one epoch of {cfg['n_train']} images at B={cfg['batch']}, "
                f"{'bfloat16 mixed precision' if mixed else 'float32'}: wall / training / evaluation / rank tracking, s",
                f"{wall:.1f} / {sec['train']:.1f} / {sec['evaluate']:.1f} / {sec['track_ranks']:.2f}")
        full, mixed = tables[False], tables[True]
        rank_diff = (full["rank_spectral"].to_numpy() - mixed["rank_spectral"].to_numpy())
        norm_rel = abs(full["weight_norm"].to_numpy() / mixed["weight_norm"].to_numpy() - 1)
        row(f"{model}: mixed vs float32 after the epoch: largest |rank difference| over layers / "
            f"largest relative weight-norm difference", f"{abs(rank_diff).max()} / {norm_rel.max():.2e}")


def bench_ensemble(cfg, dev, k=16, epochs=2):
    data = synthetic_cifar(cfg)
    make, _ = zoo.for_data(cfg["models"][0], data)
    per_epoch = {}
    for size in (1, k):
        runs_ = [{"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4, "seed": s} for s in range(size)]
        table = train.train_ensemble(make, data, runs_, batch_size=cfg["ensemble_batch"], epochs=epochs, device=dev,
                                     eval_every=epochs, progress=False)
        per_epoch[size] = table.attrs["seconds"]["train"] / epochs
    row(f"ensemble of {k} {cfg['models'][0]} vs {k} sequential runs (B={cfg['ensemble_batch']}), training steps: "
        f"throughput ratio", f"{k * per_epoch[1] / per_epoch[k]:.1f}x ({per_epoch[k]:.2f} s vs {k} x {per_epoch[1]:.2f} s)")


def bench_svd(cfg, dev, repeats=5):
    for shape in cfg["svd_shapes"]:
        mats = torch.randn(*shape, device=dev)
        times = {}
        for where, fn in (("device", lambda: torch.linalg.svdvals(mats)),
                          ("via CPU", lambda: torch.linalg.svdvals(mats.cpu()).to(dev))):
            fn()
            samples = []
            for _ in range(repeats):
                synchronize(dev)
                t = time.perf_counter()
                fn()
                synchronize(dev)
                samples.append(time.perf_counter() - t)
            times[where] = statistics.median(samples)
        row(f"singular values of {shape[0]} matrices {shape[1]}x{shape[2]} ({shape[1] * shape[2]} entries): "
            f"on the device / via the CPU, ms", f"{1e3 * times['device']:.2f} / {1e3 * times['via CPU']:.2f}")
    row("current `GPU_SVD_MIN_ENTRIES`", str(spectral.GPU_SVD_MIN_ENTRIES))


def bench_notebook(cfg):
    name = "gradients/decomposition"
    scale = "ci" if cfg["notebook_overrides"] else "paper"
    params = rules.resolve_parameters(name, scale=scale, overrides=cfg["notebook_overrides"])
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        runs.run(name, params, runs_root=Path(tmp))
        row(f"notebook {name} at {scale} scale, wall seconds (kernel start included)", f"{time.perf_counter() - t:.1f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, any device: check the script runs")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "GPU.md")
    args = ap.parse_args(argv)
    dev = get_device()
    if dev.type != "cuda" and not args.smoke:
        ap.error(f"no GPU here ({describe_device(dev)}); run with --smoke to check the script on this device")
    cfg = SMOKE if args.smoke else PAPER
    ROWS.clear()
    bench_architectures(cfg, dev)
    bench_ensemble(cfg, dev)
    bench_svd(cfg, dev)
    bench_notebook(cfg)
    head = (f"Measured {time.strftime('%Y-%m-%d')} on {describe_device(dev)}, torch {torch.__version__} "
            f"(`bench/gpu.py{' --smoke' if args.smoke else ''}`).")
    lines = [head, "", "| measurement | value |", "|---|---|"] + [f"| {w} | {v} |" for w, v in ROWS]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
