"""The child processes of a process, read from Linux's /proc (proc(5): ``/proc/PID/stat`` and
``/proc/PID/cmdline``)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ChildProcess:
    pid: int
    state: str
    """proc(5)'s one-letter state: ``Z`` for a zombie (exited, not yet reaped)."""
    command: str
    """The command line, its arguments joined by spaces."""


def children_of(parent: int) -> list[ChildProcess]:
    """Every process whose parent is ``parent``, zombies included."""
    found = []
    # Listed, then each read on its own: a process may exit between the two, and pathlib's glob
    # raises for a /proc/PID that vanished under it (ProcessLookupError, ESRCH, which Python 3.11's
    # pathlib does not ignore), where a read below is simply skipped.
    for pid in filter(str.isdigit, os.listdir("/proc")):
        stat = Path("/proc", pid, "stat")
        with contextlib.suppress(OSError, IndexError):
            # pid (comm) state ppid ...; comm may contain spaces, so split after its last ")".
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
            if int(ppid) == parent:
                command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(ChildProcess(int(stat.parent.name), state, command.strip()))
    return found
