"""Where tensors live: CUDA when present, the CPU otherwise. Notebooks never name a device."""

from __future__ import annotations

import os

import torch

__all__ = ["get_device", "describe_device"]


def get_device() -> torch.device:
    """`cuda` when available, else `cpu`; the environment variable LOWRANK_DEVICE overrides."""
    forced = os.environ.get("LOWRANK_DEVICE")
    if forced:
        dev = torch.device(forced)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"LOWRANK_DEVICE={forced} but CUDA is not available on this machine")
        return dev
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def describe_device(device: torch.device | None = None) -> str:
    dev = device or get_device()
    if dev.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(dev)})"
    return f"cpu ({torch.get_num_threads()} threads)"
