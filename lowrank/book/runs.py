"""Rerunning a notebook with new parameters: validation, run folders, provenance, reports.

A run folder `runs/<part>/<name>/<hash>/` holds the executed notebook, its figures (PNG, SVG and
the data as CSV), the glued verdicts (`verdicts.json`), the parameters (`parameters.json`), a
provenance file and `manifest.json` (the SHA-256 of every other file). The hash covers the
notebook, its parameters and the code that computes it (the notebook's source and every `lowrank`
file it imports, the book build's key), so an edit to the package never reuses an old result. The
folder is written under a temporary name `.<hash>.partial-HOST-PID` and renamed at the end, so a
folder with the final name is complete; one whose files no longer match its manifest is run again.
Temporary folders of dead processes are removed by the next run.

The parameters themselves (specs read from a notebook's parameter cell, their rules, memory
estimates, YAML values) are `lowrank.book.rules`'s; this module holds the run folders.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from lowrank.book import notebooks
from lowrank.book.goldens import glued_verdicts
from lowrank.book.keys import NotebookCode, code_key, notebook_code
from lowrank.book.rules import parameter_specs
from lowrank.core import io

__all__ = ["RunFolderError", "run_hash", "path_parameters", "input_digests", "run", "execute", "load_run",
           "manifest_problems", "write_manifest", "clean_debris", "check_output_folder", "enclosing_run_folder", "RUNS"]

# a clone's runs/; an installed copy's runs go below the current folder, never into site-packages
RUNS = (notebooks.REPO_ROOT if notebooks.IN_CLONE else Path.cwd()) / "runs"


def is_output_path(name: str) -> bool:
    """Parameters naming a file the run writes (a checkpoint), not one it reads."""
    return name == "checkpoint" or name.endswith("_checkpoint")


FOLDER_LISTING_MAX = 10_000  # files of a folder parameter listed in its digest


def path_parameters(target: str) -> set[str]:
    """The parameters of `target` that name a file or folder it reads: a notebook's declared with
    `format: file` (or `folder`), a function's (`module:callable`) with that format in its module's
    `PARAMETER_RULES`."""
    if ":" in target:
        module, _, attr = target.partition(":")
        try:
            rules = (getattr(importlib.import_module(module), "PARAMETER_RULES", {}) or {}).get(attr, {})
        except ImportError:
            return set()
        return {k for k, r in rules.items() if isinstance(r, dict) and r.get("format") in ("file", "folder")}
    return {k for k, spec in parameter_specs(target).items() if spec.path}


_CONTENT_DIGESTS: dict = {}  # (path, size, mtime, ctime, inode) -> SHA-256, this process's cache


def _content_digest(f: Path, st) -> str:
    """SHA-256 of a regular file's contents, cached by its path, size, modification and change times and
    inode: a file restored to its old size and mtime (`touch -r`) still has a new ctime, so it is read again."""
    key = (str(f), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if key not in _CONTENT_DIGESTS:
        _CONTENT_DIGESTS[key] = io.file_digest(f)
    return _CONTENT_DIGESTS[key]


def _folder_digest(path: Path) -> str:
    """The names and contents (SHA-256, `_content_digest`) of a folder's regular files (at most
    `FOLDER_LISTING_MAX`); other entries (a FIFO, a device) by name and kind only, never read."""
    import stat as stat_

    listing = []
    for i, f in enumerate(sorted(path.rglob("*"))):
        if i >= FOLDER_LISTING_MAX:
            break
        st = f.stat()
        name = f.relative_to(path).as_posix()
        if stat_.S_ISREG(st.st_mode):
            listing.append(f"{name}\0{st.st_size}\0{_content_digest(f, st)}\n")
        elif not stat_.S_ISDIR(st.st_mode):
            listing.append(f"{name}\0mode {stat_.S_IFMT(st.st_mode)}\n")
    return io.digest(*listing)


# parameters naming the data folder (`lowrank.core.datasets.resolve_root`: `data` means $LOWRANK_DATA
# when set): the folder the run reads, found as the run finds it, keys the run by its files
DATA_FOLDER_PARAMETERS = ("data_root",)


def input_digests(params: dict, paths) -> dict:
    """`{parameter: digest}` of the files and folders the parameters `paths` name (see
    `path_parameters`) and of the data folder (`DATA_FOLDER_PARAMETERS`, resolved as the data sets'
    loaders resolve it): SHA-256 of a file's contents; of a folder, the names and SHA-256 of its files
    (`_folder_digest`). Checkpoints (`is_output_path`) are outputs and left out.
    Part of the run key: an edited input file, another data folder or a changed image file is a new run."""
    from lowrank.core.validation import user_path

    out = {}

    def visit(key, value):
        if isinstance(value, dict):
            for k, v in value.items():
                visit(f"{key}.{k}", v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                visit(f"{key}[{i}]", v)
        elif isinstance(value, str) and value and len(value) < 4096 and "\0" not in value:
            path = user_path(value, f"parameter {key!r}:")
            try:
                if path.is_file():
                    out[key] = io.file_digest(path)
                elif path.is_dir():
                    out[key] = _folder_digest(path)
            except OSError as err:
                raise RunFolderError(f"parameter {key!r}: {value} cannot be read ({err.strerror})") from None

    for key, value in params.items():
        if key in DATA_FOLDER_PARAMETERS and isinstance(value, str) and "\0" not in value:
            from lowrank.core.datasets import resolve_root

            user_path(value, f"parameter {key!r}:")  # `~nouser`: one line, before the loader's traceback
            folder = resolve_root(value or None)
            try:
                if folder.is_dir():
                    out[key] = _folder_digest(folder)
            except OSError as err:
                raise RunFolderError(f"parameter {key!r}: the data folder {folder} cannot be read "
                                     f"({err.strerror})") from None
        elif key in paths and not is_output_path(key):
            visit(key, value)
    return out


def run_hash(name: str, params: dict, code: str, paths=None) -> str:
    """The run folder's name: a hash of the notebook (or function) `name`, its parameters, the contents
    of every file a parameter names (`input_digests`; `paths`, default `path_parameters(name)`) and
    `code`, the key of the code that computes it (`lowrank.book.keys.code_key`, which every caller
    holds already), so that neither an edit to `lowrank/` nor one to an input file ever reuses an old result."""
    payload = {"notebook": name, "parameters": params, "code": code}
    inputs = input_digests(params, path_parameters(name) if paths is None else paths)
    if inputs:
        payload["inputs"] = inputs
    text = json.dumps(payload, sort_keys=True)
    return io.digest(text)


class RunFolderError(notebooks.InputError):
    """A run folder that is not complete, or whose files changed since the run wrote them."""


MANIFEST = "manifest.json"
UNLISTED = (MANIFEST, io.WORK_MARKER)  # the manifest itself, and a work folder's marker (removed when it is finished)


def write_manifest(folder: Path) -> None:
    """`manifest.json`: the digest (`lowrank.core.io.file_digest`) of every file of `folder` (paths relative to it)."""
    files = {p.relative_to(folder).as_posix(): io.file_digest(p) for p in sorted(folder.rglob("*"))
             if p.is_file() and p.relative_to(folder).as_posix() not in UNLISTED}
    (folder / MANIFEST).write_text(json.dumps(files, indent=1, sort_keys=True))


# what every run folder holds, whatever its manifest says (what `load_run`, `report` and `collect`
# read): a notebook's run its verdicts, a function's its results (one of the two files)
REQUIRED = {"notebook": ("verdicts.json", "provenance.json"), "function": ("provenance.json",)}
FUNCTION_RESULTS = ("results.csv", "results.json")


def required_problems(folder: Path, listed: dict) -> list[str]:
    """Required files (`REQUIRED`) that `folder`'s manifest does not list."""
    odd = io.irregular_kind(folder / "provenance.json")
    if odd:  # a FIFO, a device, a link: never opened
        return [f"provenance.json is {odd}, not a regular file"]
    try:
        provenance = json.loads(io.read_regular_text(folder / "provenance.json"))
    except (OSError, ValueError):
        return ["provenance.json missing or unreadable (required)"]
    if not isinstance(provenance, dict):
        return [f"provenance.json holds a {type(provenance).__name__}, not a mapping (required)"]
    kind = "function" if isinstance(provenance, dict) and "function" in provenance else "notebook"
    problems = [f"{f} missing (required)" for f in REQUIRED[kind] if f not in listed]
    if kind == "function" and not any(f in listed for f in FUNCTION_RESULTS):
        problems.append(f"{' or '.join(FUNCTION_RESULTS)} missing (required)")
    return problems


