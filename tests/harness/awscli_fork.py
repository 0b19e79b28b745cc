"""The real AWS CLI v2, started once and forked per call: a fork server for simulated hosts.

A simulated host's boot makes dozens of ``aws`` calls; each start of the CLI imports awscli, botocore and
its customizations again (about half a second). :class:`AwsCliServer` runs one process of the AWS CLI's
own Python (``.tools/aws``, the wheel of aws/aws-cli tag 2.36.7 in ``../shared/awscli-v2/``) that imports
``awscli.clidriver`` once and listens on a Unix socket. A client (:func:`call`, which
``tests/boot/host_aws.py`` runs as a host's ``aws``) sends its argv, environment and working directory,
and its standard input, output and error as file descriptors (``SCM_RIGHTS``). The server forks a child
that takes those descriptors as 0, 1 and 2, that environment and directory, and runs the CLI's own entry
point, ``awscli.clidriver.main()``, as the ``aws`` executable does (aws/aws-cli 2.36.7, ``bin/aws``:
``sys.exit(main())``); the child sends its exit status back, and the client exits with it.

What the child keeps from a fresh start, and why it is the same CLI:
- Every import is the CLI's own code, unchanged; each call builds a new driver and session
  (``create_clidriver()`` in ``main()``), which read the caller's environment then, not at import.
- ``AWS_DATA_PATH``: ``awscli/__init__.py`` (2.36.7) sets it at import from the environment it found,
  adding the CLI's ``data`` folder; the child sets it the same way from the caller's environment.
- Signals: a Python process ignores SIGPIPE (CPython sets ``SIG_IGN`` at start-up), so a CLI whose server
  or reader goes away gets ``EPIPE`` and reports it; the child inherits the server's ``SIG_IGN`` and
  keeps it. SIGCHLD is the default, so the CLI's own subprocesses (a pager, ``credential_process``) can
  be waited for.
- Standard streams: Python's ``sys.stdin``/``stdout``/``stderr`` wrap descriptors 0 to 2, which the child
  replaces; their encoding is UTF-8 (the server runs with ``PYTHONUTF8=1``), as the CLI's under the
  hosts' ``LANG=C.UTF-8``.

``tests/harness/test_aws.py`` checks that calls give the same exit status, output and errors through
the fork server as from the ``aws`` executable.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Self

_HEADER = struct.Struct("!I")

_SERVER_MAIN = r"""
import array, json, os, signal, socket, struct, sys, traceback
os.environ.pop("AWS_DATA_PATH", None)
import awscli
import awscli.clidriver

HEADER = struct.Struct("!I")
DATA = os.path.join(os.path.dirname(os.path.abspath(awscli.__file__)), "data")
awscli.clidriver.create_clidriver()  # imports what every call needs, once

def receive(conn):
    fds = array.array("i")
    data, ancdata, _, _ = conn.recvmsg(HEADER.size, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    (size,) = HEADER.unpack(data)
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise EOFError("client went away")
        body += chunk
    return json.loads(body), list(fds)

def run(conn, request, fds):
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    env = dict(request["env"])
    # bin/aws: an LC_CTYPE of "UTF-8" becomes "en_US.UTF-8". awscli/__init__.py: the caller's AWS_DATA_PATH
    # entries (variables and ~ expanded), then the CLI's data folder.
    if env.get("LC_CTYPE") == "UTF-8":
        env["LC_CTYPE"] = "en_US.UTF-8"
    os.environ.clear()
    os.environ.update(env)
    if "AWS_DATA_PATH" in env:
        paths = [os.path.expanduser(os.path.expandvars(p)) for p in env["AWS_DATA_PATH"].split(os.pathsep)]
    else:
        paths = []
    env["AWS_DATA_PATH"] = os.pathsep.join([*paths, DATA])
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["aws", *request["argv"]]
    try:
        rc = awscli.clidriver.main()
    except SystemExit as exit:
        rc = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        if not isinstance(exit.code, (int, type(None))):
            print(exit.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        rc = 255
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    conn.sendall(HEADER.pack(rc & 0xFF))

listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(64)
listener.settimeout(1.0)
print("ready", flush=True)
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    try:
        conn, _ = listener.accept()
    except TimeoutError:
        if os.getppid() == 1:
            break
        continue
    conn.settimeout(None)
    try:
        request, fds = receive(conn)
    except (EOFError, OSError, ValueError):
        conn.close()
        continue
    pid = os.fork()
    if pid == 0:
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        code = 255
        try:
            run(conn, request, fds)
            code = 0
        finally:
            os._exit(code)
    conn.close()
    for fd in fds:
        os.close(fd)
"""


class AwsCliServer:
    """The fork server: one process of ``python`` (the AWS CLI's venv) listening on :attr:`socket_path`."""

    def __init__(self, python: str | Path) -> None:
        self.python = str(python)
        self._dir = Path(tempfile.mkdtemp(prefix="awscli-fork-"))
        self.socket_path = self._dir / "aws.sock"
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> Self:
        env = {**os.environ, "PYTHONUTF8": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        self._process = subprocess.Popen([self.python, "-c", _SERVER_MAIN, str(self.socket_path)],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=env)
        assert self._process.stdout is not None
        if self._process.stdout.readline().strip() != "ready":
            self.stop()
            raise RuntimeError("the AWS CLI fork server did not start")
        return self

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            if self._process.stdout is not None:
                self._process.stdout.close()
            self._process = None
        self.socket_path.unlink(missing_ok=True)
        self._dir.rmdir()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def call(socket_path: str, argv: list[str]) -> int:
    """Run ``aws argv...`` in the fork server at ``socket_path`` with this process's environment, working
    directory and standard streams; its exit status (255 when the CLI died without one, as the ``aws``
    executable's ``main`` reports an uncaught error)."""
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:  # a closed stream: the CLI gets /dev/null, as a shell's <&- leaves nothing to read
            fds.append(os.open(os.devnull, os.O_RDWR))
    body = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(socket_path)
        conn.sendmsg([_HEADER.pack(len(body))],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
        conn.sendall(body)
        status = b""
        while len(status) < _HEADER.size:
            chunk = conn.recv(_HEADER.size - len(status))
            if not chunk:
                return 255
            status += chunk
    return int(_HEADER.unpack(status)[0])


if __name__ == "__main__":
    sys.exit(call(os.environ["AWSCLI_FORK_SOCKET"], sys.argv[1:]))
