"""Paper-scale results with provenance in results/paper/: stored from a run folder, read back by
`paper_results(name)`, and shown as stale once the notebook's paper parameters change."""

import json
import shutil

import pytest
import yaml

from lowrank.book import cli, keys, notebooks, paper_results as pr, rules, runs
from probe_book import probe_notebook

NAME = "gradients/decomposition"


def _run_folder(tmp_path, params, verdicts=None):
    folder = tmp_path / "runs" / NAME / runs.run_hash(NAME, params, keys.code_key(NAME))
    folder.mkdir(parents=True)
    verdicts = verdicts if verdicts is not None else {
        "identity_residual": {"name": "identity_residual", "claim": "I-1", "kind": "check", "measured": 1e-15,
                              "outcome": "holds", "scale": "paper"}}
    prov = {"notebook": NAME, "parameters": params, "hash": folder.name, "git": {"commit": "abc", "dirty": False},
            "versions": {"torch": "x"}, "device": "cpu (2 threads)", "start": "2026-11-30T00:00:00+00:00",
            "end": "2026-11-30T00:01:00+00:00", "wall_s": 60.0}
    (folder / "provenance.json").write_text(json.dumps(prov))
    (folder / "verdicts.json").write_text(json.dumps(verdicts))
    runs.write_manifest(folder)
    return folder


def test_store_and_read_back_with_provenance(tmp_path):
    params = pr.paper_parameters(NAME)
    assert params["scale"] == "paper"
    stored = pr.store_run(runs.load_run(_run_folder(tmp_path, params)), root=tmp_path / "results")
    assert stored == tmp_path / "results" / NAME
    assert sorted(p.name for p in stored.iterdir()) == ["provenance.json", "verdicts.json"]
    r = pr.paper_results(NAME, root=tmp_path / "results")
    assert r["stale"] is False and r["stale_reason"] is None
    assert r["verdicts"]["identity_residual"]["outcome"] == "holds"
    p = r["provenance"]
    assert p["git"]["commit"] == "abc" and p["wall_s"] == 60.0 and p["device"].startswith("cpu")
    assert p["parameter_hash"] == pr.parameter_hash(NAME, params) and p["versions"] == {"torch": "x"}
    assert pr.stored_names(tmp_path / "results") == [NAME]
    assert pr.paper_results("gradients/relu", root=tmp_path / "results") is None


def test_a_result_whose_paper_file_changed_is_stale(tmp_path, monkeypatch):
    results = tmp_path / "results"
    pr.store_run(runs.load_run(_run_folder(tmp_path, pr.paper_parameters(NAME))), root=results)
    assert pr.paper_results(NAME, root=results)["stale"] is False
    paper = yaml.safe_load(notebooks.paper_params_path(NAME).read_text())
    paper["n"] = paper["n"] + 1
    edited = tmp_path / "paper.yaml"
    edited.write_text(yaml.safe_dump(paper))
    monkeypatch.setattr(notebooks, "paper_params_path", lambda name: edited)
    r = pr.paper_results(NAME, root=results)
    assert r["stale"] is True and r["stale_reason"].endswith(": n")
    monkeypatch.setattr(notebooks, "paper_params_path", lambda name: tmp_path / "absent.yaml")
    r = pr.paper_results(NAME, root=results)
    assert r["stale"] is True and "no paper-scale parameter file" in r["stale_reason"]


def test_only_paper_scale_runs_with_verdicts_are_stored(tmp_path):
    ci = rules.resolve_parameters(NAME, scale="ci")
    with pytest.raises(rules.ParameterError, match="a ci-scale run; only laptop and paper-scale runs are stored"):
        pr.store_run(runs.load_run(_run_folder(tmp_path, ci)), root=tmp_path / "results")
    with pytest.raises(rules.ParameterError, match="not a paper-scale run: parameters .*'n'"):
        pr.store_run(runs.load_run(_run_folder(tmp_path / "n", {**ci, "scale": "paper"})), root=tmp_path / "results")
    with pytest.raises(rules.ParameterError, match="no verdicts"):
        pr.store_run(runs.load_run(_run_folder(tmp_path / "b", pr.paper_parameters(NAME), verdicts={})), root=tmp_path / "results")
    assert not (tmp_path / "results").exists()


