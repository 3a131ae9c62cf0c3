"""Issue #51: what a hostile or careless user gives the tool. Nothing runs, writes or deletes what the
user did not ask for; the silent cases say what is wrong; the tracebacks are one line.

Sections by class: security, data loss, silently wrong, tracebacks and wrong errors.
"""

import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lowrank.book import cli, keys, report, runs, sweeps
from lowrank.core import io
from test_bad_input_two import one_line  # `lowrank ARGV` exits with a code and says one line

REPO = Path(__file__).resolve().parents[1]


def dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def spec_file(folder: Path, body: dict, name="spec.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(body))
    return path


@pytest.fixture(autouse=True)
def own_record(tmp_path, monkeypatch):
    """The record of the tool's outputs (`io.written_record`) of this test only."""
    monkeypatch.setenv("LOWRANK_STATE", str(tmp_path / "state"))


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    monkeypatch.delenv("LOWRANK_SWEEP_MODULES", raising=False)
    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---- security: a sweep file names only the functions declared for sweeping -------------------------

MARKER_COMMAND = "touch {marker}"


@pytest.mark.parametrize("function, point", [
    ("lowrank.book.sweeps:execute_point", lambda m: {"target_kind": "function", "target": "os:system",
                                                     "params": {"command": MARKER_COMMAND.format(marker=m)},
                                                     "folder": str(m.parent / "out1")}),
    ("lowrank.core.io:write_atomically", lambda m: {"path": str(m), "data": "written"}),
    ("lowrank.book.pages:publish_figures", lambda m: {"target": str(m.parent / "victim")}),
    ("lowrank.book.cli:main", lambda m: {"argv": ["report", str(m.parent / "run"), "-o", str(m)]}),
    ("lowrank.book.runs:run", lambda m: {"name": "x/y", "params": {}}),
    ("os:system", lambda m: {"command": MARKER_COMMAND.format(marker=m)}),
    ("subprocess:run", lambda m: {"args": ["touch", str(m)]}),
])
def test_a_sweep_refuses_every_function_not_declared_for_sweeping(clean_env, capsys, function, point):
    marker = clean_env / "marker"
    (clean_env / "victim").mkdir()
    spec = spec_file(clean_env, {"function": function, "points": [point(marker)]})
    for argv in (["sweep", spec, "--output", clean_env / "out"], ["sweep", spec, "--output", clean_env / "out", "--dry-run"]):
        err = one_line(argv, capsys)
        assert "not declared for sweeping" in err or "outside the lowrank package" in err, err
    assert not marker.exists() and (clean_env / "victim").is_dir() and not (clean_env / "out").exists()


def test_the_opt_in_variable_cannot_reopen_the_package(clean_env, capsys, monkeypatch):
    """LOWRANK_SWEEP_MODULES opts in a user's module, never lowrank's own machinery."""
    marker = clean_env / "marker"
    for named in ("lowrank", "lowrank.core", "lowrank.core.io"):
        monkeypatch.setenv("LOWRANK_SWEEP_MODULES", named)
        spec = spec_file(clean_env, {"function": "lowrank.core.io:write_atomically",
                                     "points": [{"path": str(marker), "data": "x"}]})
        assert "not declared for sweeping" in one_line(["sweep", spec, "--output", clean_env / "out"], capsys)
    assert not marker.exists()
    assert sweeps.SWEEP_FUNCTIONS == {"lowrank.core.train:train_point"}


def test_the_declared_function_and_an_opted_in_module_still_sweep(clean_env, monkeypatch):
    spec = spec_file(clean_env, {"function": "lowrank.core.train:train_point",
                                 "points": [{"model": "MLP-2-8", "dataset": "digits", "batch_size": 8, "lr": 0.1,
                                             "epochs": 1}]})
    assert sweeps.load_spec(spec, output=clean_env / "out").function == "lowrank.core.train:train_point"
    monkeypatch.setenv("LOWRANK_SWEEP_MODULES", "sweep_fixture")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    spec = spec_file(clean_env, {"function": "sweep_fixture:ranked_matrix", "points": [{"size": 3, "seed": 0}]})
    assert sweeps.load_spec(spec, output=clean_env / "out").function == "sweep_fixture:ranked_matrix"


@pytest.mark.parametrize("name", ["...yaml", "..yaml", ".hidden.yaml", "a b.yaml"])
def test_a_spec_name_cannot_move_the_default_output(clean_env, capsys, name):
    spec = spec_file(clean_env, {"function": "lowrank.core.train:train_point",
                                 "points": [{"model": "MLP-2-8", "dataset": "digits", "batch_size": 8, "lr": 0.1,
                                             "epochs": 1}]}, name=name)
    assert "cannot name the default output folder" in one_line(["sweep", spec, "--dry-run"], capsys)
    assert not runs.RUNS.exists()
    # with an explicit --output the file's name does not matter
    assert sweeps.load_spec(spec, output=clean_env / "out").output == clean_env / "out"


class _Payload:
    """A pickle whose loading runs a command that creates a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _fit(tmp_path, checkpoint, **kw):
    from lowrank.core import datasets, train
    from lowrank.core.nets import mlp

    return train.train_ensemble(lambda: mlp.mlp("MLP", 2, 8, 64, 10), datasets.digits(), [{"lr": 0.1, "seed": 0}],
                                **({"batch_size": 128, "epochs": 1, "progress": False, "checkpoint": checkpoint} | kw))


@pytest.mark.parametrize("writer", ["torch.save", "pickle-2", "pickle-5"])
def test_a_crafted_checkpoint_is_refused_not_unpickled(tmp_path, writer):
    import torch

    marker = tmp_path / "marker"
    ckpt = tmp_path / "run.ckpt"
    payload = {"format": 6, "identity": _Payload(marker)}
    if writer == "torch.save":
        torch.save(payload, ckpt)
    else:
        ckpt.write_bytes(pickle.dumps(payload, protocol=int(writer[-1])))
    pickle.loads(pickle.dumps(_Payload(tmp_path / "proof")))  # the payload does run when unpickled ...
    assert (tmp_path / "proof").exists()
    before = ckpt.read_bytes()
    # ... but not by a checkpoint's loading (protocol 5's opcodes are not even read by the restricted unpickler)
    with pytest.raises(ValueError, match="refused, not unpickled" if writer != "pickle-5" else "is unreadable") as err:
        _fit(tmp_path, ckpt)
    assert not marker.exists() and ckpt.read_bytes() == before
    # the message says what the file is, not torch's advice to load it with weights_only=False (which runs it)
    assert "not a lowrank checkpoint" in str(err.value) and "weights_only" not in str(err.value)
    assert str(ckpt) in str(err.value) and "\n" not in str(err.value)
    if writer == "torch.save":
        assert "it names posix.system" in str(err.value) or "it names os.system" in str(err.value)


def test_a_crafted_checkpoint_in_a_sweep_is_refused(clean_env, capsys):
    import torch

    marker = clean_env / "marker"
    ckpt = clean_env / "point.ckpt"
    torch.save({"format": 6, "x": _Payload(marker)}, ckpt)
    spec = spec_file(clean_env, {"function": "lowrank.core.train:train_point",
                                 "points": [{"model": "MLP-2-8", "dataset": "digits", "batch_size": 128, "lr": 0.1,
                                             "epochs": 1, "checkpoint": str(ckpt)}]})
    with pytest.raises(sweeps.SweepError, match="refused, not unpickled"):  # before any run, as a FIFO is
        sweeps.load_spec(spec, output=clean_env / "out")
    assert not marker.exists() and not (clean_env / "out").exists()


@pytest.mark.parametrize("kind", ["foreign", "fifo"])
def test_an_unusable_and_a_fifo_checkpoint_are_both_refused_input(clean_env, capsys, kind):
    """Both are bad parameters, said in one line with exit 2 before any work (the unusable one was a run failure, exit 1)."""
    ckpt = clean_env / "point.ckpt"
    if kind == "fifo":
        os.mkfifo(ckpt)
    else:
        ckpt.write_bytes(b"not a checkpoint")
    spec = spec_file(clean_env, {"function": "lowrank.core.train:train_point",
                                 "points": [{"model": "MLP-2-8", "dataset": "digits", "batch_size": 128, "lr": 0.1,
                                             "epochs": 1, "checkpoint": str(ckpt)}]})
    said = one_line(["sweep", spec, "--output", clean_env / "out"], capsys)
    assert ("is a FIFO" if kind == "fifo" else "not a lowrank checkpoint") in said
    assert not (clean_env / "out").exists()


def test_a_real_checkpoint_still_resumes_with_weights_only(tmp_path):
    """The checkpoint format holds tensors and plain data only: the resumed run equals the uninterrupted one."""
    ckpt = tmp_path / "run.ckpt"
    _fit(tmp_path, ckpt, epochs=1)
    resumed = _fit(tmp_path, ckpt, epochs=2)
    straight = _fit(tmp_path, None, epochs=2)
    cols = ["epoch", "layer", "rank_frobenius", "weight_norm", "train_loss", "lr"]
    assert resumed[cols].equals(straight[cols])


# ---- data loss: outputs never replace what the tool did not write ----------------------------------

def _run_folder(root: Path) -> Path:
    """A complete notebook run folder (as `runs.run` writes it) under `root`."""
    import json

    folder = root / "part" / "name" / "0123456789abcdef"
    (folder / "figures").mkdir(parents=True)
    (folder / "verdicts.json").write_text("{}")
    (folder / "parameters.json").write_text("{}")
    (folder / "provenance.json").write_text(json.dumps({"notebook": "part/name", "parameters": {}, "hash": folder.name}))
    runs.write_manifest(folder)
    return folder


@pytest.mark.parametrize("victim", ["lowrank/core/io.py", "notebooks/sgd/rank_vs_batch_size.md",
                                    "tests/golden_verdicts.yaml", "README.md"])
def test_report_never_overwrites_a_file_it_did_not_write(tmp_path, capsys, monkeypatch, victim):
    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    folder = _run_folder(tmp_path / "runs")
    copy = tmp_path / Path(victim).name
    copy.write_bytes((REPO / victim).read_bytes())
    before = copy.read_bytes()
    assert "was not written by lowrank" in one_line(["report", folder, "-o", copy], capsys)
    assert copy.read_bytes() == before
    link = tmp_path / "link.html"  # through a link: refused, whatever it points to
    link.symlink_to(copy)
    assert "is a link" in one_line(["report", folder, "-o", link], capsys)
    assert copy.read_bytes() == before and link.is_symlink()
    # "ours" is the tool's record, not the first bytes: a file starting with the report's meta tag is the user's
    typed = tmp_path / "typed.html"
    typed.write_text(f"<!doctype html><html><head>{report.GENERATOR}</head><body>my notes</body></html>")
    assert "was not written by lowrank" in one_line(["report", folder, "-o", typed], capsys)
    assert "my notes" in typed.read_text()


def test_report_replaces_its_own_report_only_as_written_and_never_through_a_link(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    folder = _run_folder(tmp_path / "runs")
    out = tmp_path / "report.html"
    assert cli.main(["report", str(folder), "-o", str(out)]) == 0
    assert io.written_by_lowrank(out)
    assert cli.main(["report", str(folder), "-o", str(out)]) == 0  # its own file, as it wrote it: replaced
    link = tmp_path / "latest.html"
    link.symlink_to(out)
    assert "is a link" in one_line(["report", folder, "-o", link], capsys)
    out.write_text(out.read_text() + "<!-- my annotations -->")  # the user's edits make it the user's
    assert not io.written_by_lowrank(out)
    assert "was not written by lowrank" in one_line(["report", folder, "-o", out], capsys)
    assert out.read_text().endswith("<!-- my annotations -->")


def test_report_cannot_reach_a_run_folder_through_a_link(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    folder = _run_folder(tmp_path / "runs")
    link = tmp_path / "figs"
    link.symlink_to(folder / "figures")
    assert "inside the run folder" in one_line(["report", folder, "-o", link / "r.html"], capsys)
    assert runs.manifest_problems(folder) == []


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_report_and_every_atomic_write_refuse_devices_and_fifos(tmp_path, capsys, monkeypatch, kind):
    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    folder = _run_folder(tmp_path / "runs")
    if kind == "device":
        target = Path("/dev/null")
    else:
        target = tmp_path / "fifo"
        os.mkfifo(target)
    err = one_line(["report", folder, "-o", target], capsys)
    assert "is a device" in err or "is a FIFO" in err
    with pytest.raises(io.OutputRefused, match="a device|a FIFO"):
        io.write_atomically(target, "x")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(io.OutputRefused, match="is a link"):
        io.write_atomically(link, "x")
    assert link.is_symlink() and (target.is_char_device() or target.is_fifo())


def test_an_atomic_write_never_goes_through_a_link(tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    with pytest.raises(io.OutputRefused, match=r"is a link \(-> .*real.txt\)"):
        io.write_atomically(link, "new")
    assert link.is_symlink() and target.read_text() == "old"
    with pytest.raises(io.OutputRefused, match="a folder"):
        io.write_atomically(tmp_path, "x")


@pytest.mark.parametrize("kind", ["device", "fifo", "link to a device"])
def test_a_checkpoint_path_naming_a_device_or_fifo_is_refused(tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/null")
    else:
        path = tmp_path / "ckpt"
        path.symlink_to("/dev/null")
    with pytest.raises(ValueError, match="is a device|is a FIFO|is a link"):
        _fit(tmp_path, path)
    assert Path("/dev/null").is_char_device()


def test_a_checkpoint_through_a_link_is_refused(tmp_path):
    target = tmp_path / "real.ckpt"
    link = tmp_path / "link.ckpt"
    link.symlink_to(target)
    with pytest.raises(ValueError, match="is a link"):
        _fit(tmp_path, link)
    assert link.is_symlink() and not target.exists()


def test_a_sweep_output_cannot_be_a_run_folder_or_a_users_folder(clean_env, capsys, monkeypatch):
    monkeypatch.setenv("LOWRANK_SWEEP_MODULES", "sweep_fixture")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    run = _run_folder(runs.RUNS)
    spec = spec_file(clean_env, {"function": "sweep_fixture:ranked_matrix", "points": [{"size": 3, "seed": 0}]})
    for out in (run, run / "figures", run.parent.parent):
        err = one_line(["sweep", spec, "--output", out], capsys)
        assert "inside the run folder" in err or "holds files that no sweep wrote" in err, err
    assert runs.manifest_problems(run) == []
    home = clean_env / "home"
    home.mkdir()
    (home / ".zshrc").write_text("mine")
    assert "holds files that no sweep wrote" in one_line(["sweep", spec, "--output", home], capsys)
    # a sweep's own folder is its to resume; an empty or new folder is fine
    assert cli.main(["sweep", str(spec), "--output", str(clean_env / "new")]) == 0
    assert cli.main(["sweep", str(spec), "--output", str(clean_env / "new")]) == 0
    assert "1 already finished" in capsys.readouterr().out


def test_cleanup_removes_only_marked_leftovers_of_dead_processes(tmp_path):
    dead, host = dead_pid(), socket.gethostname()
    users = [tmp_path / ".zshrc.old-2023", tmp_path / ".thesis.partial-77777", tmp_path / f".x.partial-{host}-{dead}",
             tmp_path / ".x.partial-99999999999999999999", tmp_path / f".y.old-{dead}"]
    users[0].write_text("my shell")
    for p in users[1:]:
        p.mkdir()
        (p / "chapter.tex").write_text("mine")
    huge = io.make_work_folder(tmp_path / ".z.partial-99999999999999999999")  # a marker, but no process has that id
    ours_dead = io.make_work_folder(tmp_path / f".r.partial-{host}-{dead}")
    ours_alive = io.make_work_folder(io.work_name(tmp_path / "r"))
    elsewhere = io.make_work_folder(tmp_path / f".r.partial-otherhost-{dead}")
    link = tmp_path / f".l.partial-{host}-{dead}"
    link.symlink_to(ours_alive)
    assert io.clean_leftovers(tmp_path) == [ours_dead]
    assert all(p.exists() for p in users + [huge, ours_alive, elsewhere, link])
    assert (users[1] / "chapter.tex").read_text() == "mine"


def test_kernel_file_cleanup_survives_huge_numbers(tmp_path):
    from lowrank.book import notebooks

    name = tmp_path / f"lowrank-kernel-{notebooks._host_tag()}-99999999999999999999-ab.json"
    name.write_text("{}")
    notebooks.clean_kernel_files(tmp_path)  # no OverflowError
    assert io.process_alive(10**20) is False and io.process_alive(os.getpid())


def test_a_finished_run_folder_holds_no_marker_and_its_manifest_matches(tmp_path):
    final = tmp_path / "abc"
    work = io.make_work_folder(io.work_name(final))
    (work / "a.txt").write_text("a")
    runs.write_manifest(work)
    io.replace_folder(work, final)
    assert not (final / io.WORK_MARKER).exists() and runs.manifest_problems(final) == [f"provenance.json missing or "
                                                                                       f"unreadable (required)"]
    assert sorted(p.name for p in final.iterdir()) == ["a.txt", "manifest.json"]


# ---- silently wrong: the input is the key, bounds where the work is sized, spectra, resumes --------

def test_resuming_to_train_longer_evaluates_the_epochs_an_uninterrupted_run_does(tmp_path):
    ckpt = tmp_path / "run.ckpt"
    _fit(tmp_path, ckpt, epochs=3, eval_every=2)
    resumed = _fit(tmp_path, ckpt, epochs=5, eval_every=2)
    straight = _fit(tmp_path, None, epochs=5, eval_every=2)
    evaluated = lambda t: sorted(t.loc[t["train_loss"].notna(), "epoch"].unique().tolist())  # noqa: E731
    assert evaluated(straight) == [0, 2, 4, 5] and evaluated(resumed) == evaluated(straight)
    cols = ["epoch", "layer", "rank_frobenius", "weight_norm", "train_loss", "test_acc"]
    assert resumed[cols].equals(straight[cols])


def test_the_lr_column_is_the_configured_rate(tmp_path):
    from lowrank.core import datasets, train
    from lowrank.core.nets import mlp

    table = train.train_ensemble(lambda: mlp.mlp("MLP", 2, 8, 64, 10), datasets.digits(),
                                 [{"lr": 0.1, "seed": 0}, {"lr": 0.03, "seed": 1}], batch_size=256, epochs=3,
                                 milestones=[1], lr_decay=0.2, progress=False)
    by_epoch = table.groupby(["lr0", "epoch"])["lr"].first()
    assert by_epoch[(0.1, 0)] == 0.1 and by_epoch[(0.1, 1)] == 0.1 and by_epoch[(0.03, 1)] == 0.03
    assert by_epoch[(0.1, 2)] == 0.1 * 0.2 and by_epoch[(0.03, 3)] == 0.03 * 0.2  # in float64, not 0.0200000004


def test_a_collected_sweep_holds_the_configured_lr(clean_env, monkeypatch):
    import pandas as pd

    spec = spec_file(clean_env, {"function": "lowrank.core.train:train_point",
                                 "points": [{"model": "MLP-2-8", "dataset": "digits", "batch_size": 256, "lr": 0.1,
                                             "epochs": 1}]})
    loaded = sweeps.load_spec(spec, output=clean_env / "out")
    assert not sweeps.run_sweep(loaded, "local", jobs=1, progress=False)["failed"]
    sweeps.collect(loaded)
    sweeps.collect(loaded)  # its own table: replaced
    text = (clean_env / "out" / "collected.csv").read_text()
    assert "0.10000000149" not in text and set(pd.read_csv(clean_env / "out" / "collected.csv")["lr"]) == {0.1}


def test_spectral_functions_take_every_finite_input_and_refuse_the_rest():
    import math

    import torch

    from lowrank.core import spectral

    for scale in (1e200, 1e-200, 1.0, 1e-310):
        assert spectral.alignment([scale, scale], [scale, 0.0]) == pytest.approx(1 / math.sqrt(2), rel=1e-12)
        assert spectral.alignment([scale, 0.0], [scale, 0.0]) == pytest.approx(1.0)
        s = torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64) * scale
        stats = spectral.spectrum_stats(s, 0.5)
        assert stats["stable_rank"].item() == pytest.approx(14 / 9)  # ||s||^2 / s_1^2 = (9 + 4 + 1) / 9
        assert stats["weight_norm"].item() == pytest.approx(math.sqrt(14) * scale, rel=1e-12)
        assert int(spectral.rank_from_singular_values(s, 0.5)) == 2  # 3 and 2 above 1.5; 1 not
    for bad, message in [([1.0, 2.0, 3.0], "descending"), ([3.0, -1.0], "negative"), ([3.0, math.nan], "NaN"),
                         ([math.inf, 1.0], "infinite")]:
        with pytest.raises(ValueError, match=message):
            spectral.rank_from_singular_values(torch.tensor(bad, dtype=torch.float64), 0.5)
        with pytest.raises(ValueError, match=message):
            spectral.spectrum_stats(torch.tensor(bad, dtype=torch.float64), 0.5)
    s = torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64)
    for fro, message in [(math.nan, "NaN"), (-1.0, "negative"), (math.inf, "infinite")]:
        with pytest.raises(ValueError, match=message):
            spectral.rank_from_singular_values(s, 0.5, "frobenius", fro=torch.tensor(fro, dtype=torch.float64))
        with pytest.raises(ValueError, match=message):
            spectral.spectrum_stats(s, 0.5, fro=torch.tensor(fro, dtype=torch.float64))
    for bad in ([math.nan, 1.0], [math.inf, 1.0]):
        with pytest.raises(ValueError, match="NaN or infinite"):
            spectral.alignment(bad, [1.0, 1.0])
    with pytest.raises(ValueError, match="zero vector"):
        spectral.alignment([0.0, 0.0], [1.0, 1.0])


@pytest.mark.parametrize("kwargs, message", [
    ({"widths": [-5]}, "widths"), ({"widths": [0]}, "widths"), ({"widths": [2.5]}, "widths"),
])
def test_negative_or_broken_widths_are_refused(kwargs, message):
    from lowrank.core.nets import normalized

    with pytest.raises(ValueError, match=message):
        normalized.make("mlp", (1, 8, 8), 10, **kwargs)
    with pytest.raises(ValueError, match="channels"):
        normalized.make("paper_cnn", (1, 8, 8), 10, channels=[-2, 4], strides=[1, 1], padding=1)


def test_an_extra_key_does_not_bypass_the_memory_estimate(monkeypatch):
    from lowrank.book import rules

    monkeypatch.setenv("LOWRANK_MEMORY_LIMIT", "8G")
    name = "square/low_rank_sgd"
    with pytest.raises(rules.ParameterError, match="GiB"):
        rules.resolve_parameters(name, overrides={"arch_kwargs": {"widths": [20000]}})
    with pytest.raises(rules.ParameterError, match="below the minimum"):  # a negative seed once cancelled the width
        rules.resolve_parameters(name, overrides={"arch_kwargs": {"widths": [20000], "seed": -20000}})
    with pytest.raises(rules.ParameterError, match="GiB"):  # other keys add nothing to the estimate
        rules.resolve_parameters(name, overrides={"arch_kwargs": {"widths": [20000], "seed": 3, "rho_init": 0.5}})
    with pytest.raises(rules.ParameterError, match="element -5 is below the minimum"):
        rules.resolve_parameters(name, overrides={"arch_kwargs": {"widths": [-5]}})
    assert rules.numbers_in({"widths": [64, 64], "seed": 3, "rho_init": 2.0}) == 128


@pytest.mark.parametrize("grid, expect", [
    ({"a": list(range(1000)), "b": list(range(1000))}, "1,000,000 runs"),
    ({"a": list(range(1000)), "b": list(range(1000)), "c": list(range(1000))}, "1,000,000,000 runs"),
])
def test_a_huge_grid_is_refused_before_it_is_built(clean_env, capsys, grid, expect):
    spec = spec_file(clean_env, {"function": "lowrank.core.train:train_point", "grid": grid})
    err = one_line(["sweep", spec, "--dry-run", "--output", clean_env / "out"], capsys)
    assert expect in err and "split it" in err


def test_the_data_folder_and_its_files_key_the_run(tmp_path, monkeypatch):
    point = {"model": "MLP-2-8", "dataset": "mnist", "batch_size": 8, "lr": 0.1, "epochs": 1, "data_root": "data"}
    target = "lowrank.core.train:train_point"
    one, two = tmp_path / "one", tmp_path / "two"
    for d in (one, two):
        d.mkdir()
        (d / "train-images-idx3-ubyte").write_bytes(b"images")
    monkeypatch.setenv("LOWRANK_DATA", str(one))
    code = keys.code_key(target)
    first = runs.run_hash(target, point, code)
    monkeypatch.setenv("LOWRANK_DATA", str(two))
    (two / "train-images-idx3-ubyte").write_bytes(b"other images")
    assert runs.run_hash(target, point, code) != first  # another data folder with other files: another run
    monkeypatch.setenv("LOWRANK_DATA", str(one))
    assert runs.run_hash(target, point, code) == first
    os.utime(one / "train-images-idx3-ubyte", ns=(1, 1))  # only the time changed: the contents are the key
    assert runs.run_hash(target, point, code) == first
    st = (one / "train-images-idx3-ubyte").stat()
    (one / "train-images-idx3-ubyte").write_bytes(b"imagez")  # a changed image file, same size ...
    os.utime(one / "train-images-idx3-ubyte", ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and its old mtime
    assert runs.run_hash(target, point, code) != first
    (one / "train-images-idx3-ubyte").write_bytes(b"images")  # the same bytes again: the same run
    assert runs.run_hash(target, point, code) == first
    os.mkfifo(one / "pipe")  # a FIFO in the data folder is keyed by its name, never read (no hang)
    assert runs.run_hash(target, point, code) != first
    # a notebook's data_root as well
    name = "sgd/rank_bound"
    from lowrank.book import rules

    params = rules.resolve_parameters(name)
    code = keys.code_key(name)
    before = runs.run_hash(name, params, code)
    (one / "new-batch").write_bytes(b"x")
    assert runs.run_hash(name, params, code) != before


def _table(**over):
    """A monitor table as a train_point sweep's collected.csv holds it."""
    import pandas as pd

    rows = []
    for run, (B, lr) in enumerate([(16, 0.1), (32, 0.1), (64, 0.1)]):
        for epoch in range(0, 3):
            rows.append({"run": run, "model": "MLP-BN-4-64", "dataset": "digits", "batch_size": B, "lr": lr, "lr0": lr,
                         "epochs": 2, "weight_decay": 5e-3, "momentum": 0.9, "eps": 1e-3, "milestones": "[]",
                         "lr_decay": 0.1, "augment": False, "rotation": "uniform", "seed": 0, "epoch": epoch} | over)
    return pd.DataFrame(rows)


@pytest.mark.parametrize("over, named", [
    ({"model": "MLP-2-16"}, "model is 'MLP-2-16' in the table"), ({"eps": 0.05}, "eps is 0.05"),
    ({"momentum": 0.5}, "no point of the page's grid"), ({"dataset": "mnist1d"}, "dataset"),
    ({"milestones": "[60]"}, "milestones"), ({"batch_size": 4}, "first: batch_size 4"),
    ({"augment": True}, "augment"), ({"rotation": "none"}, "rotation"), ({"lr_decay": 0.5}, "lr_decay"),
    ({"seed": 3}, "grid points are not in the table"),
])
def test_a_sweep_table_that_does_not_match_the_page_is_refused(over, named):
    from lowrank.sgd import ranks

    grid = ranks.experiment_grid(batch_sizes=[16, 32, 64], lrs=[0.1], weight_decays=[5e-3], momenta=[0.9],
                                 seeds=[0])
    page = dict(model="MLP-BN-4-64", dataset="digits", epochs=2, eps=1e-3, milestones=[], lr_decay=0.1,
                augment=False, rotation="uniform")
    ranks.check_table(_table(), grid=grid, **page)  # the matching table passes
    with pytest.raises(ValueError, match=named):
        ranks.check_table(_table(**over), grid=grid, **page)
    with pytest.raises(ValueError, match="end at epoch 2, the page asks for epochs=500"):
        ranks.check_table(_table(), grid=grid, **(page | {"epochs": 500}))
    with pytest.raises(ValueError, match="does not match the page's parameters"):
        ranks.rank_experiment(grid=grid, **(page | {"model": "MLP-BN-10-100"}), coarse_eps=1e-2, min_train_acc=0.5,
                              table=_table(), regime_only=True)


@pytest.mark.parametrize("drop", ["eps", "milestones", "lr_decay", "augment", "rotation", "model", "dataset"])
def test_a_sweep_table_that_does_not_record_a_page_setting_is_refused(drop):
    from lowrank.sgd import ranks

    grid = ranks.experiment_grid(batch_sizes=[16, 32, 64], lrs=[0.1], weight_decays=[5e-3], momenta=[0.9], seeds=[0])
    page = dict(model="MLP-BN-4-64", dataset="digits", epochs=2, eps=1e-3, milestones=[], lr_decay=0.1,
                augment=False, rotation="uniform")
    with pytest.raises(ValueError, match=f"the table records no {drop} "):
        ranks.check_table(_table().drop(columns=[drop]), grid=grid, **page)


def test_a_sweep_table_must_cover_every_grid_point_and_epoch():
    from lowrank.sgd import ranks

    page = dict(model="MLP-BN-4-64", dataset="digits", epochs=2, eps=1e-3, milestones=[], lr_decay=0.1,
                augment=False, rotation="uniform")
    wider = ranks.experiment_grid(batch_sizes=[16, 32, 64], lrs=[0.1], weight_decays=[5e-3, 0.0], momenta=[0.9],
                                  seeds=[0])
    with pytest.raises(ValueError, match="3 of the page's 6 grid points are not in the table .first: batch_size 16, "
                                         "lr 0.1, weight_decay 0"):
        ranks.check_table(_table(), grid=wider, **page)
    grid = ranks.experiment_grid(batch_sizes=[16, 32, 64], lrs=[0.1], weight_decays=[5e-3], momenta=[0.9], seeds=[0])
    cut = _table()
    cut = cut[~((cut["run"] == 1) & (cut["epoch"] == 2))]  # one run stopped an epoch early
    with pytest.raises(ValueError, match="end at epoch 1, the page asks for epochs=2"):
        ranks.check_table(cut, grid=grid, **page)


# ---- tracebacks and wrong errors: one line each -------------------------------------------------------

def test_paths_naming_a_user_without_a_home_give_one_line(clean_env, capsys):
    assert "names no user" in one_line(["data", "fetch", "mnist", "--root", "~nouser_lowrank/d"], capsys)
    # `-p sweep_table ~nouser/...` is the parameter rules' (the params branch's rules.py refuses it)
    spec = spec_file(clean_env, {"function": "lowrank.core.train:train_point",
                                 "points": [{"model": "MLP-2-8", "dataset": "digits", "batch_size": 8, "lr": 0.1,
                                             "epochs": 1, "checkpoint": "~nouser_lowrank/c.ckpt"}]})
    assert "names no user" in one_line(["sweep", spec, "--output", clean_env / "out", "--dry-run"], capsys)
    spec = spec_file(clean_env, {"function": "lowrank.core.train:train_point",
                                 "points": [{"model": "MLP-2-8", "dataset": "mnist", "batch_size": 8, "lr": 0.1,
                                             "epochs": 1, "data_root": "~nouser_lowrank/data"}]})
    assert "names no user" in one_line(["sweep", spec, "--output", clean_env / "out", "--dry-run"], capsys)


@pytest.mark.parametrize("content", ["[]", "3", '"text"', "null"])
def test_a_provenance_that_is_no_mapping_gives_one_line(tmp_path, capsys, monkeypatch, content):
    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    folder = _run_folder(tmp_path / "runs")
    (folder / "provenance.json").write_text(content)
    runs.write_manifest(folder)
    assert "not a mapping" in one_line(["report", folder, "-o", tmp_path / "r.html"], capsys)
    assert "not a mapping" in one_line(["results", "store", folder], capsys)


def test_results_store_on_a_sweeps_folder_gives_one_line(clean_env, capsys, monkeypatch):
    monkeypatch.setenv("LOWRANK_SWEEP_MODULES", "sweep_fixture")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    spec = spec_file(clean_env, {"function": "sweep_fixture:ranked_matrix", "points": [{"size": 3, "seed": 0}]})
    assert cli.main(["sweep", str(spec), "--output", str(clean_env / "out")]) == 0
    capsys.readouterr()
    run = next(p for p in (clean_env / "out").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert "not of a notebook" in one_line(["results", "store", run], capsys)
    assert "not a complete run folder" in one_line(["results", "store", clean_env / "out"], capsys)


def test_a_full_disk_is_said_to_be_full(tmp_path, capsys, monkeypatch):
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cli, "cmd_list", full)
    assert "the disk is full" in one_line(["list"], capsys, code=1)


def test_every_run_diverging_is_said_so(recwarn):
    from lowrank.core import train
    from lowrank.sgd import ranks

    grid = ranks.experiment_grid(batch_sizes=[64, 128], lrs=[1e6], weight_decays=[5e-3], momenta=[0.0], seeds=[0])
    setup = dict(model="MLP-2-8", dataset="digits", epochs=2, eps=1e-3, coarse_eps=1e-2, min_train_acc=0.5)
    with pytest.raises(train.AllDiverged, match=r"every run diverged \(2 of 2.*learning rates 1e\+06"):
        ranks.rank_experiment(grid=grid, **setup)
    # one run that trains: a result, with the diverged one excluded as before
    grid = ranks.experiment_grid(batch_sizes=[64], lrs=[1e6, 0.1], weight_decays=[5e-3], momenta=[0.0], seeds=[0])
    assert len(ranks.rank_experiment(grid=grid, **setup)["diverged"]) == 1


# ---- the hostile pass's findings (cases beyond the issue's) ---------------------------------------------

def test_a_run_folder_holding_a_link_is_not_trusted(tmp_path, capsys, monkeypatch):
    """A run folder handed over by someone else, with a figure that links to a local secret and a
    manifest that matches it: the report would carry the secret. A run writes no links."""
    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    secret = tmp_path / "id_rsa"
    secret.write_bytes(b"PRIVATE KEY")
    folder = _run_folder(tmp_path / "runs")
    (folder / "figures" / "fig.png").symlink_to(secret)
    runs.write_manifest(folder)
    assert runs.manifest_problems(folder) == ["figures/fig.png is a link (a run writes none)"]
    assert "is a link" in one_line(["report", folder, "-o", tmp_path / "r.html"], capsys)
    assert not (tmp_path / "r.html").exists()


def test_a_sweep_checkpoint_cannot_lie_in_a_run_folder(clean_env, capsys):
    run = _run_folder(runs.RUNS)
    spec = spec_file(clean_env, {"function": "lowrank.core.train:train_point",
                                 "points": [{"model": "MLP-2-8", "dataset": "digits", "batch_size": 8, "lr": 0.1,
                                             "epochs": 1, "checkpoint": str(run / "figures" / "c.ckpt")}]})
    assert "inside the run folder" in one_line(["sweep", spec, "--output", clean_env / "out", "--dry-run"], capsys)


def test_a_sweep_output_through_a_link_to_a_run_folder_is_refused(clean_env, capsys, monkeypatch):
    monkeypatch.setenv("LOWRANK_SWEEP_MODULES", "sweep_fixture")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    run = _run_folder(runs.RUNS)
    link = clean_env / "results"
    link.symlink_to(run)
    spec = spec_file(clean_env, {"function": "sweep_fixture:ranked_matrix", "points": [{"size": 3, "seed": 0}]})
    assert "inside the run folder" in one_line(["sweep", spec, "--output", link / "sub"], capsys)
    assert runs.manifest_problems(run) == []


@pytest.mark.parametrize("victim", ["README.md", "tests/golden_verdicts.yaml"])
def test_diff_never_overwrites_a_file_it_did_not_write(tmp_path, capsys, victim):
    copy = tmp_path / Path(victim).name
    copy.write_bytes((REPO / victim).read_bytes())
    assert "was not written by lowrank" in one_line(["diff", "-o", copy], capsys)
    assert copy.read_bytes() == (REPO / victim).read_bytes()


def test_a_sweep_checkpoint_naming_a_device_is_refused_when_the_spec_is_read(clean_env, capsys):
    spec = spec_file(clean_env, {"function": "lowrank.core.train:train_point",
                                 "points": [{"model": "MLP-2-8", "dataset": "digits", "batch_size": 8, "lr": 0.1,
                                             "epochs": 1, "checkpoint": "/dev/null"}]})
    assert "is a device" in one_line(["sweep", spec, "--output", clean_env / "out", "--dry-run"], capsys)


def test_a_fetch_cut_short_by_a_full_disk_says_the_disk_is_full(tmp_path, capsys, monkeypatch):
    """The download's own message was "stopped at N bytes ... run the command again to resume"; with
    the disk holding the data folder full, the command says that instead."""
    from lowrank.core import datasets

    def cut_short(name, root):
        raise datasets.FetchError("https://example.invalid/x stopped at 10 of 100 bytes ([Errno 28]); run the "
                                  "command again to resume from .x.part")

    free_bytes = cli._free_bytes
    assert free_bytes(tmp_path / "no" / "such" / "folder") > 0  # the deepest existing folder's disk
    monkeypatch.setattr(datasets, "fetch", cut_short)
    monkeypatch.setattr(cli, "_free_bytes", lambda path: 4096)
    err = one_line(["data", "fetch", "mnist", "--root", tmp_path / "d"], capsys, code=1)
    assert "is full (0.0 MiB free)" in err and str(tmp_path / "d") in err
    monkeypatch.setattr(cli, "_free_bytes", lambda path: 2**40)  # room enough: the download's own message
    assert "stopped at 10 of 100 bytes" in one_line(["data", "fetch", "mnist", "--root", tmp_path / "d"], capsys)


def test_collect_never_writes_through_a_planted_link(clean_env, monkeypatch):
    monkeypatch.setenv("LOWRANK_SWEEP_MODULES", "sweep_fixture")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    spec = sweeps.load_spec(spec_file(clean_env, {"function": "sweep_fixture:ranked_matrix",
                                                  "points": [{"size": 3, "seed": 0}]}), output=clean_env / "out")
    assert not sweeps.run_sweep(spec, "local", jobs=1, progress=False)["failed"]
    mine = clean_env / "thesis.tex"
    mine.write_text("mine")
    (clean_env / "out" / "collected.csv").symlink_to(mine)
    with pytest.raises(io.OutputRefused, match="is a link"):
        sweeps.collect(spec)
    assert mine.read_text() == "mine"
    (clean_env / "out" / "collected.csv").unlink()
    sweeps.collect(spec)  # its own table, then replaced as written ...
    sweeps.collect(spec)
    (clean_env / "out" / "collected.csv").write_text("run,my own table\n")  # ... but not a user's, whatever its head
    with pytest.raises(io.OutputRefused, match="was not written by lowrank"):
        sweeps.collect(spec)
    assert (clean_env / "out" / "collected.csv").read_text() == "run,my own table\n"


def test_a_failed_notebooks_copy_never_writes_through_a_planted_link(tmp_path, monkeypatch):
    import papermill
    from papermill.exceptions import PapermillExecutionError

    from lowrank.book import notebooks

    monkeypatch.setattr(notebooks, "FAILED_ROOT", tmp_path / "failed")
    mine = tmp_path / "thesis.tex"
    mine.write_text("mine")
    kept = tmp_path / "failed" / "gradients" / "decomposition.ipynb"
    kept.parent.mkdir(parents=True)
    kept.symlink_to(mine)

    def fails(src, out, **kwargs):
        Path(out).write_text('{"cells": []}')
        raise PapermillExecutionError(cell_index=1, exec_count=1, source="x", ename="ValueError", evalue="no",
                                      traceback=[])

    monkeypatch.setattr(papermill, "execute_notebook", fails)
    with pytest.raises(notebooks.NotebookFailed):
        notebooks.execute("gradients/decomposition", tmp_path / "nb.ipynb")
    assert mine.read_text() == "mine" and not kept.is_symlink() and kept.read_text() == '{"cells": []}'


def test_no_link_is_followed_by_a_write_whoever_owns_it(tmp_path):
    """A link in an output's place is refused, the user's own as another's (a planted one in /tmp, or a
    dangling one, would otherwise create or replace a file wherever it points)."""
    target = tmp_path / "real.txt"
    target.write_text("old")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "elsewhere" / "cron-job")
    own = tmp_path / "own"
    own.symlink_to(tmp_path / "new.txt")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for link in (own, dangling, loop):
        with pytest.raises(io.OutputRefused, match="is a link"):
            io.write_atomically(link, "x")
    assert not (tmp_path / "new.txt").exists() and not (tmp_path / "elsewhere").exists()


