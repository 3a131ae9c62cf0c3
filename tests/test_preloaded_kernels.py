"""Kernels forked from a server with the pages' libraries imported (lowrank.book.preloaded_kernels)
against ordinary kernels: the same state, signals and ends, and an ordinary kernel whenever the
server cannot stand in for one."""

import asyncio
import json
import os
import re
from pathlib import Path

import pytest

from lowrank.book import notebooks
from lowrank.book.preloaded_kernels import PreloadedKernels, ServerFailed

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).parent / "fixtures" / "notebooks"
NOTHING = ()  # a server that imports nothing in advance starts in a fraction of a second: for the mechanism


@pytest.fixture
def fixtures(monkeypatch):
    monkeypatch.setattr(notebooks, "NOTEBOOK_ROOT", FIXTURES)


def _state(path: Path) -> tuple[dict, list]:
    """The kernel state printed by fixture/kernel_state, and the output types of its figure cell."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    text = "".join(o.get("text", "") for o in code[-2].outputs if o.output_type == "stream")
    return json.loads(text), [sorted(o.get("data", {})) for o in code[-1].outputs]


def test_a_forked_kernel_has_the_state_of_an_ordinary_kernel(fixtures, tmp_path, monkeypatch):
    """The same working folder, import path, environment (but the per-kernel variables), matplotlib
    backend with its inline display, threads and sums, for the first and a later fork."""
    monkeypatch.setenv("LOWRANK_FIGURE_DIR", str(tmp_path / "figures"))  # a per-kernel variable
    with PreloadedKernels() as kernels:  # here: pytest changes PYTEST_CURRENT_TEST between phases
        for k in range(2):
            notebooks.execute("fixture/kernel_state", tmp_path / f"forked{k}.ipynb", figure_dir=tmp_path / "f1",
                              kernels=kernels)
    notebooks.execute("fixture/kernel_state", tmp_path / "ordinary.ipynb", figure_dir=tmp_path / "f2")
    (forked, forked_figure), (second, _) = _state(tmp_path / "forked0.ipynb"), _state(tmp_path / "forked1.ipynb")
    ordinary, ordinary_figure = _state(tmp_path / "ordinary.ipynb")
    assert forked["sums"] == second["sums"] == ordinary["sums"]
    assert forked["preloaded"] and forked["ppid"] == kernels.process.pid
    assert not ordinary["preloaded"] and ordinary["ppid"] == os.getpid()
    for key in ("cwd", "path", "backend", "threads"):
        assert forked[key] == ordinary[key], key
    assert forked["cwd"] == str(FIXTURES / "fixture")
    assert forked["env"]["LOWRANK_FIGURE_DIR"] == str((tmp_path / "f1").resolve())
    assert ordinary["env"]["LOWRANK_FIGURE_DIR"] == str((tmp_path / "f2").resolve())
    different = {k for k in forked["env"].keys() | ordinary["env"].keys() if forked["env"].get(k) != ordinary["env"].get(k)}
    assert different == {"LOWRANK_FIGURE_DIR"}
    options = [[a for a in state["argv"] if not a.endswith(".json")] for state in (forked, ordinary)]
    assert options[0] == options[1] + [f"--IPKernelApp.parent_handle={os.getpid()}"]
    assert forked_figure == ordinary_figure == [["image/png", "text/plain"]]  # the inline backend works


def test_a_page_computes_bit_for_bit_what_it_computes_in_an_ordinary_kernel(tmp_path, monkeypatch):
    """A real page, forked after another kernel and in an ordinary kernel: its verdicts, figure data and
    SVGs (but their time stamps) identical to the last bit."""
    name = "gradients/real_data"
    with PreloadedKernels() as kernels:
        with monkeypatch.context() as m:
            m.setattr(notebooks, "NOTEBOOK_ROOT", FIXTURES)
            notebooks.execute("fixture/kernel_state", tmp_path / "before.ipynb", kernels=kernels)
        forked = notebooks.execute(name, tmp_path / "forked.ipynb", figure_dir=tmp_path / "forked", kernels=kernels)
    ordinary = notebooks.execute(name, tmp_path / "ordinary.ipynb", figure_dir=tmp_path / "ordinary")
    assert forked == ordinary and forked
    import nbformat

    verdicts = [notebooks.verdicts(nbformat.read(tmp_path / f"{k}.ipynb", as_version=4)) for k in ("forked", "ordinary")]
    assert verdicts[0] == verdicts[1] and verdicts[0]
    files = [{p.name: re.sub(r"<dc:date>[^<]*</dc:date>", "", p.read_text()) for p in (tmp_path / k).iterdir()
              if p.suffix in (".csv", ".svg")} for k in ("forked", "ordinary")]
    assert files[0] == files[1] and {p.rsplit(".")[-1] for p in files[0]} == {"csv", "svg"}


def test_another_environment_gets_an_ordinary_kernel(fixtures, tmp_path, monkeypatch, capfd):
    """What the server imported was imported in its own environment: a kernel asked for in another
    one (here a variable more) is not forked, and says why."""
    with PreloadedKernels(NOTHING) as kernels:
        monkeypatch.setenv("LOWRANK_TEST_ONLY", "1")
        notebooks.execute("fixture/kernel_state", tmp_path / "out.ipynb", kernels=kernels)
    state, _ = _state(tmp_path / "out.ipynb")
    assert not state["preloaded"] and state["ppid"] == os.getpid() and state["env"]["LOWRANK_TEST_ONLY"] == "1"
    assert "not a preloaded one: environment differs in LOWRANK_TEST_ONLY" in capfd.readouterr().err


def test_a_gone_server_gives_an_ordinary_kernel(fixtures, tmp_path):
    server = PreloadedKernels(NOTHING)
    server.close()
    notebooks.execute("fixture/kernel_state", tmp_path / "out.ipynb", kernels=server)
    assert _state(tmp_path / "out.ipynb")[0]["ppid"] == os.getpid()  # started by jupyter_client, not forked


async def _kernel_session(kernels, work):
    manager = notebooks._kernel_manager_class(notebooks.kernel_file_prefix(os.urandom(4).hex()), kernels)()
    await manager.start_kernel()
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        return await work(manager, client)
    finally:
        client.stop_channels()


async def _run(client, code: str, timeout: float = 60) -> dict:
    """Execute `code`; its reply content and the pid of the kernel that ran it (printed first)."""
    msg_id = client.execute("import os; print(os.getpid(), flush=True)\n" + code)
    pid = None
    while True:
        msg = await client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream" and pid is None:
            pid = int(msg["content"]["text"].split()[0])
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" \
                and msg["content"]["execution_state"] == "idle":
            break
    reply = await client.get_shell_msg(timeout=timeout)
    return {"pid": pid, **reply["content"]}


def test_interrupt_kill_and_shutdown_reach_the_forked_kernel():
    async def work(manager, client):
        task = asyncio.ensure_future(_run(client, "import time; time.sleep(600)"))  # _run waits 60 s at most
        await asyncio.sleep(2)
        await manager.interrupt_kernel()  # a signal to the client, relayed
        reply = await task
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
        kernel = reply["pid"]
        assert kernel != manager.provisioner.process.pid and notebooks._alive(kernel)
        assert (await _run(client, "x = 1"))["status"] == "ok"  # it lives on
        await manager.shutdown_kernel(now=True)  # SIGKILL to the client: the server kills the kernel
        for _ in range(100):
            if not notebooks._alive(kernel):
                break
            await asyncio.sleep(0.1)
        assert not notebooks._alive(kernel)

    async def polite(manager, client):
        kernel = (await _run(client, "pass"))["pid"]
        process = manager.provisioner.process
        await manager.shutdown_kernel()  # a shutdown request: the kernel exits, then its client
        assert process.poll() == 0 and not notebooks._alive(kernel)

    with PreloadedKernels(NOTHING) as kernels:
        asyncio.run(_kernel_session(kernels, work))
        asyncio.run(_kernel_session(kernels, polite))  # the server still serves after a kill



def test_closing_the_server_kills_its_kernels_and_removes_its_socket():
    kernels = PreloadedKernels(NOTHING)

    async def work(manager, client):
        kernel = (await _run(client, "pass"))["pid"]
        kernels.close()
        for _ in range(100):
            if not notebooks._alive(kernel):
                break
            await asyncio.sleep(0.1)
        assert not notebooks._alive(kernel) and not kernels.folder.exists()
        await manager.shutdown_kernel(now=True)

    asyncio.run(_kernel_session(kernels, work))


def test_a_server_whose_imports_start_a_thread_refuses_to_start(tmp_path, monkeypatch):
    """A fork keeps only the forking thread, so the server refuses to fork at all."""
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(ServerFailed, match="started 1 thread"):
        PreloadedKernels(modules=("starts_a_thread",))
    with pytest.raises(ServerFailed, match="exited with status 1"):
        PreloadedKernels(modules=("no_such_module_here",))


def test_a_bad_request_is_refused_and_the_server_serves_on(fixtures, tmp_path):
    import socket

    def ask(payload: bytes, fds=()) -> dict:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(str(kernels.path))
        socket.send_fds(conn, [payload], list(fds)) if fds else conn.send(payload)
        reply = json.loads(conn.recv(1 << 16))
        conn.close()
        return reply

    with PreloadedKernels(NOTHING) as kernels:
        assert "without standard streams" in ask(b"{}")["refused"]
        assert "over 65536 bytes" in ask(b"x" * 70_000, [0, 1, 2])["refused"]
        assert "unreadable" in ask(b"not json", [0, 1, 2])["refused"]
        assert "not an ipykernel command" in ask(json.dumps({"argv": ["sh"], "cwd": "/", "env": {}}).encode(), [0, 1, 2])["refused"]
        notebooks.execute("fixture/kernel_state", tmp_path / "out.ipynb", kernels=kernels)
        assert _state(tmp_path / "out.ipynb")[0]["ppid"] == kernels.process.pid  # forked
