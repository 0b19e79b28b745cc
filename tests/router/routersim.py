"""The router under test: the real HAProxy binary running the rendered config in front of fake TGI
replicas (fake_tgi.py) or fake vLLM servers (fake_vllm.py), all on loopback ports picked per test
(fixtures in conftest.py)."""

from __future__ import annotations

import contextlib
import csv
import http.client
import io
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fake_tgi import FakeTgi
from fake_vllm import FakeVllm
from recording import RecordingRelay

from benchmarks.router import free_port_block
from neuron_serving.plan import ServingPlan, ServingRequest, plan_serving
from neuron_serving.plan.engines import Engine, engine
from neuron_serving.plan.engines.vllm import VllmServer
from neuron_serving.render.router import ROUTER_USER, render_router_config

TEST_CHECK_INTERVAL_MS = 200
"""Health check interval in tests: state changes are confirmed within a second instead of the
production interval's several seconds. Everything else in the config is the production one."""

STARTUP_TIMEOUT = 10.0
STATE_TIMEOUT = 5.0
REQUEST_TIMEOUT = 10.0

PLANS: dict[int, tuple[str, int]] = {
    1: ("inf2.xlarge", 2),
    3: ("inf2.24xlarge", 4),
    12: ("inf2.48xlarge", 2),
}
"""Instance type and tensor-parallel degree that give each replica count."""

MISSING_HAPROXY = "install Debian's haproxy (apt-get install haproxy): the router tests run the real binary"


def make_plan(replicas: int, router_port: int = 8080, first_replica_port: int = 8081) -> ServingPlan:
    """A plan with ``replicas`` replicas of a small model."""
    instance_type, degree = PLANS[replicas]
    plan = plan_serving(ServingRequest("llama-3.2-1b", instance_type, tensor_parallel=degree,
                                       router_port=router_port, first_replica_port=first_replica_port))
    assert len(plan.replicas) == replicas
    return plan


def find_haproxy() -> str | None:
    """HAProxy on ``PATH``, else Debian's ``/usr/sbin/haproxy`` (not on a normal user's PATH)."""
    found = shutil.which("haproxy")
    if found is None and os.access("/usr/sbin/haproxy", os.X_OK):
        found = "/usr/sbin/haproxy"
    return found


def run_as_user() -> str | None:
    """HAProxy can only drop to the ``haproxy`` user when started as root."""
    return ROUTER_USER if os.geteuid() == 0 else None


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def replica(self) -> str | None:
        """The fake replica that answered, or ``None`` when HAProxy answered itself."""
        return self.headers.get("x-replica")


def http_request(port: int, method: str, path: str, payload: dict[str, Any] | None = None,
                 timeout: float = REQUEST_TIMEOUT, headers: dict[str, str] | None = None) -> Response:
    """One request to 127.0.0.1:``port`` on its own connection, with ``headers`` besides."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        body = json.dumps(payload).encode() if payload is not None else None
        headers = {**({"Content-Type": "application/json"} if body is not None else {}), **(headers or {})}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def bearer(key: str) -> dict[str, str]:
    """The ``Authorization`` header that carries ``key``."""
    return {"Authorization": f"Bearer {key}"}


def generate(max_new_tokens: int = 1) -> dict[str, Any]:
    """A TGI ``/generate`` request body."""
    return {"inputs": "Hello", "parameters": {"max_new_tokens": max_new_tokens}}


@dataclass
class Router:
    """A running HAProxy with its fake replicas."""

    plan: ServingPlan
    replicas: dict[str, FakeTgi]
    process: subprocess.Popen[bytes]
    metrics_port: int
    log_path: Path
    recorders: dict[str, RecordingRelay] = field(default_factory=dict)
    """With ``record``, each replica's recording relay, by replica name."""

    @property
    def port(self) -> int:
        return self.plan.router_port

    def request(self, method: str, path: str, payload: dict[str, Any] | None = None,
                timeout: float = REQUEST_TIMEOUT, headers: dict[str, str] | None = None) -> Response:
        return http_request(self.port, method, path, payload, timeout, headers)

    def stats(self) -> list[dict[str, str]]:
        """HAProxy's CSV statistics, one row per frontend, backend and server."""
        resp = http_request(self.metrics_port, "GET", "/stats;csv", timeout=2)
        assert resp.status == 200, resp
        text = resp.body.decode().lstrip("# ")
        return list(csv.DictReader(io.StringIO(text)))

    def server_states(self) -> dict[str, str]:
        """``replica-N`` -> ``UP``, ``DOWN``, ``UP 1/3`` (going down), ``DOWN 1/2`` (going up)."""
        return {row["svname"]: row["status"] for row in self.stats()
                if row["pxname"] == "replicas" and row["svname"] not in ("FRONTEND", "BACKEND")}

    def backend_stats(self) -> dict[str, str]:
        """The backend's totals: ``wretr`` retries, ``wredis`` redispatches, and so on."""
        return next(row for row in self.stats() if row["pxname"] == "replicas" and row["svname"] == "BACKEND")

    def wait_for_states(self, expected: dict[str, str], timeout: float = STATE_TIMEOUT) -> None:
        """Wait until each named replica has the given state; fail with the last states seen."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            self.check_alive()
            states = self.server_states()
            if all(states.get(name) == state for name, state in expected.items()):
                return
            time.sleep(0.05)
        pytest.fail(f"replicas did not reach {expected} within {timeout} s; last seen {states}")

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            pytest.fail(f"haproxy exited with {self.process.returncode}:\n{self.log_path.read_text()}")

    def wait_for_log(self, text: str, count: int, timeout: float = 5.0) -> str:
        """The log once it has ``count`` lines with ``text``: HAProxy writes a request's line when
        the stream ends, which may be just after the client has its response, and a stop then may
        come first. Fails the test with the log when the lines do not come within ``timeout``."""
        deadline = time.monotonic() + timeout
        while (log := self.log_path.read_text()).count(text) < count:
            if time.monotonic() > deadline:
                pytest.fail(f"{count} log lines with {text!r} not written within {timeout} s:\n{log}")
            time.sleep(0.05)
        return log

    def stop(self) -> None:
        """Stop HAProxy, then the fakes; safe to call more than once."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        for recorder in self.recorders.values():
            recorder.stop()
        for fake in self.replicas.values():
            fake.stop()


