"""Jupyter kernels forked from a process that has already imported the pages' libraries.

Every page's kernel spends seconds of CPU before its first line of work: starting ipykernel and
importing torch, scipy, pandas and matplotlib (`PRELOAD`). `PreloadedKernels` starts one server
process that imports them once; each kernel is then a fork of it, which starts at once.

jupyter_client still starts a process of its own for each kernel (`kernel_client.py`, standard
library only). It hands the server the kernel command, its working folder, its environment and its
standard streams, relays signals to the forked kernel and exits with the kernel's status, so that
interrupting, killing and waiting work as for an ordinary kernel; if the client dies, the server
kills its kernel. The server forks only an ipykernel command of its own Python whose environment
equals the server's, apart from the per-kernel variables `PER_KERNEL`; any other request, or a
server that is gone, gets an ordinary kernel (the client executes the command itself).

Nothing of the page's own code is imported in advance (not even `lowrank`): what the server imports
is what every page imports first, and none of it behaves differently outside a kernel (tqdm.auto,
which does, is left out). tests/test_preloaded_kernels.py compares forked and ordinary kernels.

A forked kernel's heap is not an ordinary kernel's: buffers land elsewhere, and what the server imported
left malloc's mmap threshold at 2 MiB where the tests' ordinary kernel, importing less, has 1 MiB. The pages' numbers do
not depend on it: in ordinary kernels too, buffers land elsewhere on every run (hash randomisation),
and reruns are bit-identical. The tests check a page's verdicts, figure data and SVGs bit for bit. Its
PNGs are not always identical: in some forked kernels, real_data's eigenvalue figure had 8 pixels of
its markers drawn differently, from the same data (cause not found).
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

__all__ = ["PRELOAD", "PER_KERNEL", "PreloadedKernels", "ServerFailed"]

# imported once by the server; none of them looks for a running IPython or starts a thread at import
PRELOAD = ("ipykernel.kernelapp", "ipykernel.ipkernel", "numpy", "torch", "scipy.stats", "scipy.sparse.linalg",
           "pandas", "matplotlib.pyplot")
# environment variables that may differ between the server and a kernel: read when used, not at import
PER_KERNEL = frozenset({"LOWRANK_FIGURE_DIR", "LOWRANK_FIGURE_URL", "JPY_PARENT_PID", "JPY_SESSION_NAME",
                        "COLUMNS", "LINES"})
# what ipykernel sets in each kernel before a page imports matplotlib, which reads it at import
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
CLIENT = Path(__file__).with_name("kernel_client.py")
MESSAGE_MAX = 1 << 16  # bytes of a request (mostly the environment)
# the interpreter options of ipykernel's kernel spec (python -Xfrozen_modules=off -m ipykernel_launcher)
KERNEL_OPTIONS = ("-Xfrozen_modules=off",)


class ServerFailed(RuntimeError):
    """The server did not start (an import failed, or importing started a thread)."""


class PreloadedKernels:
    """A running server of forked kernels; `command(cmd)` wraps a kernel command to use it.

    The environment of the calling process when it starts is the environment of every forked
    kernel, so start it after setting what the kernels should inherit (OMP_NUM_THREADS, ...)."""

    def __init__(self, modules=PRELOAD):
        self.folder = Path(tempfile.mkdtemp(prefix="lowrank-kernels-"))
        self.path = self.folder / "server"
        self.process = subprocess.Popen([sys.executable, *KERNEL_OPTIONS, "-m", __name__, str(self.path), *modules],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline().strip()
        if line != "ready":
            self.close()
            raise ServerFailed(line or f"the kernel server exited with status {self.process.returncode}")

    def command(self, cmd: list[str]) -> list[str]:
        """The command that jupyter_client starts in place of the kernel command `cmd`."""
        return [sys.executable, "-I", "-S", str(CLIENT), str(self.path), *cmd]

    def close(self) -> None:
        """Stop the server (kernels still running are killed) and remove its socket."""
        if self.process.poll() is None:
            self.process.stdin.close()  # the server's signal to stop
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- the server (python -m lowrank.book.preloaded_kernels SOCKET MODULE...) ----

def _refusal(request: dict, own_env: dict) -> str | None:
    """Why `request` cannot be served by a fork (None: it can)."""
    argv, own = request["argv"], _interpreter_command()
    if argv[:len(own) + 2] != [*own, "-m", "ipykernel_launcher"]:
        return f"not an ipykernel command of {' '.join(own)}"
    env = dict(request["env"])
    env.setdefault("MPLBACKEND", INLINE_BACKEND)
    differ = sorted(k for k in set(env) | set(own_env) if k not in PER_KERNEL and env.get(k) != own_env.get(k))
    return f"environment differs in {', '.join(differ)}" if differ else None


def _interpreter_command() -> list[str]:
    """This Python with its options, as the server was started."""
    return [sys.executable, *sys.orig_argv[1:sys.orig_argv.index("-m")]]


def _send(conn, message: dict) -> None:
    try:
        conn.send(json.dumps(message).encode())
    except OSError:  # the client is gone
        pass


def _run_kernel(request: dict, fds: list[int], start_path0: str) -> None:
    """In the forked child: become the kernel `request` asks for; never returns."""
    code = 1
    try:
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if sys.path and sys.path[0] == start_path0:  # `python -m` put it there; ipykernel_launcher removes it
            del sys.path[0]
        sys.argv = ["ipykernel_launcher", *request["argv"][len(_interpreter_command()) + 2:]]
        if os.environ.get("JPY_PARENT_PID"):  # ipykernel read it when the server imported it
            sys.argv.append(f"--IPKernelApp.parent_handle={int(os.environ['JPY_PARENT_PID'])}")
        from ipykernel import kernelapp

        kernelapp.launch_new_instance()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)  # without tearing down what the server imported


def serve(path: str, modules) -> None:
    os.environ.setdefault("MPLBACKEND", INLINE_BACKEND)
    for name in modules:
        importlib.import_module(name)
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads != 1:  # a fork keeps only the calling thread: what the others held would be lost
        print(f"importing {', '.join(modules)} started {threads - 1} thread(s); not forking", flush=True)
        return
    own_env, start_path0 = dict(os.environ), os.getcwd()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "listener")
    sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
    sel.register(wake_r, selectors.EVENT_READ, "child exited")
    print("ready", flush=True)
    try:
        _serve_requests(sel, listener, wake_r, wake_w, own_env, start_path0)
    finally:
        os.unlink(path)


def _serve_requests(sel, listener, wake_r, wake_w, own_env: dict, start_path0: str) -> None:
    kernel_of: dict = {}  # connection -> pid of its kernel
    connection_of: dict = {}  # pid -> connection
    while True:
        for key, _ in sel.select():
            what = key.data
            if what == "listener":
                conn, _ = listener.accept()
                sel.register(conn, selectors.EVENT_READ, "connection")
            elif what == "stdin":
                if not sys.stdin.readline():  # the caller closed it, or is gone
                    for pid in connection_of:
                        os.kill(pid, signal.SIGKILL)
                    return
            elif what == "child exited":
                os.read(wake_r, 512)
                while connection_of:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    conn = connection_of.pop(pid, None)
                    if conn is not None:
                        kernel_of.pop(conn)
                        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
                        _send(conn, {"signal": sig} if sig else {"exit": os.WEXITSTATUS(status)})
                        if conn in sel.get_map():  # not when its client is already gone
                            sel.unregister(conn)
                        conn.close()
            elif key.fileobj in kernel_of:  # readable only when the client is gone (it was killed)
                conn = key.fileobj
                try:
                    conn.recv(1)
                except OSError:
                    pass
                os.kill(kernel_of[conn], signal.SIGKILL)  # reaped and reported as above
                sel.unregister(conn)
            else:  # a new client's request
                conn = key.fileobj
                request, fds, why = _read_request(conn, own_env)
                if why:
                    _send(conn, {"refused": why})
                    for fd in fds:
                        os.close(fd)
                    sel.unregister(conn)
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for k in list(sel.get_map().values()):
                        if isinstance(k.fileobj, socket.socket):
                            k.fileobj.close()
                    sel.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    _run_kernel(request, fds, start_path0)
                for fd in fds:
                    os.close(fd)
                kernel_of[conn], connection_of[pid] = pid, conn
                _send(conn, {"pid": pid})


def _read_request(conn, own_env: dict) -> tuple[dict | None, list[int], str | None]:
    """The request on `conn`, its three file descriptors, and why it cannot be forked (None: it can)."""
    try:
        message, fds, flags, _ = socket.recv_fds(conn, MESSAGE_MAX, 3)
    except OSError as err:
        return None, [], str(err)
    if flags & socket.MSG_TRUNC:
        return None, fds, f"a request over {MESSAGE_MAX} bytes"
    if len(fds) != 3:
        return None, fds, "a request without standard streams"
    try:
        request = json.loads(message)
        return request, fds, _refusal(request, own_env)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        return None, fds, f"an unreadable request ({type(err).__name__}: {err})"


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
