"""Real data sets: scikit-learn's bundled digits, MNIST-1D generated locally, and MNIST / CIFAR-10
read from a local folder (`lowrank data fetch mnist|cifar10` puts them there; loading never downloads).

Every loader returns a `Dataset` of float32 inputs and int64 labels as torch tensors.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import pickle
import re
import shutil
import tarfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from lowrank.core.validation import check_choice

__all__ = [
    "DEFAULT_DATA_ROOT",
    "DATA_ENV",
    "MIRRORS_ENV",
    "user_data_dir",
    "expand",
    "default_data_root",
    "resolve_root",
    "present",
    "FetchError",
    "DataSource",
    "SOURCES",
    "fetch",
    "download",
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


DEFAULT_DATA_ROOT = "data"  # the name by which the paper files' `data_root` means the default data folder
DATA_ENV = "LOWRANK_DATA"  # an environment variable naming the data folder; it overrides every default
MIRRORS_ENV = "LOWRANK_DATA_MIRRORS"  # base URLs (space-separated) tried instead of a source's own mirrors
_REPO_ROOT = Path(__file__).resolve().parents[2]


def _checkout_root() -> Path | None:
    """The source checkout the package runs from (an editable install or a clone), None for an
    installed copy (whose parents[2] is site-packages)."""
    if (_REPO_ROOT / "pyproject.toml").is_file() and (_REPO_ROOT / "lowrank" / "core" / "datasets.py").is_file():
        return _REPO_ROOT
    return None


def user_data_dir() -> Path:
    """The user's data folder for `lowrank`, as platformdirs places it: `$XDG_DATA_HOME/lowrank`
    or `~/.local/share/lowrank` on Linux, `~/Library/Application Support/lowrank` on macOS,
    `%LOCALAPPDATA%\\lowrank` on Windows."""
    import platformdirs

    return Path(platformdirs.user_data_dir("lowrank", appauthor=False))


def expand(path) -> Path:
    """`path` with `~` / `~user` expanded; ValueError with one line for a user who does not exist."""
    try:
        return Path(path).expanduser()
    except RuntimeError:  # pathlib: "Could not determine home directory."
        user = str(path).split("/", 1)[0]
        raise ValueError(f"{path}: there is no user {user[1:]!r} whose home {user} names") from None


def default_data_root() -> Path:
    """Where MNIST / CIFAR-10 live unless a `data_root` or `--root` says otherwise: `$LOWRANK_DATA`
    when set, else `data/` of the source checkout the package runs from, else `user_data_dir()`
    (an installed copy: never a folder inside site-packages)."""
    env = os.environ.get(DATA_ENV, "").strip()
    if env:
        return expand(env)
    checkout = _checkout_root()
    return checkout / DEFAULT_DATA_ROOT if checkout is not None else user_data_dir()


def resolve_root(root=None) -> Path:
    """The data folder `root` names, `~` expanded. None, "" and the paper files' `data` (DEFAULT_DATA_ROOT)
    mean `default_data_root()` ($LOWRANK_DATA when set), else a folder `data` below the working
    directory when there is one; another relative folder that does not exist there is taken below the
    checkout's root (notebooks execute in their own folder while `lowrank data fetch` writes below the
    repository root)."""
    if root in (None, ""):
        return default_data_root()
    path = expand(root)
    default = path == Path(DEFAULT_DATA_ROOT)
    if default and os.environ.get(DATA_ENV, "").strip():
        return default_data_root()
    if path.is_absolute() or path.is_dir():
        return path
    if default:
        return default_data_root()
    checkout = _checkout_root()
    return checkout / path if checkout is not None else path


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
    d = {k: v.copy() for k, v in _generated_mnist1d(int(num_samples), int(seed)).items()}  # callers may write
    x_tr, x_te = d["x"].astype(np.float64), d["x_test"].astype(np.float64)
    if standardize:
        x_tr, x_te = _standardize(x_tr, x_te)
    return _pack(x_tr, d["y"], x_te, d["y_test"], 10, "mnist1d")


@functools.lru_cache(maxsize=4)
def _generated_mnist1d(num_samples: int, seed: int) -> dict:
    """The package's make_dataset for these settings, bit for bit (`_make_mnist1d`), generated once per
    process (a page's regime, training and figures each load the data)."""
    from mnist1d.data import get_dataset_args

    args = get_dataset_args()
    args.num_samples, args.seed = num_samples, seed
    return _make_mnist1d(args)


def _interp_rows(scale, rows, new_scale):
    """Each row of `rows` (sampled at `scale`) linearly interpolated at `new_scale`, by `np.interp`
    row by row: what scipy's `interp1d(kind="linear")` does with one signal (with a 2-D array it takes
    another path, which rounds differently)."""
    return np.stack([np.interp(new_scale, scale, r) for r in rows])


def _make_mnist1d(args) -> dict:
    """`mnist1d.data.make_dataset(args)` with the same random draws in the same order and the same
    floating-point operations, element for element, but the arithmetic done on all signals at once
    (the package transforms one signal at a time through scipy's `interp1d` and `gaussian_filter`:
    about 10 s for 20,000 signals, against about 1 s here). Returns `x`, `y`, `x_test`, `y_test`
    equal to the package's, bit for bit (tests/test_datasets.py); `args.shuffle_seq` is not supported."""
    from mnist1d.data import get_templates
    from mnist1d.utils import set_seed
    from scipy.ndimage import gaussian_filter1d

    if args.shuffle_seq:
        raise ValueError("shuffle_seq is not supported")
    templates = get_templates()
    set_seed(args.seed)
    per_class = args.num_samples // len(templates["y"])
    labels = np.repeat(np.arange(len(templates["y"])), per_class)
    n, length = len(labels), args.template_len + args.padding[-1]
    low, high = args.padding
    pads, scale_draws, shifts, shear_draws = (np.empty(n, dtype=np.int64), np.empty(n), np.empty(n, dtype=np.int64),
                                              np.empty(n))
    corr, iid = np.empty((n, length)), np.empty((n, length))
    for i in range(n):  # the package's draws, one signal after the other (transform's order)
        pads[i] = low + int(np.random.rand() * (high - low + 1))
        scale_draws[i] = np.random.rand()
        shifts[i] = np.random.choice(args.max_translation)
        corr[i] = args.corr_noise_scale * np.random.randn(length)
        iid[i] = args.iid_noise_scale * np.random.randn(length)
        shear_draws[i] = np.random.rand()
    x = np.empty((n, length))
    new_scale = np.linspace(0, 1, length)
    eps = 1e-8  # transform's default
    for p in np.unique(pads):  # pad, then dilate to `length` samples
        rows = np.flatnonzero(pads == p)
        padded = np.concatenate([templates["x"][labels[rows]] + eps, np.zeros((len(rows), p))], axis=1)
        x[rows] = _interp_rows(np.linspace(0, 1, padded.shape[1]), padded, new_scale)
    x *= np.array([1 + args.scale_coeff * (r - 0.5) for r in scale_draws])[:, None]  # scale
    x = x[np.arange(n)[:, None], (np.arange(length)[None, :] - shifts[:, None]) % length]  # translate
    mask = x != 0
    x = mask * x + (1 - mask) * gaussian_filter1d(corr, 2, axis=1)  # correlated noise where the signal is 0
    x = x + iid
    x = x - (args.shear_scale * (shear_draws - 0.5))[:, None] * np.linspace(-0.5, 0.5, length)[None, :]  # shear
    x = _interp_rows(new_scale, x, np.linspace(0, 1, args.final_seq_length))  # subsample
    shuffle = np.random.permutation(n)
    xs, ys = x[shuffle], templates["y"][labels][shuffle]
    xs = (xs - xs.mean()) / xs.std()
    split = int(n * args.train_split)
    return {"x": xs[:split], "x_test": xs[split:], "y": ys[:split], "y_test": ys[split:]}


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
        f"`lowrank data fetch {what.lower().replace('-', '')} --root {root}` downloads them (loading never downloads)."
    )


