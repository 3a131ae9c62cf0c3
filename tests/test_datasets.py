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