def manifest_problems(folder: Path) -> list[str]:
    """What differs between `folder` and its manifest: missing, changed or unlisted files, and
    required files (`REQUIRED`) the manifest leaves out (empty when the folder is as its run wrote it)."""
    folder = Path(folder)
    try:
        listed = json.loads(io.read_regular_text(folder / MANIFEST))
    except io.NotRegularFile as err:
        return [str(err).replace(f"input {folder / MANIFEST}", MANIFEST)]
    except (OSError, ValueError):
        return [f"no readable {MANIFEST}"]
    if not isinstance(listed, dict):
        return [f"{MANIFEST} is not a mapping"]
    entries = {p.relative_to(folder).as_posix(): p for p in folder.rglob("*")}
    links = [name for name, p in entries.items() if p.is_symlink()]
    if links:  # a run writes none: a link would bring another file (a key, a password file) into a report
        return [f"{k} is a link (a run writes none)" for k in links]
    odd = {name: kind for name, p in entries.items() if (kind := io.irregular_kind(p))}  # a FIFO, a device: never read
    present = {name: p for name, p in entries.items() if p.is_file() and name not in UNLISTED}
    problems = required_problems(folder, listed)
    problems += [f"{k} is {odd[k]}, not a regular file" for k in sorted(set(listed) & set(odd))]
    problems += [f"{k} missing" for k in sorted(set(listed) - set(present) - set(odd))]
    problems += [f"{k} changed" for k in sorted(set(listed) & set(present)) if io.file_digest(present[k]) != listed[k]]
    problems += [f"{k} not written by the run" for k in sorted(set(present) - set(listed))]
    problems += [f"{k} is {odd[k]}, not a regular file (a run writes none)" for k in sorted(set(odd) - set(listed))]
    return list(dict.fromkeys(problems))  # provenance.json's kind said once


