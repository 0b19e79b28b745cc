"""What a monitored host runs besides its replicas: the metrics publisher with its config,
neuron-monitor's config, and the CloudWatch agent's, which only ships files.

The publisher (``userdata/publish_metrics.py``, in the boot bundle) starts
neuron-monitor with :func:`render_neuron_monitor_config`, scrapes every replica and the router,
and appends EMF lines to :data:`~neuron_serving.plan.metrics.EMF_LOG` as
:func:`render_publisher_config` tells it. With API keys, ``api-keys sync`` (``userdata/api_keys.py``)
appends one EMF line to its own file for each run that fails. The CloudWatch agent
(:func:`render_agent_config`) ships those files, the boot logs and the router's log; docker's
awslogs driver ships each replica's output. Every metric is the publisher's or, for the failed
key syncs, the sync's: the agent collects none.

Everything here is rendered at synth and travels in the boot bundle (a CDK asset), which
cannot hold deploy-time values: the log group names in the agent's config are placeholders
(:func:`placeholder`) that the boot script replaces with the names in ``stack.env``.
"""

from __future__ import annotations

import json

from ..plan.engines import Engine
from ..plan.layout import ServingPlan
from ..plan.metrics import EMF_LOG, INTERVAL_SECONDS, MonitoringOptions, published_metrics
from ..userdata.api_keys import METRICS_FILE as API_KEYS_METRICS_FILE
from .router import ROUTER_METRICS_PORT

PUBLISHER = "/opt/neuron-serving/bin/publish-metrics"
"""The publisher on the host, run by ``neuron-serving-metrics.service``."""
PUBLISHER_SOURCE = "publish_metrics.py"
"""The publisher's file in the ``neuron_serving.userdata`` package."""

PUBLISHER_CONFIG = "/etc/neuron-serving/metrics.json"
NEURON_MONITOR = "/opt/aws/neuron/bin/neuron-monitor"
"""Where the Neuron DLAMI installs neuron-monitor (aws-neuronx-tools)."""
NEURON_MONITOR_CONFIG = "/etc/neuron-serving/neuron-monitor.json"
AGENT_CONFIG = "/etc/neuron-serving/cloudwatch-agent.json"
"""The CloudWatch agent's config, which the boot script writes from :data:`AGENT_CONFIG_TEMPLATE`."""
AGENT_CONFIG_TEMPLATE = f"{AGENT_CONFIG}.in"
"""The agent's config with :func:`placeholder` for each log group name."""

ROUTER_BACKEND = "replicas"
"""The HAProxy backend of the replicas in ``userdata/haproxy.cfg.j2``, as its metrics label it."""
ROUTER_FRONTEND = "router"
"""The HAProxy frontend the load balancer reaches in ``userdata/haproxy.cfg.j2``."""
ROUTER_LOG = "/var/log/haproxy.log"
"""Where rsyslog writes HAProxy's log on Ubuntu (the ``haproxy`` package's rsyslog rule)."""
AGENT_LOG_KINDS = ("boot", "router", "metrics")
"""The log groups of the agent's config; the ``replicas`` group is docker's."""
BOOT_LOGS = ("boot", "export", "ready")
"""The boot's logs in ``/var/log/neuron-serving/``: ``<name>.log``, shipped to the stream
``<instance id>/<name>`` of the ``boot`` group."""

NEURON_RUNTIME_METRICS = ("neuroncore_counters", "memory_used", "neuron_runtime_vcpu_usage", "execution_stats")
"""neuron-monitor's metric groups of each replica's runtime."""
NEURON_SYSTEM_METRICS = ("vcpu_usage", "memory_info", "neuron_hw_counters")
"""neuron-monitor's metric groups of the host."""
REPLICA_TAG_FILTER = "^replica-"
"""Selects the runtimes whose ``NEURON_PROCESS_TAG`` is a replica's name (``replica-N``)."""


def log_group_variable(kind: str) -> str:
    """The ``stack.env`` variable holding the log group name of ``kind`` (one of ``LOG_KINDS``)."""
    return f"LOG_GROUP_{kind.upper()}"


def placeholder(kind: str) -> str:
    """What stands for the log group name of ``kind`` in the agent's config until the host fills it
    in: ``@LOG_GROUP_<KIND>@``, which no log group name can contain."""
    return f"@{log_group_variable(kind)}@"


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":")) + "\n"


