"""Paper-scale results with provenance in results/paper/: stored from a run folder, read back by
`paper_results(name)`, and shown as stale once the notebook's paper parameters change."""

import json

import pytest
import yaml

from lowrank.book import cli, notebooks, paper_results as pr, runs

NAME = "gradients/decomposition"


def _run_folder(tmp_path, params, verdicts=None):
    folder = tmp_path / "runs" / NAME / runs.run_hash(NAME, params)
    folder.mkdir(parents=True)
    verdicts = verdicts if verdicts is not None else {
        "identity_residual": {"name": "identity_residual", "claim": "I-1", "kind": "check", "measured": 1e-15,
                              "outcome": "holds", "scale": "paper"}}
    prov = {"notebook": NAME, "parameters": params, "hash": folder.name, "git": {"commit": "abc", "dirty": False},
            "versions": {"torch": "x"}, "device": "cpu (2 threads)", "start": "2026-11-30T00:00:00+00:00",
            "end": "2026-11-30T00:01:00+00:00", "wall_s": 60.0}
    (folder / "provenance.json").write_text(json.dumps(prov))
    (folder / "verdicts.json").write_text(json.dumps(verdicts))
    return folder


def test_store_and_read_back_with_provenance(tmp_path):
    params = pr.paper_parameters(NAME)
    assert params["scale"] == "paper"
    stored = pr.store_run(_run_folder(tmp_path, params), root=tmp_path / "results")
    assert stored == tmp_path / "results" / NAME
    assert sorted(p.name for p in stored.iterdir()) == ["provenance.json", "verdicts.json"]
    r = pr.paper_results(NAME, root=tmp_path / "results")
    assert r["stale"] is False and r["stale_reason"] is None
    assert r["verdicts"]["identity_residual"]["outcome"] == "holds"
    p = r["provenance"]
    assert p["git"]["commit"] == "abc" and p["wall_s"] == 60.0 and p["device"].startswith("cpu")
    assert p["parameter_hash"] == runs.run_hash(NAME, params) and p["versions"] == {"torch": "x"}
    assert pr.stored_names(tmp_path / "results") == [NAME]
    assert pr.paper_results("gradients/relu", root=tmp_path / "results") is None


def test_a_result_whose_paper_file_changed_is_stale(tmp_path, monkeypatch):
    results = tmp_path / "results"
    pr.store_run(_run_folder(tmp_path, pr.paper_parameters(NAME)), root=results)
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
    ci = runs.resolve_parameters(NAME, scale="ci")
    with pytest.raises(runs.ParameterError, match="not a paper-scale run: parameters .*'n'"):
        pr.store_run(_run_folder(tmp_path, ci), root=tmp_path / "results")
    with pytest.raises(runs.ParameterError, match="no verdicts"):
        pr.store_run(_run_folder(tmp_path / "b", pr.paper_parameters(NAME), verdicts={}), root=tmp_path / "results")
    assert not (tmp_path / "results").exists()


def test_cli_store_and_list(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pr, "RESULTS", tmp_path / "results")
    folder = _run_folder(tmp_path, pr.paper_parameters(NAME))
    assert cli.main(["results", "store", str(folder)]) == 0
    assert cli.main(["results", "list"]) == 0
    out = capsys.readouterr().out
    assert f"{NAME}: 1 verdicts, 60.0 s on cpu (2 threads), commit abc: current" in out


@pytest.mark.parametrize("name", pr.stored_names())
def test_every_stored_result_is_complete(name):
    """(A stale result stays: the ledger marks it; re-measuring may need hours on a GPU.)"""
    r = pr.paper_results(name)
    assert r["verdicts"] and all(v["scale"] == "paper" for v in r["verdicts"].values())
    p = r["provenance"]
    assert p["git"]["commit"] and p["versions"]["torch"] and p["device"] and p["wall_s"] > 0
    assert p["parameter_hash"] == runs.run_hash(name, p["parameters"])