def check_regular_file(path, what: str = "data file") -> Path:
    """`path` when it is a regular file (a link to one is followed); ValueError, before anything opens
    it, for a FIFO (reading it would wait for ever), a device, a folder, or a broken link (named with
    its target). FileNotFoundError when nothing is there."""
    import stat as stat_

    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if path.is_symlink():
            raise ValueError(f"{what} {path} is a broken link (-> {os.readlink(path)}): nothing is there") from None
        raise
    if not stat_.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat_.S_ISFIFO(st.st_mode) else "a folder" if stat_.S_ISDIR(st.st_mode)
                else "a device" if stat_.S_ISCHR(st.st_mode) or stat_.S_ISBLK(st.st_mode) else "not a regular file")
        raise ValueError(f"{what} {path} is {kind}, not a regular file; it is not read")
    return path


def _exists(path: Path) -> bool:
    """Whether anything (a file, a FIFO, a broken link) has the name `path`."""
    return path.exists() or path.is_symlink()


# the most values an MNIST IDX file holds (the 60,000 training images of 28 x 28): a header that says
# more, or a compressed file that unpacks to more than its header says, is refused before it fills memory
MNIST_MAX_VALUES = 60000 * 28 * 28


def _read_idx(path: Path, max_values: int = MNIST_MAX_VALUES) -> np.ndarray:
    check_regular_file(path, "MNIST file")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            head = fh.read(4)
            if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] != 8 or not 1 <= head[3] <= 3:
                raise ValueError(f"{path} is not an IDX file of unsigned bytes")
            ndim = head[3]
            dims = fh.read(4 * ndim)
            shape = tuple(int.from_bytes(dims[4 * i: 4 + 4 * i], "big") for i in range(ndim))
            count = int(np.prod(shape, dtype=object)) if len(dims) == 4 * ndim else -1
            if count < 0:
                raise ValueError(f"{path} is truncated in its header")
            if count > max_values:
                raise ValueError(f"{path}: its header says {shape} ({count} values); an MNIST file holds at most "
                                 f"{max_values}")
            raw = fh.read(count + 1)  # one more: a file longer than its header says (a gzip bomb) stops here
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise ValueError(f"{path} cannot be read as an IDX file ({type(err).__name__}: {err})") from None
    if len(raw) > count:
        raise ValueError(f"{path} holds more than its header's {shape} values; it is not an MNIST file")
    if len(raw) != count:
        raise ValueError(f"{path} is truncated: header says {shape}, found {len(raw)} values")
    return np.frombuffer(raw, dtype=np.uint8).reshape(shape).copy()  # frombuffer is read-only


