#!/usr/bin/env python3
"""Publishes a Neuron serving host's metrics as CloudWatch embedded metric format (EMF) lines.

Run by systemd as ``publish_metrics.py CONFIG_JSON`` with ``SERVICE`` and ``INSTANCE_ID`` in the
environment (the ``Service`` and ``InstanceId`` dimension values), and ``INSTANCE_TYPE``,
``AVAILABILITY_ZONE`` and ``CAPACITY`` (the boot's metadata step writes them to host.env from the
instance metadata), by which each round counts the host in ``Hosts``. ``NEURON_SERVING_ROOT``, empty
on a host, prefixes every file read or written (the config, the output, the disk measured), so
tests can run the script against a directory; the neuron-monitor command line is not prefixed.

The config, rendered at synth from the metric catalog (``neuron_serving.plan.metrics``), names
the namespace, the interval, the output file, the neuron-monitor command line, each replica's
name and loopback port, ``replica_metrics`` (the serving engine's Prometheus names behind the
replica metrics: ``neuron_serving.plan.engines``, ``ReplicaMetrics.to_json``), the router's
Prometheus URL and backend, the disk to measure, and
``metrics``: for each published metric its unit and dimension sets. That map is the contract: a
metric is written only if it is there, with that unit and those of its dimension sets whose keys
the metric has (``Replica`` for per-replica metrics, ``ErrorType`` for execution errors).

Design:

- neuron-monitor runs as a child process and prints one JSON report per period (its period is
  the interval). Each report starts a round: scrape every replica's ``/metrics`` and the
  router's, measure the disk, compute, append EMF lines. With no report for two intervals
  (neuron-monitor missing, dead or silent), rounds run on their own clock without Neuron data,
  and neuron-monitor is restarted at most once every :data:`RESTART_INTERVALS` intervals.
- The computation is pure and kept apart from the I/O: :func:`parse_prometheus` reads the text
  exposition format, :class:`Publisher` turns one round's inputs into EMF events and keeps the
  state that counter deltas need. Counters become per-interval deltas (none on a series' first
  observation; a drop means a restart, and the delta is then the new value). A replica's histogram
  becomes one value per request of the interval, placed evenly inside the request's bucket, so
  that CloudWatch computes percentiles across replicas and instances from the raw values.
- Metrics with the same dimension values share one event; value arrays longer than EMF's 100
  are split over extra events. Bad input never stops the publisher: what cannot be read is
  logged to stderr (the journal) and left out of the round.

Standard library only, and Python 3.10 syntax: the script runs with the host's own Python.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, NamedTuple, TypeGuard

ERROR_TYPES = ("generic", "numerical", "transient", "model", "runtime", "hardware")
"""neuron-monitor's ``error_summary`` keys: the values of the ``ErrorType`` dimension."""
MAX_VALUES = 100
"""EMF: at most this many values in one metric's array."""
SCRAPE_TIMEOUT = 5.0
"""Seconds a replica or the router has to answer a scrape."""
RESTART_INTERVALS = 3
"""A missing, dead or silent neuron-monitor is restarted at most once in this many intervals."""
CONFIG_KEYS = {"namespace", "interval_seconds", "output", "neuron_monitor", "replicas", "replica_metrics",
               "router_metrics_url", "router_backend", "router_frontend", "disk_path", "metrics"}

# The router and the replicas listen on loopback: no proxy from the environment may apply.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_SAMPLE = re.compile(r'([a-zA-Z_:][\w:]*)\s*(?:\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$')
_LABEL = re.compile(r'\s*([a-zA-Z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPE = re.compile(r"\\(.)")


HOST_DIMENSIONS = {"InstanceType": "INSTANCE_TYPE", "AvailabilityZone": "AVAILABILITY_ZONE", "Capacity": "CAPACITY"}
"""The dimensions ``Hosts`` counts a host by, and the variables of host.env that hold its values."""


def log(message: str) -> None:
    print(f"publish_metrics: {message}", file=sys.stderr, flush=True)


class Sample(NamedTuple):
    """One sample of the Prometheus text format: ``name{labels} value``."""

    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    """The samples of a Prometheus text exposition; comments, timestamps and unreadable lines are
    skipped. Label values are unescaped; ``+Inf``, ``-Inf`` and ``NaN`` are floats."""
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())  # a comment's "#" cannot start a metric name
        if match is None:
            continue
        labels = {key: _ESCAPE.sub(lambda e: "\n" if e.group(1) == "n" else e.group(1), raw)
                  for key, raw in _LABEL.findall(match.group(2) or "")}
        with contextlib.suppress(ValueError):
            samples.append(Sample(match.group(1), labels, float(match.group(3))))
    return samples


