"""Checkpoints of an ensemble's training: what a checkpoint belongs to, saving and resuming.

`lowrank.core.train.train_ensemble` writes its whole `EnsembleState` (parameters, buffers, momentum,
every generator, the monitor table so far) every `checkpoint_every` epochs with `save`, atomically,
and resumes from an existing file with `resume`. A checkpoint carries an `identity`: the runs,
every field of the `TrainConfig` that can change the table, the model's shapes, the data split and
the code of `lowrank/core/`; resuming with any of them changed is refused, as is a file written by
another format (`CHECKPOINT_FORMAT`) or holding more epochs than asked for.

A checkpoint holds tensors and plain data only (`_plain`), and is read with
`torch.load(weights_only=True)`: a file holding anything else (a crafted pickle whose loading would
run code) is refused, never unpickled. The path is checked before training: a folder, a device or a
FIFO is refused (a write would replace /dev/null by a regular file), a link is written through.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from lowrank.core.datasets import Dataset
from lowrank.core.io import OutputRefused, check_replaceable, digest, write_atomically

# `cfg` below is a `lowrank.core.train.TrainConfig` and `state` an `EnsembleState` (not imported:
# the training loop imports this module).

__all__ = ["CHECKPOINT_FORMAT", "identity", "check_checkpoint_path", "resume", "save"]

CHECKPOINT_FORMAT = 6  # 6: tensors and plain data only (read with weights_only=True); 5: identity from every TrainConfig field (`_identity`); 4: identity with model,
# data split, settings, code; 3: EnsembleState payload, lr_decay; 2: per-member augmentation generators


def _tensor_digest(*tensors) -> str:
    parts = []
    for t in tensors:
        t = t.detach().cpu().contiguous()
        parts += [f"{t.dtype}{tuple(t.shape)}", t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes()]
    return digest(*parts)


def _code_digest() -> str:
    """Hash of the shared layer's source (`lowrank/core/`: this loop, the nets, the data, spectral)."""
    root = Path(__file__).resolve().parent
    return digest(*[part for f in sorted(root.rglob("*.py")) for part in (f.relative_to(root).as_posix(), f)])


def _canonical(value):
    """`value` as plain data that compares equal exactly when the value would act the same: numbers,
    strings, lists, dicts; a function by its qualified name, its default arguments and the values
    it closes over (a `lambda x, g: augment_images(x, g, rotation=r)` records `r`); a
    `functools.partial` by its function and arguments; anything else by its type and repr."""
    import functools

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, torch.Tensor):
        return {"tensor": _tensor_digest(value)}
    if isinstance(value, functools.partial):
        return {"partial": _canonical(value.func), "args": _canonical(value.args),
                "keywords": _canonical(dict(value.keywords))}
    if callable(value) and hasattr(value, "__qualname__"):
        out = {"function": f"{getattr(value, '__module__', '')}.{value.__qualname__}"}
        code = getattr(value, "__code__", None)
        if code is not None:
            cells = value.__closure__ or ()
            out["closure"] = {name: _canonical(cell.cell_contents) for name, cell in zip(code.co_freevars, cells)}
            out["defaults"] = _canonical(list(value.__defaults__ or ()) + sorted((value.__kwdefaults__ or {}).items()))
        return out
    return {"type": type(value).__qualname__, "repr": repr(value)}


