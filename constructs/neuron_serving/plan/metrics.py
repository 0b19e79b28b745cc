"""The metrics a Neuron serving host publishes: one catalog for the host's publisher, the
dashboard and the alarms, so that nothing on the dashboard lacks a producer.

The host's publisher (``userdata/publish_metrics.py``) reads neuron-monitor's reports, each
replica's ``/metrics`` (whose names are the engine's: ``Engine.metrics``) and the router's
Prometheus endpoint once per :data:`INTERVAL_SECONDS`,
and writes CloudWatch embedded metric format (EMF) lines to :data:`EMF_LOG`, which the
CloudWatch agent ships to a log group; CloudWatch Logs turns them into metrics. Names, units and
dimensions are ours, never the guessed names of ``neuron-monitor-cloudwatch.py``.

Dimensions: ``Service`` (the deployment: the stack name by default), ``InstanceId``,
``Replica`` (the replica's ``NEURON_PROCESS_TAG``, ``replica-N``) and ``ErrorType``. Every
metric is also published with ``Service`` alone (or ``Service`` and its own breakdown), so the
fleet aggregate needs no SEARCH expression and can drive alarms and target tracking.

Histograms (request duration, time per output token...) are published as arrays of values, one
per request, placed within the request's Prometheus bucket, so that CloudWatch computes
percentiles across replicas and instances correctly rather than averaging per-replica ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..userdata.api_keys import FAILURE_METRIC
from .engines import Engine
from .errors import Problems
from .phases import BOOT_PHASE_METRIC, PHASE_DIMENSION, PUBLISH_TAG

DEFAULT_NAMESPACE = "NeuronServing"
"""CloudWatch namespace of every metric below, unless the monitoring construct is given another."""

INTERVAL_SECONDS = 60
"""How often the host publishes: neuron-monitor's period, and one data point per minute."""

EMF_LOG = "/var/log/neuron-serving/metrics.emf"
"""The file of EMF lines the CloudWatch agent ships."""

AGENT_KEY_FINGERPRINT = "937616F3450B7D806CBD9725D58167303B789C72"
"""The fingerprint of AWS's key "Amazon CloudWatch Agent" (RSA 2048, key id 3B789C72), which
signs the CloudWatch agent's packages, as the CloudWatch user guide documents it: "Verifying the
signature of the CloudWatch agent package" (awsdocs/amazon-cloudwatch-user-guide,
doc_source/verify-CloudWatch-Agent-Package-Signature.md; today
https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/verify-CloudWatch-Agent-Package-Signature.html),
``9376 16F3 450B 7D80 6CBD 9725 D581 6730 3B78 9C72``, here as gpg's ``--with-colons`` output
spells it."""

API_KEY_SYNC_FAILURES = FAILURE_METRIC
"""The metric ``api-keys sync`` writes for each run that fails (``userdata/api_keys.py``)."""

EXPORT_PUBLISH_FAILURES = "ExportPublishFailures"
"""The metric a host puts when it compiled the model and could not publish the export to the artifact
cache (``report-publish``, ``userdata/report-publish.sh.j2``)."""

SERVICE = "Service"
INSTANCE = "InstanceId"
REPLICA = "Replica"
ERROR_TYPE = "ErrorType"
PHASE = PHASE_DIMENSION

FLEET = (SERVICE,)
PER_INSTANCE = (SERVICE, INSTANCE)
PER_REPLICA = (SERVICE, INSTANCE, REPLICA)

REPLICA_SETS = (FLEET, PER_INSTANCE, PER_REPLICA)
"""Per replica, per instance and for the whole fleet."""
INSTANCE_SETS = (FLEET, PER_INSTANCE)
"""Per instance and for the whole fleet."""
INSTANCE_TYPE = "InstanceType"
ZONE = "AvailabilityZone"
CAPACITY = "Capacity"
HOST_SETS = ((SERVICE, INSTANCE_TYPE), (SERVICE, ZONE), (SERVICE, CAPACITY))
"""The fleet's hosts by instance type, by zone and by purchasing option."""
ERROR_SETS = ((SERVICE, ERROR_TYPE), (SERVICE, INSTANCE, ERROR_TYPE))
"""By error type, per instance and for the whole fleet."""

EXECUTION_ERROR_TYPES = ("generic", "numerical", "transient", "model", "runtime", "hardware")
"""neuron-monitor's ``execution_stats.error_summary`` keys: the values of ``ErrorType``."""


@dataclass(frozen=True)
class MetricSpec:
    """One published metric.

    :param name: the CloudWatch metric name.
    :param unit: an EMF / CloudWatch unit (``Count``, ``Seconds``, ``Percent``, ``Bytes``).
    :param source: ``replica`` (a replica's ``/metrics``, with the engine's names), ``router`` (HAProxy's), ``neuron``
        (neuron-monitor), ``host`` (neuron-monitor's system data, and the root file system), ``api-keys``
        (``api-keys sync`` itself, on hosts with API keys), ``boot`` (``report-phase``, once a boot ends) or
        ``export`` (``report-publish``, once a host that compiled has tried to publish its export).
    :param dimension_sets: the dimension sets it is published with.
    :param description: what it measures and where it comes from.
    """

    name: str
    unit: str
    source: str
    dimension_sets: tuple[tuple[str, ...], ...]
    description: str


