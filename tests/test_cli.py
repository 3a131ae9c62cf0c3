"""The `lowrank` command's conventions: --version, help for every argument, `-p` values typed by
each parameter's declared type (YAML 1.2 for what is not text), papermill's own view of the parameter
cells, and a failed notebook told in a few lines (the cell, its error and
the partial notebook kept for reading)."""

import argparse
import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import nbformat
import pytest

from lowrank.book import cli, notebooks, rules, runs


def _actions(ap: argparse.ArgumentParser, path=("lowrank",)):
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, path + (name,))
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def test_every_command_and_argument_has_help():
    ap = cli.parser()
    missing = [f"{' '.join(path)} {action.dest}" for path, action in _actions(ap) if not action.help]
    assert not missing, f"no help text: {missing}"
    subcommands = [a for a in ap._actions if isinstance(a, argparse._SubParsersAction)][0]
    assert all(c.help for c in subcommands._choices_actions)


def test_version():
    out = subprocess.run([sys.executable, "-m", "lowrank.book.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"lowrank {version('lowrank')}"


@pytest.mark.parametrize("text, value", [
    ("1e-3", 0.001), ("1E5", 1e5), ("010", 10), ("0o17", 15), ("0x1f", 31), ("-3", -3), ("0.5", 0.5),
    ("true", True), ("False", False), ("null", None), (".inf", float("inf")), ("[0.25, 0.5]", [0.25, 0.5]),
    ("[tanh, elu]", ["tanh", "elu"]), ("{a: 1}", {"a": 1}), ("a b", "a b"),
    # YAML 1.1 (PyYAML's own resolvers, papermill's -p) reads these as 90, 5, True, a date, 1000, nan
    ("1:30", "1:30"), ("0b101", "0b101"), ("yes", "yes"), ("2026-01-01", "2026-01-01"), ("1_000", "1_000"),
    ("nan", "nan")])
def test_values_are_read_as_yaml_1_2_core_schema(text, value):
    got = rules.parse_value(text)
    assert type(got) is type(value) and got == value


def test_p_values_are_typed_by_the_declared_type():
    name = "sgd/rank_vs_learning_rate"
    got = rules.resolve_parameters(name, memory=False, texts={
        "data_root": "no", "rotation": "none", "lrs": "[0.01, 1e-1, 0.3]", "epochs": "1e1", "momentum": "0"})
    assert got["data_root"] == "no" and got["rotation"] == "none"  # str parameters take the text as given
    assert got["lrs"] == [0.01, 0.1, 0.3] and got["epochs"] == 10 and type(got["epochs"]) is int
    assert got["momentum"] == 0.0 and type(got["momentum"]) is float
    assert rules.resolve_parameters(name, memory=False, texts={"data_root": "2026-01-01"})["data_root"] == "2026-01-01"
    with pytest.raises(rules.ParameterError, match="'epochs': '1:30' is not an int"):
        rules.resolve_parameters(name, memory=False, texts={"epochs": "1:30"})
    with pytest.raises(rules.ParameterError, match="'seeds': '0b101' is not an int"):
        rules.resolve_parameters(name, memory=False, texts={"seeds": "0b101"})


def test_yaml_refuses_two_merge_keys_and_merges_a_list():
    base = "a: &a {x: 1}\nb: &b {y: 2}\n"
    with pytest.raises(ValueError, match="more than one merge key"):
        rules.parse_yaml(base + "c:\n  <<: *a\n  <<: *b\n")
    assert rules.parse_yaml(base + "c:\n  <<: [*a, *b]\n")["c"] == {"x": 1, "y": 2}


def test_papermill_reads_every_parameter_with_its_type_and_no_warning(caplog):
    """papermill's own view of each notebook (`papermill --help-notebook`): every parameter with the
    declared type and meaning, no "Unable to parse line" (a comment holding `=`)."""
    import logging

    import jupytext
    from papermill.translators import PythonTranslator

    for name in notebooks.list_notebooks():
        nb = jupytext.reads(notebooks.source_path(name).read_text(), {"extension": ".md"})
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        with caplog.at_level(logging.WARNING, logger="papermill"):
            found = {p.name: p for p in PythonTranslator.inspect(cell)}
        assert not caplog.records, f"{name}: {[r.getMessage() for r in caplog.records]}"
        specs = rules.parameter_specs(name)
        assert list(found) == list(specs), name
        for p in found.values():
            assert p.inferred_type_name not in ("None", ""), (name, p.name)
            assert specs[p.name].comment in p.help, (name, p.name)


def test_failure_message_names_the_cell_the_error_and_the_partial_notebook(tmp_path):
    from papermill.exceptions import PapermillExecutionError

    err = PapermillExecutionError(cell_index=4, exec_count=3, source="x = 1\ny = undefined_name\nz = 2\nw = 3\n",
                                  ename="NameError", evalue="name 'undefined_name' is not defined", traceback=[])
    text = notebooks.failure_message("part/name", err, tmp_path / "part" / "name.ipynb")
    lines = text.splitlines()
    assert lines[0] == "part/name failed in code cell 4 (execution count 3):"
    assert "    | y = undefined_name" in lines and lines[4] == "    | ..."  # three lines of the cell, then ...
    assert "  NameError: name 'undefined_name' is not defined" in lines
    assert lines[-1].endswith(str(tmp_path / "part" / "name.ipynb")) and len(lines) <= 8


@pytest.mark.slow  # starts a kernel
def test_a_failing_notebook_keeps_its_partial_notebook_and_lowrank_run_says_so(tmp_path, monkeypatch, capsys):
    root = tmp_path / "notebooks"
    (root / "t").mkdir(parents=True)
    (root / "t" / "fails.md").write_text(
        "---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
        "kernelspec:\n  display_name: Python 3\n  language: python\n  name: python3\n---\n\n"
        "```{code-cell} ipython3\n:tags: [parameters]\n\nlr: float = 0.1  # step size {exclusiveMinimum: 0}\n```\n\n"
        "```{code-cell} ipython3\nprint('before', lr)\n```\n\n"
        "```{code-cell} ipython3\nraise ValueError(f'lr {lr} is too small')\n```\n")
    monkeypatch.setattr(notebooks, "NOTEBOOK_ROOT", root)
    monkeypatch.setattr(notebooks, "FAILED_ROOT", tmp_path / "failed")
    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    assert cli.main(["run", "t/fails", "-p", "lr", "1e-3"]) == 1
    stderr = capsys.readouterr().err  # papermill's progress bar (cells done), then the message
    err = ("lowrank: error:" + stderr.split("lowrank: error:", 1)[1]).strip().splitlines()
    assert err[0].startswith("lowrank: error: t/fails failed in code cell") and len(err) <= 8
    assert "    | raise ValueError(f'lr {lr} is too small')" in err
    assert "  ValueError: lr 0.001 is too small" in err  # -p lr 1e-3 reached the kernel as 0.001
    kept = tmp_path / "failed" / "t" / "fails.ipynb"
    assert err[-1].endswith(str(kept))
    nb = nbformat.read(kept, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert any("before 0.001" in o.get("text", "") for o in outputs)
    assert any(o.get("ename") == "ValueError" for o in outputs)
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file()], "a failed run left a run folder"


@pytest.mark.parametrize("module, extra", [("matplotlib", "notebook"), ("papermill", "run"), ("jupyter_book", "book"),
                                           ("mnist1d", "data")])
def test_a_command_of_a_missing_extra_says_which_extra(monkeypatch, capsys, module, extra):
    import tomllib

    def report_needs(args):
        raise ModuleNotFoundError(f"No module named '{module}'", name=module)

    monkeypatch.setattr(cli, "cmd_report", report_needs)
    assert cli.main(["report", "x"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"pip install 'lowrank[{extra}]'" in err
    # that extra does bring the module (its distribution named in pyproject.toml, directly or by an extra it names)
    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def names(e):
        for d in extras[e]:
            base = d.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip()
            yield from names(d.split("[")[1].rstrip("]")) if base == "lowrank" else [base.replace("-", "_")]

    assert module in names(extra)


@pytest.mark.parametrize("command", [["diff"], ["goldens", "check"], ["results", "list"]])
def test_what_needs_a_clone_says_so_in_one_line_from_an_installed_copy(monkeypatch, capsys, command):
    monkeypatch.setattr(notebooks, "IN_CLONE", False)
    assert cli.main(command) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "run this from a clone" in err and "Errno" not in err


def test_run_dry_run_prints_notebook_parameters_folder_and_cost_and_runs_nothing(tmp_path, monkeypatch, capsys):
    from lowrank.book import pages, rules

    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(pages, "PAGE_SECONDS", tmp_path / "pages.csv")
    (tmp_path / "pages.csv").write_text("page,seconds\ngradients/scaling,8.25\n")
    assert cli.main(["run", "gradients/scaling", "--dry-run", "-p", "repeats", "3"]) == 0
    out = capsys.readouterr().out
    params = rules.resolve_parameters("gradients/scaling", overrides={"repeats": 3})
    assert out.splitlines()[0] == f"gradients/scaling at ci scale: {notebooks.source_path('gradients/scaling')}"
    assert all(f"  {k:<22} = {v!r}" in out.splitlines() for k, v in params.items())
    assert f"run folder: {runs.run_dir('gradients/scaling', params)} (would be written)" in out
    assert "estimated cost: unknown" in out and out.rstrip().endswith("nothing was run")
    assert not (tmp_path / "runs").exists()
    # at the ci defaults: the page's measured seconds
    assert cli.main(["run", "gradients/scaling", "--dry-run"]) == 0
    assert "estimated cost: 8.25 s (this page at its ci defaults" in capsys.readouterr().out


def test_run_cost_of_a_training_page_sums_measured_epoch_seconds_over_its_batch_sizes(tmp_path, monkeypatch):
    from lowrank.book import costs, rules

    csv = tmp_path / "epochs.csv"
    csv.write_text("model,dataset,batch_size,seconds_per_epoch,measured_on\n"
                   "MLP-BN-4-64,digits,16,0.5,cpu:here\nMLP-BN-4-64,digits,64,0.25,cpu:here\n")
    monkeypatch.setattr(costs, "EPOCH_SECONDS", csv)
    name = "sgd/rank_vs_learning_rate"
    params = rules.resolve_parameters(name, overrides={"batch_sizes": [16, 64], "epochs": 4})
    assert cli.run_cost(name, params, "ci").startswith(f"at least {(0.5 + 0.25) * 4:.0f} s (")
    params = rules.resolve_parameters(name, overrides={"batch_sizes": [16, 32], "epochs": 4})  # 32: not measured
    assert cli.run_cost(name, params, "ci").startswith("unknown")
