"""Where tensors live: CUDA when present, the CPU otherwise. Notebooks never name a device."""

from __future__ import annotations

import os

import torch

__all__ = ["get_device", "describe_device", "deterministic", "reproducible"]


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


def deterministic() -> None:
    """Make torch choose deterministic kernels (called by `reproducible`; importing changes nothing).

    On the CPU this makes a seeded run repeat bit for bit. On CUDA, cuBLAS also needs
    CUBLAS_WORKSPACE_CONFIG set before its first use (done here when unset); a few GPU kernels have
    no deterministic version and only warn, and results still differ from the CPU's in the last bits
    (different summation order), which is why golden values are for the CPU.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # torch.use_deterministic_algorithms also imports torch._inductor to set its flag, 0.9 s of every
    # kernel's and sweep process's start; the book never compiles, so set the kernels' flag alone.
    set_flag = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_flag is None:
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        set_flag(True, warn_only=True)
    # deterministic mode also fills every new tensor with NaN before its kernel writes it (2-3 %
    # of a CPU training step); no code here reads memory it has not written, so skip the fill.
    torch.utils.deterministic.fill_uninitialized_memory = False


def reproducible(seed: int | None = None, *, cpu_threads: int | None = None) -> None:
    """The explicit start of every notebook and runner: deterministic kernels, then (on the CPU)
    `cpu_threads` threads when given, then torch's global seed when given.

    Parameters
    ----------
    seed : torch's global seed (functions that take a `generator` do not read it).
    cpu_threads : threads for CPU kernels; one thread is faster for the book's small tensors and
        fixes the summation order. Ignored when CUDA is present.
    """
    deterministic()
    if cpu_threads is not None and not torch.cuda.is_available():
        torch.set_num_threads(cpu_threads)
    if seed is not None:
        torch.manual_seed(seed)