METRICS: tuple[MetricSpec, ...] = (
    # Serving, per replica, from its /metrics (the engine's names: Engine.metrics).
    MetricSpec("QueueSize", "Count", "replica", REPLICA_SETS, "Requests waiting for a batch slot (a gauge)."),
    MetricSpec("BatchSize", "Count", "replica", REPLICA_SETS, "Requests in the running batch (a gauge)."),
    MetricSpec("InFlightRequests", "Count", "replica", REPLICA_SETS,
               "Requests queued or in the batch: QueueSize + BatchSize, plus an equal share of the requests "
               "the router holds for the replicas (RouterQueue over the replicas that answered). "
               "The fleet's scaling signal."),
    MetricSpec("Requests", "Count", "replica", REPLICA_SETS, "Requests in the interval (a counter, as a delta)."),
    MetricSpec("RequestFailures", "Count", "replica", REPLICA_SETS,
               "Requests failed in the interval, all reasons (a counter, as a delta)."),
    MetricSpec("GeneratedTokens", "Count", "replica", REPLICA_SETS,
               "Tokens generated in the interval (a counter, as a delta)."),
    MetricSpec("RequestDuration", "Seconds", "replica", REPLICA_SETS,
               "End-to-end request time, one value per request (a histogram)."),
    MetricSpec("QueueDuration", "Seconds", "replica", REPLICA_SETS,
               "Time a request waited for a batch slot, one value per request (a histogram)."),
    MetricSpec("TimePerOutputToken", "Seconds", "replica", REPLICA_SETS,
               "Mean time per generated token, one value per request (a histogram)."),
    # The on-host router (HAProxy), per instance.
    MetricSpec("RouterQueue", "Count", "router", INSTANCE_SETS,
               "Requests the router holds because every replica is at its concurrency limit "
               "(gauge haproxy_backend_current_queue)."),
    MetricSpec("UnauthorizedRequests", "Count", "router", INSTANCE_SETS,
               "Requests refused with 401 for a missing or unknown API key (counter "
               "haproxy_frontend_requests_denied_total of the router's frontend, as a delta)."),
    MetricSpec("ReplicasUp", "Count", "router", INSTANCE_SETS,
               "Replicas whose health check passes (haproxy_server_status with state UP)."),
    # Neuron, from neuron-monitor.
    MetricSpec("NeuronCoreUtilization", "Percent", "neuron", INSTANCE_SETS,
               "Utilization of each NeuronCore in use, one value per core: Average is the instance's "
               "mean, Maximum its busiest core (neuroncore_counters)."),
    MetricSpec("NeuronDeviceMemoryUsed", "Bytes", "neuron", INSTANCE_SETS,
               "Neuron device memory used by all replicas (memory_used.neuron_runtime_used_bytes.neuron_device)."),
    MetricSpec("ExecutionErrors", "Count", "neuron", ERROR_SETS,
               "Failed executions in the interval, by ErrorType (execution_stats.error_summary)."),
    MetricSpec("ExecutionLatency", "Seconds", "neuron", REPLICA_SETS,
               "Median execution latency on the NeuronCores in the interval (execution_stats.latency_stats."
               "total_latency.p50)."),
    MetricSpec("ExecutionLatencyP99", "Seconds", "neuron", REPLICA_SETS,
               "99th percentile execution latency in the interval (latency_stats.total_latency.p99)."),
    MetricSpec("EccCorrectedEvents", "Count", "neuron", INSTANCE_SETS,
               "Corrected memory and SRAM ECC events in the interval, all devices (neuron_hw_counters)."),
    MetricSpec("EccUncorrectedEvents", "Count", "neuron", INSTANCE_SETS,
               "Uncorrected memory and SRAM ECC events in the interval, all devices: the device needs attention."),
    # The host.
    MetricSpec("CpuUtilization", "Percent", "host", INSTANCE_SETS,
               "vCPU time not idle (system_data.vcpu_usage.average_usage)."),
    MetricSpec("MemoryUtilization", "Percent", "host", INSTANCE_SETS,
               "Host memory used (system_data.memory_info)."),
    MetricSpec("DiskUtilization", "Percent", "host", INSTANCE_SETS,
               "Root file system used, which holds the image and the exports (statvfs of /)."),
    MetricSpec("Hosts", "Count", "host", HOST_SETS,
               "1 per host and minute, by InstanceType, AvailabilityZone and Capacity (the instance metadata's "
               "instance-life-cycle: on-demand or spot): the Sum of a minute counts the hosts serving metrics."),
    # The API keys' sync, on hosts with API keys: its own EMF line, not the publisher's.
    # The boot: report-phase puts each phase's seconds once the boot ends (PutMetricData, not EMF).
    MetricSpec(BOOT_PHASE_METRIC, "Seconds", "boot", ((SERVICE, PHASE),),
               "How long a phase of a host's boot took (Phase: the phase's name, neuron_serving.plan.phases), "
               "from its start to the next phase's by the host's /proc/uptime: one value per host and phase, "
               "its times in that boot added up, timed when it last ended."),
    MetricSpec(API_KEY_SYNC_FAILURES, "Count", "api-keys", INSTANCE_SETS,
               "Runs of api-keys sync that failed (1 per failed run, nothing when it succeeds): the secret could "
               "not be read or used, or the router refused the new keys; the keys in force stay. Each line "
               "says why (its Reason), in the metrics log group's stream <instance id>/api-keys."),
    # The export's publish to the artifact cache: report-publish puts it (PutMetricData, not EMF) when it fails.
    MetricSpec(EXPORT_PUBLISH_FAILURES, "Count", "export", INSTANCE_SETS,
               "1 when a host that compiled the model could not publish its export to the artifact cache (the "
               "upload or the conditional write of COMPLETE failed, for any reason but another host publishing "
               "first), nothing otherwise: the host serves its own export, and each host after it compiles "
               f"again. Its tag {PUBLISH_TAG} and export.log say why."),
)

