"""The `lowrank` command's conventions: --version, help for every argument, `-p` values typed as
papermill's own `-p` types them, and a failed notebook told in a few lines (the cell, its error and
the partial notebook kept for reading)."""

import argparse
import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import nbformat
import pytest
from papermill.cli import _resolve_type

from lowrank.book import cli, notebooks, runs


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


@pytest.mark.parametrize("text", ["1e-3", "1E5", "10", "010", "-3", "1_000", "0.5", "True", "False", "None",
                                  "nan", "inf", "relu", "1e8"])
def test_p_values_are_typed_as_papermill_types_them(text):
    got, expected = cli._parse_value(text), _resolve_type(text)
    assert type(got) is type(expected) and (got == expected or got != got and expected != expected)


def test_p_values_papermill_leaves_as_text_are_read_as_yaml():
    assert cli._parse_value("1e-3") == 0.001 and cli._parse_value("010") == 10  # not YAML 1.1's octal 8
    assert cli._parse_value("[0.25, 0.5]") == [0.25, 0.5] and cli._parse_value("[tanh, elu]") == ["tanh", "elu"]
    assert cli._parse_value("true") is True and cli._parse_value(".inf") == float("inf")
    assert cli._parse_value("a b") == "a b"


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
        "```{code-cell} ipython3\n:tags: [parameters]\n\nlr = 0.1  # step size {gt: 0}\n```\n\n"
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
    from lowrank.book import rules, sweeps

    csv = tmp_path / "epochs.csv"
    csv.write_text("model,dataset,batch_size,seconds_per_epoch,measured_on\n"
                   "MLP-BN-4-64,digits,16,0.5,cpu:here\nMLP-BN-4-64,digits,64,0.25,cpu:here\n")
    monkeypatch.setattr(sweeps, "EPOCH_SECONDS", csv)
    name = "sgd/rank_vs_learning_rate"
    params = rules.resolve_parameters(name, overrides={"batch_sizes": [16, 64], "epochs": 4})
    assert cli.run_cost(name, params, "ci").startswith(f"at least {(0.5 + 0.25) * 4:.3g} s of training")
    params = rules.resolve_parameters(name, overrides={"batch_sizes": [16, 32], "epochs": 4})  # 32: not measured
    assert cli.run_cost(name, params, "ci").startswith("unknown")