def test_cli_store_and_list(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pr, "RESULTS", tmp_path / "results")
    assert cli.main(["results", "list"]) == 0 and "no paper-scale results in" in capsys.readouterr().out
    folder = _run_folder(tmp_path, pr.paper_parameters(NAME))
    assert cli.main(["results", "store", str(folder)]) == 0
    assert cli.main(["results", "list"]) == 0
    out = capsys.readouterr().out
    assert f"paper {NAME}: 1 verdicts, 60.0 s on cpu (2 threads), commit abc: current" in out


@pytest.mark.parametrize("name", pr.stored_names())
def test_every_stored_result_is_complete(name):
    """(A stale result stays: the ledger marks it; re-measuring may need hours on a GPU.)"""
    r = pr.paper_results(name)
    assert r["verdicts"] and all(v["scale"] == "paper" for v in r["verdicts"].values())
    p = r["provenance"]
    assert p["git"]["commit"] and p["versions"]["torch"] and p["device"] and p["wall_s"] > 0
    assert not p["git"].get("dirty"), "a stored result must come from committed code"
    assert p["parameter_hash"] == pr.parameter_hash(name, p["parameters"])


# ---- the paper-scale build (`python -m lowrank.book.build --scale paper`) ----------------------------

def test_notebooks_without_their_data_are_skipped_with_the_fetch_command(tmp_path):
    from lowrank.book import build as pb

    assert pb.required_data({"dataset": "cifar10", "data_root": "x"}) == ["cifar10"]
    assert pb.required_data({"datasets_used": ["mnist", "digits"], "dataset": "digits"}) == ["mnist"]
    assert pb.required_data(pr.paper_parameters(NAME)) == []
    reason = pb.missing_data("sgd/rank_bound", {"dataset": "cifar10", "data_root": str(tmp_path)})
    assert f"cifar10 is not in {tmp_path}" in reason and "lowrank data fetch cifar10" in reason
    (tmp_path / "cifar-10-batches-py").mkdir()
    for n in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (tmp_path / "cifar-10-batches-py" / n).write_bytes(b"")
    assert pb.missing_data("sgd/rank_bound", {"dataset": "cifar10", "data_root": str(tmp_path)}) is None


@pytest.mark.slow
def test_paper_build_executes_stores_caches_and_skips(tmp_path, monkeypatch, capsys):
    """The build's bookkeeping with the kernel replaced by a stub (a real paper-scale execution takes
    minutes to hours): one notebook executed and stored, one skipped for its data, then a cache hit."""
    from lowrank.book import build as pb
    from lowrank.book.verdicts import GLUE_PREFIX

    calls = []

    def fake_execute(name, output, parameters=None, figure_dir=None, figure_url=None, timeout=None):
        import time

        import nbformat

        calls.append((name, parameters, timeout))
        partial = output.parent / f".{output.stem}.tmp" / "output.ipynb"  # as papermill leaves it mid-run
        partial.parent.mkdir(parents=True)
        cells = [nbformat.v4.new_code_cell("1", metadata={"papermill": {"status": s}})
                 for s in ("completed", "completed", "running", "pending")]
        nbformat.write(nbformat.v4.new_notebook(cells=cells), partial)
        time.sleep(0.5)
        shutil.rmtree(partial.parent)
        output.write_text("{}")
        return {f"{GLUE_PREFIX}identity_residual": {"name": "identity_residual", "claim": "I-1", "kind": "check",
                                                    "measured": 1e-15, "outcome": "holds", "scale": "paper"}}

    monkeypatch.setattr(notebooks, "execute", fake_execute)
    monkeypatch.setattr(pb, "HEARTBEAT_S", 0.1)
    monkeypatch.setattr(pb, "PAPER_EXECUTED", tmp_path / "executed")
    monkeypatch.setattr(pr, "RESULTS", tmp_path / "results")
    data = tmp_path / "no-data"
    real = rules.resolve_parameters

    def resolve(name, scale="ci", **kw):
        p = real(name, scale=scale, **kw)
        return {**p, "data_root": str(data)} if "data_root" in p else p

    monkeypatch.setattr(rules, "resolve_parameters", resolve)
    ready, skipped = pb.execute_paper([NAME, "sgd/rank_bound"])
    assert ready == [NAME] and list(skipped) == ["sgd/rank_bound"] and "cifar10 is not in" in skipped["sgd/rank_bound"]
    assert len(calls) == 1 and calls[0][1] == pr.paper_parameters(NAME) and calls[0][2] >= 3600
    r = pr.paper_results(NAME)
    assert r["stale"] is False and r["provenance"]["wall_s"] >= 0 and r["provenance"]["git"]["commit"]
    assert pb.execute_paper([NAME])[0] == [NAME] and len(calls) == 1, "a current notebook was executed again"
    out = capsys.readouterr().out
    assert "paper scale on " in out and "skipped: cifar10 is not in" in out and "current (cache hit)" in out
    assert f"{NAME}: 0 s elapsed, code cell 3 of 4" in out  # the heartbeat of a running notebook


