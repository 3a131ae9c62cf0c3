"""The book's notebooks as objects: find them, read their parameters, execute them, read their glued values.

A notebook is a MyST-markdown file `notebooks/<part>/<name>.md` (jupytext). Its cell tagged
`parameters` holds the ci-scale defaults as `name: TYPE = literal` declarations; the laptop- and
paper-scale values live in `params/<scale>/<part>/<name>.yaml` (`scale_params_path`).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import socket
import time
from pathlib import Path

from lowrank.core import io

__all__ = [
    "REPO_ROOT",
    "IN_CLONE",
    "SOURCE_ROOT",
    "NOTEBOOK_ROOT",
    "list_notebooks",
    "InputError",
    "NotebookFailed",
    "FAILED_ROOT",
    "check_name",
    "source_path",
    "SCALES",
    "scale_params_path",
    "paper_params_path",
    "read_notebook",
    "parameter_defaults",
    "parameter_defaults_from_source",
    "execute",
    "glued_values",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
# A clone holds the package beside the book's sources; an installed copy (`pip install lowrank`) has
# no clone around it and carries the notebooks and parameter files in lowrank/_book/ (setup.py).
IN_CLONE = (REPO_ROOT / "_toc.yml").is_file() and (REPO_ROOT / "notebooks").is_dir()
SOURCE_ROOT = REPO_ROOT if IN_CLONE else Path(__file__).resolve().parents[1] / "_book"
NOTEBOOK_ROOT = SOURCE_ROOT / "notebooks"
# the partial notebook of a failed execution (its outputs up to the failing cell): <part>/<name>.ipynb
FAILED_ROOT = (REPO_ROOT if IN_CLONE else Path.cwd()) / "_build" / "failed"


def list_notebooks() -> list[str]:
    """Names `part/name` of every notebook, sorted."""
    return sorted(p.relative_to(NOTEBOOK_ROOT).with_suffix("").as_posix() for p in NOTEBOOK_ROOT.glob("*/*.md"))


class InputError(ValueError):
    """An input refused before any work starts (a name, a parameter, a path, a spec); its message
    is one line saying what is wrong and what is allowed."""


class NotebookFailed(RuntimeError):
    """A cell raised while a notebook executed. The message is a few lines: the notebook, the failing
    cell (its number and first lines), the error, and the partial notebook kept in FAILED_ROOT."""


def failure_message(name: str, err, partial: Path) -> str:
    """A few lines from papermill's PapermillExecutionError (cell_index, source, ename, evalue)."""
    lines = [ln for ln in str(getattr(err, "source", "") or "").splitlines() if ln.strip()]
    shown = "\n".join(f"    | {ln[:100]}" for ln in lines[:3]) + ("\n    | ..." if len(lines) > 3 else "")
    count = getattr(err, "exec_count", None)
    evalue = " ".join(str(getattr(err, "evalue", "")).split())
    return (f"{name} failed in code cell {getattr(err, 'cell_index', '?')}"
            f"{f' (execution count {count})' if count is not None else ''}:\n{shown}\n"
            f"  {getattr(err, 'ename', type(err).__name__)}: {evalue[:500]}\n"
            f"  partial notebook (outputs up to the failure): {partial}")


# a notebook name is `part/name`: two plain path components, so that it can never reach a file
# outside notebooks/ (no `..`, no absolute path) nor a run folder outside runs/
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*/[A-Za-z0-9_][A-Za-z0-9_-]*")


