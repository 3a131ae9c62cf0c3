"""Sweeps: specs validated before running, local and Ray executors, a killed worker, restart."""

import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from lowrank.core import io
from lowrank.book import cli, sweeps

pytestmark = pytest.mark.slow  # every sweep test starts kernels or Ray workers


@pytest.fixture(autouse=True)
def allow_the_sweep_fixture_module(monkeypatch):
    """tests/sweep_fixture.py is outside lowrank: allowed by the documented opt-in."""
    monkeypatch.setenv("LOWRANK_SWEEP_MODULES", "sweep_fixture")


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
        ({"function": "lowrank.nowhere:f", "points": [{}]}, "not declared for sweeping"),
        ({"function": "sweep_fixture:nowhere", "points": [{}]}, "cannot import"),
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
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOWRANK_SWEEP_MODULES", "sweep_fixture")
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


CI_SPEC = sweeps.notebooks.REPO_ROOT / "sweeps" / "sgd_batch_size_ci.yaml"


def _collected(spec):
    return sweeps.collect(spec).sort_values(["batch_size", "lr", "epoch", "layer_index"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def ci_local(tmp_path_factory):
    """sweeps/sgd_batch_size_ci.yaml run point by point on the local pool."""
    out = tmp_path_factory.mktemp("ci_local")
    spec = sweeps.load_spec(CI_SPEC, output=out)
    result = sweeps.run_sweep(spec, "local", jobs=2, progress=False)
    assert len(result["done"]) == len(spec.points) and not result["failed"], result["failed"]
    return out, _collected(spec)


def test_part_two_ci_sweep_under_both_executors_feeds_the_notebook(tmp_path, ci_local):
    """sweeps/sgd_batch_size_ci.yaml (the ci version of the paper's batch-size grid) gives the same
    collected table on the local pool and on Ray, and the Part II page plots it without training."""
    pytest.importorskip("ray")
    local_out, local = ci_local
    spec = sweeps.load_spec(CI_SPEC, output=tmp_path / "ray")
    result = sweeps.run_sweep(spec, "ray", progress=False)
    assert len(result["done"]) == len(spec.points) and not result["failed"], result["failed"]
    pd.testing.assert_frame_equal(local.drop(columns="run"), _collected(spec).drop(columns="run"))
    assert local["run"].nunique() == 12 and {"rank_spectral", "rank_frobenius", "dist"} <= set(local.columns)

    from lowrank.book import rules, runs

    # the page's parameters are the sweep's (a table of other settings is refused: test_hostile_input.py)
    params = rules.resolve_parameters("sgd/rank_vs_batch_size",
                                     overrides={"sweep_table": str(local_out / "collected.csv"), "epochs": 3,
                                                "batch_sizes": [16, 32, 64], "lrs": [0.05, 0.1], "weight_decay": 0.005,
                                                "momentum": 0.0, "variant_momentum": 0.0, "seeds": 1})
    folder, _ = runs.run("sgd/rank_vs_batch_size", params, runs_root=tmp_path / "runs")
    nb = (folder / "notebook.ipynb").read_text()
    assert "read from" in nb and "collected.csv" in nb
    assert (folder / "figures" / "rank_vs_batch_size_final.csv").stat().st_size > 0


def _close(a: pd.DataFrame, b: pd.DataFrame):
    """Equal up to float32 round-off: an ensemble's batched products round differently from one run's."""
    pd.testing.assert_frame_equal(a.drop(columns="run"), b.drop(columns="run"), check_exact=False, rtol=1e-4, atol=1e-6)


def test_ensemble_sweep_trains_a_batch_size_group_at_once(tmp_path, ci_local):
    """`ensemble: true`: the points of one batch size (two learning rates, two weight decays) train as one ensemble, one
    task each; every point gets its own folder, the results match the point-by-point sweep, and a
    restart trains only the missing member."""
    body = yaml.safe_load(CI_SPEC.read_text()) | {"ensemble": True}
    spec = sweeps.load_spec(write_spec(tmp_path, body), output=tmp_path / "out")
    assert [len(g) for g in sweeps._ensemble_groups(spec, spec.points)] == [4, 4, 4]  # 2 lrs x 2 weight decays
    result = sweeps.run_sweep(spec, "local", jobs=2, progress=False)
    assert len(result["done"]) == 12 and not result["failed"], result["failed"]
    together = _collected(spec)
    _close(together, ci_local[1])
    gone = spec.run_folder(spec.points[1])
    import shutil

    shutil.rmtree(gone)
    again = sweeps.run_sweep(spec, "local", jobs=2, progress=False)
    assert again["done"] == [str(gone)] and len(again["skipped"]) == 11
    _close(_collected(spec), together)


@pytest.mark.parametrize("body, message", [
    ({"notebook": "gradients/decomposition", "grid": {"seed": [0]}, "ensemble": True}, "works with function"),
    ({"function": "lowrank.core.train:train_point", "points": [{"model": "MLP-2-8", "dataset": "digits", "batch_size": 8,
      "lr": 0.1, "epochs": 1}], "ensemble": "yes"}, "true or false"),
])
def test_bad_ensemble_specs(tmp_path, body, message):
    with pytest.raises(sweeps.SweepError, match=message):
        sweeps.load_spec(write_spec(tmp_path, body))


def test_train_points_refuses_members_that_differ_in_shared_settings():
    from lowrank.core import train

    base = {"model": "MLP-2-8", "dataset": "digits", "batch_size": 8, "lr": 0.1, "epochs": 1}
    with pytest.raises(ValueError, match=r"differs from points\[0\] in \['batch_size'\]"):
        train.train_points([base, base | {"batch_size": 16, "seed": 1}])


def test_repository_sweep_specs_are_valid():
    """Every spec under sweeps/ (the Part II paper grids and their ci version) validates."""
    specs = sorted((sweeps.notebooks.REPO_ROOT / "sweeps").glob("*.yaml"))
    assert len(specs) >= 6
    for path in specs:
        spec = sweeps.load_spec(path)
        assert spec.points, path


def test_points_never_share_a_checkpoint(tmp_path):
    """A `checkpoint:` in the base is shared by every point as written: each point (each ensemble,
    with `ensemble: true`) gets its own file, in the given folder, and points that name their own
    file keep it."""
    base = {"model": "MLP-2-8", "dataset": "digits", "batch_size": 8, "lr": 0.1, "epochs": 1,
            "checkpoint": str(tmp_path / "ckpt.pt")}
    body = {"function": "lowrank.core.train:train_point", "base": base, "grid": {"eps": [0.3, 0.001]}}
    spec = sweeps.load_spec(write_spec(tmp_path, body), output=tmp_path / "out")
    paths = [p["checkpoint"] for p in spec.points]
    assert len(set(paths)) == 2 and all(Path(p).parent == tmp_path and Path(p).suffix == ".pt" for p in paths)
    ens = sweeps.load_spec(write_spec(tmp_path, body | {"ensemble": True, "grid": {"eps": [0.3, 0.001],
                                                                                   "seed": [0, 1]}}, "ens"))
    by_eps = {}
    for p in ens.points:
        by_eps.setdefault(p["eps"], set()).add(p["checkpoint"])
    assert all(len(v) == 1 for v in by_eps.values()) and len(set.union(*by_eps.values())) == 2
    own = sweeps.load_spec(write_spec(tmp_path, {"function": "lowrank.core.train:train_point", "base": base,
                                                 "points": [{"seed": 0}]}, "own"))
    assert own.points[0]["checkpoint"] == str(tmp_path / "ckpt.pt")


def test_a_restarted_sweep_cleans_dead_partials_and_checks_manifests(tmp_path, capsys):
    import socket
    import subprocess
    import sys

    from lowrank.book import rules, runs

    spec = sweeps.load_spec(fixture_spec(tmp_path), output=tmp_path / "out")
    assert len(sweeps.run_sweep(spec, "local", jobs=1, progress=False)["done"]) == 4
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    debris = io.make_work_folder(spec.output / f".abc.partial-{socket.gethostname()}-{dead}")
    first = spec.run_folder(spec.points[0])
    (first / "results.json").unlink()  # a file of the run lost (an edited one is the user's: refused)
    again = sweeps.run_sweep(spec, "local", jobs=1, progress=False)
    assert again["done"] == [str(first)] and len(again["skipped"]) == 3
    assert "results.json missing" in capsys.readouterr().err
    assert not debris.exists() and runs.manifest_problems(first) == []


def test_jobs_default_and_refusals():
    assert sweeps.check_jobs(None, threads=1) == max(1, os.cpu_count() or 1)
    assert sweeps.check_jobs(None, threads=10**6) == 1
    assert sweeps.check_jobs(3) == 3
    for bad in (-1, 0, 1.5, True, "2"):
        with pytest.raises(sweeps.SweepError, match="--jobs must be a positive number"):
            sweeps.check_jobs(bad)


def test_a_config_function_takes_its_dataclass_fields_as_sweep_parameters():
    """`train_point(config: PointConfig)`: a sweep's parameters are PointConfig's fields, with their
    defaults; a plain keyword function keeps its own signature."""
    import dataclasses

    from lowrank.core import train

    assert sweeps.config_class(train.train_point) is train.PointConfig
    fields = {f.name: f.default for f in dataclasses.fields(train.PointConfig)}
    params = sweeps.sweep_parameters(train.train_point)
    assert list(params) == list(fields)
    assert {k: p.default for k, p in params.items() if p.default is not p.empty} == {
        k: v for k, v in fields.items() if v is not dataclasses.MISSING}
    assert sweeps.function_specs(train.train_point)["batch_size"].check(4) == 4

    def plain(*, a: int, b: float = 0.5):
        return a + b

    assert sweeps.config_class(plain) is None and list(sweeps.sweep_parameters(plain)) == ["a", "b"]
    assert sweeps.call_with_parameters(plain, {"a": 1}) == 1.5

    @dataclasses.dataclass
    class Settings:
        a: int
        b: float = 0.5

    def takes(config: Settings):
        return config

    assert sweeps.config_class(takes) is Settings and list(sweeps.sweep_parameters(takes)) == ["a", "b"]
    assert sweeps.call_with_parameters(takes, {"a": 2}) == Settings(2, 0.5)
    point = {"model": "MLP-2-8", "dataset": "digits", "batch_size": 8, "lr": 0.1, "epochs": 1, "seed": 3}
    config = train.PointConfig(**point)
    assert config.member() == {"lr": 0.1, "weight_decay": 0.0, "momentum": 0.0, "seed": 3}
    assert set(config.member()) | set(config.shared()) == set(fields)
    assert not set(config.member()) & set(config.shared())


def test_a_sweep_spec_naming_no_field_of_the_config_is_refused(tmp_path):
    body = {"function": "lowrank.core.train:train_point", "points": [{"model": "MLP-2-8", "dataset": "digits",
            "batch_size": 8, "lr": 0.1, "epochs": 1, "width": 3}]}
    with pytest.raises(sweeps.SweepError, match="takes no parameter 'width'"):
        sweeps.load_spec(write_spec(tmp_path, body))
    body["points"][0].pop("width")
    body["points"][0].pop("lr")
    with pytest.raises(sweeps.SweepError, match="needs 'lr'"):
        sweeps.load_spec(write_spec(tmp_path, body, "two"))


@pytest.mark.parametrize("base_as", ["mapping", "file"])
def test_a_grid_key_also_in_the_base_is_refused_in_one_line_before_any_work(tmp_path, capsys, base_as):
    """`base: {lr: 0.1}` with `grid: {lr: [...]}`: the grid's values would silently win over the base's;
    refused, naming the key, before anything is resolved or run. A point's value over the base's is the
    documented rule (a point is an explicit exception) and stays accepted."""
    base = {"size": 3, "seed": 0}
    if base_as == "file":
        (tmp_path / "shared.yaml").write_text(yaml.safe_dump(base))
        base = "shared.yaml"
    body = {"function": "sweep_fixture:ranked_matrix", "base": base, "grid": {"seed": [1, 2]}}
    with pytest.raises(sweeps.SweepError, match=r"'seed' is in both 'base' and 'grid'") as err:
        sweeps.load_spec(write_spec(tmp_path, body), output=tmp_path / "out")
    assert "\n" not in str(err.value) and "size" not in str(err.value)
    assert cli.main(["sweep", str(tmp_path / "spec.yaml"), "--output", str(tmp_path / "out"), "--dry-run"]) == 2
    said = capsys.readouterr().err.strip()
    assert len(said.splitlines()) == 1 and "'seed' is in both" in said
    assert not (tmp_path / "out").exists()
    points = {"function": "sweep_fixture:ranked_matrix", "base": base, "points": [{"seed": 5}]}
    spec = sweeps.load_spec(write_spec(tmp_path, points, "points"), output=tmp_path / "out2")
    assert [p["seed"] for p in spec.points] == [5]