def test_paper_toc_keeps_prose_and_the_executed_notebooks_only():
    from lowrank.book import build as pb, pages

    toc = pb.paper_toc([NAME])
    files = set()

    def walk(node):
        if isinstance(node, dict):
            files.update([node["file"]] if "file" in node else [])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(toc)
    assert f"notebooks/{NAME}" in files and not any(f.startswith("notebooks/") and f != f"notebooks/{NAME}"
                                                    for f in files)
    assert {f for f in pages.toc_files() if not f.startswith("notebooks/")} <= files | {toc["root"]}


def test_the_ledger_marks_a_stale_paper_result():
    from lowrank.book import ledger

    v = {"name": "identity_residual", "claim": "I-1", "kind": "check", "measured": 1e-15, "outcome": "holds",
         "controls": [], "threshold": {"op": "<=", "value": 1e-12, "origin": "identity"}, "expected": "round-off"}
    row = {"claim_id": "I-1", "notebook": NAME, "exists": True, "verdict": v, "paper": v, "paper_date": "2026-11-30"}
    assert "stale" not in ledger._row_html({**row, "paper_stale": False}, set())
    assert ">stale<" in ledger._row_html({**row, "paper_stale": True}, set())


PROBE_CODE = """from lowrank.book import verdicts as V
v = V.check("n_squared", claim_id="P-1", measured=float(n * n), scale=scale, expected="n^2",
            threshold=V.Threshold(">=", 0.0, "probe"))
print("n squared is", n * n, "at", scale, "scale")"""


def _probe(name, dataset):
    return probe_notebook(name, PROBE_CODE, f'n: int = 2\ndataset: str = "{dataset}"\ndata_root: str = "data"\n',
                          "The value is {glue:text}`n_squared`.")


