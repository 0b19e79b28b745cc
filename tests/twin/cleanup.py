"""What a twin test leaves on the machine, taken back even when the run is killed.

A twin mounts its root (overlay) and its small disks (tmpfs) under pytest's temporary directories and
boots inside a named network namespace; a run stopped by SIGTERM (CI's timeout) or SIGINT would leave
all of them, and a later ``rm -rf`` of the tree walks into the mounts. So:

- :func:`on_signals` (held by the session's fixture) makes SIGTERM and SIGINT run the cleanups
  registered with :func:`on_signal` (twins killed, mounts and namespaces gone) before the signal takes
  its course. Signal handlers belong to a process: each pytest-xdist worker, a process of its own,
  holds its own.
- :func:`reap` (at the session's start) takes back what runs killed without a chance to clean up
  (SIGKILL) left: the namespaces and mounts whose names carry the pid of a process that is gone.

Everything this harness makes is named after the process that made it (:func:`owned`), and nothing
else is ever touched.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType

NETNS_DIR = Path("/run/netns")
"""Where ``ip netns add`` makes a namespace's name (iproute2, ip/ipnetns.c: ``NETNS_RUN_DIR``)."""

NAMESPACE = re.compile(r"twin(\d+)-\d+")
"""A twin's network namespace: ``twin<pid>-<n>`` (tests/twin/conftest.py)."""

MOUNT = re.compile(r"twin-(?:root|disk)-(\d+)")
"""The source of a twin's overlay root or tmpfs disk, from :func:`owned`."""

MOUNT_TYPES = ("overlay", "tmpfs")

_cleanups: list[Callable[[], None]] = []
_previous: dict[int, signal._HANDLER] = {}


def owned(kind: str) -> str:
    """The source name of a mount of this process's twins (``mount -t TYPE SOURCE``): the pid in it
    tells :func:`reap` whether the run that made it is still there."""
    return f"twin-{kind}-{os.getpid()}"


@contextmanager
def on_signal(cleanup: Callable[[], None]) -> Iterator[None]:
    """``cleanup`` runs if SIGTERM or SIGINT arrives inside the block (the latest registered first)."""
    _cleanups.append(cleanup)
    try:
        yield
    finally:
        if cleanup in _cleanups:
            _cleanups.remove(cleanup)


@contextmanager
def on_signals(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """Inside the block, ``signums`` first run the registered cleanups, then do what they did before:
    the default action (SIGTERM's: the process ends by the signal, as its killer expects) or the
    previous handler (SIGINT's is Python's, whose KeyboardInterrupt pytest reports)."""
    installed = []
    for signum in signums:
        # An ignored signal stays ignored: a shell starts a background job with SIGINT ignored
        # (bash(1), "COMMAND EXECUTION ENVIRONMENT"), and Python then leaves it so (signal(2) SIG_IGN
        # survives execve); such a run does not stop on it, so nothing is to be cleaned up.
        if signal.getsignal(signum) == signal.SIG_IGN:
            continue
        previous = signal.signal(signum, _stop)
        # None: a handler not installed from Python; the default is the nearest we can put back.
        _previous[signum] = signal.SIG_DFL if previous is None else previous
        installed.append(signum)
    try:
        yield
    finally:
        for signum in installed:
            signal.signal(signum, _previous.pop(signum))


def _stop(signum: int, frame: FrameType | None) -> None:
    # A second signal (a second Ctrl-C, the killer's retry) must not cut the cleanups short.
    for other in _previous:
        signal.signal(other, signal.SIG_IGN)
    while _cleanups:
        cleanup = _cleanups.pop()
        try:
            cleanup()
        except Exception as error:  # the others must run all the same
            print(f"twin cleanup {cleanup!r} failed on signal {signum}: {error!r}", file=sys.stderr)
    for other, handler in _previous.items():
        signal.signal(other, handler)
    previous = _previous[signum]
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        os.kill(os.getpid(), signum)


def alive(pid: int) -> bool:
    """Signal 0 checks that ``pid`` exists (kill(2)); EPERM says it does, owned by someone else."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def reap() -> None:
    """Takes back the namespaces and mounts of twins whose process is gone: the processes left inside
    such a namespace (an orphaned twin's systemd, the servers its test started there) are killed, the
    namespace deleted, and the mounts lazily unmounted. A pid is read in this process's PID namespace:
    runs that share /run/netns must share that too (as runs on one machine do, containers may not)."""
    for name in stale_namespaces():
        # `ip netns pids NAME`: the processes whose network namespace it is (ip-netns(8)).
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False)
        for pid in pids.stdout.split():
            with suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
    # Deepest first: a twin's disks are mounted inside its root.
    for point in sorted(stale_mounts(), key=lambda p: len(p.parts), reverse=True):
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)


def stale_namespaces() -> list[str]:
    """The twins' network namespaces whose process is gone."""
    names = sorted(p.name for p in NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else []
    return [n for n in names if (m := NAMESPACE.fullmatch(n)) and not alive(int(m.group(1)))]


def stale_mounts() -> list[Path]:
    """The mount points of the twins' overlay roots and tmpfs disks whose process is gone."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # proc_pid_mountinfo(5): ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER
        fields, _, filesystem = line.partition(" - ")
        kind, source = filesystem.split(" ")[:2]
        if kind in MOUNT_TYPES and (m := MOUNT.fullmatch(source)) and not alive(int(m.group(1))):
            points.append(Path(_unescape(fields.split(" ")[4])))
    return points


def _unescape(field: str) -> str:
    """A mountinfo path: the kernel writes space, tab, newline and backslash as octal escapes
    (linux, fs/proc_namespace.c, ``show_mountinfo``: ``seq_path_root(m, ..., " \\t\\n\\\\")``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
