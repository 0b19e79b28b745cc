"""The real router for the benchmarks: Debian's HAProxy running the config that
:func:`neuron_serving.render.router.render_router_config` renders, on loopback ports.

The changes to the shipped config: HAProxy keeps the user that starts it and logs to its standard
output, which goes to a file. :func:`round_robin` makes the benchmarks' baseline from it.
"""

from __future__ import annotations

import asyncio
import csv
import io
import os
import random
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

from neuron_serving.plan import ServingPlan, ServingRequest, plan_serving
from neuron_serving.plan.engines import engine
from neuron_serving.render.router import render_router_config

from .load import get

MISSING_HAPROXY = "install Debian's haproxy (apt-get install haproxy): the benchmarks run the real router"

LOG_TARGET = "stdout format raw"

BACKEND = "replicas"
"""The backend of the rendered config that holds the replicas."""


def find_haproxy() -> str:
    """HAProxy on ``PATH``, else Debian's ``/usr/sbin/haproxy``."""
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None)
    if found is None:
        raise RuntimeError(MISSING_HAPROXY)
    return found


def free_port_block(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports, below the kernel's ephemeral range
    (which starts at 32768) so that outgoing connections cannot take one meanwhile."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - count)
        if all(_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no block of {count} free ports between 20000 and 32000")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def make_plan(model_id: str, instance_type: str, batch_size: int, router_port: int) -> ServingPlan:
    """The planner's layout of ``model_id`` on ``instance_type``, its ports from ``router_port`` on."""
    return plan_serving(ServingRequest(model_id, instance_type, batch_size=batch_size, router_port=router_port,
                                       first_replica_port=router_port + 1))


def shipped_config(plan: ServingPlan, metrics_port: int) -> str:
    """What a host running ``plan`` with TGI gets, but for the user and the log target."""
    return render_router_config(plan, engine("tgi"), metrics_port=metrics_port, user=None,
                                log_target=LOG_TARGET)


def round_robin(plan: ServingPlan, metrics_port: int) -> str:
    """The baseline a naive router would be: the shipped config with ``balance roundrobin`` and
    each replica sent up to TGI's ``MAX_CONCURRENT_REQUESTS`` (128) requests at once, so that
    requests queue inside the replicas, in the order they were dealt."""
    config = render_router_config(plan, engine("tgi"), metrics_port=metrics_port, user=None,
                                  log_target=LOG_TARGET,
                                  max_concurrent_per_replica=engine("tgi").max_concurrent_requests)
    baseline, count = re.subn(r"^(\s*)balance \S+$", r"\1balance roundrobin", config, flags=re.MULTILINE)
    if count != 1:
        raise RuntimeError(f"expected one balance line in the rendered config, found {count}")
    return baseline


class Router:
    """HAProxy running ``config`` (written to ``workdir``) until :meth:`stop`."""

    def __init__(self, config: str, workdir: Path, metrics_port: int) -> None:
        self.metrics_port = metrics_port
        self.config_path = workdir / f"haproxy-{metrics_port}.cfg"
        self.config_path.write_text(config)
        self.output = workdir / f"haproxy-{metrics_port}.out"
        self._process: subprocess.Popen[bytes] | None = None

    async def start(self, timeout: float = 15.0) -> None:
        """Start HAProxy and wait until every server has passed its first health check."""
        with self.output.open("wb") as out:
            self._process = subprocess.Popen([find_haproxy(), "-db", "-f", str(self.config_path)],
                                             stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self._process.returncode}: {self.output.read_text()}")
            try:
                states = await self.server_states()
            except (OSError, ValueError, TimeoutError):
                states = {}
            if states and all(state == "UP" for state in states.values()):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"haproxy not serving within {timeout} s: {self.output.read_text()}")

    async def stats(self) -> list[dict[str, str]]:
        """HAProxy's CSV statistics, one row per proxy and server."""
        status, data = await get(self.metrics_port, "/stats;csv", timeout=2)
        if status != 200:
            raise ValueError(f"stats answered {status}")
        return list(csv.DictReader(io.StringIO(data.decode().lstrip("# "))))

    async def server_states(self) -> dict[str, str]:
        """``replica-N`` -> ``UP``, ``DOWN``, ``UP 1/3`` (going down)... of the replicas' backend."""
        return {row["svname"]: row["status"] for row in await self.stats()
                if row["pxname"] == BACKEND and row["svname"] not in ("FRONTEND", "BACKEND")}

    async def backend(self) -> dict[str, str]:
        """The replicas' backend totals: ``wretr`` retries, ``wredis`` redispatches..."""
        return next(row for row in await self.stats() if row["pxname"] == BACKEND and row["svname"] == "BACKEND")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