def check_discardable(folder) -> None:
    """RunFolderError unless `folder`, a run folder to be run again, holds only what its run wrote (the
    files its manifest lists, unchanged, and the manifest): a file a user added or edited there, a link, or a
    folder without a readable manifest is never deleted; the message names what is in the way."""
    folder = Path(folder)
    if folder.is_symlink():
        raise RunFolderError(f"{folder} is a link, not a run folder this tool wrote; it is left as it is "
                             f"(remove the link yourself to run again)")
    try:
        listed = json.loads(io.read_regular_text(folder / MANIFEST))
    except (OSError, ValueError):
        listed = None
    if not isinstance(listed, dict):
        listed = {}
    try:
        entries = sorted(folder.rglob("*"))
    except OSError as err:
        raise RunFolderError(f"{folder} cannot be read ({err.strerror or err}); it is left as it is") from None

    def written_by_run(p: Path, name: str) -> bool:  # listed, and still what the run wrote (an edit is the user's)
        return name in listed and p.is_file() and not p.is_symlink() and io.file_digest(p) == listed[name]

    named = {p.relative_to(folder).as_posix(): p for p in entries}  # UNLISTED: exempt at the folder's top only
    foreign = [name for name, p in named.items()
               if (p.is_symlink() or not p.is_dir()) and name not in UNLISTED and not written_by_run(p, name)]
    if foreign:  # a FIFO or a device is named by its kind (a run writes none)
        said = [f"{name} is {kind}, not a regular file" if (kind := io.irregular_kind(named[name])) else name
                for name in foreign]
        shown = ", ".join(said[:3]) + (f" and {len(said) - 3} more" if len(said) > 3 else "")
        raise RunFolderError(f"{folder} must be run again but holds files its run did not write or that were "
                             f"changed since ({shown}); nothing was deleted: move them out, then run again")


