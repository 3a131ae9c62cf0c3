"""Rerunning a notebook with new parameters: validation, run folders, provenance, reports.

A run folder `runs/<part>/<name>/<hash>/` holds the executed notebook, its figures (PNG, SVG and
the data as CSV), the glued verdicts (`verdicts.json`), the parameters (`parameters.json`) and a
provenance file. It is written under a temporary name and renamed at the end, so a folder with
the final name is always complete; the same notebook with the same parameters reuses it.

Parameter specs come from the notebook's parameter cell: the type is the default's type, and a
comment may end with a YAML mapping stating the allowed values, e.g.

    mu = "sample"  # how mu is computed {choices: [sample, quadrature]}
    n = 375  # samples {min: 2}
    activations = ["tanh"]  # {items: [tanh, relu, elu]}
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

import yaml

from lowrank.book import notebooks

__all__ = ["ParameterSpec", "ParameterError", "parameter_specs", "resolve_parameters", "run_hash", "run", "RUNS"]

RUNS = notebooks.REPO_ROOT / "runs"


class ParameterError(ValueError):
    """A parameter a user gave is unknown or not allowed; raised before anything runs."""


@dataclass
class ParameterSpec:
    name: str
    default: object
    comment: str = ""
    choices: list | None = None
    items: list | None = None  # allowed elements of a list parameter
    min: float | None = None
    max: float | None = None

    def describe(self) -> str:
        kind = type(self.default).__name__
        parts = [kind]
        if self.choices is not None:
            parts.append(f"one of {self.choices}")
        if self.items is not None:
            parts.append(f"elements from {self.items}")
        if self.min is not None:
            parts.append(f">= {self.min}")
        if self.max is not None:
            parts.append(f"<= {self.max}")
        return ", ".join(parts)

    def check(self, value):
        """Return `value` (ints accepted for floats) or raise ParameterError saying what is allowed."""
        d = self.default
        bad = lambda why: ParameterError(f"parameter {self.name!r}: {why}; allowed: {self.describe()}")  # noqa: E731
        if isinstance(d, bool):
            if not isinstance(value, bool):
                raise bad(f"{value!r} is not a bool")
        elif isinstance(d, int):
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(f"{value!r} is not an int")
        elif isinstance(d, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad(f"{value!r} is not a number")
            value = float(value)
        elif isinstance(d, str):
            if not isinstance(value, str):
                raise bad(f"{value!r} is not a string")
        elif isinstance(d, list):
            if not isinstance(value, list) or not value:
                raise bad(f"{value!r} is not a non-empty list")
            kinds = {type(x) for x in d}
            for x in value:
                numeric = kinds <= {int, float} and isinstance(x, (int, float)) and not isinstance(x, bool)
                if kinds and type(x) not in kinds and not numeric:
                    raise bad(f"element {x!r} has the wrong type")
                if self.items is not None and x not in self.items:
                    raise bad(f"element {x!r} is not allowed")
        elif d is not None and not isinstance(value, type(d)):
            raise bad(f"{value!r} has the wrong type")
        if self.choices is not None and value not in self.choices:
            raise bad(f"{value!r} is not allowed")
        for x in value if isinstance(value, list) else [value]:
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                if self.min is not None and x < self.min:
                    raise bad(f"{x!r} is below the minimum")
                if self.max is not None and x > self.max:
                    raise bad(f"{x!r} is above the maximum")
        return value


def _comments(source: str) -> dict[int, str]:
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string[1:].strip()
    return out


def parameter_specs(name: str) -> dict[str, ParameterSpec]:
    """The notebook's parameters with their defaults and allowed values."""
    import ast

    nb = notebooks.read_notebook(name)
    defaults = notebooks.parameter_defaults(nb)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    comments = _comments(cell.source)
    specs = {}
    for node in ast.parse(cell.source).body:
        pname = node.targets[0].id
        comment = comments.get(node.lineno, "")
        rules = {}
        if comment.endswith("}") and "{" in comment:
            text = comment[comment.rindex("{"):]
            try:
                rules = yaml.safe_load(text) or {}
            except yaml.YAMLError as err:
                raise ValueError(f"{name}: parameter {pname}: unreadable rule {text!r}: {err}") from err
            comment = comment[: comment.rindex("{")].strip()
        unknown = set(rules) - {"choices", "items", "min", "max"}
        if unknown:
            raise ValueError(f"{name}: parameter {pname}: unknown rule keys {sorted(unknown)}")
        specs[pname] = ParameterSpec(pname, defaults[pname], comment, **rules)
    return specs