@pytest.mark.slow
def test_make_paper_on_a_probe_book(tmp_path):
    """`python -m lowrank.book.build --scale paper` end to end on a two-page copy of the book: the page
    with a paper file is executed with it, stored with provenance and rendered in the paper-scale
    HTML; the page whose CIFAR-10 is absent is skipped with the fetch command; the ci build is untouched."""
    import os
    import shutil
    import subprocess
    import sys

    from lowrank.book import build, keys

    root = tmp_path / "book"
    shutil.copytree(keys.PACKAGE, root / "lowrank", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(build.REPO_ROOT / "book" / "_ext", root / "book" / "_ext")
    for rel in ("_config.yml", "book/references.bib", "book/claims.yaml"):
        shutil.copy(build.REPO_ROOT / rel, root / rel)
    (root / "book" / "intro.md").write_text("# Probe book\n")
    (root / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n"
                                   "  - file: notebooks/probe/square\n  - file: notebooks/probe/needs_cifar\n")
    (root / "notebooks" / "probe").mkdir(parents=True)
    (root / "notebooks" / "probe" / "square.md").write_text(_probe("A", "digits"))
    (root / "notebooks" / "probe" / "needs_cifar.md").write_text(_probe("B", "cifar10"))
    (root / "params" / "paper" / "probe").mkdir(parents=True)
    for nb in ("square", "needs_cifar"):
        (root / "params" / "paper" / "probe" / f"{nb}.yaml").write_text("scale: paper\nn: 7\n")
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-m", "lowrank.book.build", "--scale", "paper"], cwd=root, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "probe/needs_cifar: skipped: cifar10 is not in" in out.stdout and "lowrank data fetch cifar10" in out.stdout
    page = (root / "_build" / "paper" / "_build" / "html" / "notebooks" / "probe" / "square.html").read_text()
    assert "n squared is 49 at paper scale" in page and "(paper scale)" in page
    assert "# Parameters" in page and "n = 7" in page  # the injected paper parameters are shown
    assert not (root / "_build" / "paper" / "_build" / "html" / "notebooks" / "probe" / "needs_cifar.html").exists()
    stored = json.loads((root / "results" / "paper" / "probe" / "square" / "provenance.json").read_text())
    assert stored["parameters"]["n"] == 7 and stored["wall_s"] > 0 and stored["device"].startswith(("cpu", "cuda"))
    assert stored["load_at_start"]["cpus"] >= 1  # a wall time on a busy machine says so
    verdict = json.loads((root / "results" / "paper" / "probe" / "square" / "verdicts.json").read_text())
    assert verdict["n_squared"]["measured"] == 49.0 and verdict["n_squared"]["scale"] == "paper"
    assert not (root / "results" / "paper" / "probe" / "needs_cifar").exists()
    assert not (root / "_build" / "executed").exists() and not (root / "_build" / "html").exists()


# ---- cost lines of the paper files: measured (bench/run.py writes them), never typed -----------------

HAND_TYPED_COST = ("estimate", "gpu hour", "cpu:", "about 1", "min on", "h on cpu")


@pytest.mark.parametrize("name", notebooks.list_notebooks())
def test_every_paper_file_carries_the_generated_cost_line(name):
    lines = notebooks.paper_params_path(name).read_text().splitlines()
    cost = [line for line in lines if line.startswith(pr.COST_PREFIX)]
    assert cost == [pr.cost_line(name)], "run `python bench/run.py --only paper` to regenerate it"
    typed = [line for line in lines if line.startswith("#") and not line.startswith(pr.COST_PREFIX)
             and any(word in line.lower() for word in HAND_TYPED_COST)]
    assert not typed, f"a hand-typed cost in {name}'s paper file: {typed}"


def test_cost_line_reads_the_stored_wall_time_and_goes_back_to_unmeasured_when_stale(tmp_path, monkeypatch):
    params = pr.paper_parameters(NAME)
    folder = _run_folder(tmp_path, params)
    prov = json.loads((folder / "provenance.json").read_text())
    prov["load_at_start"] = {"cpus": 2, "load_average_1m": 3.5}
    (folder / "provenance.json").write_text(json.dumps(prov))
    runs.write_manifest(folder)
    root = tmp_path / "results"
    assert "not measured" in pr.cost_line(NAME, root=root)
    pr.store_run(runs.load_run(folder), root=root)
    line = pr.cost_line(NAME, root=root)
    assert line.startswith(pr.COST_PREFIX) and "60 s on cpu (2 threads), 2 CPUs at load 3.5, 2026-11-30" in line
    paper_file = tmp_path / "paper.yaml"
    paper_file.write_text("# a header\nscale: paper\nn: 3\n")
    monkeypatch.setattr(notebooks, "paper_params_path", lambda name: paper_file)
    monkeypatch.setattr(pr, "paper_parameters", lambda name: {**params, "n": params["n"] + 1})  # now stale
    assert pr.write_cost_line(NAME, root=root)
    assert paper_file.read_text().splitlines()[:2] == ["# a header", pr.cost_line(NAME, root=root)]
    assert "not measured" in paper_file.read_text()
    assert not pr.write_cost_line(NAME, root=root)  # idempotent


def test_readme_shows_the_stored_timings():
    """README's paper-scale table is generated from results/paper (bench/run.py --only paper)."""
    text = (notebooks.REPO_ROOT / "README.md").read_text()
    start = "<!-- paper-scale timings: bench/run.py --only paper -->"
    block = text[text.index(start) + len(start):text.index("<!-- end -->", text.index(start))]
    table = pr.timing_table().strip()
    assert block.strip().startswith(table), "run `python bench/run.py --only paper`"
    after = block.strip()[len(table):].strip()  # mf_vs_ntk's floor, written beside a current result only
    stored = pr.paper_results("gradients/mf_vs_ntk")
    assert bool(after) == (stored is not None and not stored["parameters_stale"]), "run `python bench/run.py --only paper`"
    assert not after or after.startswith("`gradients/mf_vs_ntk`'s floor on this machine")


# ---- staleness by code: a real edit of an imported module, in a copy of the repository -----------------

_STATE = """
import json, sys
from lowrank.book import paper_results as pr
name = sys.argv[1]
if sys.argv[2:] == ["store"]:
    v = {"identity_residual": {"name": "identity_residual", "claim_id": "I-1", "kind": "check", "measured": 1e-15,
                               "outcome": "holds", "scale": "paper"}}
    pr.store(name, pr.paper_parameters(name), v, {"wall_s": 1.0, "code": None})
r = pr.paper_results(name)
print(json.dumps({"stale": r["stale"], "reason": r["stale_reason"]}))
"""


def _state(copy, *args):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _STATE, NAME, *args], cwd=copy, capture_output=True, text=True,
                          env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin", "HOME": str(copy)}, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # four interpreters, each importing the package (10 s on an idle machine)