def discard_run_folder(folder) -> None:
    """Remove the run folder `folder` after `check_discardable` (never a file the tool did not write)."""
    check_discardable(folder)
    shutil.rmtree(folder)


clean_debris = notebooks.clean_debris
work_name = notebooks.work_name


def enclosing_run_folder(path) -> Path | None:
    """The run folder (one with a manifest) or work folder that `path` is or lies in, its links
    resolved; None if there is none. A file written there breaks the run's manifest, and the next
    run replaces the folder with all it holds."""
    where = Path(path).resolve()
    for folder in [where, *where.parents]:
        if (folder / MANIFEST).is_file() or io.is_work_name(folder.name):
            return folder
    return None


MIN_FREE_BYTES = 256 * 2**20  # a run folder (notebook, figures as PNG, SVG and CSV) is a few MB


def check_output_folder(root: Path, what: str = "output folder", min_free: int = 0) -> Path:
    """Refuse an output root that exists and is not a folder, or that cannot be created (the
    deepest existing folder on its way is not writable), or that lies on a disk with less than
    `min_free` bytes free."""
    root = Path(root)
    for p in [root, *root.parents]:
        if p.exists():
            if not p.is_dir():
                raise RunFolderError(f"{what} {root}: {p} exists and is not a folder")
            if not os.access(p, os.W_OK | os.X_OK):
                raise RunFolderError(f"{what} {root}: {p} is not writable")
            if min_free:
                free = shutil.disk_usage(p).free
                if free < min_free:
                    raise RunFolderError(f"{what} {root}: only {free / 2**20:.0f} MiB free on its disk, "
                                         f"{min_free / 2**20:.0f} MiB needed")
            break
    return root


def run_dir(name: str, params: dict) -> Path:
    return RUNS / name / run_hash(name, params, code_key(name))


