"""Sweeps: a grid (or list) of runs of a notebook or a function, on a local process pool or Ray.

A sweep spec is a YAML file:

    notebook: sgd/rank_vs_batch_size      # or  function: lowrank.some_module:callable
    scale: ci                             # notebooks only: start from ci defaults or the paper YAML
    base: params/my_base.yaml             # optional: shared parameters (a YAML file or a mapping);
                                          # a key may not be in both base and grid (refused); a
                                          # point's own value overrides the base's
    grid:                                 # the cartesian product of these lists ...
      batch_size: [4, 8, 16]
      seed: [0, 1]
    points:                               # ... or/and an explicit list of points
      - {batch_size: 128, seed: 0}
    resources: {num_cpus: 1, num_gpus: 0} # per run (per ensemble), for Ray
    ensemble: true                        # function lowrank.core.train:train_point only: points that
                                          # differ only in lr, weight_decay, momentum, seed train
                                          # together as one ensemble (one task, one folder per point)

A sweep file is data: it may name only the experiment functions the package declares for
sweeping (`SWEEP_FUNCTIONS`, today `lowrank.core.train:train_point`), never any other function of
`lowrank` (`execute_point`, `write_atomically` or `cli:main` would run or write what the file
says) nor of another module (`os:system`). A module of the person running the sweep is allowed only
when named in the environment variable `LOWRANK_SWEEP_MODULES` (comma-separated module names, e.g.
`LOWRANK_SWEEP_MODULES=my_study`), an explicit opt-in; it cannot name a `lowrank` module. A grid is
sized before it is built (at most `MAX_POINTS` runs), and the default output folder
`runs/sweeps/<spec name>` needs a plain spec name (`...yaml` would be `runs/` itself).

Every point is validated before anything runs (a function's points by the rules of its module's
`PARAMETER_RULES` (JSON Schema keywords) and its annotations, as `lowrank run` checks a notebook's; a function that takes one
config dataclass, as `train_point` takes a `PointConfig`, has that dataclass's fields as its
parameters), as are the output
folder, `--jobs` (a positive integer), a Ray `--address` (reachable within a few bounded tries),
the resources each run asks of the Ray cluster (refused when no node could ever give them) and
checkpoint paths (a file in
an existing folder; a path shared by several points gets a per-point suffix, so that no two points
ever resume from each other's checkpoint). Each run writes its own folder `<output>/<hash>/`
atomically (the layout of `lowrank run`, hash over target, parameters and code, with a manifest);
a restarted sweep skips finished runs whose files match their manifest, removes the temporary
folders of dead processes, and one failing run is reported without stopping the others. A run
that diverged or collapsed (`lowrank.core.train.with_status`) is a result, not a failure: its
rows in `results.csv` and `collected.csv` say so (`status`, `status_epoch`, `status_reason`),
and the sweep's summary counts and names it.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import json
import math
import os
import re
import shutil
import stat
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from lowrank.book import notebooks, rules, runs
from lowrank.book.keys import code_key
from lowrank.core import io
from lowrank.core.validation import user_path

__all__ = ["SweepSpec", "SweepError", "load_spec", "run_sweep", "collect", "EXECUTORS", "ENSEMBLE_FUNCTIONS"]

EXECUTORS = ("local", "ray")
# point function -> the function training several points at once; the keys its points may differ in
# are its module's ENSEMBLE_KEYS
ENSEMBLE_FUNCTIONS = {"lowrank.core.train:train_point": "lowrank.core.train:train_points"}


class SweepError(notebooks.InputError):
    """A sweep spec that cannot run; raised before any run starts."""


@dataclass
class SweepSpec:
    path: Path
    notebook: str | None
    function: str | None
    scale: str
    points: list[dict]  # fully resolved parameters of every run
    resources: dict = field(default_factory=dict)
    output: Path | None = None
    ensemble: bool = False
    code: str = ""  # code_key(target), set when the spec is read
    paths: set = field(default_factory=set)  # runs.path_parameters(target): inputs whose contents key a run

    @property
    def target(self) -> str:
        return self.notebook or self.function

    def run_folder(self, params: dict) -> Path:
        return self.output / runs.run_hash(self.target, params, code=self.code, paths=self.paths)


ALLOWED_MODULES_VARIABLE = "LOWRANK_SWEEP_MODULES"
# the experiment functions of `lowrank` a sweep file may name: each takes plain values (or one config
# dataclass of them), computes a result and writes nothing but the checkpoint its parameters name
SWEEP_FUNCTIONS = frozenset({"lowrank.core.train:train_point"})
MAX_POINTS = 10_000  # runs of one sweep: the paper's largest has 48; a bigger grid is a typo, not a study


def _in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def check_function_module(ref: str) -> None:
    """A sweep's function is one of `SWEEP_FUNCTIONS`, or lives in a module named in
    $LOWRANK_SWEEP_MODULES (never a `lowrank` module: those are the package's machinery)."""
    module = ref.partition(":")[0]
    if _in_package(module, "lowrank"):
        if ref not in SWEEP_FUNCTIONS:
            raise SweepError(f"function {ref!r} is not declared for sweeping; a sweep runs {sorted(SWEEP_FUNCTIONS)}"
                             f" (or a function of a module named in {ALLOWED_MODULES_VARIABLE})")
        return
    allowed = [m.strip() for m in os.environ.get(ALLOWED_MODULES_VARIABLE, "").split(",") if m.strip()]
    if not any(_in_package(module, a) and not _in_package(a, "lowrank") for a in allowed):
        raise SweepError(f"function module {module!r} is outside the lowrank package; a sweep runs "
                         f"{sorted(SWEEP_FUNCTIONS)}, unless {ALLOWED_MODULES_VARIABLE} names the module (an explicit opt-in)")


def _load_function(ref: str, check: bool = True):
    module, _, attr = str(ref).partition(":")
    if not module or not attr:
        raise SweepError(f"function must be 'module:callable', got {ref!r}")
    if check:
        check_function_module(str(ref))
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise SweepError(f"cannot import function {ref!r}: {err}") from err
    if not callable(fn):
        raise SweepError(f"{ref!r} is not callable")
    return fn


def load_spec(path, output: Path | None = None) -> SweepSpec:
    """Read and validate a sweep spec; every point's parameters are checked here."""
    if output is not None and not str(output).strip():  # "" would mean the default folder, silently
        raise SweepError("--output is empty: give a sweep folder, or leave --output out for "
                         "runs/sweeps/<spec name>")
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):  # read, a FIFO would hang
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise SweepError(f"sweep spec {path} is {kind}, not a regular file; give the spec's YAML file")
    raw = rules.load_yaml_mapping(path, "sweep spec", SweepError)
    if not raw:
        raise SweepError(f"sweep spec {path} is empty")
    unknown = set(raw) - {"notebook", "function", "scale", "base", "grid", "points", "resources", "ensemble"}
    if unknown:
        raise SweepError(f"sweep spec {path}: unknown keys {sorted(unknown)}")
    if ("notebook" in raw) == ("function" in raw):
        raise SweepError(f"sweep spec {path}: give exactly one of 'notebook' or 'function'")
    grid = raw.get("grid") or {}
    if not isinstance(grid, dict) or any(not isinstance(v, list) or not v for v in grid.values()):
        raise SweepError(f"sweep spec {path}: 'grid' must map parameter names to non-empty lists")
    listed = raw.get("points") or []
    if not isinstance(listed, list) or any(not isinstance(p, dict) for p in listed):
        raise SweepError(f"sweep spec {path}: 'points' must be a list of mappings")
    keys = list(grid)
    count = math.prod(len(v) for v in grid.values()) * bool(grid) + len(listed)
    if count > MAX_POINTS:  # sized before it is built: 10^9 points would fill the memory first
        raise SweepError(f"sweep spec {path}: {count:,} runs ({' x '.join(str(len(v)) for v in grid.values()) or 0} "
                         f"grid + {len(listed)} points), more than the {MAX_POINTS:,} a sweep runs; split it")
    points = [dict(zip(keys, combo)) for combo in itertools.product(*grid.values())] if grid else []
    points += listed
    if not points:
        raise SweepError(f"sweep spec {path}: no points (give 'grid' or 'points')")
    base = raw.get("base") or {}
    if isinstance(base, str):  # a YAML file of shared parameters, relative to the spec or the repository
        base_path = path.parent / base
        if not base_path.is_file():
            base_path = notebooks.REPO_ROOT / base
        base = rules.load_yaml_mapping(base_path, f"sweep spec {path}: base file", SweepError)
    if not isinstance(base, dict):
        raise SweepError(f"sweep spec {path}: 'base' must be a mapping or a YAML file name")
    both = [k for k in grid if k in base]
    if both:  # the grid's values would replace the base's without a word
        raise SweepError(f"sweep spec {path}: {both[0]!r} is in both 'base' and 'grid' (the grid would override the "
                         f"base); give it in one of them")
    if "function" in raw and "scale" in raw:
        raise SweepError(f"sweep spec {path}: 'scale' is for notebooks (ci defaults or the paper YAML); a function's "
                         f"points give every value themselves")
    scale = raw.get("scale", "ci")
    if scale not in notebooks.SCALES:
        raise SweepError(f"sweep spec {path}: scale must be one of {', '.join(notebooks.SCALES)}, got {scale!r}")
    resources = _check_resources(path, raw.get("resources") or {})
    if "notebook" in raw:
        name = raw["notebook"]
        try:
            notebooks.source_path(name)  # PART/NAME under notebooks/ only: never a file elsewhere
            resolved = [rules.resolve_parameters(name, scale=scale, overrides={**base, **p}) for p in points]
        except (notebooks.InputError, FileNotFoundError) as err:
            raise SweepError(f"sweep spec {path}: {err}") from err
        spec = SweepSpec(path, name, None, scale, resolved, resources)
    else:
        fn = _load_function(raw["function"])
        accepted = sweep_parameters(fn)
        specs = function_specs(fn)
        resolved = []
        for p in points:
            full = {**base, **p}
            bad = [k for k in full if k not in accepted]
            if bad:
                raise SweepError(f"sweep spec {path}: {raw['function']} takes no parameter {bad[0]!r}; "
                                 f"it takes {sorted(accepted)}")
            missing = [k for k, a in accepted.items() if a.default is inspect.Parameter.empty
                       and a.kind in (a.KEYWORD_ONLY, a.POSITIONAL_OR_KEYWORD) and full.get(k) is None]
            if missing:
                raise SweepError(f"sweep spec {path}: {raw['function']} needs {missing[0]!r} (no default)")
            try:
                full = {k: (specs[k].check(v) if k in specs and not is_checkpoint(k) else v) for k, v in full.items()}
            except rules.ParameterError as err:
                raise SweepError(f"sweep spec {path}: {err}") from None
            check_point_memory(raw["function"], full, f"sweep spec {path}")
            resolved.append(full)
        spec = SweepSpec(path, None, raw["function"], scale, resolved, resources)
    spec.ensemble = raw.get("ensemble", False)
    if spec.ensemble not in (True, False):
        raise SweepError(f"sweep spec {path}: ensemble must be true or false, got {spec.ensemble!r}")
    if spec.ensemble and spec.function not in ENSEMBLE_FUNCTIONS:
        raise SweepError(f"sweep spec {path}: ensemble: true works with function {sorted(ENSEMBLE_FUNCTIONS)}, "
                         f"not {spec.target!r}")
    spec.points = _own_checkpoints(spec)
    spec.code = code_key(spec.target)
    spec.paths = runs.path_parameters(spec.target)
    hashes = [runs.run_hash(spec.target, p, code=spec.code, paths=spec.paths) for p in spec.points]
    if len(set(hashes)) != len(hashes):
        raise SweepError(f"sweep spec {path}: two points have the same parameters")
    if not output and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*", path.stem):
        raise SweepError(f"sweep spec {path}: its name {path.stem!r} cannot name the default output folder "
                         f"runs/sweeps/<spec name>; rename the file (letters, digits, _ . + -) or give --output")
    spec.output = Path(output) if output else runs.RUNS / "sweeps" / path.stem
    check_sweep_output(spec.output)
    return spec


