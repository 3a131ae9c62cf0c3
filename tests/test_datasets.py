"""Offline data sets: shapes, splits, labels; missing or broken local files are reported clearly."""

import gzip

import numpy as np
import pytest
import torch

from lowrank.core import datasets


def test_digits_split_and_standardisation():
    d = datasets.digits(test_fraction=0.2, seed=0)
    assert d.x_train.shape == (1438, 64) and d.x_test.shape == (359, 64) and d.num_classes == 10
    assert torch.allclose(d.x_train.mean(0), torch.zeros(64), atol=1e-5)
    assert torch.equal(datasets.digits(seed=0).y_train, d.y_train)
    assert not torch.equal(datasets.digits(seed=1).y_train, d.y_train)


def test_binary_subset_and_random_labels():
    d = datasets.binary_subset(datasets.digits(), (3, 5))
    assert set(d.y_train.tolist()) == {-1, 1} and d.num_classes == 2
    flipped = datasets.random_labels(d.y_train, 1.0, 2, seed=0)
    assert set(flipped.tolist()) <= {-1, 1}
    assert torch.equal(datasets.random_labels(d.y_train, 0.0, 2, seed=0), d.y_train)
    with pytest.raises(ValueError, match="fraction"):
        datasets.random_labels(d.y_train, 1.5, 2, seed=0)
    with pytest.raises(ValueError, match="two different labels"):
        datasets.binary_subset(datasets.digits(), (3, 3))


def _write_idx(path, array):
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + array.astype(np.uint8).tobytes())


def test_mnist_from_a_local_folder(tmp_path):
    rng = np.random.default_rng(0)
    for stem, arr in {"train-images-idx3-ubyte": rng.integers(0, 256, (6, 28, 28)),
                      "train-labels-idx1-ubyte": np.arange(6) % 10,
                      "t10k-images-idx3-ubyte": rng.integers(0, 256, (4, 28, 28)),
                      "t10k-labels-idx1-ubyte": np.arange(4)}.items():
        _write_idx(tmp_path / f"{stem}.gz", arr)
    d = datasets.load("mnist", root=tmp_path)
    assert d.x_train.shape == (6, 1, 28, 28) and d.y_test.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("labels, images, message", [
    (np.arange(15) % 10, 20, "holds 20 images but .*train-labels-idx1-ubyte.gz 15 labels"),
    (np.array([0, 1, 200, 3, 4, 5]), 6, "holds the label 200: MNIST has 10 classes")])
def test_mnist_refuses_files_that_disagree(tmp_path, labels, images, message):
    """Issue 51: 20 images with 15 labels, and labels up to 200 with 10 classes, were accepted."""
    rng = np.random.default_rng(0)
    for stem, arr in {"train-images-idx3-ubyte": rng.integers(0, 256, (images, 28, 28)),
                      "train-labels-idx1-ubyte": labels,
                      "t10k-images-idx3-ubyte": rng.integers(0, 256, (4, 28, 28)),
                      "t10k-labels-idx1-ubyte": np.arange(4)}.items():
        _write_idx(tmp_path / f"{stem}.gz", arr)
    with pytest.raises(ValueError, match=message):
        datasets.load("mnist", root=tmp_path)


@pytest.mark.parametrize("name, expected", [("mnist", "train-images-idx3-ubyte"), ("cifar10", "data_batch_1")])
def test_missing_local_data_names_folder_and_files(tmp_path, name, expected):
    before = sorted(tmp_path.iterdir())
    with pytest.raises(FileNotFoundError) as err:
        datasets.load(name, root=tmp_path)
    assert str(tmp_path) in str(err.value) and expected in str(err.value)
    assert sorted(tmp_path.iterdir()) == before, "a failed load wrote something"
    with pytest.raises(ValueError, match="root=<folder>"):
        datasets.load(name)


