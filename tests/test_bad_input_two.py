"""Bad input, round two (issue 29): the input is the run key, every training setting reaches the
checkpoint, divergence travels with the results, required outputs are required, one validation
vocabulary, bounded YAML and resources, clean interrupts. Each case failed on 2ddda80.

Refusals are one line (exit 2, or 1 for the environment) before any kernel starts; the fixture
notebooks (tests/fixtures/notebooks) stand in for notebooks/, and tests/fixtures/rules.yaml for
params/rules.yaml.
"""

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from lowrank.book import cli, goldens, keys, notebooks, rules, runs, sweeps

FIXTURES = Path(__file__).parent / "fixtures"
NB, TEXTY = "fixture/tiny", "fixture/texty"


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """Fixture notebooks and rules, runs into tmp_path/runs, the working folder tmp_path/cwd; any
    kernel start fails the test."""
    monkeypatch.setattr(notebooks, "NOTEBOOK_ROOT", FIXTURES / "notebooks")
    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(rules, "RULES_FILE", FIXTURES / "rules.yaml")
    monkeypatch.setenv("LOWRANK_MEMORY_LIMIT", "1G")
    monkeypatch.delenv("LOWRANK_SWEEP_MODULES", raising=False)

    def no_kernel(*args, **kwargs):
        raise AssertionError("a kernel was started for refused input")

    monkeypatch.setattr(notebooks, "execute", no_kernel)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return tmp_path


def one_line(argv, capsys, code=2):
    """`lowrank ARGV` exits with `code` and says one line on stderr; returns it."""
    got = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert got == code, err
    assert len(err.splitlines()) == 1 and err.startswith("lowrank: "), err
    return err


# ---- 1. every training setting reaches the checkpoint -------------------------------------------

def _fit(tmp_path, **kw):
    from lowrank.core import datasets, train
    from lowrank.core.nets import mlp

    options = {"batch_size": 256, "epochs": 1, "progress": False, "checkpoint": tmp_path / "run.ckpt"} | kw
    return train.train_ensemble(lambda: mlp.mlp("MLP", 2, 8, 64, 10), datasets.digits(), [{"lr": 0.1, "seed": 0}],
                                **options)


def test_a_checkpoint_with_more_epochs_than_asked_is_refused(tmp_path):
    """train_ensemble(epochs=2) on a finished 4-epoch checkpoint returned epochs 0-4."""
    _fit(tmp_path, epochs=4)
    with pytest.raises(ValueError, match="holds 4 epochs, more than epochs=2"):
        _fit(tmp_path, epochs=2)
    assert _fit(tmp_path, epochs=5)["epoch"].max() == 5  # resuming to train longer stays possible


def test_a_checkpoint_records_what_its_augmentation_closes_over(tmp_path):
    """A different `rotation` on resume was accepted: the identity said only `augment is not None`."""
    def augmenter(rotation):
        return lambda x, g: x if rotation == "none" else x  # the same data, a different setting

    _fit(tmp_path, augment=augmenter("uniform"))
    with pytest.raises(ValueError, match="belongs to other augment"):
        _fit(tmp_path, augment=augmenter("none"), epochs=2)


def test_the_checkpoint_identity_covers_every_configuration_field():
    """No hand-written list: every TrainConfig field not marked `identity: False` is in it, and
    train_point's rotation reaches it through the augmentation."""
    import dataclasses
    import functools

    from lowrank.core import checkpoint, datasets, train
    from lowrank.core.nets import mlp

    data, model = datasets.digits(), mlp.mlp("MLP", 2, 8, 64, 10)
    cfg = train.TrainConfig(batch_size=8, epochs=1)
    identity = checkpoint.identity([{"lr": 0.1}], cfg, model, data)
    marked = {f.name for f in dataclasses.fields(cfg) if not f.metadata.get("identity", True)}
    assert {f.name for f in dataclasses.fields(cfg)} - marked <= set(identity)
    assert marked == {"epochs", "eval_batch", "checkpoint", "checkpoint_every", "device", "progress", "desc"}
    rotated = [checkpoint.identity([{"lr": 0.1}], dataclasses.replace(cfg, augment=functools.partial(
        train.augment_images, rotation=r)), model, data)["augment"] for r in ("uniform", "none")]
    assert rotated[0] != rotated[1]


# ---- 2. the key is the input ---------------------------------------------------------------------