def _load_yaml(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ParameterError(f"parameter file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ParameterError(f"parameter file {path} is not valid YAML: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ParameterError(f"parameter file {path} must hold a mapping name: value, got {type(data).__name__}")
    return data


def resolve_parameters(name: str, *, scale: str = "ci", params_file=None, overrides: dict | None = None) -> dict:
    """The full parameter set of a run: defaults, then the paper YAML (scale="paper"), then a
    user's YAML, then `overrides`. Every given name and value is checked against the parameter cell."""
    if scale not in ("ci", "paper"):
        raise ParameterError(f"scale must be 'ci' or 'paper', got {scale!r}")
    specs = parameter_specs(name)
    given: dict = {}
    if scale == "paper":
        path = notebooks.paper_params_path(name)
        if not path.is_file():
            raise ParameterError(f"{name} has no paper-scale parameter file {path}")
        given.update(_load_yaml(path))
    user = _load_yaml(params_file) if params_file is not None else {}
    user.update(overrides or {})
    if "scale" in user:
        raise ParameterError("'scale' labels the starting point (ci defaults or the paper YAML): set it with --scale")
    given.update(user)
    resolved = {k: s.default for k, s in specs.items()}
    for key, value in given.items():
        if key not in specs:
            close = difflib.get_close_matches(key, list(specs), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; parameters are {sorted(specs)}"
            raise ParameterError(f"{name} has no parameter {key!r}{hint}")
        resolved[key] = specs[key].check(value)
    return resolved


def run_hash(name: str, params: dict) -> str:
    text = json.dumps({"notebook": name, "parameters": params}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _git_state() -> dict:
    def git(*args):
        out = subprocess.run(["git", *args], cwd=notebooks.REPO_ROOT, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else None

    status = git("status", "--porcelain", "--", "lowrank", "notebooks", "params")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("lowrank", "torch", "numpy", "scipy", "papermill", "jupyter-book"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def run_dir(name: str, params: dict) -> Path:
    return RUNS / name / run_hash(name, params)


def run(name: str, params: dict, *, force: bool = False, runs_root: Path | None = None) -> tuple[Path, bool]:
    """Execute `name` with the (already resolved) `params` into its run folder.

    Returns `(folder, reused)`. An existing complete folder is reused unless `force`.
    """
    from lowrank.core.device import describe_device

    root = Path(runs_root) if runs_root is not None else RUNS
    final = root / name / run_hash(name, params)
    if final.is_dir() and not force:
        return final, True
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        started = dt.datetime.now(dt.timezone.utc)
        t0 = time.time()
        values = notebooks.execute(name, tmp / "notebook.ipynb", parameters=params, figure_dir=tmp / "figures")
        from lowrank.book.verdicts import GLUE_PREFIX

        found = {k[len(GLUE_PREFIX):]: v for k, v in values.items() if k.startswith(GLUE_PREFIX)}
        (tmp / "verdicts.json").write_text(json.dumps(found, indent=2, sort_keys=True))
        (tmp / "parameters.json").write_text(json.dumps(params, indent=2, sort_keys=True))
        provenance = {
            "notebook": name,
            "parameters": params,
            "hash": final.name,
            "git": _git_state(),
            "versions": _versions(),
            "device": describe_device(),
            "start": started.isoformat(timespec="seconds"),
            "end": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "wall_s": round(time.time() - t0, 2),
        }
        (tmp / "provenance.json").write_text(json.dumps(provenance, indent=2, sort_keys=True))
        if final.exists():  # forced rerun: swap in the new folder, then drop the old one
            old = final.parent / f".{final.name}.old-{os.getpid()}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, False


def load_run(folder) -> dict:
    """Provenance, parameters and verdicts of a complete run folder."""
    folder = Path(folder)
    if not (folder / "provenance.json").is_file():
        raise FileNotFoundError(f"{folder} is not a complete run folder (no provenance.json)")
    return {
        "folder": folder,
        "provenance": json.loads((folder / "provenance.json").read_text()),
        "verdicts": json.loads((folder / "verdicts.json").read_text()),
        "figures": sorted((folder / "figures").glob("*.png")),
    }
