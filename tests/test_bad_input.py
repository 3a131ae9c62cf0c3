"""Bad input, tried as a user would: every refusal is one clear line (exit 2 from the command line),
comes before any kernel starts, and writes nothing.

The notebook cases use a fixture notebook (tests/fixtures/notebooks/fixture/tiny.md) whose parameter
cell carries every kind of rule; the fixture folder stands in for notebooks/ during each test.
"""

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from lowrank.book import cli, notebooks, rules, runs, sweeps


@pytest.fixture(autouse=True)
def allow_the_sweep_fixture_module(monkeypatch):
    """tests/sweep_fixture.py is outside lowrank: allowed by the documented opt-in."""
    monkeypatch.setenv("LOWRANK_SWEEP_MODULES", "sweep_fixture")


FIXTURES = Path(__file__).parent / "fixtures" / "notebooks"
NB = "fixture/tiny"


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """Notebooks from the fixture folder, runs into tmp_path/runs, the working folder tmp_path/cwd,
    and any kernel start fails the test. Returns the folders that must stay empty."""
    monkeypatch.setattr(notebooks, "NOTEBOOK_ROOT", FIXTURES)
    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    monkeypatch.setenv("LOWRANK_MEMORY_LIMIT", "1G")

    def no_kernel(*args, **kwargs):
        raise AssertionError("a kernel was started for refused input")

    monkeypatch.setattr(notebooks, "execute", no_kernel)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return tmp_path


