"""`lowrank run` / `list` / `report`: parameters are validated before anything runs, run folders
are complete or absent, reruns reuse them."""

import json

import pytest

from lowrank.book import cli, keys, notebooks, rules, runs
from lowrank.core import io

NB = "gradients/decomposition"
# a seconds-long variant of the notebook
TINY = {"n": 40, "d": 50, "m": 60, "nus": [0.0, 0.375], "activations": ["tanh"], "losses": ["mse"],
        "weights": ["isotropic"]}


def test_specs_come_from_the_parameter_cell():
    specs = rules.parameter_specs(NB)
    assert specs["mu"].schema["enum"] == ["sample", "quadrature"]
    assert specs["n"].schema == {"type": "integer", "minimum": 2} and specs["n"].default == 375
    assert "relu" in specs["activations"].schema["items"]["enum"]


def test_every_notebook_parameter_cell_is_readable():
    for name in notebooks.list_notebooks():
        assert rules.parameter_specs(name)["scale"].default == "ci"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"activation": ["relu"]}, "no parameter 'activation'; did you mean 'activations'"),
        ({"nnn": 3}, "no parameter 'nnn'"),
        ({"n": 1}, "'n': 1 is below the minimum"),
        ({"n": 3.5}, "'n': 3.5 is not an int"),
        ({"n": "many"}, "'n': 'many' is not an int"),
        ({"mu": "median"}, "'mu': 'median' is not allowed"),
        ({"nus": [0.1, 5.0]}, "'nus': element 5.0 is above the maximum"),
        ({"nus": []}, "not a non-empty list"),
        ({"nus": 0.1}, "0.1 is not a list"),
        ({"activations": ["swish"]}, "element 'swish' is not allowed"),
        ({"losses": ["mse", 3]}, "element 3 is not a string"),
        ({"scale": "paper"}, "set it with --scale"),
        ({"alignment_threshold": 1.5}, "above the maximum"),
        ({"seed": -1}, "below the minimum"),
    ],
)
def test_bad_parameters_are_rejected_before_running(overrides, message, tmp_path):
    with pytest.raises(rules.ParameterError, match=message):
        rules.resolve_parameters(NB, overrides=overrides)