def check_name(name) -> str:
    """Return `name` if it is a notebook name `part/name`, else raise ValueError saying why."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InputError(f"notebook name {name!r} must be PART/NAME (letters, digits, '_' and '-'; "
                         f"no '..', no absolute path, no '.md')")
    return name


def source_path(name: str) -> Path:
    """The MyST source of notebook `name`; FileNotFoundError (with a close match) if there is none,
    ValueError for a name that is not PART/NAME or a file outside the notebook folder."""
    check_name(name)
    path = NOTEBOOK_ROOT / f"{name}.md"
    if path.is_file() and not path.resolve().is_relative_to(NOTEBOOK_ROOT.resolve()):
        raise InputError(f"notebook {name!r} resolves outside {NOTEBOOK_ROOT} (a link): refused")
    if not path.is_file():
        import difflib

        close = difflib.get_close_matches(name, list_notebooks(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise FileNotFoundError(f"no notebook {name!r} under {NOTEBOOK_ROOT}{hint}")
    return path


# the book's scales, smallest first: ci (the notebook's defaults), laptop and paper (a parameter file each)
SCALES = ("ci", "laptop", "paper")


def scale_params_path(name: str, scale: str) -> Path:
    """`params/<scale>/<part>/<name>.yaml`, the parameter file of a laptop- or paper-scale run."""
    if scale not in SCALES[1:]:
        raise ValueError(f"scale must be one of {', '.join(SCALES[1:])} (ci is the notebook's defaults), got {scale!r}")
    return paper_params_path(name) if scale == "paper" else SOURCE_ROOT / "params" / scale / f"{name}.yaml"


def paper_params_path(name: str) -> Path:
    return SOURCE_ROOT / "params" / "paper" / f"{name}.yaml"


def read_notebook(name: str):
    """The notebook as an nbformat object, converted from MyST markdown by jupytext; without jupytext
    (the science install, `pip install lowrank`) its code cells only, read by `myst_code_cells`:
    enough for the parameter cell that `lowrank list` shows."""
    from lowrank.core.io import parse_once

    text = source_path(name).read_text(encoding="utf-8")
    try:
        import jupytext  # noqa: F401
    except ModuleNotFoundError:
        return myst_code_cells(text)
    return parse_once(_myst_notebook, text)  # a build reads each notebook once per claim


def _myst_notebook(text: str):
    import jupytext

    return jupytext.reads(text, {"extension": ".md"})  # as jupytext.read(path) reads a .md file


class _Cell(dict):
    """A code cell as nbformat has it (`cell.cell_type`, `cell.metadata`, `cell.source`)."""

    __getattr__ = dict.__getitem__


class _Notebook:
    def __init__(self, cells):
        self.cells = cells


# a MyST code cell: ```{code-cell} LANG ... ``` with its options as `:key: value` lines or a YAML block
_CODE_CELL = re.compile(r"^(?P<fence>`{3,}|~{3,})\{code-cell\}[^\n]*\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S)


def myst_code_cells(text: str) -> _Notebook:
    """The code cells of a MyST notebook's text, each with its metadata and source, as jupytext reads
    them up to trailing blank lines (tests/test_install.py checks every notebook of the book against
    jupytext)."""
    import yaml  # cell options are tags and flags: plain YAML (papermill's number reading is for parameters)

    cells = []
    for m in _CODE_CELL.finditer(text):
        lines = m.group("body").split("\n")[:-1]
        meta = {}
        if lines and lines[0].strip() == "---":
            end = lines.index("---", 1)
            meta = yaml.safe_load("\n".join(lines[1:end])) or {}
            lines = lines[end + 1:]
        else:
            while lines and re.match(r":[A-Za-z_-]+:", lines[0]):
                key, _, value = lines.pop(0)[1:].partition(":")
                meta[key] = yaml.safe_load(value.strip()) if value.strip() else None
        if meta and lines and not lines[0].strip():
            lines.pop(0)  # the blank line that ends the options
        while lines and not lines[-1].strip():
            lines.pop()  # blank lines before the closing fence are not part of the cell
        cells.append(_Cell(cell_type="code", metadata=meta, source="\n".join(lines)))
    return _Notebook(cells)


def parameter_defaults(nb) -> dict:
    """`{name: value}` from the cell tagged `parameters` (literal assignments only)."""
    cells = [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"a notebook needs exactly one cell tagged 'parameters', found {len(cells)}")
    return parameter_defaults_from_source(cells[0].source)


def parameter_defaults_from_source(source: str) -> dict:
    """`{name: value}` of a parameter cell's source: one `name: TYPE = literal` (or `name = literal`)
    per statement; the declarations are `lowrank.book.rules`'s."""
    params = {}
    for node in ast.parse(source).body:
        plain = isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        annotated = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None
        if not (plain or annotated):
            raise ValueError(f"parameter cell line {node.lineno}: only `name: TYPE = literal` assignments are allowed")
        try:
            params[(node.target if annotated else node.targets[0]).id] = ast.literal_eval(node.value)
        except ValueError:
            raise ValueError(f"parameter cell line {node.lineno}: the value is not a literal") from None
    return params