# ---- round 2: "ours" is the tool's record; nothing it did not write is deleted; no hang on odd files -----

def test_diff_never_overwrites_a_file_starting_with_its_title(tmp_path, capsys):
    mine = tmp_path / "notes.md"
    mine.write_text("# Verdict diff\n\nmy notes on the last build\n")
    assert "was not written by lowrank" in one_line(["diff", "-o", mine], capsys)
    assert "my notes" in mine.read_text()


def test_a_sweep_rerun_never_deletes_a_finished_folder_holding_a_users_file(clean_env, capsys, monkeypatch):
    monkeypatch.setenv("LOWRANK_SWEEP_MODULES", "sweep_fixture")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    spec_path = spec_file(clean_env, {"function": "sweep_fixture:ranked_matrix", "points": [{"size": 3, "seed": 0}]})
    spec = sweeps.load_spec(spec_path, output=clean_env / "out")
    assert not sweeps.run_sweep(spec, "local", jobs=1, progress=False)["failed"]
    folder = spec.run_folder(spec.points[0])
    (folder / "my-analysis.ipynb").write_text("mine")
    with pytest.raises(runs.RunFolderError, match=r"holds files its run did not write or that were changed since \(my-analysis.ipynb\); "
                                                  r"nothing was deleted"):
        sweeps.run_sweep(spec, "local", jobs=1, progress=False)
    assert (folder / "my-analysis.ipynb").read_text() == "mine"
    (folder / "my-analysis.ipynb").unlink()
    (folder / "results.json").unlink()  # a file of the run lost: the folder is the tool's to redo
    assert not sweeps.run_sweep(spec, "local", jobs=1, progress=False)["failed"]
    assert runs.manifest_problems(folder) == []


