"""Sweeps: specs validated before running, local and Ray executors, a killed worker, restart."""

import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from lowrank import cli, sweeps

HERE = Path(__file__).parent


def write_spec(tmp_path, body: dict, name="spec") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def fixture_spec(tmp_path, crash_file="", name="spec"):
    return write_spec(tmp_path, {"function": "sweep_fixture:ranked_matrix", "base": {"crash_file": crash_file},
                                 "grid": {"seed": [0, 1, 2, 3], "size": [20]}}, name)


@pytest.mark.parametrize(
    "body, message",
    [
        ({"grid": {"seed": [0]}}, "exactly one of 'notebook' or 'function'"),
        ({"notebook": "gradients/decomposition", "function": "x:y", "grid": {"seed": [0]}}, "exactly one"),
        ({"notebook": "gradients/decompositon", "grid": {"seed": [0]}}, "did you mean"),
        ({"notebook": "gradients/decomposition", "grid": {"sead": [0]}}, "did you mean 'seed'"),
        ({"notebook": "gradients/decomposition", "grid": {"n": [375, 1]}}, "below the minimum"),
        ({"notebook": "gradients/decomposition", "grid": {"seed": []}}, "non-empty lists"),
        ({"notebook": "gradients/decomposition"}, "no points"),
        ({"notebook": "gradients/decomposition", "points": [{"seed": 0}, {"seed": 0}]}, "same parameters"),
        ({"function": "lowrank.nowhere:f", "points": [{}]}, "cannot import"),
        ({"function": "sweep_fixture:ranked_matrix", "points": [{"sise": 3}]}, "no parameter 'sise'"),
        ({"function": "sweep_fixture:ranked_matrix", "points": [{"size": 3}], "resources": {"gpu": 1}}, "resources"),
        ({"notebook": "gradients/decomposition", "points": [{"seed": 0}], "colour": "red"}, "unknown keys"),
    ],
)
def test_bad_specs_are_rejected_before_anything_runs(tmp_path, body, message):
    with pytest.raises(sweeps.SweepError, match=message):
        sweeps.load_spec(write_spec(tmp_path, body), output=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_not_yaml_and_missing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("grid: {seed: [0, 1\n")
    with pytest.raises(sweeps.SweepError, match="not valid YAML"):
        sweeps.load_spec(bad)
    with pytest.raises(sweeps.SweepError, match="does not exist"):
        sweeps.load_spec(tmp_path / "none.yaml")


def _results(spec):
    table = sweeps.collect(spec)
    return table.drop(columns=["crash_file", "run"]).sort_values("seed").reset_index(drop=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference")
    spec = sweeps.load_spec(fixture_spec(tmp), output=tmp / "out")
    result = sweeps.run_sweep(spec, "local", jobs=2, progress=False)
    assert len(result["done"]) == 4 and not result["failed"]
    return _results(spec)


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_killed_worker_then_restart_matches_uninterrupted(tmp_path, executor, reference, monkeypatch):
    if executor == "ray":
        pytest.importorskip("ray")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        crash = tmp_path / "crash-now"
        crash.touch()
        spec = sweeps.load_spec(fixture_spec(tmp_path, str(crash)), output=tmp_path / "out")
        first = sweeps.run_sweep(spec, executor, jobs=2, progress=False)
        assert len(first["done"]) == 3 and len(first["failed"]) == 1, first
        (failed,) = first["failed"]
        assert not Path(failed).exists(), "a killed run left a folder that looks complete"
        crash.unlink()
        second = sweeps.run_sweep(spec, executor, jobs=2, progress=False)
        assert second["done"] == [failed] and len(second["skipped"]) == 3 and not second["failed"]
        pd.testing.assert_frame_equal(_results(spec), reference)
    finally:
        if executor == "ray":
            import ray

            ray.shutdown()


def test_cli_sweep_and_collect(tmp_path, capsys, reference):
    spec = fixture_spec(tmp_path)
    out = tmp_path / "out"
    assert cli.main(["sweep", str(spec), "--jobs", "2", "--output", str(out)]) == 0
    assert "4 ran, 0 already finished, 0 failed" in capsys.readouterr().out
    assert cli.main(["sweep", str(spec), "--output", str(out)]) == 0
    assert "0 ran, 4 already finished" in capsys.readouterr().out
    assert cli.main(["sweep", str(spec), "--output", str(out), "--collect"]) == 0
    table = pd.read_csv(out / "collected.csv")
    assert len(table) == 4 and {"run", "seed", "size", "rank", "stable_rank"} <= set(table.columns)


def test_part_two_ci_sweep_under_both_executors_feeds_the_notebook(tmp_path):
    """sweeps/sgd_batch_size_ci.yaml (the ci version of the paper's batch-size grid) gives the same
    collected table on the local pool and on Ray, and the Part II page plots it without training."""
    pytest.importorskip("ray")
    spec_path = sweeps.notebooks.REPO_ROOT / "sweeps" / "sgd_batch_size_ci.yaml"
    tables = {}
    for executor in ("local", "ray"):
        spec = sweeps.load_spec(spec_path, output=tmp_path / executor)
        result = sweeps.run_sweep(spec, executor, jobs=2, progress=False)
        assert len(result["done"]) == len(spec.points) and not result["failed"], result["failed"]
        tables[executor] = sweeps.collect(spec).sort_values(["run", "epoch", "layer_index"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(tables["local"], tables["ray"])
    assert tables["local"]["run"].nunique() == 4 and {"rank", "rank_frobenius", "dist"} <= set(tables["local"].columns)

    from lowrank import runs

    params = runs.resolve_parameters("sgd/rank_vs_batch_size",
                                     overrides={"sweep_table": str(tmp_path / "local" / "collected.csv")})
    folder, _ = runs.run("sgd/rank_vs_batch_size", params, runs_root=tmp_path / "runs")
    nb = (folder / "notebook.ipynb").read_text()
    assert "read from" in nb and "collected.csv" in nb
    assert (folder / "figures" / "rank_vs_batch_size_final.csv").stat().st_size > 0


def test_repository_sweep_specs_are_valid():
    """Every spec under sweeps/ (the Part II paper grids and their ci version) validates."""
    specs = sorted((sweeps.notebooks.REPO_ROOT / "sweeps").glob("*.yaml"))
    assert len(specs) >= 6
    for path in specs:
        spec = sweeps.load_spec(path)
        assert spec.points, path
