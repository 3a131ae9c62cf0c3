"""Files written whole or not at all, one digest, and the provenance of a result.

- `write_atomically(path, data)` and `replace_folder(work, final)`: a reader never sees half a
  file or half a folder (written under a temporary name in the same folder, then renamed); a write
  never goes through a symbolic link and never replaces a device, a FIFO or a folder, and
  `check_replaceable` refuses an existing file the tool did not write (`ours`: `written_by_lowrank`,
  a record of the digests of the outputs it wrote, kept outside the output folders);
- work folders: `work_name`, `make_work_folder` and `clean_leftovers`: a temporary folder
  `.NAME.KIND-HOST-PID` carries a marker file (`WORK_MARKER`) written by this module, and start-up
  cleanup removes only such marked folders of dead processes of this host (a user's
  `.thesis.partial-77777/` or `.zshrc.old-2023` carries no marker and is never touched);
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
import re
import shutil
import socket
import stat
import subprocess
from pathlib import Path

__all__ = ["DIGEST_LENGTH", "digest", "file_digest", "write_atomically", "replace_folder", "check_replaceable",
           "OutputRefused", "irregular_kind", "written_by_lowrank", "record_written", "written_record", "work_name", "is_work_name", "make_work_folder", "clean_leftovers", "process_alive", "git_state",
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


class OutputRefused(ValueError):
    """A write that would replace something the tool did not write (a device, a folder, a user's file)."""


def _kind(mode: int) -> str:
    for test, word in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return word
    return "not a regular file"


def irregular_kind(path) -> str | None:
    """What `path` is when it is there and is neither a regular file nor a folder, links not followed
    and nothing opened (a FIFO, a device): "a link to a device (-> /dev/zero)", "a FIFO", "a device",
    "a socket"; None for a regular file, a folder or nothing there."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            to = os.stat(path)
            what = "a regular file" if stat.S_ISREG(to.st_mode) else _kind(to.st_mode)
        except OSError:
            what = "nothing (broken)"
        try:
            shown = os.readlink(path)
        except OSError:
            shown = "?"
        return f"a link to {what} (-> {shown})"
    return _kind(st.st_mode)


class NotRegularFile(OSError):
    """An input that is a FIFO, a device, a socket or a folder: read, it would hang or never end."""


def read_regular_bytes(path, what: str = "input") -> bytes:
    """The contents of the regular file `path`, or NotRegularFile (an OSError) naming what it is: the
    file is opened without blocking (a FIFO with no writer opens at once) and checked on the open
    descriptor before a byte is read, so a FIFO or a device never hangs a reader."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{what} {path} is {_kind(st.st_mode)}, not a regular file")
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as fh:
            fd = None
            return fh.read()
    finally:
        if fd is not None:
            os.close(fd)


def read_regular_text(path, what: str = "input") -> str:
    """`read_regular_bytes` as UTF-8 text."""
    return read_regular_bytes(path, what).decode("utf-8")


def check_replaceable(path, what: str = "output", ours=None) -> Path:
    """The file a write to `path` replaces, or OutputRefused before any work: `path` is a symbolic
    link (resolved, to name its target, and refused: a link planted in an output folder would send the
    write anywhere), it exists and is not a regular file (a folder, a device such as /dev/null, a FIFO),
    or `ours(path)` says the tool did not write it (`written_by_lowrank`: a record this package keeps,
    not the file's contents, which anyone can type)."""
    path = Path(path)
    if path.is_symlink():
        try:
            shown = f" (-> {path.resolve()})"
        except (OSError, RuntimeError):  # a loop of links
            shown = ""
        raise OutputRefused(f"{what} {path} is a link{shown}; an output is never written through a link "
                            f"(give the file itself, or a new name)")
    target = path.absolute()
    try:
        st = os.stat(target)
    except (FileNotFoundError, NotADirectoryError):  # a new file (a folder on its way is the caller's to check)
        return target
    except OSError as err:
        raise OutputRefused(f"{what} {path}: {err.strerror or err}") from None
    if not stat.S_ISREG(st.st_mode):
        raise OutputRefused(f"{what} {path} is {_kind(st.st_mode)}; give the name of a file to write")
    if ours is not None and not ours(target):
        raise OutputRefused(f"{what} {path} exists and was not written by lowrank; it is left as it is "
                            f"(give a new file name, or remove it yourself)")
    return target


def head_contains(path: Path, marker: bytes, within: int = 4096) -> bool:
    """Whether `marker` occurs in the first `within` bytes of the file (a hint only: never proof that
    the tool wrote it, see `written_by_lowrank`)."""
    try:
        with open(path, "rb") as f:
            return marker in f.read(within)
    except OSError:
        return False


# --- the record of written outputs: how the tool knows a file it may replace is its own ---------------
def written_record() -> Path:
    """The file listing `SHA-256<TAB>absolute path` of every output written with `record=True`:
    `$LOWRANK_STATE/written.tsv`, by default under `$XDG_STATE_HOME` (~/.local/state/lowrank)."""
    root = os.environ.get("LOWRANK_STATE") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state"), "lowrank")
    return Path(root) / "written.tsv"


def _full_digest(path: Path) -> str:
    h = hashlib.sha256()
    _update(h, Path(path))
    return h.hexdigest()