def test_the_run_key_covers_the_contents_of_a_file_parameter(sandbox):
    """After the CSV behind `sweep_table` was edited, the same `lowrank run` reused the old folder."""
    table = sandbox / "cwd" / "table.csv"
    table.write_text("a,b\n1,2\n")
    params = rules.resolve_parameters(TEXTY, overrides={"sweep_table": "table.csv"})
    assert params["sweep_table"] == str(table)  # relative to the caller's folder, made absolute
    code = keys.code_key(TEXTY)
    before = runs.run_hash(TEXTY, params, code)
    table.write_text("a,b\n1,-1\n")
    assert runs.run_hash(TEXTY, params, code) != before


def test_the_book_declares_its_file_parameters():
    """rank_vs_batch_size's `sweep_table` had no path rule: relative paths reached the kernel, which
    runs in the notebook's folder, and its contents were not in the key."""
    assert rules.parameter_specs("sgd/rank_vs_batch_size")["sweep_table"].path == "file"
    assert "sweep_table" in runs.path_parameters("sgd/rank_vs_batch_size")


# ---- 3. divergence travels through sweeps, results.csv and collect -------------------------------

@pytest.mark.slow
def test_divergence_reaches_results_collect_and_the_summary(sandbox, capsys):
    from lowrank.core import train
    from lowrank.sgd import ranks

    spec = sandbox / "spec.yaml"
    spec.write_text(yaml.safe_dump({"function": "lowrank.core.train:train_point",
                                    "base": {"model": "MLP-2-8", "dataset": "digits", "batch_size": 256, "epochs": 1},
                                    "points": [{"lr": 1.0e6}, {"lr": 0.1}]}))
    out = sandbox / "out"
    assert cli.main(["sweep", str(spec), "--output", str(out), "--jobs", "1"]) == 0
    captured = capsys.readouterr()
    assert "1 diverged or collapsed" in captured.out and "DIVERGED" in captured.err
    loaded = sweeps.load_spec(spec, output=out)
    diverged = pd.read_csv(loaded.run_folder(loaded.points[0]) / "results.csv")
    assert set(diverged["status"]) == {"diverged"} and diverged["status_epoch"].iloc[0] == 1
    assert cli.main(["sweep", str(spec), "--output", str(out), "--collect"]) == 0
    collected = pd.read_csv(out / "collected.csv")
    assert sorted(collected.groupby("lr0")["status"].first().items()) == [(0.1, "ok"), (1e6, "diverged")]
    one = collected[collected["lr0"] == 1e6].assign(run=0)
    assert train.diverged_runs(one) and ranks.summarise(one)["diverged"]  # never read as final ranks


def test_a_collapsed_run_is_marked():
    from lowrank.core import train

    table = pd.DataFrame({"run": [0, 0, 1, 1], "epoch": [0, 1, 0, 1], "spectral_norm": [1.0, 0.0, 1.0, 0.5]})
    table.attrs["diverged"] = {}
    marked = train.with_status(table)
    assert list(marked["status"]) == ["collapsed", "collapsed", "ok", "ok"]


# ---- 4. required outputs are required ---------------------------------------------------------------

def _finished_run(root: Path) -> Path:
    folder = root / "runs" / "fixture" / "tiny" / "abc"
    (folder / "figures").mkdir(parents=True)
    (folder / "notebook.ipynb").write_text("{}")
    (folder / "parameters.json").write_text("{}")
    (folder / "verdicts.json").write_text('{"v": {"measured": 1.0, "outcome": "agrees", "expected": "1"}}')
    (folder / "provenance.json").write_text('{"notebook": "fixture/tiny", "hash": "abc", "parameters": {}}')
    runs.write_manifest(folder)
    return folder


def test_a_run_folder_without_verdicts_is_not_complete(sandbox, capsys):
    """Deleting verdicts.json and its manifest line made `run` reuse the folder without verdicts."""
    folder = _finished_run(sandbox)
    assert runs.manifest_problems(folder) == []
    (folder / "verdicts.json").unlink()
    listed = json.loads((folder / "manifest.json").read_text())
    del listed["verdicts.json"]
    (folder / "manifest.json").write_text(json.dumps(listed))
    assert runs.manifest_problems(folder) == ["verdicts.json missing (required)"]
    with pytest.raises(runs.RunFolderError, match="verdicts.json missing"):
        runs.load_run(folder)