def written(root: Path, keep=()) -> list[str]:
    """Everything under `root` except the inputs a test made itself (`keep`)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if not any(p == k or k in p.parents or p in k.parents for k in keep) and p.name != "cwd")


def refused(argv, message, capsys, root, keep=()):
    """`lowrank ARGV` exits 2 with `message` on one stderr line and writes nothing under `root`."""
    code = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert message in err, err
    assert len(err.splitlines()) == 1 and err.startswith("lowrank: error: "), err
    assert written(root, keep) == [], "a refused command wrote something"
    return err


# ---- lowrank run: parameter values (the parameter cell's rules) -------------------------------------

RUN_CASES = [
    (["-p", "lr", "0"], "'lr': 0.0 is not above 0"),
    (["-p", "lr", "-0.1"], "'lr': -0.1 is not above 0"),
    (["-p", "momentum", "1"], "'momentum': 1.0 is not below 1"),
    (["-p", "threshold", ".nan"], "'threshold': nan is not a finite number"),
    (["-p", "threshold", ".inf"], "'threshold': inf is not a finite number"),
    (["-p", "threshold", " -.inf"], "'threshold': -inf is not a finite number"),
    (["-p", "threshold", "1.5"], "'threshold': 1.5 is above the maximum"),
    (["-p", "lrs", "[0.1, 0.2]"], "'lrs': [0.1, 0.2] has 2 elements; at least 3 needed"),
    (["-p", "lrs", "[0.1, .nan, 1]"], "'lrs': element nan is not a finite number"),
    (["-p", "lrs", "[0.1, 0, 1]"], "'lrs': element 0.0 is not above 0"),
    (["-p", "lrs", "[0.1, 0.1, 0.1]"], "'lrs': [0.1, 0.1, 0.1] repeats a value (a grid that cannot show a trend)"),
    (["-p", "n", "1:30"], "'n': '1:30' is not an int"),  # YAML 1.2: text (1.1: 90)
    (["-p", "n", "0b101"], "'n': '0b101' is not an int"),  # YAML 1.2: text (1.1: 5)
    (["-p", "milestones", "[foo]"], "'milestones': element 'foo' is not an int"),
    (["-p", "milestones", "[2.5]"], "'milestones': element 2.5 is not an int"),
    (["-p", "batch_sizes", "[4, 8.5]"], "'batch_sizes': element 8.5 is not an int"),
    (["-p", "batch_sizes", "[4, true]"], "'batch_sizes': element True is not an int"),
    (["-p", "batch_sizes", "4"], "'batch_sizes': 4 is not a list"),
    (["-p", "seed", "18446744073709551616"], "'seed': 18446744073709551616 is above the maximum"),
    (["-p", "seed", "4294967296"], "'seed': 4294967296 is above the maximum"),
    (["-p", "seed", "-1"], "'seed': -1 is below the minimum"),
    (["-p", "seeds", "[0, 4294967296]"], "'seeds': element 4294967296 is above the maximum"),
    (["-p", "n", "100000000"], "need about 5.96 GiB by the notebook's estimate (8 * n * d * len(seeds))"),
    (["-p", "n", "1e8"], "need about 5.96 GiB"),  # 1e8 is a number (papermill's reading), a whole one
    (["-p", "n", "2.5e0"], "'n': 2.5 is not an int"),
    (["-p", "n", "true"], "'n': True is not an int"),
    (["-p", "n", str(2**70)], f"'n': {2**70} does not fit in a 64-bit integer"),
    (["-p", "d", "0"], "'d': 0 is below the minimum"),
    (["-p", "names", "[c]"], "'names': element 'c' is not allowed"),
    (["-p", "names", "[]"], "'names': [] is not a non-empty list"),
    (["-p", "step", "-1"], "'step': -1.0 is not above 0"),
    (["-p", "step", "{a: 1}"], "'step': {'a': 1} is not a number"),
    (["-p", "table", "missing.csv"], "'table': 'missing.csv' is not an existing file"),
    (["-p", "table", "/"], "'table': '/' is not an existing file"),
    (["-p", "table", "~nouser-lowrank/t.csv"], "'table': '~nouser-lowrank/t.csv' is not an existing file"),
    (["-p", "scale", "paper"], "set it with --scale"),
    (["-p", "nn", "3"], "no parameter 'nn'; did you mean 'n'?"),
    (["-p", "lr", "0.1", "-p", "lr", "0.2"], "-p lr is given twice (0.1 and 0.2)"),
    (["--scale", "paper"], "fixture/tiny has no paper-scale parameter file"),
]


@pytest.mark.parametrize("args, message", RUN_CASES, ids=[" ".join(a) for a, _ in RUN_CASES])
def test_run_refuses_bad_parameters(sandbox, capsys, args, message):
    refused(["run", NB, *args], message, capsys, sandbox)


NAME_CASES = [
    ("../fixture/tiny", "notebook name '../fixture/tiny' must be PART/NAME"),
    ("fixture/../fixture/tiny", "must be PART/NAME"),
    ("/etc/passwd", "notebook name '/etc/passwd' must be PART/NAME"),
    ("fixture/tiny.md", "must be PART/NAME"),
    ("tiny", "notebook name 'tiny' must be PART/NAME"),
    ("fixture/tiny2", "no notebook 'fixture/tiny2'"),
]


@pytest.mark.parametrize("name, message", NAME_CASES)
def test_run_refuses_names_outside_the_notebooks(sandbox, capsys, name, message):
    refused(["run", name], message, capsys, sandbox)


def test_run_refuses_a_notebook_linked_from_outside(sandbox, capsys, tmp_path, monkeypatch):
    root = tmp_path / "nbroot"
    (root / "part").mkdir(parents=True)
    outside = tmp_path / "outside.md"
    outside.write_text((FIXTURES / "fixture" / "tiny.md").read_text())
    (root / "part" / "linked.md").symlink_to(outside)
    monkeypatch.setattr(notebooks, "NOTEBOOK_ROOT", root)
    refused(["run", "part/linked"], "resolves outside", capsys, sandbox, keep=[root, outside])


# ---- parameter files ---------------------------------------------------------------------------------

FILE_CASES = [
    (b"n: 3\n\xff\xfe: 4\n", "is not UTF-8 text (byte 0xff at offset 5)"),
    (b"n: 3\nn: 4\n", "duplicate key 'n'"),
    (b"1: 3\n", "keys must be names (strings), got 1 (int)"),
    (b"[n, 3]: 3\n", "is not valid YAML"),
    (b"- 1\n- 2\n", "must hold a mapping name: value, got list"),
    (b"n: [1, 2\n", "is not valid YAML"),
    (b"threshold: .nan\n", "'threshold': nan is not a finite number"),
    (b"a: &a {n: 3}\nb: &b {d: 2}\nc:\n  <<: *a\n  <<: *b\n", "more than one merge key"),
    (b"lrs: [0.1, .inf, 1.0]\n", "'lrs': element inf is not a finite number"),
    (b"seeds: [0, 1, 2, 99999999999]\n", "'seeds': element 99999999999 is above the maximum"),
]


@pytest.mark.parametrize("content, message", FILE_CASES, ids=[m for _, m in FILE_CASES])
def test_run_refuses_bad_parameter_files(sandbox, capsys, content, message):
    params = sandbox / "params.yaml"
    params.write_bytes(content)
    refused(["run", NB, "--params", params], message, capsys, sandbox, keep=[params])


def test_book_pages_refuse_a_trend_grid_that_repeats_a_value_and_a_dropped_noise_data_set():
    """Issue 51: a grid of repeated learning rates ran and reported "needs a larger scale"; the
    paper file's noise_datasets: [mnist] vanished when datasets_used left MNIST out."""
    with pytest.raises(rules.ParameterError, match=r"'lrs': \[0.1, 0.1, 0.1\] repeats a value"):
        rules.resolve_parameters("sgd/rank_vs_learning_rate", texts={"lrs": "[0.1, 0.1, 0.1]"})
    with pytest.raises(rules.ParameterError, match=r"'noise_datasets': \['mnist'\] not in datasets_used \['digits'\]"):
        rules.resolve_parameters("gradients/real_data", scale="paper", texts={"datasets_used": "[digits]"}, memory=False)
    kept = rules.resolve_parameters("gradients/real_data", scale="paper", memory=False,
                                    texts={"datasets_used": "[digits]", "noise_datasets": "[digits]",
                                           "penalty_datasets": "[digits]"})
    assert kept["noise_datasets"] == ["digits"]