def run(name: str, params: dict, *, force: bool = False, runs_root: Path | None = None,
        progress: bool = False) -> tuple[Path, bool]:
    """Execute `name` with the (already resolved) `params` into its run folder.

    Returns `(folder, reused)`. An existing complete folder whose files match its manifest is
    reused unless `force`; one that does not match is run again (said on stderr). `progress` shows
    the executed cells with elapsed time on stderr.
    """
    notebook = notebook_code(name)  # first: it checks the name too (notebooks.source_path)
    root = check_output_folder(runs_root if runs_root is not None else RUNS, "runs folder")
    final = root / name / run_hash(name, params, code=notebook.key)
    check_output_folder(final.parent, "runs folder", min_free=MIN_FREE_BYTES)  # runs/<part>/<name> too
    notebooks.check_temporary_folder()
    clean_debris(final.parent)
    if final.is_dir() and not force:
        problems = manifest_problems(final)
        if not problems:
            return final, True
        print(f"lowrank: {final} does not match its manifest ({'; '.join(problems[:3])}"
              f"{'; ...' if len(problems) > 3 else ''}): running it again", file=sys.stderr)
    if final.is_dir() or final.is_symlink():  # replaced below: only if it holds nothing but its run's files
        check_discardable(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = io.make_work_folder(work_name(final))
    try:
        _execute_into(tmp, notebook, params, final.name, progress)
        io.replace_folder(tmp, final, old=work_name(final, "old"))  # a rerun: the old folder is dropped
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, False


def execute(notebook: NotebookCode, params: dict, output: Path, figure_dir: Path, *, progress: bool = False,
            **options) -> tuple[dict, dict]:
    """Execute `notebook` (`lowrank.book.keys.notebook_code`) with `params` into `output` (its figures
    into `figure_dir`): the one execution path of a result with provenance (run folders here, the laptop-
    and paper-scale builds). `options` go to `lowrank.book.notebooks.execute` (`figure_url`, `timeout`).

    Returns `(verdicts, provenance)`: the glued verdicts by name, and `lowrank.core.io.provenance`
    with the notebook's code key."""
    if progress:
        options["progress"] = True
    started, load, t0 = io.now(), io.machine_load(), time.time()
    values = notebooks.execute(notebook.name, output, parameters=params, figure_dir=figure_dir, **options)
    found = glued_verdicts(values)
    return found, io.provenance(started, load, time.time() - t0, code=notebook.key)


def _execute_into(tmp: Path, notebook: NotebookCode, params: dict, run_name: str, progress: bool = False) -> None:
    """Execute `notebook` into the fresh folder `tmp`: notebook, figures, verdicts, parameters,
    provenance, then the manifest of them all."""
    found, provenance = execute(notebook, params, tmp / "notebook.ipynb", tmp / "figures", progress=progress)
    (tmp / "verdicts.json").write_text(json.dumps(found, indent=2, sort_keys=True))
    (tmp / "parameters.json").write_text(json.dumps(params, indent=2, sort_keys=True))
    provenance = {"notebook": notebook.name, "parameters": params, "hash": run_name, **provenance}
    (tmp / "provenance.json").write_text(json.dumps(provenance, indent=2, sort_keys=True))
    write_manifest(tmp)


SWEEP_RECORD = "sweep.json"  # written by `lowrank.book.sweeps.run_sweep` before any run: the folder is a sweep's


def rerun_advice(folder: Path) -> str:
    """How to run `folder` again: a point of a sweep (its parent holds the sweep's record,
    `SWEEP_RECORD`) by that sweep's command, a notebook's run by `lowrank run --force`."""
    record = Path(folder).parent / SWEEP_RECORD
    try:
        spec = json.loads(io.read_regular_text(record)).get("spec") if not io.irregular_kind(record) else None
    except (OSError, ValueError, AttributeError):
        spec = None
    if isinstance(spec, str) and spec:
        return f"it is a point of a sweep: rerun the sweep with `lowrank sweep {spec} --output {Path(folder).parent}`"
    return "rerun it with `lowrank run --force`"


def load_run(folder) -> dict:
    """Provenance, parameters and verdicts of a complete run folder whose files match its manifest;
    RunFolderError otherwise."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RunFolderError(f"{folder} is not a run folder (no such folder)")
    odd = io.irregular_kind(folder / "provenance.json")
    if odd:  # a link to /dev/zero, a FIFO: said, never opened
        raise RunFolderError(f"{folder} is not a complete run folder: provenance.json is {odd}, not a regular "
                             f"file; it is not read")
    if not (folder / "provenance.json").is_file():
        raise RunFolderError(f"{folder} is not a complete run folder (no provenance.json)")
    problems = manifest_problems(folder)
    if problems:
        raise RunFolderError(f"{folder} does not match its manifest ({'; '.join(problems[:3])}); "
                             f"{rerun_advice(folder)}")
    try:
        provenance = json.loads(io.read_regular_text(folder / "provenance.json"))
        verdicts = json.loads(io.read_regular_text(folder / "verdicts.json")) if "notebook" in provenance else {}
    except (ValueError, OSError) as err:
        raise RunFolderError(f"{folder}: unreadable JSON ({err})") from None
    return {"folder": folder, "provenance": provenance, "verdicts": verdicts,
            "figures": sorted((folder / "figures").glob("*.png"))}