def render_publisher_config(plan: ServingPlan, engine: Engine, options: MonitoringOptions) -> str:
    """The publisher's config for ``plan``: compact JSON with sorted keys, so renders are identical.

    It names the namespace, the interval, the EMF file, the neuron-monitor command line, each
    replica's name and port, the engine's Prometheus names behind the replica metrics
    (``Engine.metrics``), the router's Prometheus endpoint, backend and frontend, the file system to
    measure, and the unit and dimension sets of each catalog metric the engine produces (the
    publisher writes exactly those). ``Service`` and ``InstanceId`` reach the publisher in its environment.
    """
    return _json({
        "namespace": options.namespace,
        "interval_seconds": INTERVAL_SECONDS,
        "output": EMF_LOG,
        "neuron_monitor": [NEURON_MONITOR, "-c", NEURON_MONITOR_CONFIG],
        "replicas": [{"name": r.name, "port": r.port} for r in plan.replicas],
        "replica_metrics": engine.metrics.to_json(),
        "router_metrics_url": f"http://127.0.0.1:{ROUTER_METRICS_PORT}/metrics",
        "router_backend": ROUTER_BACKEND,
        "router_frontend": ROUTER_FRONTEND,
        "disk_path": "/",
        "metrics": {m.name: {"unit": m.unit, "dimensions": [list(s) for s in m.dimension_sets]}
                    for m in published_metrics(engine)},
    })


def render_neuron_monitor_config(plan: ServingPlan) -> str:
    """neuron-monitor's config: one report per interval, with the runtime groups of the replicas
    of ``plan`` (matched by their process tag) and the host's groups.

    Raises ``ValueError`` if a replica's process tag would escape the filter.
    """
    untagged = [r.process_tag for r in plan.replicas if not r.process_tag.startswith(REPLICA_TAG_FILTER[1:])]
    if untagged:
        raise ValueError(f"process tags {untagged} do not match neuron-monitor's tag_filter {REPLICA_TAG_FILTER!r}")
    return _json({
        "period": f"{INTERVAL_SECONDS}s",
        "neuron_runtimes": [{
            "tag_filter": REPLICA_TAG_FILTER,
            "metrics": [{"type": t} for t in NEURON_RUNTIME_METRICS],
        }],
        "system_metrics": [{"type": t} for t in NEURON_SYSTEM_METRICS],
    })


def render_agent_config(*, api_keys: bool = False) -> str:
    """The CloudWatch agent's config: ships the boot logs, the router's log and the EMF file, with
    :func:`placeholder` for each log group name. It collects no metrics (the publisher makes every
    one) and sets no retention (the stack creates the groups with theirs).

    :param api_keys: the host syncs API keys: also ship the sync's EMF file
        (:data:`~neuron_serving.userdata.api_keys.METRICS_FILE`) to the metrics group, in the stream
        ``<instance id>/api-keys``. Default: false.
    """
    collect = [
        {"file_path": f"/var/log/neuron-serving/{name}.log", "log_group_name": placeholder("boot"),
         "log_stream_name": f"{{instance_id}}/{name}"}
        for name in BOOT_LOGS
    ]
    collect += [
        {"file_path": ROUTER_LOG, "log_group_name": placeholder("router"), "log_stream_name": "{instance_id}"},
        {"file_path": EMF_LOG, "log_group_name": placeholder("metrics"), "log_stream_name": "{instance_id}"},
    ]
    if api_keys:
        # The sync creates its file at its first failure, long after the agent started: the agent
        # reads a file it finds with no saved offset from its start, as from_beginning defaults to
        # true (aws/amazon-cloudwatch-agent v1.300071.0, translator/translate/logs/logs_collected/
        # files/collect_list/ruleFromBeginning.go; plugins/inputs/logfile/logfile.go, FindLogSrc).
        collect.append({"file_path": API_KEYS_METRICS_FILE, "log_group_name": placeholder("metrics"),
                        "log_stream_name": "{instance_id}/api-keys"})
    # Root reads HAProxy's log (syslog:adm, 0640) and the root-owned logs of the boot.
    return _json({"agent": {"run_as_user": "root"}, "logs": {"logs_collected": {"files": {"collect_list": collect}}}})