@pytest.mark.parametrize("kwargs, message", [
    ({"widths": [20000], "seed": -20000}, "'arch_kwargs.seed': -20000 is below the minimum"),
    ({"widths": [-5]}, "'arch_kwargs.widths': element -5 is below the minimum"),
    ({"widths": [8], "depth": 3}, "'arch_kwargs': key 'depth' is not allowed"),
    ({"rho_init": 0}, "'arch_kwargs.rho_init': 0.0 is not above 0")])
def test_network_keyword_arguments_are_typed_by_their_shared_declaration(kwargs, message):
    """Issue 51: an extra key (`seed: -20000`) took the memory estimate below the limit, `widths: [-5]`
    was accepted; the kwargs now have a declaration (params/rules.yaml's $defs) like any parameter."""
    with pytest.raises(rules.ParameterError, match=re.escape(message)):
        rules.resolve_parameters("square/rho_dynamics", overrides={"arch_kwargs": kwargs})


def test_a_text_parameter_takes_the_text_as_given(sandbox):
    """YAML 1.1 (papermill's -p) made `no` False and `2026-01-01` a date; a str parameter keeps the text."""
    got = rules.resolve_parameters(NB, texts={"table": ""})
    assert got["table"] == ""
    (Path.cwd() / "no").write_text("x\n")
    assert rules.resolve_parameters(NB, texts={"table": "no"})["table"] == str(Path.cwd() / "no")


def test_run_refuses_missing_or_folder_parameter_files(sandbox, capsys):
    refused(["run", NB, "--params", sandbox / "none.yaml"], "does not exist", capsys, sandbox)
    folder = sandbox / "folder.yaml"
    folder.mkdir()
    refused(["run", NB, "--params", folder], "does not exist (it is a folder)", capsys, sandbox, keep=[folder])


