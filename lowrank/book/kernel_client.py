"""The process jupyter_client starts for a preloaded kernel (lowrank.book.preloaded_kernels).

Run as `python -I -S kernel_client.py SERVER_SOCKET KERNEL_COMMAND...`: standard library only, so
that it starts in milliseconds. It asks the server to fork the kernel with this process's working
folder, environment and standard streams, relays the signals jupyter_client sends it, and exits as
the kernel exits. If the server refuses or cannot be reached, it becomes an ordinary kernel.
"""

import json
import os
import signal
import socket
import sys

RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def main(server: str, command: list) -> None:
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(server)
        request = {"argv": command, "cwd": os.getcwd(), "env": dict(os.environ)}
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
        reply = json.loads(conn.recv(1 << 16) or b'{"refused": "the server closed"}')
    except OSError as err:
        reply = {"refused": str(err)}
    if "pid" not in reply:
        print(f"lowrank: an ordinary kernel starts, not a preloaded one: {reply['refused']}", file=sys.stderr, flush=True)
        os.execv(command[0], command)  # in this process
    pid = reply["pid"]

    def relay(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in RELAYED:
        signal.signal(sig, relay)
    message = conn.recv(1 << 16)  # the kernel's end; retried after a relayed signal (PEP 475)
    if not message:  # the server is gone: do not leave its kernel behind
        relay(signal.SIGKILL, None)
        sys.exit(1)
    ended = json.loads(message)
    if ended.get("signal"):
        signal.signal(ended["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), ended["signal"])
    sys.exit(ended.get("exit", 1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
