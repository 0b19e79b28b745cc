"""The metrics publisher under test (userdata/publish_metrics.py) and its inputs: the recorded
neuron-monitor reports, TGI and HAProxy pages of monitor_fixtures/, the publisher's config as the
catalog defines it, and loopback HTTP servers that serve recorded pages.

The publisher is a standalone host script, not a module of the package: it is loaded from its
file, as the host runs it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

from emf_spec import check_event, metric_values

from neuron_serving.plan.engines import ENGINES, Engine
from neuron_serving.plan.metrics import DEFAULT_NAMESPACE, EMF_LOG, INTERVAL_SECONDS, published_metrics

REPO = Path(__file__).resolve().parents[2]
PUBLISHER = REPO / "userdata" / "publish_metrics.py"
FIXTURES = Path(__file__).resolve().parent / "monitor_fixtures"
FAKE_NEURON_MONITOR = FIXTURES / "fake_neuron_monitor.py"

SERVICE = "llama-serving"
INSTANCE_ID = "i-0123456789abcdef0"
REPLICAS = {"replica-0": 8081, "replica-1": 8082}
"""The replicas of the fixtures' host: the neuron-monitor reports have runtimes of both tags."""
BACKEND = "replicas"
TGI = ENGINES["tgi"]
PAGES = {"tgi": ("tgi-first.txt", "tgi-second.txt"), "vllm": ("vllm-first.txt", "vllm-second.txt"),
         "nxdi": ("vllm-first.txt", "vllm-second.txt")}
"""Each engine's two recorded (or generated) /metrics pages of one replica, one interval apart. ``nxdi``
serves vLLM 0.13.0, whose families that the publisher reads (ReplicaMetrics of neuron_serving.plan.engines.vllm)
have the names, types, help texts, labels and buckets of 0.11.0's (vllm/v1/metrics/loggers.py of both
PyPI wheels differ there in code formatting only), and whose HTTP instrumentator excludes the same handlers
(0.13.0 vllm/entrypoints/serve/instrumentator/metrics.py, 0.11.0 vllm/entrypoints/openai/api_server.py)."""


def load_publisher() -> ModuleType:
    """``publish_metrics.py`` as a module (once per session)."""
    module = sys.modules.get("publish_metrics")
    if module is None:
        spec = importlib.util.spec_from_file_location("publish_metrics", PUBLISHER)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        # Registered first: dataclasses and NamedTuples look their module up while it runs.
        sys.modules["publish_metrics"] = module
        spec.loader.exec_module(module)
    return module


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def report(which: str) -> dict[str, Any]:
    """A recorded neuron-monitor report: ``first``, or ``second`` one period later."""
    loaded: dict[str, Any] = json.loads(fixture(f"neuron-monitor-{which}.json"))
    return loaded


def catalog_metrics(engine: Engine = TGI) -> dict[str, dict[str, Any]]:
    """The config's ``metrics`` map, as the catalog defines it for ``engine``."""
    return {m.name: {"unit": m.unit, "dimensions": [list(s) for s in m.dimension_sets]}
            for m in published_metrics(engine)}


def make_config(replicas: dict[str, int] | None = None, router_url: str = "http://127.0.0.1:8404/metrics",
                neuron_monitor: list[str] | None = None, interval: float = INTERVAL_SECONDS,
                metrics: dict[str, dict[str, Any]] | None = None, engine: Engine = TGI) -> dict[str, Any]:
    """The publisher's config, in the schema the renderer writes, for replicas of ``engine``."""
    return {
        "namespace": DEFAULT_NAMESPACE,
        "interval_seconds": interval,
        "output": EMF_LOG,
        "neuron_monitor": neuron_monitor or ["/opt/aws/neuron/bin/neuron-monitor", "-c",
                                             "/etc/neuron-serving/neuron-monitor.json"],
        "replicas": [{"name": n, "port": p} for n, p in (REPLICAS if replicas is None else replicas).items()],
        "replica_metrics": engine.metrics.to_json(),
        "router_metrics_url": router_url,
        "router_backend": BACKEND,
        "router_frontend": "router",
        "disk_path": "/",
        "metrics": catalog_metrics(engine) if metrics is None else metrics,
    }


REPLICA_DIMENSIONS = {"Service": SERVICE, "InstanceId": INSTANCE_ID, "Replica": "replica-0"}


def scrape(pub: Any, page: str | None, now_ms: int = 1_000) -> list[dict[str, Any]]:
    """One round with only replica-0's page; every event checked against the EMF specification."""
    events: list[dict[str, Any]] = pub.collect(None, {"replica-0": page}, None, None, now_ms)
    for event in events:
        check_event(event)
    return events


def values(events: list[dict[str, Any]], metric: str) -> list[float]:
    """replica-0's values of ``metric`` in ``events``."""
    return metric_values(events, metric, **REPLICA_DIMENSIONS)


HOST_FACTS = {"InstanceType": "inf2.24xlarge", "AvailabilityZone": "us-east-2a", "Capacity": "on-demand"}
"""The host's type, zone and purchasing option, as its host.env gives them (the boot's metadata step)."""
DISK = (30 * 2**30, 70 * 2**30)
"""Bytes used and available of the fixtures' root file system: 30 % used."""
FIRST_MS = 1_767_225_600_000
SECOND_MS = FIRST_MS + 60_000


def fixture_rounds(config: dict[str, Any], service: str = SERVICE, instance_id: str = INSTANCE_ID,
                   engine: Engine = TGI) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The events of two rounds one interval apart, every input recorded: the two neuron-monitor
    reports, every replica of ``config`` serving ``engine``'s two pages, and the HAProxy page."""
    publisher = load_publisher().Publisher(config, service, instance_id, HOST_FACTS)
    names = [r["name"] for r in config["replicas"]]
    router = fixture("haproxy-metrics.txt")
    rounds = []
    first, second = PAGES[engine.name]
    for which, page, now in (("first", first, FIRST_MS), ("second", second, SECOND_MS)):
        text = fixture(page)
        rounds.append(publisher.collect(report(which), dict.fromkeys(names, text), router, DISK, now))
    return rounds[0], rounds[1]


def fixture_events(config: dict[str, Any], service: str = SERVICE, instance_id: str = INSTANCE_ID,
                   engine: Engine = TGI) -> list[dict[str, Any]]:
    """Every event the publisher writes over :func:`fixture_rounds` with ``config``: by then every
    catalog metric has a value. For consistency tests: ``metrics_produced(fixture_events(config))``."""
    first, second = fixture_rounds(config, service, instance_id, engine)
    return first + second


class PageServer:
    """Serves ``GET /metrics`` on a free loopback port: the i-th request gets ``pages[i]``, and
    every later one the last page; with no page, every request gets a 503."""

    def __init__(self, *pages: str) -> None:
        self.pages = list(pages)
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                served = owner.pages[min(owner.requests, len(owner.pages) - 1)] if owner.pages else None
                owner.requests += 1
                body = (served or "unavailable").encode()
                self.send_response(200 if served is not None and self.path == "/metrics" else 503)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