def test_a_sweep_run_folder_that_is_a_link_is_refused_in_one_line(clean_env, capsys, monkeypatch):
    """shutil.rmtree on a link raised OSError "Cannot call rmtree on a symbolic link"."""
    monkeypatch.setenv("LOWRANK_SWEEP_MODULES", "sweep_fixture")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    spec = sweeps.load_spec(spec_file(clean_env, {"function": "sweep_fixture:ranked_matrix",
                                                  "points": [{"size": 3, "seed": 0}]}), output=clean_env / "out")
    assert not sweeps.run_sweep(spec, "local", jobs=1, progress=False)["failed"]
    folder = spec.run_folder(spec.points[0])
    elsewhere = clean_env / "thesis"
    elsewhere.mkdir()
    (elsewhere / "chapter.tex").write_text("mine")
    shutil.rmtree(folder)
    folder.symlink_to(elsewhere)
    with pytest.raises(runs.RunFolderError, match="is a link"):
        sweeps.run_sweep(spec, "local", jobs=1, progress=False)
    assert (elsewhere / "chapter.tex").read_text() == "mine"


def test_a_notebook_rerun_never_deletes_a_users_file_in_the_run_folder(tmp_path):
    folder = _run_folder(tmp_path / "runs")
    runs.check_discardable(folder)  # as its run wrote it: the tool's to replace
    saved = (folder / "verdicts.json").read_text()
    (folder / "verdicts.json").write_text('{"edited": 1}')  # an edit is the user's, even to a file of the run
    with pytest.raises(runs.RunFolderError, match="verdicts.json"):
        runs.check_discardable(folder)
    (folder / "verdicts.json").write_text(saved)
    runs.check_discardable(folder)
    manifest = json.loads((folder / "manifest.json").read_text())  # a user's file listed in a planted entry
    (folder / "thesis.tex").write_text("mine")
    (folder / "manifest.json").write_text(json.dumps({**manifest, "thesis.tex": "0" * 16}))
    with pytest.raises(runs.RunFolderError, match="thesis.tex"):
        runs.discard_run_folder(folder)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "thesis.tex").unlink()
    (folder / "parameters.json").unlink()  # a file of the run missing: nothing of the user's is lost
    runs.check_discardable(folder)
    (folder / "parameters.json").write_text("{}")
    (folder / "sub").mkdir()  # named as the tool's own files, but not where the tool puts them
    (folder / "sub" / "manifest.json").write_text('{"mine": 1}')
    with pytest.raises(runs.RunFolderError, match="sub/manifest.json"):
        runs.check_discardable(folder)
    shutil.rmtree(folder / "sub")
    (folder / "figures" / "my-sketch.svg").write_text("mine")
    with pytest.raises(runs.RunFolderError, match="figures/my-sketch.svg"):
        runs.check_discardable(folder)
    (folder / "manifest.json").unlink()  # without a manifest nothing there is known to be the run's
    with pytest.raises(runs.RunFolderError, match="parameters.json"):
        runs.discard_run_folder(folder)
    assert (folder / "figures" / "my-sketch.svg").read_text() == "mine"