def identity(runs, cfg, model: nn.Module, data: Dataset) -> dict:
    """What a checkpoint belongs to: the runs, every field of the configuration that can change the
    table (`TrainConfig` fields without `identity: False` metadata, made plain by `_canonical`: a
    field added to the configuration is part of the identity without a word here), the model
    (class, parameter and buffer shapes), the data split (hashes of the train and test tensors)
    and the code (`_code_digest`). Resuming with any of them changed is refused."""
    shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    settings = {f.name: _canonical(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
                if f.metadata.get("identity", True)}
    return {"runs": _canonical(runs), **settings,
            "model": {"class": type(model).__name__, "shapes": shapes},
            "data": {"train": _tensor_digest(data.x_train, data.y_train), "test": _tensor_digest(data.x_test, data.y_test)},
            "code": _code_digest()}


def check_checkpoint_path(path, *, content: bool = False) -> None:
    """Refuse, before any training, a checkpoint path that is a folder or lies in a missing or
    unwritable folder (training would otherwise fail at the first save, an epoch later). With
    `content`, a file already there must also be a lowrank checkpoint of this format (a sweep checks
    every point's file so before its first run; whether it matches the run is known only at training)."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"checkpoint {p} is a folder; give a file path")
    try:
        p = check_replaceable(p, "checkpoint")  # a device, a FIFO, a link: refused
    except OutputRefused as err:
        raise ValueError(str(err)) from None
    if p.is_file():
        try:  # a file there is resumed from: one that cannot be read is said so now, and left as it is
            with open(p, "rb"):
                pass
        except PermissionError:
            raise ValueError(_unreadable(p)) from None
        if content:
            _check_format(_load_checkpoint(p, "cpu"), p)
    if not p.parent.is_dir():
        raise ValueError(f"checkpoint {p}: folder {p.parent} does not exist")
    if not os.access(p.parent, os.W_OK | os.X_OK):
        raise ValueError(f"checkpoint {p}: folder {p.parent} is not writable")


def _unreadable(path) -> str:
    return (f"checkpoint {path} cannot be read (permission denied); it is left as it is: make it readable or "
            f"pass another path")


def _load_checkpoint(path: Path, dev) -> dict:
    """The saved payload, or ValueError naming the file when it cannot be read. A file that is no
    lowrank checkpoint may be a user's: it is left as it is and another path asked for."""
    leave = "it is left as it is: pass another path"
    try:
        saved = torch.load(path, map_location=dev, weights_only=True)  # never runs a pickle's code
    except PermissionError:
        raise ValueError(_unreadable(path)) from None
    except pickle.UnpicklingError as err:
        # torch's restricted unpickler met a class or a function to call; its message advises loading with
        # weights_only=False, which would run the file's code: only the name of the global is shown
        found = re.search(r"GLOBAL\s+([\w.]+)", str(err))
        if found:
            raise ValueError(f"checkpoint {path} is not a lowrank checkpoint: it holds objects other than tensors "
                             f"and plain data (it names {found[1]}); refused, not unpickled; {leave}") from None
        raise ValueError(f"checkpoint {path} is unreadable: not a lowrank checkpoint (UnpicklingError); "
                         f"{leave}") from None
    except Exception as err:  # zip and EOF errors of a truncated or foreign file
        raise ValueError(f"checkpoint {path} is unreadable: not a lowrank checkpoint ({type(err).__name__}); "
                         f"{leave}") from None
    if not isinstance(saved, dict):
        raise ValueError(f"checkpoint {path} does not hold a lowrank.core.train checkpoint; {leave}")
    return saved


def _check_format(saved: dict, path) -> None:
    if saved.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {path} was written by another version of lowrank.core.train "
                         f"(format {saved.get('format')}, this one reads {CHECKPOINT_FORMAT}); remove it")


def resume(cfg, identity: dict, state, dev) -> bool:
    """Restore `state` from `cfg.checkpoint` if the file exists; whether it did."""
    if cfg.checkpoint is None or not Path(cfg.checkpoint).is_file():
        return False
    saved = _load_checkpoint(Path(cfg.checkpoint), dev)
    _check_format(saved, cfg.checkpoint)
    before = saved.get("identity") or {}
    differ = [k for k in identity if before.get(k) != identity[k]]
    if differ:
        what = ", ".join("data split" if k == "data" else k.replace("_", " ") for k in differ)
        raise ValueError(f"checkpoint {cfg.checkpoint} belongs to other {what}; remove it or pass another path")
    if int(saved.get("epoch", 0)) > cfg.epochs:
        raise ValueError(f"checkpoint {cfg.checkpoint} holds {saved['epoch']} epochs, more than epochs={cfg.epochs}: "
                         f"its table would not be the one asked for; remove it, pass another path, or ask for "
                         f"epochs >= {saved['epoch']}")
    state.restore(saved, dev)
    return True


def _plain(value):
    """`value` with numpy scalars as Python numbers and numpy arrays as tensors: what
    `torch.load(weights_only=True)` reads back."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def save(cfg, identity: dict, state):
    payload = _plain({"format": CHECKPOINT_FORMAT, "identity": identity, **state.payload()})
    write_atomically(cfg.checkpoint, save=lambda tmp: torch.save(payload, tmp))