def mnist(root, normalize: bool = True) -> Dataset:
    """MNIST from the four standard IDX files (optionally .gz) in `root` (or `root/MNIST/raw`).

    Inputs are 1 x 28 x 28 in [0, 1], normalised by the usual mean 0.1307 and std 0.3081.
    """
    root = resolve_root(root)
    arrays = {}
    paths = {}
    for key, stem in _MNIST_FILES.items():
        candidates = [d / f"{stem}{ext}" for d in (root, root / "MNIST" / "raw") for ext in ("", ".gz")]
        found = next((p for p in candidates if _exists(p)), None)
        if found is None:
            raise _missing(root, "MNIST", [f"{s}[.gz]" for s in _MNIST_FILES.values()])
        paths[key], arrays[key] = found, _read_idx(found)
    for split in ("train", "test"):  # what the files say of each other, before anything trains on them
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.ndim != 3 or x.shape[1:] != (28, 28) or y.ndim != 1:
            raise ValueError(f"{paths[f'x_{split}']} holds {x.shape} and {paths[f'y_{split}']} {y.shape}: MNIST is "
                             f"N x 28 x 28 images and N labels")
        if len(x) != len(y):
            raise ValueError(f"{paths[f'x_{split}']} holds {len(x)} images but {paths[f'y_{split}']} {len(y)} labels")
        if y.size and int(y.max()) >= 10:
            raise ValueError(f"{paths[f'y_{split}']} holds the label {int(y.max())}: MNIST has 10 classes (0..9)")
    x_tr = arrays["x_train"].astype(np.float32)[:, None] / 255.0
    x_te = arrays["x_test"].astype(np.float32)[:, None] / 255.0
    if normalize:
        x_tr, x_te = (x_tr - MNIST_MEAN) / MNIST_STD, (x_te - MNIST_MEAN) / MNIST_STD
    return _pack(x_tr, arrays["y_train"], x_te, arrays["y_test"], 10, "mnist")