def test_fetch_never_removes_an_incomplete_cifar_folder_holding_a_users_files(tmp_path):
    from test_fetch import _cifar_archive, _cifar_batches, _md5, _mnist_files, _Server, _sources

    from lowrank.core import datasets

    cifar = _cifar_archive()
    batches = _cifar_batches()
    with _Server({"cifar-10-python.tar.gz": cifar}) as srv:
        sources = _sources(srv.base, _mnist_files(), cifar)
        folder = tmp_path / "cifar-10-batches-py"
        folder.mkdir()
        (folder / "my-notes.txt").write_text("mine")
        (folder / "data_batch_1").write_bytes(batches["data_batch_1"])  # one published batch already there
        datasets.fetch("cifar10", tmp_path, sources=sources, progress=False)
        assert (folder / "my-notes.txt").read_text() == "mine"
        assert all(_md5((folder / n).read_bytes()) == _md5(b) for n, b in batches.items())
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the unpack folder is gone
        # a batch there that is not the published one: named, nothing removed or replaced
        (folder / "test_batch").write_bytes(b"my own")
        (tmp_path / "cifar-10-python.tar.gz").unlink()
        with pytest.raises(datasets.FetchError, match="test_batch is there but its md5"):
            datasets.fetch("cifar10", tmp_path, sources=sources, progress=False)
        assert (folder / "test_batch").read_bytes() == b"my own" and (folder / "my-notes.txt").is_file()