def test_run_refuses_a_runs_folder_that_is_a_file(sandbox, monkeypatch):
    blocker = sandbox / "runs"
    blocker.write_text("not a folder")
    params = rules.resolve_parameters(NB)
    with pytest.raises(runs.RunFolderError, match="exists and is not a folder"):
        runs.run(NB, params)
    assert blocker.read_text() == "not a folder"


# ---- lowrank sweep -------------------------------------------------------------------------------

def spec_file(root: Path, body, name="spec.yaml") -> Path:
    path = root / name
    path.write_text(yaml.safe_dump(body) if isinstance(body, dict) else body)
    return path


FUNCTION = {"function": "sweep_fixture:ranked_matrix", "grid": {"seed": [0, 1], "size": [5]}}
TRAIN_POINT = {"function": "lowrank.core.train:train_point",
               "base": {"model": "MLP-2-8", "dataset": "digits", "batch_size": 8, "lr": 0.1, "epochs": 1}}

SWEEP_CASES = [
    ({**FUNCTION, "resources": {"num_cpus": 0}}, [], "resources.num_cpus must be a positive integer"),
    ({**FUNCTION, "resources": {"num_cpus": 1.5}}, [], "resources.num_cpus must be a positive integer"),
    ({**FUNCTION, "resources": {"num_gpus": -1}}, [], "resources.num_gpus must be a number >= 0"),
    ({**FUNCTION, "resources": {"num_gpus": ".inf"}}, [], "resources.num_gpus must be a number >= 0"),
    (FUNCTION, ["--jobs", "-1"], "--jobs must be a positive number of runs at once, got -1"),
    (FUNCTION, ["--jobs", "0"], "--jobs must be a positive number of runs at once, got 0"),
    (FUNCTION, ["--address", "127.0.0.1:1"], "--address is for --executor ray"),
    (FUNCTION, ["--executor", "ray", "--address", "nonsense"], "must be HOST:PORT"),
    (FUNCTION, ["--executor", "ray", "--address", "127.0.0.1:99999"], "must be HOST:PORT"),
    ({"notebook": "../../etc/passwd", "points": [{}]}, [], "must be PART/NAME"),
    ({"notebook": "/etc/passwd", "points": [{}]}, [], "must be PART/NAME"),
    ({"notebook": NB, "grid": {"threshold": [0.5, ".nan"]}}, [], "'threshold': nan is not a finite number"),
    ({"notebook": NB, "grid": {"lrs": [[0.1, 0.2]]}}, [], "'lrs': [0.1, 0.2] has 2 elements; at least 3 needed"),
    ({"notebook": NB, "grid": {"seed": [0, 4294967296]}}, [], "'seed': 4294967296 is above the maximum"),
    (TRAIN_POINT | {"points": [{"lr": ".nan"}]}, [], "parameter 'lr': nan is not a finite number"),
    (TRAIN_POINT | {"points": [{"epochs": 1.5}]}, [], "parameter 'epochs': 1.5 is not an int"),
    (TRAIN_POINT | {"points": [{"model": 3}]}, [], "parameter 'model': 3 is not a string"),
    ("notebook: fixture/tiny\nnotebook: fixture/tiny\npoints: [{}]\n", [], "duplicate key 'notebook'"),
    ("{}\n", [], "is empty"),
    ({"notebook": NB, "base": "missing-base.yaml", "points": [{}]}, [], "base file"),
]


@pytest.mark.parametrize("body, args, message", SWEEP_CASES, ids=[m for _, _, m in SWEEP_CASES])
def test_sweep_refuses_bad_specs_and_options(sandbox, capsys, body, args, message):
    if isinstance(body, dict):  # YAML would read ".nan" / ".inf" in a plain file as floats
        body = yaml.safe_dump(body).replace("'.nan'", ".nan").replace("'.inf'", ".inf")
    spec = spec_file(sandbox, body)
    refused(["sweep", spec, "--output", sandbox / "out", *args], message, capsys, sandbox, keep=[spec])