def is_sweep_folder(folder: Path) -> bool:
    """Whether `folder` holds the record a sweep writes first (`runs.SWEEP_RECORD`)."""
    try:
        record = json.loads((Path(folder) / runs.SWEEP_RECORD).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and "target" in record


def check_sweep_output(folder: Path) -> None:
    """Refuse a sweep output that is or lies inside a run folder (its manifest would break and the
    next `lowrank run` would replace the folder, the sweep's results with it), or an existing folder
    with files that no sweep wrote (start-up cleanup and the run folders would mix with them)."""
    try:
        runs.check_output_folder(folder, "sweep output")
    except runs.RunFolderError as err:
        raise SweepError(str(err)) from None
    inside = runs.enclosing_run_folder(folder)
    if inside is not None:
        raise SweepError(f"sweep output {folder} is inside the run folder {inside}; give a folder of its own")
    if folder.is_dir() and any(folder.iterdir()) and not is_sweep_folder(folder):
        raise SweepError(f"sweep output {folder} holds files that no sweep wrote (no {runs.SWEEP_RECORD}); "
                         f"give a new or empty folder")


def point_memory_bytes(function: str, point: dict) -> float | None:
    """A rough upper bound on the bytes one run of a sweep function needs (None where the function
    states none): for `train_point`, float32 weights with their gradient, momentum and a copy (16 bytes
    a parameter, `rules.network_parameters`), the activations of one batch (`rules.network_activations`)
    and the data set (`rules.dataset_bytes`), for the point's model, batch size and ViT/CNN sizes."""
    if function != "lowrank.core.train:train_point":
        return None
    sizes = {k: point[k] for k in ("cnn_width", "vit_dim", "vit_depth") if point.get(k) is not None}
    model, batch = point.get("model"), point.get("batch_size") or 1
    return (16.0 * rules.network_parameters(model, **sizes) + 4.0 * rules.network_activations(model, batch, **sizes)
            + rules.dataset_bytes(point.get("dataset")))


def check_point_memory(function: str, point: dict, where: str) -> None:
    """Refuse, before any run starts (`--dry-run` included), a sweep point whose `point_memory_bytes`
    exceeds `rules.memory_limit()`, naming the estimate."""
    limit = rules.memory_limit()
    try:
        need = point_memory_bytes(function, point)
    except (ValueError, TypeError, OverflowError) as err:
        raise SweepError(f"{where}: the memory estimate cannot be evaluated for model {point.get('model')!r} "
                         f"({type(err).__name__}: {err})") from None
    if need is not None and not need <= limit:
        raise SweepError(f"{where}: the point model={point.get('model')!r} batch_size={point.get('batch_size')!r} "
                         f"needs about {need / 2**30:.3g} GiB by the estimate of {function.rsplit(':', 1)[-1]} "
                         f"(16 bytes a weight + a batch's activations + the data set), more than the "
                         f"{limit / 2**30:.3g} GiB allowed here (set LOWRANK_MEMORY_LIMIT to change it)")


def config_class(fn):
    """The dataclass a sweep function takes as its one argument (e.g. `train_point(config: PointConfig)`),
    or None for a function of plain keyword arguments."""
    import dataclasses
    import typing

    params = list(inspect.signature(fn).parameters.values())
    if len(params) != 1:
        return None
    try:
        kind = typing.get_type_hints(fn).get(params[0].name)
    except Exception:
        return None
    return kind if isinstance(kind, type) and dataclasses.is_dataclass(kind) else None


def sweep_parameters(fn) -> Mapping[str, inspect.Parameter]:
    """The parameters a sweep spec gives a function: its keyword arguments, or the fields of the
    config dataclass it takes (`config_class`), with their defaults."""
    cls = config_class(fn)
    return inspect.signature(cls if cls is not None else fn).parameters


def call_with_parameters(fn, params: dict):
    """`fn(**params)`, or `fn(Config(**params))` for a function that takes a config dataclass."""
    cls = config_class(fn)
    return fn(cls(**params)) if cls is not None else fn(**params)


def function_specs(fn) -> dict[str, rules.ParameterSpec]:
    """`lowrank.book.rules.ParameterSpec` of each argument of a sweep function: the type from its
    annotation (int, float, str, bool, list[X], Optional[X]) or its default, the JSON Schema keywords
    from its module's `PARAMETER_RULES[function name]` (as a notebook's declarations state them)."""
    import typing

    try:
        hints = typing.get_type_hints(config_class(fn) or fn)
    except Exception:  # unresolvable annotations: the defaults and keywords alone
        hints = {}
    stated = (getattr(importlib.import_module(fn.__module__), "PARAMETER_RULES", {}) or {}).get(fn.__name__, {})
    specs = {}
    for name, param in sweep_parameters(fn).items():
        default = None if param.default is inspect.Parameter.empty else param.default
        if isinstance(default, tuple):
            default = list(default)
        schema = rules.type_schema(hints.get(name)) if name in hints else None
        if schema is None and default is None:
            continue  # nothing known of its type: the function's own business
        specs[name] = rules.declare(name, default, schema=schema, keywords=stated.get(name, {}),
                                    where=f"{fn.__module__}:{fn.__name__} argument {name}",
                                    check_default=param.default is not inspect.Parameter.empty)
    return specs


def _check_resources(path: Path, resources) -> dict:
    """`resources: {num_cpus: N >= 1, num_gpus: G >= 0}` (num_cpus also sets each run's threads)."""
    if not isinstance(resources, dict) or set(resources) - {"num_cpus", "num_gpus"}:
        raise SweepError(f"sweep spec {path}: resources takes num_cpus and num_gpus only")
    cpus = resources.get("num_cpus", 1)
    if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1:
        raise SweepError(f"sweep spec {path}: resources.num_cpus must be a positive integer (CPU threads per run), "
                         f"got {cpus!r}")
    gpus = resources.get("num_gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or not 0 <= gpus < float("inf"):
        raise SweepError(f"sweep spec {path}: resources.num_gpus must be a number >= 0, got {gpus!r}")
    return resources


is_checkpoint = runs.is_output_path  # a checkpoint parameter: a file the run writes


def _own_checkpoints(spec: SweepSpec) -> list[dict]:
    """Every point (every ensemble, with `ensemble: true`) gets its own checkpoint file: a path the
    spec gives to several of them gets `.<hash of the point's other parameters>` before its suffix.
    Each path must lie in an existing folder and not be a folder itself; relative paths are made
    absolute (a Ray worker's working folder is not this one's)."""
    points = [dict(p) for p in spec.points]
    keys = sorted({k for p in points for k, v in p.items() if is_checkpoint(k) and v})
    if not keys:
        return points
    from lowrank.core import checkpoint as checkpointing  # torch: imported only when a point has a checkpoint
    ensemble_keys = ()
    if spec.ensemble:
        ensemble_keys = importlib.import_module(ENSEMBLE_FUNCTIONS[spec.function].partition(":")[0]).ENSEMBLE_KEYS
    for key in keys:
        owners: dict = {}
        for p in points:
            if p.get(key):
                owner = json.dumps({k: v for k, v in p.items() if k not in ensemble_keys and not is_checkpoint(k)},
                                   sort_keys=True)
                owners.setdefault(str(p[key]), set()).add(owner)
        for p in points:
            value = p.get(key)
            if not value:
                continue
            if not isinstance(value, str):
                raise SweepError(f"sweep spec {spec.path}: {key} must be a file path, got {value!r}")
            try:
                ckpt = user_path(value, key).absolute()
            except ValueError as err:
                raise SweepError(f"sweep spec {spec.path}: {err}") from None
            try:  # a folder, a device, a FIFO or a file that is no checkpoint: refused before any run, not in the worker
                checkpointing.check_checkpoint_path(ckpt, content=True)
            except ValueError as err:
                raise SweepError(f"sweep spec {spec.path}: {key}: {err}") from None
            inside = runs.enclosing_run_folder(ckpt.parent)
            if inside is not None:  # it would break the run's manifest, and the next run replace the folder
                raise SweepError(f"sweep spec {spec.path}: {key} {value} is inside the run folder {inside}; "
                                 f"keep checkpoints elsewhere")
            if len(owners[str(value)]) > 1:
                owner = json.dumps({k: v for k, v in p.items() if k not in ensemble_keys and not is_checkpoint(k)},
                                   sort_keys=True)
                tag = io.digest(owner)
                ckpt = ckpt.with_name(f"{ckpt.stem}.{tag}{ckpt.suffix}")
            p[key] = str(ckpt)
    return points


def execute_point(target_kind: str, target: str, params, folder, threads: int = 1):
    """Run one point into `folder` (atomically); returns the folder. Runs inside a worker. With
    `target_kind` "ensemble", `params` and `folder` are lists: the points train as one ensemble and
    each lands in its own folder.

    Every run uses `threads` CPU threads whatever the executor (Ray would otherwise give 1, a local
    process all cores), so that both executors give bit-identical results."""
    from lowrank.core.device import reproducible

    reproducible(cpu_threads=threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # inherited by a notebook's kernel
    started, load, t0 = io.now(), io.machine_load(), time.time()
    if target_kind == "ensemble":
        results = _load_function(ENSEMBLE_FUNCTIONS[target], check=False)(params)
        timing = (started, load, time.time() - t0)
        return [_write_result(Path(f), target, p, r, timing) for p, f, r in zip(params, folder, results)]
    folder = Path(folder)
    if folder.is_dir():
        return str(folder)
    if target_kind == "notebook":
        made, _ = runs.run(target, params, runs_root=folder.parent / ".nb")
        io.replace_folder(made, folder)  # same file system: atomic
        return str(folder)
    result = call_with_parameters(_load_function(target, check=False), params)  # checked when the spec was read
    return _write_result(folder, target, params, result, (started, load, time.time() - t0))


def _write_result(folder: Path, target: str, params: dict, result, timing: tuple) -> str:
    """A function's result, parameters and provenance (`timing`: start, machine load at start, wall
    seconds) into `folder`, atomically."""
    tmp = io.make_work_folder(runs.work_name(folder))
    status = {}
    try:
        if hasattr(result, "to_csv"):
            if "diverged" in getattr(result, "attrs", {}):  # a training table: its outcome in its rows
                from lowrank.core.train import with_status

                result = with_status(result)
                status = {str(r): s for r, s in result.groupby("run")["status"].first().items() if s != "ok"}
            result.to_csv(tmp / "results.csv", index=False)
        else:
            (tmp / "results.json").write_text(json.dumps(result, indent=2, sort_keys=True, default=float))
        (tmp / "parameters.json").write_text(json.dumps(params, indent=2, sort_keys=True))
        provenance = io.provenance(*timing, function=target, parameters=params, hash=folder.name, status=status)
        (tmp / "provenance.json").write_text(json.dumps(provenance, indent=2, sort_keys=True))
        runs.write_manifest(tmp)
        io.replace_folder(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(folder)


def _ensemble_groups(spec: SweepSpec, points: list[dict]) -> list[list[dict]]:
    """Points that differ only in the ensemble keys, grouped in first-seen order."""
    keys = importlib.import_module(ENSEMBLE_FUNCTIONS[spec.function].partition(":")[0]).ENSEMBLE_KEYS
    groups: dict = {}
    for p in points:
        shared = json.dumps({k: v for k, v in p.items() if k not in keys}, sort_keys=True)
        groups.setdefault(shared, []).append(p)
    return list(groups.values())


def _point_process(task, error_file):
    """Body of a local worker process: run one point, leave a traceback file if it fails."""
    try:
        execute_point(*task)
    except BaseException:
        Path(error_file).write_text(traceback.format_exc())
        raise SystemExit(1)


def _run_local(tasks, jobs, on_start, on_done):
    """One process per run (at most `jobs` at once): a run that crashes or is killed takes no
    other run with it, unlike a shared process pool."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    queue, running = list(tasks), {}
    while queue or running:
        while queue and len(running) < jobs:
            t = queue.pop(0)
            first = Path(t[3][0] if isinstance(t[3], list) else t[3])
            err_file = first.parent / f".{first.name}.error"
            err_file.unlink(missing_ok=True)
            proc = ctx.Process(target=_point_process, args=(t, str(err_file)), daemon=False)
            proc.start()
            running[proc] = (t, err_file)
            on_start(t)
        for proc in [p for p in running if not p.is_alive()]:
            t, err_file = running.pop(proc)
            proc.join()
            if proc.exitcode == 0:
                on_done(t, None)
            else:
                why = err_file.read_text().strip() if err_file.is_file() else f"worker exited with code {proc.exitcode}"
                err_file.unlink(missing_ok=True)
                on_done(t, why)
        time.sleep(0.05)


def check_address(address: str | None, tries: int = 3, timeout: float = 5.0, wait: float = 1.0) -> None:
    """Refuse a Ray `--address` that is malformed or not reachable: `tries` TCP connections of at
    most `timeout` seconds each (Ray's own client would retry for ever). "auto" is left to Ray."""
    import socket

    if address is None or address == "auto":
        return
    host_port = address.split("://", 1)[1] if "://" in address else address
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SweepError(f"--address {address!r} must be HOST:PORT (or ray://HOST:PORT, or auto)")
    last = None
    for i in range(tries):
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
            return
        except OSError as err:
            last = err
            if i + 1 < tries:
                time.sleep(wait)
    raise SweepError(f"cannot reach the Ray cluster at {address} ({tries} tries, {timeout:g} s each: {last}); "
                     f"is `ray start --head` running there?")


def check_cluster_resources(resources: dict, available: dict) -> None:
    """Refuse runs that ask more of one node than the Ray cluster has (`available`:
    `ray.cluster_resources()`): Ray would queue them for ever, without a word."""
    need = {"CPU": resources.get("num_cpus", 1), "GPU": resources.get("num_gpus", 0)}
    words = {"CPU": "num_cpus", "GPU": "num_gpus"}
    for key, n in need.items():
        have = float(available.get(key, 0))
        if n > have:
            raise SweepError(f"each run asks resources.{words[key]}: {n}, but the Ray cluster has {have:g} {key}(s) "
                             f"in all: no run could ever start; lower it or use a larger cluster")


def _cluster_resources(ray, timeout: float) -> dict:
    """`ray.cluster_resources()`, or SweepError after `timeout` seconds."""
    from concurrent.futures import ThreadPoolExecutor, TimeoutError as Timeout

    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(ray.cluster_resources).result(timeout=timeout)
    except Timeout:
        raise SweepError(f"the Ray cluster did not report its resources within {timeout:g} s") from None
    finally:
        pool.shutdown(wait=False)


RAY_TIMEOUT = 60.0


def _start_ray(resources, address) -> bool:
    """Connect to (or start) Ray and check that its cluster can run a task asking `resources`;
    whether Ray was started here (and is to be shut down by `_run_ray`)."""
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        check_cluster_resources(resources, _cluster_resources(ray, RAY_TIMEOUT))
    except BaseException:
        if started_here:
            ray.shutdown()
        raise
    return started_here


def _run_ray(tasks, resources, started_here, on_start, on_done):
    import ray

    remote = ray.remote(max_retries=0, num_cpus=resources.get("num_cpus", 1),
                        num_gpus=resources.get("num_gpus", 0))(execute_point)
    try:
        refs = {}
        for t in tasks:
            refs[remote.remote(*t)] = t
            on_start(t)
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                t = refs.pop(ref)
                try:
                    ray.get(ref)
                    on_done(t, None)
                except Exception as err:  # a crashed worker or a failing run: report it, go on
                    on_done(t, f"{type(err).__name__}: {err}")
    finally:
        if started_here:
            ray.shutdown()


def check_jobs(jobs, threads: int = 1) -> int:
    """The number of local runs at once: a positive integer, or None for the CPU count divided by
    each run's threads (at least 1)."""
    if jobs is None:
        return max(1, (os.cpu_count() or 1) // max(1, threads))
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise SweepError(f"--jobs must be a positive number of runs at once, got {jobs!r} "
                         f"(leave it out for as many as the CPU cores allow at {threads} thread(s) per run)")
    return jobs


def run_sweep(spec: SweepSpec, executor: str = "local", *, address: str | None = None, jobs: int | None = None,
              progress: bool = True) -> dict:
    """Run every missing point of `spec`. Returns {"done": [...], "skipped": [...], "failed": {folder: error}}."""
    from tqdm.auto import tqdm

    if executor not in EXECUTORS:
        raise SweepError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    threads = int(spec.resources.get("num_cpus", 1))
    jobs = check_jobs(jobs, threads)
    if executor == "ray":
        check_address(address)
    if address and executor != "ray":
        raise SweepError("--address is for --executor ray")
    check_sweep_output(spec.output)  # again: the folder may have changed since the spec was read
    spec.output.mkdir(parents=True, exist_ok=True)
    kind = "notebook" if spec.notebook else "function"
    folders = [spec.run_folder(p) for p in spec.points]
    record = json.dumps({"spec": str(spec.path), "target": spec.target, "runs": [str(f) for f in folders]}, indent=2)
    io.write_atomically(spec.output / runs.SWEEP_RECORD, record)  # first: the folder is a sweep's
    for where in (spec.output, spec.output / ".nb" / str(spec.notebook)):
        runs.clean_debris(where)
    stale = [f for f in folders if (f.is_dir() or f.is_symlink()) and runs.manifest_problems(f)]
    for f in stale:  # before any is removed: a folder holding a user's file stops the sweep, nothing deleted
        runs.check_discardable(f)
    for f in stale:  # a finished folder that changed since: its result is not trusted
        print(f"lowrank: {f} does not match its manifest ({'; '.join(runs.manifest_problems(f)[:3])}): running it "
              f"again", file=sys.stderr)
        runs.discard_run_folder(f)
    skipped = [str(f) for f in folders if f.is_dir()]
    missing = [p for p, f in zip(spec.points, folders) if not f.is_dir()]
    if spec.ensemble:  # restarted, only the members still missing train
        tasks = [("ensemble", spec.target, group, [str(spec.run_folder(p)) for p in group], threads)
                 for group in _ensemble_groups(spec, missing)]
    else:
        tasks = [(kind, spec.target, p, str(spec.run_folder(p)), threads) for p in missing]
    started_ray = _start_ray(spec.resources, address) if tasks and executor == "ray" else False
    state = {"running": 0, "done": [], "failed": {}}
    bar = tqdm(total=len(folders), initial=len(skipped), desc=f"sweep {spec.path.stem}", unit="run",
               disable=not progress)

    def show():
        bar.set_postfix(done=len(skipped) + len(state["done"]), running=state["running"], failed=len(state["failed"]))

    def on_start(t):
        state["running"] += 1
        show()

    def on_done(t, error):
        state["running"] -= 1
        task_folders = t[3] if isinstance(t[3], list) else [t[3]]
        for f in task_folders:
            if error is None:
                state["done"].append(f)
            else:
                state["failed"][f] = error
        bar.update(len(task_folders))
        show()

    if tasks:
        if executor == "local":
            _run_local(tasks, jobs, on_start, on_done)
        else:
            _run_ray(tasks, spec.resources, started_ray, on_start, on_done)
    bar.close()
    return {"done": state["done"], "skipped": skipped, "failed": state["failed"],
            "unusual": {f: s for f in state["done"] + skipped if (s := run_status(Path(f)))}}


def run_status(folder: Path) -> str:
    """"diverged" / "collapsed" (with the epoch) when a finished function run's provenance says so,
    else "" (`lowrank.core.train.with_status`)."""
    try:
        status = json.loads((Path(folder) / "provenance.json").read_text()).get("status") or {}
    except (OSError, ValueError, AttributeError):
        return ""
    return "; ".join(sorted(set(status.values())))


def collect(spec: SweepSpec):
    """One tidy table of every finished run: its parameters as columns, then its results
    (a function's rows, or a notebook's verdicts: one row per verdict)."""
    import pandas as pd

    # a function's defaults as columns as well: a reader (`lowrank.sgd.ranks.check_table`) sees every
    # setting the runs used, not only those the spec named
    defaults = {}
    if spec.function:
        defaults = {k: (list(p.default) if isinstance(p.default, tuple) else p.default)
                    for k, p in sweep_parameters(_load_function(spec.function)).items()
                    if p.default is not inspect.Parameter.empty}
    frames = []
    for params in spec.points:
        folder = spec.run_folder(params)
        if not folder.is_dir():
            continue
        params = {**defaults, **params}
        problems = runs.manifest_problems(folder)
        if problems:
            raise SweepError(f"{folder} does not match its manifest ({'; '.join(problems[:3])}): run the sweep "
                             f"again to redo it")
        flat = {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in params.items()}
        if (folder / "results.csv").is_file():
            df = pd.read_csv(folder / "results.csv")
        elif (folder / "results.json").is_file():
            df = pd.json_normalize(json.loads((folder / "results.json").read_text()))
        else:
            verdicts = json.loads((folder / "verdicts.json").read_text())
            df = pd.DataFrame([{"verdict": k, "measured": v["measured"], "outcome": v["outcome"]}
                               for k, v in verdicts.items()])
        for k, v in reversed(list(flat.items())):
            if k not in df.columns:
                df.insert(0, k, v)
        df = df.drop(columns=["run"], errors="ignore")  # a run's own index means nothing across runs
        df.insert(0, "run", folder.name)
        frames.append(df)
    if not frames:
        raise SweepError(f"no finished runs of {spec.path} under {spec.output}")
    table = pd.concat(frames, ignore_index=True)
    out = io.check_replaceable(spec.output / "collected.csv", "collected table",  # never over a file it did not write
                               ours=io.written_by_lowrank)
    io.write_atomically(out, table.to_csv(index=False), record=True)  # 0644, no temporary left
    return table


def plan(spec: SweepSpec, timings=None) -> dict:
    """What `run_sweep` would do, running nothing: the number of runs, the grid (every parameter that
    varies, with its values), the output folder, how many runs are already finished, and the cost
    estimated from measured seconds per epoch (`lowrank.book.costs.sweep_seconds`; `timings`: a CSV as
    bench/epoch_seconds.csv, by default that file). `estimated_seconds` is None (printed "unknown")
    when a point has no measurement for its (model, dataset, batch_size): it is listed, never guessed."""
    from lowrank.book import costs

    keys = sorted({k for p in spec.points for k in p})
    grid = {k: [json.loads(v) for v in {json.dumps(p.get(k)) for p in spec.points}] for k in keys}
    grid = {k: sorted(vals, key=lambda v: (not isinstance(v, (int, float)), v if isinstance(v, (int, float)) else str(v)))
            for k, vals in grid.items() if len(vals) > 1}
    seconds, unmeasured, where = costs.sweep_seconds(spec.points, timings=costs.read_timings(timings))
    finished = sum(spec.run_folder(p).is_dir() for p in spec.points)
    return {"runs": len(spec.points), "grid": grid, "output": str(spec.output), "finished": finished,
            "estimated_seconds": seconds, "measured_on": sorted(where), "unmeasured": sorted(set(map(str, unmeasured))),
            "ensemble": spec.ensemble}


# Pages with claims about convolutional and transformer networks on CIFAR-10: no laptop size reaches their
# regime within the page budget (`lowrank.book.costs.PAGE_BUDGET_S`; one epoch of the smallest is longer), so
# those claims read "needs a larger scale" with the training cost of the paper's sweeps that decide them (a
# page's MLP claims may still be laptop-sized: sgd/architectures, `lowrank.book.laptop`).
PAGE_SWEEPS = {
    "sgd/architectures": ("sweeps/sgd_architectures_paper.yaml",),
    "sgd/generalization": ("sweeps/sgd_fig_gen_1_paper.yaml", "sweeps/sgd_fig_gen_2_paper.yaml"),
}


def larger_scale_cost(name: str, timings: dict | None = None) -> dict | None:
    """The training cost of the paper sweeps behind a page of `PAGE_SWEEPS` (None for other pages):
    `cpu_seconds` and `gpu_seconds` (`lowrank.book.costs.sweep_seconds`, points one by one, None when a
    point is not measured), `unmeasured` (CPU), `specs`, `smallest_epoch_s` (the shortest measured CPU
    epoch of any point: more than `PAGE_BUDGET_S` says no laptop run of these networks fits), and `text`
    (`larger_scale_text`)."""
    from lowrank.book import costs

    if name not in PAGE_SWEEPS:
        return None
    timings = costs.read_timings() if timings is None else timings
    points = [p for spec in PAGE_SWEEPS[name] for p in load_spec(notebooks.REPO_ROOT / spec).points]
    cpu, unmeasured, _ = costs.sweep_seconds(points, "cpu", timings)
    gpu, _, _ = costs.sweep_seconds(points, "cuda", timings)
    epochs = [costs.epoch_seconds(p["model"], p["dataset"], p["batch_size"], 1, "cpu", timings) for p in points]
    measured = [e for e in epochs if e is not None]
    cost = {"cpu_seconds": cpu, "gpu_seconds": gpu, "unmeasured": unmeasured, "specs": list(PAGE_SWEEPS[name]),
            "smallest_epoch_s": min(measured) if measured else None}
    hours = lambda s: "unknown" if s is None else f"{s / 3600:,.0f}"  # noqa: E731
    smallest = "" if cost["smallest_epoch_s"] is None else \
        (f"; its shortest measured CPU epoch takes {cost['smallest_epoch_s']:.0f} s, against a page budget of "
         f"{costs.PAGE_BUDGET_S:.0f} s")
    cost["text"] = (f"needs a larger scale: the paper's sweeps ({', '.join(cost['specs'])}) train for "
                    f"{hours(cpu)} CPU-hours (one thread) and {hours(gpu)} GPU-hours, from the epoch times measured "
                    f"in bench/epoch_seconds.csv{smallest}")
    return cost


def larger_scale_text(name: str, timings: dict | None = None) -> str:
    """"needs a larger scale: ..." with the cost of `larger_scale_cost`, in CPU-hours and GPU-hours ("" for a page
    outside `PAGE_SWEEPS`)."""
    cost = larger_scale_cost(name, timings)
    return "" if cost is None else cost["text"]


def larger_scale_costs(names, timings: dict | None = None) -> dict:
    """`{page: larger_scale_cost(page)}` for each of `names` (a book's pages) in `PAGE_SWEEPS`: what the ledger shows
    beside their laptop cells."""
    return {name: larger_scale_cost(name, timings) for name in names if name in PAGE_SWEEPS}