# ---- 5, 13. the spectral helpers take no bad input quietly -------------------------------------

SPECTRAL_REFUSALS = [
    ("count_outliers(torch.tensor([nan, 1, .5]))", "NaN"),
    ("count_outliers(torch.tensor([]))", "empty"),
    ("count_outliers(torch.tensor([1.0, 2.0]))", "descending"),
    ("rank_from_singular_values(torch.tensor([1.0, 0.5]), float('nan'))", "eps must be positive"),
    ("rank_from_singular_values(torch.tensor([1.0, 0.5]), -1)", "eps must be positive"),
    ("rank_from_singular_values(torch.tensor([1.0, 0.5]), True)", "eps must be positive"),
    ("spectrum_stats(torch.tensor([float('nan'), 1.0]), 1e-3)", "NaN"),
    ("rank_k_error(np.eye(3), True)", "k must be a non-negative integer"),
    ("spectrum_stats(torch.tensor([1.0, 0.5]), -1)", "eps must be positive"),
]


@pytest.mark.parametrize("call, message", SPECTRAL_REFUSALS, ids=[c for c, _ in SPECTRAL_REFUSALS])
def test_spectral_helpers_refuse_bad_input(call, message):
    from lowrank.core import spectral

    nan = float("nan")  # noqa: F841 (used by the calls)
    with pytest.raises(ValueError, match=message):
        eval(call, {"torch": torch, "np": np, "nan": nan, **vars(spectral)})


def test_spectral_helpers_take_numpy_integers_and_half_precision():
    from lowrank.core import spectral

    small = torch.randn(8, 6, generator=torch.Generator().manual_seed(0)).half()
    s = spectral.singular_values(small, dtype=None)
    assert s.dtype == torch.float32 and s.shape == (6,)
    assert [t.dtype for t in spectral.singular_values_by_shape([small])] == [torch.float32]
    assert spectral.top_singular(small, np.int64(2)).s.shape == (2,)
    assert spectral.top_singular(np.eye(4), k=np.int64(2)).s.tolist() == [1.0, 1.0]


def test_a_finite_value_out_of_float32_range_is_called_so():
    from lowrank.core import spectral

    with pytest.raises(ValueError, match="beyond the range of torch.float32"):
        spectral.singular_values(np.array([[1e300, 0.0], [0.0, 1.0]]), dtype=torch.float32)


# ---- 6. Ray resources checked against the cluster ----------------------------------------------------

class FakeRay:
    """A Ray cluster of two CPUs and no GPU that never runs a task."""

    def __init__(self):
        self.shut = False

    def is_initialized(self):
        return False

    def init(self, **kwargs):
        pass

    def cluster_resources(self):
        return {"CPU": 2.0, "memory": 1e9}

    def remote(self, **kwargs):
        raise AssertionError("a task was submitted that the cluster can never run")

    def shutdown(self):
        self.shut = True


@pytest.mark.parametrize("resources, message", [({"num_cpus": 64}, "resources.num_cpus: 64, but the Ray cluster has 2"),
                                                ({"num_gpus": 1}, "resources.num_gpus: 1, but the Ray cluster has 0")])
def test_ray_resources_beyond_the_cluster_are_refused(sandbox, capsys, monkeypatch, resources, message):
    import sys

    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setenv("LOWRANK_SWEEP_MODULES", "sweep_fixture")
    spec = sandbox / "spec.yaml"
    spec.write_text(yaml.safe_dump({"function": "sweep_fixture:ranked_matrix", "points": [{"size": 3, "seed": 0}],
                                    "resources": resources}))
    err = one_line(["sweep", spec, "--output", sandbox / "out", "--executor", "ray"], capsys)
    assert message in err and fake.shut


# ---- 7, 14. bounded YAML, papermill's numbers, merge keys ----------------------------------------------