def test_truncated_idx_file_is_rejected(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(bytes([0, 0, 8, 3]) + (10).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + b"\x00" * 100)
    with pytest.raises(ValueError, match="truncated"):
        datasets._read_idx(path)
    with pytest.raises(ValueError, match="dataset='imagenet'"):
        datasets.load("imagenet")


@pytest.mark.parametrize("num_samples, seed", [(400, 42), (250, 7)])
def test_mnist1d_generator_equals_the_package_bit_for_bit(num_samples, seed):
    # the batched generator against the package's own make_dataset (one signal at a time): same
    # random draws, same floating-point operations, hence equal arrays, not merely close ones
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = num_samples, seed
    ours, package = datasets._make_mnist1d(args), make_dataset(args)
    for key in ("x", "x_test", "y", "y_test"):
        assert ours[key].dtype == package[key].dtype and ours[key].shape == package[key].shape, key
        assert np.array_equal(ours[key], package[key]), key
    d = datasets.mnist1d(num_samples=num_samples, seed=seed, standardize=False)
    assert np.array_equal(d.x_train.numpy(), package["x"].astype(np.float32))
    d.y_train[:] = -1  # generated once per process: a caller's writes must not reach the next load
    again = datasets.mnist1d(num_samples=num_samples, seed=seed, standardize=False)
    assert np.array_equal(again.y_train.numpy(), package["y"])


def test_mnist1d_generator_refuses_a_shuffled_sequence():
    from mnist1d.data import get_dataset_args

    args = get_dataset_args()
    args.shuffle_seq = True
    with pytest.raises(ValueError, match="shuffle_seq"):
        datasets._make_mnist1d(args)


# ---- `lowrank data fetch` when things go wrong mid-way (issue 51, re-tested): an unpacking killed with -9
# leaves no half-written data folder and its leftover is removed by the next fetch; a mirror that takes the
# request and then says nothing is stopped at the timeout, in one line, keeping nothing

import http.server  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from lowrank.book import cli  # noqa: E402
from test_fetch import _Loopback, _cifar_archive, _mnist_files, _sources  # noqa: E402


def _everything(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_an_unpacking_killed_midway_leaves_no_data_folder_and_the_next_fetch_completes(tmp_path, monkeypatch):
    mnist, cifar = _mnist_files(), _cifar_archive()
    root = tmp_path / "d"
    root.mkdir()
    (root / "cifar-10-python.tar.gz").write_bytes(cifar)  # downloaded before: only the unpacking runs
    sources = _sources("http://127.0.0.1:9/", mnist, cifar)  # never asked: the archive is in place
    # a child process unpacks and is killed with -9 after the first batch is written: no `finally` runs
    child = textwrap.dedent(f"""
        import os, signal, sys, tarfile
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from lowrank.core import datasets
        from test_fetch import _mnist_files, _sources
        extract = tarfile.TarFile._extract_member
        seen = []
        def killed(self, tarinfo, *args, **kwargs):
            if seen:
                os.kill(os.getpid(), signal.SIGKILL)
            seen.append(tarinfo.name)
            return extract(self, tarinfo, *args, **kwargs)
        tarfile.TarFile._extract_member = killed
        archive = open({str(root / "cifar-10-python.tar.gz")!r}, "rb").read()
        datasets.fetch("cifar10", {str(root)!r}, sources=_sources("http://127.0.0.1:9/", _mnist_files(), archive),
                       progress=False)
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not (root / "cifar-10-batches-py").exists(), "a killed unpacking left a half-written data folder"
    leftovers = [p for p in root.iterdir() if p.name != "cifar-10-python.tar.gz"]
    assert leftovers and all(p.name.startswith(".") for p in leftovers)  # the kill left its hidden work folder
    with pytest.raises(FileNotFoundError):
        datasets.load("cifar10", root=root)  # the half-unpacked batches are not data
    datasets.fetch("cifar10", root, sources=sources, progress=False)
    assert _everything(root) == ["cifar-10-batches-py", *[f"cifar-10-batches-py/{n}" for n, _ in
                                 sources["cifar10"].expect], "cifar-10-python.tar.gz"]  # the leftover is gone
    monkeypatch.setitem(datasets.SOURCES, "cifar10", sources["cifar10"])  # the generated batches' sums
    assert datasets.load("cifar10", root=root).x_test.shape == (3, 3, 32, 32)


def test_an_unpacking_interrupted_leaves_nothing(tmp_path, monkeypatch):
    mnist, cifar = _mnist_files(), _cifar_archive()
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(cifar)
    extract = datasets.tarfile.TarFile._extract_member
    seen = []

    def interrupted(self, tarinfo, *args, **kwargs):
        if seen:
            raise KeyboardInterrupt
        seen.append(tarinfo.name)
        return extract(self, tarinfo, *args, **kwargs)

    monkeypatch.setattr(datasets.tarfile.TarFile, "_extract_member", interrupted)
    with pytest.raises(KeyboardInterrupt):
        datasets.fetch("cifar10", tmp_path, sources=_sources("http://127.0.0.1:9/", mnist, cifar), progress=False)
    assert _everything(tmp_path) == ["cifar-10-python.tar.gz"]


class _Silent(_Loopback):
    """A mirror that accepts the connection, reads the request and never answers (`body=False`), or
    sends its headers and then nothing (`body=True`)."""

    def __init__(self, body: bool):
        self.release = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if body:
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(b"x" * 10)
                    self.wfile.flush()
                server.release.wait(30)

            def log_message(self, *args):
                pass

        self.serve(Handler, daemon_threads=True)

    def __exit__(self, *exc):
        self.release.set()
        super().__exit__(*exc)


@pytest.mark.parametrize("body, message", [(False, "no answer within 0.5 s"), (True, "cut short")])
def test_a_mirror_that_hangs_is_stopped_at_the_timeout_in_one_line_keeping_nothing(tmp_path, capsys, monkeypatch,
                                                                                     body, message):
    mnist, cifar = _mnist_files(), _cifar_archive()
    with _Silent(body) as srv:
        sources = _sources(srv.base, mnist, cifar)
        started = time.monotonic()
        with pytest.raises(datasets.FetchError, match=message) as err:
            datasets.fetch("mnist", tmp_path / "d", sources=sources, progress=False, timeout=0.5)
        assert time.monotonic() - started < 10
        assert "\n" not in str(err.value) and srv.base in str(err.value) or body
    assert not (tmp_path / "d").exists() or _everything(tmp_path / "d") == []


def test_cli_fetch_from_a_hanging_mirror_is_one_line(tmp_path, capsys, monkeypatch):
    mnist, cifar = _mnist_files(), _cifar_archive()
    with _Silent(False) as srv:
        monkeypatch.setitem(datasets.SOURCES, "mnist", _sources(srv.base, mnist, cifar)["mnist"])
        monkeypatch.setenv("LOWRANK_DATA_MIRRORS", srv.base)
        real = datasets.fetch
        monkeypatch.setattr(datasets, "fetch", lambda *a, **k: real(*a, **(k | {"timeout": 0.5})))
        assert cli.main(["data", "fetch", "mnist", "--root", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no answer within 0.5 s" in err and "Traceback" not in err
    assert not (tmp_path / "d").exists() or _everything(tmp_path / "d") == []