def test_a_leftover_unpack_folder_of_the_same_pid_name_is_not_removed(tmp_path):
    """The unpack folder was `.cifar-10-batches-py.tmp-PID`, removed first: a user's folder of that name went."""
    from test_fetch import _cifar_archive, _mnist_files, _Server, _sources

    from lowrank.core import datasets

    theirs = tmp_path / f".cifar-10-batches-py.tmp-{os.getpid()}"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("mine")
    cifar = _cifar_archive()
    with _Server({"cifar-10-python.tar.gz": cifar}) as srv:
        datasets.fetch("cifar10", tmp_path, sources=_sources(srv.base, _mnist_files(), cifar), progress=False)
    assert (theirs / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("kind", ["fifo", "broken link"])
def test_an_mnist_file_that_is_a_fifo_or_a_broken_link_is_refused_without_waiting(tmp_path, capsys, kind):
    from lowrank.core import datasets

    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    odd = raw / "train-images-idx3-ubyte.gz"
    if kind == "fifo":
        os.mkfifo(odd)
    else:
        odd.symlink_to(tmp_path / "gone.gz")
    want = "is a FIFO, not a regular file" if kind == "fifo" else r"is a broken link \(-> .*gone.gz\)"
    with pytest.raises(datasets.FetchError, match=want):  # in data fetch: before pooch opens it
        datasets.fetch("mnist", tmp_path, sources={"mnist": datasets.SOURCES["mnist"]._replace(
            mirrors=("http://127.0.0.1:9/",))}, progress=False)
    with pytest.raises(ValueError, match=want):  # and in the loader, not "not found"
        datasets.mnist(tmp_path)


def test_a_gzip_bomb_mnist_file_is_stopped_at_what_its_header_says(tmp_path):
    import gzip

    from lowrank.core import datasets

    header = bytes([0, 0, 8, 1]) + (10).to_bytes(4, "big")  # "10 labels"
    bomb = tmp_path / "t10k-labels-idx1-ubyte.gz"
    with gzip.open(bomb, "wb") as f:
        f.write(header)
        for _ in range(64):  # 64 MiB unpacked from ~64 KiB
            f.write(bytes(1 << 20))
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(ValueError, match="holds more than its header"):
        datasets._read_idx(bomb)
    huge = tmp_path / "train-images-idx3-ubyte"
    huge.write_bytes(bytes([0, 0, 8, 3]) + b"".join(n.to_bytes(4, "big") for n in (10**9, 28, 28)))
    with pytest.raises(ValueError, match="an MNIST file holds at most"):
        datasets._read_idx(huge)


from test_fetch import _Loopback  # noqa: E402 (the loopback server, beside the cases that use it)


class _OddServer(_Loopback):
    """A mirror that drips one byte every `pause` s, or sends bytes for ever (no Content-Length)."""

    def __init__(self, mode: str, pause: float = 0.2):
        import http.server
        import time

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                self.send_response(200)
                if mode == "drip":
                    self.send_header("Content-Length", "1000")
                if mode == "hello":  # a whole small file, not the published one
                    self.send_header("Content-Length", "5")
                    self.end_headers()
                    self.wfile.write(b"hello")
                    return
                self.end_headers()
                try:
                    for _ in range(10**6):
                        self.wfile.write(b"x" if mode == "drip" else bytes(1 << 16))
                        self.wfile.flush()
                        if mode == "drip":
                            time.sleep(pause)
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        self.serve(Handler, daemon_threads=True)  # a dripping handler must not hold the shutdown


def test_a_dripping_mirror_is_stopped_at_the_minimum_rate(tmp_path, monkeypatch):
    import time

    from lowrank.core import datasets

    monkeypatch.setattr(datasets, "DOWNLOAD_GRACE", 1)  # deadline: 1 x timeout + size / rate
    monkeypatch.setattr(datasets, "DOWNLOAD_MIN_RATE", 1000)
    with _OddServer("drip") as srv:
        started = time.monotonic()
        with pytest.raises(datasets.FetchError, match="slower than"):
            datasets.download(srv.base + "f.gz", tmp_path / "f.gz", "0" * 32, progress=False, timeout=1.0,
                              max_bytes=1000)
        assert time.monotonic() - started < 10  # each byte came within the timeout: without a deadline, 200 s
    assert not (tmp_path / "f.gz").exists()


def test_a_download_with_another_md5_names_the_file_and_both_checksums(tmp_path):
    import hashlib

    from lowrank.core import datasets

    target = tmp_path / "sub" / "f.gz"
    with _OddServer("hello") as srv:
        with pytest.raises(datasets.FetchError) as err:
            datasets.download(srv.base + "f.gz", target, "0" * 32, progress=False, timeout=5.0, max_bytes=1000)
    got = hashlib.md5(b"hello").hexdigest()  # independent: the md5 of what the server sent
    assert str(target) in str(err.value) and f"md5 is {got}" in str(err.value) and "0" * 32 in str(err.value)
    assert not target.exists() and not (tmp_path / "sub").exists()  # nothing kept


def test_an_endless_download_is_stopped_at_the_published_size(tmp_path):
    from lowrank.core import datasets

    with _OddServer("endless") as srv:
        with pytest.raises(datasets.FetchError, match="sent more than the 100000 bytes"):
            datasets.download(srv.base + "f.gz", tmp_path / "f.gz", "0" * 32, progress=False, timeout=5.0,
                              max_bytes=100000)
    assert list(tmp_path.iterdir()) == []
    assert dict(datasets.SOURCES["mnist"].sizes).keys() == {n for n, _ in datasets.SOURCES["mnist"].files}
    assert dict(datasets.SOURCES["cifar10"].sizes).keys() == {n for n, _ in datasets.SOURCES["cifar10"].files}


@pytest.mark.parametrize("page, name", [("sgd/architectures", "res_bn_lrs"), ("sgd/architectures", "mlp_lrs"),
                                        ("sgd/generalization", "panel_lrs")])
def test_a_learning_rate_list_with_a_repeated_value_is_refused(capsys, page, name):
    assert "repeats a value" in one_line(["run", page, "-p", name, "[0.05, 0.05]", "--dry-run"], capsys)


# ---- spectral functions: defined for every finite input (ratios before squares), refusing the rest --------

def test_spectrum_stats_of_huge_and_subnormal_spectra_are_their_ratios():
    import torch

    from lowrank.core import spectral

    huge = spectral.spectrum_stats(torch.tensor([1.7e308, 1e308, 1.0], dtype=torch.float64), 0.01)
    # independent: the ratios 1, 1/1.7, 1/1.7e308 -> stable rank 1 + 1/1.7^2; ||s|| beyond float64: inf
    assert float(huge["stable_rank"]) == pytest.approx(1 + 1 / 1.7**2, rel=1e-12)
    assert int(huge["rank_spectral"]) == 2 and int(huge["rank_frobenius"]) == 2
    assert huge["weight_norm"] == float("inf") and float(huge["spectral_norm"]) == 1.7e308
    tiny = spectral.spectrum_stats(torch.tensor([5e-324, 5e-324], dtype=torch.float64), 0.01)
    assert float(tiny["stable_rank"]) == pytest.approx(2.0) and int(tiny["rank_frobenius"]) == 2  # was 1: the squares underflowed
    sub = spectral.spectrum_stats(torch.full((3,), 1e-310, dtype=torch.float64), 0.5)
    assert float(sub["stable_rank"]) == pytest.approx(3.0) and int(sub["rank_frobenius"]) == 3
    assert int(spectral.rank_from_singular_values(torch.full((3,), 1e-310, dtype=torch.float64), 0.5,
                                                  "frobenius")) == 3


@pytest.mark.parametrize("eps", [1, 1.5, 0, -0.1])
def test_a_rank_threshold_outside_zero_one_is_refused(eps):
    import torch

    from lowrank.core import spectral

    for call in (lambda: spectral.rank_from_singular_values(torch.tensor([1.0, 0.5]), eps),
                 lambda: spectral.spectrum_stats(torch.tensor([1.0, 0.5]), eps),
                 lambda: spectral.numerical_rank(torch.eye(3), eps)):
        with pytest.raises(ValueError, match=r"in \(0, 1\)"):
            call()


def test_principal_angles_and_top_singular_of_huge_finite_matrices():
    import torch

    from lowrank.core import spectral

    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(6, 2, generator=g, dtype=torch.float64), torch.randn(6, 2, generator=g, dtype=torch.float64)
    for scale in (1e300, 1e-300):  # the column spaces are A's and B's: the same angles (was "zero matrix")
        assert torch.allclose(spectral.principal_angles(A * scale, B * scale), spectral.principal_angles(A, B))
    T = torch.randn(8, 7, generator=g, dtype=torch.float64)
    for scale in (1e300, 1e-300):
        assert torch.allclose(spectral.principal_angles(T * scale, T.flip(0) * scale),
                              spectral.principal_angles(T, T.flip(0)), atol=1e-10)
    # A^T B = 1e200 * (A^T B with the scales out): the values scale, the message of a real overflow names A^T B
    got = spectral.top_singular_of_product(A * 1e250, B * 1e-50).s
    assert torch.allclose(got / 1e200, torch.linalg.svdvals(A.T @ B)[:1], rtol=1e-12)
    with pytest.raises(ValueError, match=r"A\^T B exceeds the largest"):
        spectral.top_singular_of_product(A * 1e200, B * 1e200)
    with pytest.raises(ValueError, match="singular value of M exceeds"):
        spectral.top_singular(torch.full((3, 3), 1e308, dtype=torch.float64))


# ---- the memory estimate applies to sweep points, before any work -------------------------------------

@pytest.mark.parametrize("point, named", [
    ({"model": "MLP-9999-999999"}, "model='MLP-9999-999999'"),
    ({"model": "ViT", "dataset": "cifar10", "vit_dim": 100000}, "model='ViT'"),
])
def test_a_sweep_point_beyond_the_memory_estimate_is_refused_before_a_dry_run(clean_env, capsys, point, named,
                                                                               monkeypatch):
    monkeypatch.setenv("LOWRANK_MEMORY_LIMIT", "64G")
    base = {"model": "MLP-2-8", "dataset": "digits", "batch_size": 8, "lr": 0.1, "epochs": 1}
    spec = spec_file(clean_env, {"function": "lowrank.core.train:train_point", "points": [base | point]})
    out = clean_env / "out"
    message = one_line(["sweep", spec, "--output", out, "--dry-run"], capsys)
    assert named in message and "GiB by the estimate of train_point" in message and "64 GiB allowed" in message
    assert not out.exists()  # refused before any work
    # the same sweep of a small point passes the estimate (the refusal is the size, not the spec)
    from lowrank.book import sweeps

    small = spec_file(clean_env, {"function": "lowrank.core.train:train_point", "points": [base]}, name="small.yaml")
    assert len(sweeps.load_spec(small, output=out).points) == 1


def test_the_sweep_point_estimate_grows_with_each_size():
    from lowrank.book import sweeps

    fn = "lowrank.core.train:train_point"
    point = {"model": "MLP-2-100", "dataset": "digits", "batch_size": 8}
    base = sweeps.point_memory_bytes(fn, point)
    # independent count: 2 * 100^2 + 3082 * 100 weights at 16 bytes, (4*2*100 + 3072) * 8 floats, digits' floats
    assert base == pytest.approx(16 * (2 * 100 ** 2 + 3082 * 100) + 4 * (800 + 3072) * 8 + 4 * 1797 * 64)
    assert sweeps.point_memory_bytes(fn, point | {"batch_size": 800}) > base
    assert sweeps.point_memory_bytes(fn, point | {"model": "MLP-2-1000"}) > base
    vit = {"model": "ViT", "dataset": "cifar10", "batch_size": 8}
    assert sweeps.point_memory_bytes(fn, vit | {"vit_dim": 1024}) > sweeps.point_memory_bytes(fn, vit)
    assert sweeps.point_memory_bytes("lowrank.other:f", point) is None


# ---- a FIFO or device among the files `lowrank report` reads: refused, never a hang ---------------------

@pytest.mark.parametrize("name", ["manifest.json", "provenance.json", "verdicts.json"])
def test_report_refuses_a_fifo_in_a_run_folder_without_hanging(tmp_path, capsys, monkeypatch, name):
    import signal

    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    folder = _run_folder(tmp_path / "runs")
    (folder / name).unlink()
    os.mkfifo(folder / name)
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("report hung on a FIFO")))
    signal.alarm(20)
    try:
        message = one_line(["report", folder, "-o", tmp_path / "r.html"], capsys)
    finally:
        signal.alarm(0)
    assert name in message and not (tmp_path / "r.html").exists()
    if name == "manifest.json":
        assert "is a FIFO, not a regular file" in message