def test_sweep_refuses_a_spec_that_is_not_utf8(sandbox, capsys):
    spec = sandbox / "spec.yaml"
    spec.write_bytes(b"notebook: fixture/tiny\npoints: [{seed: 0}]\n# caf\xe9\n")
    refused(["sweep", spec, "--output", sandbox / "out"], "is not UTF-8 text", capsys, sandbox, keep=[spec])


@pytest.mark.slow
def test_sweep_refuses_an_unreachable_ray_address_within_bounded_tries(sandbox, capsys):
    import socket

    with socket.socket() as s:  # a port nobody listens on: bound here, never listened
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        spec = spec_file(sandbox, FUNCTION)
        refused(["sweep", spec, "--output", sandbox / "out", "--executor", "ray", "--address", f"127.0.0.1:{port}"],
                f"cannot reach the Ray cluster at 127.0.0.1:{port} (3 tries", capsys, sandbox, keep=[spec])


def test_sweep_refuses_an_output_that_is_a_file(sandbox, capsys):
    spec = spec_file(sandbox, FUNCTION)
    out = sandbox / "out"
    out.write_text("a file")
    refused(["sweep", spec, "--output", out], "exists and is not a folder", capsys, sandbox, keep=[spec, out])


TRAIN = {"function": "lowrank.core.train:train_point",
         "base": {"model": "MLP-2-8", "dataset": "digits", "batch_size": 8, "lr": 0.1, "epochs": 1}}


def test_sweep_refuses_checkpoint_paths_that_cannot_be_written(sandbox, capsys):
    folder = sandbox / "ckpt-folder"
    folder.mkdir()
    spec = spec_file(sandbox, TRAIN | {"points": [{"seed": 0, "checkpoint": str(folder)}]})
    refused(["sweep", spec, "--output", sandbox / "out"], "is a folder; give a file path", capsys, sandbox,
            keep=[spec, folder])
    spec = spec_file(sandbox, TRAIN | {"points": [{"seed": 0, "checkpoint": str(sandbox / "no" / "c.pt")}]})
    refused(["sweep", spec, "--output", sandbox / "out"], f"folder {sandbox / 'no'} does not exist", capsys,
            sandbox, keep=[spec, folder])


# ---- lowrank report ----------------------------------------------------------------------------------

def _finished_run(root: Path) -> Path:
    """A complete run folder with a manifest (written by hand, as `runs.run` writes it)."""
    folder = root / "runs" / "fixture" / "tiny" / "abc"
    (folder / "figures").mkdir(parents=True)
    (folder / "verdicts.json").write_text('{"v": {"measured": 1.0, "outcome": "agrees", "expected": "1"}}')
    (folder / "provenance.json").write_text('{"notebook": "fixture/tiny", "hash": "abc", "parameters": {}}')
    (folder / "figures" / "f.png").write_bytes(b"png")
    runs.write_manifest(folder)
    return folder


def test_report_refuses_bad_output_and_folders(sandbox, capsys):
    run = _finished_run(sandbox)
    keep = [sandbox / "runs"]
    outdir = sandbox / "outdir"
    outdir.mkdir()
    refused(["report", run, "-o", outdir], "is a folder; give a file name", capsys, sandbox, keep=[*keep, outdir])
    blocker = sandbox / "file"
    blocker.write_text("x")
    refused(["report", run, "-o", blocker / "report.html"], "exists and is not a folder", capsys, sandbox,
            keep=[*keep, outdir, blocker])
    refused(["report", sandbox / "nowhere", "-o", sandbox / "r.html"], "no such folder", capsys, sandbox,
            keep=[*keep, outdir, blocker])
    refused(["report", outdir, "-o", sandbox / "r.html"], "no provenance.json", capsys, sandbox,
            keep=[*keep, outdir, blocker])