# work folders and their cleanup are `lowrank.core.io`'s (a marker file says which are the tool's)
work_folder_name = io.is_work_name
_alive = io.process_alive
clean_debris = io.clean_leftovers
work_name = io.work_name


class _work_folder:
    """`.NAME.partial-HOST-PID` next to `output`, removed on exit whatever happens (and by
    `clean_debris` if this process is killed before)."""

    def __init__(self, output: Path):
        self.path = work_name(output)

    def __enter__(self) -> str:
        io.make_work_folder(self.path)
        return str(self.path)

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)


# A kernel's files in the temporary folder: its connection file (which holds the kernel's key) and
# its IPC sockets, named `lowrank-kernel-HOST-PID-ID` (HOST: 6 hex digits of the host name's hash,
# PID: the process that started it). They are removed when the kernel stops; those of a process
# killed before (kill -9) are removed by the next execution (`clean_kernel_files`).
_KERNEL_FILE = re.compile(r"lowrank-kernel-(?P<host>[0-9a-f]{6})-(?P<pid>\d+)-[0-9a-f]+(?:\.json|-ipc-\d+|-\d+)?$")
SOCKET_PATH_MAX = 107  # bytes of a Unix socket path (sun_path is 108 bytes with its final NUL)
IPC_PORTS = 5  # shell, iopub, stdin, control, heartbeat: sockets PATH-1 .. PATH-5


def _host_tag() -> str:
    import hashlib

    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def kernel_file_prefix(kernel_id: str) -> Path:
    import tempfile

    return Path(tempfile.gettempdir()) / f"lowrank-kernel-{_host_tag()}-{os.getpid()}-{kernel_id}"


def ipc_fits(prefix: Path) -> bool:
    """Whether the kernel's socket paths `PREFIX-ipc-N` fit in a Unix socket address."""
    return len(os.fsencode(f"{prefix}-ipc-{IPC_PORTS}")) <= SOCKET_PATH_MAX


def clean_kernel_files(folder=None) -> list[Path]:
    """Remove the kernel files (`_KERNEL_FILE`) in `folder` (the temporary folder) left by dead
    processes of this host. Returns what was removed."""
    import tempfile

    folder = Path(folder or tempfile.gettempdir())
    removed, host = [], _host_tag()
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for p in entries:
        m = _KERNEL_FILE.match(p.name)
        if m and m["host"] == host and not _alive(int(m["pid"])):
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
    return removed


def check_temporary_folder() -> None:
    """Refuse, before a kernel starts, a temporary folder ($TMPDIR) that is missing or not writable."""
    import tempfile

    tmp = Path(os.environ.get("TMPDIR") or tempfile.gettempdir())
    if not tmp.is_dir() or not os.access(tmp, os.W_OK | os.X_OK):
        raise InputError(f"the temporary folder {tmp} (TMPDIR) is not a writable folder")