def test_read_regular_bytes_refuses_what_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(io.NotRegularFile, match="is a FIFO"):
        io.read_regular_bytes(fifo)
    with pytest.raises(io.NotRegularFile, match="is a device"):
        io.read_regular_bytes("/dev/zero")
    with pytest.raises(io.NotRegularFile, match="is a folder"):
        io.read_regular_bytes(tmp_path)
    (tmp_path / "ok").write_bytes(b"abc")
    assert io.read_regular_bytes(tmp_path / "ok") == b"abc"


# ---- wrong errors: the message says what is wrong ----------------------------------------------------

def test_a_fifo_spec_file_is_not_a_regular_file_and_an_empty_output_is_refused(clean_env, capsys):
    fifo = clean_env / "s.yaml"
    os.mkfifo(fifo)
    message = one_line(["sweep", fifo, "--output", clean_env / "o", "--dry-run"], capsys)
    assert "is a FIFO, not a regular file" in message and "does not exist" not in message
    spec = spec_file(clean_env, {"function": "lowrank.core.train:train_point",
                                 "points": [{"model": "MLP-2-8", "dataset": "digits", "batch_size": 8, "lr": 0.1,
                                             "epochs": 1}]})
    for empty in ["", " "]:
        assert "--output is empty" in one_line(["sweep", spec, "--output", empty, "--dry-run"], capsys)
    assert not (clean_env / "runs").exists()  # not sent to the default folder
    assert "does not exist" in one_line(["sweep", clean_env / "none.yaml", "--dry-run"], capsys)  # a real absence