def total(samples: list[Sample], name: str, **labels: str) -> float | None:
    """The sum of the samples of ``name`` (or ``name_total``) that have ``labels``; ``None`` if none."""
    found = [s.value for s in samples if s.name in (name, name + "_total")
             and all(s.labels.get(k) == v for k, v in labels.items())]
    return sum(found) if found else None


def buckets(samples: list[Sample], name: str) -> dict[float, float]:
    """Histogram ``name``'s cumulative bucket counts by upper bound, summed over other labels."""
    counts: dict[float, float] = {}
    for s in samples:
        if s.name == name + "_bucket" and "le" in s.labels:
            counts[float(s.labels["le"])] = counts.get(float(s.labels["le"]), 0.0) + s.value
    return counts


def histogram_values(previous: dict[float, float] | None, current: dict[float, float]) -> list[float]:
    """One value per observation made between two scrapes of a histogram, spread evenly inside its
    bucket (lower, upper]; the +Inf bucket's at the largest finite bound. No previous scrape: none.
    A count that went down means the histogram restarted, and every current observation counts."""
    if previous is None:
        return []
    if any(count < previous.get(bound, 0.0) for bound, count in current.items()):
        previous = {}
    finite = [b for b in current if math.isfinite(b)]
    top, lower, below = max(finite, default=0.0), min([0.0, *finite]), 0.0
    values: list[float] = []
    for bound in sorted(current):
        cumulative = current[bound] - previous.get(bound, 0.0)
        n, below = max(0, round(cumulative - below)), max(below, cumulative)
        values += [lower + (bound - lower) * (i + 0.5) / n if bound < math.inf else top for i in range(n)]
        lower = min(bound, top)
    return values


def _sum(samples: list[Sample], sources: list[dict[str, Any]]) -> float | None:
    """The sum of ``total`` over ``sources`` (each ``{"name": ..., "labels": {...}}``); ``None``
    if no source has a sample."""
    found = [v for v in (total(samples, s["name"], **s["labels"]) for s in sources) if v is not None]
    return sum(found) if found else None


def _ok(group: Any) -> TypeGuard[dict[str, Any]]:
    """Whether a neuron-monitor metric group is present and reports no error."""
    return isinstance(group, dict) and not group.get("error")


def _round(value: float) -> float:
    """Integers as they are, other values to 6 significant digits: short lines, enough precision."""
    rounded = value if value.is_integer() else float(f"{value:.6g}")
    return int(rounded) if rounded.is_integer() and abs(rounded) < 2**53 else rounded