def test_a_stored_result_goes_stale_when_an_imported_module_is_edited(tmp_path):
    """In a copy of the package, notebooks and parameter files: a stored result is current; an edit of a
    module its notebook imports makes it stale, naming the file; undone, it is current again; an edit
    of a module the notebook does not import leaves it current."""
    from lowrank.book import keys

    copy = tmp_path / "repo"
    for part in ("lowrank", "notebooks", "params"):
        shutil.copytree(notebooks.REPO_ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "tests").mkdir()
    shutil.copy(notebooks.REPO_ROOT / "tests" / "golden_verdicts.yaml", copy / "tests")
    shutil.copy(notebooks.REPO_ROOT / "_toc.yml", copy)  # a clone, not an installed copy (notebooks.IN_CLONE)
    assert _state(copy, "store") == {"stale": False, "reason": None}
    used = set(keys.code_files(NAME))
    edited = copy / "lowrank" / "gradients" / "decomposition.py"
    assert "lowrank/gradients/decomposition.py" in used
    original = edited.read_text()
    edited.write_text(original + "\n# an edit\n")
    assert _state(copy) == {"stale": True, "reason": "code changed since the run: lowrank/gradients/decomposition.py"}
    edited.write_text(original)
    assert _state(copy) == {"stale": False, "reason": None}
    unused = next(p for p in sorted((copy / "lowrank").rglob("*.py"))
                  if p.relative_to(copy).as_posix() not in used)
    unused.write_text(unused.read_text() + "\n# an edit\n")
    assert _state(copy) == {"stale": False, "reason": None}


def test_the_stored_part_one_paper_results_read_stale_where_their_code_key_differs():
    """Stored before per-file digests: each result whose code key is not today's reads stale, and the
    ledger's rows say so (their keys predate this code, so today all of them do)."""
    from lowrank.book import keys, ledger

    names = pr.stored_names()
    assert names, "results/paper/ holds the Part I results"
    for name in names:
        r = pr.paper_results(name)
        differs = r["provenance"].get("code") != keys.code_key(name)
        assert r["stale"] == differs and (not differs or "code changed since the run" in r["stale_reason"]), name
        assert r["parameters_stale"] is False, name
    v = {"name": "identity_residual", "claim_id": "I-1", "kind": "check", "measured": 1e-15, "outcome": "holds",
         "controls": [], "threshold": {"op": "<=", "value": 1e-12, "origin": "identity"}, "expected": "round-off"}
    row = {"claim_id": "I-1", "notebook": names[0], "exists": True, "verdict": v, "paper": v, "paper_stale": True,
           "paper_stale_reason": "code changed since the run: code key"}
    assert 'title="stale: code changed since the run: code key">stale<' in ledger._row_html(row, set())