def cifar10(root, normalize: bool = True) -> Dataset:
    """CIFAR-10 from the python batches (`data_batch_1..5`, `test_batch`) in `root` or
    `root/cifar-10-batches-py`. Inputs are 3 x 32 x 32, normalised per channel."""
    root = resolve_root(root)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    folder = next((d for d in (root, root / "cifar-10-batches-py") if all(_exists(d / n) for n in names)), None)
    if folder is None:
        raise _missing(root, "CIFAR-10", names)
    published = dict(SOURCES["cifar10"].expect)
    for n in names:  # a FIFO, a device, a broken link: refused before anything is opened
        check_regular_file(folder / n, "CIFAR-10 batch")

    def batch(name):
        raw = (folder / name).read_bytes()
        got = _md5(raw)
        if got != published[name]:  # a batch is a pickle, which can run code when read: only the published ones are
            raise ValueError(f"{folder / name} is not the published CIFAR-10 batch (md5 {got}, published "
                             f"{published[name]}) and is not read: remove it and run `lowrank data fetch cifar10`")
        b = pickle.loads(raw, encoding="bytes")
        y = np.asarray(b[b"labels"])
        if y.size and not 0 <= int(y.min()) <= int(y.max()) < 10:
            raise ValueError(f"{folder / name} holds labels outside 0..9")
        return b[b"data"].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0, y

    parts = [batch(n) for n in names[:5]]
    x_tr, y_tr = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    x_te, y_te = batch("test_batch")
    if normalize:
        mean = np.asarray(CIFAR_MEAN, dtype=np.float32)[:, None, None]
        std = np.asarray(CIFAR_STD, dtype=np.float32)[:, None, None]
        x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
    return _pack(x_tr, y_tr, x_te, y_te, 10, "cifar10")


def present(name: str, root=None) -> bool:
    """Whether the files `mnist(root)` / `cifar10(root)` read are in `root` (nothing is read)."""
    root = resolve_root(root)
    if name == "mnist":
        dirs = (root, root / "MNIST" / "raw")
        return all(any((d / f"{s}{e}").is_file() for d in dirs for e in ("", ".gz")) for s in _MNIST_FILES.values())
    check_choice(name, "dataset", frozenset({"mnist", "cifar10"}))
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    return any(all((d / n).is_file() for n in names) for d in (root, root / "cifar-10-batches-py"))


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


# ---- fetching: `lowrank data fetch mnist|cifar10` (pooch) ------------------------------------------

class FetchError(RuntimeError):
    """A download failed (unreachable, cut short, wrong checksum); the message is one line."""


class DataSource(NamedTuple):
    """Where a data set's files come from and where they go below the data root.

    files: (file name, published md5) pairs; mirrors: base URLs tried in order (each ends in "/");
    folder: sub-folder of the root the files are written to; extract_to: for an archive, the folder
    (below the root) it unpacks into, complete when it holds every file of `expect`, (name, md5) pairs;
    sizes: (file name, bytes) pairs, the published sizes: a download stops beyond them (an endless
    stream), `DOWNLOAD_MAX_BYTES` for a file not listed.
    """

    files: tuple
    mirrors: tuple
    folder: str = ""
    extract_to: str | None = None
    expect: tuple = ()
    sizes: tuple = ()


