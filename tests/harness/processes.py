"""The child processes of a process, read from Linux's /proc (proc(5): ``/proc/PID/stat`` and
``/proc/PID/cmdline``)."""

from __future__ import annotations

import contextlib
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
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            # pid (comm) state ppid ...; comm may contain spaces, so split after its last ")".
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
            if int(ppid) == parent:
                command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(ChildProcess(int(stat.parent.name), state, command.strip()))
    return found
