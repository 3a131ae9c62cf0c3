"""Files written whole or not at all, one digest, and the provenance of a result.

- `write_atomically(path, data)` and `replace_folder(work, final)`: a reader never sees half a
  file or half a folder (written under a temporary name in the same folder, then renamed);
- `digest(*parts)` and `file_digest(path)`: SHA-256 in hex, cut to `DIGEST_LENGTH` digits, the one
  hash of the package's keys, run folders, manifests and checkpoints (integrity sums published by
  a data set's authors are theirs: `lowrank.core.datasets` checks those as given);
- `provenance(...)`: the record of where and when a result was computed (git commit, package
  versions, device, machine load, start, end, wall time), assembled here for every caller;
- `parse_once(parse, text)`: a file's parsed contents, computed once per distinct text (a build
  reads the same goldens, rules and modules hundreds of times).
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

__all__ = ["DIGEST_LENGTH", "digest", "file_digest", "write_atomically", "replace_folder", "git_state",
           "versions", "machine_load", "now", "provenance", "parse_once"]

REPO_ROOT = Path(__file__).resolve().parents[2]
# 16 hex digits = 64 bits: a collision between two of a project's keys is out of reach
# (about 2^32 keys before one is likely), and a folder name stays short.
DIGEST_LENGTH = 16


def _update(h, part) -> None:
    if isinstance(part, Path):
        with open(part, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    elif isinstance(part, str):
        h.update(part.encode())
    elif isinstance(part, (bytes, bytearray, memoryview)):
        h.update(part)
    else:
        raise TypeError(f"digest takes str, bytes or Path parts, got {type(part).__name__}")


def digest(*parts) -> str:
    """SHA-256 of `parts` fed in order (str as UTF-8, bytes as they are, a Path by its contents),
    as `DIGEST_LENGTH` hex digits."""
    h = hashlib.sha256()
    for part in parts:
        _update(h, part)
    return h.hexdigest()[:DIGEST_LENGTH]


def file_digest(path) -> str:
    """`digest` of a file's contents."""
    return digest(Path(path))


def _work_path(path: Path, what: str = "tmp") -> Path:
    return path.with_name(f".{path.name}.{what}-{os.getpid()}")


@functools.lru_cache(maxsize=256)
def _parsed(parse, text):
    return parse(text)


def parse_once(parse, text: str):
    """`parse(text)`, computed once per distinct `text` and `parse` (a module-level function), then
    handed out as a deep copy that the caller may change. The key is the text itself, not a file's
    time stamp: a file rewritten within one tick is parsed again. An error is raised, not kept."""
    return copy.deepcopy(_parsed(parse, text))


def write_atomically(path, data=None, *, save=None, mode: int = 0o644) -> Path:
    """Write `data` (str as UTF-8, or bytes) to `path` through a temporary file in its folder, then
    rename it: `path` holds either its old contents or the whole new ones. `save(tmp_path)` writes
    instead (a writer that takes a path: `torch.save`, `fig.savefig`). The file gets `mode`
    (readable by all: a web server running as another user serves it); the temporary file is
    removed on every error, and an OSError names `path`, not the temporary name."""
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp" + path.suffix)
    except OSError as err:
        raise OSError(err.errno, f"cannot write {path} ({err.strerror or err})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            if save is None:
                f.write(data.encode("utf-8") if isinstance(data, str) else bytes(data))
        if save is not None:
            save(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(err.errno, f"cannot write {path} ({err.strerror or err})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def replace_folder(work, final, old=None) -> Path:
    """Rename the finished folder `work` to `final` (same file system); an existing `final` is
    renamed aside first (to `old`, by default `.<name>.old-<pid>` beside it) and removed after, so a
    folder with the final name is always complete."""
    work, final = Path(work), Path(final)
    if final.exists():
        old = _work_path(final, "old") if old is None else Path(old)
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(work, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(work, final)
    return final


def git_state(root: Path = REPO_ROOT) -> dict:
    """The commit checked out in `root` and whether the code, notebooks or parameters differ from it
    (None where git is not there)."""
    def git(*args):
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        except OSError:
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    status = git("status", "--porcelain", "--", "lowrank", "notebooks", "params")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}


def versions() -> dict:
    """Python's version and those of the packages that compute and execute a result."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("lowrank", "torch", "numpy", "scipy", "papermill", "jupyter-book"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def machine_load() -> dict:
    """CPU count and the 1-minute load average: a wall time measured on a busy machine says so."""
    return {"cpus": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def provenance(started: dt.datetime, load_at_start: dict, wall_s: float, *, device: bool = True, **fields) -> dict:
    """Where and when a result was computed: `fields` (what it is: notebook or function, parameters,
    hash, code key) with the git state, package versions, device (`device=False` leaves it out),
    the machine's load at start and end, the start and end times (UTC) and the wall time in seconds."""
    record = dict(fields)
    record.update(git=git_state(), versions=versions())
    if device:
        from lowrank.core.device import describe_device

        record["device"] = describe_device()
    record.update(load_at_start=load_at_start, load_at_end=machine_load(),
                  start=started.isoformat(timespec="seconds"), end=now().isoformat(timespec="seconds"),
                  wall_s=round(wall_s, 2))
    return record
