"""Real data sets, all offline: scikit-learn's bundled digits, MNIST-1D generated locally, and
MNIST / CIFAR-10 read from a local folder the user names (nothing is downloaded).

Every loader returns a `Dataset` of float32 inputs and int64 labels as torch tensors.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from lowrank.core.validation import check_choice

__all__ = [
    "DEFAULT_DATA_ROOT",
    "Dataset",
    "DATASETS",
    "load",
    "digits",
    "mnist1d",
    "mnist",
    "cifar10",
    "binary_subset",
    "random_labels",
    "one_hot",
]


DEFAULT_DATA_ROOT = "data"  # where MNIST / CIFAR-10 are read from unless a notebook's `data_root` says otherwise


class Dataset(NamedTuple):
    x_train: torch.Tensor  # N x ... float32
    y_train: torch.Tensor  # N int64
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    name: str


def _split(x, y, test_fraction, seed):
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    perm = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(test_fraction * len(x)))
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


def _standardize(x_train, x_test):
    mean, std = x_train.mean(0), x_train.std(0)
    std[std == 0] = 1.0
    return (x_train - mean) / std, (x_test - mean) / std


def _pack(x_tr, y_tr, x_te, y_te, num_classes, name) -> Dataset:
    f = lambda a: torch.as_tensor(np.ascontiguousarray(a), dtype=torch.float32)  # noqa: E731
    i = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.int64)  # noqa: E731
    return Dataset(f(x_tr), i(y_tr), f(x_te), i(y_te), num_classes, name)


def digits(test_fraction: float = 0.2, seed: int = 0, standardize: bool = True) -> Dataset:
    """scikit-learn's 8x8 digits (1797 images, 10 classes) as 64-vectors, split by `seed`."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x_tr, y_tr, x_te, y_te = _split(d.data.astype(np.float64) / 16.0, d.target, test_fraction, seed)
    if standardize:
        x_tr, x_te = _standardize(x_tr, x_te)
    return _pack(x_tr, y_tr, x_te, y_te, 10, "digits")


def mnist1d(num_samples: int = 5000, seed: int = 42, standardize: bool = True) -> Dataset:
    """MNIST-1D (Greydanus) generated locally: 40-dimensional signals, 10 classes, 80/20 split."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = int(num_samples), int(seed)
    d = make_dataset(args)
    x_tr, x_te = d["x"].astype(np.float64), d["x_test"].astype(np.float64)
    if standardize:
        x_tr, x_te = _standardize(x_tr, x_te)
    return _pack(x_tr, d["y"], x_te, d["y_test"], 10, "mnist1d")


_MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


def _missing(root: Path, what: str, expected) -> FileNotFoundError:
    return FileNotFoundError(
        f"{what} not found in {root}: expected the files {', '.join(expected)}. "
        f"This book downloads nothing; put the standard files in that folder (see 'How to reproduce')."
    )


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 8 or raw[0] != 0 or raw[1] != 0 or raw[2] != 8:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path} is truncated: header says {shape}, found {data.size} values")
    return data.reshape(shape).copy()  # frombuffer is read-only


def mnist(root, normalize: bool = True) -> Dataset:
    """MNIST from the four standard IDX files (optionally .gz) in `root` (or `root/MNIST/raw`).

    Inputs are 1 x 28 x 28 in [0, 1], normalised by the usual mean 0.1307 and std 0.3081.
    """
    root = Path(root).expanduser()
    arrays = {}
    for key, stem in _MNIST_FILES.items():
        candidates = [d / f"{stem}{ext}" for d in (root, root / "MNIST" / "raw") for ext in ("", ".gz")]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            raise _missing(root, "MNIST", [f"{s}[.gz]" for s in _MNIST_FILES.values()])
        arrays[key] = _read_idx(found)
    x_tr = arrays["x_train"].astype(np.float32)[:, None] / 255.0
    x_te = arrays["x_test"].astype(np.float32)[:, None] / 255.0
    if normalize:
        x_tr, x_te = (x_tr - MNIST_MEAN) / MNIST_STD, (x_te - MNIST_MEAN) / MNIST_STD
    return _pack(x_tr, arrays["y_train"], x_te, arrays["y_test"], 10, "mnist")


def cifar10(root, normalize: bool = True) -> Dataset:
    """CIFAR-10 from the python batches (`data_batch_1..5`, `test_batch`) in `root` or
    `root/cifar-10-batches-py`. Inputs are 3 x 32 x 32, normalised per channel."""
    root = Path(root).expanduser()
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    folder = next((d for d in (root, root / "cifar-10-batches-py") if all((d / n).is_file() for n in names)), None)
    if folder is None:
        raise _missing(root, "CIFAR-10", names)

    def batch(name):
        with open(folder / name, "rb") as fh:
            b = pickle.load(fh, encoding="bytes")
        return b[b"data"].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0, np.asarray(b[b"labels"])

    parts = [batch(n) for n in names[:5]]
    x_tr, y_tr = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    x_te, y_te = batch("test_batch")
    if normalize:
        mean = np.asarray(CIFAR_MEAN, dtype=np.float32)[:, None, None]
        std = np.asarray(CIFAR_STD, dtype=np.float32)[:, None, None]
        x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
    return _pack(x_tr, y_tr, x_te, y_te, 10, "cifar10")


DATASETS = frozenset({"digits", "mnist1d", "mnist", "cifar10"})


def load(name: str, root=None, **kwargs) -> Dataset:
    """Load a data set by name; "mnist" and "cifar10" need `root`, the local folder."""
    check_choice(name, "dataset", DATASETS)
    if name in ("mnist", "cifar10"):
        if root is None:
            raise ValueError(f"dataset {name!r} is read from a local folder: pass root=<folder> (nothing is downloaded)")
        return (mnist if name == "mnist" else cifar10)(root, **kwargs)
    return (digits if name == "digits" else mnist1d)(**kwargs)


def binary_subset(ds: Dataset, classes=(0, 1), max_train: int | None = None, max_test: int | None = None) -> Dataset:
    """Keep two classes, relabelled `classes[0] -> -1`, `classes[1] -> +1` (labels stay int64)."""
    a, b = classes
    if a == b or not (0 <= a < ds.num_classes and 0 <= b < ds.num_classes):
        raise ValueError(f"classes must be two different labels in [0, {ds.num_classes}), got {classes}")

    def pick(x, y, cap):
        keep = torch.nonzero((y == a) | (y == b)).flatten()[:cap]
        return x[keep], torch.where(y[keep] == b, 1, -1)

    x_tr, y_tr = pick(ds.x_train, ds.y_train, max_train)
    x_te, y_te = pick(ds.x_test, ds.y_test, max_test)
    return Dataset(x_tr, y_tr, x_te, y_te, 2, f"{ds.name}[{a} vs {b}]")


def random_labels(y: torch.Tensor, fraction: float, num_classes: int, seed: int) -> torch.Tensor:
    """Replace a `fraction` of the labels (chosen by `seed`) by labels drawn uniformly.

    For ±1 labels pass num_classes=2: the new labels are then in {-1, +1}.
    """
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    g = torch.Generator().manual_seed(seed)
    y = y.clone()
    idx = torch.randperm(len(y), generator=g)[: int(round(fraction * len(y)))]
    new = torch.randint(0, num_classes, (len(idx),), generator=g)
    if num_classes == 2 and bool(((y == 1) | (y == -1)).all()):
        new = new * 2 - 1
    y[idx] = new
    return y


def one_hot(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(y, num_classes).to(torch.float32)
