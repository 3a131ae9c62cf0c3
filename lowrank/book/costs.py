"""What a run costs, from measured seconds per epoch (bench/epoch_seconds.csv), never guessed.

`bench/epoch_seconds.py` measures, on the machine it runs on, the seconds per epoch of training
`members` networks of one (model, dataset, batch size) together (an ensemble: one member for a sweep
point, a page's whole batch-size group for a rank page), and writes one CSV row each with where it
was measured (`measured_on`: `cpu:<host> (<threads> thread)` or `cuda:<host> (<GPU>)`). A cost is the
sum over what is trained of epochs times that measurement; anything without a measurement makes the
cost unknown (None), printed as "unknown".

    epoch_seconds(model, dataset, batch_size, members=1)  # one measurement, or None
    training_seconds(groups)                              # [(model, dataset, B, members, epochs)] -> (seconds, unmeasured)
    sweep_seconds(points)                                 # a sweep's points costed one by one
    lowrank.book.laptop.page_seconds(name, params)        # a page sized for the laptop scale, at params
    format_seconds(seconds)                               # "412 s (0.11 CPU-hours)" or "unknown"
"""

from __future__ import annotations

import csv
from pathlib import Path

from lowrank.book.notebooks import SOURCE_ROOT

__all__ = ["PAGE_BUDGET_S", "TIER_BUDGET_S", "EPOCH_SECONDS", "FIELDS", "read_timings", "epoch_seconds", "training_seconds", "sweep_seconds",
           "format_seconds", "UNKNOWN"]

EPOCH_SECONDS = SOURCE_ROOT / "bench" / "epoch_seconds.csv"  # shipped with an installed copy too
FIELDS = ["model", "dataset", "batch_size", "members", "device", "seconds_per_epoch", "measured_on"]
UNKNOWN = "unknown"
PAGE_BUDGET_S = 600.0  # a laptop page on 2 CPU cores (issue 43)
TIER_BUDGET_S = 3600.0  # the whole laptop tier


def read_timings(path=None) -> dict:
    """`{(model, dataset, batch_size, members, device): (seconds_per_epoch, measured_on)}` from the CSV
    (`EPOCH_SECONDS` by default; {} when there is none). `device` is "cpu" or "cuda"; rows written
    before those columns existed count as one member on the CPU."""
    path = EPOCH_SECONDS if path is None else Path(path)
    if not path.is_file():
        return {}
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            key = (row["model"], row["dataset"], int(row["batch_size"]), int(row.get("members") or 1),
                   row.get("device") or "cpu")
            out[key] = (float(row["seconds_per_epoch"]), row.get("measured_on", ""))
    return out


def epoch_seconds(model: str, dataset: str, batch_size: int, members: int = 1, device: str = "cpu",
                  timings: dict | None = None) -> float | None:
    """Measured seconds per epoch of `members` networks trained together, or None when not measured."""
    found = (read_timings() if timings is None else timings).get((model, dataset, int(batch_size), int(members), device))
    return None if found is None else found[0]


def training_seconds(groups, device: str = "cpu", timings: dict | None = None) -> tuple[float | None, list[str]]:
    """(seconds, unmeasured) of training each `(model, dataset, batch_size, members, epochs)` of
    `groups`; seconds is None when any group has no measurement (they are listed)."""
    timings = read_timings() if timings is None else timings
    total, unmeasured = 0.0, []
    for model, dataset, batch_size, members, epochs in groups:
        s = epoch_seconds(model, dataset, batch_size, members, device, timings)
        if s is None:
            unmeasured.append(f"{model} on {dataset}, B = {batch_size}, {members} member(s)")
        else:
            total += s * int(epochs)
    return (None if unmeasured else total), unmeasured


def sweep_seconds(points, device: str = "cpu", timings: dict | None = None) -> tuple[float | None, list[str], list[str]]:
    """(seconds, unmeasured, measured_on) of a sweep's points costed one by one (one member each: an
    upper bound where a sweep trains ensembles). seconds is None when any point has no measurement
    for its (model, dataset, batch_size), listed in `unmeasured` as "(model, dataset, batch_size)"."""
    timings = read_timings() if timings is None else timings
    total, unmeasured, where = 0.0, set(), set()
    for p in points:
        key = (p.get("model"), p.get("dataset"), p.get("batch_size"))
        found = timings.get((*key, 1, device)) if None not in key else None
        if found is None or "epochs" not in p:
            unmeasured.add(str(key))
            continue
        total += found[0] * int(p["epochs"])
        where.add(found[1])
    return (None if unmeasured else total), sorted(unmeasured), sorted(where)


def format_seconds(seconds: float | None, device: str = "cpu") -> str:
    """"412 s (0.114 CPU-hours)", or "unknown" when not measured."""
    if seconds is None:
        return UNKNOWN
    return f"{seconds:.0f} s ({seconds / 3600:.3g} {'GPU' if device == 'cuda' else 'CPU'}-hours)"