def test_an_alias_bomb_is_refused_quickly_in_one_short_line(sandbox, capsys):
    """An alias bomb inside a list parameter: the message printed the whole expanded value (39 MB)."""
    levels = ["&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    levels += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 6)]
    bomb = sandbox / "bomb.yaml"
    bomb.write_text(f"lrs: [[{', '.join(levels)}]]\n")  # 10^6 values in 300 bytes
    err = one_line(["run", NB, "--params", bomb], capsys)
    assert len(err) < 1200  # the value is not printed, nor expanded (the message says where it stopped)
    assert "expands to more than" in err


def test_numbers_are_read_as_papermill_reads_them(sandbox):
    assert rules.parse_value("1e-3") == 0.001 and rules.parse_value("1E5") == 1e5 and rules.parse_value("relu") == "relu"
    params = sandbox / "p.yaml"
    params.write_text("lr: 1e-1\nlrs: [1e-2, 1e-1, 1e0]\nbatch_sizes: [4, 1e1]\n")
    got = rules.resolve_parameters(NB, params_file=params)
    assert (got["lr"], got["lrs"], got["batch_sizes"]) == (0.1, [0.01, 0.1, 1.0], [4, 10])
    spec = sandbox / "spec.yaml"
    spec.write_text(f"notebook: {NB}\ngrid:\n  lr: [1e-1, 3e-1]\n")
    assert [p["lr"] for p in sweeps.load_spec(spec, output=sandbox / "out").points] == [0.1, 0.3]


def test_a_merge_key_is_yaml(sandbox):
    """A YAML merge key (`<<: *base`) was called "not valid YAML"."""
    spec = sandbox / "spec.yaml"
    spec.write_text(f"notebook: {NB}\nbase: &base {{lr: 0.2, n: 12}}\npoints:\n  - {{<<: *base, seed: 3}}\n")
    assert sweeps.load_spec(spec, output=sandbox / "out").points[0] == {
        **rules.resolve_parameters(NB), "lr": 0.2, "n": 12, "seed": 3}


# ---- 8. seed ranges bounded before expansion ------------------------------------------------------

@pytest.mark.parametrize("text", ["0-9999999999", "0-4,5-100000", "4-0"])
def test_seed_ranges_are_bounded_before_expansion(text):
    with pytest.raises(ValueError, match="at most 100"):
        goldens.parse_seeds(text)


# ---- 9, 15. report and data fetch outputs ------------------------------------------------------------

def test_report_refuses_to_write_inside_a_run_folder(sandbox, capsys):
    folder = _finished_run(sandbox)
    err = one_line(["report", folder, "-o", folder / "report.html"], capsys)
    assert "inside the run folder" in err and not (folder / "report.html").exists()
    one_line(["report", folder, "-o", folder / "figures" / "report.html"], capsys)
    assert runs.manifest_problems(folder) == []


def test_an_unwritable_report_output_names_no_temporary_file(sandbox, capsys, monkeypatch):
    import tempfile

    folder = _finished_run(sandbox)

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "/proc/.version.x1y2.tmp")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    err = one_line(["report", folder, "-o", sandbox / "r.html"], capsys, code=1)
    assert ".tmp" not in err and "cannot write" in err


@pytest.mark.parametrize("make", ["file", "under_file"])
def test_data_fetch_refuses_a_root_that_cannot_hold_the_data(sandbox, capsys, monkeypatch, make):
    from lowrank.core import datasets

    monkeypatch.setattr(datasets, "fetch", lambda *a, **k: (_ for _ in ()).throw(AssertionError("fetched")))
    blocker = sandbox / "blocker"
    blocker.write_text("x")
    root = blocker if make == "file" else blocker / "data"
    err = one_line(["data", "fetch", "mnist", "--root", root], capsys)
    assert "is not a folder" in err


# ---- 10. one validation vocabulary for notebook parameters ---------------------------------------

TEXT_CASES = [
    (["-p", "model", "MLP-BN-4-64x"], "'model': 'MLP-BN-4-64x' is not a network of lowrank.core.nets.zoo"),
    (["-p", "eps_by_name", "3"], "'eps_by_name': 3 is not a mapping"),
    (["-p", "eps_by_name", "{a: abc}"], "'eps_by_name.a': 'abc' is not a number"),
    (["-p", "eps_by_name", "{a: -1}"], "'eps_by_name.a': -1.0 is not above 0"),
    (["-p", "eps_by_name", "{c: 0.1}"], "'eps_by_name': key 'c' is not allowed"),
    (["-p", "net_kwargs", "{widths: [8, x]}"], "'net_kwargs.widths': element 'x' is not an int"),
    (["-p", "net_kwargs", "{depth: 3}"], "'net_kwargs': key 'depth' is not allowed"),
    (["-p", "sweep_table", "missing.csv"], "'sweep_table': 'missing.csv' is not an existing file"),
    (["-p", "ds", "[100000]"], "need about 224 GiB by the notebook's estimate"),
]