BY_NAME = {m.name: m for m in METRICS}


PUBLISHER_SOURCES = ("replica", "router", "neuron", "host")
"""The sources of the metrics the publisher writes; ``api-keys`` is the sync's (``userdata/api_keys.py``)."""


def published_metrics(engine: Engine) -> tuple[MetricSpec, ...]:
    """The catalog's metrics the publisher of a host serving with ``engine`` writes: every metric
    of the router, Neuron and host sources, and the replica metrics the engine has a source for."""
    return tuple(m for m in METRICS if m.source in PUBLISHER_SOURCES
                 and (m.source != "replica" or m.name in engine.metrics.published))


def metric(name: str) -> MetricSpec:
    """The spec of ``name``; a ``KeyError`` naming it when the catalog has no such metric."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no metric {name!r} in the catalog; known: {', '.join(BY_NAME)}") from None


LOG_KINDS = ("boot", "replicas", "router", "metrics")
"""The host's log groups: ``boot`` (boot.log, export.log, ready.log of /var/log/neuron-serving),
``replicas`` (each serving container's output, through docker's awslogs driver, one stream per
replica), ``router`` (HAProxy's log) and ``metrics`` (the EMF lines)."""


@dataclass(frozen=True)
class MonitoringOptions:
    """What the boot script needs to publish metrics and ship logs.

    :param service: the ``Service`` dimension's value (a CDK token is fine: it reaches the host
        through ``stack.env``).
    :param log_groups: the log group name for each of :data:`LOG_KINDS` (tokens are fine).
    :param namespace: the CloudWatch namespace. Default: :data:`DEFAULT_NAMESPACE`.
    :param agent_key_fingerprint: when the host downloads the CloudWatch agent, it installs the
        package only if its signature is a good one by the key with this fingerprint (40
        hexadecimal digits, upper case, no spaces). Default: :data:`AGENT_KEY_FINGERPRINT`,
        AWS's documented key; set another only if AWS documents a new one.
    """

    service: str
    log_groups: dict[str, str]
    namespace: str = DEFAULT_NAMESPACE
    agent_key_fingerprint: str = AGENT_KEY_FINGERPRINT

    def __post_init__(self) -> None:
        problems = Problems()
        if not isinstance(self.service, str) or not self.service or any(c.isspace() for c in self.service):
            problems.add("monitoring.service", self.service, "must be a non-empty name without spaces")
        if not isinstance(self.log_groups, dict) or set(self.log_groups) != set(LOG_KINDS):
            problems.add("monitoring.log_groups", self.log_groups,
                         f"must name a group for each of {', '.join(LOG_KINDS)}")
        elif any(not isinstance(v, str) or not v or any(c.isspace() for c in v) for v in self.log_groups.values()):
            problems.add("monitoring.log_groups", self.log_groups, "must be names without spaces")
        ns = self.namespace
        if not isinstance(ns, str) or not 1 <= len(ns) <= 255 or ns.startswith("AWS/") or ":" in ns:
            problems.add("monitoring.namespace", ns,
                         "must be 1 to 255 characters, without ':' and not starting with AWS/")
        key = self.agent_key_fingerprint
        if not isinstance(key, str) or not _FINGERPRINT.fullmatch(key):
            problems.add("monitoring.agent_key_fingerprint", key,
                         "must be an OpenPGP v4 fingerprint: 40 hexadecimal digits, upper case, no spaces")
        problems.raise_if_any()


_FINGERPRINT = re.compile(r"[0-9A-F]{40}")
