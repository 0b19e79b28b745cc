"""The monitoring files as rendered: the publisher's config, neuron-monitor's and the CloudWatch
agent's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from bootsim import MONITORING, make_plan

from neuron_serving.plan import ServingConfigError, ServingPlan
from neuron_serving.plan.engines.tgi import TGI
from neuron_serving.plan.metrics import (
    API_KEY_SYNC_FAILURES,
    EMF_LOG,
    EXPORT_PUBLISH_FAILURES,
    INTERVAL_SECONDS,
    METRICS,
    PUBLISHER_SOURCES,
    MonitoringOptions,
)
from neuron_serving.plan.phases import BOOT_PHASE_METRIC
from neuron_serving.render.monitoring import (
    AGENT_LOG_KINDS,
    NEURON_MONITOR,
    NEURON_MONITOR_CONFIG,
    ROUTER_BACKEND,
    ROUTER_FRONTEND,
    placeholder,
    render_agent_config,
    render_neuron_monitor_config,
    render_publisher_config,
)
from neuron_serving.render.router import ROUTER_METRICS_PORT, render_router_config
from neuron_serving.userdata.api_keys import METRICS_FILE as API_KEYS_METRICS_FILE

# neuron-monitor's metric groups (Neuron docs, neuron-monitor user guide).
RUNTIME_GROUPS = {"neuroncore_counters", "memory_used", "neuron_runtime_vcpu_usage", "execution_stats"}
SYSTEM_GROUPS = {"vcpu_usage", "memory_info", "neuron_hw_counters"}

# The keys the agent's schema accepts in a collect_list entry (translator/config/schema.json,
# logsFilesDefinition, additionalProperties false) and at the top of the config.
COLLECT_LIST_KEYS = {"file_path", "log_group_name", "log_stream_name", "log_group_class", "retention_in_days",
                     "timestamp_format", "timezone", "multi_line_start_pattern", "encoding", "auto_removal",
                     "filters", "trim_timestamp", "blacklist", "publish_multi_logs", "backpressure_mode"}
AGENT_SECTIONS = {"agent", "metrics", "logs", "traces"}


def plans() -> list[ServingPlan]:
    return [make_plan("inf2.48xlarge", 2), make_plan("trn1.32xlarge", 8)]


def is_canonical_json(text: str) -> bool:
    value = json.loads(text)
    return text == json.dumps(value, sort_keys=True, separators=(",", ":")) + "\n"


@pytest.mark.parametrize("plan", plans(), ids=lambda p: f"{p.instance.name}-tp{p.degree}")
def test_the_publisher_config_names_each_replica_the_router_and_what_to_publish(plan: ServingPlan) -> None:
    text = render_publisher_config(plan, TGI, MONITORING)
    assert is_canonical_json(text)
    assert json.loads(text) == {
        "namespace": "NeuronServing",
        "interval_seconds": INTERVAL_SECONDS,
        "output": EMF_LOG,
        "neuron_monitor": [NEURON_MONITOR, "-c", NEURON_MONITOR_CONFIG],
        "replicas": [{"name": f"replica-{r.index}", "port": r.port} for r in plan.replicas],
        # TGI's names (text-generation-inference v3.3.5 router/src/server.rs, router/src/infer/mod.rs).
        "replica_metrics": {
            "queued": [{"name": "tgi_queue_size", "labels": {}}],
            "running": [{"name": "tgi_batch_current_size", "labels": {}}],
            "counters": {"Requests": [{"name": "tgi_request_count", "labels": {}}],
                         "RequestFailures": [{"name": "tgi_request_failure", "labels": {}}],
                         "GeneratedTokens": [{"name": "tgi_request_generated_tokens_sum", "labels": {}}]},
            "histograms": {"RequestDuration": "tgi_request_duration", "QueueDuration": "tgi_request_queue_duration",
                           "TimePerOutputToken": "tgi_request_mean_time_per_token_duration"},
        },
        "router_metrics_url": f"http://127.0.0.1:{ROUTER_METRICS_PORT}/metrics",
        "router_backend": ROUTER_BACKEND,
        "router_frontend": ROUTER_FRONTEND,
        "disk_path": "/",
        "metrics": json.loads(text)["metrics"],
    }


def test_the_publisher_config_metrics_are_the_catalog_with_its_units_and_dimension_sets() -> None:
    metrics = json.loads(render_publisher_config(make_plan("inf2.48xlarge", 8), TGI, MONITORING))["metrics"]
    published = [m for m in METRICS if m.source in PUBLISHER_SOURCES]
    assert list(metrics) == sorted(m.name for m in published)
    for m in published:
        assert metrics[m.name] == {"unit": m.unit, "dimensions": [list(s) for s in m.dimension_sets]}


def test_the_api_key_sync_failures_are_the_syncs_and_not_in_the_publishers_config() -> None:
    # The boot's phase times are report-phase's (PutMetricData), the failed publishes report-publish's (the
    # same), the key sync's failures the sync's.
    assert {m.name for m in METRICS if m.source not in PUBLISHER_SOURCES} == {
        API_KEY_SYNC_FAILURES, BOOT_PHASE_METRIC, EXPORT_PUBLISH_FAILURES}
    metrics = json.loads(render_publisher_config(make_plan("inf2.48xlarge", 8), TGI, MONITORING))["metrics"]
    assert API_KEY_SYNC_FAILURES not in metrics


def test_the_publisher_config_carries_the_namespace() -> None:
    options = MonitoringOptions(service="s", log_groups=MONITORING.log_groups, namespace="Team/LLM")
    assert json.loads(render_publisher_config(make_plan("inf2.48xlarge", 8), TGI, options))["namespace"] == "Team/LLM"


def test_the_router_backend_is_the_one_in_the_router_config() -> None:
    config = render_router_config(make_plan("inf2.48xlarge", 8))
    assert re.findall(r"^backend (\S+)$", config, re.MULTILINE) == [ROUTER_BACKEND]
    assert re.findall(r"^frontend (\S+)$", config, re.MULTILINE)[0] == ROUTER_FRONTEND


@pytest.mark.parametrize("plan", plans(), ids=lambda p: f"{p.instance.name}-tp{p.degree}")
def test_neuron_monitor_reports_every_replica_runtime_and_the_host_once_per_interval(plan: ServingPlan) -> None:
    text = render_neuron_monitor_config(plan)
    assert is_canonical_json(text)
    config = json.loads(text)
    assert set(config) == {"period", "neuron_runtimes", "system_metrics"}
    assert config["period"] == f"{INTERVAL_SECONDS}s"
    [runtimes] = config["neuron_runtimes"]
    assert set(runtimes) == {"tag_filter", "metrics"}
    assert all(re.search(runtimes["tag_filter"], r.process_tag) for r in plan.replicas)
    assert not re.search(runtimes["tag_filter"], "12345")  # an untagged runtime: its pid
    assert {m["type"] for m in runtimes["metrics"]} == RUNTIME_GROUPS
    assert [set(m) for m in runtimes["metrics"] + config["system_metrics"]] == [{"type"}] * 7
    assert {m["type"] for m in config["system_metrics"]} == SYSTEM_GROUPS


@pytest.mark.parametrize("api_keys", [False, True], ids=["without API keys", "with API keys"])
def test_the_agent_ships_files_only_with_keys_its_schema_accepts(api_keys: bool) -> None:
    text = render_agent_config(api_keys=api_keys)
    assert is_canonical_json(text)
    config = json.loads(text)
    assert set(config) <= AGENT_SECTIONS
    assert "metrics" not in config  # every metric is the publisher's
    assert config["agent"] == {"run_as_user": "root"}
    assert set(config["logs"]) == {"logs_collected"}
    assert set(config["logs"]["logs_collected"]) == {"files"}
    collect = config["logs"]["logs_collected"]["files"]["collect_list"]
    assert all(set(entry) <= COLLECT_LIST_KEYS - {"retention_in_days"} for entry in collect)
    assert [e["file_path"] for e in collect] == [
        "/var/log/neuron-serving/boot.log", "/var/log/neuron-serving/export.log",
        "/var/log/neuron-serving/ready.log", "/var/log/haproxy.log", EMF_LOG, *([API_KEYS_METRICS_FILE] * api_keys)]


def test_with_api_keys_the_agent_ships_the_syncs_failures_to_the_metrics_group_in_a_stream_of_their_own() -> None:
    collect = json.loads(render_agent_config(api_keys=True))["logs"]["logs_collected"]["files"]["collect_list"]
    (sync,) = [e for e in collect if e["file_path"] == API_KEYS_METRICS_FILE]
    assert sync == {"file_path": API_KEYS_METRICS_FILE, "log_group_name": placeholder("metrics"),
                    "log_stream_name": "{instance_id}/api-keys"}


def test_the_agent_config_has_a_placeholder_for_each_of_its_log_groups_and_nothing_else() -> None:
    collect = json.loads(render_agent_config())["logs"]["logs_collected"]["files"]["collect_list"]
    assert {e["log_group_name"] for e in collect} == {placeholder(kind) for kind in AGENT_LOG_KINDS}
    assert set(AGENT_LOG_KINDS) | {"replicas"} == set(MONITORING.log_groups)
    assert set(re.findall(r"@\w+@", render_agent_config())) == {placeholder(kind) for kind in AGENT_LOG_KINDS}


def test_the_monitoring_files_render_the_same_every_time() -> None:
    plan = make_plan("trn1.32xlarge", 2)
    first = (render_publisher_config(plan, TGI, MONITORING), render_neuron_monitor_config(plan), render_agent_config())
    assert first == (render_publisher_config(plan, TGI, MONITORING), render_neuron_monitor_config(plan),
                     render_agent_config())


@pytest.mark.parametrize(("options", "message"), [
    ({"service": "my service"}, r"^monitoring.service \('my service'\) must be a non-empty name without spaces"),
    ({"log_groups": {"boot": "b"}}, r"^monitoring.log_groups \(\{'boot': 'b'\}\) must name a group for each of boot, "),
    ({"log_groups": {**MONITORING.log_groups, "router": "a b"}}, r"^monitoring.log_groups .* must be names without"),
    ({"namespace": "AWS/EC2"}, r"^monitoring.namespace \('AWS/EC2'\) must be 1 to 255 characters"),
    ({"agent_key_fingerprint": "9376 16F3 450B 7D80 6CBD 9725 D581 6730 3B78 9C72"},
     r"^monitoring.agent_key_fingerprint \('9376 16F3 .*'\) must be an OpenPGP v4 fingerprint: 40 hexadecimal"),
    ({"agent_key_fingerprint": "3B789C72"}, r"^monitoring.agent_key_fingerprint \('3B789C72'\) must be"),
])
def test_monitoring_options_name_the_bad_setting(options: dict[str, object], message: str) -> None:
    given = {"service": MONITORING.service, "log_groups": MONITORING.log_groups, **options}
    with pytest.raises(ServingConfigError, match=message):
        MonitoringOptions(**given)  # type: ignore[arg-type]


AGENT_SCHEMA = Path(__file__).resolve().parents[3] / "shared" / "cloudwatch-agent" / "schema.json"
"""The CloudWatch agent's published schema (aws/amazon-cloudwatch-agent translator/config/
schema.json), placed in the project's shared/ folder: a data file fetched from the agent's
repository may not be committed here."""


@pytest.mark.parametrize("api_keys", [False, True], ids=["without API keys", "with API keys"])
def test_the_agent_config_as_the_host_writes_it_validates_against_the_agents_published_schema(api_keys: bool) -> None:
    if not AGENT_SCHEMA.is_file():
        pytest.skip(f"no {AGENT_SCHEMA}: the agent's schema.json, which only shared/ may hold")
    text = render_agent_config(api_keys=api_keys)
    for kind in AGENT_LOG_KINDS:  # as start-monitoring substitutes the stack's log group names
        text = text.replace(placeholder(kind), MONITORING.log_groups[kind])
    validator = jsonschema.Draft4Validator(json.loads(AGENT_SCHEMA.read_text()))
    assert [error.message for error in validator.iter_errors(json.loads(text))] == []
    typo = json.loads(text)
    typo["logs"]["logs_collected"]["files"]["collect_list"][0]["log_grup_name"] = "x"
    assert list(validator.iter_errors(typo))