class Publisher:
    """Turns the inputs of one round into EMF events, keeping what counter deltas need.

    :param config: the publisher's config (``namespace``, ``replicas``, ``replica_metrics``,
        ``router_backend``, ``router_frontend`` and ``metrics`` are read here).
    :param service: the ``Service`` dimension's value.
    :param instance_id: the ``InstanceId`` dimension's value.
    :param host: the host's ``InstanceType``, ``AvailabilityZone`` and ``Capacity`` (its purchasing option),
        by which it counts itself in ``Hosts`` each round; none are counted without all three.
    """

    def __init__(self, config: dict[str, Any], service: str, instance_id: str,
                 host: dict[str, str] | None = None) -> None:
        self.namespace: str = config["namespace"]
        self.metrics: dict[str, dict[str, Any]] = config["metrics"]
        self.replicas = {r["name"] for r in config["replicas"]}
        self.sources: dict[str, Any] = config["replica_metrics"]
        self.backend: str = config["router_backend"]
        self.frontend: str = config["router_frontend"]
        self.instance = {"Service": service, "InstanceId": instance_id}
        facts = {k: v for k, v in (host or {}).items() if v}
        self.host = {**self.instance, **facts} if set(facts) == set(HOST_DIMENSIONS) else None
        for name, spec in self.metrics.items():
            if not isinstance(spec["unit"], str) or not all(isinstance(s, list) for s in spec["dimensions"]):
                raise ValueError(f"metrics.{name} ({spec!r}) needs a unit and a list of dimension sets")
        self._last: dict[Any, Any] = {}
        self._out: dict[tuple[tuple[str, str], ...], dict[str, list[float]]] = {}

    def collect(self, report: Any, replicas: dict[str, str | None], router: str | None,
                disk: tuple[int, int] | None, now_ms: int) -> list[dict[str, Any]]:
        """The EMF events of one round.

        :param report: neuron-monitor's latest report (a JSON object), or ``None`` without one.
        :param replicas: each replica's ``/metrics`` text by replica name, ``None`` if it did not answer.
        :param router: the router's ``/metrics`` text, or ``None``.
        :param disk: bytes used and available on the measured file system, or ``None``.
        :param now_ms: the events' timestamp, in milliseconds since the epoch.
        """
        self._out = {}
        share = self._queue_share(router, sum(text is not None for text in replicas.values()))
        steps = [(f"{name}'s metrics", partial(self._replica, name, text, share)) for name, text in replicas.items()
                 if text is not None]
        if router is not None:
            steps.append(("the router's metrics", partial(self._router, router)))
        if report is not None:
            steps += [(f"neuron-monitor's {what}", partial(step, report)) for what, step in (
                ("runtime data", self._runtimes), ("hardware counters", self._ecc), ("vCPU usage", self._cpu),
                ("memory info", self._memory))]
        for what, step in steps:
            try:
                step()
            except Exception as error:
                log(f"skipped {what}: {error!r}")
        if disk is not None and sum(disk) > 0:
            self._add(self.instance, "DiskUtilization", 100.0 * disk[0] / sum(disk))
        if self.host is not None:
            self._add(self.host, "Hosts", 1)
        return self._events(now_ms)

    def _add(self, dimensions: dict[str, str], metric: str, value: Any) -> None:
        numbers = [float(v) for v in (value if isinstance(value, list) else [value])
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
        if numbers:
            self._out.setdefault(tuple(dimensions.items()), {}).setdefault(metric, []).extend(numbers)

    def _delta(self, key: Any, value: float) -> float | None:
        previous, self._last[key] = self._last.get(key), value
        if previous is None:
            return None
        return value - previous if value >= previous else value

    def _queue_share(self, router: str | None, replicas: int) -> float:
        """Each replica's share of the requests the router holds for the replicas (its backend
        queue), so that InFlightRequests counts every request waiting for a replica: the router
        sends each replica only its batch and queues the rest itself."""
        if router is None or replicas == 0:
            return 0.0
        try:
            queued = total(parse_prometheus(router), "haproxy_backend_current_queue", proxy=self.backend)
        except Exception as error:
            log(f"no router queue in this round's InFlightRequests: {error!r}")
            return 0.0
        return (queued or 0.0) / replicas

    def _replica(self, replica: str, text: str, router_share: float = 0.0) -> None:
        samples = parse_prometheus(text)
        dims = {**self.instance, "Replica": replica}
        queued, batch = _sum(samples, self.sources["queued"]), _sum(samples, self.sources["running"])
        self._add(dims, "QueueSize", queued)
        self._add(dims, "BatchSize", batch)
        self._add(dims, "InFlightRequests", None if queued is None or batch is None else queued + batch + router_share)
        # Servers create a counter (or a labelled series) at its first increment: absent means zero.
        for metric, sources in self.sources["counters"].items():
            self._add(dims, metric, self._delta((replica, metric), _sum(samples, sources) or 0.0))
        for metric, source in self.sources["histograms"].items():
            current = buckets(samples, source)
            previous, self._last[(replica, source)] = self._last.get((replica, source)), current
            self._add(dims, metric, histogram_values(previous, current))

    def _router(self, text: str) -> None:
        samples = parse_prometheus(text)
        queued = total(samples, "haproxy_backend_current_queue", proxy=self.backend)
        if queued is None:
            raise ValueError(f"no backend {self.backend!r}")
        self._add(self.instance, "RouterQueue", queued)
        self._add(self.instance, "ReplicasUp", sum(
            1 for s in samples if s.name == "haproxy_server_status" and s.value == 1
            and s.labels.get("proxy") == self.backend and s.labels.get("state") == "UP"))
        # Requests the frontend refused (a missing or unknown API key), counted since HAProxy started.
        denied = total(samples, "haproxy_frontend_requests_denied_total", proxy=self.frontend) or 0.0
        self._add(self.instance, "UnauthorizedRequests", self._delta("denied", denied))

    def _runtimes(self, report: dict[str, Any]) -> None:
        runtimes = report.get("neuron_runtime_data") or []
        cores: list[float] = []
        memory: list[float] = []
        errors = dict.fromkeys(ERROR_TYPES, 0.0)
        for runtime in runtimes:
            data = {} if runtime.get("error") else runtime.get("report") or {}
            counters, used, stats = (data.get(k) for k in ("neuroncore_counters", "memory_used", "execution_stats"))
            if _ok(counters):
                cores += [c.get("neuroncore_utilization") for c in (counters.get("neuroncores_in_use") or {}).values()]
            if _ok(used):
                memory.append(used["neuron_runtime_used_bytes"]["neuron_device"])
            if _ok(stats):
                for kind in ERROR_TYPES:
                    errors[kind] += (stats.get("error_summary") or {}).get(kind) or 0
                latency = (stats.get("latency_stats") or {}).get("total_latency")
                if latency and runtime.get("neuron_runtime_tag") in self.replicas:
                    dims = {**self.instance, "Replica": runtime["neuron_runtime_tag"]}
                    self._add(dims, "ExecutionLatency", latency.get("p50"))
                    self._add(dims, "ExecutionLatencyP99", latency.get("p99"))
        self._add(self.instance, "NeuronCoreUtilization", cores)
        self._add(self.instance, "NeuronDeviceMemoryUsed", sum(memory) if memory or not runtimes else None)
        for kind, count in errors.items():
            self._add({**self.instance, "ErrorType": kind}, "ExecutionErrors", count)

    def _ecc(self, report: dict[str, Any]) -> None:
        # Counted since the device was last reset, per device: published as deltas, all devices summed.
        counters = (report.get("system_data") or {}).get("neuron_hw_counters")
        devices = (counters.get("neuron_devices") or []) if _ok(counters) else []
        for metric, kind in (("EccCorrectedEvents", "corrected"), ("EccUncorrectedEvents", "uncorrected")):
            deltas = [self._delta((metric, d.get("neuron_device_index")),
                                  (d.get(f"mem_ecc_{kind}") or 0) + (d.get(f"sram_ecc_{kind}") or 0))
                      for d in devices]
            known = [d for d in deltas if d is not None]
            self._add(self.instance, metric, sum(known) if known else None)

    def _cpu(self, report: dict[str, Any]) -> None:
        cpu = (report.get("system_data") or {}).get("vcpu_usage")
        if _ok(cpu):
            self._add(self.instance, "CpuUtilization", min(100.0, max(0.0, 100.0 - cpu["average_usage"]["idle"])))

    def _memory(self, report: dict[str, Any]) -> None:
        memory = (report.get("system_data") or {}).get("memory_info")
        if _ok(memory) and memory.get("memory_total_bytes"):
            used = 100.0 * memory["memory_used_bytes"] / memory["memory_total_bytes"]
            self._add(self.instance, "MemoryUtilization", used)

    def _events(self, now_ms: int) -> list[dict[str, Any]]:
        events = []
        for key, measured in self._out.items():
            dims = dict(key)
            chosen = []
            for metric, values in measured.items():
                spec = self.metrics.get(metric)
                sets = [list(s) for s in spec["dimensions"] if set(s) <= dims.keys()] if spec else []
                if spec and sets:
                    chosen.append((metric, spec["unit"], sets, [_round(v) for v in values]))
            for start in range(0, max((len(values) for *_, values in chosen), default=0), MAX_VALUES):
                event: dict[str, Any] = {"_aws": {"Timestamp": now_ms, "CloudWatchMetrics": []}, **dims}
                directives: dict[str, dict[str, Any]] = {}
                for metric, unit, sets, values in chosen:
                    if values[start:]:
                        chunk = values[start:start + MAX_VALUES]
                        event[metric] = chunk if len(chunk) > 1 else chunk[0]
                        directive = {"Namespace": self.namespace, "Dimensions": sets, "Metrics": []}
                        directives.setdefault(repr(sets), directive)["Metrics"].append({"Name": metric, "Unit": unit})
                event["_aws"]["CloudWatchMetrics"] = list(directives.values())
                events.append(event)
        return events


def fetch(url: str) -> str | None:
    """The body of ``url``, or ``None`` (logged) when it does not answer with one."""
    try:
        with _OPENER.open(url, timeout=SCRAPE_TIMEOUT) as response:
            return response.read().decode("utf-8", "replace")  # type: ignore[no-any-return]
    except Exception as error:
        log(f"no metrics from {url}: {error}")
        return None


def disk_usage(path: str) -> tuple[int, int] | None:
    """Bytes used and available to unprivileged users on ``path``'s file system, as ``df`` counts."""
    try:
        st = os.statvfs(path)
    except OSError as error:
        log(f"no disk usage of {path}: {error}")
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_bavail * st.f_frsize


def append_events(path: str, events: list[dict[str, Any]]) -> None:
    """Append one JSON line per event to ``path``, creating its directory."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a", encoding="utf-8") as out:
        out.write("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))


def start_monitor(argv: list[str], lines: queue.Queue[str]) -> subprocess.Popen[str] | None:
    """neuron-monitor as a child process whose output lines go to ``lines``; ``None`` if it cannot start."""
    try:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    except OSError as error:
        log(f"cannot start neuron-monitor: {error}")
        return None
    threading.Thread(target=_forward, args=(process.stdout, lines), daemon=True).start()
    return process


def _forward(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


def stop(process: subprocess.Popen[str] | None) -> None:
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()


def run(config: dict[str, Any], root: str, publisher: Publisher, stopping: threading.Event) -> None:
    """Publish a round per neuron-monitor report, or per interval without one, until ``stopping``."""
    interval, argv = float(config["interval_seconds"]), [str(a) for a in config["neuron_monitor"]]
    names = [r["name"] for r in config["replicas"]]
    urls = [f"http://127.0.0.1:{r['port']}/metrics" for r in config["replicas"]] + [config["router_metrics_url"]]
    lines: queue.Queue[str] = queue.Queue()
    monitor, started = start_monitor(argv, lines), time.monotonic()
    last = started
    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        try:
            while not stopping.is_set():
                due = last + interval * (2 if monitor is not None and monitor.poll() is None else 1)
                try:
                    # Short waits, so that SIGTERM is noticed within a second.
                    report = json.loads(lines.get(timeout=max(0.0, min(1.0, due - time.monotonic()))))
                except queue.Empty:
                    if time.monotonic() < due:
                        continue
                    report = None
                    if time.monotonic() - started >= RESTART_INTERVALS * interval:
                        stop(monitor)
                        monitor, started = start_monitor(argv, lines), time.monotonic()
                except ValueError as error:
                    log(f"unreadable neuron-monitor report: {error}")
                    continue
                last = time.monotonic()
                texts = list(pool.map(fetch, urls))
                events = publisher.collect(report, dict(zip(names, texts[:-1], strict=True)), texts[-1],
                                           disk_usage(root + config["disk_path"]), int(time.time() * 1000))
                try:
                    append_events(root + config["output"], events)
                except OSError as error:
                    log(f"cannot write {root + config['output']}: {error}")
        finally:
            stop(monitor)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} CONFIG_JSON", file=sys.stderr)
        return 2
    root = os.environ.get("NEURON_SERVING_ROOT", "")
    try:
        with open(root + argv[1], encoding="utf-8") as f:
            config = json.load(f)
        if CONFIG_KEYS - set(config):
            raise KeyError(f"the config lacks {sorted(CONFIG_KEYS - set(config))}")
        publisher = Publisher(config, os.environ["SERVICE"], os.environ["INSTANCE_ID"],
                              {name: os.environ.get(variable, "") for name, variable in HOST_DIMENSIONS.items()})
    except (OSError, ValueError, LookupError, TypeError) as error:
        log(f"cannot start: {error!r}")
        return 1
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    run(config, root, publisher, stopping)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