@pytest.mark.parametrize("args, message", TEXT_CASES, ids=[" ".join(a) for a, _ in TEXT_CASES])
def test_free_text_dict_path_and_size_parameters_are_checked(sandbox, capsys, args, message):
    err = one_line(["run", TEXTY, *args], capsys)
    assert message in err, err
    assert not (sandbox / "runs").exists()


def test_a_stored_paper_result_is_not_stale_because_this_machine_is_small(monkeypatch):
    """The memory estimates refuse a run here, never a stored result's currency."""
    from lowrank.book import paper_results

    monkeypatch.setenv("LOWRANK_MEMORY_LIMIT", "1M")
    with pytest.raises(rules.ParameterError, match="need about"):
        rules.resolve_parameters("sgd/rank_vs_batch_size", scale="paper")
    assert paper_results.paper_parameters("sgd/rank_vs_batch_size")["scale"] == "paper"


def test_dict_parameters_keep_the_keys_left_out(sandbox):
    got = rules.resolve_parameters(TEXTY, overrides={"eps_by_name": {"b": np.float64(0.5)}, "ds": [np.int64(3)]})
    assert got["eps_by_name"] == {"a": 0.1, "b": 0.5} and got["ds"] == [3] and type(got["ds"][0]) is int


@pytest.mark.slow
def test_every_notebook_of_the_book_states_a_memory_estimate_that_refuses_absurd_sizes(monkeypatch):
    monkeypatch.setenv("LOWRANK_MEMORY_LIMIT", "64G")
    for name in notebooks.list_notebooks():
        expr = rules.memory_estimate(name)
        assert expr, f"{name} states no memory estimate"
        rules.check_memory(name, rules.resolve_parameters(name))  # the ci defaults fit in 64 GiB
    with pytest.raises(rules.ParameterError, match="need about"):
        rules.resolve_parameters("gradients/relu", overrides={"ds": [1000000]})
    with pytest.raises(rules.ParameterError, match="is not a network"):
        rules.resolve_parameters("sgd/rank_vs_batch_size", overrides={"model": "MLP-BN-4-64x"})


@pytest.mark.parametrize("limit", ["abc", "-1", "0", "nan", "inf", "1e400", "8Q"])
def test_the_memory_limit_is_validated(sandbox, capsys, monkeypatch, limit):
    monkeypatch.setenv("LOWRANK_MEMORY_LIMIT", limit)
    err = one_line(["run", TEXTY], capsys)
    assert "LOWRANK_MEMORY_LIMIT" in err and "is not a positive number of bytes" in err


def test_memory_limits_as_people_write_them(monkeypatch):
    for limit, value in [("8G", 8 * 2**30), ("512MiB", 512 * 2**20), ("1e9", 10**9), ("2048", 2048)]:
        monkeypatch.setenv("LOWRANK_MEMORY_LIMIT", limit)
        assert rules.memory_limit() == value


# ---- 11. the environment -----------------------------------------------------------------------------

def test_a_full_disk_is_refused_before_the_kernel(sandbox, capsys, monkeypatch):
    import collections
    import shutil

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 2**20, 2**20))
    err = one_line(["run", NB], capsys)
    assert "only 1 MiB free on its disk" in err


def test_a_runs_subfolder_that_cannot_be_written_is_refused(sandbox, capsys, monkeypatch):
    part = sandbox / "runs" / "fixture"
    part.mkdir(parents=True)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == part else real(p, mode))
    err = one_line(["run", NB], capsys)
    assert f"{part} is not writable" in err