def record_written(path, sha256: str | None = None) -> None:
    """Add `path` (absolute, links not followed) with the digest of its contents to `written_record()`
    (one line, appended: concurrent writers do not mix lines). A record that cannot be written leaves
    the file unclaimed: the next write over it is refused, never the other way round."""
    path = Path(path).absolute()
    line = f"{sha256 or _full_digest(path)}\t{path}\n"
    if "\n" in str(path) or "\t" in str(path):
        return  # such a name cannot be recorded on one line: never claimed
    record = written_record()
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(line)
    except OSError:
        pass


def written_by_lowrank(path) -> bool:
    """Whether the regular file `path` holds exactly what this package last recorded writing there
    (`record_written`): a file whose contents a user typed, or changed since, is not the tool's."""
    path = Path(path).absolute()
    try:
        if path.is_symlink() or not path.is_file():
            return False
        wanted = f"{_full_digest(path)}\t{path}"
        with open(written_record(), encoding="utf-8", errors="replace") as f:
            return any(line.rstrip("\n") == wanted for line in f)
    except OSError:
        return False


# --- work folders: `.NAME.KIND-HOST-PID` beside the folder they become, with a marker file -------------
WORK_MARKER = ".lowrank-work"
_MARKER_TEXT = "a temporary folder of lowrank; removed once the process named in its folder name has ended\n"
_WORK_NAME = re.compile(r"\.(?P<name>.+)\.(?P<kind>partial|old)-(?:(?P<host>.+)-)?(?P<pid>\d{1,10})$")
PID_MAX = 2 ** 22  # Linux's largest (pid_max); macOS's is smaller: a larger number is no process of ours


def work_name(final, kind: str = "partial") -> Path:
    """The temporary sibling of `final` this process writes: `.NAME.KIND-HOST-PID`."""
    final = Path(final)
    return final.parent / f".{final.name}.{kind}-{socket.gethostname()}-{os.getpid()}"


def is_work_name(name: str) -> bool:
    """Whether `name` has the shape of a work folder (`.NAME.partial-HOST-PID`, `.old-`); whether one
    is the tool's is said by its marker (`clean_leftovers`)."""
    return bool(_WORK_NAME.match(name))


def _mark(folder: Path) -> None:
    (folder / WORK_MARKER).write_text(_MARKER_TEXT)


def make_work_folder(path) -> Path:
    """Create the work folder `path` (a `work_name`; an older one of this process is removed) with its marker."""
    path = Path(path)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    _mark(path)
    return path


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (another user's counts as alive); a number no
    process can have (0, above `PID_MAX`) is not."""
    if not 0 < pid <= PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def clean_leftovers(folder) -> list[Path]:
    """Remove the work folders in `folder` that this tool left (the name `.NAME.KIND-HOST-PID` of this
    host, a real folder, not a link, holding the `WORK_MARKER` file) and whose process is gone (a run
    killed with -9 cannot clean up after itself). Nothing else is touched. Returns what was removed."""
    removed = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    host = socket.gethostname()
    for p in entries:
        m = _WORK_NAME.match(p.name)
        if not m or m["host"] not in (None, host) or not 0 < int(m["pid"]) <= PID_MAX:
            continue
        if p.is_symlink() or not p.is_dir() or not head_contains(p / WORK_MARKER, _MARKER_TEXT.encode()):
            continue
        if not process_alive(int(m["pid"])):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


@functools.lru_cache(maxsize=256)
def _parsed(parse, text):
    return parse(text)


def parse_once(parse, text: str):
    """`parse(text)`, computed once per distinct `text` and `parse` (a module-level function), then
    handed out as a deep copy that the caller may change. The key is the text itself, not a file's
    time stamp: a file rewritten within one tick is parsed again. An error is raised, not kept."""
    return copy.deepcopy(_parsed(parse, text))


def write_atomically(path, data=None, *, save=None, mode: int = 0o644, record: bool = False) -> Path:
    """Write `data` (str as UTF-8, or bytes) to `path` through a temporary file in its folder, then
    rename it: `path` holds either its old contents or the whole new ones (a symbolic link, a folder,
    a device or a FIFO is refused: `check_replaceable`); `record=True` adds it to the record of the
    tool's outputs (`written_by_lowrank`: the next write over it may replace it). `save(tmp_path)` writes
    instead (a writer that takes a path: `torch.save`, `fig.savefig`). The file gets `mode`
    (readable by all: a web server running as another user serves it); the temporary file is
    removed on every error, and an OSError names `path`, not the temporary name."""
    import tempfile

    path = check_replaceable(path, "output")
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
        sha = _full_digest(Path(tmp)) if record else None
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(err.errno, f"cannot write {path} ({err.strerror or err})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if record:
        record_written(path, sha)
    return path


def replace_folder(work, final, old=None) -> Path:
    """Rename the finished folder `work` to `final` (same file system); an existing `final` is
    renamed aside first (to `old`, by default `work_name(final, "old")`) and removed after, so a
    folder with the final name is always complete. `work`'s marker is removed (it is finished); a
    `final` that is a link or a file is refused."""
    work, final = Path(work), Path(final)
    (work / WORK_MARKER).unlink(missing_ok=True)  # the finished folder is no leftover
    if final.is_symlink() or (final.exists() and not final.is_dir()):
        raise OutputRefused(f"{final} is not a folder the tool wrote (a link or a file); it is left as it is")
    if final.exists():
        old = work_name(final, "old") if old is None else Path(old)
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        _mark(old)
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