def test_bad_parameter_files(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(rules.ParameterError, match="does not exist"):
        rules.resolve_parameters(NB, params_file=missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("n: [1, 2\n")
    with pytest.raises(rules.ParameterError, match="not valid YAML"):
        rules.resolve_parameters(NB, params_file=broken)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(rules.ParameterError, match="must hold a mapping"):
        rules.resolve_parameters(NB, params_file=listy)
    with pytest.raises(rules.ParameterError, match="scale must be"):
        rules.resolve_parameters(NB, scale="huge")
    with pytest.raises(FileNotFoundError, match="did you mean gradients/decomposition"):
        rules.resolve_parameters("gradients/decompositon")


def test_paper_scale_and_overrides_layer():
    p = rules.resolve_parameters(NB, scale="paper", overrides={"seed": 3})
    assert (p["n"], p["d"], p["m"], p["seed"], p["scale"]) == (750, 1000, 1250, 3, "paper")
    assert rules.resolve_parameters(NB)["n"] == 375


def test_cli_error_exit_code_and_message(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "RUNS", tmp_path)
    assert cli.main(["run", NB, "-p", "mu", "median"]) == 2
    assert "'mu': 'median' is not allowed" in capsys.readouterr().err
    assert not any(tmp_path.iterdir()), "a rejected run wrote something"


def test_failed_run_leaves_no_folder(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        (kwargs["figure_dir"]).mkdir(parents=True)
        raise RuntimeError("kernel died")

    monkeypatch.setattr(notebooks, "execute", boom)
    params = rules.resolve_parameters(NB, overrides=TINY)
    with pytest.raises(RuntimeError, match="kernel died"):
        runs.run(NB, params, runs_root=tmp_path)
    assert list((tmp_path / NB).iterdir()) == []


def test_a_notebook_to_run_is_resolved_once_with_its_code_key():
    """`notebook_code` checks the name as `code_key` does, and carries the key that run folders use."""
    assert keys.notebook_code(NB) == keys.NotebookCode(NB, keys.code_key(NB))
    with pytest.raises(notebooks.InputError, match="PART/NAME"):
        keys.notebook_code("../gradients/decomposition")
    with pytest.raises(FileNotFoundError, match="did you mean gradients/decomposition"):
        keys.notebook_code("gradients/decompositio")


@pytest.mark.slow
def test_run_folder_contents_reuse_and_report(tmp_path):
    params = rules.resolve_parameters(NB, overrides=TINY)
    folder, reused = runs.run(NB, params, runs_root=tmp_path)
    assert not reused and folder.name == runs.run_hash(NB, params, keys.code_key(NB))
    prov = json.loads((folder / "provenance.json").read_text())
    assert prov["parameters"] == params and prov["wall_s"] > 0 and "commit" in prov["git"]
    assert prov["load_at_start"]["cpus"] >= 1 and prov["load_at_end"]["load_average_1m"] >= 0
    assert set(prov["versions"]) >= {"torch", "numpy", "lowrank"}
    verdicts = json.loads((folder / "verdicts.json").read_text())
    assert verdicts["identity_residual"]["measured"] < 1e-12
    for ext in ("png", "svg", "csv"):
        assert (folder / "figures" / f"decomposition_fig1_spectra.{ext}").stat().st_size > 0
    again, reused = runs.run(NB, params, runs_root=tmp_path)
    assert reused and again == folder
    from lowrank.book.report import render

    out = render([runs.load_run(folder), runs.load_run(folder)], tmp_path / "report.html")
    text = out.read_text()
    assert "identity_residual" in text and "data:image/png;base64" in text


@pytest.mark.slow
def test_same_parameters_give_identical_verdicts(tmp_path):
    """Determinism on the CPU: two executions, bit-identical verdicts (not just rounded)."""
    params = rules.resolve_parameters(NB, overrides={**TINY, "seed": 7})
    first, _ = runs.run(NB, params, runs_root=tmp_path / "a")
    second, _ = runs.run(NB, params, runs_root=tmp_path / "b")
    assert (first / "verdicts.json").read_text() == (second / "verdicts.json").read_text()
    assert (first / "figures" / "decomposition_outlier_counts.csv").read_bytes() == \
        (second / "figures" / "decomposition_outlier_counts.csv").read_bytes()


def _fake_execute(calls):
    """A stand-in for `notebooks.execute` that writes what a notebook run writes, and counts runs."""
    from lowrank.book.verdicts import GLUE_PREFIX

    def execute(name, output, parameters=None, figure_dir=None, **kwargs):
        calls.append(parameters)
        output.write_text('{"cells": []}')
        figure_dir.mkdir(parents=True)
        (figure_dir / "fig.png").write_bytes(b"png")
        return {GLUE_PREFIX + "v": {"measured": 1.0, "outcome": "agrees", "expected": "1", "claim": "X", "kind": "check"}}

    return execute


@pytest.mark.parametrize("tamper, why", [
    (lambda f: (f / "figures" / "fig.png").unlink(), "figures/fig.png missing"),
    (lambda f: (f / "verdicts.json").unlink(), "verdicts.json missing"),
])
@pytest.mark.slow
def test_a_changed_run_folder_is_run_again_and_said(tmp_path, monkeypatch, capsys, tamper, why):
    calls = []
    monkeypatch.setattr(notebooks, "execute", _fake_execute(calls))
    params = rules.resolve_parameters(NB, overrides=TINY)
    folder, reused = runs.run(NB, params, runs_root=tmp_path)
    assert not reused and runs.manifest_problems(folder) == []
    assert runs.run(NB, params, runs_root=tmp_path) == (folder, True) and len(calls) == 1
    tamper(folder)
    again, reused = runs.run(NB, params, runs_root=tmp_path)
    assert again == folder and not reused and len(calls) == 2
    assert why in capsys.readouterr().err and runs.manifest_problems(folder) == []


@pytest.mark.parametrize("name, text", [("verdicts.json", "{}"), ("verdicts.json", '{"v": {"meas'), ("notebook.ipynb", "")])
@pytest.mark.slow
def test_a_run_folder_with_an_edited_file_is_left_as_it_is(tmp_path, monkeypatch, name, text):
    """An edit to a file of the run is the user's: the rerun refuses, names the file, deletes nothing."""
    calls = []
    monkeypatch.setattr(notebooks, "execute", _fake_execute(calls))
    params = rules.resolve_parameters(NB, overrides=TINY)
    folder, _ = runs.run(NB, params, runs_root=tmp_path)
    (folder / name).write_text(text)
    with pytest.raises(runs.RunFolderError, match=f"changed since \\({name}\\)"):
        runs.run(NB, params, runs_root=tmp_path)
    assert (folder / name).read_text() == text and len(calls) == 1


@pytest.mark.slow
def test_a_run_folder_without_its_manifest_is_left_as_it_is(tmp_path, monkeypatch):
    """Without a readable manifest nothing says which files the run wrote: the rerun refuses, deletes nothing."""
    calls = []
    monkeypatch.setattr(notebooks, "execute", _fake_execute(calls))
    params = rules.resolve_parameters(NB, overrides=TINY)
    folder, _ = runs.run(NB, params, runs_root=tmp_path)
    (folder / "manifest.json").unlink()
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    with pytest.raises(runs.RunFolderError, match="nothing was deleted"):
        runs.run(NB, params, runs_root=tmp_path)
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before and len(calls) == 1


def test_the_run_key_covers_the_code(tmp_path, monkeypatch):
    """The folder name changes with the hash of the code (the build's execution key), not only with
    the notebook and parameters; the key is the build's own, and `lowrank run` names its folder by it."""
    params = rules.resolve_parameters(NB, overrides=TINY)
    assert keys.code_key(NB) == keys.execution_key(NB)
    before = runs.run_hash(NB, params, keys.code_key(NB))
    assert runs.run_hash(NB, params, "edited lowrank/") != before
    assert runs.run_dir(NB, params).name == before
    monkeypatch.setattr(keys, "execution_key", lambda name: "edited lowrank/")
    assert runs.run_dir(NB, params).name == runs.run_hash(NB, params, "edited lowrank/")


@pytest.mark.slow
def test_stale_partial_folders_of_dead_processes_are_cleaned(tmp_path, monkeypatch):
    import os
    import socket
    import subprocess
    import sys

    calls = []
    monkeypatch.setattr(notebooks, "execute", _fake_execute(calls))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    params = rules.resolve_parameters(NB, overrides=TINY)
    parent = tmp_path / NB
    parent.mkdir(parents=True)
    stale = [parent / f".abc.partial-{dead}", parent / f".abc.partial-{socket.gethostname()}-{dead}"]
    alive = parent / f".abc.partial-{os.getpid()}"  # this process: alive, kept
    other_host = parent / f".abc.partial-elsewhere-{dead}"  # another machine's process: not ours to judge
    for p in (*stale, alive, other_host):
        io.make_work_folder(p)  # as a run writes them, with the marker
    unmarked = parent / f".thesis.partial-{dead}"  # the same shape without the marker: a user's
    unmarked.mkdir()
    runs.run(NB, params, runs_root=tmp_path)
    assert not any(p.exists() for p in stale) and alive.exists() and other_host.exists() and unmarked.exists()


def test_files_are_readable_by_all(tmp_path, monkeypatch):
    """Figures and reports are 0644 (mkstemp's 0600 would hide them from a web server)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from lowrank.book import plotting
    from lowrank.core.io import write_atomically

    monkeypatch.setenv("LOWRANK_FIGURE_DIR", str(tmp_path / "figs"))
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    plotting.save_figure(fig, "f", pd.DataFrame({"x": [0, 1]}))
    out = write_atomically(tmp_path / "r.html", "<html></html>")
    for p in [*(tmp_path / "figs").iterdir(), out]:
        assert p.stat().st_mode & 0o777 == 0o644, p
    assert sorted(q.name for q in tmp_path.rglob("*") if q.is_file()) == ["f.csv", "f.phone.png", "f.png", "f.svg", "r.html"]


def test_report_temporary_file_is_removed_on_error(tmp_path, monkeypatch):
    from lowrank.core import io

    def boom(*args):
        raise OSError("disk full")

    monkeypatch.setattr(io.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        io.write_atomically(tmp_path / "r.html", "x")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_kernels_start_without_the_tcp_warning(tmp_path, monkeypatch, capfd):
    """The kernel's sockets are local IPC, so it no longer prints "Kernel is running over TCP
    without encryption"; with jupyter_client's default (TCP) manager the same run prints it."""
    from pathlib import Path

    from jupyter_client import AsyncKernelManager

    monkeypatch.setattr(notebooks, "NOTEBOOK_ROOT", Path(__file__).parent / "fixtures" / "notebooks")
    notebooks.execute("fixture/tiny", tmp_path / "ipc.ipynb")
    assert "without encryption" not in capfd.readouterr().err
    monkeypatch.setattr(notebooks, "_kernel_manager_class", lambda prefix: AsyncKernelManager)
    notebooks.execute("fixture/tiny", tmp_path / "tcp.ipynb")
    assert "without encryption" in capfd.readouterr().err


@pytest.mark.slow
def test_kernels_started_at_once_in_one_folder_get_sockets_of_their_own(tmp_path, monkeypatch):
    """Two executions of the same notebook at once (the goldens' seeds, the build's two jobs) each
    get their own IPC sockets, none of them in the notebook's folder (jupyter_client's default puts
    "kernel-ipc-N" there, and two kernels starting together then pick the same ones)."""
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    root = Path(__file__).parent / "fixtures" / "notebooks"
    monkeypatch.setattr(notebooks, "NOTEBOOK_ROOT", root)
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda k: notebooks.execute("fixture/tiny", tmp_path / f"{k}.ipynb"), range(2)))
    assert len(done) == 2 and all((tmp_path / f"{k}.ipynb").is_file() for k in range(2))
    assert not list((root / "fixture").glob("kernel-ipc*"))
    manager = notebooks._kernel_manager_class(notebooks.kernel_file_prefix("a"))()
    assert manager.transport == "ipc" and manager.ip != notebooks._kernel_manager_class(notebooks.kernel_file_prefix("b"))().ip


def test_path_parameters_are_made_absolute(tmp_path, monkeypatch):
    """A `{path: file}` parameter names an existing file, relative to the caller's folder; the kernel
    (which runs in the notebook's folder) gets it as an absolute path."""
    from pathlib import Path

    monkeypatch.setattr(notebooks, "NOTEBOOK_ROOT", Path(__file__).parent / "fixtures" / "notebooks")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text("x\n1\n")
    assert rules.resolve_parameters("fixture/tiny", overrides={"table": "t.csv"})["table"] == str(tmp_path / "t.csv")
    assert rules.resolve_parameters("fixture/tiny")["table"] == ""


def test_execute_leaves_no_work_folder_and_cleans_dead_ones(tmp_path, monkeypatch):
    """`notebooks.execute` works in `.NAME.partial-HOST-PID` next to its output: removed when the
    kernel fails, and removed by the next execution when its process was killed."""
    import socket
    import subprocess
    import sys

    import papermill

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = io.make_work_folder(tmp_path / f".nb.partial-{socket.gethostname()}-{dead}")

    def kernel_dies(*args, **kwargs):
        raise RuntimeError("kernel died")

    monkeypatch.setattr(papermill, "execute_notebook", kernel_dies)
    with pytest.raises(RuntimeError, match="kernel died"):
        notebooks.execute(NB, tmp_path / "nb.ipynb")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_lowrank_run_shows_progress_per_cell(tmp_path, monkeypatch, capsys):
    """`lowrank run` is not silent while it works: papermill's bar counts the executed cells."""
    monkeypatch.setattr(runs, "RUNS", tmp_path)
    args = ["run", NB]
    for k, v in TINY.items():
        args += ["-p", k, json.dumps(v)]
    assert cli.main(args) == 0
    captured = capsys.readouterr()
    assert "Executing" in captured.err and "cell" in captured.err
    assert f"wrote {tmp_path}" in captured.out