def launch_router(haproxy: str, workdir: Path, replicas: int = 3, token_delay: float = 0.0,
                 serving: Engine | None = None, record: bool = False,
                 edit_config: Callable[[str], str] | None = None, **render_kwargs: Any) -> Router:
    """Fakes for every replica of an n-replica plan (of ``serving``'s kind: TGI by default), and
    HAProxy in front of them (the config rendered for that engine), serving. ``edit_config``
    changes the rendered config first: only to shorten a timeout a test waits for.

    With ``record``, each fake listens on a port of its own behind a :class:`RecordingRelay` on the
    replica's port, which records every byte the router sends it (``Router.recorders``).

    The caller must ``stop()`` the result; if starting fails, everything started is stopped.
    """
    # Ports: the router, one per replica, then metrics; with record, then one per fake.
    base = free_port_block(replicas + 2 + (replicas if record else 0))
    plan = make_plan(replicas, router_port=base, first_replica_port=base + 1)
    metrics_port = base + replicas + 1
    render_kwargs.setdefault("health_check_interval_ms", TEST_CHECK_INTERVAL_MS)
    serving = serving or engine("tgi")
    config = render_router_config(plan, serving, metrics_port=metrics_port, user=run_as_user(), **render_kwargs)
    if edit_config is not None:
        config = edit_config(config)
    config_path = workdir / f"haproxy-{base}.cfg"
    config_path.write_text(config)
    log_path = workdir / f"haproxy-{base}.log"

    # Every engine that runs vLLM's OpenAI server (vllm, nxdi) is played by the vLLM fake.
    fake = FakeVllm if isinstance(serving, VllmServer) else FakeTgi
    fake_ports = {r.name: metrics_port + 1 + i if record else r.port for i, r in enumerate(plan.replicas)}
    fakes = {r.name: fake(r.name, fake_ports[r.name], token_delay) for r in plan.replicas}
    recorders = {r.name: RecordingRelay(r.port, fake_ports[r.name], serving.health_path)
                 for r in plan.replicas} if record else {}
    router: Router | None = None
    try:
        for fake in fakes.values():
            fake.start()
        for recorder in recorders.values():
            recorder.start()
        with log_path.open("wb") as log:
            process = subprocess.Popen([haproxy, "-db", "-f", str(config_path)],
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        router = Router(plan, fakes, process, metrics_port, log_path, recorders)
        _wait_until_serving(router)
    except BaseException:
        if router is not None:
            router.stop()
        for recorder in recorders.values():
            recorder.stop()
        for fake in fakes.values():
            fake.stop()
        raise
    return router


@contextlib.contextmanager
def router_launcher(haproxy: str, workdir: Path) -> Iterator[Callable[..., Router]]:
    """``launch(replicas=3, token_delay=0.0, serving=None, record=False, **render_kwargs)``: :func:`launch_router`
    in ``workdir``; every router launched (HAProxy and its fakes) is stopped when the block ends,
    however it ends."""
    started: list[Router] = []

    def launch(*args: Any, **kwargs: Any) -> Router:
        router = launch_router(haproxy, workdir, *args, **kwargs)
        started.append(router)
        return router

    try:
        yield launch
    finally:
        for router in started:
            router.stop()


def _wait_until_serving(router: Router) -> None:
    """Wait until HAProxy answers and every replica has passed a health check. Before its first
    check a replica shows ``UP 1/3``: up, but out at the first failure."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        router.check_alive()
        with contextlib.suppress(OSError, http.client.HTTPException):
            states = router.server_states()
            if states and all(state == "UP" for state in states.values()):
                return
        time.sleep(0.05)
    pytest.fail(f"haproxy not serving within {STARTUP_TIMEOUT} s:\n{router.log_path.read_text()}")
