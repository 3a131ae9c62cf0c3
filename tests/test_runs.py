"""`lowrank run` / `list` / `report`: parameters are validated before anything runs, run folders
are complete or absent, reruns reuse them."""

import json

import pytest

from lowrank.book import cli, notebooks, runs

NB = "gradients/decomposition"
# a seconds-long variant of the notebook
TINY = {"n": 40, "d": 50, "m": 60, "nus": [0.0, 0.375], "activations": ["tanh"], "losses": ["mse"],
        "weights": ["isotropic"]}


def test_specs_come_from_the_parameter_cell():
    specs = runs.parameter_specs(NB)
    assert specs["mu"].choices == ["sample", "quadrature"]
    assert specs["n"].min == 2 and specs["n"].default == 375
    assert "relu" in specs["activations"].items


def test_every_notebook_parameter_cell_is_readable():
    for name in notebooks.list_notebooks():
        assert runs.parameter_specs(name)["scale"].default == "ci"


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
    with pytest.raises(runs.ParameterError, match=message):
        runs.resolve_parameters(NB, overrides=overrides)


def test_bad_parameter_files(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(runs.ParameterError, match="does not exist"):
        runs.resolve_parameters(NB, params_file=missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("n: [1, 2\n")
    with pytest.raises(runs.ParameterError, match="not valid YAML"):
        runs.resolve_parameters(NB, params_file=broken)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(runs.ParameterError, match="must hold a mapping"):
        runs.resolve_parameters(NB, params_file=listy)
    with pytest.raises(runs.ParameterError, match="scale must be"):
        runs.resolve_parameters(NB, scale="huge")
    with pytest.raises(FileNotFoundError, match="did you mean gradients/decomposition"):
        runs.resolve_parameters("gradients/decompositon")


def test_paper_scale_and_overrides_layer():
    p = runs.resolve_parameters(NB, scale="paper", overrides={"seed": 3})
    assert (p["n"], p["d"], p["m"], p["seed"], p["scale"]) == (750, 1000, 1250, 3, "paper")
    assert runs.resolve_parameters(NB)["n"] == 375


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
    params = runs.resolve_parameters(NB, overrides=TINY)
    with pytest.raises(RuntimeError, match="kernel died"):
        runs.run(NB, params, runs_root=tmp_path)
    assert list((tmp_path / NB).iterdir()) == []


def test_run_folder_contents_reuse_and_report(tmp_path):
    params = runs.resolve_parameters(NB, overrides=TINY)
    folder, reused = runs.run(NB, params, runs_root=tmp_path)
    assert not reused and folder.name == runs.run_hash(NB, params)
    prov = json.loads((folder / "provenance.json").read_text())
    assert prov["parameters"] == params and prov["wall_s"] > 0 and "commit" in prov["git"]
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


def test_same_parameters_give_identical_verdicts(tmp_path):
    """Determinism on the CPU: two executions, bit-identical verdicts (not just rounded)."""
    params = runs.resolve_parameters(NB, overrides={**TINY, "seed": 7})
    first, _ = runs.run(NB, params, runs_root=tmp_path / "a")
    second, _ = runs.run(NB, params, runs_root=tmp_path / "b")
    assert (first / "verdicts.json").read_text() == (second / "verdicts.json").read_text()
    assert (first / "figures" / "decomposition_outlier_counts.csv").read_bytes() == \
        (second / "figures" / "decomposition_outlier_counts.csv").read_bytes()