@pytest.mark.parametrize("tamper, message", [
    (lambda f: (f / "verdicts.json").write_text('{"v": {"measured": 2.0, "outcome": "agrees", "expected": "1"}}'),
     "verdicts.json changed"),
    (lambda f: (f / "verdicts.json").write_text('{"v": {"meas'), "verdicts.json changed"),
    (lambda f: (f / "figures" / "f.png").unlink(), "figures/f.png missing"),
    (lambda f: (f / "extra.txt").write_text("x"), "extra.txt not written by the run"),
    (lambda f: (f / "manifest.json").unlink(), "no readable manifest.json"),
])
def test_report_refuses_a_run_folder_changed_since_it_was_written(sandbox, capsys, tamper, message):
    run = _finished_run(sandbox)
    tamper(run)
    refused(["report", run, "-o", sandbox / "r.html"], message, capsys, sandbox, keep=[sandbox / "runs"])


# ---- public functions ----------------------------------------------------------------------------

def _spectral_cases():
    from lowrank.core import spectral

    return [
        (lambda: spectral.numerical_rank(np.eye(3) * (1 + 1j)), TypeError, "M is complex"),
        (lambda: spectral.stable_rank(np.eye(3).astype(np.complex64)), TypeError, "M is complex"),
        (lambda: spectral.numerical_rank(np.full((3, 3), np.nan)), ValueError, "contains NaN or infinite"),
        (lambda: spectral.numerical_rank(np.zeros((3, 3))), ValueError, "zero matrix"),
        (lambda: spectral.numerical_rank(np.eye(3), eps=0), ValueError, "eps must be positive"),
        (lambda: spectral.numerical_rank(np.eye(3), eps=float("nan")), ValueError, "eps must be positive"),
        (lambda: spectral.numerical_rank(np.eye(3), norm="l2"), ValueError, "norm='l2' is not allowed"),
        (lambda: spectral.stable_rank(np.ones(3)), ValueError, "at least 2 dimensions"),
        (lambda: spectral.effective_rank(np.zeros((0, 3))), ValueError, "is empty"),
        (lambda: spectral.rank_k_error(np.eye(3), -1), ValueError, "k must be a non-negative integer"),
        (lambda: spectral.alignment(np.zeros(3), np.ones(3)), ValueError, "zero vector"),
        (lambda: spectral.count_outliers(np.eye(3), gap=1.0), ValueError, "gap must be greater than 1"),
        (lambda: spectral.singular_values("abc"), TypeError, "must be array-like of numbers"),
    ]


@pytest.mark.parametrize("i", range(13))
def test_public_functions_refuse_bad_input(sandbox, i):
    call, error, message = _spectral_cases()[i]
    with pytest.raises(error, match=message):
        call()
    assert written(sandbox) == []


def test_as_tensor_finiteness_is_decided_entry_by_entry_when_the_sum_overflows():
    import torch

    from lowrank.core.validation import as_tensor

    huge = np.array([[1e308, 1e308], [1e308, -1.0]])  # finite entries whose sum overflows
    assert torch.equal(as_tensor(huge, "M"), torch.from_numpy(huge))
    for bad in ([np.inf, 1.0], [np.nan, 1.0], [np.inf, -np.inf], [1e308, 1e308, np.nan]):
        with pytest.raises(ValueError, match="M contains NaN or infinite entries"):
            as_tensor(np.array(bad), "M")
    with pytest.raises(ValueError, match="beyond the range of torch.float32"):
        as_tensor(huge, "M", dtype=torch.float32)
    same = torch.ones(3, dtype=torch.float32)
    assert as_tensor(same, "v", dtype=None) is not None and as_tensor(same, "v", dtype=None).dtype == torch.float32


@pytest.mark.slow
def test_collect_refuses_a_changed_run_folder(sandbox, capsys):
    spec = spec_file(sandbox, FUNCTION)
    out = sandbox / "out"
    assert cli.main(["sweep", str(spec), "--output", str(out), "--jobs", "1"]) == 0
    capsys.readouterr()
    loaded = sweeps.load_spec(spec, output=out)
    results = loaded.run_folder(loaded.points[0]) / "results.json"
    results.write_text('{"rank": 99, "stable_rank": 1.0}')
    refused(["sweep", spec, "--output", out, "--collect"], "results.json changed", capsys, sandbox,
            keep=[spec, out])
    assert not (out / "collected.csv").exists()


