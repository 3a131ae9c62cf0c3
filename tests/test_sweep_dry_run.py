"""`lowrank sweep SPEC --dry-run`: runs, grid, cost from measured epoch times, output; nothing runs."""

import csv

from lowrank.book import cli, sweeps


def test_plan_counts_grid_and_costs_from_measured_times(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("function: lowrank.core.train:train_point\n"
                    "base: {model: MLP-BN-2-8, dataset: digits, epochs: 3, seed: 0}\n"
                    "grid: {batch_size: [16, 8], lr: [0.1, 0.05]}\n")
    timings = tmp_path / "t.csv"
    with timings.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["model", "dataset", "batch_size", "seconds_per_epoch", "measured_on"])
        w.writeheader()
        w.writerow({"model": "MLP-BN-2-8", "dataset": "digits", "batch_size": 16, "seconds_per_epoch": 2.0, "measured_on": "cpu:test"})
    s = sweeps.load_spec(spec, output=tmp_path / "out")
    p = sweeps.plan(s, timings)
    assert p["runs"] == 4 and p["grid"] == {"batch_size": [8, 16], "lr": [0.05, 0.1]}
    assert p["estimated_seconds"] is None  # B=8 unmeasured: the cost is unknown, not the B=16 runs' alone
    assert p["unmeasured"] == ["('MLP-BN-2-8', 'digits', 8)"] and p["finished"] == 0
    with timings.open("a", newline="") as f:
        csv.writer(f).writerow(["MLP-BN-2-8", "digits", 8, 5.0, "cpu:test"])
    assert sweeps.plan(s, timings)["estimated_seconds"] == 2 * 2.0 * 3 + 2 * 5.0 * 3  # 2 runs per B x 3 epochs
    assert cli.main(["sweep", str(spec), "--output", str(tmp_path / "out"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "nothing was run" in out and "estimated cost: unknown of training" in out  # bench/ has no MLP-BN-2-8
    assert not (tmp_path / "out").exists()
