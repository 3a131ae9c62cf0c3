"""Independent tasks in worker processes: the one place a page's loop over draws is spread over the cores.

`map_tasks(function, tasks, workers)` is `[function(task) for task in tasks]`: in this process for
`workers=1`, otherwise in `workers` spawned processes with one thread each (torch, and the BLAS that
NumPy and SciPy load), the results returned in the order of `tasks`. A task must carry its own seed
(a draw's index, a grid cell's seed), so that what it computes does not depend on which process runs
it: with one torch thread in the calling process too, the results for every `workers` are the same,
value for value (the workers run torch's CPU kernels of the calling process, whatever
ATEN_CPU_CAPABILITY says by then). `function` must be importable by name (a module-level function, or a
`functools.partial` of one), as the spawned processes import it.

The workers are joblib's loky executor, reused across calls and resized to `workers` (a page calls it
once per figure, and a spawned process starts by importing torch and the package again); they stop
after `IDLE_SECONDS` without a task. A worker ignores SIGINT: Jupyter interrupts and shuts a kernel
down through its process group, and the kernel's process ends the pool.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from lowrank.core import device

__all__ = ["check_workers", "map_tasks"]

# NumPy's and SciPy's BLAS (ARPACK's products) read these when they load: without them each worker's
# BLAS would start a thread per core, and two workers would oversubscribe the cores
_ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

_CPU_PATH = "ATEN_CPU_CAPABILITY"  # read once by torch when it loads: "default", "avx2", "avx512", ...
IDLE_SECONDS = 300  # an idle worker stops after this (loky's default, 10 s, would restart them per figure)


def check_workers(workers) -> int:
    """`workers` if it is a positive integer (a number of processes), else a one-line ValueError."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be a positive integer (processes), got {workers!r}")
    return workers


def _start_worker():
    import signal

    # an interrupt or the kernel's shutdown reaches the whole process group: the parent ends the pool,
    # and the workers would each print a KeyboardInterrupt traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    device.reproducible(cpu_threads=1)  # two workers on two cores: one thread each


def map_tasks(function: Callable, tasks: Iterable, workers: int = 1, desc: str | None = None) -> list:
    """`[function(task) for task in tasks]`, in this process (`workers=1`, or fewer than two tasks) or
    spread over `workers` spawned processes with one thread each; the results in the order of `tasks`.

    Parameters
    ----------
    function : a module-level function of one task (or a `functools.partial` of one): the workers import it.
    tasks : the tasks, each seeded by its own index or seed.
    workers : processes (a positive integer); 1 runs every task here, as a plain loop.
    desc : the label of a progress bar over the tasks done (none without it).
    """
    from tqdm.auto import tqdm

    check_workers(workers)
    tasks = list(tasks)

    def progress(results):
        return tqdm(results, total=len(tasks), desc=desc, disable=desc is None)

    if workers == 1 or len(tasks) < 2:
        return [function(task) for task in progress(tasks)]
    from joblib.externals.loky import get_reusable_executor

    # the workers get, before anything loads, one BLAS thread each and torch's CPU kernels of this process
    # (ATEN_CPU_CAPABILITY set since it started would otherwise give them other rounding)
    env = {**_ONE_THREAD, _CPU_PATH: torch.backends.cpu.get_cpu_capability().lower()}
    pool = get_reusable_executor(workers, timeout=IDLE_SECONDS, initializer=_start_worker, env=env)
    return list(progress(pool.map(function, tasks, chunksize=max(1, len(tasks) // (8 * workers)))))