# MNIST: the four IDX files with the md5 sums torchvision publishes (torchvision.datasets.MNIST.resources),
# from torchvision's mirror, then LeCun's page. CIFAR-10: Krizhevsky's python archive and its published md5,
# and the md5 of each batch in it (torchvision.datasets.CIFAR10.train_list, test_list): `cifar10()` unpickles
# only files with these sums.
SOURCES = {
    "mnist": DataSource(
        files=(("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
               ("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
               ("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
               ("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c")),
        mirrors=("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
        folder="MNIST/raw",
        sizes=(("train-images-idx3-ubyte.gz", 9912422), ("train-labels-idx1-ubyte.gz", 28881),
               ("t10k-images-idx3-ubyte.gz", 1648877), ("t10k-labels-idx1-ubyte.gz", 4542))),
    "cifar10": DataSource(
        files=(("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a"),),
        mirrors=("https://www.cs.toronto.edu/~kriz/",),
        extract_to="cifar-10-batches-py",
        sizes=(("cifar-10-python.tar.gz", 170498071),),
        expect=(("data_batch_1", "c99cafc152244af753f735de768cd75f"), ("data_batch_2", "d4bba439e000b95fd0a9bffe97cbabec"),
                ("data_batch_3", "54ebc095f3ab1f0389bbae665268c751"), ("data_batch_4", "634d18415352ddfa80567beed471001a"),
                ("data_batch_5", "482c414d41f54cd18b22e5b47cb7c3cb"), ("test_batch", "40351d587109b95175f43aff81a1287e"))),
}


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()  # the published sums are md5: integrity


class _Offline(Exception):
    """No connection to a mirror (name resolution, refused, timed out before any byte)."""


class _Refused(Exception):
    """A mirror answered with an HTTP error (403 of a moved S3 bucket, 404, 5xx), or took the request and
    sent nothing within the timeout: try the next one."""


# a download whose size is not published stops beyond this (the largest published file, CIFAR-10's
# archive, is 163 MiB); every download stops when it is slower on average than `DOWNLOAD_MIN_RATE`
# bytes per second after `timeout` x `DOWNLOAD_GRACE` seconds (a mirror dripping bytes: each read
# arrives within the timeout, and the whole would take days)
DOWNLOAD_MAX_BYTES = 256 * 2**20
DOWNLOAD_MIN_RATE = 32 * 2**10
DOWNLOAD_GRACE = 10


class _CappedDownloader:
    """A pooch downloader that stops at `max_bytes` (the published size) and at a deadline, whatever
    the mirror sends: each read waits at most `timeout` s, the whole at most `deadline` s."""

    def __init__(self, max_bytes: int, timeout: float, progress: bool):
        self.max_bytes, self.timeout, self.progress = int(max_bytes), float(timeout), progress
        self.deadline = self.timeout * DOWNLOAD_GRACE + self.max_bytes / DOWNLOAD_MIN_RATE

    def __call__(self, url, output_file, pooch_=None, check_only=False):
        import time

        import requests

        started, got = time.monotonic(), 0
        with requests.get(url, stream=True, timeout=self.timeout) as response:
            response.raise_for_status()
            length = response.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > self.max_bytes:
                raise FetchError(f"{url} announces {int(length)} bytes; the published file has {self.max_bytes}: "
                                 f"nothing was kept")
            sink = open(output_file, "wb") if isinstance(output_file, (str, os.PathLike)) else output_file
            try:
                while True:
                    # read1: whatever has arrived (each wait at most `timeout`), so the deadline is checked
                    # between the bytes of a mirror that drips them
                    chunk = response.raw.read1(1 << 16, decode_content=True)
                    if not chunk:
                        break
                    got += len(chunk)
                    if got > self.max_bytes:
                        raise FetchError(f"{url} sent more than the {self.max_bytes} bytes of the published file; "
                                         f"stopped, nothing was kept")
                    if time.monotonic() - started > self.deadline:
                        raise FetchError(f"{url} sent {got} bytes in {time.monotonic() - started:.0f} s, slower than "
                                         f"{DOWNLOAD_MIN_RATE / 1024:g} KiB/s: stopped, nothing was kept; try another "
                                         f"mirror ({MIRRORS_ENV})")
                    sink.write(chunk)
            except urllib3_errors() as err:  # as requests' iter_content says them
                raise requests.exceptions.ChunkedEncodingError(err) from None
            finally:
                if sink is not output_file:
                    sink.close()
            if length and length.isdigit() and got < int(length):
                raise requests.exceptions.ChunkedEncodingError(f"{got} of {length} bytes")


def urllib3_errors() -> tuple:
    """urllib3's errors of a body cut short (a dropped connection, a read that timed out)."""
    from urllib3 import exceptions as e

    return (e.ProtocolError, e.ReadTimeoutError, e.IncompleteRead)


def download(url: str, target, md5: str, *, progress: bool = True, timeout: float = 30.0,
             max_bytes: int = DOWNLOAD_MAX_BYTES) -> Path:
    """Download `url` to `target` with pooch, checked against `md5`; atomic.

    pooch writes a temporary file beside the target and renames it only once its md5 equals `md5`;
    a wrong checksum or a transfer cut short leaves nothing (the next attempt starts again). Returns
    `target`; an existing verified target is kept. Raises FetchError (cut short, wrong checksum, an
    existing file that is not the published one), _Refused (an HTTP error) or _Offline (no connection).
    """
    import logging

    import pooch
    import requests

    target = Path(target)
    if _exists(target):
        try:
            check_regular_file(target, "download target")
        except ValueError as err:
            raise FetchError(str(err)) from None
    if target.is_file():
        if pooch.file_hash(str(target), alg="md5") == md5:
            return target
        raise FetchError(f"{target} exists but its md5 is not the published {md5}: remove it and fetch again")
    made = [p for p in (target.parent, *target.parent.parents) if not p.exists()]  # pooch makes the folder first
    pooch.get_logger().setLevel(logging.WARNING)  # its own logger (not logging.getLogger("pooch")): no "Downloading data from ..." line per file
    try:
        pooch.retrieve(url, known_hash=f"md5:{md5}", fname=target.name, path=target.parent,
                       downloader=_CappedDownloader(max_bytes, timeout, progress))
    except requests.exceptions.HTTPError as err:
        raise _Refused(f"HTTP {err.response.status_code} {err.response.reason}") from None
    except requests.exceptions.ChunkedEncodingError as err:  # the body ended before its Content-Length
        raise FetchError(f"{url} was cut short ({type(err).__name__}); nothing was kept, run the command again") from None
    except requests.exceptions.ReadTimeout:  # connected, and then nothing: the mirror is reached, not offline
        raise _Refused(f"no answer within {timeout:g} s") from None
    except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as err:
        raise _Offline(type(err).__name__) from None
    except ValueError as err:  # pooch: the downloaded file's hash does not match
        found = re.search(r"got\s+'?([0-9a-fA-F]{32})", str(err))  # pooch: "... expected X but got Y"
        got = found[1] if found else "unknown"
        raise FetchError(f"{target}: downloaded from {url}, its md5 is {got}, the published one {md5} (corrupt or "
                         f"truncated file); nothing was kept, run the command again") from None
    finally:
        for folder in made:  # a failed download leaves no empty folder behind
            if folder.is_dir() and not target.is_file() and not any(folder.iterdir()):
                folder.rmdir()
    return target


def _verified(folder: Path, expect) -> bool:
    """Whether `folder` holds every file of `expect` ((name, md5) pairs); FetchError for one that
    is there with another md5."""
    if folder.is_symlink() and not folder.exists():
        raise FetchError(f"{folder} is a broken link (-> {os.readlink(folder)}): remove it or give another --root")
    for n, _ in expect:
        if _exists(folder / n):
            try:
                check_regular_file(folder / n, "data file")
            except ValueError as err:
                raise FetchError(str(err)) from None
    if not all((folder / n).is_file() for n, _ in expect):
        return False
    for name, md5 in expect:
        got = _md5((folder / name).read_bytes())
        if got != md5:
            raise FetchError(f"{folder / name} is there but its md5 {got} is not the published {md5}: remove "
                             f"{folder} and fetch again")
    return True


def _extract(archive: Path, root: Path, source: DataSource) -> None:
    """Unpack `archive` into `root/source.extract_to`: into a marked work folder of this process
    (`lowrank.core.io.work_name`), then renamed, so the data folder is never half-written; the work
    folder of an unpacking killed before (-9: no cleanup ran) is removed first (`clean_leftovers`: only
    marked folders of dead processes). A folder `extract_to` already there (incomplete: `fetch` found
    it so) may hold a user's files and is never removed: the archive's files it lacks are moved in, one
    it holds with another md5 stops the fetch (FetchError naming it, nothing removed); a link there is
    refused."""
    from lowrank.core import io

    final = root / source.extract_to
    if final.is_symlink() or (final.exists() and not final.is_dir()):
        raise FetchError(f"{final} is a link or a file, not a folder; it is left as it is: remove it or give "
                         f"another --root")
    try:
        io.clean_leftovers(root)
        tmp = io.make_work_folder(io.work_name(final))
    except OSError as err:
        raise FetchError(f"{archive} could not be unpacked into {root} ({err.strerror or err})") from None
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(tmp, filter="data")
        inner = tmp / source.extract_to
        missing = [n for n, _ in source.expect if not (inner / n).is_file()]
        if missing:
            raise FetchError(f"{archive} does not hold {source.extract_to}/{missing[0]}")
        _verified(inner, source.expect)
        if not final.exists():
            os.rename(inner, final)
            return
        published = dict(source.expect)
        for name in published:  # before anything moves: a file in the way is named, nothing is changed
            there = final / name
            if there.is_symlink() or (there.exists() and not there.is_file()):
                raise FetchError(f"{there} is not a regular file; it is left as it is: remove it and fetch again")
            if there.is_file() and _md5(there.read_bytes()) != published[name]:
                raise FetchError(f"{there} is there but its md5 is not the published {published[name]}; it is "
                                 f"left as it is: remove it and fetch again")
        for p in sorted(inner.iterdir()):
            if not (final / p.name).exists() and not (final / p.name).is_symlink():
                os.rename(p, final / p.name)
    except (tarfile.TarError, OSError, EOFError) as err:
        raise FetchError(f"{archive} could not be unpacked ({type(err).__name__}: {err})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # made by this call


def fetch(name: str, root=None, *, sources: dict | None = None, progress: bool = True,
          timeout: float = 30.0) -> Path:
    """Download data set `name` into `root`, check the published md5 sums, unpack an archive.

    Parameters
    ----------
    name : "mnist" | "cifar10".
    root : the data folder (default `default_data_root()`, where the paper files' `data_root: data`
        points); MNIST goes to `root/MNIST/raw`, CIFAR-10 to `root/cifar-10-batches-py`
        (the layouts `mnist()` and `cifar10()` read).
    sources : the source table (default SOURCES); the tests pass a server on 127.0.0.1.
        $LOWRANK_DATA_MIRRORS (base URLs separated by spaces: an institute's mirror holding the same
        file names) replaces every source's mirrors.

    Returns the root. Verified files already present are not downloaded again; an unpacked archive
    found in place is checked file by file (FetchError for one that is not the published one). A mirror that cannot be
    reached or answers with an HTTP error (403, 404, 5xx) is passed over for the next one. Raises
    FetchError with a one-line message; when no mirror served a file, it names each mirror's failure,
    the files, where to get them and the folder to put them in.
    """
    table = SOURCES if sources is None else sources
    check_choice(name, "dataset", frozenset(table))
    source = table[name]
    mirrors = os.environ.get(MIRRORS_ENV, "").split()
    if mirrors:
        source = source._replace(mirrors=tuple(m if m.endswith("/") else m + "/" for m in mirrors))
    root = resolve_root(None) if root in (None, "") else expand(root)
    folder = root / source.folder
    if source.extract_to and _verified(root / source.extract_to, source.expect):
        return root
    for fname, md5 in source.files:
        reasons, offline = [], True
        for base in source.mirrors:
            try:
                download(base + fname, folder / fname, md5, progress=progress, timeout=timeout,
                         max_bytes=dict(source.sizes).get(fname, DOWNLOAD_MAX_BYTES))
                break
            except (_Offline, _Refused) as err:
                reasons.append(f"{base} ({err})")
                offline = offline and isinstance(err, _Offline)
        else:
            names = ", ".join(f for f, _ in source.files)
            why = f"offline? could not reach {' or '.join(reasons)}" if offline else \
                f"no mirror served {fname}: {'; '.join(reasons)}"
            raise FetchError(f"{why}: download {names} from {source.mirrors[0]} yourself (md5 sums in "
                             f"lowrank.core.datasets.SOURCES) and put them in {folder.resolve()}")
        if source.extract_to:
            _extract(folder / fname, root, source)
    return root