def test_report_into_a_run_folder_hints_a_file_outside_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    folder = _run_folder(tmp_path / "runs")
    for target in [folder, folder / "figures", tmp_path / "runs"]:
        message = one_line(["report", folder, "-o", target], capsys)
        assert "where no report is written" in message and str(target / "report.html") not in message
        assert not (target / "report.html").exists()
    own = tmp_path / "mine"
    own.mkdir()
    assert str(own / "report.html") in one_line(["report", folder, "-o", own], capsys)  # elsewhere: the hint stands
    assert cli.main(["report", str(folder), "-o", str(own / "report.html")]) == 0  # and the hinted file is accepted


# ---- round 3: a FIFO or a device is said to be one, not "missing"; a sweep's point names the sweep ------

def _alarm(seconds=20):
    import signal

    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("hung on a FIFO")))
    signal.alarm(seconds)


def _sweep_point(clean_env, monkeypatch):
    monkeypatch.setenv("LOWRANK_SWEEP_MODULES", "sweep_fixture")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    spec_path = spec_file(clean_env, {"function": "sweep_fixture:ranked_matrix", "points": [{"size": 3, "seed": 0}]})
    spec = sweeps.load_spec(spec_path, output=clean_env / "out")
    assert not sweeps.run_sweep(spec, "local", jobs=1, progress=False)["failed"]
    return spec_path, spec.run_folder(spec.points[0])


