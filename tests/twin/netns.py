"""Network namespaces the test makes itself, and moving the test's own thread into one.

A twin boots inside a namespace of its own (``ip netns add``, iproute2), with only loopback and the
metadata service's link-local address on it. The fakes it talks to (the metadata service, moto,
the recorder, the Hub, the replicas) are started by the test *from inside that namespace*: the test's
thread enters it with ``setns(2)`` (which moves the calling thread only, and which the threads and
processes it then starts inherit), so every listening socket they open is on the twin's loopback,
and the test itself reaches them there. Nothing in a twin's namespace can reach any other network.
Python 3.11 has no ``os.setns`` (3.12 does): libc's ``setns`` through ctypes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

CLONE_NEWNET = 0x40000000
"""linux/sched.h: the namespace type ``setns`` is asked to join."""

METADATA_ADDRESS = "169.254.169.254"
"""The instance metadata service's address (EC2 user guide, "Access instance metadata")."""

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"setns: {os.strerror(error)}")


class NetNs:
    """A named network namespace (``/run/netns/<name>``) with loopback up and the metadata address on it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = f"/run/netns/{name}"

    def create(self) -> NetNs:
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", self.name, "addr", "add", f"{METADATA_ADDRESS}/32", "dev", "lo"], check=True)
        return self

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, check=False)

    @contextmanager
    def entered(self) -> Iterator[None]:
        """The calling thread in this namespace inside the block, back in its own after it."""
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(self.path, os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield
            finally:
                _setns(own)
        finally:
            os.close(target)
            os.close(own)