def _kernel_manager_class(prefix: Path):
    """jupyter_client's kernel manager with the kernel's sockets on local IPC (Unix sockets, readable
    by this user only) instead of TCP on localhost: the kernel then has no reason to warn "Kernel is
    running over TCP without encryption" at every start. Each kernel's files get names of their
    own (`prefix`, see `kernel_file_prefix`): jupyter_client's default ("kernel-ipc-N" in the working
    folder) makes two kernels started at once in the same folder pick the same sockets. Where the
    socket paths would not fit (`ipc_fits`: a deep temporary folder), TCP on localhost."""
    from jupyter_client import AsyncKernelManager
    from traitlets import default

    class IPCKernelManager(AsyncKernelManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            _MANAGERS.setdefault(str(prefix), []).append(self)  # an interrupted execution stops its kernel

        @default("transport")
        def _transport_default(self):
            return "ipc" if ipc_fits(prefix) else "tcp"

        @default("ip")
        def _ip_default(self):
            if self.transport == "ipc":
                return f"{prefix}-ipc"
            return super()._ip_default()

        @default("connection_file")
        def _connection_file_default(self):
            return f"{prefix}.json"

    return IPCKernelManager


_MANAGERS: dict = {}  # {kernel file prefix: its kernel managers}, per execution of this process


def _kill_kernels(managers) -> None:
    """Stop the kernels of `managers` at once (Ctrl-C: the kernel would otherwise outlive this
    process for a moment and print its own warning on the terminal)."""
    import signal

    for km in managers:
        pid = getattr(getattr(km, "provisioner", None), "pid", None)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def remove_kernel_files(prefix: Path) -> None:
    """The connection file and sockets of the kernel named `prefix` (whatever state it stopped in)."""
    for p in [Path(f"{prefix}.json"), *(Path(f"{prefix}-ipc-{i}") for i in range(1, IPC_PORTS + 1))]:
        try:
            p.unlink()
        except OSError:
            pass


def execute(name: str, output: Path, parameters: dict | None = None, figure_dir: Path | None = None,
            figure_url: str | None = None, timeout: int = 1800, progress: bool = False) -> dict:
    """Execute notebook `name` with papermill into `output` (.ipynb), atomically.

    The kernel runs in the notebook's folder; figures go to `figure_dir` (LOWRANK_FIGURE_DIR) and
    their download links point at `figure_url` (LOWRANK_FIGURE_URL). `progress` shows papermill's
    bar on stderr (cells done, elapsed, estimated time left). Returns the glued values.
    On failure nothing is left at `output`; a cell that raises gives NotebookFailed, and the partial
    notebook (outputs up to the failing cell, the traceback) is kept as FAILED_ROOT/<name>.ipynb.
    """

    import jupytext
    import papermill

    import uuid

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    clean_debris(output.parent)  # what a killed execution left
    check_temporary_folder()
    clean_kernel_files()
    prefix = kernel_file_prefix(uuid.uuid4().hex[:8])
    with _work_folder(output) as tmp:
        src = Path(tmp) / "input.ipynb"
        jupytext.write(read_notebook(name), src)
        partial = Path(tmp) / "output.ipynb"
        env = {"LOWRANK_FIGURE_DIR": str(Path(figure_dir).resolve()) if figure_dir is not None else None,
               "LOWRANK_FIGURE_URL": figure_url}
        env_before = {k: os.environ.get(k) for k in env}
        for k, v in env.items():  # the kernel inherits the environment
            if v is not None:
                os.environ[k] = v
        try:
            start = time.time()
            papermill.execute_notebook(
                str(src), str(partial), parameters=parameters or {}, cwd=str(source_path(name).parent),
                kernel_name="python3", progress_bar=progress, execution_timeout=timeout,
                kernel_manager_class=_kernel_manager_class(prefix),
            )
        except papermill.PapermillExecutionError as err:
            kept = FAILED_ROOT / f"{name}.ipynb"
            if partial.is_file():
                kept.parent.mkdir(parents=True, exist_ok=True)
                if kept.is_symlink():  # the tool's own folder: a link planted there is replaced, never written through
                    kept.unlink()
                shutil.copyfile(partial, kept)
            raise NotebookFailed(failure_message(name, err, kept if kept.is_file() else "none written")) from None
        except KeyboardInterrupt:
            _kill_kernels(_MANAGERS.get(str(prefix), []))
            raise
        finally:
            _MANAGERS.pop(str(prefix), None)
            remove_kernel_files(prefix)
            for k, v in env_before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        import nbformat

        nb = nbformat.read(partial, as_version=4)
        nb.metadata["lowrank"] = {"notebook": name, "wall_s": round(time.time() - start, 2),
                                  "executed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        nbformat.write(nb, partial)
        os.replace(partial, output)
    return glued_values(nb)


def glued_values(nb) -> dict:
    """`{name: value}` of everything the notebook glued (myst-nb / scrapbook outputs)."""
    values = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            meta = out.get("metadata", {}).get("scrapbook")
            if not meta:
                continue
            text = out.get("data", {}).get(meta.get("mime_prefix", "") + "text/plain")
            if text is not None:
                values[meta["name"]] = _parse_text(text if isinstance(text, str) else "".join(text))
    return values


def _parse_text(text: str):
    """A glued value's text/plain: JSON (verdict records, numbers), else a Python literal, else text."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text

