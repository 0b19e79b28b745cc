"""The publisher run as the host runs it: ``publish_metrics.py CONFIG_JSON`` in its own process,
with a fake neuron-monitor printing the recorded reports, fake replicas and a fake router serving
the recorded pages on loopback, and ``NEURON_SERVING_ROOT`` pointing at a temporary directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from emf_spec import metric_values, metrics_produced, parse_lines
from monitorsim import (
    FAKE_NEURON_MONITOR,
    FIXTURES,
    INSTANCE_ID,
    PUBLISHER,
    SERVICE,
    PageServer,
    fixture,
    make_config,
)

from neuron_serving.plan.metrics import EMF_LOG, METRICS, PUBLISHER_SOURCES
from tests.harness.processes import children_of

CONFIG = "/etc/neuron-serving/metrics.json"
INTERVAL = 0.5
WAIT = 8.0
REPORTS = [str(FIXTURES / "neuron-monitor-first.json"), str(FIXTURES / "neuron-monitor-second.json")]
INSTANCE = {"Service": SERVICE, "InstanceId": INSTANCE_ID}


class Host:
    """A temporary root, the fake replicas and router, and the publisher once started."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.servers: list[PageServer] = []
        self.process: subprocess.Popen[bytes] | None = None
        self.stderr = root.parent / "publisher.stderr"

    def serve(self, *pages: str) -> PageServer:
        server = PageServer(*pages)
        self.servers.append(server)
        return server

    def start(self, config: dict[str, Any], env: dict[str, str] | None = None) -> None:
        path = self.root / CONFIG.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config))
        environment = {"PATH": os.environ["PATH"], "SERVICE": SERVICE, "INSTANCE_ID": INSTANCE_ID,
                       "NEURON_SERVING_ROOT": str(self.root), **(env or {})}
        with self.stderr.open("wb") as err:
            self.process = subprocess.Popen([sys.executable, str(PUBLISHER), CONFIG], env=environment,
                                            stdout=subprocess.DEVNULL, stderr=err)

    def events(self) -> list[dict[str, Any]]:
        """The complete lines of the EMF log, checked: a line being written is left for later,
        as a tailing agent does."""
        log = self.root / EMF_LOG.lstrip("/")
        text = log.read_text() if log.exists() else ""
        return parse_lines(text[:text.rfind("\n") + 1])

    def wait_for(self, done: Callable[[list[dict[str, Any]]], bool], timeout: float = WAIT) -> list[dict[str, Any]]:
        """The events written so far, once ``done(events)`` holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None and self.process.poll() is None, self.stderr.read_text()
            events = self.events()
            if done(events):
                return events
            time.sleep(0.05)
        pytest.fail(f"the publisher did not get there in {timeout} s; stderr:\n{self.stderr.read_text()}")

    def children(self) -> list[int]:
        """The publisher's child processes (Linux)."""
        assert self.process is not None
        return [child.pid for child in children_of(self.process.pid)]

    def terminate(self) -> int:
        """SIGTERM, as systemd stops the service; the exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=5)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for server in self.servers:
            server.stop()


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    running = Host(tmp_path / "root")
    running.root.mkdir()
    yield running
    running.close()


def rounds(events: list[dict[str, Any]]) -> int:
    return len({e["_aws"]["Timestamp"] for e in events})


def monitor(*args: str) -> list[str]:
    return [sys.executable, str(FAKE_NEURON_MONITOR), str(INTERVAL), *args]


def test_publishes_every_catalog_metric_for_each_replica_and_the_instance_and_stops_on_sigterm(host: Host) -> None:
    replicas = {name: host.serve(fixture("tgi-first.txt"), fixture("tgi-second.txt"))
                for name in ("replica-0", "replica-1")}
    router = host.serve(fixture("haproxy-metrics.txt"))
    # What the boot's metadata step writes to host.env from the instance metadata.
    host.start(make_config({n: s.port for n, s in replicas.items()}, router.url, monitor(*REPORTS), INTERVAL),
               {"INSTANCE_TYPE": "inf2.24xlarge", "AVAILABILITY_ZONE": "us-east-2a", "CAPACITY": "spot"})

    events = host.wait_for(lambda events: bool(metric_values(events, "EccCorrectedEvents", **INSTANCE)))
    neuron_monitor = host.children()
    assert len(neuron_monitor) == 1
    started = time.monotonic()
    assert host.terminate() == 0
    assert time.monotonic() - started < 2
    assert not any(Path(f"/proc/{pid}").exists() for pid in neuron_monitor)

    events = host.events()
    expected = {(m.name, tuple(sorted(s))) for m in METRICS if m.source in PUBLISHER_SOURCES for s in m.dimension_sets}
    assert {(name, dims) for _, name, dims in metrics_produced(events)} == expected
    for name in replicas:
        replica = {**INSTANCE, "Replica": name}
        assert metric_values(events, "Requests", **replica)[0] == 150
        assert metric_values(events, "QueueSize", **replica)[-1] == 3
    assert metric_values(events, "ExecutionLatency", **INSTANCE, Replica="replica-0")[:2] == [0.0231, 0.0225]
    assert metric_values(events, "ReplicasUp", **INSTANCE)[0] == 2
    assert metric_values(events, "EccCorrectedEvents", **INSTANCE)[0] == 5
    assert 0 < metric_values(events, "DiskUtilization", **INSTANCE)[0] < 100
    # The host counts itself once a round, by its type, zone and purchasing option.
    service = {"Service": INSTANCE["Service"]}
    for dimension, value in (("InstanceType", "inf2.24xlarge"), ("AvailabilityZone", "us-east-2a"),
                             ("Capacity", "spot")):
        assert set(metric_values(events, "Hosts", **service, **{dimension: value})) == {1}


def test_without_neuron_monitor_serving_and_router_metrics_are_still_published(host: Host) -> None:
    replica = host.serve(fixture("tgi-first.txt"), fixture("tgi-second.txt"))
    router = host.serve(fixture("haproxy-metrics.txt"))
    silent = host.serve()  # replica-1 answers 503 to every scrape
    config = make_config({"replica-0": replica.port, "replica-1": silent.port}, router.url,
                         [str(host.root / "no" / "neuron-monitor")], INTERVAL)
    host.start(config)

    events = host.wait_for(lambda events: rounds(events) >= 2)
    assert host.terminate() == 0
    names = {name for _, name, _ in metrics_produced(events)}
    assert {"QueueSize", "Requests", "RequestDuration", "RouterQueue", "ReplicasUp", "DiskUtilization"} <= names
    assert not names & {m.name for m in METRICS if m.source == "neuron"}
    assert "CpuUtilization" not in names
    # Without its type, zone and purchasing option in the environment (a host.env of an older boot), the host
    # is not counted: a Hosts line with an empty dimension would count it apart from the others.
    assert "Hosts" not in names
    assert metric_values(events, "QueueSize", **INSTANCE, Replica="replica-1") == []
    stderr = host.stderr.read_text()
    assert "cannot start neuron-monitor" in stderr
    assert f"no metrics from {silent.url}" in stderr


def test_a_neuron_monitor_that_dies_is_restarted(host: Host) -> None:
    router = host.serve(fixture("haproxy-metrics.txt"))
    interval = 0.3
    host.start(make_config({}, router.url, [sys.executable, str(FAKE_NEURON_MONITOR), str(interval), "--exit",
                                            REPORTS[0]], interval))
    # One report, then silence: rounds go on without Neuron data, until the restarted monitor reports.
    events = host.wait_for(lambda events: len(metric_values(events, "CpuUtilization", **INSTANCE)) >= 2)
    assert host.terminate() == 0
    with_report = {e["_aws"]["Timestamp"] for e in events if "CpuUtilization" in e}
    assert len(with_report) == 2 and rounds(events) > 2


def test_bad_invocations_exit_with_a_message(host: Host) -> None:
    usage = subprocess.run([sys.executable, str(PUBLISHER)], capture_output=True, text=True, timeout=10)
    assert usage.returncode == 2 and "usage" in usage.stderr
    env = {"PATH": os.environ["PATH"], "NEURON_SERVING_ROOT": str(host.root)}
    missing = subprocess.run([sys.executable, str(PUBLISHER), CONFIG], capture_output=True, text=True,
                             timeout=10, env=env)
    assert missing.returncode == 1 and "cannot start" in missing.stderr
    path = host.root / CONFIG.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"namespace": "NeuronServing"}))
    partial = subprocess.run([sys.executable, str(PUBLISHER), CONFIG], capture_output=True, text=True,
                             timeout=10, env={**env, "SERVICE": SERVICE, "INSTANCE_ID": INSTANCE_ID})
    assert partial.returncode == 1 and "the config lacks" in partial.stderr