def test_kernel_sockets_fit_whatever_the_temporary_folder(tmp_path, monkeypatch):
    """A TMPDIR of 58-63 characters made every run fail: the length check allowed too much."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="k", dir="/tmp"))
    for length in (40, 58, 63, 90):
        deep = base / ("d" * (length - len(str(base)) - 1))
        deep.mkdir()
        assert len(str(deep)) == length
        monkeypatch.setattr(tempfile, "tempdir", str(deep))
        manager = notebooks._kernel_manager_class(notebooks.kernel_file_prefix("0123abcd"))()
        if manager.transport == "ipc":
            assert all(len(os.fsencode(f"{manager.ip}-{i}")) <= 107 for i in range(1, 6))
        assert Path(manager.connection_file).parent == deep
    shutil.rmtree(base)


def test_stale_kernel_files_of_dead_processes_are_removed(tmp_path):
    """After kill -9 the kernel's sockets and its connection file (with the key) stayed behind."""
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    dead = proc.pid
    tag = notebooks._host_tag()
    stale = [tmp_path / f"lowrank-kernel-{tag}-{dead}-ab12cd34{s}" for s in (".json", "-ipc-1", "-ipc-5")]
    mine = tmp_path / f"lowrank-kernel-{tag}-{os.getpid()}-ab12cd34.json"
    other = tmp_path / "unrelated.json"
    for p in [*stale, mine, other]:
        p.write_text("{}")
    assert sorted(notebooks.clean_kernel_files(tmp_path)) == sorted(stale)
    assert mine.exists() and other.exists()


# ---- 12. corrupt goldens, Ctrl-C ---------------------------------------------------------------------

@pytest.mark.parametrize("content, message", [("a: [1, 2\n  b: {", "is unreadable (line"),
                                              ("- 1\n- 2\n", "got list"),
                                              ("gradients/x: [1, 2]\n", "the block of 'gradients/x' is a list")])
def test_a_corrupt_goldens_file_is_one_line(tmp_path, content, message):
    bad = tmp_path / "golden.yaml"
    bad.write_text(content)
    with pytest.raises(notebooks.InputError, match="golden file") as err:
        goldens.load(bad)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_ctrl_c_is_one_line_and_exit_130(sandbox, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runs, "run", interrupted)
    try:
        err = one_line(["run", NB], capsys, code=130)
    except KeyboardInterrupt:  # not caught by the command: a traceback for the user, the test session stopped
        pytest.fail("Ctrl-C escaped `lowrank run` as a traceback")
    assert "interrupted" in err


# ---- 15, 16. sweep files -----------------------------------------------------------------------------

SWEEP_CASES = [
    ({"function": "os:getpid", "points": [{}]}, "outside the lowrank package"),
    ({"function": "subprocess:getoutput", "points": [{"cmd": "true"}]}, "outside the lowrank package"),
    ({"function": "lowrank.core.spectral:numerical_rank", "scale": "paper", "points": [{"M": [[1.0]]}]},
     "'scale' is for notebooks"),
    ({"function": "lowrank.core.train:train_point",
      "base": {"model": "MLP-2-8", "dataset": "digits", "batch_size": 8, "lr": 0.1}, "points": [{"epochs": 0}]},
     "'epochs': 0 is below the minimum"),
    ({"function": "lowrank.core.train:train_point",
      "base": {"model": "MLP-2-8x", "dataset": "digits", "batch_size": 8, "lr": 0.1}, "points": [{"epochs": 1}]},
     "'model': 'MLP-2-8x' is not a network"),
    ({"function": "lowrank.core.train:train_point",
      "base": {"model": "MLP-2-8", "dataset": "digits", "batch_size": 8, "lr": 0.1, "epochs": 1},
      "points": [{"rotation": "sideways"}]}, "'rotation': 'sideways' is not allowed"),
]


@pytest.mark.parametrize("body, message", SWEEP_CASES, ids=[m for _, m in SWEEP_CASES])
def test_sweep_files_are_checked_in_the_same_vocabulary(sandbox, capsys, body, message):
    spec = sandbox / "spec.yaml"
    spec.write_text(yaml.safe_dump(body))
    err = one_line(["sweep", spec, "--output", sandbox / "out"], capsys)
    assert message in err and not (sandbox / "out").exists()


def test_a_module_outside_lowrank_runs_only_when_named(sandbox, monkeypatch):
    spec = sandbox / "spec.yaml"
    spec.write_text(yaml.safe_dump({"function": "sweep_fixture:ranked_matrix", "points": [{"size": 5, "seed": 0}]}))
    with pytest.raises(sweeps.SweepError, match="LOWRANK_SWEEP_MODULES"):
        sweeps.load_spec(spec, output=sandbox / "out")
    monkeypatch.setenv("LOWRANK_SWEEP_MODULES", "other, sweep_fixture")
    assert sweeps.load_spec(spec, output=sandbox / "out").function == "sweep_fixture:ranked_matrix"


# ---- issue 31, cheaply: the version --------------------------------------------------------------

def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("lowrank ")
