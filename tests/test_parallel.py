"""lowrank.core.parallel: tasks in worker processes come back in task order, with the values one process
computes, from workers that run one thread and leave the interrupt to the page's process."""

import os
import signal

import numpy as np
import pytest
import torch

from lowrank.core import parallel


def _seeded_spectrum(seed):
    """A seeded task whose value depends on every rounding: the singular values of a product."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(60, 40, generator=g, dtype=torch.float64), torch.randn(40, 50, generator=g, dtype=torch.float64)
    return torch.linalg.svdvals(a @ b).numpy()


def _worker_state(task):
    return {"task": task, "pid": os.getpid(), "sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
            "torch_threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
            "cpu_path": torch.backends.cpu.get_cpu_capability()}


def test_results_come_back_in_task_order_and_equal_one_process_value_for_value():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tasks = [7, 3, 11, 0, 5, 2, 9]
        one = parallel.map_tasks(_seeded_spectrum, tasks, 1)
        two = parallel.map_tasks(_seeded_spectrum, tasks, 2)
    finally:
        torch.set_num_threads(threads)
    assert len(two) == len(tasks)
    for task, a, b in zip(tasks, one, two):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, _seeded_spectrum(task))  # the task's own value, not a neighbour's
    assert parallel.map_tasks(abs, range(-20, 0), 2) == list(range(20, 0, -1))


def test_a_worker_ignores_the_interrupt_and_runs_one_thread():
    """Jupyter interrupts and shuts a kernel down through its process group: a worker leaves the
    interrupt to the page's process (which ends the pool) instead of printing a traceback."""
    before = os.environ.get("OMP_NUM_THREADS")
    # a kernel's own handler (pytest-xdist's workers may ignore SIGINT, and spawned processes would inherit
    # that); three workers: a pool of its own, started under this handler
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        states = parallel.map_tasks(_worker_state, range(8), 3)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the caller's handler untouched
    finally:
        signal.signal(signal.SIGINT, handler)
    assert [s["task"] for s in states] == list(range(8))
    assert all(s["pid"] != os.getpid() for s in states)
    assert all(s["sigint_ignored"] and s["torch_threads"] == 1 and s["omp"] == "1" for s in states)
    assert os.environ.get("OMP_NUM_THREADS") == before  # the caller's environment is restored


def test_workers_run_the_cpu_kernels_of_the_calling_process(monkeypatch):
    """ATEN_CPU_CAPABILITY set after torch loaded (as `lowrank goldens` does for its kernels) changes
    nothing here; workers spawned then would take other kernels, and other rounding, without the pin."""
    own = torch.backends.cpu.get_cpu_capability()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2" if own == "DEFAULT" else "default")
    states = parallel.map_tasks(_worker_state, range(3), 3)  # a new pool, spawned under that variable
    assert {s["cpu_path"] for s in states} == {own}
    assert os.environ["ATEN_CPU_CAPABILITY"] == ("avx2" if own == "DEFAULT" else "default")  # restored


def test_one_worker_or_one_task_runs_here():
    assert parallel.map_tasks(_worker_state, range(3), 1)[0]["pid"] == os.getpid()
    assert parallel.map_tasks(_worker_state, [5], 2)[0]["pid"] == os.getpid()
    assert parallel.map_tasks(_worker_state, [], 2) == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_bad_workers_is_a_one_line_error(bad):
    with pytest.raises(ValueError, match="workers must be a positive integer") as err:
        parallel.map_tasks(abs, [1, 2], bad)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="workers"):
        parallel.check_workers(bad)
    assert parallel.check_workers(3) == 3


def test_desc_shows_a_progress_bar_over_the_tasks_done(capsys):
    assert parallel.map_tasks(abs, [-1, -2, -3], 1, desc="draws") == [1, 2, 3]
    bar = capsys.readouterr().err
    assert "draws" in bar and "3/3" in bar
    parallel.map_tasks(abs, [-1, -2, -3], 1)
    assert capsys.readouterr().err == ""  # no label, no bar