def test_a_fifo_parameters_json_is_said_to_be_a_fifo_not_missing(tmp_path, capsys, monkeypatch):
    import signal

    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    folder = _run_folder(tmp_path / "runs")
    (folder / "parameters.json").unlink()
    os.mkfifo(folder / "parameters.json")
    _alarm()
    try:
        problems = runs.manifest_problems(folder)
        with pytest.raises(runs.RunFolderError) as err:
            runs.load_run(folder)
        message = one_line(["report", folder, "-o", tmp_path / "r.html"], capsys)
        with pytest.raises(runs.RunFolderError, match="parameters.json") as refused:
            runs.check_discardable(folder)  # a FIFO is never the run's: the folder is not deleted
    finally:
        signal.alarm(0)
    assert problems == ["parameters.json is a FIFO, not a regular file"]
    for said in (str(err.value), message):
        assert "parameters.json is a FIFO, not a regular file" in said and "missing" not in said
    assert (folder / "parameters.json").exists() and "nothing was deleted" in str(refused.value)
    assert "parameters.json is a FIFO, not a regular file" in str(refused.value)  # its kind, not "changed"


def test_a_fifo_results_file_of_a_sweep_point_is_said_to_be_a_fifo(clean_env, monkeypatch):
    import signal

    _, folder = _sweep_point(clean_env, monkeypatch)
    name = next(n for n in runs.FUNCTION_RESULTS if (folder / n).is_file())
    (folder / name).unlink()
    os.mkfifo(folder / name)
    extra = folder / "results.csv" if name != "results.csv" else folder / "results.json"
    os.mkfifo(extra)  # one the manifest does not list either
    _alarm()
    try:
        problems = runs.manifest_problems(folder)
    finally:
        signal.alarm(0)
    assert f"{name} is a FIFO, not a regular file" in problems
    assert f"{extra.name} is a FIFO, not a regular file (a run writes none)" in problems
    assert not any("missing" in p for p in problems)


def test_a_provenance_linked_to_a_device_is_said_so_and_never_read(tmp_path, monkeypatch):
    folder = _run_folder(tmp_path / "runs")
    (folder / "provenance.json").unlink()
    (folder / "provenance.json").symlink_to("/dev/zero")
    read = []
    real = io.read_regular_bytes
    monkeypatch.setattr(io, "read_regular_bytes", lambda p, *a, **k: read.append(Path(p).name) or real(p, *a, **k))
    with pytest.raises(runs.RunFolderError) as err:
        runs.load_run(folder)
    message = str(err.value)
    assert "provenance.json is a link to a device (-> /dev/zero), not a regular file" in message, message
    assert "no provenance.json" not in message and "provenance.json" not in read
    (folder / "provenance.json").unlink()
    os.mkfifo(folder / "provenance.json")
    with pytest.raises(runs.RunFolderError, match="provenance.json is a FIFO, not a regular file"):
        runs.load_run(folder)


def test_a_changed_sweep_point_names_the_sweep_command_not_lowrank_run(clean_env, monkeypatch, capsys):
    spec_path, folder = _sweep_point(clean_env, monkeypatch)
    next(folder / n for n in runs.FUNCTION_RESULTS if (folder / n).is_file()).unlink()  # a file of the run lost
    with pytest.raises(runs.RunFolderError) as err:
        runs.load_run(folder)
    message = str(err.value)
    assert "lowrank run --force" not in message
    assert f"`lowrank sweep {spec_path} --output {folder.parent}`" in message
    # and the command it names redoes the point
    assert not sweeps.run_sweep(sweeps.load_spec(spec_path, output=folder.parent), "local", jobs=1,
                                progress=False)["failed"]
    assert runs.manifest_problems(folder) == []
    # a notebook's run folder outside any sweep keeps its advice
    nb = _run_folder(clean_env / "runs")
    (nb / "verdicts.json").write_text('{"x": 1}')
    with pytest.raises(runs.RunFolderError, match="lowrank run --force"):
        runs.load_run(nb)


# ---- check_table (the `-p sweep_table` guard), re-tested: the branches the cases above leave out --------

_PAGE = dict(model="MLP-BN-4-64", dataset="digits", epochs=2, eps=1e-3, milestones=[], lr_decay=0.1,
             augment=False, rotation="uniform")


def _grid():
    from lowrank.sgd import ranks

    return ranks.experiment_grid(batch_sizes=[16, 32, 64], lrs=[0.1], weight_decays=[5e-3], momenta=[0.9], seeds=[0])


@pytest.mark.parametrize("drop, named", [("run", "no run and epoch columns"), ("epoch", "no run and epoch columns"),
                                         ("weight_decay", "no weight_decay column")])
def test_a_sweep_table_without_its_run_columns_is_refused(drop, named):
    from lowrank.sgd import ranks

    with pytest.raises(ValueError, match=named):
        ranks.check_table(_table().drop(columns=[drop]), grid=_grid(), **_PAGE)


def test_a_sweep_table_is_read_at_its_configured_rate_not_the_epochs_float32_one():
    """`lr` of collected.csv is the epoch's rate as float32 (0.10000000149011612), decayed after a
    milestone; `lr0` is the configured one: the table matches the page's grid by `lr0`."""
    import numpy as np

    from lowrank.sgd import ranks

    table = _table()
    table["lr"] = np.where(table["epoch"] == 2, np.float32(0.01), np.float32(0.1)).astype(float)
    assert table["lr"].iloc[0] != 0.1  # the float32 rate is not the configured 0.1
    ranks.check_table(table, grid=_grid(), **_PAGE)
    with pytest.raises(ValueError, match="no point of the page's grid"):  # without lr0, the float32 rate is off-grid
        ranks.check_table(table.drop(columns=["lr0"]), grid=_grid(), **_PAGE)


def test_a_sweep_table_holding_a_grid_point_twice_is_refused():
    """Two sweeps' tables concatenated: every grid point is there, each twice; the page would average
    twice the runs its parameters say."""
    import pandas as pd

    from lowrank.sgd import ranks

    once = _table()
    twice = pd.concat([once, once.assign(run=once["run"] + once["run"].max() + 1)], ignore_index=True)
    with pytest.raises(ValueError, match="more than once"):
        ranks.check_table(twice, grid=_grid(), **_PAGE)
