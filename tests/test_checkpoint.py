"""Checkpoint paths that are a user's files (lowrank.core.checkpoint): a file that cannot be read is
said to be so and left as it is; no message advises deleting a file lowrank did not write."""

import os

import pytest

from lowrank.core import checkpoint, datasets, train
from lowrank.core.nets import mlp


def _fit(ckpt, **kw):
    data = datasets.digits()
    return train.train_ensemble(lambda: mlp.mlp("MLP", 2, 8, 64, 10), data, [{"lr": 0.1, "seed": 0}],
                                batch_size=128, epochs=1, progress=False, checkpoint=ckpt, **kw)


def _denied(path, *args, **kwargs):
    raise PermissionError(13, "Permission denied", str(path))


def _no_training(*args, **kwargs):
    raise AssertionError("an epoch was trained before the checkpoint was found unreadable")


@pytest.mark.parametrize("how", ["chmod", "open refused"])
def test_an_unreadable_checkpoint_is_said_so_and_left_before_any_training(tmp_path, monkeypatch, how):
    ckpt = tmp_path / "mine.ckpt"
    ckpt.write_bytes(b"a user's file")
    if how == "chmod":
        if os.geteuid() == 0:
            pytest.skip("root reads a file whatever its mode")
        ckpt.chmod(0)
    else:  # as root: every open of the file is refused, as chmod 0 refuses it to a user
        monkeypatch.setattr(checkpoint, "open", _denied, raising=False)
        monkeypatch.setattr(checkpoint.torch, "load", _denied)
    monkeypatch.setattr(train, "_sgd_epoch", _no_training)
    with pytest.raises(ValueError) as err:
        _fit(ckpt)
    message = str(err.value)
    assert f"checkpoint {ckpt} cannot be read (permission denied)" in message
    assert "remove" not in message and "delete" not in message
    ckpt.chmod(0o600)
    assert ckpt.read_bytes() == b"a user's file" and sorted(tmp_path.iterdir()) == [ckpt]


def test_a_denied_read_while_loading_is_said_so(tmp_path, monkeypatch):
    """Made unreadable between the check and the load: the load says so too, not 'remove it'."""
    ckpt = tmp_path / "mine.ckpt"
    ckpt.write_bytes(b"x")
    monkeypatch.setattr(checkpoint.torch, "load", _denied)
    with pytest.raises(ValueError, match=f"checkpoint {ckpt} cannot be read \\(permission denied\\)") as err:
        checkpoint._load_checkpoint(ckpt, "cpu")
    assert "remove" not in str(err.value)


@pytest.mark.parametrize("content", [b"not a checkpoint at all", b"PK\x03\x04 truncated zip", b""])
def test_a_file_that_is_no_checkpoint_is_left_and_another_path_asked_for(tmp_path, content):
    ckpt = tmp_path / "notes.txt"
    ckpt.write_bytes(content)
    with pytest.raises(ValueError, match=f"checkpoint {ckpt} is unreadable") as err:
        _fit(ckpt)
    assert "remove" not in str(err.value) and "pass another path" in str(err.value)
    assert ckpt.read_bytes() == content