@pytest.mark.parametrize("seed", [-1, 2**32, 1.0, True, "0"])
def test_check_seed_refuses_what_the_parameter_rule_refuses(sandbox, seed):
    from lowrank.core import validation

    with pytest.raises(ValueError, match="seed must be an integer in 0..4294967295"):
        validation.check_seed(seed)
    assert rules.SEED_MAX == validation.SEED_MAX
    assert written(sandbox) == []


# ---- checkpoints (lowrank.core.train) --------------------------------------------------------------

def _training(tmp_path):
    from lowrank.core import datasets, train
    from lowrank.core.nets import mlp

    data = datasets.digits()
    make = lambda width=8: (lambda: mlp.mlp("MLP", 2, width, 64, 10))  # noqa: E731
    runs = [{"lr": 0.1, "seed": 0}]
    fit = lambda ckpt, **kw: train.train_ensemble(kw.pop("model", make()), kw.pop("data", data), runs,  # noqa: E731
                                                  **({"batch_size": 128, "epochs": 1, "progress": False,
                                                      "checkpoint": ckpt} | kw))
    return train, data, make, fit


@pytest.mark.parametrize("where, message", [
    (lambda root: root / "folder", "is a folder; give a file path"),
    (lambda root: root / "missing" / "c.ckpt", "does not exist"),
])
def test_checkpoint_paths_fail_before_any_training(sandbox, monkeypatch, where, message):
    train, _, _, fit = _training(sandbox)
    (sandbox / "folder").mkdir()

    def no_training(*args, **kwargs):
        raise AssertionError("an epoch was trained before the checkpoint path was checked")

    monkeypatch.setattr(train, "_sgd_epoch", no_training)
    with pytest.raises(ValueError, match=message):
        fit(where(sandbox))
    assert written(sandbox, keep=[sandbox / "folder"]) == []


@pytest.mark.parametrize("content", [b"not a checkpoint at all", b"PK\x03\x04 truncated zip", b""])
def test_a_corrupt_checkpoint_names_its_file(sandbox, content):
    _, _, _, fit = _training(sandbox)
    ckpt = sandbox / "bad.ckpt"
    ckpt.write_bytes(content)
    with pytest.raises(ValueError, match=f"checkpoint {ckpt} is unreadable"):
        fit(ckpt)
    assert ckpt.read_bytes() == content and written(sandbox, keep=[ckpt]) == []


def test_a_checkpoint_refuses_another_model_data_split_settings_or_code(sandbox, monkeypatch):
    """A checkpoint records what it belongs to; resuming with any of it changed is refused by name
    (the shared-checkpoint sweep gave one eps the other's results), and the same call resumes."""
    from lowrank.core import datasets

    train, data, make, fit = _training(sandbox)
    ckpt = sandbox / "run.ckpt"
    fit(ckpt)
    saved = ckpt.read_bytes()
    other_split = datasets.digits(seed=1)
    for kwargs, what in [({"eps": 0.3}, "eps"), ({"model": make(16)}, "model"), ({"data": other_split}, "data split"),
                         ({"loss": "mse"}, "loss"), ({"milestones": [1]}, "milestones")]:
        with pytest.raises(ValueError, match=f"checkpoint {ckpt} belongs to other {what}"):
            fit(ckpt, epochs=2, **kwargs)
        assert ckpt.read_bytes() == saved
    from lowrank.core import checkpoint

    monkeypatch.setattr(checkpoint, "_code_digest", lambda: "edited")
    with pytest.raises(ValueError, match="belongs to other code"):
        fit(ckpt, epochs=2)
    monkeypatch.undo()
    assert fit(ckpt, epochs=2)["epoch"].max() == 2  # the same settings resume
